"""Validation on the GPU: bad tensors raise before anything is written; cases at the edge
of what cuDNN runs are either correct or refused with a StridedFAError, never wrong."""

import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import stridedfa  # noqa: E402
from helpers.cases import (  # noqa: E402
    DEVICE,
    Case,
    build,
    check_against_reference,
    check_forward,
    check_fully_written,
    check_grads,
    forward,
    run_case,
)
from helpers.checks import assert_all_nan, assert_bitexact  # noqa: E402
from helpers.layouts import general_tensor, make_qkv, poisoned_like_strided, poisoned_lse  # noqa: E402

pytestmark = pytest.mark.gpu

B, H, S, D = 1, 4, 128, 64
F16 = torch.float16


def _valid_forward_args(seed, h_q=H, h_kv=H, d=D, dtype=F16):
    q, k, v, _ = make_qkv("bhsd", B, h_q, h_kv, S, S, d, d, dtype, DEVICE, seed)
    out, _ = poisoned_like_strided((B, h_q, S, d), dtype=dtype, device=DEVICE)
    return dict(q=q, k=k, v=v, out=out, lse=poisoned_lse(B, h_q, S, DEVICE))


def _shifted(t, elements):
    """A copy of ``t`` whose data pointer is ``elements`` past a fresh allocation."""
    buf = torch.empty(t.numel() + elements, dtype=t.dtype, device=t.device)
    view = buf[elements:].view(t.shape)
    view.copy_(t)
    return view


