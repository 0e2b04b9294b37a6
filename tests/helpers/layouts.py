"""Build logical (batch, heads, seq, head_dim) torch views of every memory layout.

Every tensor handed to stridedfa has the logical shape ``(b, h, s, d)``; the layout is
only the strides. The helpers here allocate a *physical* buffer in some axis order (and
optionally with padding), fill it (random normal or NaN poison) and return the logical
view together with the buffer(s) behind it, so tests can check that nothing outside the
views was written.

Layout names
------------
single-tensor orders (physical axis order, ``d`` always last):
    ``bhsd`` (contiguous), ``bshd``, ``sbhd``, ``hbsd``, ``hsbd``, ``shbd``
single-tensor padded variant:
    ``bshd_padded``: a ``bshd`` buffer with 8 extra head-dim columns and spare rows in
    the head and sequence axes, so no stride equals the dense one
q/k/v layouts (:func:`make_qkv`):
    every single-tensor layout above (q, k, v allocated separately), and the packed ones
    ``bs3hd``  q/k/v = ``buf[:, :, i].transpose(1, 2)`` of one ``(b, s, 3, h, d)`` buffer
    ``sb3hd``  q/k/v = ``buf[:, :, i].permute(1, 2, 0, 3)`` of one ``(s, b, 3, h, d)`` buffer
    ``sbh3d``  q/k/v = ``buf[:, :, :, i].permute(1, 2, 0, 3)`` of one ``(s, b, h, 3, d)`` buffer
    ``bs2hd_kv`` q a separate ``bshd`` tensor, k/v views of one ``(b, s_kv, 2, h_kv, d)`` buffer
"""

from __future__ import annotations

import torch

NAN = float("nan")

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}

ORDERS = ("bhsd", "bshd", "sbhd", "hbsd", "hsbd", "shbd")
# name -> (physical order, extra head_dim columns, extra entries per logical (b, h, s) axis)
TENSOR_LAYOUTS = {order: (order, 0, (0, 0, 0)) for order in ORDERS}
TENSOR_LAYOUTS["bshd_padded"] = ("bshd", 8, (0, 1, 5))

PACKED_QKV_LAYOUTS = ("bs3hd", "sb3hd", "sbh3d")
KV_PACKED_LAYOUT = "bs2hd_kv"
QKV_LAYOUTS = tuple(TENSOR_LAYOUTS) + PACKED_QKV_LAYOUTS + (KV_PACKED_LAYOUT,)


def as_dtype(dtype) -> torch.dtype:
    """Accept ``"fp16"``/``"bf16"`` or a torch dtype."""
    return DTYPES[dtype] if isinstance(dtype, str) else dtype


def make_generator(seed: int | None) -> torch.Generator | None:
    return None if seed is None else torch.Generator().manual_seed(int(seed))


def filled(shape, dtype, device, fill="randn", gen=None, requires_grad=False) -> torch.Tensor:
    """A new dense tensor: ``fill`` is ``"randn"`` (N(0, 1), drawn on the CPU in float32 so
    the numbers do not depend on the device), ``"nan"`` (poison) or ``"zeros"``."""
    dtype = as_dtype(dtype)
    if fill == "randn":
        t = torch.randn(tuple(shape), generator=gen, dtype=torch.float32)
        t = t.to(device=device, dtype=dtype)
    elif fill == "nan":
        t = torch.full(tuple(shape), NAN, dtype=dtype, device=device)
    elif fill == "zeros":
        t = torch.zeros(tuple(shape), dtype=dtype, device=device)
    else:
        raise ValueError(f"unknown fill {fill!r}")
    return t.requires_grad_(requires_grad)


# ----------------------------------------------------------------------------- single tensors


def _phys_axes(order: str) -> list[int]:
    if len(order) != 4 or order[-1] != "d" or sorted(order[:3]) != ["b", "h", "s"]:
        raise ValueError(f"bad physical order {order!r}: a permutation of 'bhs' then 'd'")
    return ["bhs".index(c) for c in order[:3]]


def _view(base: torch.Tensor, order: str, shape) -> torch.Tensor:
    axes = _phys_axes(order)
    view = base[tuple(slice(0, shape[a]) for a in axes) + (slice(0, shape[3]),)]
    return view.permute(*[axes.index(i) for i in range(3)], 3)


def view_of(base: torch.Tensor, layout: str, shape) -> torch.Tensor:
    """The logical ``(b, h, s, d)`` view of ``shape`` inside a physical buffer of ``layout``."""
    return _view(base, TENSOR_LAYOUTS[layout][0], shape)


