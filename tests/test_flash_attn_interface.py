"""stridedfa.flash_attn_interface without a GPU: FlashAttention 2's signatures, what each function
hands stridedfa.torch's operators (traced on meta tensors, which run the fake kernels), the shapes
it returns, and the arguments it refuses by name."""

import inspect

import pytest

torch = pytest.importorskip("torch")

import stridedfa  # noqa: E402
from stridedfa import flash_attn_interface as fa  # noqa: E402

META = dict(device="meta", dtype=torch.bfloat16)

# FlashAttention 2.x's parameter lists (flash_attn/flash_attn_interface.py), in order.
SIGNATURES = {
    "flash_attn_func": "q k v dropout_p softmax_scale causal window_size softcap alibi_slopes deterministic "
                       "return_attn_probs",
    "flash_attn_qkvpacked_func": "qkv dropout_p softmax_scale causal window_size softcap alibi_slopes "
                                 "deterministic return_attn_probs",
    "flash_attn_kvpacked_func": "q kv dropout_p softmax_scale causal window_size softcap alibi_slopes "
                                "deterministic return_attn_probs",
    "flash_attn_varlen_func": "q k v cu_seqlens_q cu_seqlens_k max_seqlen_q max_seqlen_k dropout_p softmax_scale "
                              "causal window_size softcap alibi_slopes deterministic return_attn_probs block_table",
    "flash_attn_varlen_qkvpacked_func": "qkv cu_seqlens max_seqlen dropout_p softmax_scale causal window_size "
                                        "softcap alibi_slopes deterministic return_attn_probs",
    "flash_attn_varlen_kvpacked_func": "q kv cu_seqlens_q cu_seqlens_k max_seqlen_q max_seqlen_k dropout_p "
                                       "softmax_scale causal window_size softcap alibi_slopes deterministic "
                                       "return_attn_probs",
    "flash_attn_with_kvcache": "q k_cache v_cache k v rotary_cos rotary_sin cache_seqlens cache_batch_idx "
                               "cache_leftpad block_table softmax_scale causal window_size softcap "
                               "rotary_interleaved alibi_slopes num_splits return_softmax_lse",
}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signatures_are_flash_attention_2s(name):
    assert list(inspect.signature(getattr(fa, name)).parameters) == SIGNATURES[name].split()


def _recorded(fn, *args):
    """The stridedfa operator calls a traced fn makes: [(name, args)]."""
    from torch.fx.experimental.proxy_tensor import make_fx

    graph = make_fx(fn)(*args)
    return [(str(n.target), n.args) for n in graph.graph.nodes
            if n.op == "call_function" and str(n.target).startswith("stridedfa.")]


def test_flash_attn_func_maps_causal_bottom_right_scale_window_and_softcap():
    q = torch.empty(2, 100, 8, 64, **META)
    k = v = torch.empty(2, 130, 2, 64, **META)
    calls = _recorded(lambda q, k, v: fa.flash_attn_func(q, k, v, causal=True, window_size=(31, -1), softcap=30.0),
                      q, k, v)
    (name, args), = calls
    assert name.startswith("stridedfa.attention_inference")
    scale, causal, alignment, left, right, softcap = args[3:9]
    assert (scale, causal, alignment, left, right, softcap) == (64 ** -0.5, True, "bottom_right", 31, -1, 30.0)
    plain = _recorded(lambda q, k, v: fa.flash_attn_func(q, k, v), q, k, v)
    assert plain[0][0].startswith("stridedfa.attention_inference_basic")  # no window, no softcap: none passed


def test_dense_shapes_lse_and_head_dims_padded_to_eight():
    q = torch.empty(2, 100, 8, 60, **META)
    k = v = torch.empty(2, 130, 2, 60, **META)
    out, lse, dmask = fa.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.shape == (2, 100, 8, 60) and lse.shape == (2, 8, 100) and dmask is None
    qkv = torch.empty(2, 100, 3, 8, 64, **META)
    assert fa.flash_attn_qkvpacked_func(qkv).shape == (2, 100, 8, 64)
    kv = torch.empty(2, 130, 2, 2, 64, **META)
    out, lse, _ = fa.flash_attn_kvpacked_func(q[..., :56], kv[..., :56], return_attn_probs=True)
    assert out.shape == (2, 100, 8, 56) and lse.shape == (2, 8, 100)


