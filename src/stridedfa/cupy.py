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
import functools

try:
    import cupy
    from cupy.cuda.stream import _BaseStream
except ImportError as error:  # pragma: no cover - exercised in a subprocess by the CPU tests
    raise ImportError(
        "stridedfa.cupy needs CuPy, which is not importable here "
        f"({error}); install the wheel matching your CUDA, e.g. `pip install cupy-cuda13x`, "
        "or call stridedfa.sdpa_forward / stridedfa.attention with any DLPack tensors") from error

from stridedfa import _core, _layouts
from stridedfa._errors import LayoutError

__all__ = ["attention", "attention_backward"]

_ndarray = cupy.ndarray
_new_array = cupy.ndarray  # the constructor (a separate name so tests can record allocations)
_alloc = cupy.cuda.alloc
_get_current_stream = cupy.cuda.get_current_stream
_get_device_id = cupy.cuda.runtime.getDevice
_Device = cupy.cuda.Device
_FLOAT32 = cupy.dtype(cupy.float32)
_ALIGNMENT = 16  # bytes; cuDNN's requirement for pointers and strides

# The layout rule sorts axes in Python; a model repeats a handful of shapes, so remember them.
_output_strides = functools.lru_cache(maxsize=1024)(_layouts.output_strides)
_gradient_strides = functools.lru_cache(maxsize=1024)(_layouts.gradient_strides)


def attention(q, k, v, *, scale: float | None = None, causal: bool = False,
              causal_alignment: str = "top_left", return_lse: bool = False, stream=None):
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
            (query i sees keys j <= i + s_kv - s_q).
        return_lse: also return the float32 (batch, h_q, s_q) log-sum-exp of each score row,
            which :func:`attention_backward` needs.
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
    handle, alloc_stream = _call_stream(stream)
    device = q.data.device_id
    if alloc_stream is None and device == _get_device_id():  # the common case: nothing to switch
        return _forward(q, k, v, scale, causal, causal_alignment, return_lse, handle, None)
    return _forward(q, k, v, scale, causal, causal_alignment, return_lse, handle,
                    _Allocation(alloc_stream, device))


def attention_backward(q, k, v, out, lse, grad_out, *, scale: float | None = None,
                       causal: bool = False, causal_alignment: str = "top_left", stream=None):
    """Gradients of :func:`attention`: returns ``(grad_q, grad_k, grad_v)``.

    Args:
        q, k, v: the forward's inputs; out, lse: what ``attention(..., return_lse=True)`` returned.
        grad_out: (batch, h_q, s_q, d_v) gradient of the loss with respect to ``out``. A layout
            cuDNN cannot read (e.g. a broadcast array with stride 0) is copied first.
        scale, causal, causal_alignment: the forward's values.
        stream: as in :func:`attention`.

    Returns:
        Gradients shaped like q, k, v, from CuPy's pool: each has its input's strides when the input
        is dense, else it is dense in the input's axis order (views of a packed buffer get compact
        gradients). Under GQA, grad_k and grad_v are summed over the query heads sharing a kv head.
    """
    if not isinstance(q, _ndarray):
        raise TypeError(_not_cupy("attention_backward", q))
    handle, alloc_stream = _call_stream(stream)
    device = q.data.device_id
    if alloc_stream is None and device == _get_device_id():
        return _backward(q, k, v, out, lse, grad_out, scale, causal, causal_alignment, handle, None)
    return _backward(q, k, v, out, lse, grad_out, scale, causal, causal_alignment, handle,
                     _Allocation(alloc_stream, device))


# --- Helpers ------------------------------------------------------------------------------------

