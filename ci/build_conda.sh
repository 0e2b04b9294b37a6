#!/usr/bin/env bash
# Builds the stridedfa conda packages with conda-build (recipe/meta.yaml), after the offline recipe
# check (ci/check_recipe.py). Needs conda-build and a reachable channel (conda-forge by default).
#
# Usage: ci/build_conda.sh [options] [-- extra conda-build arguments]
#   --cuda VERSION        cuda_compiler_version to build: 12.9, 13.0 or all (default: all). The
#                         matching c_stdlib_version (12.9 -> 2.17, 13.0 -> 2.28) comes with it.
#   --python VERSION      Python to build for: 3.10 ... 3.13 or all (default: all)
#   --target-platform P   linux-64 or linux-aarch64 (default: the machine's own; cross-building is
#                         passed to conda-build as the target_platform variant and is untested)
#   --output-dir DIR      where the packages go (conda-build --output-folder; default: dist/conda)
#   --channel CH          channel to solve from; repeatable (default: conda-forge). Only these
#                         channels are used (--override-channels).
#   --no-test             skip the recipe's test section (import, stridedfa.info(), the CPU demo)
#   --skip-check          do not run ci/check_recipe.py first
#   --dry-run             print the conda-build command instead of running it
# Examples:
#   ci/build_conda.sh                              # all 8 variants of this platform
#   ci/build_conda.sh --cuda 13.0 --python 3.12    # one package
#   ci/build_conda.sh --cuda 12.9 -- --keep-old-work
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cuda=all
python=all
target_platform=
output_dir="${repo}/dist/conda"
channels=()
test_args=()
check=1
dry_run=0
extra=()

usage() { sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cuda) cuda="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    --target-platform) target_platform="$2"; shift 2 ;;
    --output-dir) output_dir="$2"; shift 2 ;;
    --channel) channels+=("$2"); shift 2 ;;
    --no-test) test_args=(--no-test); shift ;;
    --skip-check) check=0; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "build_conda.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ ${#channels[@]} -gt 0 ]] || channels=(conda-forge)

# The variant selection, as YAML for conda-build's --variants. cuda_compiler_version and
# c_stdlib_version are zipped in recipe/conda_build_config.yaml, so both are narrowed together.
variants=()
case "${cuda}" in
  all) ;;
  12.9) variants+=("cuda_compiler_version: ['12.9']" "c_stdlib_version: ['2.17']") ;;
  13.0) variants+=("cuda_compiler_version: ['13.0']" "c_stdlib_version: ['2.28']") ;;
  *) echo "build_conda.sh: --cuda must be 12.9, 13.0 or all, not ${cuda}" >&2; exit 2 ;;
esac
case "${python}" in
  all) ;;
  3.1[0-3]) variants+=("python: ['${python}']") ;;
  *) echo "build_conda.sh: --python must be 3.10 ... 3.13 or all, not ${python}" >&2; exit 2 ;;
esac
case "${target_platform}" in
  "") ;;
  linux-64|linux-aarch64) variants+=("target_platform: ['${target_platform}']") ;;
  *) echo "build_conda.sh: --target-platform must be linux-64 or linux-aarch64" >&2; exit 2 ;;
esac

command=(conda-build "${repo}/recipe" --output-folder "${output_dir}" --no-anaconda-upload --override-channels)
for channel in "${channels[@]}"; do
  command+=(-c "${channel}")
done
if [[ ${#variants[@]} -gt 0 ]]; then
  joined=$(IFS=,; echo "${variants[*]}")
  command+=(--variants "{${joined//,/, }}")
fi
command+=("${test_args[@]}" "${extra[@]}")

if [[ ${check} -eq 1 ]]; then
  "${PYTHON:-python3}" "${repo}/ci/check_recipe.py" --recipe "${repo}/recipe"
fi
if [[ ${dry_run} -eq 1 ]]; then
  printf '%q ' "${command[@]}"
  echo
  exit 0
fi
if ! command -v conda-build >/dev/null; then
  echo "build_conda.sh: conda-build is not installed (conda install -c conda-forge conda-build)" >&2
  exit 2
fi
mkdir -p "${output_dir}"
"${command[@]}"