def test_varlen_shapes_and_lse_layout():
    q = torch.empty(300, 8, 64, **META)
    k = v = torch.empty(280, 2, 64, **META)
    cu = torch.empty(4, device="meta", dtype=torch.int32)
    out, lse, _ = fa.flash_attn_varlen_func(q, k, v, cu, cu, 120, 110, causal=True, return_attn_probs=True)
    assert out.shape == (300, 8, 64) and lse.shape == (8, 300)
    qkv = torch.empty(300, 3, 8, 64, **META)
    assert fa.flash_attn_varlen_qkvpacked_func(qkv, cu, 120, causal=True).shape == (300, 8, 64)
    kv = torch.empty(280, 2, 2, 64, **META)
    assert fa.flash_attn_varlen_kvpacked_func(q, kv, cu, cu, 120, 110).shape == (300, 8, 64)


def test_varlen_records_the_maximum_lengths_and_bottom_right():
    q = k = v = torch.empty(300, 4, 64, **META)
    cu = torch.empty(3, device="meta", dtype=torch.int32)
    (name, args), = _recorded(lambda q, k, v, cu: fa.flash_attn_varlen_func(q, k, v, cu, cu, 200, 200, causal=True),
                              q, k, v, cu)
    assert name.startswith("stridedfa.varlen_forward")
    assert args[5:10] == (200, 200, 64 ** -0.5, True, "bottom_right")


def test_with_kvcache_contiguous_and_paged_shapes():
    q = torch.empty(3, 1, 8, 64, **META)
    cache = torch.empty(3, 256, 2, 64, **META)
    new = torch.empty(3, 1, 2, 64, **META)
    lengths = torch.empty(3, device="meta", dtype=torch.int32)
    out, lse = fa.flash_attn_with_kvcache(q, cache, cache.clone(), new, new, cache_seqlens=lengths, causal=True,
                                         return_softmax_lse=True)
    assert out.shape == (3, 1, 8, 64) and lse.shape == (3, 8, 1)
    cos = sin = torch.empty(512, 16, device="meta", dtype=torch.float32)
    out = fa.flash_attn_with_kvcache(q, cache, cache.clone(), new, new, rotary_cos=cos, rotary_sin=sin,
                                     cache_seqlens=5, rotary_interleaved=False)
    assert out.shape == (3, 1, 8, 64)
    pages = torch.empty(40, 16, 2, 64, **META)
    table = torch.empty(3, 8, device="meta", dtype=torch.int32)
    out = fa.flash_attn_with_kvcache(q, pages, pages.clone(), new, new, cache_seqlens=lengths, block_table=table,
                                     causal=True)
    assert out.shape == (3, 1, 8, 64)


@pytest.mark.parametrize("call,argument", [
    (lambda q, c, t: fa.flash_attn_with_kvcache(q, c, c, cache_leftpad=t, block_table=t[:, None]), "cache_leftpad"),
    (lambda q, c, t: fa.flash_attn_with_kvcache(q, c, c, cache_leftpad=t, alibi_slopes=torch.zeros(8)),
     "alibi_slopes"),
    (lambda q, c, t: fa.flash_attn_with_kvcache(q, c, c, cache_batch_idx=t, block_table=t[:, None]),
     "cache_batch_idx"),
    (lambda q, c, t: fa.flash_attn_func(q, c, c, alibi_slopes=torch.zeros(2, 8)), "alibi_slopes"),
])
def test_what_stridedfa_cannot_do_is_refused_by_argument_name(call, argument):
    q = torch.empty(3, 1, 8, 64, **META)
    cache = torch.empty(3, 64, 8, 64, **META)
    t = torch.empty(3, device="meta", dtype=torch.int32)
    with pytest.raises(stridedfa.UnsupportedError, match=argument):
        call(q, cache, t)