def _forward(q, k, v, scale, causal, causal_alignment, return_lse, handle, allocation=None):
    """Allocates out (and lse) on the call's device and stream, then runs on `handle`.

    `allocation` (None when they are already current) switches CuPy to them for allocations only:
    the core reads the inputs under the caller's current stream, so CuPy's __dlpack__(stream=...)
    orders the call after the work that produced them."""
    q_shape, q_strides = _shape_and_strides(q, "q")
    v_shape = v.shape
    if len(v_shape) != 4:
        raise LayoutError(f"v must be 4-D (batch, h_kv, s_kv, d_v), got shape {tuple(v_shape)}")
    b, h_q, s_q, _ = q_shape
    out_shape = (b, h_q, s_q, v_shape[3])
    with allocation or _NOTHING:
        out = _empty(out_shape, _output_strides(out_shape, q_strides), q.dtype)
        # Packed (b, h, s): the layout cuDNN's backward reads (it ignores strides before 9.26).
        lse = _empty((b, h_q, s_q), (h_q * s_q, s_q, 1), _FLOAT32) if return_lse else None
    _core._forward(q, k, v, out, lse, scale, causal, causal_alignment, handle,
                   _workspace if allocation is None else allocation.workspace)
    return (out, lse) if return_lse else out


def _backward(q, k, v, out, lse, grad_out, scale, causal, causal_alignment, handle, allocation=None):
    """Allocates the gradients on the call's device and stream (see _forward), then runs on
    `handle`."""
    grads = []
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, _ndarray):  # its gradient is allocated like it, by CuPy
            raise TypeError(f"stridedfa.cupy.attention_backward takes {name} as a cupy.ndarray, "
                            f"got {type(x).__module__}.{type(x).__qualname__}")
        shape, strides = _shape_and_strides(x, name)
        with allocation or _NOTHING:
            grads.append(_empty(shape, _gradient_strides(shape, strides), x.dtype))
    grad_q, grad_k, grad_v = grads
    # A copy of an unreadable grad_out runs on the caller's stream, where grad_out was produced; the
    # core then orders the call after it like any other input.
    _core._backward(q, k, v, out, _readable(grad_out), lse, grad_q, grad_k, grad_v, scale, causal,
                    causal_alignment, handle, _workspace if allocation is None else allocation.workspace)
    return grad_q, grad_k, grad_v


def _not_cupy(function, q):
    return (f"stridedfa.cupy.{function} takes q as a cupy.ndarray, got "
            f"{type(q).__module__}.{type(q).__qualname__}; stridedfa.attention picks the adapter "
            f"for any DLPack tensor")


def _shape_and_strides(x, name):
    """Shape and strides in elements of a 4-D array (CuPy's strides are in bytes)."""
    shape = x.shape
    if len(shape) != 4:
        raise LayoutError(f"{name} must be 4-D (batch, heads, seq, head_dim), got shape {tuple(shape)}")
    item = x.itemsize
    s0, s1, s2, s3 = x.strides
    return shape, (s0 // item, s1 // item, s2 // item, s3 // item)


def _empty(shape, strides, dtype):
    """An uninitialised array with exactly these element strides, from the current allocator."""
    item = dtype.itemsize
    size = 1
    for extent in shape:
        size *= extent
    # Every layout from _layouts is dense in some axis order: prod(shape) elements cover it.
    memptr = _alloc(size * item)
    return _new_array(shape, dtype, memptr, tuple(s * item for s in strides))


def _workspace(nbytes: int, device: int):
    # Allocated from CuPy's pool on the call's stream (made current by _Allocation), so the block is
    # reused only by work queued behind the kernel that uses it.
    memory = _alloc(nbytes)
    return memory.ptr, memory


def _call_stream(stream):
    """(the handle the core runs on, the CuPy stream to allocate on when it is not the current)."""
    if stream is None:
        return _get_current_stream().ptr, None
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

    def workspace(self, nbytes: int, device: int):
        with self:
            return _workspace(nbytes, device)


_NOTHING = contextlib.nullcontext()


def _readable(t):
    """grad_out as cuDNN can read it: only a layout it cannot read (broadcast stride 0, a strided
    last axis, misaligned) is copied."""
    shape = getattr(t, "shape", None)
    if not isinstance(t, _ndarray) or shape is None or len(shape) != 4:
        return t  # other producers and malformed arrays: the core reads or reports them
    item = t.itemsize
    strides = t.strides
    ok = (strides[3] == item or shape[3] == 1) and t.data.ptr % _ALIGNMENT == 0 and all(
        extent == 1 or (stride > 0 and stride % _ALIGNMENT == 0)
        for extent, stride in zip(shape[:3], strides[:3]))
    return t if ok else cupy.ascontiguousarray(t)
