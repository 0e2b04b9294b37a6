"""stridedfa.torch.attention: autograd, packed views vs contiguous copies, gradient strides."""

import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import stridedfa  # noqa: E402
import stridedfa.torch  # noqa: E402,F401  (the adapter may be a lazily imported submodule)
from helpers.cases import DEVICE, check_bitexact, check_forward, check_grads  # noqa: E402
from helpers.checks import assert_bitexact, assert_no_nan  # noqa: E402
from helpers.layouts import make_qkv, qkv_views, stride_order  # noqa: E402

pytestmark = pytest.mark.gpu

# layout -> dims (b, h_q, h_kv, s_q, s_kv, d_qk, d_v)
DIMS = {
    "bs3hd": (2, 4, 4, 256, 256, 64, 64),
    "sb3hd": (2, 4, 4, 256, 256, 64, 64),
    "sbh3d": (2, 4, 4, 256, 256, 128, 128),
    "bs2hd_kv": (2, 8, 2, 128, 256, 64, 64),
}
GRAD_NAMES = ("grad_q", "grad_k", "grad_v")


def attention(*args, **kwargs):
    return stridedfa.torch.attention(*args, **kwargs)


def _results(out, grads):
    return {"out": out, **dict(zip(GRAD_NAMES, grads))}


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("layout", list(DIMS))
def test_packed_views_bitexact_vs_contiguous_and_correct(layout, causal, seed):
    """q/k/v are views of leaf buffers (one packed qkv buffer, or q + one packed kv buffer);
    out.backward(g) fills the buffers' .grad. Everything must equal, bit for bit, the same
    computation on contiguous leaf copies, and be close to the reference."""
    dims, dtype = DIMS[layout], torch.bfloat16
    alignment = "bottom_right" if layout == "bs2hd_kv" else "top_left"
    opts = dict(causal=causal, causal_alignment=alignment)

    q, k, v, bases = make_qkv(layout, *dims, dtype, DEVICE, seed, requires_grad=True)
    out = attention(q, k, v, **opts)
    dout = torch.randn(out.shape, device=DEVICE, dtype=dtype)
    out.backward(dout)
    torch.cuda.synchronize()
    grads = qkv_views(layout, [b.grad for b in bases], *dims)
    inputs = [t.detach() for t in (q, k, v)]

    def contiguous_run():
        leaves = [t.clone(memory_format=torch.contiguous_format).requires_grad_() for t in inputs]
        o = attention(*leaves, **opts)
        o.backward(dout)
        torch.cuda.synchronize()
        return _results(o.detach(), [t.grad for t in leaves])

    flat, flat_again = contiguous_run(), contiguous_run()
    nondeterministic = check_bitexact(_results(out.detach(), grads), flat, flat_again)

    ref_options = dict(causal=causal, alignment=alignment)
    check_forward(out, None, *inputs, dtype, ref_options)
    check_grads(grads, *inputs, dout, dtype, ref_options)
    if nondeterministic:
        pytest.xfail("cuDNN backward is not deterministic here: " + "; ".join(nondeterministic))


@pytest.mark.parametrize("layout", ["bshd", "sbhd", "hsbd"])
def test_grad_strides_equal_dense_input_strides(layout, seed):
    """For dense permuted inputs (e.g. a bshd transpose), grad_q/k/v come back with exactly
    the inputs' strides (torch.autograd.grad returns the adapter's tensors unchanged)."""
    dims = (2, 4, 4, 128, 128, 64, 64)
    q, k, v, _ = make_qkv(layout, *dims, torch.float16, DEVICE, seed)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))  # leaves keep the strides
    out = attention(q, k, v, causal=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    for name, g, t in zip(GRAD_NAMES, grads, (q, k, v)):
        assert g.stride() == t.stride(), f"{name}: strides {g.stride()} != input's {t.stride()}"
    check_grads(grads, q, k, v, dout, torch.float16, dict(causal=True))


@pytest.mark.parametrize("layout", ["bs3hd", "sbh3d", "bs2hd_kv"])
def test_grad_strides_follow_packed_input_stride_order(layout, seed):
    dims = DIMS[layout]
    q, k, v, _ = make_qkv(layout, *dims, torch.bfloat16, DEVICE, seed, requires_grad=True)
    out = attention(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    for name, g, t in zip(GRAD_NAMES, grads, (q, k, v)):
        assert g.shape == t.shape, f"{name}: shape {tuple(g.shape)} != {tuple(t.shape)}"
        assert_no_nan(g, name)
        assert stride_order(g) == stride_order(t), (
            f"{name}: stride order {stride_order(g)} (strides {g.stride()}) != input's "
            f"{stride_order(t)} (strides {t.stride()})")


def test_is_causal_alias_gqa_forward(seed):
    dims = (2, 8, 2, 128, 256, 64, 64)
    q, k, v, _ = make_qkv("bshd", *dims, torch.float16, DEVICE, seed)
    a = attention(q, k, v, causal=True, causal_alignment="bottom_right")
    b = attention(q, k, v, is_causal=True, causal_alignment="bottom_right")
    torch.cuda.synchronize()
    assert a.shape == (2, 8, 128, 64) and a.dtype == torch.float16 and a.device == q.device
    assert_bitexact(a, b, "is_causal=True vs causal=True")
    check_forward(a, None, q, k, v, torch.float16, dict(causal=True, alignment="bottom_right"))
