"""Loading: a light import, cuDNN found on first use (or a clear reason), a clean symbol table."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import stridedfa
from stridedfa import _core, _loader


def run_python(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})


def test_import_loads_no_framework_and_no_cuda_library():
    result = run_python("""
        import sys
        import stridedfa
        heavy = [m for m in ("torch", "jax", "cupy", "cuda.core", "cuda.pathfinder") if m in sys.modules]
        maps = open("/proc/self/maps").read()
        libs = [name for name in ("libcudnn", "libcudart", "libcuda.so") if name in maps]
        print(heavy, libs)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[] []"


def test_info_never_raises_and_says_what_it_found():
    report = stridedfa.info()
    assert report["stridedfa"] == stridedfa.__version__
    assert report["built_with"]["cudnn_frontend"] == "1.32.0"
    assert report["built_with"]["cuda"].startswith("13.")
    for key in ("cudnn", "cuda_runtime", "devices"):
        entry = report[key]
        assert isinstance(entry, (dict, list)) and entry, key
        if isinstance(entry, dict):
            assert "error" in entry or "version" in entry, (key, entry)


def test_cudnn_search_reports_every_step():
    with pytest.raises(stridedfa.BackendError) as error:
        _loader.find_cudnn(steps=("override",))
    message = str(error.value)
    assert "STRIDEDFA_CUDNN_LIBRARY: not set" in message
    assert "pip install nvidia-cudnn-cu13" in message


def test_cudnn_override_that_cannot_load(monkeypatch, tmp_path):
    bogus = tmp_path / "libcudnn.so.9"
    bogus.write_text("not a library")
    monkeypatch.setenv("STRIDEDFA_CUDNN_LIBRARY", str(bogus))
    with pytest.raises(stridedfa.BackendError, match=r"STRIDEDFA_CUDNN_LIBRARY=.*cannot be loaded"):
        _loader.find_cudnn(steps=("override",))


def test_not_loaded_in_a_fresh_process():
    result = run_python("""
        from stridedfa import _loader
        try:
            _loader.find_cudnn(steps=("loaded",))
        except Exception as error:
            print(type(error).__name__, error)
    """)
    assert "BackendError" in result.stdout and "this process: not loaded yet" in result.stdout


def test_unknown_search_step():
    with pytest.raises(ValueError, match="unknown search step"):
        _loader.find_cudnn(steps=("nowhere",))


def test_calls_without_a_gpu_fail_with_backend_error_after_validation():
    """A valid call on a machine without a GPU or driver: BackendError, never a crash."""
    if not isinstance(stridedfa.info()["devices"], dict):
        pytest.skip("a GPU is present")
    import numpy as np

    from helpers.fake_dlpack import FakeTensor

    # A CPU array is a layout problem: reported before anything is loaded.
    q = np.ones((1, 1, 8, 64), np.float16)
    with pytest.raises(stridedfa.LayoutError, match="needs a CUDA device"):
        stridedfa.sdpa_forward(q, q, q, q.copy())
    # A well-formed "CUDA" call gets as far as the device query.
    tensors = [FakeTensor((1, 1, 16, 64), data=0x7F0000000000 + i * (1 << 30)) for i in range(4)]
    with pytest.raises(stridedfa.BackendError):
        stridedfa.sdpa_forward(*tensors)


def test_extension_exports_only_its_init_function():
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    listing = subprocess.run([nm, "-D", "--defined-only", _core.__file__], capture_output=True, text=True,
                             check=True).stdout
    symbols = [line.split()[-1] for line in listing.splitlines() if line.strip()]
    assert symbols == ["PyInit__core"], symbols


@pytest.mark.parametrize("order", ["torch-first", "stridedfa-first"])
def test_runs_beside_torch_in_either_import_order(order):
    pytest.importorskip("torch")
    first, second = ("torch", "stridedfa") if order == "torch-first" else ("stridedfa", "torch")
    result = run_python(f"""
        import {first}, {second}
        import torch, stridedfa
        x = torch.ones(8, 8) @ torch.ones(8, 8)        # torch's own C++ runs
        report = stridedfa.info()                      # ours loads cuDNN / CUDA if present
        try:
            stridedfa.torch.attention(torch.ones(1, 1, 8, 64, dtype=torch.bfloat16),
                                      torch.ones(1, 1, 8, 64, dtype=torch.bfloat16),
                                      torch.ones(1, 1, 8, 64, dtype=torch.bfloat16))
        except stridedfa.LayoutError as error:
            assert "needs a CUDA device" in str(error), error
        print("ok", float(x[0, 0]))
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok 8.0")


def _other_major_cudart():
    """A CUDA runtime of the other major than this build's, if one is installed (wheel layout)."""
    import glob
    import importlib.util

    from stridedfa import _core

    major = _core._compiled_versions()["cuda"] // 1000
    package, soname = ("nvidia.cuda_runtime", "libcudart.so.12") if major == 13 else ("nvidia.cu13", "libcudart.so.13")
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(glob.glob(f"{folder}/lib/{soname}*"))
        if found:
            return found[0]
    return None


def test_a_runtime_of_the_other_cuda_major_is_refused_by_name():
    """A cu13 build offered libcudart.so.12 (or a cu12 build .so.13) refuses it, saying which
    distribution fits, before touching any other symbol (the majors export different ones)."""
    other = _other_major_cudart()
    if other is None:
        pytest.skip("no CUDA runtime wheel of the other major is installed (nvidia-cuda-runtime-cu12 / "
                    "nvidia-cuda-runtime)")
    script = f"""
import stridedfa
from stridedfa import _core, _loader
_loader.find_cudart = lambda: _loader.Library(path={other!r}, handle=0, found_via="test")
try:
    _core._load_libraries()
    print("LOADED")
except stridedfa.BackendError as error:
    print("REFUSED", error)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "REFUSED" in result.stdout, result.stdout + result.stderr
    assert "was built for CUDA" in result.stdout and "install stridedfa-cu" in result.stdout, result.stdout


def test_the_build_records_its_commit_and_cuda_major():
    """The build writes what it is into the package (stridedfa/_build_info.py): info() reports it,
    and the loader's CUDA major is the one the extension was compiled against."""
    import re

    from stridedfa import _build_info, _core

    build = stridedfa.info()["build"]
    assert re.fullmatch(r"[0-9a-f]{40}|unknown", build["commit"]), build
    assert build["dirty"] in ("true", "false", "unknown"), build
    assert build["cuda_major"] == _build_info.CUDA_MAJOR == _core._compiled_versions()["cuda"] // 1000
