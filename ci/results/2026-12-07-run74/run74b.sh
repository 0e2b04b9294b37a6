#!/usr/bin/env bash
# GPU run 74 short of device time (~4 min): run74.sh without the compiled transformers rows.
set -u
repo=$(pwd)
PART=files LIMIT=110 FILES="test_decode_prefix_tail.py test_decode_by_tokens.py" bash ci/gpu_suite.sh > "$OUT/files.out" 2>&1
cat "$OUT/files.out"
(export PYTHONPATH=/tmp/sfa-files PYTHONUNBUFFERED=1; cd /tmp && timeout 100 python3 "$repo/ci/results/2026-12-07-stop49/probe74.py" > "$OUT/probe74.log" 2>&1; echo "probe74 rc $?")
cut -c1-1200 "$OUT/probe74.log"; ls "$OUT"
