# GPU run 20: the cuda.core demo and allocation benchmark again (pinned Buffer copies)
set -u
ls .whl/*.whl || exit 3
TESTS_SUBSET=test_demo.py SKIP_STAGES="fuzz host patterns bench demo" TESTS_TIMEOUT=120 ci/gpu_host_run.sh --quick
echo "rc $?"; cat $OUT/summary.txt; cd $OUT && tar xzf logs.tgz && cat bench_allocation.log; grep -n "^E  " pytest.log | grep -v "^E   *[\"{}]" | head -30
