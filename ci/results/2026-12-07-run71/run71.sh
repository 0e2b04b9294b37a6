#!/usr/bin/env bash
# GPU run 71 (~8.5 min; build the wheel first): the prefix + tail split (5-16 causal queries per entry
# over a paged cache of >= 2048 keys; call_plan.cpp plan_prefix_tail) and everything its kernels'
# changes touch (the table copy's kernel, split-KV's inputs and merge): its GPU tests, the paged,
# by-tokens, split-KV and adapter tests, probe71 (bench_paged's rows of
# 4-16 queries beside cuDNN's general kernel), then memcheck over the new tests. One all.tgz back, packed after every step.
set -u
repo=$(pwd)
pack() { (cd "$OUT" && tar czf /tmp/all.tgz --exclude=all.tgz . && mv /tmp/all.tgz all.tgz); }
PART=files LIMIT=265 FILES="test_decode_prefix_tail.py test_split_kv.py test_decode_by_tokens.py test_paged.py \
  test_paged_adapters.py test_sinks_decode.py" bash ci/gpu_suite.sh; pack
(mkdir -p /tmp/w && cd /tmp/w && PYTHONPATH=/tmp/sfa-files PYTHONUNBUFFERED=1 timeout 190 python3 \
  "$repo/ci/results/2026-12-07-run71/probe71.py" > "$OUT/probe71.log" 2>&1); echo "probe71 rc $?"; cut -c1-900 "$OUT/probe71.log"
pack
(cd tests/gpu && PYTHONPATH=/tmp/sfa-files timeout 70 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest \
  -p no:cacheprovider -q -o cache_dir=/tmp/.c test_decode_prefix_tail.py -k "not random_strides and not growing and not every_entry" \
  > $OUT/memcheck.log 2>&1)
echo "memcheck rc $? (9: memcheck found errors)"; grep -E "ERROR SUMMARY|passed|failed" $OUT/memcheck.log | tail -3; pack
cd "$OUT" && find . -type f ! -name all.tgz -delete; ls "$OUT"
