"""stridedfa.info(): what stridedfa found on this machine, or why something is unavailable."""

from __future__ import annotations

import platform
import sys
from typing import Any

from stridedfa import _build_info, _core, _loader
from stridedfa._errors import StridedFAError
from stridedfa._version import __version__


def _version_str(v: int, scheme: str) -> str:
    if scheme == "cudnn":  # 91900 -> 9.19.0
        return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"
    return f"{v // 1000}.{v % 1000 // 10}"  # CUDA: 13000 -> 13.0


def info() -> dict[str, Any]:
    """Versions, library paths and devices, or the reason each is unavailable.

    Loads cuDNN and the CUDA runtime if no call has done so yet. Never raises for a missing GPU or
    library: the entry says why instead. Keys: ``stridedfa``, ``build`` (the commit it was built
    from, whether tracked files differed from it, its CUDA major), ``distribution`` (``stridedfa-cu13``
    or ``stridedfa-cu12``), ``cuda_major`` (the CUDA major this build is for: it loads only that
    major's runtime), ``python``, ``built_with`` (the cuDNN, cudnn-frontend and CUDA versions
    compiled against), ``cudnn`` and ``cuda_runtime`` (version,
    path, how it was found — or ``error``), ``cuda_driver``, ``devices`` (name and compute
    capability per ordinal — or ``error``), ``graph_cache``.
    """
    built = _core._compiled_versions()
    cuda_major = int(_build_info.CUDA_MAJOR)
    report: dict[str, Any] = {
        "stridedfa": __version__,
        "build": {"commit": _build_info.COMMIT, "dirty": _build_info.DIRTY, "cuda_major": cuda_major},
        "distribution": f"stridedfa-cu{cuda_major}",
        "cuda_major": cuda_major,
        "python": f"{platform.python_implementation()} {sys.version.split()[0]}",
        "built_with": {
            "cudnn": _version_str(built["cudnn"], "cudnn"),
            "cudnn_frontend": _version_str(built["cudnn_frontend"], "cudnn"),
            "cuda": _version_str(built["cuda"], "cuda"),
        },
    }
    try:
        libs = _loader.load()
        versions = _core._runtime_versions()
    except StridedFAError as error:
        reason = str(error)
        report["cudnn"] = {"error": reason}
        report["cuda_runtime"] = {"error": reason}
        report["cuda_driver"] = {"error": reason}
        report["devices"] = {"error": reason}
        report["graph_cache"] = _core.cache_info()
        return report
    report["cudnn"] = {"version": _version_str(versions["cudnn"], "cudnn"), "path": libs.cudnn.path,
                       "found_via": libs.cudnn.found_via}
    report["cuda_runtime"] = {"version": _version_str(versions["cuda_runtime"], "cuda"),
                              "path": libs.cudart.path, "found_via": libs.cudart.found_via}
    driver = versions["cuda_driver"]
    report["cuda_driver"] = ({"version": _version_str(driver, "cuda")} if driver
                             else {"error": "no CUDA driver is installed"})
    try:
        report["devices"] = [
            {"index": index, "name": name, "compute_capability": f"{cc[0]}.{cc[1]}"}
            for index, name, cc in _core._devices()
        ]
    except StridedFAError as error:
        report["devices"] = {"error": str(error)}
    report["graph_cache"] = _core.cache_info()
    return report
