#!/usr/bin/env bash
# GPU run 74 (~7 min; build the wheel first): the prefix + tail split's tests on the code that makes
# 3-4 queries at batch >= 32 split by default (the wide switch removed), then issue 32 item 2's
# torch.compile'd transformers rows (PART=compiled, unrun since they were written); between them probe74
# (the general kernel with the GQA group folded into its rows, over chunks of the keys). One all.tgz back.
set -u
repo=$(pwd)
pack() { (cd "$OUT" && tar czf /tmp/all.tgz --exclude=all.tgz . && mv /tmp/all.tgz all.tgz); }
PART=files LIMIT=110 FILES="test_decode_prefix_tail.py test_decode_by_tokens.py" bash ci/gpu_suite.sh > "$OUT/files.out" 2>&1
cat "$OUT/files.out"; pack
(export PYTHONPATH=/tmp/sfa-files PYTHONUNBUFFERED=1; cd /tmp && timeout 90 python3 "$repo/ci/results/2026-12-07-stop49/probe74.py" > "$OUT/probe74.log" 2>&1; echo "probe74 rc $?")
cut -c1-900 "$OUT/probe74.log"; pack
PART=compiled bash ci/gpu_bench.sh > "$OUT/compiled.out" 2>&1
cat "$OUT/compiled.out"; pack
cd "$OUT" && find . -type f ! -name all.tgz -delete; ls "$OUT"
