"""stridedfa: stride-true fused attention.

cuDNN's fused scaled-dot-product attention for any DLPack tensor (torch, CuPy, JAX, ...), with every
tensor described to cuDNN by its real strides: q/k/v views into packed buffers need no copy and no
layout enum, and outputs are written wherever the caller wants them. Every call is validated before
anything runs.

    stridedfa.sdpa_forward(q, k, v, out, lse=None, ...)      # any DLPack tensors, outputs in place
    stridedfa.sdpa_backward(q, k, v, out, grad_out, lse, grad_q, grad_k, grad_v, ...)
    stridedfa.attention(q, k, v, causal=True)                # any DLPack tensor, outputs allocated
    stridedfa.varlen_attention(q, k, v, cu_q, cu_kv)         # packed documents (THD), any producer
    stridedfa.torch.attention(q, k, v, causal=True)          # torch.Tensor, differentiable
    stridedfa.cupy.attention(q, k, v, causal=True)           # cupy.ndarray, CuPy's pool and stream
    stridedfa.jax.attention(q, k, v, causal=True)            # jax.Array; jit, grad, vmap
    stridedfa.info()                                         # what was found, or why not
    stridedfa.warm_up([dict(q=..., k=..., causal=True)])     # graphs ready before the first call

Importing stridedfa needs no GPU, no cuDNN and no framework; cuDNN and the CUDA runtime are loaded
at the first GPU call.
"""

from stridedfa._core import DeviceBuffer, cache_clear, cache_info, sdpa_backward, sdpa_forward
from stridedfa._dispatch import attention, varlen_attention
from stridedfa._errors import BackendError, BoundsError, LayoutError, StridedFAError, UnsupportedError
from stridedfa._info import info
from stridedfa._version import __version__
from stridedfa._warm_up import length_buckets, warm_up

__all__ = [
    "BackendError",
    "BoundsError",
    "DeviceBuffer",
    "LayoutError",
    "StridedFAError",
    "UnsupportedError",
    "__version__",
    "attention",
    "cache_clear",
    "cache_info",
    "info",
    "length_buckets",
    "sdpa_backward",
    "sdpa_forward",
    "varlen_attention",
    "warm_up",
]


def __getattr__(name: str):
    # Framework adapters import their framework, so they load on first use: stridedfa.torch,
    # stridedfa.cupy, stridedfa.jax.
    if name in ("torch", "cupy", "jax", "reference"):
        import importlib

        return importlib.import_module(f"stridedfa.{name}")
    raise AttributeError(f"module 'stridedfa' has no attribute {name!r}")
