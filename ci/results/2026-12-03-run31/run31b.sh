# GPU run 31b (196e06c): the stride fuzz at scale (10000 valid / 2000 invalid), host overhead (quick)
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
cd $OUT
STRIDEDFA_FUZZ_VALID=10000 STRIDEDFA_FUZZ_INVALID=2000 STRIDEDFA_FUZZ_REPORT=$OUT/fuzz.json timeout 400 \
  python3 -X faulthandler -m pytest -p no:cacheprovider -q $repo/tests/gpu/test_stride_fuzz.py > fuzz.log 2>&1
echo "fuzz rc $?"; tail -3 fuzz.log; python3 -c "import json; d=json.load(open('fuzz.json')); print(json.dumps(d)[:3000])"
timeout 150 python3 $repo/benchmarks/bench_host_overhead.py --out $OUT --quick > bench_host_overhead.log 2>&1
echo "bench rc $?"; grep "cupy\|vs_torch\|met" bench_host_overhead.md | head -30
