# GPU run 30: the score bias and ALiBi (814323d): bias tests (layout probe), the adapters' GPU tests,
# the stride fuzz with bias (2000/200), host overhead (CuPy bfloat16 intake fix)
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
cd $OUT
timeout 240 python3 -X faulthandler -m pytest -p no:cacheprovider -q -rfEx $repo/tests/gpu/test_bias.py \
  $repo/tests/gpu/test_torch_ops.py $repo/tests/gpu/test_variants.py $repo/tests/gpu/test_variants_adapters.py \
  $repo/tests/gpu/test_cupy.py $repo/tests/gpu/test_torch_attention.py $repo/tests/gpu/test_torch_packed.py \
  $repo/tests/gpu/test_torch_compile.py $repo/tests/gpu/test_gpu_validation.py > pytest.log 2>&1
echo "tests rc $?"; grep -E "passed|failed" pytest.log | tail -1
grep -E "^(FAILED|ERROR|XFAIL)" pytest.log | cut -c1-400 | head -60
STRIDEDFA_FUZZ_VALID=2000 STRIDEDFA_FUZZ_INVALID=200 STRIDEDFA_FUZZ_REPORT=$OUT/fuzz.json timeout 130 \
  python3 -X faulthandler -m pytest -p no:cacheprovider -q $repo/tests/gpu/test_stride_fuzz.py > fuzz.log 2>&1
echo "fuzz rc $?"; tail -3 fuzz.log; python3 -c "import json; d=json.load(open('fuzz.json')); print(json.dumps(d)[:3000])"
timeout 120 python3 $repo/benchmarks/bench_host_overhead.py --out $OUT --quick > bench_host_overhead.log 2>&1
echo "bench rc $?"; grep "cupy\|vs_torch\|met" bench_host_overhead.md | head -30
