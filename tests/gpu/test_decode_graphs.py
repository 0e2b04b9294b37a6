"""Decoding by heads (issue 33 item 1): a decoding step -- a few queries against a cache whose length
changes every step -- runs as a ragged problem of one sequence per (batch entry, key/value head)
whose extents are bucketed, so a generation loop builds one graph per doubling of its cache instead
of one per step. Outputs poisoned with NaN, compared with the float64 reference on fresh data, for
every cache layout a caller has (transformers' head-major dynamic cache, a token-major cache, a
slice of a static cache), grouped, multi-head and multi-query heads, and each mask decoding uses.
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


@pytest.fixture(autouse=True)
def bucketed():
    """Decode graphs bucketed (the default; set in case the environment chose exact)."""
    before = stridedfa._core._decode_graphs()
    stridedfa._core._decode_graphs(True)
    yield
    stridedfa._core._decode_graphs(before)


def _np(t):
    return t.detach().float().cpu().numpy().astype(np.float64)


def _check(out, lse, ref_out, ref_lse):
    out, lse = out.float(), lse.float()
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    ref_out, ref_lse = (torch.from_numpy(x).cuda().float() for x in (ref_out, ref_lse))
    assert (out - ref_out).abs().max().item() <= 2e-2 * ref_out.abs().max().item() + 5e-3
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse[finite] - ref_lse[finite]).abs().max().item() <= 2e-3 * max(1.0, ref_lse[finite].abs().max().item())


def _cache(gen, b, h_kv, length, d, layout):
    if layout == "head_major":
        return torch.randn(b, h_kv, length, d, generator=gen, device="cuda").bfloat16()
    if layout == "token_major":
        return torch.randn(b, length, h_kv, d, generator=gen, device="cuda").bfloat16().transpose(1, 2)
    full = torch.randn(b, h_kv, length + 300, d, generator=gen, device="cuda").bfloat16()  # a static cache
    return full[:, :, :length]


MASKS = [
    pytest.param({}, id="no_mask"),
    pytest.param(dict(causal=True, causal_alignment="bottom_right"), id="causal_br"),
    pytest.param(dict(causal=True), id="causal_tl"),
    pytest.param(dict(causal=True, causal_alignment="bottom_right", window=(63, None)), id="window64"),
    # A sliding-window model inside its window (mistral's 1024 over a shorter cache): no key cut.
    pytest.param(dict(causal=True, causal_alignment="bottom_right", window=(1023, None)), id="window_wider"),
    pytest.param(dict(softcap=30.0, causal=True, causal_alignment="bottom_right"), id="softcap"),
]


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("layout", ["head_major", "token_major", "static_slice"])
@pytest.mark.parametrize("heads", [(8, 2), (4, 4), (8, 1)], ids=["gqa", "mha", "mqa"])
@pytest.mark.parametrize("s_q", [1, 5])
def test_a_decoding_step_matches_the_reference(mask, layout, heads, s_q, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    b, (h_q, h_kv), length, d = 3, heads, 333, 64
    q = torch.randn(b, h_q, s_q, d, generator=gen, device="cuda").bfloat16()
    k, v = (_cache(gen, b, h_kv, length, d, layout) for _ in range(2))
    out = torch.full((b, h_q, s_q, d), float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((b, h_q, s_q), float("nan"), device="cuda")
    stridedfa.sdpa_forward(q, k, v, out, lse=lse, **mask)
    ref_out, ref_lse = reference.sdpa_forward(_np(q), _np(k), _np(v), dtype=np.float64, **mask)
    _check(out, lse, ref_out, ref_lse)


def test_cache_lengths_on_the_device_with_an_empty_sequence(seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    b, h_q, h_kv, capacity, d = 3, 8, 2, 512, 64
    q = torch.randn(b, h_q, 1, d, generator=gen, device="cuda").bfloat16()
    k, v = (_cache(gen, b, h_kv, capacity, d, "static_slice") for _ in range(2))
    lengths = [300, 0, 17]
    out = torch.full((b, h_q, 1, d), float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((b, h_q, 1), float("nan"), device="cuda")
    stridedfa.sdpa_forward(q, k, v, out, lse=lse, causal=True, causal_alignment="bottom_right",
                           seqlens_kv=torch.tensor(lengths, device="cuda", dtype=torch.int32))
    ref_out, ref_lse = reference.sdpa_forward(_np(q), _np(k), _np(v), dtype=np.float64, causal=True,
                                              causal_alignment="bottom_right", seqlens_q=np.ones(b, dtype=np.int64),
                                              seqlens_kv=np.array(lengths))
    _check(out, lse, ref_out, ref_lse)
    assert torch.all(out[1] == 0) and torch.all(lse[1] == -torch.inf)


@pytest.mark.parametrize("layout", ["head_major", "token_major"])
def test_a_generation_loop_builds_one_graph_per_doubling(layout, seed):
    """300 steps of a growing cache (100 -> 399 keys), as transformers' dynamic cache calls it:
    graphs for 128, 256 and 512 keys, each output right."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    b, h_q, h_kv, d = 2, 8, 2, 64
    k_all, v_all = (_cache(gen, b, h_kv, 400, d, layout) for _ in range(2))
    before = stridedfa.cache_info()["builds"]
    worst = 0.0
    for length in range(100, 400):
        q = torch.randn(b, h_q, 1, d, generator=gen, device="cuda").bfloat16()
        k, v = k_all[:, :, :length], v_all[:, :, :length]
        if layout == "head_major":
            k, v = k.contiguous(), v.contiguous()  # a fresh tensor each step, as torch.cat makes it
        out = st.attention(q, k, v, causal=True, causal_alignment="bottom_right")
        if length % 50 == 0:
            ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
            worst = max(worst, (out.float() - ref).abs().max().item())
    assert stridedfa.cache_info()["builds"] - before <= 3
    assert worst < 2e-2


