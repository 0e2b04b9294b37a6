"""The in-tree build backend's choice of CUDA major (build_backend/stridedfa_build.py), without
building: requirements, distribution name and dependencies per major, and errors."""

import importlib
import shutil
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def backend(monkeypatch, tmp_path):
    # A stand-in for scikit_build_core.build: records what it is asked, reads pyproject.toml as the
    # real one would at that moment.
    calls = []
    fake = types.ModuleType("scikit_build_core.build")
    fake.get_requires_for_build_wheel = lambda settings=None: ["cmake>=3.26"]
    fake.get_requires_for_build_sdist = lambda settings=None: []
    fake.get_requires_for_build_editable = lambda settings=None: ["cmake>=3.26"]

    def build_wheel(directory, settings=None, metadata=None):
        calls.append((Path("pyproject.toml").read_text(), settings))
        return "wheel.whl"

    fake.build_wheel = build_wheel
    package = types.ModuleType("scikit_build_core")
    package.build = fake
    monkeypatch.setitem(sys.modules, "scikit_build_core", package)
    monkeypatch.setitem(sys.modules, "scikit_build_core.build", fake)
    monkeypatch.syspath_prepend(str(ROOT / "build_backend"))
    sys.modules.pop("stridedfa_build", None)
    module = importlib.import_module("stridedfa_build")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    monkeypatch.chdir(tmp_path)
    module.calls = calls
    return module


def test_default_is_cu13(backend, monkeypatch):
    monkeypatch.delenv("STRIDEDFA_CUDA_MAJOR", raising=False)
    requires = backend.get_requires_for_build_wheel()
    assert "nvidia-cuda-runtime==13.0.*" in requires and not any("cu12" in r for r in requires)
    backend.build_wheel("dist")
    text, settings = backend.calls[-1]
    assert 'name = "stridedfa-cu13"' in text
    assert settings["build-dir"].endswith("-cu13")


def test_cu12_renames_and_swaps_dependencies_then_restores(backend, monkeypatch):
    monkeypatch.setenv("STRIDEDFA_CUDA_MAJOR", "12")
    original = Path("pyproject.toml").read_text()
    requires = backend.get_requires_for_build_wheel()
    assert "nvidia-cuda-runtime-cu12==12.9.*" in requires and "nvidia-cuda-nvcc-cu12==12.9.*" in requires
    assert not any(r.startswith(("nvidia-cuda-runtime==", "nvidia-cudnn-cu13")) for r in requires)
    backend.build_wheel("dist")
    text, settings = backend.calls[-1]
    assert 'name = "stridedfa-cu12"' in text
    assert '"nvidia-cudnn-cu12>=9.10,<10"' in text and '"nvidia-cuda-runtime-cu12>=12.2,<13"' in text
    assert "cu13" not in text.split("[project]")[1].split("[project.optional-dependencies]")[0]
    assert settings["build-dir"].endswith("-cu12")
    assert Path("pyproject.toml").read_text() == original  # restored


def test_unknown_major_is_refused(backend, monkeypatch):
    monkeypatch.setenv("STRIDEDFA_CUDA_MAJOR", "11")
    with pytest.raises(ValueError, match="CUDA major 12 or 13"):
        backend.get_requires_for_build_wheel()


def test_header_locator_checks_the_major(tmp_path, monkeypatch):
    """cmake/locate_build_headers.py refuses headers of another major than the one asked for."""
    import subprocess

    include = tmp_path / "include"
    include.mkdir()
    (include / "cuda_runtime_api.h").write_text("#define CUDART_VERSION 13000\n")
    for header in ("cuda.h", "nvrtc.h"):
        (include / header).write_text("")
    (include / "crt").mkdir()
    (include / "crt" / "host_defines.h").write_text("")
    (include / "nv").mkdir()
    (include / "nv" / "target").write_text("")
    env = {"CUDA_HOME": str(tmp_path), "STRIDEDFA_CUDA_MAJOR": "12", "PATH": "/usr/bin:/bin"}
    code = ("import importlib.util, sys; sys.argv=['x']; "
            "spec = importlib.util.spec_from_file_location("
            f"'loc', {str(ROOT / 'cmake' / 'locate_build_headers.py')!r}); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); m.cuda_includes()")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode != 0 and "CUDA 13, but this build is for CUDA 12" in result.stderr
    env["STRIDEDFA_CUDA_MAJOR"] = "13"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
