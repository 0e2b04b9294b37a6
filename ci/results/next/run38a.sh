# GPU run 38, part A of 2 (prepared 2026-12-03 after run 37's probe): the varlen and paged tests
# with q and grad_q dense in the backward (the fix of 6e06bee), the paged adapters (CuPy, JAX,
# compile, CUDA graphs, options over fuzzed cache strides), memcheck, bench_varlen.
# Build the wheel first (ci/build_wheel_for_gpu_host.sh), then `run` this with carry [".whl"].
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
rm -rf /tmp/sfa && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
cd $OUT
STRIDEDFA_VARLEN_FUZZ=60 timeout 240 python3 -X faulthandler -m pytest -p no:cacheprovider -v -rfEsx -s --tb=short \
  $repo/tests/gpu/test_varlen.py $repo/tests/gpu/test_paged.py $repo/tests/gpu/test_paged_adapters.py > varlen.log 2>&1
echo "varlen rc $?"; grep -E " passed| failed" varlen.log | tail -1
grep -E "^(FAILED|ERROR)" varlen.log | cut -c1-220 | head -30
grep -E "^E  " varlen.log | cut -c1-300 | sort | uniq -c | sort -rn | head -20
grep -E "graphs built" varlen.log
timeout 120 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -p no:cacheprovider \
  -q $repo/tests/gpu/test_varlen.py $repo/tests/gpu/test_paged.py -k "garbage or out_of_range or fuzzed or views" > memcheck.log 2>&1
echo "memcheck rc $?"; grep -E "ERROR SUMMARY|passed|failed" memcheck.log | tail -3
timeout 90 python3 $repo/benchmarks/bench_varlen.py --out $OUT --quick > /dev/null 2> bench_varlen.err
echo "bench rc $?"; python3 -c "import json; d = json.load(open('varlen.json')); print(d['ms_per_step'], d['targets'])"
