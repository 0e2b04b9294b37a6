#!/usr/bin/env bash
# The cheap packaging checks of the fast gate (.ci/run): files only, no build, no GPU, seconds.
#
#   ci/check_packaging.sh [--root REPO] [--python python3]
#
# 1. ci/check_metadata.py: ci/matrix.yml is valid and expands for every job kind; metadata
#    consistency: one version source, requires-python vs the matrix's Pythons, the matrix's CUDA
#    majors vs what the build supports.
# 2. The conda recipe renders and agrees with pyproject.toml (ci/check_recipe.py), when recipe/
#    exists.
# 3. Every ci/ script the workflows call exists and is executable (ci/build_conda.sh and
#    ci/check_recipe.py once recipe/ exists: they come with it).
# Every check runs; the exit status is 1 if any failed. Needs PyYAML (`pip install pyyaml`, or
# the test extra) and, on Python 3.10, tomli.
set -euo pipefail

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

ci=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$ci") python=python3
while [ $# -gt 0 ]; do
  case "$1" in
    --root) root=${2:?--root needs a value}; shift 2 ;;
    --python) python=${2:?--python needs a value}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "ci/check_packaging.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
"$python" -c 'import yaml' 2>/dev/null || {
  echo "ci/check_packaging.sh: needs PyYAML in $python (pip install pyyaml)" >&2; exit 2; }

failed=0
"$python" "$root/ci/check_metadata.py" --root "$root" || failed=1
if [ -d "$root/recipe" ]; then
  "$python" "$root/ci/check_recipe.py" || failed=1
else
  echo "no recipe/: conda recipe check skipped"
fi
# The conda scripts come with recipe/ (ci/build_conda.sh, ci/check_recipe.py): checked once it is there.
while read -r script; do
  case "$script" in ci/build_conda.sh|ci/check_recipe.py) [ -d "$root/recipe" ] || continue ;; esac
  if [ ! -x "$root/$script" ]; then
    echo "ci/check_packaging.sh: the workflow calls $script, which is missing or not executable" >&2; failed=1
  fi
done < <(grep -ohE '(^|[^A-Za-z0-9_./-])ci/[A-Za-z0-9_./-]+\.(sh|py)' "$root"/.github/workflows/*.yml \
         | grep -oE 'ci/.*' | sort -u)
if [ "$failed" != 0 ]; then echo "packaging checks: FAILED (see above)" >&2; exit 1; fi
echo "packaging checks: passed"
