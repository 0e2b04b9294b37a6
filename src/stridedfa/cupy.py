"""The CuPy adapter: stridedfa attention on CuPy arrays, allocated and run the CuPy way.

Outputs and gradients come from CuPy's memory pool (``cupy.cuda.alloc``, so whatever allocator the
user installed with ``cupy.cuda.set_allocator``), cuDNN's workspace too, and the kernels run on
CuPy's current stream (``with stream:``) unless ``stream=`` names another. Inputs are read where
they lie: q/k/v may be views of one packed projection (``qkv[:, :, i].transpose(0, 2, 1, 3)`` of a
(b, s, 3, h, d) array) at no copy. Logical axes are (batch, heads, seq, head_dim) as everywhere in
stridedfa; memory order is whatever the strides say.

Layouts of what is allocated follow :mod:`stridedfa._layouts`: the output is dense in q's axis
order; a gradient has its input's strides when the input is dense, else it is dense in the input's
axis order.
"""

from __future__ import annotations

import contextlib
import types

try:
    import cupy
    from cupy.cuda.stream import _BaseStream
except ImportError as error:  # pragma: no cover - exercised in a subprocess by the CPU tests
    raise ImportError(
        "stridedfa.cupy needs CuPy, which is not importable here "
        f"({error}); install the wheel matching your CUDA, e.g. `pip install cupy-cuda13x`, "
        "or call stridedfa.sdpa_forward / stridedfa.attention with any DLPack tensors") from error

from stridedfa import _core
from stridedfa._quirk_workarounds import VARLEN_BACKWARD_DENSE_QUERIES, varlen_backward_kv_heads

__all__ = ["attention", "attention_backward", "attention_with_kvcache", "paged_attention", "varlen_attention",
           "varlen_attention_backward"]

_ndarray = cupy.ndarray
_get_current_stream = cupy.cuda.get_current_stream
_get_device_id = cupy.cuda.runtime.getDevice
_Device = cupy.cuda.Device

# What the core calls back into CuPy for (everything else of a call happens in C): allocation
# through CuPy's current allocator (cupy.cuda.alloc, so whatever cupy.cuda.set_allocator
# installed), the ndarray constructor, float32 for the statistics, and the copy of a grad_out cuDNN
# cannot read.
_HOOKS = types.SimpleNamespace(alloc=cupy.cuda.alloc, new_array=cupy.ndarray,
                               float32=cupy.dtype(cupy.float32), contiguous=cupy.ascontiguousarray)


