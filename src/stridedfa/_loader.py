"""Finding cuDNN and the CUDA runtime at first GPU use (nothing is linked at build time).

libcudnn.so.9 is taken, in this order, from:
  1. the process, when some library already loaded it (so torch or JAX and stridedfa share one
     cuDNN);
  2. the ``nvidia-cudnn-cu13`` (or, for a CUDA 12 build, ``nvidia-cudnn-cu12``) wheel;
  3. the path in ``STRIDEDFA_CUDNN_LIBRARY``;
  4. the system: cuda-pathfinder's search (the dynamic loader's path, conda, CUDA_HOME).
The CUDA runtime (libcudart.so.13, or .12 for a CUDA 12 build) comes from cuda-pathfinder, which
also prefers a copy already loaded; the core refuses a runtime of another major than it was built
for. The result, or why nothing was found, is remembered for the process and shown by
``stridedfa.info()``.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import threading
from dataclasses import dataclass

from stridedfa._errors import BackendError

CUDNN_SONAME = "libcudnn.so.9"
CUDNN_OVERRIDE_ENV = "STRIDEDFA_CUDNN_LIBRARY"
CUDNN_STEPS = ("loaded", "wheel", "override", "system")


@dataclass(frozen=True)
class Library:
    path: str
    found_via: str  # one of CUDNN_STEPS, or cuda-pathfinder's description for the runtime
    handle: int  # dlopen handle


@dataclass(frozen=True)
class Libraries:
    cudnn: Library
    cudart: Library


_lock = threading.Lock()
_result: Libraries | BackendError | None = None


def load() -> Libraries:
    """The libraries for this process, found on the first call; raises BackendError if missing."""
    global _result
    with _lock:
        if _result is None:
            try:
                _result = Libraries(cudnn=find_cudnn(), cudart=find_cudart())
            except BackendError as error:
                _result = error
        if isinstance(_result, BackendError):
            raise _result
        return _result


def status() -> Libraries | BackendError | None:
    """What load() found or why it failed; None before the first attempt."""
    return _result


def _loaded_path(soname: str) -> str:
    """Where the process mapped a library from, read from /proc/self/maps."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(" ", 5)[-1].strip()
                if os.path.basename(path) == soname:
                    return path
    except OSError:
        pass
    return soname


def _open(path: str, mode: int = os.RTLD_NOW | os.RTLD_LOCAL) -> int:
    return ctypes.CDLL(path, mode=mode)._handle


def find_cudnn(steps: tuple[str, ...] = CUDNN_STEPS) -> Library:
    """Finds and opens libcudnn.so.9 trying ``steps`` in order; BackendError lists every attempt."""
    tried = []
    for step in steps:
        try:
            if step == "loaded":
                try:
                    handle = _open(CUDNN_SONAME, os.RTLD_NOW | os.RTLD_NOLOAD)
                except OSError:
                    tried.append("this process: not loaded yet")
                    continue
                return Library(_loaded_path(CUDNN_SONAME), step, handle)
            if step == "wheel":
                path = _wheel_cudnn()
                if path is None:
                    tried.append(f"nvidia-cudnn-cu{_cuda_major()} wheel: not installed")
                    continue
                return Library(path, step, _open(path))
            if step == "override":
                path = os.environ.get(CUDNN_OVERRIDE_ENV)
                if not path:
                    tried.append(f"{CUDNN_OVERRIDE_ENV}: not set")
                    continue
                try:
                    return Library(path, step, _open(path))
                except OSError as error:
                    raise BackendError(f"{CUDNN_OVERRIDE_ENV}={path} cannot be loaded: {error}") from None
            if step == "system":
                return _pathfinder_library("cudnn", step)
            raise ValueError(f"unknown search step {step!r}")
        except OSError as error:
            tried.append(f"{step}: {error}")
        except _NotFound as error:
            tried.append(f"{step}: {error}")
    raise BackendError(
        "cuDNN 9 (libcudnn.so.9) was not found; tried " + "; ".join(tried)
        + f". Install it with `pip install nvidia-cudnn-cu{_cuda_major()}`, or set {CUDNN_OVERRIDE_ENV} to "
        "its path.")


def find_cudart() -> Library:
    """Opens the CUDA runtime of the major stridedfa was built for through cuda-pathfinder."""
    major = _cuda_major()
    try:
        return _pathfinder_library("cudart", "cuda-pathfinder")
    except _NotFound as error:
        wheel = "nvidia-cuda-runtime" if major >= 13 else f"nvidia-cuda-runtime-cu{major}"
        raise BackendError(
            f"the CUDA runtime (libcudart.so.{major}) was not found: {error}. Install it with "
            f"`pip install {wheel}`.") from None


def _cuda_major() -> int:
    """The CUDA major this build of stridedfa was compiled for (its distribution's -cuXX), as the
    build wrote it into the package."""
    from stridedfa import _build_info

    return int(_build_info.CUDA_MAJOR)


class _NotFound(Exception):
    pass


def _wheel_cudnn() -> str | None:
    try:
        spec = importlib.util.find_spec("nvidia.cudnn")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, "lib", CUDNN_SONAME)
        if os.path.isfile(path):
            return path
    return None


def _pathfinder_library(name: str, found_via: str) -> Library:
    try:
        from cuda import pathfinder
    except ImportError as error:
        raise _NotFound(f"cuda-pathfinder is not installed ({error})") from None
    try:
        loaded = pathfinder.load_nvidia_dynamic_lib(name)
    except pathfinder.DynamicLibNotFoundError as error:
        raise _NotFound(str(error).splitlines()[0]) from None
    path = loaded.abs_path or _loaded_path(name)
    via = found_via if found_via != "cuda-pathfinder" else f"cuda-pathfinder ({loaded.found_via})"
    return Library(path, via, _open(path))
