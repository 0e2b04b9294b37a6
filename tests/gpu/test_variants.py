"""Attention variants through the generic entry points (sdpa_forward / sdpa_backward): windows,
causal bottom-right with s_q > s_kv, padding lengths, deterministic backward.

Each case draws fresh inputs, poisons every output with NaN, runs forward then backward, and
compares with the NumPy reference (float64, stridedfa.reference) where a row sees keys; where it
sees none (or is padding) the documented values must be there: out = 0, lse = -inf, zero
gradients. Layouts: bhsd tensors, bshd views, and views of one packed (b, s, 3, h, d) buffer.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import stridedfa  # noqa: E402
from helpers.layouts import random_qkv  # noqa: E402 (imports torch)
from stridedfa import reference  # noqa: E402

pytestmark = pytest.mark.gpu

# (out atol, grad rel, grad atol). The absolute floor of the gradients: cuDNN's backward reads the
# forward's rounded out (D = rowsum(dO * out)), so where a gradient is ~0 exactly (a row that sees
# one key: P = 1) it carries that rounding, ~2^-8 |dO| |v| in bf16.
TOL = {torch.float16: (5e-3, 1e-2, 1e-3), torch.bfloat16: (2.5e-2, 3e-2, 5e-3)}


def _poisoned(like):
    return torch.full_like(like, float("nan"))


def _np(t):
    return t.detach().float().cpu().numpy().astype(np.float64)


def run_case(*, b=2, h_q=4, h_kv=2, s_q=128, s_kv=128, d=64, dtype=torch.bfloat16, layout="bhsd",
             causal=False, alignment="top_left", window=None, seqlens=None, deterministic=False,
             softcap=None, sinks=False, alibi=False, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = random_qkv(b, h_q, h_kv, s_q, s_kv, d, dtype, layout, gen)
    out = _poisoned(torch.empty(b, h_q, s_q, d, device="cuda", dtype=dtype))
    lse = torch.full((b, h_q, s_q), float("nan"), device="cuda")
    options = dict(causal=causal, causal_alignment=alignment, window=window, softcap=softcap)
    lengths = {}
    if seqlens is not None:  # either side may be None: the core takes the full length there
        lengths = {name: torch.tensor(x, device="cuda", dtype=torch.int32)
                   for name, x in zip(("seqlens_q", "seqlens_kv"), seqlens) if x is not None}
    sink = {}
    if sinks:  # logits around the scores' own scale, some high enough to take most of the weight
        sink = dict(sinks=2.0 * torch.randn(h_q, generator=gen, device="cuda"))
    if alibi:  # BLOOM's geometric slopes 2^(-8 (h + 1) / h_q), mixed in order
        sink["alibi_slopes"] = (2.0 ** (-8.0 * torch.arange(1, h_q + 1, device="cuda") / h_q)).flip(0)
    stridedfa.sdpa_forward(q, k, v, out, lse=lse, **options, **lengths, **sink)
    grad_out = torch.randn(out.shape, generator=gen, device="cuda").to(dtype)
    dq, dk, dv = (_poisoned(torch.empty(t.shape, device="cuda", dtype=dtype)) for t in (q, k, v))
    grad_sinks = torch.full((h_q,), float("nan"), device="cuda") if sinks else None
    stridedfa.sdpa_backward(q, k, v, out, grad_out, lse, dq, dk, dv, deterministic=deterministic,
                            **options, **lengths, **sink, **({"grad_sinks": grad_sinks} if sinks else {}))
    torch.cuda.synchronize()

    ref_lengths = {} if seqlens is None else dict(
        seqlens_q=np.array(seqlens[0] if seqlens[0] is not None else [s_q] * b),
        seqlens_kv=np.array(seqlens[1] if seqlens[1] is not None else [s_kv] * b))
    ref_sink = {name: _np(x) for name, x in sink.items()}
    ref_out, ref_lse = reference.sdpa_forward(_np(q), _np(k), _np(v), dtype=np.float64, **options,
                                              **ref_lengths, **ref_sink)
    ref_dq, ref_dk, ref_dv, extra = reference.sdpa_backward(_np(q), _np(k), _np(v), _np(grad_out),
                                                            dtype=np.float64, **options, **ref_lengths, **ref_sink,
                                                            return_extra=True)
    if sinks:
        want = torch.from_numpy(extra["dsinks"]).cuda().float()
        err = (grad_sinks - want).abs().max().item()
        assert err <= 3e-2 * max(want.abs().max().item(), 1e-2) + 1e-3, f"grad_sinks: max err {err:.3e}"
    seen = reference.visible_mask(s_q, s_kv, causal=causal, causal_alignment=alignment, window=window,
                                  b=b, **ref_lengths)  # (b, 1, s_q, s_kv)
    rows = torch.from_numpy(seen.any(axis=3)[:, 0].copy()).cuda()  # (b, s_q): row sees a key
    out_atol, grad_rel, grad_atol = TOL[dtype]

    got_out = out.float()
    err = (got_out - torch.from_numpy(ref_out).cuda().float()).abs()
    assert not torch.isnan(got_out).any(), f"out: {int(torch.isnan(got_out).sum())} elements NaN (unwritten?)"
    assert err.max().item() <= out_atol + 1e-2 * np.abs(ref_out).max(), f"out: max err {err.max().item():.3e}"
    empty = ~rows[:, None, :].expand(b, h_q, s_q)
    if empty.any():
        assert (got_out[empty] == 0).all(), "out: rows that see no key must be 0"
        assert torch.isneginf(lse[empty]).all(), f"lse: rows that see no key must be -inf, got {lse[empty][:4]}"
    full = ~empty
    lse_err = (lse[full] - torch.from_numpy(ref_lse).cuda().float()[full]).abs()
    lse_scale = max(1.0, float(np.abs(ref_lse[np.isfinite(ref_lse)]).max(initial=0.0)))
    assert lse_err.numel() == 0 or lse_err.max().item() <= 2e-3 * lse_scale, f"lse: max err {lse_err.max().item():.3e}"
    for name, got, want in (("grad_q", dq, ref_dq), ("grad_k", dk, ref_dk), ("grad_v", dv, ref_dv)):
        g = got.float()
        assert not torch.isnan(g).any(), f"{name}: {int(torch.isnan(g).sum())} elements NaN (unwritten?)"
        w = torch.from_numpy(want).cuda().float()
        scale = max(w.abs().max().item(), 1e-3)
        assert (g - w).abs().max().item() <= grad_rel * scale + grad_atol, \
            f"{name}: max err {(g - w).abs().max().item():.3e} vs scale {scale:.3e}"
    if empty.any():
        assert (dq.float()[empty] == 0).all(), "grad_q: rows that see no key must be 0"
    keys = torch.from_numpy(seen.any(axis=2)[:, 0].copy()).cuda()  # (b, s_kv): key seen by a row
    unseen = ~keys[:, None, :].expand(b, h_kv, s_kv)
    if unseen.any():
        assert (dk.float()[unseen] == 0).all() and (dv.float()[unseen] == 0).all(), \
            "grad_k / grad_v: keys no row sees must get zero gradients"
    return out, lse, dq, dk, dv


WINDOWS = [
    pytest.param(dict(window=(31, 0)), id="window31_0"),
    pytest.param(dict(window=(16, 16)), id="window16_16"),
    pytest.param(dict(window=(0, 0)), id="window0_0-diagonal_only"),
    pytest.param(dict(window=(None, 8)), id="window_none_8"),
    pytest.param(dict(causal=True, window=(63, None)), id="causal-window63"),
    pytest.param(dict(causal=True, alignment="bottom_right", window=(40, None), s_q=96, s_kv=160),
                 id="causal_br-window40-sq96_skv160"),
    pytest.param(dict(window=(20, 5), alignment="bottom_right", s_q=64, s_kv=192), id="window_br-sq64_skv192"),
    pytest.param(dict(window=(24, 0), layout="packed", h_q=4, h_kv=4, dtype=torch.float16),
                 id="window24_0-packed-fp16"),
    pytest.param(dict(window=(10, 10), layout="bshd", h_q=8, h_kv=1), id="window10_10-bshd-mqa"),
]


@pytest.mark.parametrize("case", WINDOWS)
def test_sliding_windows(case, seed):
    run_case(seed=seed, **case)


ROWS_WITHOUT_KEYS = [
    pytest.param(dict(causal=True, alignment="bottom_right", s_q=256, s_kv=128), id="causal_br-sq256_skv128"),
    pytest.param(dict(causal=True, alignment="bottom_right", s_q=200, s_kv=72, layout="bshd"),
                 id="causal_br-sq200_skv72-bshd"),
    pytest.param(dict(causal=True, alignment="bottom_right", s_q=130, s_kv=1, h_q=8, h_kv=2),
                 id="causal_br-sq130_skv1-gqa"),
    pytest.param(dict(window=(16, None), s_q=256, s_kv=64), id="window16-tl-sq256_skv64-trailing_rows_empty"),
    pytest.param(dict(window=(None, 0), alignment="bottom_right", s_q=192, s_kv=64, dtype=torch.float16),
                 id="right0-br-sq192_skv64-fp16"),
    pytest.param(dict(window=(None, 5), alignment="bottom_right", s_q=300, s_kv=129),
                 id="right5-br-sq300_skv129-more_rows_than_keys_remain"),
    pytest.param(dict(causal=True, alignment="bottom_right", s_q=133, s_kv=128, b=1, h_q=1, h_kv=1),
                 id="causal_br-sq133_skv128-lse_rows_offset_by_5-misaligned_slice"),
]


@pytest.mark.parametrize("case", ROWS_WITHOUT_KEYS)
def test_rows_that_see_no_key_get_zeros_and_minus_inf(case, seed):
    run_case(seed=seed, **case)


TINY = [
    pytest.param(dict(s_q=1, s_kv=1), id="sq1_skv1-gqa"),
    pytest.param(dict(s_q=1, s_kv=1, causal=True, alignment="bottom_right"), id="sq1_skv1-causal_br-gqa"),
    pytest.param(dict(s_q=1, s_kv=1, h_q=4, h_kv=4, window=(0, 0)), id="sq1_skv1-window"),
    pytest.param(dict(s_q=1, s_kv=1, h_q=8, h_kv=1, layout="bshd"), id="sq1_skv1-mqa-bshd"),
    pytest.param(dict(s_q=1, s_kv=37, causal=True, alignment="bottom_right"), id="sq1_skv37-causal_br"),
    pytest.param(dict(s_q=3, s_kv=5), id="sq3_skv5"),
    pytest.param(dict(s_q=2, s_kv=2, causal=True, b=1, h_q=1, h_kv=1), id="sq2_skv2-causal-b1h1"),
]


@pytest.mark.parametrize("case", TINY)
def test_tiny_extents(case, seed):
    run_case(seed=seed, **case)


SOFTCAP = [
    pytest.param(dict(softcap=5.0), id="softcap5"),
    pytest.param(dict(softcap=3.0, causal=True), id="softcap3-causal"),
    pytest.param(dict(softcap=10.0, causal=True, window=(31, None)), id="softcap10-causal-window31-gemma2"),
    pytest.param(dict(softcap=4.0, causal=True, alignment="bottom_right", s_q=64, s_kv=192),
                 id="softcap4-causal_br-sq64_skv192"),
    pytest.param(dict(softcap=6.0, causal=True, alignment="bottom_right", s_q=192, s_kv=64),
                 id="softcap6-causal_br-sq192_skv64-rows_without_keys"),
    pytest.param(dict(softcap=8.0, seqlens=([128, 70], [128, 70])), id="softcap8-padding"),
    pytest.param(dict(softcap=2.0, layout="packed", h_q=4, h_kv=4, dtype=torch.float16), id="softcap2-packed-fp16"),
]


@pytest.mark.parametrize("case", SOFTCAP)
def test_softcap(case, seed):
    """Caps of 2 to 10 against scores of unit spread: tanh bends many of them (Gemma 2 uses 50 on
    larger logits)."""
    run_case(seed=seed, **case)


ALIBI = [
    pytest.param(dict(alibi=True), id="alibi-bidirectional"),
    pytest.param(dict(alibi=True, causal=True), id="alibi-causal-bloom"),
    pytest.param(dict(alibi=True, causal=True, alignment="bottom_right", s_q=64, s_kv=192),
                 id="alibi-causal_br-sq64_skv192-flash_attn"),
    pytest.param(dict(alibi=True, causal=True, alignment="bottom_right", s_q=192, s_kv=64),
                 id="alibi-causal_br-sq192_skv64-rows_cut"),
    pytest.param(dict(alibi=True, window=(20, 5), alignment="bottom_right", s_q=64, s_kv=192),
                 id="alibi-window_br-keys_cut"),
    pytest.param(dict(alibi=True, causal=True, seqlens=([100, 37], [128, 90])), id="alibi-causal-padding"),
    pytest.param(dict(alibi=True, softcap=5.0, causal=True), id="alibi-softcap5-causal"),
    pytest.param(dict(alibi=True, layout="packed", h_q=4, h_kv=4, dtype=torch.float16, causal=True),
                 id="alibi-packed-fp16"),
    pytest.param(dict(alibi=True, sinks=True, causal=True), id="alibi-sinks-causal"),
]


@pytest.mark.parametrize("case", ALIBI)
def test_alibi(case, seed):
    """ALiBi slopes as the score modifier stridedfa builds: -slope_h * |i + off - j| in the caller's
    indices whatever rows and keys the plan cuts off."""
    run_case(seed=seed, **case)


def test_alibi_with_padding_bottom_right_is_refused_before_launch(seed):
    """A distance offset per sequence gave wrong numbers (GPU run 30): refused, nothing written."""
    with pytest.raises(stridedfa.UnsupportedError, match="ALiBi with bottom-right alignment and padding"):
        run_case(seed=seed, alibi=True, causal=True, alignment="bottom_right", seqlens=([100, 37], [128, 90]))


SINKS = [
    pytest.param(dict(sinks=True), id="sinks"),
    pytest.param(dict(sinks=True, causal=True, h_q=8, h_kv=2), id="sinks-causal-gqa"),
    pytest.param(dict(sinks=True, causal=True, window=(63, None)), id="sinks-causal-window63-gpt_oss"),
    pytest.param(dict(sinks=True, seqlens=([128, 50], [128, 50])), id="sinks-padding"),
    pytest.param(dict(sinks=True, layout="bshd", dtype=torch.float16, s_q=64, s_kv=192), id="sinks-bshd-fp16-cross"),
    pytest.param(dict(sinks=True, causal=True, alignment="bottom_right", window=(31, None), s_q=4, s_kv=256),
                 id="sinks-decode_window-leading_keys_cut"),
]


@pytest.mark.parametrize("case", SINKS)
def test_attention_sinks_and_their_gradient(case, seed):
    run_case(seed=seed, **case)


def test_sinks_with_rows_that_see_no_key_are_refused_untouched(seed):
    q, k, v = (torch.randn(1, 2, s, 64, device="cuda", dtype=torch.bfloat16) for s in (128, 64, 64))
    out = torch.full((1, 2, 128, 64), float("nan"), device="cuda", dtype=torch.bfloat16)
    with pytest.raises(stridedfa.UnsupportedError, match="sinks"):
        stridedfa.sdpa_forward(q, k, v, out, causal=True, causal_alignment="bottom_right",
                               sinks=torch.zeros(2, device="cuda"))
    torch.cuda.synchronize()
    assert torch.isnan(out).all()


PADDING = [
    pytest.param(dict(s_q=128, s_kv=128, seqlens=([128, 77], [128, 77])), id="self-77"),
    pytest.param(dict(s_q=64, s_kv=192, seqlens=([64, 30], [192, 100])), id="cross-30_100"),
    pytest.param(dict(s_q=128, s_kv=128, seqlens=([100, 50], [100, 50]), causal=True), id="causal-tl"),
    pytest.param(dict(s_q=128, s_kv=128, seqlens=([20, 128], [120, 128]), causal=True,
                      alignment="bottom_right"), id="causal-br-per_sequence"),
    pytest.param(dict(s_q=128, s_kv=128, seqlens=([128, 90], [128, 90]), window=(15, 0)), id="window15"),
    pytest.param(dict(s_q=128, s_kv=128, seqlens=([100, 128], [40, 128]), causal=True, alignment="bottom_right"),
                 id="causal-br-rows_without_keys_inside_a_sequence"),
    pytest.param(dict(s_q=128, s_kv=128, seqlens=([128, 70], [128, 70]), layout="packed", h_q=4, h_kv=4),
                 id="packed"),
    pytest.param(dict(s_q=128, s_kv=96, seqlens=(None, [96, 41])), id="keys_only"),
    pytest.param(dict(s_q=64, s_kv=64, seqlens=([64, 9], None), causal=True), id="queries_only"),
    pytest.param(dict(s_q=96, s_kv=96, seqlens=([96, 33], [96, 33]), layout="bshd", h_q=8, h_kv=2,
                      dtype=torch.float16), id="bshd-gqa-fp16"),
]


@pytest.mark.parametrize("case", PADDING)
def test_padding_lengths(case, seed):
    """Padding rows: out, lse and grad_q there, and dk/dv of padded keys, have the documented values
    (checked against the reference, which defines them as 0 / -inf / 0)."""
    run_case(seed=seed, **case)


def test_padded_keys_do_not_change_the_result(seed):
    """Overwrite the padded keys and values with large garbage: nothing may change. (cuDNN
    multiplies padded values by a weight of exactly 0, so they must be finite: NaN or inf there
    would propagate, as the README says.)"""
    kw = dict(s_q=128, s_kv=128, seqlens=([128, 60], [128, 60]))
    base = run_case(seed=seed, **kw)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = random_qkv(2, 4, 2, 128, 128, 64, torch.bfloat16, "bhsd", gen)
    garbage = torch.Generator(device="cuda").manual_seed(seed + 1)
    k[1, :, 60:] = 1e4 * torch.randn(k[1, :, 60:].shape, generator=garbage, device="cuda").to(k.dtype)
    v[1, :, 60:] = 1e4 * torch.randn(v[1, :, 60:].shape, generator=garbage, device="cuda").to(v.dtype)
    out = torch.empty(2, 4, 128, 64, device="cuda", dtype=torch.bfloat16)
    lengths = dict(seqlens_q=torch.tensor([128, 60], device="cuda", dtype=torch.int32),
                   seqlens_kv=torch.tensor([128, 60], device="cuda", dtype=torch.int32))
    stridedfa.sdpa_forward(q, k, v, out, **lengths)
    assert torch.equal(out, base[0]), "padded keys changed the output"


def test_deterministic_backward_is_bitwise_reproducible(seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = random_qkv(2, 8, 2, 512, 512, 128, torch.bfloat16, "bhsd", gen)
    out = torch.empty_like(q)
    lse = torch.empty(2, 8, 512, device="cuda")
    stridedfa.sdpa_forward(q, k, v, out, lse=lse, causal=True)
    grad_out = torch.randn(out.shape, generator=gen, device="cuda").to(out.dtype)
    first = None
    for _ in range(100):
        grads = tuple(torch.empty_like(t) for t in (q, k, v))
        stridedfa.sdpa_backward(q, k, v, out, grad_out, lse, *grads, causal=True, deterministic=True)
        if first is None:
            first = grads
        else:
            for a, b_, name in zip(first, grads, ("grad_q", "grad_k", "grad_v")):
                assert torch.equal(a, b_), f"{name} differs between deterministic backward calls"
    run_case(seed=seed, causal=True, deterministic=True, h_q=8, h_kv=2)  # and it is right


def test_each_window_builds_its_own_graph(seed):
    run_case(seed=seed, window=(8, 8))
    before = stridedfa.cache_info()["builds"]
    run_case(seed=seed, window=(8, 8))
    assert stridedfa.cache_info()["builds"] == before, "an equal call rebuilt its graphs"
    run_case(seed=seed, window=(9, 8))
    assert stridedfa.cache_info()["builds"] == before + 2, "a new window must get new graphs (fwd, bwd)"
