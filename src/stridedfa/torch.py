"""The torch adapter: stridedfa attention as a differentiable torch function.

Outputs and gradients are allocated with torch's caching allocator, cuDNN's workspace too, and the
kernels run on torch's current stream. Inputs are read where they lie: q/k/v may be views of one
packed projection (``qkv[:, :, i].transpose(1, 2)`` of a (b, s, 3, h, d) buffer) at no copy.
"""

from __future__ import annotations

import torch

from stridedfa import _core

__all__ = ["attention"]

# torch >= 2.10 exports the DLPack C exchange API, through which the core reads tensors and the
# current stream in well under a microsecond. Older torch goes through __dlpack__, which needs the
# stream spelled out.
_HAS_EXCHANGE_API = hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
_ALIGNMENT = 16  # bytes; cuDNN's requirement for pointers and strides


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
              causal: bool = False, is_causal: bool | None = None,
              causal_alignment: str = "top_left") -> torch.Tensor:
    """Scaled-dot-product attention with cuDNN's fused kernels, differentiable.

    ``softmax(scale * q @ k^T + mask) @ v`` with the axes of
    ``torch.nn.functional.scaled_dot_product_attention``:

    Args:
        q: (batch, h_q, s_q, d_qk) CUDA tensor, float16 or bfloat16, any valid strides — e.g. a
            bshd tensor passed as ``x.transpose(1, 2)``, or a view into a packed qkv buffer.
        k: (batch, h_kv, s_kv, d_qk); h_q must be a multiple of h_kv (GQA and MQA need no repeat).
        v: (batch, h_kv, s_kv, d_v).
        scale: defaults to ``1 / sqrt(d_qk)``.
        causal: mask future keys. ``is_causal`` is accepted as torch's name for it.
        causal_alignment: ``"top_left"`` (query i sees keys j <= i) or ``"bottom_right"``
            (query i sees keys j <= i + s_kv - s_q).

    Returns:
        (batch, h_q, s_q, d_v) tensor laid out in q's axis order (a bshd-ordered q gives a
        bshd-ordered result). Gradients of q, k, v come back with the inputs' strides when those
        are dense, and in the inputs' axis order otherwise (views of a packed buffer).

    Raises:
        stridedfa.LayoutError, UnsupportedError, BackendError: see :func:`stridedfa.sdpa_forward`.

    Example::

        qkv = torch.randn(2, 1024, 3, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        out = stridedfa.torch.attention(q, k, v, causal=True)   # (2, 16, 1024, 128), bshd in memory
        out.sum().backward()
    """
    if is_causal is not None:
        if causal and not is_causal:
            raise ValueError("causal=True and is_causal=False disagree; pass one of them")
        causal = bool(is_causal)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _Attention.apply(q, k, v, scale, causal, causal_alignment)
    out, _ = _forward(q, k, v, scale, causal, causal_alignment, with_lse=False)
    return out


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, causal, causal_alignment):
        out, lse = _forward(q, k, v, scale, causal, causal_alignment, with_lse=True)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (scale, causal, causal_alignment)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        scale, causal, causal_alignment = ctx.options
        grad_q, grad_k, grad_v = _like_input(q), _like_input(k), _like_input(v)
        _core._backward(_raw(q), _raw(k), _raw(v), out, _readable(grad_out), lse,
                        grad_q, grad_k, grad_v, scale, causal, causal_alignment, _stream(q),
                        _workspace)
        return grad_q, grad_k, grad_v, None, None, None


def _forward(q, k, v, scale, causal, causal_alignment, *, with_lse):
    b, h_q, s_q, _ = q.shape
    out = _empty_in_order((b, h_q, s_q, v.shape[3]), _axis_order(q), q.dtype, q.device)
    # Packed (b, h, s) float32: the layout cuDNN's backward reads (it ignores strides before 9.26).
    lse = torch.empty((b, h_q, s_q), dtype=torch.float32, device=q.device) if with_lse else None
    _core._forward(_raw(q), _raw(k), _raw(v), out, lse, scale, causal, causal_alignment,
                   _stream(q), _workspace)
    return out, lse


def _raw(t: torch.Tensor) -> torch.Tensor:
    # The exchange API reads any tensor; __dlpack__ refuses tensors that require grad.
    return t if _HAS_EXCHANGE_API else t.detach()


def _stream(t: torch.Tensor):
    if _HAS_EXCHANGE_API or t.device.type != "cuda":
        return None  # the core takes torch's current stream from the exchange API
    return torch.cuda.current_stream(t.device).cuda_stream


def _workspace(nbytes: int, device: int):
    # Allocated on the current stream by torch's caching allocator, so reusing the block after
    # this call is ordered behind the kernel that uses it.
    buffer = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device))
    return buffer.data_ptr(), buffer


def _axis_order(t: torch.Tensor) -> list[int]:
    """Axes from outermost to innermost in memory (ties keep the logical order)."""
    return sorted(range(t.dim()), key=lambda axis: -t.stride(axis))


def _empty_in_order(shape, order, dtype, device) -> torch.Tensor:
    physical = torch.empty([shape[axis] for axis in order], dtype=dtype, device=device)
    inverse = [order.index(axis) for axis in range(len(order))]
    return physical.permute(inverse)


def _is_dense(t: torch.Tensor) -> bool:
    expected = 1
    for axis in sorted(range(t.dim()), key=lambda a: t.stride(a)):
        if t.shape[axis] == 1:
            continue
        if t.stride(axis) != expected:
            return False
        expected *= t.shape[axis]
    return True


def _like_input(t: torch.Tensor) -> torch.Tensor:
    """A gradient buffer with t's strides when t is dense, else dense in t's axis order."""
    if _is_dense(t):
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    return _empty_in_order(tuple(t.shape), _axis_order(t), t.dtype, t.device)


def _readable(t: torch.Tensor) -> torch.Tensor:
    """grad_out as cuDNN can read it. Autograd may hand a broadcast gradient (stride 0, e.g. from
    out.sum().backward()) or another layout cuDNN cannot read; only then is a copy made."""
    item = t.element_size()
    ok = t.stride(-1) == 1 and t.data_ptr() % _ALIGNMENT == 0 and all(
        size == 1 or (stride > 0 and stride * item % _ALIGNMENT == 0)
        for size, stride in zip(t.shape[:-1], t.stride()[:-1]))
    return t if ok else t.contiguous()
