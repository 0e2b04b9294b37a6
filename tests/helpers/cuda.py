"""Module-level skip for GPU test modules (no torch import unless available)."""

import pytest


def require_cuda():
    """Return the ``torch`` module, or skip the calling test module.

    Call it at the top of a test module, before importing ``stridedfa`` or the torch
    helpers, so that a machine without torch or without a CUDA device reports the module
    as skipped instead of failing at import.
    """
    try:
        import torch
    except ImportError:
        pytest.skip("GPU tests need torch, which is not installed", allow_module_level=True)
    if not torch.cuda.is_available():
        pytest.skip(
            "GPU tests need a CUDA device (torch.cuda.is_available() is False)",
            allow_module_level=True,
        )
    return torch
