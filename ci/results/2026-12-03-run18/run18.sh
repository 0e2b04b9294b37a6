# GPU run 18: issue 10 item 6 (cuda.core demo + allocation benchmark), whole suite, fuzz after redesign
set -u
ls .whl/*.whl || exit 3
SKIP_STAGES="host patterns bench" TESTS_TIMEOUT=270 FUZZ_TIMEOUT=230 ci/gpu_host_run.sh --quick
echo "rc $?"; cat $OUT/summary.txt; cat $OUT/demo.log 2>/dev/null | tail -12
