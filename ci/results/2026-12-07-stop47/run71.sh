#!/usr/bin/env bash
# GPU run 71 (~7 min; build the wheel first): the prefix + tail split (5-16 causal queries per entry
# over a paged cache of >= 2048 keys; call_plan.cpp plan_prefix_tail) and everything its kernels'
# changes touch (the table copy's kernel, split-KV's inputs and merge): its GPU tests, the paged,
# by-tokens, split-KV and adapter tests, memcheck over the new tests, then bench_paged --quick (2, 4,
# 8 and 16 queries beside cuDNN's general kernel). One all.tgz back, packed after every step.
set -u
repo=$(pwd)
pack() { (cd "$OUT" && tar czf /tmp/all.tgz --exclude=all.tgz . && mv /tmp/all.tgz all.tgz); }
PART=files LIMIT=220 FILES="test_decode_prefix_tail.py test_decode_by_tokens.py test_split_kv.py test_paged.py \
  test_paged_adapters.py test_sinks_decode.py" bash ci/gpu_suite.sh; pack
(cd tests/gpu && PYTHONPATH=/tmp/sfa-files timeout 80 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest \
  -p no:cacheprovider -q -o cache_dir=/tmp/.c test_decode_prefix_tail.py -k "not random_strides and not growing and not every_entry" \
  > $OUT/memcheck.log 2>&1)
echo "memcheck rc $? (9: memcheck found errors)"; grep -E "ERROR SUMMARY|passed|failed" $OUT/memcheck.log | tail -3; pack
(mkdir -p /tmp/w && cd /tmp/w && PYTHONPATH=/tmp/sfa-files PYTHONUNBUFFERED=1 timeout 150 python3 "$repo/benchmarks/bench_paged.py" \
  --quick --out "$OUT/paged" > "$OUT/paged.log" 2>&1); echo "paged rc $?"
python3 - "$OUT/paged/paged.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    if r.get("queries", 1) > 1 and "graphed" in r:
        g = r["graphed"]
        print(r["batch"], r["cache_length"], r["queries"], "ours", round(r["stridedfa_paged_us"], 1), "general",
              round(r["stridedfa_general_kernel_us"], 1), "share", round(r["share_of_ceiling"], 3), "graphed", round(g["stridedfa_paged_us"], 1),
              round(g["stridedfa_general_kernel_us"], 1), round(g["share_of_ceiling"], 3))
print({k: v for k, v in d.items() if k.startswith("issue") or k.startswith("target")})
PY
pack
cd "$OUT" && find . -type f ! -name all.tgz -delete; ls "$OUT"
