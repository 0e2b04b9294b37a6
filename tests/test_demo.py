"""``python -m stridedfa``: the demo runs, and passes, with each way to get device memory -- torch,
CuPy alone, cuda.core alone (no framework) -- and without a GPU through the NumPy reference."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

# Runs the demo as `python -m stridedfa` would, with the named modules made unimportable.
HIDE_AND_RUN = (
    "import runpy, sys\n"
    "for name in sys.argv[1:]:\n"
    "    sys.modules[name] = None\n"
    "runpy.run_module('stridedfa', run_name='__main__', alter_sys=True)\n"
)


def run_demo(*hidden):
    return subprocess.run([sys.executable, "-c", HIDE_AND_RUN, *hidden], capture_output=True,
                          text=True, timeout=600)


def installed(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def test_demo_without_any_framework_passes_or_explains():
    # With no GPU this is the NumPy path; with one and cuda.core installed, cuDNN via cuda.core.
    result = run_demo("torch", "cupy")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS" in result.stdout or "bit-exact: True" in result.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("hidden, memory_from", [
    ((), "torch"),
    (("torch",), "cupy"),
    (("torch", "cupy"), "cuda.core"),
])
def test_demo_runs_cudnn_with_each_memory_source(hidden, memory_from):
    if not installed(memory_from):
        pytest.skip(f"{memory_from} is not installed")
    result = run_demo(*hidden)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"device memory from {memory_from}" in result.stdout, result.stdout
    assert "PASS" in result.stdout
    assert "every output element written: True" in result.stdout
    assert "bit-exact (out and lse): True" in result.stdout
