set -u
R=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
cd /tmp
timeout 200 python3 -X faulthandler -m pytest $R/tests -q -p no:cacheprovider -rfEs \
  --ignore=$R/tests/gpu/test_stride_fuzz.py --ignore=$R/tests/gpu/test_jax.py --ignore=$R/tests/gpu/test_bitexact.py \
  > $OUT/pytest.log 2>&1; echo "tests rc $? $(tail -1 $OUT/pytest.log)"
timeout 90 python3 -X faulthandler $R/.diag/diag2.py > $OUT/diag2.log 2>&1; echo "diag rc $?"
STRIDEDFA_COMMIT=$1 timeout 80 python3 $R/benchmarks/bench_host_overhead.py --out $OUT --quick > $OUT/host.log 2>&1; echo "host rc $?"
STRIDEDFA_FUZZ_VALID=40 STRIDEDFA_FUZZ_INVALID=60 timeout 150 compute-sanitizer --tool memcheck --print-limit 20 \
  python3 -m pytest $R/tests/gpu/test_stride_fuzz.py $R/tests/gpu/test_hardening.py -q -p no:cacheprovider -k "not beyond_int32" \
  > $OUT/sanitizer.log 2>&1; echo "sanitizer rc $? $(grep -a 'ERROR SUMMARY' $OUT/sanitizer.log | tail -1)"
cd $OUT && tar czf logs.tgz pytest.log diag2.log host.log sanitizer.log && rm -f pytest.log diag2.log host.log sanitizer.log
