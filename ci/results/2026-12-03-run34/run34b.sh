# GPU run 34b: the stride fuzz at scale (10000 valid / 2000 invalid, dropout on ~12%) and the
# host-overhead benchmark (quick)
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
cd $OUT
STRIDEDFA_FUZZ_VALID=10000 STRIDEDFA_FUZZ_INVALID=2000 STRIDEDFA_FUZZ_REPORT=$OUT/fuzz.json timeout 400 \
  python3 -X faulthandler -m pytest -p no:cacheprovider -q $repo/tests/gpu/test_stride_fuzz.py > fuzz.log 2>&1
echo "fuzz rc $?"; tail -2 fuzz.log
python3 -c "
import json; d=json.load(open('fuzz.json'))
for k in ('valid','invalid'):
    v=d.get(k,{}); print(k, v.get('cases'), v.get('complete'), v.get('counts')); print({x: n for x, n in v.get('by_variant', {}).items() if x.startswith('dropout')})
    for name, ex in v.get('examples',{}).items():
        if name.startswith('FAIL'): print(name, sorted(set(ex))[:6])
"
timeout 150 python3 $repo/benchmarks/bench_host_overhead.py --out $OUT --quick > bench_host.log 2>&1
echo "bench rc $?"; cat bench_host_overhead.md 2>/dev/null | tail -25
