"""Split-KV paged decoding (issue 33 item 2; STRIDEDFA_SPLIT_KV=auto, which these tests set): at
small batch a paged decoding step is cut into chunks of its keys, each a sequence of a larger paged
problem, and the chunks' partial outputs are merged by their log-sum-exp. Outputs and lse poisoned
with NaN, compared with the float64 reference on fresh data: entries whose keys end inside a chunk,
fill only the first chunk, or are empty; GQA and MHA; bfloat16 and float16; each mask decoding uses.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import stridedfa  # noqa: E402
from stridedfa import reference  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def split_kv():
    before = stridedfa._core._split_kv()
    stridedfa._core._split_kv(True)
    yield
    stridedfa._core._split_kv(before)


def _np(t):
    return t.detach().float().cpu().numpy().astype(np.float64)


def _paged(gen, b, h_q, h_kv, d, lengths, dtype, block=16, columns=None):
    """A paged cache of shuffled blocks holding `lengths` keys per entry; `columns` table columns."""
    columns = columns or max(1, -(-max(lengths) // block))
    num_blocks = b * columns + 3
    k_cache = torch.randn(num_blocks, h_kv, block, d, generator=gen, device="cuda").to(dtype)
    v_cache = torch.randn(num_blocks, h_kv, block, d, generator=gen, device="cuda").to(dtype)
    order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(int(gen.initial_seed())))
    table = order[:b * columns].view(b, columns).to(device="cuda", dtype=torch.int32)
    q = torch.randn(b, h_q, 1, d, generator=gen, device="cuda").to(dtype)
    return q, k_cache, v_cache, table


def _reference(q, k_cache, v_cache, table, lengths, sinks=None, **mask):
    outs, lses = [], []
    for i, n in enumerate(lengths):
        ids = table[i].tolist()
        keys = torch.cat([k_cache[j] for j in ids], dim=1)[:, :n][None]
        values = torch.cat([v_cache[j] for j in ids], dim=1)[:, :n][None]
        if n == 0:  # no keys: out 0, lse -inf (or the head's sink)
            outs.append(np.zeros((1, q.shape[1], 1, v_cache.shape[-1])))
            lses.append(np.full((1, q.shape[1], 1), -np.inf) if sinks is None else _np(sinks)[None, :, None])
            continue
        extra = {} if sinks is None else {"sinks": _np(sinks)}
        out, lse = reference.sdpa_forward(_np(q[i:i + 1]), _np(keys), _np(values), dtype=np.float64, **mask, **extra)
        outs.append(out)
        lses.append(lse)
    return np.concatenate(outs), np.concatenate(lses)


def _check(out, lse, ref_out, ref_lse):
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    ref_out, ref_lse = (torch.from_numpy(x).cuda().float() for x in (ref_out, ref_lse))
    out, lse = out.float(), lse.float()
    assert (out - ref_out).abs().max().item() <= 2e-2 * ref_out.abs().max().item() + 5e-3
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse[finite] - ref_lse[finite]).abs().max().item() <= 2e-3 * max(1.0, ref_lse[finite].abs().max().item())


MASKS = [
    pytest.param({}, id="no_mask"),
    pytest.param(dict(causal=True, causal_alignment="bottom_right"), id="causal_br"),
    pytest.param(dict(softcap=30.0, causal=True, causal_alignment="bottom_right"), id="softcap"),
]


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("heads", [(32, 8), (8, 8)], ids=["gqa", "mha"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_a_split_decoding_step_matches_the_reference(mask, heads, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    (h_q, h_kv), d = heads, 128
    lengths = [3000, 37, 0]  # ends inside a chunk; fills only the first chunk; empty
    q, k_cache, v_cache, table = _paged(gen, 3, h_q, h_kv, d, lengths, dtype)
    out = torch.full((3, h_q, 1, d), float("nan"), device="cuda", dtype=dtype)
    lse = torch.full((3, h_q, 1), float("nan"), device="cuda")
    before = stridedfa.cache_info()["builds"]
    stridedfa.sdpa_forward(q, k_cache, v_cache, out, lse=lse, block_table=table,
                           seqlens_kv=torch.tensor(lengths, device="cuda", dtype=torch.int32), **mask)
    ref_out, ref_lse = _reference(q, k_cache, v_cache, table, lengths, **mask)
    _check(out, lse, ref_out, ref_lse)
    assert stridedfa.cache_info()["builds"] - before <= 1


def test_split_and_unsplit_agree_and_out_alone_is_right(seed):
    """Without lse (inference's call) the split still merges by its own statistics; split and unsplit
    outputs of one call agree to bfloat16 rounding."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    lengths = [8192]
    q, k_cache, v_cache, table = _paged(gen, 1, 32, 8, 128, lengths, torch.bfloat16)
    seqlens = torch.tensor(lengths, device="cuda", dtype=torch.int32)
    outs = []
    for split in (True, False):
        stridedfa._core._split_kv(split)
        out = torch.full((1, 32, 1, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
        stridedfa.sdpa_forward(q, k_cache, v_cache, out, block_table=table, seqlens_kv=seqlens)
        outs.append(out.float())
    assert not torch.isnan(outs[0]).any()
    assert (outs[0] - outs[1]).abs().max().item() <= 1e-2 * outs[1].abs().max().item() + 2e-3


def test_a_strided_out_and_lse_get_the_merge(seed):
    """out a (b, 1, h, d) projection's view, lse the first column of a wider buffer (cuDNN wants a
    16-byte aligned start): the merge writes through their strides and nothing around them."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    lengths = [2048, 1500]
    q, k_cache, v_cache, table = _paged(gen, 2, 16, 4, 64, lengths, torch.bfloat16, columns=256)
    buffer = torch.full((2, 1, 16, 96), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = buffer[..., :64].transpose(1, 2)
    lse_buffer = torch.full((2, 16, 4), float("nan"), device="cuda")
    lse = lse_buffer[..., :1]
    stridedfa.sdpa_forward(q, k_cache, v_cache, out, lse=lse, block_table=table,
                           seqlens_kv=torch.tensor(lengths, device="cuda", dtype=torch.int32))
    ref_out, ref_lse = _reference(q, k_cache, v_cache, table, lengths)
    _check(out, lse, ref_out, ref_lse)
    assert torch.isnan(buffer[..., 64:]).all() and torch.isnan(lse_buffer[..., 1:]).all()


def test_sinks_are_weighed_in_by_the_merge(seed):
    """gpt-oss's sinks on a split paged step: each head's sink joins the merge's sum of weights
    (cuDNN computes the chunks without it); an entry of no keys gets its heads' sinks as lse."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    lengths = [3000, 0]
    q, k_cache, v_cache, table = _paged(gen, 2, 32, 8, 64, lengths, torch.bfloat16)
    sinks = 2.0 * torch.randn(32, generator=gen, device="cuda")
    out = torch.full((2, 32, 1, 64), float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((2, 32, 1), float("nan"), device="cuda")
    stridedfa.sdpa_forward(q, k_cache, v_cache, out, lse=lse, block_table=table, sinks=sinks, causal=True,
                           causal_alignment="bottom_right",
                           seqlens_kv=torch.tensor(lengths, device="cuda", dtype=torch.int32))
    ref_out, ref_lse = _reference(q, k_cache, v_cache, table, lengths, sinks=sinks)
    _check(out, lse, ref_out, ref_lse)


def test_two_chunks_of_one_entry(seed):
    """b = 1 over 32 columns of 16 keys: 2 chunks, so the keys' lengths row starts a 16-byte pitch
    after the queries' (2 int32 would leave it 8-byte aligned)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    lengths = [500]
    q, k_cache, v_cache, table = _paged(gen, 1, 32, 8, 128, lengths, torch.bfloat16, columns=32)
    out = torch.full((1, 32, 1, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((1, 32, 1), float("nan"), device="cuda")
    stridedfa.sdpa_forward(q, k_cache, v_cache, out, lse=lse, block_table=table,
                           seqlens_kv=torch.tensor(lengths, device="cuda", dtype=torch.int32))
    ref_out, ref_lse = _reference(q, k_cache, v_cache, table, lengths)
    _check(out, lse, ref_out, ref_lse)
