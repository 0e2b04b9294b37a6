#!/usr/bin/env bash
# GPU run 67, command 4 (~3 min; wheel of d94ff83's C++): decoding by tokens at 2-4 queries, 2-8 for
# one sequence: its tests, memcheck, and bench_paged again. One all.tgz back.
set -u
pack() { (cd "$OUT" && tar czf /tmp/all.tgz --exclude=all.tgz . && mv /tmp/all.tgz all.tgz); }
PART=files LIMIT=120 FILES="test_decode_by_tokens.py test_paged.py test_paged_adapters.py test_flash_attn_interface.py" bash ci/gpu_suite.sh
pack
export PYTHONPATH=/tmp/sfa-files PYTHONUNBUFFERED=1
(cd tests/gpu && timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -p no:cacheprovider \
  -q -o cache_dir=/tmp/.c test_decode_by_tokens.py > $OUT/memcheck.log 2>&1)
echo "memcheck rc $? (9: memcheck found errors)"; grep -E "ERROR SUMMARY|passed|failed" $OUT/memcheck.log | tail -3; pack
timeout 150 python3 benchmarks/bench_paged.py --out $OUT/paged --quick > $OUT/paged.log 2>&1; echo "paged bench rc $?"
python3 - <<'PY'
import json, os
d = json.load(open(os.path.join(os.environ["OUT"], "paged", "paged.json")))
for r in d["rows"]:
    g = r.get("graphed", {})
    print(r["batch"], r["cache_length"], r["queries"], "graphed", {k: round(v, 2) for k, v in g.items() if isinstance(v, float)})
print({k: v for k, v in d.items() if k.startswith("issue") or k.startswith("target")})
PY
pack; cd $OUT && find . -type f ! -name all.tgz -delete; ls $OUT
