"""The registered torch operators: opcheck, stride-exact fake kernels, allocation-path outputs."""

import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import stridedfa  # noqa: E402
import stridedfa.torch as sfa_torch  # noqa: E402
from helpers.cases import DEVICE, check_forward, check_grads  # noqa: E402
from helpers.checks import assert_no_nan  # noqa: E402
from stridedfa import _layouts  # noqa: E402

pytestmark = pytest.mark.gpu

# The options after causal_alignment, as the operators take them: no window (-1, -1), no softcap,
# no padding lengths, no sinks, non-deterministic backward.
DEFAULTS = (-1, -1, None, None, None, None, False, None, None, 0.0, None)

B, H, S, D = 2, 4, 128, 64


def _inputs(kind, seed, dtype=torch.bfloat16, requires_grad=False):
    """q, k, v (b, h, s, d) as contiguous tensors, transposed views of bshd tensors, or views of
    one packed (b, s, 3, h, d) buffer; fresh random data."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    if kind == "contiguous":
        tensors = [torch.randn(B, H, S, D, device=DEVICE, dtype=dtype, generator=gen) for _ in range(3)]
        leaves = tensors
    elif kind == "transposed":
        leaves = [torch.randn(B, S, H, D, device=DEVICE, dtype=dtype, generator=gen) for _ in range(3)]
        tensors = [t.transpose(1, 2) for t in leaves]
    elif kind == "packed":
        packed = torch.randn(B, S, 3, H, D, device=DEVICE, dtype=dtype, generator=gen)
        leaves = [packed]
        tensors = [packed[:, :, i].transpose(1, 2) for i in range(3)]
    else:
        raise ValueError(kind)
    if requires_grad:
        for leaf in leaves:
            leaf.requires_grad_(True)
        if kind == "transposed":
            tensors = [t.transpose(1, 2) for t in leaves]
        elif kind == "packed":
            tensors = [leaves[0][:, :, i].transpose(1, 2) for i in range(3)]
    return tensors


def _poison_next_allocation(nbytes):
    """Leaves a NaN-filled block of exactly `nbytes` in torch's cache, so the next allocation of
    that size reuses it and any element the kernel leaves unwritten shows as NaN. Returns the
    block's address (to check it was indeed reused)."""
    block = torch.full((nbytes // 2,), float("nan"), device=DEVICE, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    address = block.data_ptr()
    del block
    return address


@pytest.mark.parametrize("kind", ["contiguous", "transposed", "packed"])
def test_opcheck_forward_and_backward(kind, seed):
    q, k, v = _inputs(kind, seed, requires_grad=True)
    torch.library.opcheck(torch.ops.stridedfa.attention_forward.default,
                          (q, k, v, None, True, "top_left", *DEFAULTS, True))
    # Without statistics (what an inference call asks for) there is no backward to check.
    torch.library.opcheck(torch.ops.stridedfa.attention_forward.default,
                          (q.detach(), k.detach(), v.detach(), None, True, "top_left", *DEFAULTS, False))
    # The inference operator of calls without variant options, and its equality with the full one.
    plain = (q.detach(), k.detach(), v.detach(), None, True, "top_left")
    torch.library.opcheck(torch.ops.stridedfa.attention_inference_basic.default, plain)
    assert torch.equal(torch.ops.stridedfa.attention_inference_basic(*plain),
                       torch.ops.stridedfa.attention_inference(*plain, *DEFAULTS))
    out, lse = torch.ops.stridedfa.attention_forward(q, k, v, None, True, "top_left", *DEFAULTS, True)
    grad_out = torch.randn_like(out)
    torch.library.opcheck(torch.ops.stridedfa.attention_backward.default,
                          (q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), grad_out,
                           None, True, "top_left", *DEFAULTS, False))


def _option_sets(b=B, s=S):
    lengths = (torch.tensor([s, s // 2 + 3][:b], device=DEVICE, dtype=torch.int32),) * 2
    sinks = torch.randn(H, device=DEVICE).requires_grad_()
    bias = torch.randn(1, H, s, s, device=DEVICE, dtype=torch.bfloat16).requires_grad_()
    mask_bias = torch.randn(b, 1, s, s, device=DEVICE, dtype=torch.bfloat16)  # shared heads, no gradient
    slopes = torch.rand(H, device=DEVICE)
    rng = torch.tensor([1234, 5678], device=DEVICE, dtype=torch.int64)  # Philox seed and offset
    return {"window": (16, 0, None, None, None, None, False, None, None, 0.0, None),
            "window_both": (8, 24, None, None, None, None, False, None, None, 0.0, None),
            "softcap": (-1, -1, 30.0, None, None, None, False, None, None, 0.0, None),
            "padding": (-1, -1, None, *lengths, None, False, None, None, 0.0, None),
            "sinks": (-1, -1, None, None, None, sinks, False, None, None, 0.0, None),
            "deterministic": (-1, -1, None, None, None, None, True, None, None, 0.0, None),
            "bias": (-1, -1, None, None, None, None, False, bias, None, 0.0, None),
            "mask_bias": (-1, -1, None, None, None, None, False, mask_bias, None, 0.0, None),
            "alibi": (-1, -1, None, None, None, None, False, None, slopes, 0.0, None),
            "dropout": (-1, -1, None, None, None, None, False, None, None, 0.1, rng),
            # fixed sinks: their gradient with dropout is refused (cuDNN 9.19 gets it wrong)
            "all": (31, 0, 50.0, *lengths, sinks.detach(), True, mask_bias, slopes, 0.1, rng)}


@pytest.mark.parametrize("name", ["window", "window_both", "softcap", "padding", "sinks", "deterministic", "bias",
                                  "mask_bias", "alibi", "dropout", "all"])
def test_opcheck_every_option(name, seed):
    """Each option through the operators: fake kernels, schema, autograd registration."""
    q, k, v = _inputs("packed", seed, requires_grad=True)
    extra = _option_sets()[name]
    torch.library.opcheck(torch.ops.stridedfa.attention_forward.default, (q, k, v, None, True, "top_left", *extra,
                                                                          True))
    torch.library.opcheck(torch.ops.stridedfa.attention_inference.default,
                          (q.detach(), k.detach(), v.detach(), None, False, "top_left", *extra))
    out, lse = torch.ops.stridedfa.attention_forward(q, k, v, None, True, "top_left", *extra, True)
    torch.library.opcheck(torch.ops.stridedfa.attention_backward.default,
                          (q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), torch.randn_like(out),
                           None, True, "top_left", *(x.detach() if isinstance(x, torch.Tensor) else x for x in extra),
                           name == "bias"))  # the bias' gradient: not under a softcap or ALiBi
    packed = torch.randn(B, S, 3, H, D, device=DEVICE, dtype=torch.bfloat16).requires_grad_()
    torch.library.opcheck(torch.ops.stridedfa.packed_attention_forward.default,
                          (packed, 2, "bshd", None, None, True, "top_left", *extra, True))


@pytest.mark.parametrize("layout,dim", [("bshd", 2), ("sbhd", 2), ("bshd", 3), ("bhsd", 1)])
def test_opcheck_packed(layout, dim, seed):
    shape = [{"b": B, "s": S, "h": H, "d": D}[axis] for axis in layout]
    shape.insert(dim, 3)
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    packed = torch.randn(shape, device=DEVICE, dtype=torch.bfloat16, generator=gen).requires_grad_()
    torch.library.opcheck(torch.ops.stridedfa.packed_attention_forward.default,
                          (packed, dim, layout, None, None, True, "top_left", *DEFAULTS, True))
    out, lse = torch.ops.stridedfa.packed_attention_forward(packed, dim, layout, None, None, True,
                                                            "top_left", *DEFAULTS, True)
    torch.library.opcheck(torch.ops.stridedfa.packed_attention_backward.default,
                          (packed.detach(), dim, layout, None, out.detach(), lse.detach(),
                           torch.randn_like(out), None, True, "top_left", *DEFAULTS, False))


@pytest.mark.parametrize("kind", ["contiguous", "transposed", "packed"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_eager_fast_path_poisoned_and_correct(kind, dtype, seed):
    """attention() without autograd takes the one-C-call path: out allocated by torch through the
    DLPack exchange API (poisoned block reused), strides by the layout rule, values vs fp32 ref."""
    q, k, v = _inputs(kind, seed, dtype)
    address = _poison_next_allocation(B * H * S * D * 2)
    out = sfa_torch.attention(q, k, v, causal=True)
    torch.cuda.synchronize()
    assert out.data_ptr() == address, "the poisoned block was not reused; the poison proves nothing"
    assert out.stride() == _layouts.output_strides(out.shape, q.stride())
    assert_no_nan(out, "out")
    check_forward(out, None, q, k, v, dtype, dict(causal=True))


@pytest.mark.parametrize("kind", ["contiguous", "transposed", "packed"])
def test_autograd_path_strides_and_values(kind, seed):
    q, k, v = _inputs(kind, seed, requires_grad=True)
    out = sfa_torch.attention(q, k, v, causal=True)
    assert out.stride() == _layouts.output_strides(out.shape, q.stride())
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    check_forward(out, None, q, k, v, torch.bfloat16, dict(causal=True))
    check_grads(grads, q, k, v, grad_out, torch.bfloat16, dict(causal=True))


def test_fast_path_and_operator_give_identical_bits(seed):
    q, k, v = _inputs("packed", seed)
    fast = sfa_torch.attention(q, k, v, causal=True)
    via_op = torch.ops.stridedfa.attention_forward(q, k, v, None, True, "top_left", *DEFAULTS, False)[0]
    assert torch.equal(fast, via_op)


def test_bad_input_raises_before_allocating(seed):
    q, k, v = _inputs("contiguous", seed)
    before = torch.cuda.memory_allocated()
    with pytest.raises(stridedfa.LayoutError, match="head_dim|d_qk|k"):
        sfa_torch.attention(q, k[..., :32], v)
    with pytest.raises(stridedfa.LayoutError):
        sfa_torch.attention(q.float(), k.float(), v.float())
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
