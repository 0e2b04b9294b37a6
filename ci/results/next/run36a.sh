# Next GPU run, part A of 2 (varlen + paged tests, memcheck, bench_varlen) (prepared 2026-12-03, after GPU run 35b; nothing since 229f15c has run on a GPU):
# build the wheel first (ci/build_wheel_for_gpu_host.sh), then `run` this with carry [".whl"].
# (1) the varlen and paged-KV tests (interleaved-view refusal and torch copies, CuPy, JAX, dispatcher, opcheck,
# packed entry point, the small transformer, the fuzz), (2) memcheck on the varlen tests,
# (3) bench_varlen (with the full padded batch as the FLOP-ideal base), (4) the dense suites the
# core change touches, each under its own time limit. Record in ci/results/<date>-run36/.
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
cd $OUT
STRIDEDFA_VARLEN_FUZZ=60 timeout 200 python3 -X faulthandler -m pytest -p no:cacheprovider -v -rfEx -s --tb=short \
  $repo/tests/gpu/test_varlen.py $repo/tests/gpu/test_paged.py > varlen.log 2>&1
echo "varlen rc $?"; grep -E " passed| failed" varlen.log | tail -1
grep -E "(FAILED|ERROR)" varlen.log | grep -v "^FAILED" | cut -c1-200 | head -30
grep -E "^E  |Error:" varlen.log | cut -c1-300 | sort | uniq -c | sort -rn | head -20
grep -E "graphs built" varlen.log
timeout 80 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -p no:cacheprovider \
  -q $repo/tests/gpu/test_varlen.py $repo/tests/gpu/test_paged.py -k "garbage or out_of_range or fuzzed" > memcheck.log 2>&1
echo "memcheck rc $?"; grep -E "ERROR SUMMARY|passed|failed" memcheck.log | tail -3
timeout 90 python3 $repo/benchmarks/bench_varlen.py --out $OUT --quick > bench_varlen.log 2>&1
echo "bench rc $?"; grep -A12 '"ms_per_step"' bench_varlen.log; grep -A3 '"targets"' bench_varlen.log
