# GPU run 39 (prepared 2026-12-03 after run 38 part A): the varlen/paged tests again with a single
# head's stride canonical (MQA dK) and two test bugs fixed, then the dense suites (run 36 cut them
# at 200 s with 209 passed) and bench_paged with torch's varlen_attn over the block table.
# Build the wheel first (ci/build_wheel_for_gpu_host.sh), then `run` this with carry [".whl"].
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
rm -rf /tmp/sfa && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
cd $OUT
STRIDEDFA_VARLEN_FUZZ=60 timeout 190 python3 -X faulthandler -m pytest -p no:cacheprovider -v -rfEsx -s --tb=short \
  $repo/tests/gpu/test_varlen.py $repo/tests/gpu/test_paged.py $repo/tests/gpu/test_paged_adapters.py > varlen.log 2>&1
echo "varlen rc $?"; grep -E " passed| failed" varlen.log | tail -1
grep -E "^(FAILED|ERROR)" varlen.log | cut -c1-220 | head -20
grep -E "^E  " varlen.log | cut -c1-300 | sort | uniq -c | sort -rn | head -12
timeout 170 python3 -X faulthandler -m pytest -p no:cacheprovider -q -rfEx $repo/tests/gpu/test_variants.py \
  $repo/tests/gpu/test_forward_backward.py $repo/tests/gpu/test_jax.py $repo/tests/gpu/test_torch_ops.py > dense.log 2>&1
echo "dense rc $?"; tail -2 dense.log; grep -E "^FAILED" dense.log | cut -c1-200 | head
timeout 70 python3 $repo/benchmarks/bench_paged.py --out $OUT --quick > /dev/null 2> bench_paged.err
echo "bench paged rc $?"; python3 -c "
import json; d = json.load(open('paged.json'))
for r in d['rows']: print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()})" 2>&1 | cut -c1-400
