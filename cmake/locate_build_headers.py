"""Prints the include directories the build needs, one `NAME=path` per line (a name may repeat), for
CMakeLists.txt.

Every header comes from a PyPI package in the build requirements (pyproject.toml and, per CUDA
major, build_backend/stridedfa_build.py), installed in the build environment: cudnn-frontend
(nvidia-cudnn-frontend: <site-packages>/include), cuDNN (nvidia-cudnn-cuXX: nvidia/cudnn/include),
the CUDA runtime, crt, CCCL and NVRTC headers of the major in STRIDEDFA_CUDA_MAJOR (13, the
default: nvidia/cu13/include and its cccl/; 12: one folder per component, nvidia/cuda_runtime,
cuda_nvcc (crt), cuda_cccl, cuda_nvrtc), and XLA's header-only FFI API for the JAX handlers
(jaxlib: jaxlib/include/xla/ffi/api). Where a full CUDA toolkit exists, CUDA_HOME (or CUDA_PATH)
takes precedence for the CUDA headers; CUDNN_INCLUDE_DIR overrides the cuDNN headers and
XLA_FFI_INCLUDE_DIR the XLA FFI headers (a folder holding xla/ffi/api/ffi.h). The CUDA headers'
CUDART_VERSION must belong to the chosen major.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import sys

CUDA_MAJOR = os.environ.get("STRIDEDFA_CUDA_MAJOR", "13").strip()
# Where each major's header wheels put their include folders (package paths under site-packages).
CUDA_HEADER_PACKAGES = {
    "13": ["nvidia.cu13"],
    "12": ["nvidia.cuda_runtime", "nvidia.cuda_nvcc", "nvidia.cuda_cccl", "nvidia.cuda_nvrtc"],
}


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
        fail(f"cudnn.h not found (nvidia-cudnn-cu{CUDA_MAJOR} wheel or CUDNN_INCLUDE_DIR); looked in {candidates}")
    return found


def cuda_includes() -> list[str]:
    if CUDA_MAJOR not in CUDA_HEADER_PACKAGES:
        fail(f"STRIDEDFA_CUDA_MAJOR={CUDA_MAJOR!r}: stridedfa builds for CUDA 12 or 13")
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and os.path.isfile(os.path.join(home, "include", "cuda_runtime_api.h")):
        folders = [os.path.join(home, "include")]
    else:
        folders = [os.path.join(d, "include") for package in CUDA_HEADER_PACKAGES[CUDA_MAJOR]
                   for d in package_dirs(package) if os.path.isdir(os.path.join(d, "include"))]
        if not first_with(folders, "cuda_runtime_api.h"):
            fail(f"CUDA {CUDA_MAJOR} headers not found: install the header wheels the build backend "
                 f"asks for (build_backend/stridedfa_build.py) or set CUDA_HOME")
    for folder in list(folders):
        cccl = os.path.join(folder, "cccl")  # CUDA 13 keeps CCCL in a subfolder
        if os.path.isdir(cccl):
            folders.append(cccl)
    for header in ("cuda_runtime_api.h", "cuda.h", "nvrtc.h", "crt/host_defines.h", "nv/target"):
        if not any(os.path.exists(os.path.join(f, header)) for f in folders):
            fail(f"{header} is missing from the CUDA headers in {folders}")
    check_major(first_with(folders, "cuda_runtime_api.h"))
    return folders


def check_major(folder: str) -> None:
    with open(os.path.join(folder, "cuda_runtime_api.h"), encoding="utf-8", errors="replace") as f:
        match = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", f.read())
    if not match:
        fail(f"no CUDART_VERSION in {folder}/cuda_runtime_api.h")
    found = int(match.group(1)) // 1000
    if str(found) != CUDA_MAJOR:
        fail(f"the CUDA headers in {folder} are CUDA {found}, but this build is for CUDA {CUDA_MAJOR} "
             f"(STRIDEDFA_CUDA_MAJOR); point CUDA_HOME at a CUDA {CUDA_MAJOR} toolkit or unset it")


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
