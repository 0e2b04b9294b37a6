#!/usr/bin/env bash
# One GPU session on the H200 test host (no network; see shared GPU_HOST.md): installs the
# stridedfa wheel carried in .whl/ (built by ci/build_wheel_for_gpu_host.sh), then runs the
# environment report and demo, the whole test suite (CPU and GPU tests) and the benchmark, writing
# every log to $OUT (bundled into logs.tgz at the end). Every stage runs even if one fails; the exit status is the test suite's.
#   usage (from the repository root on the host): OUT=/some/dir ci/gpu_host_run.sh [--quick]
set -u
OUT=${OUT:?set OUT to a folder for the logs}
REPO=$(pwd)
BENCH_ARGS=${1:-}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false

python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$REPO"/.whl/*.whl || exit 2
export PYTHONPATH=/tmp/site
cd /tmp  # import the installed package, never the source tree

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, sys; print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"
} > "$OUT/env.txt" 2>&1

# Most important first: a short lease may end before the later stages.
timeout "${TESTS_TIMEOUT:-420}" python3 -X faulthandler -m pytest "$REPO/tests" -p no:cacheprovider -q -rfEsx \
  --junitxml="$OUT/pytest.xml" > "$OUT/pytest.log" 2>&1
tests_rc=$?
echo "tests: exit $tests_rc; $(tail -n 1 "$OUT/pytest.log")" | tee -a "$OUT/summary.txt"

timeout "${HOST_BENCH_TIMEOUT:-120}" python3 -X faulthandler "$REPO/benchmarks/bench_host_overhead.py" --out "$OUT" $BENCH_ARGS \
  > "$OUT/bench_host_overhead.log" 2>&1
echo "host-overhead benchmark: exit $?" | tee -a "$OUT/summary.txt"

timeout "${BENCH_TIMEOUT:-200}" python3 -X faulthandler "$REPO/benchmarks/bench_attention.py" --out "$OUT" $BENCH_ARGS \
  > "$OUT/bench.log" 2>&1
echo "benchmark: exit $?" | tee -a "$OUT/summary.txt"

timeout "${DEMO_TIMEOUT:-90}" python3 -X faulthandler -m stridedfa > "$OUT/demo.log" 2>&1
echo "demo: exit $?" | tee -a "$OUT/summary.txt"
# Few files travel back from the host: bundle the logs.
(cd "$OUT" && logs=$(ls ./*.log ./*.xml env.txt 2>/dev/null) && tar czf logs.tgz $logs && rm -f $logs)
exit $tests_rc
