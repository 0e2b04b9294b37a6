#!/usr/bin/env bash
# GPU run 67 (stop 45, ~8 min; build the wheel first): the paged view by heads as the default,
# decoding by tokens (tests/gpu/test_decode_by_tokens.py), memcheck over both, then bench_paged
# (multi-token rows by tokens beside cuDNN's general kernel) and bench_decode_lengths. Everything
# comes back as one all.tgz (the device tool returns at most 8 files).
set -u
repo=$(pwd)
pack() { (cd "$OUT" && tar czf /tmp/all.tgz --exclude=all.tgz . && mv /tmp/all.tgz all.tgz); }
PART=files LIMIT=200 \
  FILES="test_decode_by_tokens.py test_decode_graphs.py test_paged.py test_paged_adapters.py test_flash_attn_interface.py test_split_kv.py test_empty_sequences.py test_sinks_decode.py test_variants.py" \
  bash ci/gpu_suite.sh
pack
export PYTHONPATH=/tmp/sfa-files PYTHONUNBUFFERED=1
(cd tests/gpu && timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -p no:cacheprovider \
  -q -o cache_dir=/tmp/.c test_decode_by_tokens.py \
  "test_decode_graphs.py::test_one_query_through_a_paged_view_matches_the_reference" > $OUT/memcheck.log 2>&1)
echo "memcheck rc $? (9: memcheck found errors)"; grep -E "ERROR SUMMARY|passed|failed" $OUT/memcheck.log | tail -3; pack
timeout 120 python3 benchmarks/bench_paged.py --out $OUT/paged --quick > $OUT/paged.log 2>&1; echo "paged bench rc $?"
python3 - <<'PY'
import json, os
d = json.load(open(os.path.join(os.environ["OUT"], "paged", "paged.json")))
for r in d["rows"]:
    g = r.get("graphed", {})
    print(r["batch"], r["cache_length"], r["queries"], {k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()
          if k.endswith("_us") or "share" in k or "speedup" in k}, "graphed", {k: round(v, 2) for k, v in g.items() if isinstance(v, float)})
print({k: v for k, v in d.items() if k.startswith("issue") or k.startswith("target")})
PY
pack
timeout 80 python3 benchmarks/bench_decode_lengths.py --out $OUT/decode --quick > $OUT/decode.log 2>&1; echo "decode lengths rc $?"; grep -E "^\||graphs built" $OUT/decode.log | tail -11
pack; cd $OUT && find . -type f ! -name all.tgz -delete; ls $OUT
