"""stridedfa.flash_attn_interface against the fp32-class reference: FlashAttention 2's calls on
bshd, packed, THD and KV-cache inputs (causal bottom-right with s_q != s_kv, windows, softcap,
GQA, head dims padded to 8, non-contiguous grad_out, deterministic backward). Fresh random data
per case."""

from __future__ import annotations

import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

from helpers.checks import assert_bitexact, assert_close, assert_close_to_scale  # noqa: E402
from helpers.torch_ref import torch_reference, torch_reference_all  # noqa: E402
from stridedfa import flash_attn_interface as fa  # noqa: E402

pytestmark = pytest.mark.gpu
ATOL, GRAD_REL = 2.5e-2, 3e-2  # bf16


def bshd(b, s, h, d, gen):
    return torch.randn(b, s, h, d, generator=gen, device="cuda").to(torch.bfloat16)


def to_bhsd(t):
    return t.transpose(1, 2)


CASES = {  # (b, s_q, s_kv, h_q, h_kv, d, causal, window_size, softcap)
    "plain": (2, 128, 128, 4, 4, 64, False, (-1, -1), 0.0),
    "causal_sq_gt_skv": (2, 160, 96, 4, 2, 64, True, (-1, -1), 0.0),
    "causal_sq_lt_skv": (2, 64, 200, 8, 2, 128, True, (-1, -1), 0.0),
    "window_gemma": (1, 256, 256, 4, 4, 64, True, (63, 0), 30.0),
    "window_both_sides": (2, 96, 128, 4, 1, 64, False, (20, 7), 0.0),
    "head_dim_60_padded": (2, 80, 80, 4, 4, 60, True, (-1, -1), 0.0),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_flash_attn_func_matches_the_reference(name):
    b, s_q, s_kv, h_q, h_kv, d, causal, window_size, softcap = CASES[name]
    gen = torch.Generator(device="cuda").manual_seed(len(name))
    q = bshd(b, s_q, h_q, d, gen).requires_grad_()
    k, v = (bshd(b, s_kv, h_kv, d, gen).requires_grad_() for _ in range(2))
    grad_out = bshd(b, h_q, s_q, d, gen).transpose(1, 2)  # non-contiguous, as autograd may hand over
    out, lse, dmask = fa.flash_attn_func(q, k, v, causal=causal, window_size=window_size, softcap=softcap,
                                         return_attn_probs=True)
    out.backward(grad_out)
    assert dmask is None and out.shape == (b, s_q, h_q, d) and lse.shape == (b, h_q, s_q)
    window = None if window_size == (-1, -1) else tuple(None if w < 0 else w for w in window_size)
    ref_out, ref_lse, ref_grads = torch_reference_all(
        to_bhsd(q), to_bhsd(k), to_bhsd(v), to_bhsd(grad_out), causal=causal, alignment="bottom_right",
        window=window, softcap=softcap or None)
    assert_close(to_bhsd(out), ref_out, atol=ATOL, name="out")
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite), "rows without keys: lse -inf"
    assert_close(lse[finite], ref_lse[finite], atol=1e-2, name="lse")
    for label, got, want in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), ref_grads):
        assert_close_to_scale(to_bhsd(got), want, rel=GRAD_REL, name=label)


def test_packed_functions_equal_separate_tensors_bitwise():
    gen = torch.Generator(device="cuda").manual_seed(5)
    qkv = torch.randn(2, 100, 3, 4, 64, generator=gen, device="cuda").to(torch.bfloat16).requires_grad_()
    grad_out = bshd(2, 100, 4, 64, gen)
    out = fa.flash_attn_qkvpacked_func(qkv, causal=True)
    out.backward(grad_out)
    parts = [qkv[:, :, i].detach().contiguous().requires_grad_() for i in range(3)]
    expected = fa.flash_attn_func(*parts, causal=True)
    expected.backward(grad_out)
    assert_bitexact(out, expected, "out")
    for i, part in enumerate(parts):
        assert_bitexact(qkv.grad[:, :, i], part.grad, f"gradient {i}")
    q = bshd(2, 60, 8, 64, gen).requires_grad_()
    kv = torch.randn(2, 100, 2, 2, 64, generator=gen, device="cuda").to(torch.bfloat16).requires_grad_()
    out = fa.flash_attn_kvpacked_func(q, kv, causal=True)
    expected = fa.flash_attn_func(q.detach(), kv[:, :, 0].detach(), kv[:, :, 1].detach(), causal=True)
    assert_bitexact(out, expected, "kv-packed out")


