#!/usr/bin/env bash
# conda-build runs this in the work directory with $PREFIX (host), $PYTHON, $SP_DIR,
# $target_platform and the variant's keys (cuda_compiler_version, ...) in the environment.
# shellcheck disable=SC2154  # cuda_compiler_version, target_platform: set by conda-build
set -euxo pipefail

# The CUDA major stridedfa is built for (frontend code branches on CUDART_VERSION), as for the
# pip builds: STRIDEDFA_CUDA_MAJOR=12|13.
export STRIDEDFA_CUDA_MAJOR="${cuda_compiler_version%%.*}"

# conda-forge's CUDA packages put their headers in $PREFIX/targets/<arch>/include (not symlinked
# into $PREFIX/include); cmake/locate_build_headers.py takes CUDA_HOME/include (and its cccl/
# subfolder when there is one) as the CUDA headers.
case "${target_platform}" in
  linux-64) cuda_target=x86_64-linux ;;
  linux-aarch64) cuda_target=sbsa-linux ;;
  *) echo "stridedfa recipe: unsupported target_platform ${target_platform}" >&2; exit 1 ;;
esac
export CUDA_HOME="${PREFIX}/targets/${cuda_target}"
# libcudnn-dev installs cudnn*.h into $PREFIX/include; jaxlib keeps the XLA FFI headers in its
# package folder. cudnn-frontend's headers are found through python-cudnn-frontend's
# nvidia-cudnn-frontend distribution metadata ($SP_DIR/include).
export CUDNN_INCLUDE_DIR="${PREFIX}/include"
export XLA_FFI_INCLUDE_DIR="${SP_DIR}/jaxlib/include"

# Fail early, naming the missing header and the package that should have provided it.
for pair in \
    "${CUDA_HOME}/include/cuda_runtime_api.h:cuda-cudart-dev" \
    "${CUDA_HOME}/include/cuda.h:cuda-cudart-dev" \
    "${CUDA_HOME}/include/crt/host_defines.h:cuda-crt-dev_${target_platform}" \
    "${CUDA_HOME}/include/nvrtc.h:cuda-nvrtc-dev" \
    "${CUDNN_INCLUDE_DIR}/cudnn.h:libcudnn-dev" \
    "${SP_DIR}/include/cudnn_frontend.h:python-cudnn-frontend" \
    "${XLA_FFI_INCLUDE_DIR}/xla/ffi/api/ffi.h:jaxlib"; do
  if [[ ! -f "${pair%%:*}" ]]; then
    echo "stridedfa recipe: ${pair%%:*} is missing (host package ${pair##*:})" >&2
    exit 1
  fi
done
if [[ ! -e "${CUDA_HOME}/include/nv/target" && ! -e "${CUDA_HOME}/include/cccl/nv/target" ]]; then
  echo "stridedfa recipe: nv/target is missing under ${CUDA_HOME}/include (host package cuda-cccl)" >&2
  exit 1
fi

"${PYTHON}" -m pip install . --no-build-isolation --no-deps -vv
