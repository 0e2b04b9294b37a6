"""Configuration of the GPU tests (``pytest -m gpu tests/gpu``).

Every module here starts with ``torch = require_cuda()``, which skips the whole module when
torch is missing or sees no CUDA device, before ``stridedfa`` is imported. Nothing in this
file imports torch, JAX or CuPy at import time.
"""

import os
import sys
import zlib

# JAX preallocates 75% of the GPU memory on its first use unless told otherwise; this must
# be set before jax is imported anywhere in the process (subprocesses inherit it).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import pytest  # noqa: E402

# `helpers` is importable and the `gpu` marker registered through tests/conftest.py and
# pyproject.toml.


@pytest.fixture
def seed(request) -> int:
    """A per-test seed (stable hash of the test id); also seeds torch's global RNG."""
    value = zlib.crc32(request.node.nodeid.encode()) & 0x7FFFFFFF
    import torch

    torch.manual_seed(value)
    return value


@pytest.fixture(autouse=True)
def _surface_async_cuda_errors():
    """Synchronize after each test so an asynchronous CUDA error fails the test that caused it."""
    yield
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


@pytest.fixture
def cupy():
    cp = pytest.importorskip("cupy")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("CuPy sees no CUDA device")
    except cp.cuda.runtime.CUDARuntimeError as exc:
        pytest.skip(f"CuPy cannot use CUDA: {exc}")
    return cp


@pytest.fixture
def jax_gpu():
    """``(jax, gpu_device)``; skips when JAX or its CUDA backend is missing."""
    jax = pytest.importorskip("jax")
    try:
        device = jax.devices("gpu")[0]
    except Exception as exc:  # RuntimeError when no GPU backend is installed/usable
        pytest.skip(f"JAX has no GPU backend: {exc}")
    return jax, device
