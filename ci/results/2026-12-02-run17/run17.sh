# GPU run 17: the architecture redesign, the whole suite (fuzz apart), then the host benchmark if time is left
set -u
ls .whl/*.whl || exit 3
SKIP_STAGES="fuzz patterns bench demo" TESTS_TIMEOUT=190 HOST_BENCH_TIMEOUT=50 ci/gpu_host_run.sh --quick
echo "rc $?"; cat $OUT/summary.txt
