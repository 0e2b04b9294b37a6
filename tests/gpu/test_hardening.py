"""Defects found by trying stridedfa as a new user would, each reproduced here: a reversed CuPy view
that crashed the process, statistics the package allocated itself refused by the backward for one
query head or one query row, strides beyond 2^31 elements, and the workspace memory a caller who
synchronises after every call paid to map again each time."""

import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import stridedfa  # noqa: E402
import stridedfa.torch  # noqa: E402
from helpers.checks import TOLERANCES, assert_close, assert_close_to_scale  # noqa: E402
from helpers.producers import Producer  # noqa: E402
from helpers.torch_ref import torch_reference, torch_reference_grads  # noqa: E402

pytestmark = pytest.mark.gpu


# --- CuPy: negative strides are read as negative and refused, never launched -----------------------

def test_cupy_reversed_view_is_refused_and_the_process_keeps_its_context(cupy):
    c = cupy.random.standard_normal((2, 4, 128, 64), dtype=cupy.float32).astype(cupy.float16)
    reversed_q = c[:, :, ::-1]
    assert reversed_q.strides == (65536, 16384, -128, 2)
    assert stridedfa._core._inspect_dlpack(reversed_q)["strides"] == (32768, 8192, -64, 1)
    out = cupy.full((2, 4, 128, 64), cupy.nan, dtype=cupy.float16)
    with pytest.raises(stridedfa.LayoutError, match=r"q: axis 2 \(seq\) has negative stride -64"):
        stridedfa.sdpa_forward(reversed_q, c, c, out)
    cupy.cuda.Device().synchronize()
    assert bool(cupy.isnan(out).all())  # nothing written
    # Through DLPack too (a producer wrapping CuPy's export, which divides unsigned in CuPy 14.2).
    with pytest.raises(stridedfa.LayoutError, match=r"q: (axis 2 \(seq\) has negative stride|its layout)"):
        stridedfa.sdpa_forward(Producer(reversed_q), c, c, out)
    # The context is alive: a valid call still runs and is right.
    stridedfa.sdpa_forward(c, c, c, out)
    q = torch.from_dlpack(c)
    ref, _ = torch_reference(q, q, q)
    assert_close(torch.from_dlpack(out), ref, atol=5e-3, rtol=5e-3, name="out")