def _phys_shape(order, pad_d, extra, shape):
    return [shape[a] + extra[a] for a in _phys_axes(order)] + [shape[3] + pad_d]


def physical_shape(layout: str, shape):
    return _phys_shape(*TENSOR_LAYOUTS[layout], shape)


def general_tensor(shape, order, pad_d=0, extra=(0, 0, 0), *, dtype, device, fill="randn",
                   gen=None):
    """Logical view of ``shape`` = (b, h, s, d) inside a buffer with physical axis ``order``
    (``d`` last), ``pad_d`` spare head-dim columns and ``extra`` spare entries per logical
    (b, h, s) axis. Returns ``(view, base)``; ``base`` is the whole physical buffer."""
    base = filled(_phys_shape(order, pad_d, extra, shape), dtype, device, fill, gen)
    return _view(base, order, shape), base


def layout_tensor(shape, layout="bhsd", *, dtype, device, fill="randn", gen=None):
    """Logical view of ``shape`` in one of :data:`TENSOR_LAYOUTS`. Returns ``(view, base)``."""
    order, pad_d, extra = TENSOR_LAYOUTS[layout]
    return general_tensor(shape, order, pad_d, extra, dtype=dtype, device=device, fill=fill,
                          gen=gen)


def copy_to_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A copy of logical (b, h, s, d) tensor ``t`` stored in ``layout`` (same values)."""
    view, _ = layout_tensor(t.shape, layout, dtype=t.dtype, device=t.device, fill="nan")
    return view.copy_(t)


def poisoned_like_strided(shape, layout="bhsd", *, dtype, device):
    """A NaN-filled output of logical ``shape`` in ``layout`` (see :data:`TENSOR_LAYOUTS`).

    Returns ``(view, base)``."""
    return layout_tensor(shape, layout, dtype=dtype, device=device, fill="nan")


def poisoned_lse(b, h, s, device):
    """NaN-filled, packed (b, h, s) float32 softmax statistics."""
    return torch.full((b, h, s), NAN, dtype=torch.float32, device=device)


# ----------------------------------------------------------------------------- q / k / v


def _packed_view(layout: str, base: torch.Tensor, i: int) -> torch.Tensor:
    if layout in ("bs3hd", "bs2hd"):  # (b, s, n, h, d)
        return base[:, :, i].transpose(1, 2)
    if layout == "sb3hd":  # (s, b, n, h, d)
        return base[:, :, i].permute(1, 2, 0, 3)
    if layout == "sbh3d":  # (s, b, h, n, d)
        return base[:, :, :, i].permute(1, 2, 0, 3)
    raise ValueError(f"unknown packed layout {layout!r}")


def _packed_shape(layout: str, b, h, s, d, n):
    if layout in ("bs3hd", "bs2hd"):
        return (b, s, n, h, d)
    if layout == "sb3hd":
        return (s, b, n, h, d)
    if layout == "sbh3d":
        return (s, b, h, n, d)
    raise ValueError(f"unknown packed layout {layout!r}")


def qkv_shapes(b, h_q, h_kv, s_q, s_kv, d_qk, d_v):
    return (b, h_q, s_q, d_qk), (b, h_kv, s_kv, d_qk), (b, h_kv, s_kv, d_v)


def _check_packable(layout, b, h_q, h_kv, s_q, s_kv, d_qk, d_v):
    if layout in PACKED_QKV_LAYOUTS and not (h_q == h_kv and s_q == s_kv and d_qk == d_v):
        raise ValueError(f"{layout} needs h_q == h_kv, s_q == s_kv and d_qk == d_v")
    if layout == KV_PACKED_LAYOUT and d_qk != d_v:
        raise ValueError(f"{layout} needs d_qk == d_v")


def qkv_buffers(layout, b, h_q, h_kv, s_q, s_kv, d_qk, d_v, *, dtype, device,
                fill="randn", gen=None, requires_grad=False):
    """Allocate the physical buffer(s) behind q, k, v of ``layout`` (a tuple)."""
    if layout not in QKV_LAYOUTS:
        raise ValueError(f"unknown q/k/v layout {layout!r}; one of {QKV_LAYOUTS}")
    _check_packable(layout, b, h_q, h_kv, s_q, s_kv, d_qk, d_v)

    def new(shape):
        return filled(shape, dtype, device, fill, gen, requires_grad)

    if layout in PACKED_QKV_LAYOUTS:
        return (new(_packed_shape(layout, b, h_q, s_q, d_qk, 3)),)
    if layout == KV_PACKED_LAYOUT:
        return (new(physical_shape("bshd", (b, h_q, s_q, d_qk))),
                new(_packed_shape("bs2hd", b, h_kv, s_kv, d_qk, 2)))
    return tuple(new(physical_shape(layout, shape))
                 for shape in qkv_shapes(b, h_q, h_kv, s_q, s_kv, d_qk, d_v))


def qkv_views(layout, bases, b, h_q, h_kv, s_q, s_kv, d_qk, d_v):
    """The logical q, k, v views of buffers made by :func:`qkv_buffers` (or of tensors
    shaped like them, e.g. their ``.grad``)."""
    if layout in PACKED_QKV_LAYOUTS:
        return tuple(_packed_view(layout, bases[0], i) for i in range(3))
    q_shape, k_shape, v_shape = qkv_shapes(b, h_q, h_kv, s_q, s_kv, d_qk, d_v)
    if layout == KV_PACKED_LAYOUT:
        return (view_of(bases[0], "bshd", q_shape),
                _packed_view("bs2hd", bases[1], 0), _packed_view("bs2hd", bases[1], 1))
    return tuple(view_of(base, layout, shape)
                 for base, shape in zip(bases, (q_shape, k_shape, v_shape)))


def make_qkv(layout, b, h_q, h_kv, s_q, s_kv, d_qk, d_v, dtype, device, seed=None, *,
             fill="randn", requires_grad=False):
    """q, k, v as logical (b, h, s, d) views of ``layout``, plus the tuple of buffers.

    ``fill="randn"`` draws N(0, 1) values from a generator seeded with ``seed`` (the global
    torch RNG when ``seed`` is None); ``fill="nan"`` makes poisoned gradient destinations.
    With ``requires_grad`` the *buffers* are autograd leaves and q, k, v differentiable
    views of them (so ``out.backward()`` fills e.g. one packed ``(b, s, 3, h, d)`` grad).
    Returns ``(q, k, v, bases)``.
    """
    dims = (b, h_q, h_kv, s_q, s_kv, d_qk, d_v)
    bases = qkv_buffers(layout, *dims, dtype=dtype, device=device, fill=fill,
                        gen=make_generator(seed), requires_grad=requires_grad)
    q, k, v = qkv_views(layout, bases, *dims)
    return q, k, v, bases


def poisoned_qkv(layout, b, h_q, h_kv, s_q, s_kv, d_qk, d_v, dtype, device):
    """NaN-filled gradient destinations grad_q, grad_k, grad_v in ``layout`` (e.g. the
    three slices of one packed ``(b, s, 3, h, d)`` buffer). Returns ``(dq, dk, dv, bases)``."""
    return make_qkv(layout, b, h_q, h_kv, s_q, s_kv, d_qk, d_v, dtype, device, fill="nan")


def contiguous_copies(*tensors):
    """Fresh row-major (bhsd) copies with the same values (always a copy)."""
    return tuple(t.detach().clone(memory_format=torch.contiguous_format) for t in tensors)


def stride_order(t: torch.Tensor) -> tuple[int, ...]:
    """Logical axes sorted from the largest stride to the smallest (ties by axis)."""
    return tuple(sorted(range(t.dim()), key=lambda i: (-t.stride(i), i)))


# The high-precision reference lives in helpers.torch_ref; re-exported here for convenience.
from .torch_ref import torch_reference, torch_reference_grads  # noqa: E402,F401


def random_qkv(b, h_q, h_kv, s_q, s_kv, d, dtype, layout, gen):
    """Fresh random q, k, v as logical (b, h, s, d) CUDA views from `gen`: "bhsd" tensors, "bshd"
    views, or "packed" views of one fused (b, s, 3, h, d) projection (h_q = h_kv, s_q = s_kv)."""
    def randn(*shape):
        return torch.randn(*shape, generator=gen, device="cuda", dtype=torch.float32).to(dtype)

    if layout == "packed":
        assert s_q == s_kv and h_q == h_kv
        qkv = randn(b, s_q, 3, h_q, d)
        return tuple(qkv[:, :, i].transpose(1, 2) for i in range(3))
    if layout == "bshd":
        return (randn(b, s_q, h_q, d).transpose(1, 2), randn(b, s_kv, h_kv, d).transpose(1, 2),
                randn(b, s_kv, h_kv, d).transpose(1, 2))
    return randn(b, h_q, s_q, d), randn(b, h_kv, s_kv, d), randn(b, h_kv, s_kv, d)