def test_rotary_matches_flash_attentions_definition():
    """GPT-NeoX (halves) and GPT-J (interleaved pairs) rotations of the first 2 * half channels at
    given positions, the rest unchanged: against the formula written out per channel pair."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 4, 12, generator=gen)
    cos, sin = torch.randn(10, 4, generator=gen), torch.randn(10, 4, generator=gen)
    positions = torch.tensor([[0, 1, 2], [7, 8, 9]])
    for interleaved in (False, True):
        got = fa._rotate(x, cos, sin, positions, interleaved)
        want = x.clone()
        for b in range(2):
            for s in range(3):
                c, sn = cos[positions[b, s]], sin[positions[b, s]]
                for i in range(4):
                    a, bb = (2 * i, 2 * i + 1) if interleaved else (i, i + 4)
                    x0, x1 = x[b, s, :, a], x[b, s, :, bb]
                    want[b, s, :, a], want[b, s, :, bb] = x0 * c[i] - x1 * sn[i], x0 * sn[i] + x1 * c[i]
        assert torch.allclose(got, want, atol=1e-6), interleaved


def test_left_padded_cache_cuts_each_row_into_padding_keys_and_tail(monkeypatch):
    """cache_leftpad runs on the variable-length path: per row, (padding, keys, unused tail) paired
    with (no queries, the row's queries, none), on the token axis of the flattened cache."""
    seen = {}

    def varlen(q, k, v, cu_q, cu_kv, max_q, max_kv, **options):
        seen.update(cu_q=cu_q.tolist(), cu_kv=cu_kv.tolist(), shapes=(q.shape, k.shape), max=(max_q, max_kv),
                    options=options)
        return torch.zeros(q.shape[0], q.shape[1], v.shape[2]), torch.zeros(q.shape[1], q.shape[0])

    monkeypatch.setattr(fa._st, "varlen_attention", varlen)
    q = torch.zeros(2, 3, 8, 64)
    cache = torch.zeros(2, 16, 2, 64)
    out, lse = fa.flash_attn_with_kvcache(q, cache, cache.clone(), torch.ones(2, 3, 2, 64), torch.ones(2, 3, 2, 64),
                                          cache_seqlens=torch.tensor([4, 9], dtype=torch.int32),
                                          cache_leftpad=torch.tensor([1, 0], dtype=torch.int32), causal=True,
                                          return_softmax_lse=True)
    assert seen["cu_kv"] == [0, 1, 7, 16, 16, 28, 32] and seen["cu_q"] == [0, 0, 3, 3, 3, 6, 6]
    assert seen["max"] == (3, 16) and seen["options"]["causal_alignment"] == "bottom_right"
    assert out.shape == (2, 3, 8, 64) and lse.shape == (2, 8, 3)


def _reference(q, k, v, *, scale, causal, causal_alignment, window, softcap, seqlens_q=None, seqlens_kv=None,
               alibi_slopes=None, dropout_p=0.0, return_lse=False, **_):
    """stridedfa.torch.attention's arguments, computed by the float64 reference (on the CPU), after
    the core's own verdict on the call (helpers.core_check: what it refuses on a GPU, it refuses)."""
    from helpers.core_check import check_forward
    from helpers.torch_ref import _attention

    check_forward(q, k, v, scale=scale, causal=causal, causal_alignment=causal_alignment, window=window,
                  softcap=softcap, seqlens_q=seqlens_q, seqlens_kv=seqlens_kv, alibi_slopes=alibi_slopes,
                  dropout_p=dropout_p)

    out, lse = _attention(q.double(), k.double(), v.double(), scale, causal, causal_alignment, window, seqlens_q,
                          seqlens_kv, softcap, None, None, None if alibi_slopes is None else alibi_slopes.double())
    return (out.to(q.dtype), lse.float()) if return_lse else out.to(q.dtype)


def test_per_sequence_alibi_slopes_run_one_call_per_sequence(monkeypatch):
    monkeypatch.setattr(fa._st, "attention", _reference)
    gen = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(3, 10, 4, 16, generator=gen) for _ in range(3))
    slopes = torch.rand(3, 4, generator=gen)
    out, lse, _ = fa.flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes, return_attn_probs=True)
    assert out.is_contiguous() and out.shape == (3, 10, 4, 16) and lse.shape == (3, 4, 10)
    for i in range(3):
        want, want_lse, _ = fa.flash_attn_func(q[i:i + 1], k[i:i + 1], v[i:i + 1], causal=True,
                                               alibi_slopes=slopes[i], return_attn_probs=True)
        assert torch.equal(out[i:i + 1], want) and torch.equal(lse[i:i + 1], want_lse)
    qkv = torch.stack([q, k, v], dim=2)
    assert torch.equal(fa.flash_attn_qkvpacked_func(qkv, causal=True, alibi_slopes=slopes), out)


