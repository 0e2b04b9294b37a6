#!/usr/bin/env bash
# GPU run 72 as device time allows (~6.5 min; build the wheel first), on the code with the prefix + tail
# split on by default where probe71 showed it pays (6ebba7d): the decoding plans' and paged files with
# the stride fuzz beside them, then bench_paged --quick (the default plan's multi-token rows beside
# the general kernel and SDPA) and probe73 (a one-query paged step's kernels at small batch). One
# all.tgz back, packed after every step.
set -u
repo=$(pwd)
pack() { (cd "$OUT" && tar czf /tmp/all.tgz --exclude=all.tgz . && mv /tmp/all.tgz all.tgz); }
PART=files LIMIT=150 FILES="test_decode_prefix_tail.py test_decode_by_tokens.py test_split_kv.py test_paged.py \
  test_paged_adapters.py test_sinks_decode.py test_decode_graphs.py" bash ci/gpu_suite.sh > "$OUT/files.out" 2>&1 &
PART=fuzz FUZZ_LIMIT=150 FUZZ_VALID=1200 FUZZ_INVALID=400 bash ci/gpu_suite.sh > "$OUT/fuzz.out" 2>&1 &
wait; cat "$OUT/files.out" "$OUT/fuzz.out"; pack
export PYTHONPATH=/tmp/sfa-files PYTHONUNBUFFERED=1
mkdir -p /tmp/w && cd /tmp/w || exit 3
timeout 110 python3 "$repo/benchmarks/bench_paged.py" --quick --out "$OUT/paged" > "$OUT/paged.log" 2>&1; echo "paged rc $?"
tail -8 "$OUT/paged.log"; pack
timeout 45 python3 "$repo/ci/results/2026-12-07-stop48/probe73.py" > "$OUT/probe73.log" 2>&1; echo "probe73 rc $?"
cut -c1-700 "$OUT/probe73.log"; pack
cd "$OUT" && find . -type f ! -name all.tgz -delete; ls "$OUT"
