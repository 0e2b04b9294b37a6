#!/usr/bin/env bash
# GPU run 75 (~5.5 min; build the wheel first): the prefix + tail split described by rows, its prefix
# in chunks (_core._decode_prefix_tail_rows, off by default): test_decode_prefix_tail.py runs every
# case both ways (and 3-16 queries, one entry, by rows); by tokens' and split-KV's files, whose
# kernels (clamp_blocks, split_inputs, split_merge) took the chunk count; then bench_paged --quick
# with it on (the multi-token rows beside the general kernel and SDPA). If the tests pass and the
# rows beat the default, switch it on.
set -u
repo=$(pwd)
PART=files LIMIT=150 FILES="test_decode_prefix_tail.py test_decode_by_tokens.py test_split_kv.py" bash ci/gpu_suite.sh > "$OUT/files.out" 2>&1
cat "$OUT/files.out"
(export PYTHONPATH=/tmp/sfa-files PYTHONUNBUFFERED=1; mkdir -p /tmp/w && cd /tmp/w && timeout 110 python3 "$repo/benchmarks/bench_paged.py" --quick --prefix-tail-rows --out "$OUT/paged" > "$OUT/paged.log" 2>&1; echo "paged rc $?")
python3 - "$OUT/paged/paged.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    g = r.get("graphed", {})
    if r.get("queries", 1) > 1:
        print(r["batch"], r["cache_length"], r["queries"], {k: round(v, 1) if isinstance(v, float) else v for k, v in g.items()})
PY
# memcheck over the chunked rows' cases (the table copy's shifted rows, the chunks' lengths, the merge)
(cd tests/gpu && PYTHONPATH=/tmp/sfa-files timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest \
  -p no:cacheprovider -q -o cache_dir=/tmp/.c test_decode_prefix_tail.py -k "rows_take" > "$OUT/memcheck.log" 2>&1)
echo "memcheck rc $? (9: memcheck found errors)"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck.log" | tail -3
ls "$OUT"