def test_varlen_alibi_runs_on_padded_copies_of_the_sequences(monkeypatch):
    """ALiBi in the varlen functions: the sequences padded, attended with lengths and the slopes,
    gathered back -- against each sequence attended alone (float64 reference in place of cuDNN)."""
    reference = _reference
    monkeypatch.setattr(fa._st, "attention", reference)
    gen = torch.Generator().manual_seed(5)
    lengths, h, d = [3, 7, 1, 5], 4, 16
    cu = torch.tensor([0, 3, 10, 11, 16], dtype=torch.int32)
    total = 18  # two tokens in no sequence
    q, k, v = (torch.randn(total, h, d, generator=gen, requires_grad=True) for _ in range(3))
    slopes = torch.rand(h, generator=gen)
    out, lse, _ = fa.flash_attn_varlen_func(q, k, v, cu, cu, 7, 7, causal=True, alibi_slopes=slopes,
                                            return_attn_probs=True)
    assert out.shape == (total, h, d) and lse.shape == (h, total)
    assert torch.all(out[16:] == 0) and torch.all(lse[:, 16:] == float("-inf")), "tokens in no sequence"
    for i, n in enumerate(lengths):
        rows = slice(int(cu[i]), int(cu[i]) + n)
        one = [t[rows].transpose(0, 1)[None] for t in (q, k, v)]
        want, want_lse = reference(*one, scale=d ** -0.5, causal=True, causal_alignment="bottom_right", window=None,
                                   softcap=None, alibi_slopes=slopes, return_lse=True)
        assert torch.allclose(out[rows], want[0].transpose(0, 1), atol=1e-5), f"sequence {i}"
        assert torch.allclose(lse[:, rows], want_lse[0], atol=1e-5), f"lse of sequence {i}"
    out.sum().backward()
    assert q.grad is not None and torch.all(q.grad[16:] == 0), "gradients flow back through the copies"
    per_sequence = fa.flash_attn_varlen_func(q, k, v, cu, cu, 7, 7, causal=True, alibi_slopes=slopes.expand(4, h))
    assert torch.allclose(per_sequence, out, atol=1e-6), "(batch, nheads) slopes: one call per sequence"


@pytest.mark.parametrize("causal, window", [(True, (-1, -1)), (False, (-1, -1)), (True, (3, 0)), (False, (2, 4))])
def test_alibi_aligned_per_sequence_when_queries_and_keys_differ(monkeypatch, causal, window):
    """ALiBi's distance and masks aligned to each sequence's end (i + L_k - L_q - j), as FlashAttention
    aligns them, where every sequence has its own offset: varlen with different cu_seqlens and a KV
    cache with cache_seqlens. The core refuses that offset (the fake too); the sequences are
    attended back to front, top-left -- against each sequence attended alone, bottom-right."""
    monkeypatch.setattr(fa._st, "attention", _reference)
    gen = torch.Generator().manual_seed(13)
    h, d = 4, 16
    slopes = torch.rand(h, generator=gen)
    options = dict(causal=causal, window_size=window, alibi_slopes=slopes)

    def alone(q, k, v):  # (s, h, d) each
        one = [t.transpose(0, 1)[None] for t in (q, k, v)]
        out, lse = _reference(*one, scale=d ** -0.5, causal=causal, causal_alignment="bottom_right",
                              window=fa._window(window), softcap=None, alibi_slopes=slopes, return_lse=True)
        return out[0].transpose(0, 1), lse[0]

    lengths_q, lengths_k = [2, 5, 1, 4], [6, 5, 9, 4]
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32)
                  for n in (lengths_q, lengths_k))
    q = torch.randn(int(cu_q[-1]), h, d, generator=gen, requires_grad=True)
    k, v = (torch.randn(int(cu_k[-1]), h, d, generator=gen, requires_grad=True) for _ in range(2))
    out, lse, _ = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                            return_attn_probs=True, **options)
    for i in range(len(lengths_q)):
        rows, keys = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        want, want_lse = alone(q[rows], k[keys], v[keys])
        assert torch.allclose(out[rows], want, atol=1e-5), f"varlen sequence {i}"
        assert torch.allclose(lse[:, rows], want_lse, atol=1e-5), f"varlen lse of sequence {i}"
    out.sum().backward()
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in (q, k, v)), "gradients through the reversal"

    b, s_q, capacity = 3, 2, 10
    q = torch.randn(b, s_q, h, d, generator=gen)
    k_cache, v_cache = (torch.randn(b, capacity, h, d, generator=gen) for _ in range(2))
    cached = torch.tensor([3, 8, 0], dtype=torch.int32)
    new = [torch.randn(b, s_q, h, d, generator=gen) for _ in range(2)]
    out, lse = fa.flash_attn_with_kvcache(q, k_cache, v_cache, *new, cache_seqlens=cached,
                                          return_softmax_lse=True, **options)
    for i in range(b):
        n = int(cached[i]) + s_q
        want, want_lse = alone(q[i], k_cache[i, :n], v_cache[i, :n])
        assert torch.allclose(out[i], want, atol=1e-5) and torch.allclose(lse[i], want_lse, atol=1e-5), f"cache {i}"


