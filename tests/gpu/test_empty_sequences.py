"""Sequences of length 0 (issue 30): padding lengths of 0 on either side or both, empty documents in
cu_seqlens, paged caches of length 0, through every variant. Serving engines pad a batch to a
captured CUDA-graph size with empty sequences, and packed-document loaders emit empty documents.

The documented values (docs/pages/options.md): a row that sees no key gets out = 0, lse = -inf (its
head's sink where sinks are given), dq = 0; keys no row sees get dk = dv = 0; nothing is NaN, and
the shared gradients (sinks', bias') take nothing from empty rows. Every output is poisoned with
NaN first; the rows that see keys are compared with the float64 reference.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import stridedfa  # noqa: E402
import stridedfa.torch as st  # noqa: E402
from stridedfa import reference  # noqa: E402

pytestmark = pytest.mark.gpu


def _np(t):
    return t.detach().float().cpu().numpy().astype(np.float64)


def _nan(shape, dtype):
    return torch.full(shape, float("nan"), device="cuda", dtype=dtype)


def _close(got, want, what, rel=3e-2, atol=1e-2):
    want = torch.as_tensor(want, device="cuda").float()
    got = got.float()
    assert not torch.isnan(got).any(), f"{what}: {int(torch.isnan(got).sum())} elements NaN"
    scale = max(want[torch.isfinite(want)].abs().max().item() if torch.isfinite(want).any() else 0.0, 1e-3)
    finite = torch.isfinite(want)
    assert torch.equal(torch.isinf(got) & (got < 0), torch.isinf(want) & (want < 0)), f"{what}: -inf where not expected"
    err = (got[finite] - want[finite]).abs().max().item() if finite.any() else 0.0
    assert err <= rel * scale + atol, f"{what}: max err {err:.3e} (scale {scale:.3e})"


def dense_case(*, seqlens_q, seqlens_kv, b=2, h_q=2, h_kv=1, s=40, d=64, causal=False, alignment="top_left",
               window=None, softcap=None, sinks=False, alibi=False, bias=None, dropout=0.0, deterministic=False,
               seed=0, dtype=torch.bfloat16):
    """q bshd, k and v views of one (b, s, 2, h_kv, d) buffer; forward then backward through the
    generic entry points, checked against the reference (not the dropped weights' values)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, s, h_q, d, generator=gen, device="cuda").to(dtype).transpose(1, 2)
    kv = torch.randn(b, s, 2, h_kv, d, generator=gen, device="cuda").to(dtype)
    k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
    lengths = {}
    if seqlens_q is not None:
        lengths["seqlens_q"] = torch.tensor(seqlens_q, device="cuda", dtype=torch.int32)
    if seqlens_kv is not None:
        lengths["seqlens_kv"] = torch.tensor(seqlens_kv, device="cuda", dtype=torch.int32)
    options = dict(causal=causal, causal_alignment=alignment, window=window, softcap=softcap)
    extra = {}
    if sinks:
        extra["sinks"] = 2.0 * torch.randn(h_q, generator=gen, device="cuda")
    if alibi:
        extra["alibi_slopes"] = 2.0 ** (-8.0 * torch.arange(1, h_q + 1, device="cuda") / h_q)
    if bias == "key_padding":  # -inf past each sequence's keys, as a padding mask given as a bias
        n_kv = seqlens_kv if seqlens_kv is not None else [s] * b
        extra["bias"] = torch.zeros(b, 1, 1, s, device="cuda", dtype=dtype)
        for i, n in enumerate(n_kv):
            extra["bias"][i, ..., n:] = float("-inf")
    elif bias == "trained":  # a row per query, with its gradient
        extra["bias"] = torch.randn(b, 1, s, s, generator=gen, device="cuda").to(dtype)
    if dropout:
        extra["dropout_p"] = dropout
        extra["rng_state"] = torch.tensor([1234, 0], device="cuda", dtype=torch.int64)
    out, lse = _nan((b, h_q, s, d), dtype), _nan((b, h_q, s), torch.float32)
    stridedfa.sdpa_forward(q, k, v, out, lse=lse, **options, **lengths, **extra)
    grad_out = torch.randn(out.shape, generator=gen, device="cuda").to(dtype)
    dq, dk, dv = (_nan(t.shape, dtype) for t in (q, k, v))
    grads = {}
    if sinks:
        grads["grad_sinks"] = _nan((h_q,), torch.float32)
    if bias == "trained":
        grads["grad_bias"] = _nan(extra["bias"].shape, dtype)
    stridedfa.sdpa_backward(q, k, v, out, grad_out, lse, dq, dk, dv, deterministic=deterministic, **options,
                            **lengths, **extra, **grads)
    torch.cuda.synchronize()

    n_q = np.array(seqlens_q if seqlens_q is not None else [s] * b)
    n_kv = np.array(seqlens_kv if seqlens_kv is not None else [s] * b)
    ref_extra = {name: _np(x) for name, x in extra.items() if name in ("sinks", "alibi_slopes", "bias")}
    seen = reference.visible_mask(s, s, causal=causal, causal_alignment=alignment, window=window, b=b,
                                  seqlens_q=n_q, seqlens_kv=n_kv)[:, 0]  # (b, s_q, s_kv)
    if "bias" in ref_extra:
        seen = seen & np.isfinite(ref_extra["bias"][:, 0]) if bias == "key_padding" else seen
    rows = torch.from_numpy(seen.any(axis=2).copy()).cuda()[:, None, :].expand(b, h_q, s)
    keys = torch.from_numpy(seen.any(axis=1).copy()).cuda()[:, None, :].expand(b, h_kv, s)

    # The documented values, exactly
    assert (out[~rows] == 0).all(), "out: rows that see no key must be 0"
    assert (dq[~rows] == 0).all(), "grad_q: rows that see no key must be 0"
    assert (dk[~keys] == 0).all() and (dv[~keys] == 0).all(), "grad_k / grad_v: unseen keys must get exactly 0"
    real_rows = torch.from_numpy(np.arange(s)[None, :] < n_q[:, None]).cuda()[:, None, :].expand(b, h_q, s)
    if sinks:  # a real row without keys: its head's sink; a padded row: -inf
        want = torch.where(real_rows, extra["sinks"][None, :, None].expand(b, h_q, s), float("-inf"))
        assert torch.equal(lse[~rows], want[~rows]), "lse: rows without keys must hold their head's sink"
    else:
        assert torch.isneginf(lse[~rows]).all(), "lse: rows that see no key must be -inf"
    for name, t in (("out", out), ("grad_q", dq), ("grad_k", dk), ("grad_v", dv), *grads.items()):
        assert not torch.isnan(t).any(), f"{name}: {int(torch.isnan(t).sum())} elements NaN"
    if dropout:  # the dropped weights are cuDNN's: no reference for the rows that see keys
        return
    ref_out, ref_lse = reference.sdpa_forward(_np(q), _np(k), _np(v), dtype=np.float64, **options,
                                              seqlens_q=n_q, seqlens_kv=n_kv, **ref_extra)
    ref_dq, ref_dk, ref_dv, ref_grads = reference.sdpa_backward(
        _np(q), _np(k), _np(v), _np(grad_out), dtype=np.float64, **options, seqlens_q=n_q, seqlens_kv=n_kv,
        **ref_extra, return_extra=True)
    _close(out, ref_out, "out")
    _close(lse, ref_lse, "lse", rel=2e-3, atol=2e-3)
    for name, got, want in (("grad_q", dq, ref_dq), ("grad_k", dk, ref_dk), ("grad_v", dv, ref_dv)):
        _close(got, want, name)
    if sinks:
        _close(grads["grad_sinks"], ref_grads["dsinks"], "grad_sinks")
    if bias == "trained":
        _close(grads["grad_bias"], ref_grads["dbias"], "grad_bias")


LENGTHS = [
    pytest.param(([2, 3], [0, 5]), id="kv0"),
    pytest.param(([0, 3], [4, 5]), id="q0"),
    pytest.param(([0, 0], [0, 0]), id="all_zero"),
    pytest.param((None, [0, 37]), id="kv0-keys_only"),
    pytest.param(([40, 0], None), id="q0-queries_only"),
]

VARIANTS = [
    pytest.param({}, id="plain"),
    pytest.param(dict(bias="key_padding"), id="key_padding_bias"),
    pytest.param(dict(bias="trained"), id="bias_with_grad"),
    pytest.param(dict(sinks=True), id="sinks"),
    pytest.param(dict(alibi=True, causal=True), id="alibi-causal"),
    pytest.param(dict(softcap=5.0), id="softcap"),
    pytest.param(dict(window=(7, 0), causal=True), id="window"),
    pytest.param(dict(dropout=0.2), id="dropout"),
    pytest.param(dict(deterministic=True), id="deterministic"),
    pytest.param(dict(causal=True, alignment="bottom_right"), id="causal_br"),
]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("lengths", LENGTHS)
def test_padding_lengths_of_zero(lengths, variant, seed):
    if variant.get("alibi") and variant.get("alignment") == "bottom_right":
        pytest.skip("ALiBi bottom-right with padding lengths is refused by name")
    dense_case(seqlens_q=lengths[0], seqlens_kv=lengths[1], seed=seed, **variant)


def test_the_reported_case_sinks_alibi_deterministic_with_padded_keys_past_a_tile(seed):
    """Issue 30's second report: b = 3, one head, 284 tokens, packed q/k/v, causal top-left,
    seqlens_kv [0, 194, 201] with sinks, ALiBi and the deterministic backward: dV was NaN in batch 0
    and dK / dV at padded keys past key 256 (a tile cuDNN never visits) not 0."""
    dense_case(seqlens_q=None, seqlens_kv=[0, 194, 201], b=3, h_q=1, h_kv=1, s=284, causal=True, sinks=True,
               alibi=True, deterministic=True, seed=seed)


@pytest.mark.parametrize("causal", [False, True])
def test_empty_documents_in_cu_seqlens(causal, seed):
    """Variable length: an empty middle document (no queries, no keys), a document with queries but
    no keys, and one with keys but no queries; forward and backward through stridedfa.torch."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    cu_q, cu_kv = [0, 3, 3, 9, 9, 16], [0, 4, 4, 4, 11, 20]
    h, d = 2, 64
    q = torch.randn(cu_q[-1], h, d, generator=gen, device="cuda").bfloat16().requires_grad_()
    k = torch.randn(cu_kv[-1], h, d, generator=gen, device="cuda").bfloat16().requires_grad_()
    v = torch.randn(cu_kv[-1], h, d, generator=gen, device="cuda").bfloat16().requires_grad_()
    cq, ck = (torch.tensor(c, device="cuda", dtype=torch.int32) for c in (cu_q, cu_kv))
    out, lse = st.varlen_attention(q, k, v, cq, ck, causal=causal, causal_alignment="bottom_right", return_lse=True)
    grad_out = torch.randn(out.shape, generator=gen, device="cuda").bfloat16()
    out.backward(grad_out)
    for name, t in (("out", out), ("grad_q", q.grad), ("grad_k", k.grad), ("grad_v", v.grad)):
        assert not torch.isnan(t).any(), f"{name}: NaN"
    for i in range(len(cu_q) - 1):
        rows, keys = slice(cu_q[i], cu_q[i + 1]), slice(cu_kv[i], cu_kv[i + 1])
        if cu_q[i] == cu_q[i + 1]:
            assert (k.grad[keys] == 0).all() and (v.grad[keys] == 0).all(), f"document {i}: keys without queries"
            continue
        if cu_kv[i] == cu_kv[i + 1]:
            assert (out[rows] == 0).all() and torch.isneginf(lse[:, rows]).all() and (q.grad[rows] == 0).all(), \
                f"document {i}: queries without keys"
            continue
        one = [t[sl].detach().transpose(0, 1)[None] for t, sl in ((q, rows), (k, keys), (v, keys))]
        ref_out, ref_lse = reference.sdpa_forward(*(_np(t) for t in one), causal=causal,
                                                  causal_alignment="bottom_right", dtype=np.float64)
        _close(out[rows].transpose(0, 1)[None], ref_out, f"document {i} out")
        _close(lse[:, rows][None], ref_lse, f"document {i} lse", rel=2e-3, atol=2e-3)


def test_a_paged_cache_of_length_zero(seed):
    """Serving: a batch padded with sequences whose cache is empty (CUDA-graph bucket padding)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    b, h, d, block, blocks = 4, 2, 128, 16, 12
    q = torch.randn(b, h, 1, d, generator=gen, device="cuda").bfloat16()
    k_cache = torch.randn(blocks, h, block, d, generator=gen, device="cuda").bfloat16()
    v_cache = torch.randn(blocks, h, block, d, generator=gen, device="cuda").bfloat16()
    table = torch.arange(b * 3, device="cuda", dtype=torch.int32).reshape(b, 3)
    lengths = torch.tensor([0, 5, 0, 33], device="cuda", dtype=torch.int32)
    out, lse = _nan((b, h, 1, d), torch.bfloat16), _nan((b, h, 1), torch.float32)
    stridedfa.sdpa_forward(q, k_cache, v_cache, out, lse=lse, block_table=table, seqlens_kv=lengths, causal=True,
                           causal_alignment="bottom_right")
    torch.cuda.synchronize()
    for i, n in enumerate(lengths.tolist()):
        if n == 0:
            assert (out[i] == 0).all() and torch.isneginf(lse[i]).all(), f"sequence {i}: empty cache"
            continue
        keys = torch.cat([k_cache[j] for j in table[i].tolist()], dim=1)[:, :n][None]
        values = torch.cat([v_cache[j] for j in table[i].tolist()], dim=1)[:, :n][None]
        ref_out, ref_lse = reference.sdpa_forward(_np(q[i:i + 1]), _np(keys), _np(values), dtype=np.float64)
        _close(out[i:i + 1], ref_out, f"sequence {i} out")
        _close(lse[i:i + 1], ref_lse, f"sequence {i} lse", rel=2e-3, atol=2e-3)


def test_the_flash_attn_interface_with_empty_sequences(seed):
    """flash_attn_varlen_func with an empty document and flash_attn_with_kvcache with an empty cache:
    zeros, as FlashAttention gives."""
    from stridedfa.flash_attn_interface import flash_attn_varlen_func, flash_attn_with_kvcache

    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(7, 2, 64, generator=gen, device="cuda").bfloat16()
    k = torch.randn(9, 2, 64, generator=gen, device="cuda").bfloat16()
    v = torch.randn(9, 2, 64, generator=gen, device="cuda").bfloat16()
    cu_q = torch.tensor([0, 3, 7], device="cuda", dtype=torch.int32)
    cu_k = torch.tensor([0, 0, 9], device="cuda", dtype=torch.int32)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, 9, causal=True)
    assert not torch.isnan(out).any() and (out[:3] == 0).all()
    cache_k = torch.randn(2, 32, 2, 64, generator=gen, device="cuda").bfloat16()
    cache_v = torch.randn(2, 32, 2, 64, generator=gen, device="cuda").bfloat16()
    out = flash_attn_with_kvcache(q[:2, None], cache_k, cache_v,
                                  cache_seqlens=torch.tensor([0, 7], device="cuda", dtype=torch.int32), causal=True)
    assert not torch.isnan(out).any() and (out[0] == 0).all()