def test_a_paged_decoding_loop_with_a_growing_table(seed):
    """A caller passing each step only the blocks its cache fills: the table is declared a power
    of two wide (block 0 past the caller's columns), so 100 steps over 20 -> 119 keys of 8-key
    blocks (3 -> 15 blocks) build the graphs of 8 and 16 blocks; each output right."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    b, h_q, h_kv, d, block, num_blocks = 2, 8, 2, 64, 8, 40
    k_cache = torch.randn(num_blocks, h_kv, block, d, generator=gen, device="cuda").bfloat16()
    v_cache = torch.randn(num_blocks, h_kv, block, d, generator=gen, device="cuda").bfloat16()
    order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))
    full_table = order[:2 * 16].view(b, 16).to(device="cuda", dtype=torch.int32)
    before = stridedfa.cache_info()["builds"]
    for length in range(20, 120):
        blocks = -(-length // block)
        q = torch.randn(b, h_q, 1, d, generator=gen, device="cuda").bfloat16()
        out = torch.full((b, h_q, 1, d), float("nan"), device="cuda", dtype=torch.bfloat16)
        lse = torch.full((b, h_q, 1), float("nan"), device="cuda")
        lengths = torch.tensor([length, length - 7], device="cuda", dtype=torch.int32)
        stridedfa.sdpa_forward(q, k_cache, v_cache, out, lse=lse, block_table=full_table[:, :blocks].contiguous(),
                               seqlens_kv=lengths, causal=True, causal_alignment="bottom_right")
        if length % 33 == 0:
            for i, n in enumerate(lengths.tolist()):
                ids = full_table[i, :blocks].tolist()
                keys = torch.cat([k_cache[j] for j in ids], dim=1)[:, :n][None]
                values = torch.cat([v_cache[j] for j in ids], dim=1)[:, :n][None]
                ref_out, ref_lse = reference.sdpa_forward(_np(q[i:i + 1]), _np(keys), _np(values), dtype=np.float64)
                _check(out[i:i + 1], lse[i:i + 1], ref_out, ref_lse)
    assert stridedfa.cache_info()["builds"] - before <= 2


def test_a_static_cache_whose_heads_lie_far_beyond_the_declared_extent(seed):
    """One batch entry, 8 key/value heads of a 4096-token static cache with 200 tokens filled: the
    offsets of the later heads reach far past 256 keys x 8 sequences, which the declared tensors
    must cover."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    h_q, h_kv, d = 32, 8, 128
    q = torch.randn(1, h_q, 1, d, generator=gen, device="cuda").bfloat16()
    k_cache, v_cache = (torch.randn(1, h_kv, 4096, d, generator=gen, device="cuda").bfloat16() for _ in range(2))
    for length in (200, 201, 255):
        k, v = k_cache[:, :, :length], v_cache[:, :, :length]
        out = torch.full((1, h_q, 1, d), float("nan"), device="cuda", dtype=torch.bfloat16)
        lse = torch.full((1, h_q, 1), float("nan"), device="cuda")
        stridedfa.sdpa_forward(q, k, v, out, lse=lse, causal=True, causal_alignment="bottom_right")
        ref_out, ref_lse = reference.sdpa_forward(_np(q), _np(k), _np(v), dtype=np.float64)
        _check(out, lse, ref_out, ref_lse)