def attention(q, k, v, *, scale: float | None = None, causal: bool = False,
              causal_alignment: str = "top_left", window=None, softcap: float | None = None,
              seqlens_q=None, seqlens_kv=None, sinks=None, bias=None, alibi_slopes=None, dropout_p: float = 0.0,
              rng_state=None, return_lse: bool = False, stream=None):
    """Scaled-dot-product attention forward with cuDNN's fused kernels, on CuPy arrays.

    ``softmax(scale * q @ k^T + mask) @ v`` per batch and query head.

    Args:
        q: (batch, h_q, s_q, d_qk) ``cupy.ndarray``, float16 (or bfloat16 where CuPy has it), any
            valid strides: a bshd array ``x`` is passed as ``x.transpose(0, 2, 1, 3)``.
        k: (batch, h_kv, s_kv, d_qk); h_q must be a multiple of h_kv (GQA/MQA need no repeat).
            In the forward, k and v may also be other DLPack tensors on the same device.
        v: (batch, h_kv, s_kv, d_v).
        scale: defaults to ``1 / sqrt(d_qk)``.
        causal: mask keys after the query position.
        causal_alignment: ``"top_left"`` (query i sees keys j <= i) or ``"bottom_right"``
            (query i sees keys j <= i + s_kv - s_q; rows that see no key get out = 0).
        window: ``(left, right)`` sliding window in tokens, None on a side for unbounded (see
            :func:`stridedfa.sdpa_forward` for the exact rule and a picture).
        softcap: ``softcap * tanh(scores / softcap)`` before the mask (None: no cap).
        seqlens_q, seqlens_kv: int32 (batch,) arrays of sequence lengths in a padded batch (one may
            be omitted: full length on that side); read on the device only.
        sinks: float32 (h_q,) attention-sink logits: an extra term per query head in each row's
            softmax denominator (see :func:`stridedfa.sdpa_forward`).
        bias: additive score bias in q's dtype, broadcastable to (batch, h_q, s_q, s_kv) (extent-1
            or stride-0 axes are shared without a copy; key axis contiguous): scores are
            ``softcap(scale * q @ k^T) + bias`` before the masks (see :func:`stridedfa.sdpa_forward`).
        alibi_slopes: float32 (h_q,) ALiBi slopes: ``scores -= alibi_slopes[h] * |i + off - j|`` (see
            :func:`stridedfa.sdpa_forward`).
        dropout_p: attention dropout probability (torch SDPA's ``dropout_p``): softmax weights are
            zeroed with this probability, the kept ones scaled by 1 / (1 - dropout_p).
        rng_state: with ``dropout_p > 0``, an int64 (2,) array holding the Philox seed and offset
            that pick the mask -- e.g. ``cupy.random.randint(0, 2**62, size=2, dtype=cupy.int64)``
            (CuPy's generator: ``cupy.random.seed`` decides it). Pass the same array to
            :func:`attention_backward`, which regenerates the mask from it; read on the device only.
        return_lse: also return the float32 (batch, h_q, s_q) log-sum-exp of each score row,
            which :func:`attention_backward` needs (-inf for rows that see no key).
        stream: run on this stream instead of CuPy's current one: a ``cupy.cuda.Stream``, any
            object with ``__cuda_stream__``, or a ``cudaStream_t`` as an int. Outputs and the
            workspace are then allocated on that stream too.

    Returns:
        ``out`` (batch, h_q, s_q, d_v), laid out in q's axis order, or ``(out, lse)``.
        The result is ready in stream order: other streams must wait on the call's stream.

    Raises:
        stridedfa.LayoutError, UnsupportedError, BackendError: see :func:`stridedfa.sdpa_forward`.

    Example::

        qkv = cupy.random.standard_normal((2, 1024, 3, 16, 128), dtype=cupy.float32).astype(cupy.float16)
        q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
        out, lse = stridedfa.cupy.attention(q, k, v, causal=True, return_lse=True)
        grad_q, grad_k, grad_v = stridedfa.cupy.attention_backward(q, k, v, out, lse, cupy.ones_like(out))
    """
    if not isinstance(q, _ndarray):
        raise TypeError(_not_cupy("attention", q))
    handle, allocation = _call(stream, q.data.device_id)
    out, lse = _core._cupy_forward(q, k, v, scale, causal, causal_alignment, return_lse, handle,
                                   allocation, _HOOKS, window, softcap, seqlens_q, seqlens_kv, sinks, bias,
                                   alibi_slopes, dropout_p, rng_state)
    return (out, lse) if return_lse else out


