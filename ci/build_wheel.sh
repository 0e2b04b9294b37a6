#!/usr/bin/env bash
# Builds one stridedfa wheel: stridedfa-cu<MAJOR> for one CPU arch and CPython.
#
#   ci/build_wheel.sh --cuda-major 12|13 [--arch x86_64|aarch64] [--python 3.12] [--out DIR]
#   ci/build_wheel.sh --cuda-major 12|13 --local [--python 3.12 | --interpreter PATH] [--out DIR]
#
# Default: cibuildwheel builds the cell cp3XY-manylinux_<arch> in its manylinux container
# (configuration: [tool.cibuildwheel] in pyproject.toml); needs cibuildwheel and docker/podman
# (`pip install cibuildwheel`). The arch must be the machine's own (native builds, no QEMU).
# --local: `pip wheel --no-deps` with one interpreter on this machine (pythonX.Y from --python,
# --interpreter PATH, else python3); the wheel is tagged linux_<arch>, for local and GPU-host use.
# Then, when installed: `auditwheel show` and `twine check --strict`.
#
# Both export STRIDEDFA_CUDA_MAJOR, which the build backend reads (cibuildwheel passes it into its
# container through CIBW_ENVIRONMENT_PASS_LINUX, which leaves [tool.cibuildwheel] environment
# settings in pyproject.toml in force). The built wheel must be named stridedfa_cu<MAJOR>-*;
# it is moved into DIR (default: dist/) and its path is the last line printed.
set -euo pipefail

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

cuda_major="" arch=$(uname -m) python="" interpreter="" out="dist" local=0
while [ $# -gt 0 ]; do
  case "$1" in
    --cuda-major) cuda_major=${2:?--cuda-major needs a value}; shift 2 ;;
    --arch) arch=${2:?--arch needs a value}; shift 2 ;;
    --python) python=${2:?--python needs a value}; shift 2 ;;
    --interpreter) interpreter=${2:?--interpreter needs a value}; shift 2 ;;
    --out) out=${2:?--out needs a value}; shift 2 ;;
    --local) local=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "ci/build_wheel.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$cuda_major" in 12|13) ;; *) echo "ci/build_wheel.sh: --cuda-major must be 12 or 13, got '$cuda_major'" >&2; exit 2 ;; esac
case "$arch" in x86_64|aarch64) ;; *) echo "ci/build_wheel.sh: --arch must be x86_64 or aarch64, got '$arch'" >&2; exit 2 ;; esac
if [ -n "$python" ] && ! [[ "$python" =~ ^3\.[0-9]+$ ]]; then
  echo "ci/build_wheel.sh: --python must look like 3.12, got '$python'" >&2; exit 2
fi
if [ "$arch" != "$(uname -m)" ]; then
  echo "ci/build_wheel.sh: --arch $arch on a $(uname -m) machine: build on a native $arch runner" >&2; exit 2
fi

repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export STRIDEDFA_CUDA_MAJOR=$cuda_major

if [ "$local" = 1 ]; then
  if [ -z "$interpreter" ]; then interpreter=${python:+python$python}; interpreter=${interpreter:-python3}; fi
  if [ -n "$python" ] && [ "$("$interpreter" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" != "$python" ]; then
    echo "ci/build_wheel.sh: $interpreter is not CPython $python" >&2; exit 2
  fi
  "$interpreter" -m pip wheel --no-deps -w "$work" "$repo"
else
  if [ -n "$interpreter" ]; then echo "ci/build_wheel.sh: --interpreter needs --local" >&2; exit 2; fi
  python=${python:-3.12}
  command -v cibuildwheel >/dev/null || { echo "ci/build_wheel.sh: cibuildwheel not found (pip install cibuildwheel)" >&2; exit 2; }
  CIBW_BUILD="cp${python/./}-manylinux_$arch" CIBW_ARCHS="$arch" \
  CIBW_ENVIRONMENT_PASS_LINUX="STRIDEDFA_CUDA_MAJOR" \
    cibuildwheel --platform linux --output-dir "$work" "$repo"
fi

shopt -s nullglob
wheels=("$work"/*.whl)
if [ "${#wheels[@]}" != 1 ]; then
  echo "ci/build_wheel.sh: expected one wheel, found ${#wheels[@]}: ${wheels[*]:-none}" >&2; exit 1
fi
wheel=${wheels[0]}
case "$(basename "$wheel")" in
  "stridedfa_cu${cuda_major}-"*) ;;
  *) echo "ci/build_wheel.sh: built $(basename "$wheel"), expected stridedfa_cu${cuda_major}-*:" \
          "the build backend ignored STRIDEDFA_CUDA_MAJOR=$cuda_major" >&2; exit 1 ;;
esac

if command -v auditwheel >/dev/null; then auditwheel show "$wheel"; else echo "auditwheel not installed: skipped"; fi
if command -v twine >/dev/null; then twine check --strict "$wheel"; else echo "twine not installed: skipped"; fi
mv -f "$wheel" "$out/"
echo "$out/$(basename "$wheel")"
