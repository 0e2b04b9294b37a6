# GPU run 15, command 1: wheel, whole suite (fuzz apart), demo, sanitizer subset, training-step diagnosis
set -u
R=$PWD
t0=$(date +%s)
ls .whl/*.whl || exit 3
echo "build $(( $(date +%s) - t0 )) s"
SKIP_STAGES="fuzz host patterns bench" TESTS_TIMEOUT=300 ci/gpu_host_run.sh --quick; echo "suite rc $? at $(( $(date +%s) - t0 )) s"
cat $OUT/summary.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
cd /tmp
timeout 100 python3 -X faulthandler $R/.diag/diag3.py > $OUT/diag3.log 2>&1; echo "diag rc $? at $(( $(date +%s) - t0 )) s"
STRIDEDFA_FUZZ_VALID=60 STRIDEDFA_FUZZ_INVALID=80 timeout $(( 560 - $(date +%s) + t0 )) compute-sanitizer --tool memcheck --print-limit 20 \
  python3 -m pytest $R/tests/gpu/test_stride_fuzz.py $R/tests/gpu/test_hardening.py -q -p no:cacheprovider -k "not beyond_int32" \
  > $OUT/sanitizer.log 2>&1; echo "sanitizer rc $? $(grep -a 'ERROR SUMMARY' $OUT/sanitizer.log | tail -1) $(tail -1 $OUT/sanitizer.log) at $(( $(date +%s) - t0 )) s"
