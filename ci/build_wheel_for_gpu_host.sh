#!/usr/bin/env bash
# Builds the stridedfa-cu13 wheel for the GPU host (CPython 3.12, no network) into .whl/ (ignored
# by git): ci/build_wheel.sh --local, the same isolated build as `pip install .`, from this
# checkout. ci/gpu_host_run.sh installs it there.
#   usage: ci/build_wheel_for_gpu_host.sh [path/to/python3.12]
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-python3.12}
mkdir -p .whl
rm -f .whl/*.whl
ci/build_wheel.sh --local --cuda-major 13 --interpreter "$python" --out .whl
ls -la .whl