def attention_backward(q, k, v, out, lse, grad_out, *, scale: float | None = None,
                       causal: bool = False, causal_alignment: str = "top_left", window=None,
                       softcap: float | None = None, seqlens_q=None, seqlens_kv=None, sinks=None, bias=None,
                       bias_grad: bool = False, alibi_slopes=None, dropout_p: float = 0.0, rng_state=None,
                       deterministic: bool = False, stream=None):
    """Gradients of :func:`attention`: returns ``(grad_q, grad_k, grad_v)``, then the sinks'
    gradient (float32 (h_q,); None with dropout, where cuDNN 9.19 gets it wrong) when ``sinks`` are
    given, then the bias' gradient (contiguous, of bias' shape, summed over its shared batch and head
    axes) when ``bias_grad=True``.

    Args:
        q, k, v: the forward's inputs; out, lse: what ``attention(..., return_lse=True)`` returned.
        grad_out: (batch, h_q, s_q, d_v) gradient of the loss with respect to ``out``. A layout
            cuDNN cannot read (e.g. a broadcast array with stride 0) is copied first.
        scale, causal, causal_alignment, window, softcap, seqlens_q, seqlens_kv, sinks, bias,
            alibi_slopes, dropout_p, rng_state: the forward's values (the same rng_state: the same
            dropout mask).
        bias_grad: also compute the bias' gradient (off by default: a bias is most often a constant
            mask). cuDNN computes it for a bias with a row per query, without softcap or ALiBi (see
            :func:`stridedfa.sdpa_backward`).
        deterministic: cuDNN's deterministic backward (bitwise-identical gradients run to run).
        stream: as in :func:`attention`.

    Returns:
        Gradients shaped like q, k, v, from CuPy's pool: each has its input's strides when the input
        is dense, else it is dense in the input's axis order (views of a packed buffer get compact
        gradients). Under GQA, grad_k and grad_v are summed over the query heads sharing a kv head.
    """
    if not isinstance(q, _ndarray):
        raise TypeError(_not_cupy("attention_backward", q))
    if bias_grad and bias is None:
        raise ValueError("bias_grad=True asks for the bias' gradient, but no bias was given")
    for name, x in (("k", k), ("v", v)):
        if not isinstance(x, _ndarray):  # its gradient is allocated like it, by CuPy
            raise TypeError(f"stridedfa.cupy.attention_backward takes {name} as a cupy.ndarray, "
                            f"got {type(x).__module__}.{type(x).__qualname__}")
    handle, allocation = _call(stream, q.data.device_id)
    grads = _core._cupy_backward(q, k, v, out, lse, grad_out, scale, causal, causal_alignment, handle,
                                 allocation, _HOOKS, window, softcap, seqlens_q, seqlens_kv, sinks, deterministic,
                                 bias, bias_grad, alibi_slopes, dropout_p, rng_state)
    result: tuple = grads[:3]
    if sinks is not None:
        result += (grads[3],)
    if bias is not None and bias_grad:
        result += (grads[4],)
    return result


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q: int | None = None,
                     max_seqlen_kv: int | None = None, *, scale: float | None = None, causal: bool = False,
                     causal_alignment: str = "top_left", window=None, softcap: float | None = None, sinks=None,
                     dropout_p: float = 0.0, rng_state=None, return_lse: bool = False, stream=None):
    """Attention over sequences packed along one token axis (THD), on CuPy arrays.

    q (total_q, h_q, d_qk), k (total_kv, h_kv, d_qk), v (total_kv, h_kv, d_v) at any valid token and
    head strides, views of one qkv projection included; ``cu_seqlens_q`` / ``cu_seqlens_kv`` int32 (b + 1,) arrays,
    0 then each sequence's end, read on the device only. The other arguments are
    :func:`attention`'s and :func:`stridedfa.torch.varlen_attention`'s (max_seqlen: a promise; a
    sequence longer than its bucket, at most 1.25x the promise, is treated as empty; None bounds it
    by the token count; sinks only where no backward follows before cuDNN 9.26).

    Returns ``out`` (total_q, h_q, d_v), contiguous, or ``(out, lse)`` with lse float32 (h_q,
    total_q) over token-major memory; tokens in no sequence get out = 0 and lse = -inf.
    """
    if not isinstance(q, _ndarray):
        raise TypeError(_not_cupy("varlen_attention", q))
    handle, allocation = _call(stream, q.data.device_id)
    out, lse = _core._cupy_forward(q, k, v, scale, causal, causal_alignment, return_lse, handle, allocation, _HOOKS,
                                   window, softcap, None, None, sinks, None, None, dropout_p, rng_state,
                                   cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv, max_seqlen_q=max_seqlen_q,
                                   max_seqlen_kv=max_seqlen_kv)
    return (out, lse) if return_lse else out