def _reference_varlen(q, k, v, cu_q, cu_kv, max_q=None, max_kv=None, *, return_lse=False, **options):
    """stridedfa.torch.varlen_attention by the float64 reference, sequence by sequence (on the CPU),
    after the core's verdict on the call: tokens in no sequence, and sequences without keys, get
    out = 0 and lse = -inf."""
    from helpers.core_check import check_forward

    check_forward(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv, max_seqlen_q=max_q, max_seqlen_kv=max_kv,
                  **{name: value for name, value in options.items() if name != "deterministic"})
    cq, ckv = cu_q.tolist(), cu_kv.tolist()
    out = q.new_zeros(q.shape[0], q.shape[1], v.shape[2])
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"))
    for i in range(len(cq) - 1):
        if cq[i + 1] == cq[i] or ckv[i + 1] == ckv[i]:
            continue
        one = [t[c[i]:c[i + 1]].transpose(0, 1)[None] for t, c in ((q, cq), (k, ckv), (v, ckv))]
        o, o_lse = _reference(*one, return_lse=True, **options)
        out[cq[i]:cq[i + 1]], lse[:, cq[i]:cq[i + 1]] = o[0].transpose(0, 1), o_lse[0]
    return (out, lse) if return_lse else out


@pytest.mark.parametrize("alibi", [False, True])
def test_varlen_over_a_paged_cache_equals_the_packed_keys(monkeypatch, alibi):
    """flash_attn_varlen_func with block_table (chunked prefill over paged caches): each sequence's
    keys are the first cu_seqlens_k lengths of its pages -- the result of the same keys packed."""
    monkeypatch.setattr(fa._st, "attention", _reference)
    monkeypatch.setattr(fa._st, "varlen_attention", _reference_varlen)
    gen = torch.Generator().manual_seed(17)
    h, h_kv, d, page, per_seq = 4, 2, 16, 4, 3
    lengths_q, lengths_k = [2, 5, 1], [7, 5, 12]
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32)
                  for n in (lengths_q, lengths_k))
    b = len(lengths_q)
    q = torch.randn(int(cu_q[-1]), h, d, generator=gen)
    dense_k, dense_v = (torch.randn(b, page * per_seq, h_kv, d, generator=gen) for _ in range(2))
    table = torch.randperm(b * per_seq, generator=gen).view(b, per_seq).to(torch.int32)
    k_pages, v_pages = (torch.empty(b * per_seq, page, h_kv, d) for _ in range(2))
    k_pages[table.long()] = dense_k.view(b, per_seq, page, h_kv, d)
    v_pages[table.long()] = dense_v.view(b, per_seq, page, h_kv, d)
    packed_k, packed_v = (torch.cat([t[i, :n] for i, n in enumerate(lengths_k)]) for t in (dense_k, dense_v))
    options = dict(causal=True, window_size=(3, 0), return_attn_probs=True,
                   alibi_slopes=torch.rand(h, generator=gen) if alibi else None)
    spare_columns = torch.randint(0, b * per_seq, (b, 5), generator=gen, dtype=torch.int32)  # past max_seqlen_k
    out, lse, _ = fa.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, max(lengths_q), page * per_seq,
                                            block_table=torch.cat([table, spare_columns], 1), **options)
    want, want_lse, _ = fa.flash_attn_varlen_func(q, packed_k, packed_v, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                                  **options)
    assert out.shape == want.shape and lse.shape == want_lse.shape
    assert torch.allclose(out, want, atol=1e-5) and torch.allclose(lse, want_lse, atol=1e-5)
    with pytest.raises(stridedfa.LayoutError, match="block_table"):
        fa.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, 5, 12, block_table=table.long())


