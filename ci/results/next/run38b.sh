# GPU run 38, part B of 2: the dense suites the core touches (run 36 cut them at 200 s, 209 passed,
# none failed) under a longer limit, then bench_paged with torch's varlen_attn over the block table.
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
rm -rf /tmp/sfa && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
cd $OUT
timeout 120 python3 $repo/benchmarks/bench_paged.py --out $OUT --quick > /dev/null 2> bench_paged.err
echo "bench paged rc $?"; python3 -c "
import json; d = json.load(open('paged.json'))
for r in d['rows']: print(r)" 2>&1 | cut -c1-400
timeout 400 python3 -X faulthandler -m pytest -p no:cacheprovider -q -rfEx $repo/tests/gpu/test_variants.py \
  $repo/tests/gpu/test_forward_backward.py $repo/tests/gpu/test_jax.py $repo/tests/gpu/test_torch_ops.py > dense.log 2>&1
echo "dense rc $?"; tail -2 dense.log; grep -E "^FAILED" dense.log | cut -c1-200 | head
