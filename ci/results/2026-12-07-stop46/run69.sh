#!/usr/bin/env bash
# GPU run 69 (~8 min; build the wheel first): the launch's scratch now lies in the call's workspace
# (one allocation by the caller's allocator, none by the launch), so the whole GPU suite in its two
# halves at once, memcheck over the decoding, split, sinks and varlen paths, then probe69 (a decoding
# call's host time beside SDPA; the tail of a prefix + tail split). One all.tgz back.
set -u
repo=$(pwd)
pack() { (cd "$OUT" && tar czf /tmp/all.tgz --exclude=all.tgz . && mv /tmp/all.tgz all.tgz); }
PART=suite1 bash ci/gpu_suite.sh > "$OUT/suite1.out" 2>&1 &
PART=suite2 bash ci/gpu_suite.sh > "$OUT/suite2.out" 2>&1 &
wait
cat "$OUT/suite1.out" "$OUT/suite2.out"; pack
export PYTHONPATH=/tmp/sfa-suite2 PYTHONUNBUFFERED=1
(cd tests/gpu && timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -p no:cacheprovider \
  -q -o cache_dir=/tmp/.c test_decode_by_tokens.py test_split_kv.py test_sinks_decode.py test_decode_graphs.py \
  -k "not random_strides and not loop" > $OUT/memcheck.log 2>&1)
echo "memcheck rc $? (9: memcheck found errors)"; grep -E "ERROR SUMMARY|passed|failed" $OUT/memcheck.log | tail -3; pack
(cd /tmp && timeout 150 python3 "$repo/ci/results/2026-12-07-stop46/probe69.py" > "$OUT/probe69.log" 2>&1); echo "probe69 rc $?"
cut -c1-700 "$OUT/probe69.log"; pack
cd "$OUT" && find . -type f ! -name all.tgz -delete; ls "$OUT"
