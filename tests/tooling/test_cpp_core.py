"""The core's C++ tests (cpp/tests: doctest), configured, built and run from here so that the
README's one test command covers them. They need a C++17 compiler, CMake, doctest's header (Debian:
doctest-dev) and cuda.h (the nvidia-cuda-runtime wheel, or a CUDA toolkit); without one of those
this test skips and says which. .ci/run installs them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCTEST_FOLDERS = ("/usr/include", "/usr/local/include")


def _cuda_include() -> str | None:
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home and (Path(home) / "include" / "cuda.h").exists():
            return str(Path(home) / "include")
    try:
        import nvidia
    except ImportError:
        return None
    for root in nvidia.__path__:  # CUDA 13 wheels: nvidia/cu13/include; CUDA 12: nvidia/cuda_runtime/include
        for folder in ("cu13/include", "cuda_runtime/include"):
            if (Path(root) / folder / "cuda.h").exists():
                return str(Path(root) / folder)
    return None


def test_core_cpp_tests_pass(tmp_path):
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"no {', '.join(missing)} to build the C++ tests")
    if not any((Path(folder) / "doctest" / "doctest.h").exists() for folder in DOCTEST_FOLDERS):
        pytest.skip("doctest's header is not installed (Debian: apt-get install doctest-dev)")
    cuda_include = _cuda_include()
    if cuda_include is None:
        pytest.skip("no cuda.h (pip install nvidia-cuda-runtime, or set CUDA_HOME)")
    build = tmp_path / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    steps = [
        ["cmake", "-S", str(ROOT / "cpp" / "tests"), "-B", str(build), *generator, "-DCMAKE_BUILD_TYPE=Debug",
         f"-DCUDA_INCLUDE_DIR={cuda_include}"],
        ["cmake", "--build", str(build), "--parallel", str(os.cpu_count() or 2)],
        [str(build / "stridedfa_cpp_tests")],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        sys.stdout.write(done.stdout[-4000:])
        assert done.returncode == 0, f"{' '.join(step[:3])}: {done.stdout[-6000:]}\n{done.stderr[-4000:]}"