def test_varlen_functions_match_per_sequence_reference():
    gen = torch.Generator(device="cuda").manual_seed(11)
    lengths = [37, 1, 0, 120, 64]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    total = sum(lengths)
    q = torch.randn(total, 8, 64, generator=gen, device="cuda").to(torch.bfloat16).requires_grad_()
    kv = torch.randn(total, 2, 2, 64, generator=gen, device="cuda").to(torch.bfloat16).requires_grad_()
    out, lse, _ = fa.flash_attn_varlen_kvpacked_func(q, kv, cu, cu, max(lengths), max(lengths), causal=True,
                                                     window_size=(16, -1), return_attn_probs=True)
    assert lse.shape == (8, total)
    for i, n in enumerate(lengths):
        if n == 0:
            continue
        s = slice(int(cu[i]), int(cu[i + 1]))
        ref_out, ref_lse = torch_reference(q[s][None].transpose(1, 2), kv[s, 0][None].transpose(1, 2),
                                           kv[s, 1][None].transpose(1, 2), causal=True, alignment="bottom_right",
                                           window=(16, None))
        assert_close(out[s][None].transpose(1, 2), ref_out, atol=ATOL, name=f"out of sequence {i}")
        assert_close(lse[:, s], ref_lse[0], atol=1e-2, name=f"lse of sequence {i}")
    qkv = torch.randn(total, 3, 4, 64, generator=gen, device="cuda").to(torch.bfloat16).requires_grad_()
    out = fa.flash_attn_varlen_qkvpacked_func(qkv, cu, max(lengths), causal=True)
    expected = fa.flash_attn_varlen_func(*(qkv[:, i].detach() for i in range(3)), cu, cu, max(lengths),
                                         max(lengths), causal=True)
    assert_bitexact(out, expected, "qkv-packed varlen out")


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("rotary", [None, "neox", "gptj"])
def test_with_kvcache_equals_appending_by_hand(paged, rotary):
    gen = torch.Generator(device="cuda").manual_seed(17 + paged)
    b, s_new, h_q, h_kv, d, capacity, block = 3, 2, 8, 2, 64, 256, 16
    q = bshd(b, s_new, h_q, d, gen)
    k_new, v_new = (bshd(b, s_new, h_kv, d, gen) for _ in range(2))
    dense_k, dense_v = (bshd(b, capacity, h_kv, d, gen) for _ in range(2))
    lengths = torch.tensor([0, 100, 250], dtype=torch.int32, device="cuda")
    cos = sin = None
    if rotary:
        angles = torch.rand(capacity, 16, generator=gen, device="cuda") * 6.3
        cos, sin = angles.cos(), angles.sin()
    # expected: rotate, write by hand, attend over the first lengths + s_new keys (bottom-right causal)
    positions = lengths.long()[:, None] + torch.arange(s_new, device="cuda")
    k_rot = k_new if cos is None else fa._rotate(k_new, cos, sin, positions, rotary == "gptj")
    q_rot = q if cos is None else fa._rotate(q, cos, sin, positions, rotary == "gptj")
    want_k, want_v = dense_k.clone(), dense_v.clone()
    for i in range(b):
        want_k[i, lengths[i]:lengths[i] + s_new] = k_rot[i]
        want_v[i, lengths[i]:lengths[i] + s_new] = v_new[i]
    ref, _ = torch_reference(to_bhsd(q_rot), to_bhsd(want_k), to_bhsd(want_v), causal=True, alignment="bottom_right",
                             seqlens_kv=lengths + s_new)
    args = dict(rotary_cos=cos, rotary_sin=sin, cache_seqlens=lengths, causal=True,
                rotary_interleaved=rotary == "gptj")
    if paged:  # the same logical cache in shuffled blocks of one (num_blocks, block, h, d) pool each
        per_seq = capacity // block
        table = torch.randperm(b * per_seq, device="cuda").view(b, per_seq).to(torch.int32)
        k_pool, v_pool = (torch.empty(b * per_seq, block, h_kv, d, device="cuda", dtype=torch.bfloat16)
                          for _ in range(2))
        k_pool[table.long()] = dense_k.view(b, per_seq, block, h_kv, d)
        v_pool[table.long()] = dense_v.view(b, per_seq, block, h_kv, d)
        out = fa.flash_attn_with_kvcache(q, k_pool, v_pool, k_new, v_new, block_table=table, **args)
        got_k = k_pool[table.long()].view(b, capacity, h_kv, d)
    else:
        out = fa.flash_attn_with_kvcache(q, dense_k, dense_v, k_new, v_new, **args)
        got_k = dense_k
    assert torch.equal(got_k, want_k), "the appended (rotated) keys"
    assert_close(to_bhsd(out), ref, atol=ATOL, name=f"with_kvcache paged={paged} rotary={rotary}")


