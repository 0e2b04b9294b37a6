# GPU run 19: run 18's failures re-run (cuda.core keyword stream), allocation, call-pattern and throughput benchmarks
set -u
ls .whl/*.whl || exit 3
TESTS_SUBSET=test_demo.py SKIP_STAGES="fuzz host" TESTS_TIMEOUT=120 PATTERNS_TIMEOUT=150 BENCH_TIMEOUT=200 ci/gpu_host_run.sh --quick
echo "rc $?"; cat $OUT/summary.txt