def _overlapping_pair(t):
    """(a copy of t, a tensor of t's shape overlapping the second half of that copy)."""
    n = t.numel()
    buf = torch.empty(2 * n, dtype=t.dtype, device=t.device)
    first = buf[:n].view(t.shape)
    first.copy_(t)
    return first, buf[n // 2: n // 2 + n].view(t.shape)


def _overlap_out_with_v(a):
    a["v"], a["out"] = _overlapping_pair(a["v"])


def _padded_q(a):
    # seq stride of 68 fp16 elements = 136 bytes, not a multiple of 16
    a["q"] = general_tensor((B, H, S, D), "bhsd", pad_d=4, dtype=F16, device=DEVICE)[0]


def _float32_everything(a):
    a.update(q=a["q"].float(), k=a["k"].float(), v=a["v"].float(),
             out=torch.full((B, H, S, D), float("nan"), device=DEVICE))


# name -> (mutation of valid arguments that makes the call invalid, regex the message must match)
BAD_FORWARD = {
    "misaligned_q_pointer": (lambda a: a.update(q=_shifted(a["q"], 4)), None),
    "seq_stride_not_16_bytes": (_padded_q, None),
    "head_dim_stride_not_1": (
        lambda a: a.update(q=a["q"].transpose(2, 3).contiguous().transpose(2, 3)), None),
    "out_is_q": (lambda a: a.update(out=a["q"]), None),
    "out_overlaps_v_partly": (_overlap_out_with_v, None),
    "h_q_not_multiple_of_h_kv": (lambda a: a.update(k=a["k"][:, :3], v=a["v"][:, :3]), None),
    "seq_kv_mismatch": (lambda a: a.update(v=a["v"][:, :, :64]), None),
    "dtype_mismatch": (lambda a: a.update(k=a["k"].to(torch.bfloat16)), None),
    "float32_inputs": (_float32_everything, None),
    "lse_not_float32": (lambda a: a.update(lse=a["lse"].half()), None),
    "cpu_tensor": (lambda a: a.update(q=a["q"].cpu()), "CUDA"),
}


@pytest.mark.parametrize("name", list(BAD_FORWARD))
def test_invalid_forward_raises_layout_error_and_writes_nothing(name, seed):
    mutate, match = BAD_FORWARD[name]
    args = _valid_forward_args(seed)
    poisoned = {n: args[n] for n in ("out", "lse")}
    mutate(args)
    snapshots = {n: args[n].clone() for n in ("q", "k", "v")}
    with pytest.raises(stridedfa.LayoutError, match=match):
        stridedfa.sdpa_forward(args["q"], args["k"], args["v"], args["out"], lse=args["lse"])
    torch.cuda.synchronize()
    for n, t in poisoned.items():
        if args[n] is t:  # still the poisoned output (not replaced by the mutation)
            assert_all_nan(t, n)
    for n, before in snapshots.items():
        assert_bitexact(args[n], before, f"input {n} after the refused call")


@pytest.mark.parametrize("name", ["grad_k_is_grad_q", "grad_v_overlaps_v"])
def test_invalid_backward_raises_and_writes_nothing(name, seed):
    case = Case("bhsd", "fp16", b=B, h_q=H, h_kv=H, s_q=S, s_kv=S)
    run = build(case, seed)
    forward(run, case.options)
    if name == "grad_k_is_grad_q":
        run.dk = run.dq
    else:
        run.v, run.dv = _overlapping_pair(run.v)
    v_before = run.v.clone()
    with pytest.raises(stridedfa.LayoutError):
        stridedfa.sdpa_backward(run.q, run.k, run.v, run.out, run.dout, run.lse,
                                run.dq, run.dk, run.dv)
    torch.cuda.synchronize()
    assert_all_nan(run.dq, "grad_q")
    assert_all_nan(run.dk, "grad_k")
    if name == "grad_k_is_grad_q":
        assert_all_nan(run.dv, "grad_v")
    assert_bitexact(run.v, v_before, "v after the refused call")


@pytest.mark.parametrize("case", [
    pytest.param(Case("bhsd", "fp16", d_qk=72, d_v=72), id="d72-bhsd-fp16"),
    pytest.param(Case("bshd", "bf16", d_qk=72, d_v=72, causal=True, out_layout="bshd",
                      grad_layout="bshd"), id="d72-bshd-bf16-causal"),
    pytest.param(Case("bhsd", "bf16", d_qk=256, d_v=256, b=1, s_q=128, s_kv=128), id="d256-bf16"),
])
def test_supported_head_dims_match_reference(case, seed):
    run = run_case(case, seed)
    check_fully_written(run)
    check_against_reference(run, case.torch_dtype, case.ref_options)


def _try_forward(args):
    """sdpa_forward; returns the StridedFAError raised (outputs must then be untouched) or
    None after checking the result against the reference."""
    try:
        stridedfa.sdpa_forward(args["q"], args["k"], args["v"], args["out"], lse=args["lse"])
    except stridedfa.StridedFAError as exc:
        torch.cuda.synchronize()
        assert_all_nan(args["out"], "out")
        assert_all_nan(args["lse"], "lse")
        return exc
    torch.cuda.synchronize()
    check_forward(args["out"], args["lse"], args["q"], args["k"], args["v"], args["q"].dtype, {})
    return None


def test_head_dims_differing_beyond_256_are_correct_or_refused_untouched(seed):
    """d_qk = 320 with d_v = 64: whatever this cuDNN does with it, the result is right or an
    UnsupportedError with nothing written. (The refusal this test used to pin, bottom-right causal
    with s_q > s_kv, now runs: test_variants.py.)"""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    args = dict(q=torch.randn(B, H, S, 320, device=DEVICE, dtype=F16, generator=gen),
                k=torch.randn(B, H, S, 320, device=DEVICE, dtype=F16, generator=gen),
                v=torch.randn(B, H, S, 64, device=DEVICE, dtype=F16, generator=gen),
                out=poisoned_like_strided((B, H, S, 64), dtype=F16, device=DEVICE)[0],
                lse=poisoned_lse(B, H, S, DEVICE))
    exc = _try_forward(args)
    assert exc is None or isinstance(exc, stridedfa.UnsupportedError), repr(exc)


def test_head_dim_300_is_refused(seed):
    """600-byte rows are not a multiple of 16 bytes (LayoutError) and cuDNN has no 300."""
    exc = _try_forward(_valid_forward_args(seed, d=300))
    assert isinstance(exc, (stridedfa.LayoutError, stridedfa.UnsupportedError)), repr(exc)


@pytest.mark.parametrize("d", [264, 512, 1024])  # cuDNN 9.19 on an H200 ran d=1024 correctly
def test_large_head_dims_correct_or_unsupported(d, seed):
    """Beyond 256 cuDNN may or may not run a head dim; either way never a wrong result."""
    exc = _try_forward(_valid_forward_args(seed, d=d))
    assert exc is None or isinstance(exc, stridedfa.UnsupportedError), repr(exc)


# ------------------------------------------------------- never silently wrong at the edges


def _strided_lse(kind):
    if kind == "padded":  # (b, h, s) view of (b, h, s + 4): h stride padded
        return torch.full((B, H, S + 4), float("nan"), device=DEVICE)[:, :, :S]
    return torch.full((B, S, H), float("nan"), device=DEVICE).transpose(1, 2)  # "transposed"


@pytest.mark.parametrize("kind", ["padded", "transposed"])
def test_strided_lse_is_correct_or_refused(kind, seed):
    """A non-packed lse: the forward writes it correctly or refuses; the backward (which on
    cuDNN < 9.26 reads stats as packed bhsd) uses it correctly or refuses."""
    case = Case("bhsd", "fp16", b=B, h_q=H, h_kv=H, s_q=S, s_kv=S)
    run = build(case, seed)
    run.lse = _strided_lse(kind)
    args = dict(q=run.q, k=run.k, v=run.v, out=run.out, lse=run.lse)
    if _try_forward(args) is not None:
        return
    try:
        stridedfa.sdpa_backward(run.q, run.k, run.v, run.out, run.dout, run.lse,
                                run.dq, run.dk, run.dv)
    except stridedfa.StridedFAError:
        torch.cuda.synchronize()
        for n, t in (("grad_q", run.dq), ("grad_k", run.dk), ("grad_v", run.dv)):
            assert_all_nan(t, n)
        return
    torch.cuda.synchronize()
    check_grads((run.dq, run.dk, run.dv), run.q, run.k, run.v, run.dout, F16, {})


def test_broadcast_kv_heads_correct_or_refused(seed):
    """k/v expanded over the head axis (stride 0 on an axis of extent > 1)."""
    args = _valid_forward_args(seed)
    args["k"] = args["k"][:, :1].expand(B, H, S, D)
    args["v"] = args["v"][:, :1].expand(B, H, S, D)
    exc = _try_forward(args)
    refused = (stridedfa.LayoutError, stridedfa.UnsupportedError)
    assert exc is None or isinstance(exc, refused), repr(exc)


def test_stride_of_extent_one_axes_is_free(seed):
    """b = 1 and h_kv = 1 (MQA): their strides are arbitrary and must not matter."""
    q, k, v, _ = make_qkv("bhsd", 1, H, 1, S, S, D, D, F16, DEVICE, seed)
    odd_k = torch.empty(k.numel() + 64, dtype=F16, device=DEVICE).as_strided(k.shape, (7, 3, D, 1))
    odd_k.copy_(k)
    results = []
    for kk in (k, odd_k):
        out, _ = poisoned_like_strided((1, H, S, D), dtype=F16, device=DEVICE)
        lse = poisoned_lse(1, H, S, DEVICE)
        stridedfa.sdpa_forward(q, kk, v, out, lse=lse)
        results.append((out, lse))
    torch.cuda.synchronize()
    assert_bitexact(results[1][0], results[0][0], "out with odd extent-1 strides")
    assert_bitexact(results[1][1], results[0][1], "lse with odd extent-1 strides")
    check_forward(*results[0], q, k, v, F16, {})