def test_deterministic_backward_is_bitwise_repeatable():
    gen = torch.Generator(device="cuda").manual_seed(23)
    q, k, v = (bshd(2, 256, 4, 64, gen).requires_grad_() for _ in range(3))
    grad_out = bshd(2, 256, 4, 64, gen)
    grads = []
    for _ in range(5):
        out = fa.flash_attn_func(q, k, v, causal=True, deterministic=True)
        grads.append(torch.autograd.grad(out, (q, k, v), grad_out))
    for other in grads[1:]:
        for a, e, name in zip(other, grads[0], ("dq", "dk", "dv")):
            assert_bitexact(a, e, name)


@pytest.mark.parametrize("window_size", [(-1, -1), (24, 0)])
def test_with_kvcache_left_padded_cache(window_size):
    """cache_leftpad: each row's keys start at its left padding; positions, the causal diagonal
    and the window stay absolute (FlashAttention's definition), new keys land at cache_seqlens."""
    gen = torch.Generator(device="cuda").manual_seed(29)
    b, s_new, h_q, h_kv, d, capacity = 4, 3, 8, 2, 64, 192
    q = bshd(b, s_new, h_q, d, gen)
    k_new, v_new = (bshd(b, s_new, h_kv, d, gen) for _ in range(2))
    cache_k, cache_v = (bshd(b, capacity, h_kv, d, gen) for _ in range(2))
    lengths = torch.tensor([10, 100, 150, 60], dtype=torch.int32, device="cuda")
    leftpad = torch.tensor([0, 37, 149, 5], dtype=torch.int32, device="cuda")
    want_k, want_v = cache_k.clone(), cache_v.clone()
    for i in range(b):
        want_k[i, lengths[i]:lengths[i] + s_new] = k_new[i]
        want_v[i, lengths[i]:lengths[i] + s_new] = v_new[i]
    keys = torch.arange(capacity, device="cuda")
    bias = torch.zeros(b, 1, 1, capacity, device="cuda").masked_fill(
        (keys[None] < leftpad[:, None].long())[:, None, None], float("-inf"))
    window = fa._window(window_size)
    ref, ref_lse = torch_reference(to_bhsd(q), to_bhsd(want_k), to_bhsd(want_v), causal=True, alignment="bottom_right",
                                   window=window, seqlens_kv=lengths + s_new, bias=bias)
    out, lse = fa.flash_attn_with_kvcache(q, cache_k, cache_v, k_new, v_new, cache_seqlens=lengths,
                                          cache_leftpad=leftpad, causal=True, window_size=window_size,
                                          return_softmax_lse=True)
    assert torch.equal(cache_k, want_k) and torch.equal(cache_v, want_v), "the appended keys and values"
    assert_close(to_bhsd(out), ref, atol=ATOL, name=f"left-padded cache, window {window_size}")
    assert_close(lse, ref_lse, atol=1e-2, name="lse")


def test_varlen_alibi_matches_each_sequence_alone():
    """ALiBi in flash_attn_varlen_func (padded copies, lengths, slopes aligned per sequence):
    out, LSE and gradients against the fp32 reference of each sequence alone."""
    gen = torch.Generator(device="cuda").manual_seed(31)
    lengths, h_q, h_kv, d = [37, 128, 5, 90], 8, 2, 64
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    total = int(cu[-1])
    q = torch.randn(total, h_q, d, generator=gen, device="cuda").to(torch.bfloat16).requires_grad_()
    k, v = (torch.randn(total, h_kv, d, generator=gen, device="cuda").to(torch.bfloat16).requires_grad_()
            for _ in range(2))
    slopes = torch.rand(h_q, generator=gen, device="cuda") * 0.3
    out, lse, _ = fa.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True,
                                            alibi_slopes=slopes, return_attn_probs=True)
    grad_out = torch.randn(out.shape, generator=gen, device="cuda").to(torch.bfloat16)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    for i, n in enumerate(lengths):
        s = slice(int(cu[i]), int(cu[i]) + n)
        one = [t[s].detach().transpose(0, 1)[None] for t in (q, k, v)]
        ref_out, ref_lse, ref_grads = torch_reference_all(*one, grad_out[s].transpose(0, 1)[None], causal=True,
                                                          alignment="bottom_right", alibi_slopes=slopes)
        assert_close(out[s].transpose(0, 1)[None], ref_out, atol=ATOL, name=f"out of sequence {i}")
        assert_close(lse[:, s], ref_lse[0], atol=1e-2, name=f"lse of sequence {i}")
        for got, want, name in zip(grads, ref_grads, ("dq", "dk", "dv")):
            assert_close_to_scale(got[s].transpose(0, 1)[None], want, rel=GRAD_REL, name=f"{name} of sequence {i}")