def test_kvcache_alibi_agrees_with_plain_attention_and_copies_only_what_lengths_need(monkeypatch):
    """Zero slopes give the plain result (also with cache_seqlens past the capacity, clamped on both
    paths); a whole cache (no cache_seqlens, nothing appended) is attended in place, no lengths."""
    calls = []

    def spy(q, k, v, **options):
        calls.append((k, options.get("seqlens_kv")))
        return _reference(q, k, v, **options)

    monkeypatch.setattr(fa._st, "attention", spy)
    gen = torch.Generator().manual_seed(19)
    q = torch.randn(2, 2, 2, 8, generator=gen)
    k_cache, v_cache = (torch.randn(2, 10, 2, 8, generator=gen) for _ in range(2))
    for lengths in (torch.tensor([12, 4], dtype=torch.int32), None):
        plain = fa.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, causal=True,
                                           window_size=(3, 0))
        zero = fa.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, causal=True,
                                          window_size=(3, 0), alibi_slopes=torch.zeros(2))
        assert torch.allclose(plain, zero, atol=1e-6), lengths
    assert calls[-1][1] is None and calls[-1][0].data_ptr() == k_cache.data_ptr(), "a whole cache: no copy"


def test_paged_cache_with_alibi_and_lse_gathers_the_pages(monkeypatch):
    """block_table with alibi_slopes or return_softmax_lse (which the paged kernels do not take):
    appended into the pages, the pages gathered, attended densely -- the dense cache's result."""
    monkeypatch.setattr(fa._st, "attention", _reference)
    gen = torch.Generator().manual_seed(11)
    b, s_new, h, h_kv, d, page, pages_per_seq = 2, 2, 4, 2, 16, 4, 3
    q = torch.randn(b, s_new, h, d, generator=gen)
    k_new, v_new = (torch.randn(b, s_new, h_kv, d, generator=gen) for _ in range(2))
    dense_k, dense_v = (torch.randn(b, page * pages_per_seq, h_kv, d, generator=gen) for _ in range(2))
    table = torch.randperm(b * pages_per_seq, generator=gen).view(b, pages_per_seq).to(torch.int32)
    k_pages, v_pages = (torch.empty(b * pages_per_seq, page, h_kv, d) for _ in range(2))
    k_pages[table.long()] = dense_k.view(b, pages_per_seq, page, h_kv, d)
    v_pages[table.long()] = dense_v.view(b, pages_per_seq, page, h_kv, d)
    lengths = torch.tensor([3, 9], dtype=torch.int32)
    slopes = torch.rand(h, generator=gen)
    args = dict(cache_seqlens=lengths, causal=True, alibi_slopes=slopes, return_softmax_lse=True)
    out, lse = fa.flash_attn_with_kvcache(q, k_pages, v_pages, k_new, v_new, block_table=table, **args)
    want, want_lse = fa.flash_attn_with_kvcache(q, dense_k, dense_v, k_new, v_new, **args)
    assert torch.equal(k_pages[table.long()].view(b, -1, h_kv, d), dense_k), "appended into the pages"
    assert torch.allclose(out, want, atol=1e-6) and torch.allclose(lse, want_lse, atol=1e-6)


@pytest.mark.parametrize("bad", ["float", "shape", "int64"])
def test_indices_read_by_torch_ops_are_checked_before_anything_is_written(bad):
    """cache_leftpad and the ALiBi varlen path's cu_seqlens are read by torch ops here, not by the
    core: a wrong dtype or shape is a LayoutError naming the argument, and the cache is untouched."""
    q, cache = torch.zeros(2, 3, 8, 64), torch.zeros(2, 16, 2, 64)
    leftpad = {"float": torch.zeros(2), "shape": torch.zeros(3, dtype=torch.int32),
               "int64": torch.zeros(2, dtype=torch.int64)}[bad]
    new = torch.ones(2, 3, 2, 64)
    with pytest.raises(stridedfa.LayoutError, match="cache_leftpad"):
        fa.flash_attn_with_kvcache(q, cache, cache, new, new, cache_seqlens=4, cache_leftpad=leftpad)
    assert not cache.any(), "nothing appended"
    cu = {"float": torch.tensor([0.0, 3.0]), "shape": torch.zeros(2, 1, dtype=torch.int32),
          "int64": torch.tensor([0, 3])}[bad]
    tokens = torch.zeros(3, 8, 64)
    with pytest.raises(stridedfa.LayoutError, match="cu_seqlens_q"):
        fa.flash_attn_varlen_func(tokens, tokens, tokens, cu, cu, 3, 3, alibi_slopes=torch.zeros(8))


