"""Paged KV caches: attention over (num_blocks, h_kv, block_size, d) caches through a block table,
against the same attention on the gathered contiguous cache (stridedfa's reference with padding
lengths), outputs poisoned first. Decode (s_q = 1) and chunked prefill, causal bottom-right relative
to each sequence's cached length; caches as views of one allocation; block ids out of range read
no memory outside the cache."""

from __future__ import annotations

import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import stridedfa  # noqa: E402
from helpers.checks import assert_close  # noqa: E402
from helpers.torch_ref import torch_reference  # noqa: E402

pytestmark = pytest.mark.gpu

NUM_BLOCKS, BLOCK, BLOCKS, B, H_Q, H_KV, D = 64, 16, 8, 4, 8, 2, 128


def paged_case(s_q, gen, packed_kv=False):
    cache = torch.randn(NUM_BLOCKS, 2, BLOCK, H_KV, D, generator=gen, device="cuda").to(torch.bfloat16)
    if packed_kv:  # K and V as views of one (blocks, 2, block, h, d) allocation, bshd inside a block
        k_cache, v_cache = cache[:, 0].transpose(1, 2), cache[:, 1].transpose(1, 2)
    else:
        k_cache, v_cache = (cache[:, i].transpose(1, 2).contiguous() for i in range(2))
    table = torch.randperm(NUM_BLOCKS, generator=torch.Generator().manual_seed(3))[:B * BLOCKS]
    table = table.view(B, BLOCKS).to(torch.int32).cuda()
    lengths = torch.randint(s_q, BLOCKS * BLOCK + 1, (B,), generator=torch.Generator().manual_seed(4))
    lengths = lengths.to(torch.int32).cuda()
    q = torch.randn(B, H_Q, s_q, D, generator=gen, device="cuda").to(torch.bfloat16)
    return q, k_cache, v_cache, table, lengths


def gathered(cache, table):
    """(b, h, blocks * block, d): each sequence's blocks, one after another."""
    return cache[table.long()].permute(0, 2, 1, 3, 4).reshape(B, H_KV, BLOCKS * BLOCK, D)


@pytest.mark.parametrize("s_q", [1, 8], ids=["decode", "chunked_prefill"])
@pytest.mark.parametrize("packed_kv", [False, True], ids=["separate", "one_allocation"])
def test_paged_attention_equals_attention_on_the_gathered_cache(s_q, packed_kv):
    gen = torch.Generator(device="cuda").manual_seed(11 + s_q)
    q, k_cache, v_cache, table, lengths = paged_case(s_q, gen, packed_kv)
    out = torch.full_like(q, float("nan"))
    stridedfa.sdpa_forward(q, k_cache, v_cache, out, block_table=table, seqlens_kv=lengths, causal=True,
                           causal_alignment="bottom_right")
    seqlens_q = torch.full((B,), s_q, dtype=torch.int32, device="cuda")
    ref, _ = torch_reference(q, gathered(k_cache, table), gathered(v_cache, table), causal=True,
                             alignment="bottom_right", seqlens_q=seqlens_q, seqlens_kv=lengths)
    assert_close(out, ref, atol=2.5e-2, name="out")


def test_block_ids_out_of_range_read_nothing_outside_the_cache():
    gen = torch.Generator(device="cuda").manual_seed(13)
    q, k_cache, v_cache, table, lengths = paged_case(1, gen)
    guard = torch.full((3, NUM_BLOCKS, H_KV, BLOCK, D), float("nan"), dtype=torch.bfloat16, device="cuda")
    guard[1] = k_cache
    bad = table.clone()
    bad[0, 0], bad[1, 3], bad[2, 5] = -7, NUM_BLOCKS, 2**31 - 1
    out = torch.full_like(q, float("nan"))
    stridedfa.sdpa_forward(q, guard[1], v_cache, out, block_table=bad, seqlens_kv=lengths, causal=True,
                           causal_alignment="bottom_right")
    torch.cuda.synchronize()
    assert torch.isfinite(out).all(), "a clamped id reads a block of the cache, never the NaN guards around it"


def test_attention_with_kvcache_appends_then_attends():
    """Appending s_new tokens at each sequence's length, then attending: equal to writing them into
    the gathered cache by hand and attending there."""
    import stridedfa.torch as st

    gen = torch.Generator(device="cuda").manual_seed(17)
    q, k_cache, v_cache, table, lengths = paged_case(2, gen, packed_kv=True)
    lengths = (lengths - 2).clamp(min=0).to(torch.int32)  # room for the 2 new tokens
    k_new, v_new = (torch.randn(B, H_KV, 2, D, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(2))
    k_full, v_full = gathered(k_cache, table).clone(), gathered(v_cache, table).clone()
    for b in range(B):
        n = int(lengths[b])
        k_full[b, :, n:n + 2], v_full[b, :, n:n + 2] = k_new[b], v_new[b]
    out = st.attention_with_kvcache(q, k_cache, v_cache, table, lengths, k_new, v_new)
    assert torch.equal(gathered(k_cache, table)[:, :, :int(lengths.max()) + 2].isfinite(),
                       k_full[:, :, :int(lengths.max()) + 2].isfinite())
    ref, _ = torch_reference(q, k_full, v_full, causal=True, alignment="bottom_right",
                             seqlens_q=torch.full((B,), 2, dtype=torch.int32, device="cuda"),
                             seqlens_kv=lengths + 2)
    assert_close(out, ref, atol=2.5e-2, name="out")
