"""stridedfa.torch.packed_attention: one entry point for every packing (the packed axis and the
order of the other axes are arguments); gradients land in one packed buffer with the input's
strides and equal, bit for bit, those of the unpacked path; fp32-reference check on small shapes."""

import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import stridedfa.torch as sfa_torch  # noqa: E402
from helpers.checks import assert_close, assert_close_to_scale, assert_no_nan, bitexact_mismatch  # noqa: E402
from helpers.torch_ref import torch_reference, torch_reference_grads  # noqa: E402
from stridedfa import _layouts  # noqa: E402

pytestmark = pytest.mark.gpu

# name -> (layout of the four named axes, packed dim, h_q, h_kv, s_q, s_kv, causal alignment)
PACKINGS = {
    "bs3hd": ("bshd", 2, 4, 4, 128, 128, "top_left"),
    "sb3hd": ("sbhd", 2, 4, 4, 128, 128, "top_left"),
    "bsh3d": ("bshd", 3, 4, 4, 128, 128, "top_left"),
    "b3hsd": ("bhsd", 1, 4, 4, 128, 128, "top_left"),
    "bs2hd_kv_gqa": ("bshd", 2, 8, 2, 64, 192, "bottom_right"),
    "sb2hd_kv": ("sbhd", 2, 4, 4, 96, 160, "bottom_right"),
}
B, D = 2, 64


def _shape(layout, sizes, dim, n):
    shape = [sizes[axis] for axis in layout]
    shape.insert(dim, n)
    return shape


def _make(name, seed, dtype, *, padded=False):
    layout, dim, h_q, h_kv, s_q, s_kv, alignment = PACKINGS[name]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    kv_only = h_q != h_kv or s_q != s_kv
    kv_sizes = {"b": B, "s": s_kv, "h": h_kv, "d": D}
    shape = _shape(layout, kv_sizes, dim, 2 if kv_only else 3)
    if padded:  # packed is a slice of a wider buffer: not dense, gradient dense in its axis order
        wide = list(shape)
        wide[-1] += 16
        packed = torch.randn(wide, device="cuda", dtype=dtype, generator=gen)[..., :shape[-1]]
    else:
        packed = torch.randn(shape, device="cuda", dtype=dtype, generator=gen)
    packed.requires_grad_()
    q = None
    if kv_only:
        q = torch.randn([{"b": B, "s": s_q, "h": h_q, "d": D}[a] for a in layout], device="cuda",
                        dtype=dtype, generator=gen).requires_grad_()
    return layout, dim, packed, q, alignment


def _logical(t, layout):
    return t.permute([layout.index(a) for a in "bhsd"])


def _views(packed, dim, q):
    if q is None:
        return [packed.select(dim, i) for i in range(3)]
    return [q, packed.select(dim, 0), packed.select(dim, 1)]


@pytest.mark.parametrize("name", list(PACKINGS))
@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
def test_packed_gradients_bitexact_vs_unpacked(name, padded, seed):
    layout, dim, packed, q, alignment = _make(name, seed, torch.bfloat16, padded=padded)
    opts = dict(causal=True, causal_alignment=alignment)
    out = sfa_torch.packed_attention(packed, dim, layout=layout, q=q, **opts)
    grad_out = torch.randn(out.shape, device="cuda", dtype=out.dtype)
    leaves = [packed] + ([q] if q is not None else [])
    grads = torch.autograd.grad(out, leaves, grad_out)
    grad_packed = grads[0]
    assert grad_packed.stride() == _layouts.gradient_strides(packed.shape, packed.stride())
    if not padded:
        assert grad_packed.stride() == packed.stride()
    assert_no_nan(grad_packed, "grad_packed")

    # The unpacked path on contiguous copies of the same q/k/v.
    views = [_logical(t.detach(), layout) for t in _views(packed, dim, q)]
    copies = [t.contiguous().requires_grad_() for t in views]
    ref_out = sfa_torch.attention(*copies, **opts)
    ref_grads = torch.autograd.grad(ref_out, copies, _logical(grad_out, layout))
    got_grads = [_logical(g, layout) for g in _views(grad_packed, dim, grads[1] if q is not None else None)]
    failures = []
    for what, got, want in [("out", _logical(out, layout), ref_out)] + list(
            zip(("grad_q", "grad_k", "grad_v"), got_grads, ref_grads)):
        msg = bitexact_mismatch(got, want)
        if msg:
            failures.append(f"{what}: {msg}")
    assert not failures, "; ".join(failures)


@pytest.mark.parametrize("name", ["bs3hd", "bs2hd_kv_gqa"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_packed_gradients_vs_fp32_reference_small(name, dtype, seed):
    """gradcheck-style: every gradient of a small problem against float64 autograd of the
    reference formula (cuDNN has no fp32 attention, so the comparison is at half precision's
    tolerance)."""
    layout, dim, packed, q, alignment = _make(name, seed, dtype)
    opts = dict(causal=True, causal_alignment=alignment)
    out = sfa_torch.packed_attention(packed, dim, layout=layout, q=q, **opts)
    grad_out = torch.randn(out.shape, device="cuda", dtype=dtype)
    leaves = [packed] + ([q] if q is not None else [])
    grads = torch.autograd.grad(out, leaves, grad_out)
    lq, lk, lv = (_logical(t.detach(), layout) for t in _views(packed, dim, q))
    ref_opts = dict(causal=True, alignment=alignment)
    ref_out, _ = torch_reference(lq, lk, lv, **ref_opts)
    tol = {torch.float16: (5e-3, 1e-2), torch.bfloat16: (2e-2, 3e-2)}[dtype]
    assert_close(_logical(out, layout), ref_out, atol=tol[0], rtol=tol[0], name="out")
    ref = torch_reference_grads(lq, lk, lv, _logical(grad_out, layout), **ref_opts)
    got = [_logical(g, layout) for g in _views(grads[0], dim, grads[1] if q is not None else None)]
    for gname, g, r in zip(("grad_q", "grad_k", "grad_v"), got, ref):
        assert_close_to_scale(g, r, rel=tol[1], name=gname)


def test_packed_forward_reads_zero_copy_views(seed):
    """No copy of the packed input in the forward: peak memory grows by the output (and lse)."""
    layout, dim, packed, q, alignment = _make("bs3hd", seed, torch.bfloat16)
    with torch.no_grad():
        sfa_torch.packed_attention(packed, dim, causal=True)  # warm-up (graph build)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = sfa_torch.packed_attention(packed, dim, causal=True)
        torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    assert extra < packed.numel() * packed.element_size() // 3 + out.numel() * out.element_size() + (1 << 20)


@pytest.mark.parametrize("bad", ["dim_extent", "layout", "ndim", "q_with_qkv"])
def test_packed_argument_errors(bad):
    packed = torch.empty(2, 16, 3, 4, 64, device="cuda", dtype=torch.bfloat16)
    import stridedfa

    with pytest.raises((stridedfa.LayoutError, ValueError)):
        if bad == "dim_extent":
            sfa_torch.packed_attention(packed, 1)
        elif bad == "layout":
            sfa_torch.packed_attention(packed, 2, layout="bsxd")
        elif bad == "ndim":
            sfa_torch.packed_attention(packed[0], 2)
        else:
            sfa_torch.packed_attention(packed, 2, q=packed[:, :, 0])