@pytest.mark.parametrize("causal, window", [(True, (-1, -1)), (False, (-1, -1)), (True, (40, 0)), (False, (30, 50))])
def test_alibi_with_an_offset_per_sequence(causal, window):
    """ALiBi aligned to each sequence's end where every sequence has its own L_k - L_q (varlen with
    different cu_seqlens; a KV cache with cache_seqlens), attended back to front: out, LSE and
    (varlen) gradients against the fp32 reference of each sequence alone, bottom-right."""
    gen = torch.Generator(device="cuda").manual_seed(43)
    h_q, h_kv, d = 8, 2, 64
    slopes = torch.rand(h_q, generator=gen, device="cuda") * 0.3
    options = dict(causal=causal, window_size=window, alibi_slopes=slopes)
    reference = dict(causal=causal, alignment="bottom_right", window=fa._window(window), alibi_slopes=slopes)
    lengths_q, lengths_k = [37, 128, 5, 90], [200, 128, 70, 91]
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
                  for n in (lengths_q, lengths_k))
    q = torch.randn(int(cu_q[-1]), h_q, d, generator=gen, device="cuda").to(torch.bfloat16).requires_grad_()
    k, v = (torch.randn(int(cu_k[-1]), h_kv, d, generator=gen, device="cuda").to(torch.bfloat16).requires_grad_()
            for _ in range(2))
    out, lse, _ = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                            return_attn_probs=True, **options)
    grad_out = torch.randn(out.shape, generator=gen, device="cuda").to(torch.bfloat16)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    for i in range(len(lengths_q)):
        rows, keys = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        one = [t[s].detach().transpose(0, 1)[None] for t, s in ((q, rows), (k, keys), (v, keys))]
        ref_out, ref_lse, ref_grads = torch_reference_all(*one, grad_out[rows].transpose(0, 1)[None], **reference)
        assert_close(out[rows].transpose(0, 1)[None], ref_out, atol=ATOL, name=f"varlen out of sequence {i}")
        assert_close(lse[:, rows], ref_lse[0], atol=1e-2, name=f"varlen lse of sequence {i}")
        for got, want, name, s in zip(grads, ref_grads, ("dq", "dk", "dv"), (rows, keys, keys)):
            assert_close_to_scale(got[s].transpose(0, 1)[None], want, rel=GRAD_REL, name=f"{name} of sequence {i}")

    b, s_new, capacity = 3, 4, 256
    q = bshd(b, s_new, h_q, d, gen)
    k_cache, v_cache = (bshd(b, capacity, h_kv, d, gen) for _ in range(2))
    new = [bshd(b, s_new, h_kv, d, gen) for _ in range(2)]
    cached = torch.tensor([0, 100, 200], dtype=torch.int32, device="cuda")
    out, lse = fa.flash_attn_with_kvcache(q, k_cache, v_cache, *new, cache_seqlens=cached, return_softmax_lse=True,
                                          **options)
    for i in range(b):
        n = int(cached[i]) + s_new
        ref, ref_lse = torch_reference(to_bhsd(q[i:i + 1]), to_bhsd(k_cache[i:i + 1, :n]),
                                       to_bhsd(v_cache[i:i + 1, :n]), **reference)
        assert_close(to_bhsd(out[i:i + 1]), ref, atol=ATOL, name=f"cache out of sequence {i}")
        assert_close(lse[i:i + 1], ref_lse, atol=1e-2, name=f"cache lse of sequence {i}")


