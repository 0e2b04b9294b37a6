"""Prints the include directories the build needs, one `NAME=path` per line (a name may repeat), for
CMakeLists.txt.

Every header comes from a PyPI package in build-system.requires (see pyproject.toml), installed in
the build environment: cudnn-frontend (nvidia-cudnn-frontend: <site-packages>/include), cuDNN
(nvidia-cudnn-cu13: nvidia/cudnn/include) and the CUDA 13 runtime, crt, CCCL and NVRTC headers
(nvidia/cu13/include and its cccl/), and XLA's header-only FFI API for the JAX handlers (jaxlib:
jaxlib/include/xla/ffi/api). Where a full CUDA toolkit exists, CUDA_HOME (or CUDA_PATH) takes
precedence for the CUDA headers; CUDNN_INCLUDE_DIR overrides the cuDNN headers and
XLA_FFI_INCLUDE_DIR the XLA FFI headers (a folder holding xla/ffi/api/ffi.h).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys


def fail(message: str) -> None:
    sys.exit(f"stridedfa build: {message}")


def package_dirs(name: str) -> list[str]:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    return list(spec.submodule_search_locations or []) if spec else []


def first_with(candidates: list[str], header: str) -> str | None:
    for folder in candidates:
        if os.path.isfile(os.path.join(folder, header)):
            return folder
    return None


def frontend_include() -> str:
    try:
        dist = importlib.metadata.distribution("nvidia-cudnn-frontend")
    except importlib.metadata.PackageNotFoundError:
        fail("nvidia-cudnn-frontend is not installed in the build environment")
    folder = str(dist.locate_file("include"))
    if not os.path.isfile(os.path.join(folder, "cudnn_frontend.h")):
        fail(f"nvidia-cudnn-frontend has no include/cudnn_frontend.h (looked in {folder})")
    return folder


def cudnn_include() -> str:
    override = os.environ.get("CUDNN_INCLUDE_DIR")
    candidates = [override] if override else [os.path.join(d, "include") for d in package_dirs("nvidia.cudnn")]
    found = first_with(candidates, "cudnn.h")
    if not found:
        fail(f"cudnn.h not found (nvidia-cudnn-cu13 wheel or CUDNN_INCLUDE_DIR); looked in {candidates}")
    return found


def cuda_includes() -> list[str]:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and os.path.isfile(os.path.join(home, "include", "cuda_runtime_api.h")):
        root = os.path.join(home, "include")
    else:
        root = first_with([os.path.join(d, "include") for d in package_dirs("nvidia.cu13")], "cuda_runtime_api.h")
        if not root:
            fail("CUDA 13 headers not found: install nvidia-cuda-runtime/-crt/-cccl/-nvrtc 13 or set CUDA_HOME")
    folders = [root]
    cccl = os.path.join(root, "cccl")
    if os.path.isdir(cccl):
        folders.append(cccl)
    for header in ("cuda_runtime_api.h", "cuda.h", "nvrtc.h", "crt/host_defines.h", "nv/target"):
        if not any(os.path.exists(os.path.join(f, header)) for f in folders):
            fail(f"{header} is missing from the CUDA headers in {folders}")
    return folders


def xla_ffi_include() -> str:
    override = os.environ.get("XLA_FFI_INCLUDE_DIR")
    # find_spec locates jaxlib without importing it (an import loads XLA: slow, and may fail here).
    candidates = [override] if override else [os.path.join(d, "include") for d in package_dirs("jaxlib")]
    found = first_with(candidates, os.path.join("xla", "ffi", "api", "ffi.h"))
    if not found:
        fail(f"xla/ffi/api/ffi.h not found (jaxlib in the build environment, or XLA_FFI_INCLUDE_DIR); "
             f"looked in {candidates}")
    return found


if __name__ == "__main__":
    print(f"CUDNN_FRONTEND_INCLUDE_DIR={frontend_include()}")
    print(f"CUDNN_INCLUDE_DIR={cudnn_include()}")
    for folder in cuda_includes():
        print(f"CUDA_INCLUDE_DIRS={folder}")
    print(f"XLA_FFI_INCLUDE_DIR={xla_ffi_include()}")
