#!/usr/bin/env bash
# One GPU session on the H200 test host (no network; see ci/gpu_host.md): ci/test_gpu.sh with
# the stridedfa wheel carried in .whl/ (built by ci/build_wheel_for_gpu_host.sh), offline, the
# whole test suite (CPU and GPU tests): environment report, tests, benchmarks and demo, every log
# in $OUT, then bundled into logs.tgz (few files travel back from the host). Every stage runs even
# if one fails; the exit status is the test suite's.
#   usage (from the repository root on the host): OUT=/some/dir ci/gpu_host_run.sh [--quick]
set -u
OUT=${OUT:?set OUT to a folder for the logs}
cd "$(dirname "$0")/.." || exit 2
ci/test_gpu.sh --wheel .whl --out "$OUT" --offline --tests all ${1:+"$1"}
tests_rc=$?
# shellcheck disable=SC2086  # the log names split on purpose
(cd "$OUT" && logs=$(ls ./*.log ./*.xml env.txt 2>/dev/null) && tar czf logs.tgz $logs && rm -f $logs)
exit $tests_rc
