#!/usr/bin/env bash
# GPU run 68 (for the session after stop 45, ~4 min; build the wheel first): run67c's tests, memcheck
# and bench_paged on stop 45's last code (they come back as tests.tgz), then probe68 (8-16 queries by
# a prefix and a tail: probe68.log, probe68.json).
set -u
repo=$(pwd)
bash ci/results/2026-12-07-run67/run67c.sh
mv "$OUT/all.tgz" "$OUT/tests.tgz"
export PYTHONPATH=/tmp/sfa-files PYTHONUNBUFFERED=1
(cd /tmp && timeout 90 python3 "$repo/ci/results/2026-12-07-stop45/probe68.py" > "$OUT/probe68.log" 2>&1); echo "probe68 rc $?"
cut -c1-500 "$OUT/probe68.log"; ls "$OUT"
