#!/usr/bin/env bash
# Tests one built stridedfa wheel without a GPU: a fresh virtual environment, the wheel with its
# test extras (`pip install "WHEEL[test]"`), then the demo (`python -m stridedfa`) and the test suite
# of this checkout, both run from outside the source tree so that the installed package is the one
# imported. Tests marked `gpu` skip with their reason.
#
#   ci/test_cpu.sh --wheel PATH [--python python3]
#
# PATH is a .whl file or a folder holding exactly one. --python: the interpreter the venv is made
# from (default python3; it must match the wheel's CPython).
set -euo pipefail

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

wheel="" python=python3
while [ $# -gt 0 ]; do
  case "$1" in
    --wheel) wheel=${2:?--wheel needs a value}; shift 2 ;;
    --python) python=${2:?--python needs a value}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "ci/test_cpu.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
repo=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=ci/lib.sh
. "$repo/ci/lib.sh"
wheel=$(find_wheel "$wheel") || exit 2

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m venv "$work/venv"
venv_python="$work/venv/bin/python"
"$venv_python" -m pip install -q --upgrade pip
"$venv_python" -m pip install "${wheel}[test]"

cd "$work"  # import the installed package, never the source tree
"$venv_python" -c 'import stridedfa, sys; print("stridedfa", stridedfa.__version__, "from", stridedfa.__file__); sys.exit(not stridedfa.__file__.startswith(sys.prefix))'
"$venv_python" -X faulthandler -m stridedfa
"$venv_python" -X faulthandler -m pytest "$repo/tests" -p no:cacheprovider -q -rfEsx
