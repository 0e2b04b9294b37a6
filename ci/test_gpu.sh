#!/usr/bin/env bash
# Tests one built stridedfa wheel on an NVIDIA GPU: installs it, then runs the environment report,
# the tests, both benchmarks and the demo, writing every log and result into DIR. Every stage runs
# even if one fails; the exit status is the tests' (2: no GPU or a bad argument).
#
#   ci/test_gpu.sh --wheel PATH [--out DIR] [--tests gpu|all] [--with REQ]... [--python python3]
#                  [--offline] [--quick]
#
# PATH      a .whl file or a folder holding exactly one
# --out     folder for env.txt, pytest.log, pytest.xml, the benchmark JSON/markdown and logs,
#           summary.txt (default: gpu-results/)
# --tests   gpu: the tests marked `gpu` (default); all: the whole suite
# --with    an extra requirement for the fresh venv, e.g. torch, cupy-cuda13x (repeatable; most GPU
#           tests and the benchmarks need torch; pip's own PIP_* variables pick indexes)
# --offline no venv and no network (the GPU host): `pip install --no-index --no-deps --target` into
#           a temporary folder put on PYTHONPATH of --python; the test tools, torch etc. must
#           already be installed there
# --quick   passed to the benchmarks
# Stages: the tests (the stride fuzz apart), the stride fuzz at scale (STRIDEDFA_FUZZ_VALID valid and
# STRIDEDFA_FUZZ_INVALID invalid layouts, default 10000 / 2000; counts in fuzz.json), the benchmarks,
# the demo. Stage time limits (seconds): TESTS_TIMEOUT (420), FUZZ_TIMEOUT (420),
# HOST_BENCH_TIMEOUT (150), PATTERNS_TIMEOUT (150), ALLOC_BENCH_TIMEOUT (60), BENCH_TIMEOUT (200),
# DEMO_TIMEOUT (90).
# TESTS_SUBSET: a path under tests/ to run alone (a re-run of what failed), else every test.
# SKIP_STAGES: names to skip, e.g. "bench demo" (of: tests fuzz host patterns alloc bench demo).
set -euo pipefail

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

wheel="" out="gpu-results" tests=gpu python=python3 offline=0 quick=() extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheel) wheel=${2:?--wheel needs a value}; shift 2 ;;
    --out) out=${2:?--out needs a value}; shift 2 ;;
    --tests) tests=${2:?--tests needs a value}; shift 2 ;;
    --with) extra+=("${2:?--with needs a value}"); shift 2 ;;
    --python) python=${2:?--python needs a value}; shift 2 ;;
    --offline) offline=1; shift ;;
    --quick) quick=(--quick); shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "ci/test_gpu.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$tests" in gpu) marker=(-m gpu) ;; all) marker=() ;;
  *) echo "ci/test_gpu.sh: --tests must be gpu or all, got '$tests'" >&2; exit 2 ;; esac
if [ "$offline" = 1 ] && [ "${#extra[@]}" != 0 ]; then
  echo "ci/test_gpu.sh: --with needs the network; --offline installs nothing else" >&2; exit 2
fi
repo=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=ci/lib.sh
. "$repo/ci/lib.sh"
wheel=$(find_wheel "$wheel") || exit 2
if ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then
  echo "ci/test_gpu.sh: no usable NVIDIA GPU (nvidia-smi missing or failing)" >&2; exit 2
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ "$offline" = 1 ]; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --target "$work/site" "$wheel"
  export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
else
  "$python" -m venv "$work/venv"
  python="$work/venv/bin/python"
  "$python" -m pip install -q --upgrade pip
  "$python" -m pip install "${wheel}[test]" "${extra[@]}"
fi
cd "$work"  # import the installed package, never the source tree

set +e  # from here every stage runs; the exit status is the tests'
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  "$python" -c "import sys, stridedfa; print('python', sys.version.split()[0]); print('stridedfa', stridedfa.__version__, stridedfa.__file__)"
  "$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"
} > "$out/env.txt" 2>&1

skip() {  # true (and says so) when stage $1 is named in SKIP_STAGES
  case " ${SKIP_STAGES:-} " in
    *" $1 "*) echo "$1: skipped (SKIP_STAGES)" | tee -a "$out/summary.txt"; return 0 ;;
  esac
  return 1
}
tests_rc=0

# Most important first: a short lease may end before the later stages.
if ! skip tests; then
  timeout "${TESTS_TIMEOUT:-420}" "$python" -X faulthandler -m pytest "$repo/tests/${TESTS_SUBSET:-}" "${marker[@]}" \
    --ignore="$repo/tests/gpu/test_stride_fuzz.py" -p no:cacheprovider -q -rfEsx \
    --junitxml="$out/pytest.xml" > "$out/pytest.log" 2>&1
  tests_rc=$?
  echo "tests ($tests): exit $tests_rc; $(tail -n 1 "$out/pytest.log")" | tee -a "$out/summary.txt"
fi

if ! skip fuzz; then
  STRIDEDFA_FUZZ_VALID=${STRIDEDFA_FUZZ_VALID:-10000} STRIDEDFA_FUZZ_INVALID=${STRIDEDFA_FUZZ_INVALID:-2000} \
  STRIDEDFA_FUZZ_REPORT="$out/fuzz.json" timeout "${FUZZ_TIMEOUT:-420}" "$python" -X faulthandler -m pytest \
    "$repo/tests/gpu/test_stride_fuzz.py" -p no:cacheprovider -q -rfEsx > "$out/fuzz.log" 2>&1
  fuzz_rc=$?
  [ "$tests_rc" = 0 ] && tests_rc=$fuzz_rc
  echo "stride fuzz: exit $fuzz_rc; $(tail -n 1 "$out/fuzz.log")" | tee -a "$out/summary.txt"
fi

if ! skip host; then
  timeout "${HOST_BENCH_TIMEOUT:-150}" "$python" -X faulthandler "$repo/benchmarks/bench_host_overhead.py" \
    --out "$out" "${quick[@]}" > "$out/bench_host_overhead.log" 2>&1
  echo "host-overhead benchmark: exit $?" | tee -a "$out/summary.txt"
fi

if ! skip patterns; then
  timeout "${PATTERNS_TIMEOUT:-150}" "$python" -X faulthandler "$repo/benchmarks/bench_call_patterns.py" \
    --out "$out" "${quick[@]}" > "$out/bench_call_patterns.log" 2>&1
  echo "call-patterns benchmark: exit $?" | tee -a "$out/summary.txt"
fi

if ! skip alloc; then
  timeout "${ALLOC_BENCH_TIMEOUT:-60}" "$python" -X faulthandler "$repo/benchmarks/bench_allocation.py" \
    --out "$out/allocation.json" > "$out/bench_allocation.log" 2>&1
  echo "allocation benchmark: exit $?; $(tail -n 4 "$out/bench_allocation.log" | tr '\n' '|')" | tee -a "$out/summary.txt"
fi

if ! skip bench; then
  timeout "${BENCH_TIMEOUT:-200}" "$python" -X faulthandler "$repo/benchmarks/bench_attention.py" \
    --out "$out" "${quick[@]}" > "$out/bench.log" 2>&1
  echo "benchmark: exit $?" | tee -a "$out/summary.txt"
fi

if ! skip demo; then
  timeout "${DEMO_TIMEOUT:-90}" "$python" -X faulthandler -m stridedfa > "$out/demo.log" 2>&1
  echo "demo: exit $?" | tee -a "$out/summary.txt"
fi
exit $tests_rc