@pytest.mark.parametrize("alibi", [False, True])
def test_varlen_over_a_paged_cache(alibi):
    """flash_attn_varlen_func with block_table (chunked prefill over paged caches, GQA, a window):
    out and LSE against the fp32 reference of each sequence's queries over its first keys."""
    gen = torch.Generator(device="cuda").manual_seed(47)
    h_q, h_kv, d, page, per_seq = 8, 2, 64, 16, 8
    lengths_q, lengths_k = [37, 1, 64], [100, 128, 64]
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
                  for n in (lengths_q, lengths_k))
    b = len(lengths_q)
    q = torch.randn(int(cu_q[-1]), h_q, d, generator=gen, device="cuda").to(torch.bfloat16)
    pool = b * per_seq + 5
    k_pages, v_pages = (torch.randn(pool, page, h_kv, d, generator=gen, device="cuda").to(torch.bfloat16)
                        for _ in range(2))
    table = torch.randperm(pool, device="cuda")[:b * per_seq].view(b, per_seq).to(torch.int32)
    slopes = torch.rand(h_q, generator=gen, device="cuda") * 0.3 if alibi else None
    out, lse, _ = fa.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, max(lengths_q), page * per_seq,
                                            causal=True, window_size=(90, 0), alibi_slopes=slopes,
                                            return_attn_probs=True, block_table=table)
    for i, n_k in enumerate(lengths_k):
        rows = slice(int(cu_q[i]), int(cu_q[i + 1]))
        keys, values = (t[table[i].long()].flatten(0, 1)[:n_k] for t in (k_pages, v_pages))
        ref, ref_lse = torch_reference(q[rows].transpose(0, 1)[None], keys.transpose(0, 1)[None],
                                       values.transpose(0, 1)[None], causal=True, alignment="bottom_right",
                                       window=(90, 0), alibi_slopes=slopes)
        assert_close(out[rows].transpose(0, 1)[None], ref, atol=ATOL, name=f"out of sequence {i}")
        assert_close(lse[:, rows], ref_lse[0], atol=1e-2, name=f"lse of sequence {i}")


def test_per_sequence_alibi_slopes_against_the_reference():
    """alibi_slopes (batch, nheads), as FlashAttention's own tests draw them: one call per sequence."""
    gen = torch.Generator(device="cuda").manual_seed(37)
    b, s_q, s_kv, h, d = 3, 64, 96, 4, 64
    q, k, v = bshd(b, s_q, h, d, gen), bshd(b, s_kv, h, d, gen), bshd(b, s_kv, h, d, gen)
    slopes = torch.rand(b, h, generator=gen, device="cuda") * 0.3
    out, lse, _ = fa.flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes, return_attn_probs=True)
    for i in range(b):
        ref, ref_lse = torch_reference(to_bhsd(q[i:i + 1]), to_bhsd(k[i:i + 1]), to_bhsd(v[i:i + 1]), causal=True,
                                       alignment="bottom_right", alibi_slopes=slopes[i])
        assert_close(to_bhsd(out[i:i + 1]), ref, atol=ATOL, name=f"out of sequence {i}")
        assert_close(lse[i:i + 1], ref_lse, atol=1e-2, name=f"lse of sequence {i}")


def test_paged_cache_with_alibi_and_lse_equals_the_dense_cache():
    """block_table with alibi_slopes and return_softmax_lse (pages gathered, attended densely)
    against the same cache held densely."""
    gen = torch.Generator(device="cuda").manual_seed(41)
    b, s_new, h_q, h_kv, d, block, per_seq = 3, 2, 8, 2, 64, 16, 8
    q = bshd(b, s_new, h_q, d, gen)
    k_new, v_new = (bshd(b, s_new, h_kv, d, gen) for _ in range(2))
    dense_k, dense_v = (bshd(b, block * per_seq, h_kv, d, gen) for _ in range(2))
    table = torch.randperm(b * per_seq, device="cuda").view(b, per_seq).to(torch.int32)
    k_pool, v_pool = (torch.empty(b * per_seq, block, h_kv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k_pool[table.long()] = dense_k.view(b, per_seq, block, h_kv, d)
    v_pool[table.long()] = dense_v.view(b, per_seq, block, h_kv, d)
    args = dict(cache_seqlens=torch.tensor([0, 50, 120], dtype=torch.int32, device="cuda"), causal=True,
                alibi_slopes=torch.rand(h_q, generator=gen, device="cuda") * 0.3, return_softmax_lse=True)
    out, lse = fa.flash_attn_with_kvcache(q, k_pool, v_pool, k_new, v_new, block_table=table, **args)
    want, want_lse = fa.flash_attn_with_kvcache(q, dense_k, dense_v, k_new, v_new, **args)
    assert torch.equal(k_pool[table.long()].view(b, -1, h_kv, d), dense_k), "appended into the pages"
    assert_bitexact(out, want, "out")
    assert_bitexact(lse, want_lse, "lse")