# --- Issue 30: FlashAttention's paged bounds, head dims that are not a multiple of 8 ---------------

@pytest.mark.parametrize("appended", [0, 3])
def test_paged_lengths_past_the_block_table_raise_a_runtime_error_naming_block_table(appended):
    """FlashAttention raises there (its test_flash_attn_kvcache_paged_block_table_bounds); clamping
    would compute on the wrong pages. Nothing is appended before the error."""
    q = torch.zeros(2, 1, 4, 64, dtype=torch.bfloat16)
    pages = torch.zeros(8, 16, 2, 64, dtype=torch.bfloat16)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)  # 32 tokens a sequence
    lengths = torch.tensor([5, 33 - appended], dtype=torch.int32)
    new = torch.ones(2, appended, 2, 64, dtype=torch.bfloat16) if appended else None
    with pytest.raises(RuntimeError, match="block_table") as raised:
        fa.flash_attn_with_kvcache(q, pages, pages.clone(), new, new, cache_seqlens=lengths, block_table=table)
    assert isinstance(raised.value, stridedfa.BoundsError) and isinstance(raised.value, stridedfa.LayoutError)
    assert "33 tokens" in str(raised.value) and "32" in str(raised.value)
    assert not pages.any(), "nothing may be appended before the error"


def test_a_cache_allocated_wider_is_read_in_place_for_a_head_dim_of_59(monkeypatch):
    """head_dim 59 (FlashAttention serves it): a cache whose rows are 64 apart is widened in place
    -- no copy of the cache -- and matches the reference; the new keys land in the caller's columns."""
    calls = []

    def spy(q, k, v, **options):
        calls.append(k)
        return _reference(q, k, v, **options)

    monkeypatch.setattr(fa._st, "attention", spy)
    gen = torch.Generator().manual_seed(5)
    storage = [torch.zeros(2, 12, 2, 64, dtype=torch.float64) for _ in range(2)]
    k_cache, v_cache = (t[..., :59] for t in storage)
    k_cache.copy_(torch.randn(2, 12, 2, 59, generator=gen))
    v_cache.copy_(torch.randn(2, 12, 2, 59, generator=gen))
    q = torch.randn(2, 1, 4, 59, generator=gen, dtype=torch.float64)
    new_k, new_v = (torch.randn(2, 1, 2, 59, generator=gen, dtype=torch.float64) for _ in range(2))
    lengths = torch.tensor([3, 9], dtype=torch.int32)
    out = fa.flash_attn_with_kvcache(q, k_cache, v_cache, new_k, new_v, cache_seqlens=lengths, causal=True)
    assert out.shape == (2, 1, 4, 59)
    assert calls[-1].untyped_storage().data_ptr() == storage[0].untyped_storage().data_ptr(), "read in place"
    assert torch.equal(k_cache[0, 3], new_k[0, 0]) and torch.equal(v_cache[1, 9], new_v[1, 0])
    from helpers.torch_ref import _attention

    for i, n in enumerate((4, 10)):  # the last query of each sequence sees its n keys
        want, _ = _attention(q[i:i + 1].transpose(1, 2), k_cache[i:i + 1, :n].transpose(1, 2),
                             v_cache[i:i + 1, :n].transpose(1, 2), 59 ** -0.5, False, "top_left", None, None, None,
                             None, None, None, None)
        assert torch.allclose(out[i:i + 1], want.transpose(1, 2), atol=1e-9), i


def test_a_packed_cache_of_head_dim_59_is_refused_with_how_to_allocate_one():
    q = torch.zeros(2, 1, 4, 59, dtype=torch.bfloat16)
    cache = torch.zeros(2, 12, 2, 59, dtype=torch.bfloat16)
    with pytest.raises(stridedfa.LayoutError, match=r"torch.zeros\(\.\.\., 64\)\[\.\.\., :59\]"):
        fa.flash_attn_with_kvcache(q, cache, cache.clone(), cache_seqlens=3)