def varlen_attention_backward(q, k, v, out, lse, grad_out, cu_seqlens_q, cu_seqlens_kv,
                              max_seqlen_q: int | None = None, max_seqlen_kv: int | None = None, *,
                              scale: float | None = None, causal: bool = False, causal_alignment: str = "top_left",
                              window=None, softcap: float | None = None, sinks=None, dropout_p: float = 0.0,
                              rng_state=None, deterministic: bool = False, stream=None):
    """Gradients of :func:`varlen_attention`: ``(grad_q, grad_k, grad_v)``, contiguous (tokens,
    heads, dim) arrays from CuPy's pool (token-major: cuDNN sums grouped heads only into those).
    Tokens in no sequence get zero gradients. Use the forward's arguments. A q that is not
    C-contiguous is copied first: cuDNN 9.19's variable-length backward computes dQ right only
    from a dense q (cuDNN quirk varlen_backward_dense_queries); one key/value head (MQA) is repeated
    to two and its gradients summed (quirk varlen_backward_mqa_dk)."""
    if not isinstance(q, _ndarray):
        raise TypeError(_not_cupy("varlen_attention_backward", q))
    handle, allocation = _call(stream, q.data.device_id)
    with allocation or contextlib.nullcontext():
        if VARLEN_BACKWARD_DENSE_QUERIES:  # no copy when it already is
            q = cupy.ascontiguousarray(q)
        heads = varlen_backward_kv_heads(q.shape[1], k.shape[1])
        mqa = heads != k.shape[1]
        if mqa:  # k and v repeated (quirk varlen_backward_mqa_dk), their gradients summed after
            k, v = (cupy.ascontiguousarray(cupy.broadcast_to(t, (t.shape[0], heads, t.shape[2]))) for t in (k, v))
    grad_q, grad_k, grad_v, _, _ = _core._cupy_backward(
        q, k, v, out, lse, grad_out, scale, causal, causal_alignment, handle, allocation, _HOOKS, window, softcap,
        None, None, sinks, deterministic, None, False, None, dropout_p, rng_state, cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_kv=cu_seqlens_kv, max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv,
        with_grad_sinks=False)  # sinks are never trained here
    if mqa:
        with allocation or contextlib.nullcontext():
            grad_k, grad_v = (g.sum(axis=1, keepdims=True, dtype=cupy.float32).astype(g.dtype)
                              for g in (grad_k, grad_v))
    return grad_q, grad_k, grad_v


def paged_attention(q, k_cache, v_cache, block_table, cache_seqlens, *, scale: float | None = None,
                    causal: bool = True, causal_alignment: str = "bottom_right", window=None,
                    softcap: float | None = None, stream=None):
    """Attention of q over a paged KV cache, on CuPy arrays (forward only: serving).

    q (b, h_q, s_q, d) at any valid strides (decode: s_q = 1); k_cache / v_cache (num_blocks,
    h_kv, block_size, d) at any valid strides -- a FlashAttention/vLLM (num_blocks, block_size,
    h_kv, d) cache is passed as ``cache.transpose(0, 2, 1, 3)``, no copy; block_table int32 (b,
    blocks per sequence) and cache_seqlens int32 (b,), read on the device only (block ids outside
    the cache are clamped into it). By default causal bottom-right: each query block aligned with
    the end of its sequence's cache. Returns out (b, h_q, s_q, d_v), dense in q's axis order (as
    :func:`attention` and stridedfa.torch's paged attention: a q cut from a (b, s, h, d) array gives
    out over (b, s, h, d) memory).
    """
    if not isinstance(q, _ndarray):
        raise TypeError(_not_cupy("paged_attention", q))
    handle, allocation = _call(stream, q.data.device_id)
    out, _ = _core._cupy_forward(q, k_cache, v_cache, scale, causal, causal_alignment, False, handle, allocation,
                                 _HOOKS, window, softcap, None, cache_seqlens, block_table=block_table)
    return out