def test_a_variable_length_decoding_loop_builds_one_graph_per_doubling(seed):
    """flash_attn_varlen_func's decoding form: 3 sequences of one query against packed caches of
    L, L + 50 and L + 9 keys, L = 100 -> 349 with max_seqlen_kv promised: the keys' extent a power
    of two, the totals stepping with it (graphs of 128, 256 and 512 keys); each output right."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    h_q, h_kv, d = 8, 2, 64
    before = stridedfa.cache_info()["builds"]
    for length in range(100, 350):
        lengths = [length, length + 50, length + 9]
        cu_kv = torch.tensor([0, *np.cumsum(lengths)], device="cuda", dtype=torch.int32)
        cu_q = torch.arange(4, device="cuda", dtype=torch.int32)
        q = torch.randn(3, h_q, d, generator=gen, device="cuda").bfloat16()
        k, v = (torch.randn(sum(lengths), h_kv, d, generator=gen, device="cuda").bfloat16() for _ in range(2))
        out, lse = st.varlen_attention(q, k, v, cu_q, cu_kv, 1, max(lengths), causal=True,
                                       causal_alignment="bottom_right", return_lse=True)
        if length % 83 == 0:
            for i, n in enumerate(lengths):
                keys, values = (x[cu_kv[i]:cu_kv[i] + n].transpose(0, 1)[None] for x in (k, v))
                ref_out, ref_lse = reference.sdpa_forward(_np(q[i:i + 1].transpose(0, 1)[None]), _np(keys),
                                                          _np(values), dtype=np.float64)
                _check(out[i:i + 1].transpose(0, 1)[None], lse[:, i:i + 1][None], ref_out, ref_lse)
    assert stridedfa.cache_info()["builds"] - before <= 3



@pytest.mark.parametrize("layout", ["head_major", "token_major", "static_slice"])
@pytest.mark.parametrize("heads", [(8, 2), (4, 4)], ids=["gqa", "mha"])
@pytest.mark.parametrize("s_q", [1, 5])
@pytest.mark.parametrize("with_lse", [True, False], ids=["lse", "no_lse"])
def test_sinks_are_folded_in_after_cudnn(layout, heads, s_q, with_lse, seed):
    """gpt-oss's decoding step: the graph by heads runs without sinks (its heads are regrouped) and
    each row's outputs and lse are then corrected by its head's sink; without lse asked for, the
    statistics go to the launch's scratch."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    b, (h_q, h_kv), length, d = 2, heads, 333, 64
    q = torch.randn(b, h_q, s_q, d, generator=gen, device="cuda").bfloat16()
    k, v = (_cache(gen, b, h_kv, length, d, layout) for _ in range(2))
    sinks = 2.0 * torch.randn(h_q, generator=gen, device="cuda")
    out = torch.full((b, h_q, s_q, d), float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((b, h_q, s_q), float("nan"), device="cuda") if with_lse else None
    mask = dict(causal=True, causal_alignment="bottom_right", window=(127, None))
    stridedfa.sdpa_forward(q, k, v, out, lse=lse, sinks=sinks, **mask)
    ref_out, ref_lse = reference.sdpa_forward(_np(q), _np(k), _np(v), dtype=np.float64, sinks=_np(sinks), **mask)
    _check(out, lse if with_lse else torch.from_numpy(ref_lse).cuda().float(), ref_out, ref_lse)


def test_sinks_fold_at_the_edges(seed):
    """One batch entry (offsets rows of batch stride 0), MQA, float16, 16 queries, out and lse
    token-major; two cache lengths of one doubling share one graph (the fold really ran by heads)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    h_q, d, s_q = 8, 64, 16
    sinks = torch.randn(h_q, generator=gen, device="cuda")
    before = stridedfa.cache_info()["builds"]
    for length in (300, 301):
        q = torch.randn(1, h_q, s_q, d, generator=gen, device="cuda").half()
        k, v = (torch.randn(1, 1, length, d, generator=gen, device="cuda").half() for _ in range(2))
        out = torch.full((1, s_q, h_q, d), float("nan"), device="cuda", dtype=torch.float16).transpose(1, 2)
        lse = torch.full((1, s_q, h_q), float("nan"), device="cuda").transpose(1, 2)
        mask = dict(causal=True, causal_alignment="bottom_right")
        stridedfa.sdpa_forward(q, k, v, out, lse=lse, sinks=sinks, **mask)
        ref_out, ref_lse = reference.sdpa_forward(_np(q), _np(k), _np(v), dtype=np.float64, sinks=_np(sinks), **mask)
        _check(out, lse, ref_out, ref_lse)
    assert stridedfa.cache_info()["builds"] - before <= 1


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("lengths", [None, [333, 1, 0]], ids=["full", "lengths"])
def test_one_query_planned_unmasked_matches_the_reference(mask, lengths, seed):
    """The exact plan of a one-query step (STRIDEDFA_DECODE_GRAPHS=exact): a mask that leaves the row
    every key is dropped for cuDNN's fast one-query kernel (call_plan.cpp, one_row_sees_every_key);
    without lengths a window or top-left diagonal first cuts the keys to the ones the row sees. With
    padding lengths (0 and 1 among them) only masks that keep every real key are dropped."""
    if lengths and ("window" in mask or (mask.get("causal") and "causal_alignment" not in mask)):
        pytest.skip("padding lengths with a window or top-left causal: the row's keys are decided per sequence")
    stridedfa._core._decode_graphs(False)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    b, h_q, h_kv, length, d = 3, 8, 2, 333, 64
    q = torch.randn(b, h_q, 1, d, generator=gen, device="cuda").bfloat16()
    k, v = (_cache(gen, b, h_kv, length, d, "head_major") for _ in range(2))
    out = torch.full((b, h_q, 1, d), float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((b, h_q, 1), float("nan"), device="cuda")
    extra = {} if lengths is None else {"seqlens_kv": torch.tensor(lengths, device="cuda", dtype=torch.int32)}
    stridedfa.sdpa_forward(q, k, v, out, lse=lse, **mask, **extra)
    ref_extra = {} if lengths is None else {"seqlens_kv": np.array(lengths)}
    ref_out, ref_lse = reference.sdpa_forward(_np(q), _np(k), _np(v), dtype=np.float64, **mask, **ref_extra)
    _check(out, lse, ref_out, ref_lse)


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("layout", ["head_major", "static_slice"])
@pytest.mark.parametrize("heads", [(8, 2), (4, 4)], ids=["gqa", "mha"])
def test_one_query_through_a_paged_view_matches_the_reference(mask, layout, heads, seed):
    """STRIDEDFA_DECODE_GRAPHS=paged: a head-major cache's one-query step described by heads as
    one-token blocks of a paged problem, its table made at launch (stridedfa_heads_table). Masks
    that would cut the row's keys (top-left, a narrower window) keep the ragged form; the rest run
    unmasked."""
    before = stridedfa._core._decode_heads_paged()
    stridedfa._core._decode_heads_paged(True)
    try:
        gen = torch.Generator(device="cuda").manual_seed(seed)
        b, (h_q, h_kv), length, d = 3, heads, 333, 64
        q = torch.randn(b, h_q, 1, d, generator=gen, device="cuda").bfloat16()
        k, v = (_cache(gen, b, h_kv, length, d, layout) for _ in range(2))
        out = torch.full((b, h_q, 1, d), float("nan"), device="cuda", dtype=torch.bfloat16)
        lse = torch.full((b, h_q, 1), float("nan"), device="cuda")
        stridedfa.sdpa_forward(q, k, v, out, lse=lse, **mask)
        ref_out, ref_lse = reference.sdpa_forward(_np(q), _np(k), _np(v), dtype=np.float64, **mask)
        _check(out, lse, ref_out, ref_lse)
        builds = stridedfa.cache_info()["builds"]
        grown_lengths = range(length + 1, length + 40)
        for grown in grown_lengths:  # a growing cache: a graph per doubling of its rows, not per length
            k2, v2 = (torch.randn(b, h_kv, grown, d, generator=gen, device="cuda").bfloat16() for _ in range(2))
            stridedfa.sdpa_forward(q, k2, v2, out, lse=lse, **mask)
        # The graph declares the cache's rows (b x h_kv x L here) as a power of two, at least 1024.
        doublings = {max(1024, 1 << (b * h_kv * g - 1).bit_length()) for g in grown_lengths}
        assert stridedfa.cache_info()["builds"] - builds <= len(doublings) < len(grown_lengths)
    finally:
        stridedfa._core._decode_heads_paged(before)
