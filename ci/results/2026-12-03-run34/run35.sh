# GPU run 35: the first run of variable-length (THD) attention -- tests/gpu/test_varlen.py, the
# dense variants suite (the core change touches it), and compute-sanitizer memcheck on the varlen tests
set -u
ls .diag/whl/*.whl || exit 3
repo=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .diag/whl/*.whl
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
cd $OUT
timeout 150 python3 -X faulthandler -m pytest -p no:cacheprovider -v -rfEx -s --tb=short $repo/tests/gpu/test_varlen.py > varlen.log 2>&1
echo "varlen rc $?"; grep -E " passed| failed" varlen.log | tail -1
grep -E "(FAILED|ERROR)" varlen.log | grep -v "^FAILED" | cut -c1-200 | head -36
grep -E "^E  |Error:" varlen.log | cut -c1-300 | sort | uniq -c | sort -rn | head -30
grep -E "graphs built" varlen.log
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
echo "sanitizer: $CS"
[ -n "$CS" ] && timeout 60 $CS --tool memcheck --error-exitcode 9 python3 -m pytest -p no:cacheprovider -q -x \
  $repo/tests/gpu/test_varlen.py -k "garbage or (generic and gqa and dtype0 and (window or bottom_right))" \
  > memcheck.log 2>&1
echo "memcheck rc $?"; grep -E "ERROR SUMMARY|passed|failed" memcheck.log | tail -3
timeout 70 python3 $repo/benchmarks/bench_varlen.py --out $OUT --quick > bench_varlen.log 2>&1
echo "bench rc $?"; tail -40 bench_varlen.log