def _append(cache, new, block_table, cache_seqlens):
    """Writes new (b, h, s_new, d) into the cache at positions cache_seqlens[b] + i, in place, on the
    device; positions beyond the table and ids beyond the cache are clamped into them (nothing
    outside the cache is written)."""
    block_size = cache.shape[2]
    positions = cache_seqlens.astype(cupy.int64)[:, None] + cupy.arange(new.shape[2])
    columns = cupy.clip(positions // block_size, 0, block_table.shape[1] - 1)
    blocks = cupy.clip(cupy.take_along_axis(block_table.astype(cupy.int64), columns, axis=1), 0, cache.shape[0] - 1)
    # (b, s_new) index arrays around a slice: the update is (b, s_new, h, d)
    cache[blocks, :, positions % block_size] = new.transpose(0, 2, 1, 3).astype(cache.dtype)


def attention_with_kvcache(q, k_cache, v_cache, block_table, cache_seqlens, k=None, v=None, *,
                           scale: float | None = None, causal: bool = True, causal_alignment: str = "bottom_right",
                           window=None, softcap: float | None = None, stream=None):
    """:func:`paged_attention` after writing new keys and values (b, h_kv, s_new, d) into the caches
    in place at each sequence's length (FlashAttention's ``flash_attn_with_kvcache`` with a
    ``block_table``; no host synchronisation). cache_seqlens is the caller's to advance."""
    if (k is None) != (v is None):
        raise ValueError("attention_with_kvcache appends keys and values together: give both k and v, or neither")
    if not isinstance(q, _ndarray):
        raise TypeError(_not_cupy("attention_with_kvcache", q))
    seqlens = cache_seqlens
    if k is not None and v is not None:
        _, allocation = _call(stream, q.data.device_id)
        with allocation or contextlib.nullcontext():  # the writes run on the call's device and stream
            _append(k_cache, k, block_table, cache_seqlens)
            _append(v_cache, v, block_table, cache_seqlens)
            seqlens = (cache_seqlens + k.shape[2]).astype(cupy.int32)
    return paged_attention(q, k_cache, v_cache, block_table, seqlens, scale=scale, causal=causal,
                           causal_alignment=causal_alignment, window=window, softcap=softcap, stream=stream)


# --- Helpers ------------------------------------------------------------------------------------

def _call(stream, device):
    """(the stream handle for the core -- None: CuPy's current stream, read at intake --, an
    _Allocation when the call's device or stream is not CuPy's current one, else None)."""
    if stream is None:
        return None, (None if device == _get_device_id() else _Allocation(None, device))
    handle, alloc_stream = _call_stream(stream)
    if alloc_stream is None and device == _get_device_id():
        return handle, None
    return handle, _Allocation(alloc_stream, device)


def _not_cupy(function, q):
    return (f"stridedfa.cupy.{function} takes q as a cupy.ndarray, got "
            f"{type(q).__module__}.{type(q).__qualname__}; stridedfa.attention picks the adapter "
            f"for any DLPack tensor")


def _call_stream(stream):
    """(the handle the core runs on, the CuPy stream to allocate on when it is not the current)."""
    if isinstance(stream, _BaseStream):
        handle = stream.ptr
    else:
        protocol = getattr(stream, "__cuda_stream__", None)
        if protocol is not None:
            handle = (protocol() if callable(protocol) else protocol)[1]
        elif isinstance(stream, int) and not isinstance(stream, bool):
            handle = stream
        else:
            raise TypeError(
                f"stream must be None, a cupy.cuda.Stream, an object with __cuda_stream__ or an int "
                f"cudaStream_t handle, got {type(stream).__name__}")
        if handle < 0:
            raise ValueError(f"stream handle must be >= 0, got {handle}")
    if handle == _get_current_stream().ptr:
        return handle, None
    if isinstance(stream, _BaseStream):
        return handle, stream
    if handle in (0, 1):  # the legacy default stream: CuPy's null stream
        return handle, cupy.cuda.Stream.null
    if handle == 2:  # the per-thread default stream
        return handle, cupy.cuda.Stream.ptds
    return handle, cupy.cuda.ExternalStream(handle)


class _Allocation:
    """Makes the call's device and stream current for CuPy's allocator, only when they are not
    already (the common case costs two comparisons)."""

    __slots__ = ("stream", "device", "device_context")

    def __init__(self, stream, device):
        self.stream = stream
        self.device = device
        self.device_context = None

    def __enter__(self):
        self.device_context = None
        if self.device != _get_device_id():
            self.device_context = _Device(self.device)
            self.device_context.__enter__()
        if self.stream is not None:
            self.stream.__enter__()
        return self

    def __exit__(self, *exc):
        if self.stream is not None:
            self.stream.__exit__(*exc)
        if self.device_context is not None:
            self.device_context.__exit__(*exc)
        return False
