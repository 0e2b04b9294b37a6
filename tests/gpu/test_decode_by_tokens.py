"""Decoding by tokens (call_plan.cpp, plan_decode_by_tokens): a paged step of 2-4 queries per sequence
(2-8 for one sequence)
(speculative decoding, chunked prefill), causal bottom-right or unmasked, run as one one-query
sequence per token with its own key length (cuDNN's fast decoding kernel). Against the fp64 reference
on the gathered cache and against the same call on cuDNN's general kernel (by tokens switched off),
outputs poisoned first; tokens that see no key (a cache shorter than the queries) get out 0, lse -inf."""

from __future__ import annotations

import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import stridedfa  # noqa: E402
from helpers.checks import assert_close  # noqa: E402
from helpers.switches import switched  # noqa: E402
from helpers.torch_ref import torch_reference  # noqa: E402
from stridedfa import _core  # noqa: E402

pytestmark = pytest.mark.gpu

NUM_BLOCKS, BLOCK, BLOCKS, H_Q, H_KV, D = 96, 16, 8, 8, 2, 128


@pytest.fixture
def by_tokens():
    with switched(_core._decode_by_tokens, True):
        yield


def case(b, s_q, lengths, gen):
    """q, out and lse as (b, h, s_q, ...) views of token-major (b, s_q, h, ...) memory, as a
    (b, s, h, d) projection gives them; the cache (blocks, h_kv, block, d), its table random."""
    cache = torch.randn(NUM_BLOCKS, 2, BLOCK, H_KV, D, generator=gen, device="cuda").to(torch.bfloat16)
    k_cache, v_cache = cache[:, 0].transpose(1, 2), cache[:, 1].transpose(1, 2)
    table = torch.randperm(NUM_BLOCKS, generator=torch.Generator().manual_seed(b * 7 + s_q))[:b * BLOCKS]
    table = table.view(b, BLOCKS).to(torch.int32).cuda()
    q = torch.randn(b, s_q, H_Q, D, generator=gen, device="cuda").to(torch.bfloat16).transpose(1, 2)
    out = torch.full((b, s_q, H_Q, D), float("nan"), device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    lse = torch.full((b, s_q, H_Q), float("nan"), device="cuda").transpose(1, 2)
    lengths = [BLOCKS * BLOCK] * b if lengths is None else lengths  # a paged call always says its lengths
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    return q, k_cache, v_cache, table, seqlens, out, lse


def gathered(cache, table):
    b = table.shape[0]
    return cache[table.long()].permute(0, 2, 1, 3, 4).reshape(b, H_KV, BLOCKS * BLOCK, D)


MASKS = [
    pytest.param(dict(causal=True, causal_alignment="bottom_right"), id="causal_br"),
    pytest.param({}, id="no_mask"),
    pytest.param(dict(causal=True, causal_alignment="bottom_right", softcap=20.0), id="softcap"),
]


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("b, s_q", [(6, 2), (6, 4), (1, 8)])
@pytest.mark.parametrize("lengths", [None, [128, 1, 77, 0, 3, 120]], ids=["full", "short"])
def test_a_few_queries_by_tokens_match_the_reference(mask, b, s_q, lengths, by_tokens):
    """Lengths 0, 1 and 3 leave some tokens no key under the causal mask (out 0, lse -inf)."""
    gen = torch.Generator(device="cuda").manual_seed(100 + s_q)
    lengths = None if lengths is None else lengths[:b] if b > 1 else [5]  # one entry: 3 of 8 tokens see no key
    q, k_cache, v_cache, table, seqlens, out, lse = case(b, s_q, lengths, gen)
    builds = stridedfa.cache_info()["builds"]
    stridedfa.sdpa_forward(q, k_cache, v_cache, out, lse=lse, block_table=table, seqlens_kv=seqlens, **mask)
    ref_out, ref_lse = torch_reference(
        q, gathered(k_cache, table), gathered(v_cache, table), causal=mask.get("causal", False),
        alignment="bottom_right", softcap=mask.get("softcap"),
        seqlens_q=torch.full((b,), s_q, dtype=torch.int32, device="cuda"), seqlens_kv=seqlens)
    assert_close(out, ref_out, atol=2.5e-2, name="out")
    assert_close(lse, ref_lse, atol=1e-3, name="lse")
    # The general kernel (by tokens off) agrees; both graphs built once.
    assert stridedfa.cache_info()["builds"] - builds <= 1
    _core._decode_by_tokens(False)
    general = torch.full_like(out, float("nan"))
    stridedfa.sdpa_forward(q, k_cache, v_cache, general, block_table=table, seqlens_kv=seqlens, **mask)
    seen = ref_lse.isfinite().unsqueeze(-1).expand_as(out)
    assert_close(out[seen], general[seen], atol=2e-2, name="out vs the general kernel")


def test_a_growing_cache_reuses_the_graph(by_tokens):
    """The lengths are made on the device: steps of growing length share one graph."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    q, k_cache, v_cache, table, _, out, lse = case(4, 3, None, gen)
    stridedfa.sdpa_forward(q, k_cache, v_cache, out, block_table=table,
                           seqlens_kv=torch.full((4,), 10, dtype=torch.int32, device="cuda"), causal=True,
                           causal_alignment="bottom_right")
    builds = stridedfa.cache_info()["builds"]
    for length in range(11, 120, 7):
        seqlens = torch.full((4,), length, dtype=torch.int32, device="cuda")
        stridedfa.sdpa_forward(q, k_cache, v_cache, out, block_table=table, seqlens_kv=seqlens, causal=True,
                               causal_alignment="bottom_right")
    assert stridedfa.cache_info()["builds"] == builds
    ref, _ = torch_reference(q, gathered(k_cache, table), gathered(v_cache, table), causal=True,
                             alignment="bottom_right", seqlens_q=torch.full((4,), 3, dtype=torch.int32, device="cuda"),
                             seqlens_kv=seqlens)
    assert_close(out, ref, atol=2.5e-2, name="out")


def test_head_major_queries_keep_the_general_kernel(by_tokens):
    """(b, h, s, d) memory has no (b x s) axis to read q as: planned as before, and right."""
    gen = torch.Generator(device="cuda").manual_seed(9)
    q, k_cache, v_cache, table, seqlens, _, _ = case(3, 4, [128, 50, 4], gen)
    q = q.contiguous()
    out = torch.full_like(q, float("nan"))
    stridedfa.sdpa_forward(q, k_cache, v_cache, out, block_table=table, seqlens_kv=seqlens, causal=True,
                           causal_alignment="bottom_right")
    ref, _ = torch_reference(q, gathered(k_cache, table), gathered(v_cache, table), causal=True,
                             alignment="bottom_right", seqlens_q=torch.full((3,), 4, dtype=torch.int32, device="cuda"),
                             seqlens_kv=seqlens)
    assert_close(out, ref, atol=2.5e-2, name="out")


def _random_view(rng, shape, fill, gen, token_major):
    """A view of logical ``shape`` (b, h, s[, d]) whose (b, h, s) axes lie in memory in a random order
    (b, s, h when ``token_major``), d innermost, each axis possibly padded (a view into a larger
    buffer, as a packed projection gives)."""
    lead = [0, 2, 1] if token_major else rng.sample(range(3), 3)
    order = lead + list(range(3, len(shape)))
    padded = [shape[axis] + (rng.choice((0, 0, 1, 3)) if axis != order[-1] or len(shape) == 3 else 0)
              for axis in order]
    if len(shape) == 4 and rng.random() < 0.3:
        padded[-1] += 8  # rows longer than d (16-byte aligned), as q in a packed qkv row
    if fill == "nan":
        memory = torch.full(padded, float("nan"), device="cuda", dtype=torch.float32 if len(shape) == 3
                            else torch.bfloat16)
    else:
        memory = torch.randn(padded, generator=gen, device="cuda").to(torch.bfloat16)
    view = memory[tuple(slice(0, shape[axis]) for axis in order)]
    return view.permute([order.index(axis) for axis in range(len(shape))])


def test_random_strides_match_the_reference(by_tokens):
    """Fuzz: queries, outputs and lse in random memory orders and paddings, the cache token- or
    head-major, random lengths (0 included) and masks, 1-8 queries: whether the step is decoded by
    tokens (token-major q/out/lse) or by cuDNN's general kernel, it matches the reference."""
    import random

    rng = random.Random(20261207)
    gen = torch.Generator(device="cuda").manual_seed(20261207)
    refused = []
    for trial in range(40):
        b = rng.choice((1, 2, 3, 5))
        s_q = rng.randint(1, 8 if b == 1 else 5)
        mask = rng.choice([m.values[0] for m in MASKS])
        blocks = NUM_BLOCKS if rng.random() < 0.5 else NUM_BLOCKS + 5
        cache = torch.randn(blocks, 2, BLOCK, H_KV, D, generator=gen, device="cuda").to(torch.bfloat16)
        if rng.random() < 0.5:  # head-major blocks (blocks, h_kv, block, d)
            cache = cache.permute(0, 1, 3, 2, 4).contiguous().permute(0, 1, 3, 2, 4)
        k_cache, v_cache = cache[:, 0].transpose(1, 2), cache[:, 1].transpose(1, 2)
        table = torch.randperm(blocks, generator=torch.Generator().manual_seed(trial))[:b * BLOCKS]
        table = table.view(b, BLOCKS).to(torch.int32).cuda()
        lengths = [rng.choice((0, 1, s_q, rng.randint(1, BLOCKS * BLOCK), BLOCKS * BLOCK)) for _ in range(b)]
        seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
        token_major = rng.random() < 0.6  # what decoding by tokens needs; otherwise rarely all three
        q = _random_view(rng, (b, H_Q, s_q, D), "randn", gen, token_major)
        out = _random_view(rng, (b, H_Q, s_q, D), "nan", gen, token_major)
        lse = _random_view(rng, (b, H_Q, s_q), "nan", gen, token_major)
        layout = f"trial {trial}: b={b} s_q={s_q} {mask} lengths={lengths} q{q.stride()} out{out.stride()} " \
                 f"lse{lse.stride()} k{k_cache.stride()}"
        try:
            stridedfa.sdpa_forward(q, k_cache, v_cache, out, lse=lse, block_table=table, seqlens_kv=seqlens, **mask)
        except stridedfa.UnsupportedError as error:  # a layout cuDNN refuses: refused before writing
            assert out.isnan().all() and lse.isnan().all(), f"refused but wrote, {layout}: {error}"
            refused.append(f"{layout}: {error}")
            continue
        ref_out, ref_lse = torch_reference(
            q, gathered(k_cache, table), gathered(v_cache, table), causal=mask.get("causal", False),
            alignment="bottom_right", softcap=mask.get("softcap"),
            seqlens_q=torch.full((b,), s_q, dtype=torch.int32, device="cuda"), seqlens_kv=seqlens)
        assert_close(out, ref_out, atol=2.5e-2, name=f"out, {layout}")
        assert_close(lse, ref_lse, atol=1e-3, name=f"lse, {layout}")
    assert len(refused) <= 10, "cuDNN refused most layouts:\n" + "\n".join(refused)