def test_cupy_arrays_are_read_exactly_from_their_attributes(cupy):
    base = cupy.zeros((3, 8, 64, 80), dtype=cupy.float16)
    for view in (base, base[1:, ::2, 3:], base.transpose(0, 2, 1, 3), base[:, :, :, :64]):
        seen = stridedfa._core._inspect_dlpack(view)
        assert seen["strides"] == tuple(s // 2 for s in view.strides)
        assert seen["shape"] == view.shape and seen["data"] == view.data.ptr
        assert seen["path"] == "cupy_attributes"  # no DLPack capsule was made
        assert seen["stream"] == cupy.cuda.get_current_stream().ptr


def test_cupy_absurd_strides_are_refused(cupy):
    base = cupy.zeros(64, dtype=cupy.float16)
    absurd = cupy.lib.stride_tricks.as_strided(base, shape=(2, 1, 2, 64), strides=(2**61, 0, 128, 2))
    with pytest.raises(stridedfa.LayoutError, match=r"q: its layout reaches memory beyond 2\^57"):
        stridedfa.sdpa_forward(absurd, absurd, absurd, cupy.empty((2, 1, 2, 64), cupy.float16))


# --- Statistics of one query head or one query row -------------------------------------------------

@pytest.mark.parametrize("b,h,s_q", [(2, 1, 128), (2, 4, 1), (1, 1, 1), (3, 1, 1)])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_training_with_one_query_head_or_row(b, h, s_q, layout):
    torch.manual_seed(b * 100 + h * 10 + s_q)

    def leaf(s):
        shape = (b, h, s, 64) if layout == "bhsd" else (b, s, h, 64)
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    leaves = [leaf(s_q), leaf(160), leaf(160)]
    q, k, v = leaves if layout == "bhsd" else [x.transpose(1, 2) for x in leaves]
    out = stridedfa.torch.attention(q, k, v, causal=True, causal_alignment="bottom_right")
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    options = dict(causal=True, alignment="bottom_right")
    ref_out, _ = torch_reference(q, k, v, **options)
    tol = TOLERANCES[torch.bfloat16]
    assert_close(out, ref_out, atol=tol.out_atol, rtol=tol.out_rtol, name="out")
    refs = torch_reference_grads(q, k, v, grad_out, **options)
    for leaf_, ref in zip(leaves, refs):
        grad = leaf_.grad if layout == "bhsd" else leaf_.grad.transpose(1, 2)
        assert_close_to_scale(grad, ref, rel=tol.grad_rel, name="grad")


def test_unpacked_statistics_below_9_26_name_the_layout_that_works():
    if tuple(int(x) for x in stridedfa.info()["cudnn"]["version"].split(".")[:2]) >= (9, 26):
        pytest.skip("cuDNN 9.26 reads any statistics layout")
    q = torch.randn(2, 4, 64, 64, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    lse = torch.empty(2, 64, 4, device="cuda").transpose(1, 2)  # (b, h, s) with s outermost
    stridedfa.sdpa_forward(q, q, q, out, lse=lse)  # the forward writes any layout (9.12+)
    grads = [torch.full_like(q, float("nan")) for _ in range(3)]
    with pytest.raises(stridedfa.UnsupportedError, match=r"lse: .*the packed layout is \(256, 64, 1\)"):
        stridedfa.sdpa_backward(q, q, q, out, torch.ones_like(out), lse, *grads)
    assert all(bool(torch.isnan(g).all()) for g in grads)


# --- Strides beyond 2^31 elements ------------------------------------------------------------------

def _huge(stride, fill, keep, b=2, h=2, s=64, d=64):
    base = (torch.randn(stride + h * s * d, device="cuda").to(torch.bfloat16) if fill == "randn"
            else torch.full((stride + h * s * d,), float("nan"), device="cuda", dtype=torch.bfloat16))
    keep.append(base)
    return base.as_strided((b, h, s, d), (stride, s * d, d, 1))


@pytest.mark.parametrize("stride", [2**31 + 64, 2**32 + 64])
def test_strides_beyond_int32_are_read_and_written_correctly(stride):
    """q, its gradient and the forward's out at batch strides past 2^31 elements; past 2^32 the
    backward refuses q and dq (cuDNN 9.19 left half of dq unwritten there, GPU run 14)."""
    keep = []
    q, dq, fwd_out = _huge(stride, "randn", keep), _huge(stride, "nan", keep), _huge(stride, "nan", keep)
    k, v = (torch.randn(2, 2, 64, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lse = torch.empty(2, 2, 64, device="cuda")
    stridedfa.sdpa_forward(q, k, v, fwd_out, lse=lse)
    tol = TOLERANCES[torch.bfloat16]
    ref_out, _ = torch_reference(q, k, v)
    assert_close(fwd_out, ref_out, atol=tol.out_atol, rtol=tol.out_rtol, name="out")
    out = fwd_out.contiguous()  # the backward's out must lie within 4 GiB (next test)
    dout = torch.randn_like(out)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    if stride > 2**32:
        with pytest.raises(stridedfa.UnsupportedError, match=r"q: its elements reach \d+ elements"):
            stridedfa.sdpa_backward(q, k, v, out, dout, lse, dq, dk, dv)
        torch.cuda.synchronize()
        assert bool(torch.isnan(dq).all())
        return
    stridedfa.sdpa_backward(q, k, v, out, dout, lse, dq, dk, dv)
    for name, got, ref in zip(("dq", "dk", "dv"), (dq, dk, dv), torch_reference_grads(q, k, v, dout)):
        assert_close_to_scale(got, ref, rel=tol.grad_rel, name=name)


@pytest.mark.parametrize("slot", ["out", "dout"])
def test_backward_refuses_out_or_grad_out_beyond_4_gib(slot):
    """cuDNN 9.19 computes wrong dq/dk from an out or grad_out past 2^32 bytes (GPU run 13)."""
    keep = []
    q, k, v = (torch.randn(2, 2, 64, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out, lse = torch.empty_like(q), torch.empty(2, 2, 64, device="cuda")
    stridedfa.sdpa_forward(q, k, v, out, lse=lse)
    dout = torch.randn_like(out)
    tensors = {"out": out, "dout": dout}
    tensors[slot] = _huge(2**31 - 4096, "randn", keep).copy_(tensors[slot])
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    name = "out" if slot == "out" else "grad_out"
    with pytest.raises(stridedfa.UnsupportedError, match=rf"{name}: its elements reach \d+ bytes"):
        stridedfa.sdpa_backward(q, k, v, tensors["out"], tensors["dout"], lse, *grads)
    torch.cuda.synchronize()
    assert all(bool(torch.isnan(g).all()) for g in grads)


# --- The core's workspace survives a synchronisation ------------------------------------------------

def test_pooled_workspace_is_kept_across_synchronisations_and_released_by_cache_clear():
    q = torch.randn(2, 16, 1024, 128, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    lse = torch.empty(2, 16, 1024, device="cuda")
    grads = [torch.empty_like(q) for _ in range(3)]
    stridedfa.sdpa_forward(q, q, q, out, lse=lse)
    stridedfa.sdpa_backward(q, q, q, out, torch.randn_like(out), lse, *grads)  # needs a workspace
    torch.cuda.synchronize()
    info = stridedfa.cache_info()
    assert info["pool_reserved_bytes"] > 0, info  # kept mapped although the device is idle
    assert info["pool_used_bytes"] == 0, info
    assert info["pool_retain_bytes"] == 512 << 20
    stridedfa.cache_clear()
    torch.cuda.synchronize()
    assert stridedfa.cache_info()["pool_reserved_bytes"] == 0
