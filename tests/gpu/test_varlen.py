"""Variable-length (THD) attention against the reference run per sequence (slice, dense attention,
concatenate), on random length mixes that include empty sequences and length 1.

Every case draws fresh inputs. The generic entry points write into NaN-poisoned outputs, so an
element left unwritten shows: tokens in no sequence must hold out = 0, lse = -inf and zero
gradients. The torch entry point (varlen_attention) runs under autograd, torch.compile and CUDA
graphs; views of one packed projection must equal contiguous copies bit for bit.
"""

from __future__ import annotations

import time

import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import stridedfa  # noqa: E402
import stridedfa.torch as st  # noqa: E402
from helpers.checks import assert_bitexact, assert_close, assert_close_to_scale  # noqa: E402
from helpers.torch_ref import torch_reference_all  # noqa: E402

pytestmark = pytest.mark.gpu

# (out atol, grad rel): as tests/gpu/test_variants.py
TOL = {torch.float16: (5e-3, 1e-2), torch.bfloat16: (2.5e-2, 3e-2)}


def cu_of(lengths):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32, device="cuda")


def make(tokens, heads, dim, dtype, layout, gen):
    """A (tokens, heads, dim) tensor in `layout`: "thd" contiguous, "head_major" over (heads, tokens,
    dim) memory, "padded_rows" with a gap after every token."""
    if layout == "thd":
        return torch.randn(tokens, heads, dim, generator=gen, device="cuda").to(dtype)
    if layout == "head_major":
        return torch.randn(heads, tokens, dim, generator=gen, device="cuda").to(dtype).transpose(0, 1)
    if layout == "padded_rows":
        return torch.randn(tokens, heads + 1, dim, generator=gen, device="cuda").to(dtype)[:, :heads]
    raise ValueError(layout)


def reference(q, k, v, grad_out, cu_q, cu_kv, **options):
    """(out, lse (h, tokens), (dq, dk, dv)) in float32, per sequence; tokens in no sequence and
    queries of a sequence with no keys: out 0, lse -inf, zero gradients."""
    total_q, h_q, _ = q.shape
    out = torch.zeros(total_q, h_q, v.shape[2], device="cuda")
    lse = torch.full((h_q, total_q), float("-inf"), device="cuda")
    grads = [torch.zeros(t.shape, device="cuda") for t in (q, k, v)]
    cq, ckv = cu_q.tolist(), cu_kv.tolist()
    for i in range(len(cq) - 1):
        sq, eq, skv, ekv = cq[i], cq[i + 1], ckv[i], ckv[i + 1]
        if eq == sq or ekv == skv:
            continue
        bhsd = [t.transpose(0, 1).unsqueeze(0) for t in (q[sq:eq], k[skv:ekv], v[skv:ekv], grad_out[sq:eq])]
        o, stats, all_grads = torch_reference_all(*bhsd, **options)
        dq, dk, dv = all_grads[:3]  # (with sinks a fourth: theirs)
        out[sq:eq] = o[0].transpose(0, 1)
        lse[:, sq:eq] = stats[0]
        for g, d, (s, e) in zip(grads, (dq, dk, dv), ((sq, eq), (skv, ekv), (skv, ekv))):
            g[s:e] = d[0].transpose(0, 1)
    return out, lse, grads


def random_lengths(n, longest, gen):
    lengths = torch.randint(0, longest + 1, (n,), generator=gen).tolist()
    lengths[0], lengths[-1] = 1, 0  # a length-1 and an empty sequence in every mix
    return lengths


def _contiguous_nan(shape, dtype, name):
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def run_generic(q, k, v, grad_out, cu_q, cu_kv, make_output=_contiguous_nan, q_backward=None, **options):
    """The generic entry points into NaN-poisoned outputs (`make_output(shape, dtype, name)` lays
    out, grad_q, grad_k and grad_v out; grad_q always dense, as the backward needs). The backward
    reads `q_backward` (default q): a q of the same values, dense, where q is not."""
    out = make_output((q.shape[0], q.shape[1], v.shape[2]), q.dtype, "out")
    lse = torch.full((q.shape[0], q.shape[1]), float("nan"), device="cuda").t()
    common = dict(cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv, **options)
    stridedfa.sdpa_forward(q, k, v, out, lse=lse, **common)
    grads = [(_contiguous_nan if name == "grad_q" else make_output)(t.shape, t.dtype, name)
             for name, t in zip(("grad_q", "grad_k", "grad_v"), (q, k, v))]
    stridedfa.sdpa_backward(q if q_backward is None else q_backward, k, v, out, grad_out, lse, *grads, **common)
    return out, lse, grads


CASES = {
    "plain": dict(),
    "causal": dict(causal=True),
    "causal_bottom_right": dict(causal=True, causal_alignment="bottom_right"),
    "window": dict(causal=True, window=(24, None)),
    "window_both_sides": dict(window=(16, 8)),
    "softcap": dict(softcap=20.0, causal=True),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)], ids=["mha", "gqa"])
def test_generic_entry_points_match_the_per_sequence_reference(case, dtype, heads):
    gen = torch.Generator(device="cuda").manual_seed(hash((case, str(dtype), heads)) % 2**31)
    h_q, h_kv = heads
    lengths_q = random_lengths(6, 150, torch.Generator().manual_seed(1))
    lengths_kv = lengths_q if "bottom_right" not in case else [n + 7 * (i % 2) for i, n in enumerate(lengths_q)]
    cu_q, cu_kv = cu_of(lengths_q), cu_of(lengths_kv)
    total_q, total_kv = int(cu_q[-1]) + 5, int(cu_kv[-1]) + 3  # trailing tokens in no sequence
    q = make(total_q, h_q, 64, dtype, "thd", gen)
    k = make(total_kv, h_kv, 64, dtype, "head_major", gen)
    v = make(total_kv, h_kv, 64, dtype, "padded_rows", gen)
    grad_out = make(total_q, h_q, 64, dtype, "thd", gen)
    options = CASES[case]
    out, lse, grads = run_generic(q, k, v, grad_out, cu_q, cu_kv, **options)
    ref_options = {("alignment" if name == "causal_alignment" else name): value for name, value in options.items()}
    ref_out, ref_lse, ref_grads = reference(q, k, v, grad_out, cu_q, cu_kv, **ref_options)
    atol, rel = TOL[dtype]
    assert_close(out, ref_out, atol=atol, name="out")
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite), "lse: -inf exactly where a query sees no key"
    assert_close(lse[finite], ref_lse[finite], atol=atol, name="lse")
    for name, g, r in zip(("grad_q", "grad_k", "grad_v"), grads, ref_grads):
        assert_close_to_scale(g, r, rel=rel, name=name)
        assert_close(g, r, atol=rel * max(r.abs().max().item(), 1e-3) + 1e-3, name=name)


@pytest.mark.parametrize("h_q", [4, 3])
def test_mqa_is_refused_by_the_core_and_repeated_by_the_adapters(h_q):
    """GPU run 39: cuDNN 9.19's varlen backward gets MQA's dK wrong. The generic backward refuses it
    by name (nothing written); stridedfa.torch, CuPy and JAX repeat the one head (to 2, or to h_q
    when 2 does not divide it) and match the per-sequence reference."""
    gen = torch.Generator(device="cuda").manual_seed(37 + h_q)
    cu = cu_of(random_lengths(5, 150, torch.Generator().manual_seed(6)))
    total = int(cu[-1]) + 3
    q, grad_out = (make(total, h_q, 64, torch.bfloat16, "thd", gen) for _ in range(2))
    k, v = (make(total, 1, 64, torch.bfloat16, "thd", gen) for _ in range(2))
    out = torch.full((total, h_q, 64), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((total, h_q), float("nan"), device="cuda").t()
    stridedfa.sdpa_forward(q, k, v, out, lse=lse, cu_seqlens_q=cu, cu_seqlens_kv=cu, causal=True)
    grads = [torch.full(t.shape, float("nan"), dtype=t.dtype, device="cuda") for t in (q, k, v)]
    with pytest.raises(stridedfa.UnsupportedError, match=r"^grad_k: cuDNN 9\.19's variable-length backward"):
        stridedfa.sdpa_backward(q, k, v, out, grad_out, lse, *grads, cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                causal=True)
    torch.cuda.synchronize()
    assert all(torch.isnan(g).all() for g in grads)
    ref_out, _, ref_grads = reference(q, k, v, grad_out, cu, cu, causal=True)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    st.varlen_attention(*leaves, cu, cu, causal=True).backward(grad_out)
    rel = TOL[torch.bfloat16][1]
    for name, leaf, r in zip(("grad_q", "grad_k", "grad_v"), leaves, ref_grads):
        assert_close(leaf.grad, r, atol=rel * max(r.abs().max().item(), 1e-3) + 1e-3, name=f"torch {name}")
    assert_close(out, ref_out, atol=TOL[torch.bfloat16][0], name="out")


def packed_projection(total, h, d, dtype, gen):
    qkv = torch.randn(total, 3, h, d, generator=gen, device="cuda").to(dtype)
    return qkv, qkv[:, 0], qkv[:, 1], qkv[:, 2]


def test_views_in_buffers_of_their_own_equal_contiguous_copies_bitwise():
    """Head-major q (the forward's; the backward reads a dense copy, as it must), k with padded
    rows, v a slice of a wider head axis, grad_out head-major: bit for bit the call on contiguous
    copies."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    cu = cu_of(random_lengths(5, 200, torch.Generator().manual_seed(2)))
    total = int(cu[-1])
    q = make(total, 4, 64, torch.bfloat16, "head_major", gen)
    k = make(total, 4, 64, torch.bfloat16, "padded_rows", gen)
    v = torch.randn(total, 6, 64, generator=gen, device="cuda").to(torch.bfloat16)[:, 1:5]
    grad_out = make(total, 4, 64, torch.bfloat16, "head_major", gen)
    viewed = run_generic(q, k, v, grad_out, cu, cu, q_backward=q.contiguous(), causal=True)
    copied = run_generic(q.contiguous(), k.contiguous(), v.contiguous(), grad_out.contiguous(), cu, cu, causal=True)
    assert_bitexact(viewed[0], copied[0], "out")
    assert_bitexact(viewed[1], copied[1], "lse")
    for name, a, b in zip(("grad_q", "grad_k", "grad_v"), viewed[2], copied[2]):
        assert_bitexact(a, b, name)


def test_views_of_one_projection_equal_copies_and_a_q_view_is_refused_by_the_backward():
    """q, k, v sliced out of one (tokens, 3, h, d) buffer: the forward and, with q dense, the
    backward equal contiguous copies bit for bit (GPU run 37: only q's and dQ's layout matter);
    the backward refuses the q view by name before writing anything."""
    gen = torch.Generator(device="cuda").manual_seed(8)
    for h in (4, 8):
        cu = cu_of([30, 0, 1, 69])
        _, q, k, v = packed_projection(100, h, 64, torch.bfloat16, gen)
        grad_out = make(100, h, 64, torch.bfloat16, "thd", gen)
        viewed = run_generic(q, k, v, grad_out, cu, cu, q_backward=q.contiguous(), causal=True)
        copied = run_generic(q.contiguous(), k.contiguous(), v.contiguous(), grad_out, cu, cu, causal=True)
        for name, a, b in zip(("out", "lse", "grad_q", "grad_k", "grad_v"), [*viewed[:2], *viewed[2]],
                              [*copied[:2], *copied[2]]):
            assert_bitexact(a, b, f"{name} (h = {h})")
        grads = [torch.full(t.shape, float("nan"), dtype=t.dtype, device="cuda") for t in (q, k, v)]
        with pytest.raises(stridedfa.UnsupportedError, match=r"^q: cuDNN's variable-length backward needs q"):
            stridedfa.sdpa_backward(q, k, v, viewed[0], grad_out, viewed[1], *grads, cu_seqlens_q=cu,
                                    cu_seqlens_kv=cu, causal=True)
        torch.cuda.synchronize()
        assert all(torch.isnan(g).all() for g in grads), "nothing written before the refusal"


def test_torch_packed_projection_equals_contiguous_copies_bitwise():
    """varlen_attention reads the projection's views in place (the backward a dense copy of q):
    the result and the projection's gradient equal the call on contiguous copies bit for bit."""
    gen = torch.Generator(device="cuda").manual_seed(9)
    cu = cu_of(random_lengths(6, 150, torch.Generator().manual_seed(5)))
    total = int(cu[-1])
    qkv, _, _, _ = packed_projection(total, 8, 64, torch.bfloat16, gen)
    qkv.requires_grad_()
    grad_out = make(total, 8, 64, torch.bfloat16, "thd", gen)
    out = st.varlen_attention(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu, cu, causal=True)
    out.backward(grad_out)
    parts = [qkv.detach()[:, i].contiguous().requires_grad_() for i in range(3)]
    expected = st.varlen_attention(*parts, cu, cu, causal=True)
    expected.backward(grad_out)
    assert_bitexact(out, expected, "out")
    for i, name in enumerate(("grad_q", "grad_k", "grad_v")):
        assert_bitexact(qkv.grad[:, i], parts[i].grad, name)


def test_torch_autograd_matches_the_reference_with_lse():
    gen = torch.Generator(device="cuda").manual_seed(11)
    cu = cu_of(random_lengths(7, 130, torch.Generator().manual_seed(3)))
    total = int(cu[-1])
    qkv, q, k, v = packed_projection(total, 8, 64, torch.bfloat16, gen)
    qkv.requires_grad_()
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    out, lse = st.varlen_attention(q, k, v, cu, cu, causal=True, return_lse=True)
    assert lse.shape == (8, total) and lse.stride() == (1, 8)
    grad_out = make(total, 8, 64, torch.bfloat16, "thd", gen)
    out.backward(grad_out)
    ref_out, ref_lse, ref_grads = reference(q.detach(), k.detach(), v.detach(), grad_out, cu, cu, causal=True)
    assert_close(out, ref_out, atol=TOL[torch.bfloat16][0], name="out")
    assert_close(lse, ref_lse, atol=TOL[torch.bfloat16][0], name="lse")
    for i, (name, r) in enumerate(zip(("grad_q", "grad_k", "grad_v"), ref_grads)):
        assert_close_to_scale(qkv.grad[:, i], r, rel=TOL[torch.bfloat16][1], name=name)


def test_max_seqlen_bounds_and_a_broken_promise_gives_zeros():
    gen = torch.Generator(device="cuda").manual_seed(13)
    lengths = [40, 100, 7]
    cu = cu_of(lengths)
    q, k, v = (make(147, 4, 64, torch.bfloat16, "thd", gen) for _ in range(3))
    full = st.varlen_attention(q, k, v, cu, cu, causal=True)
    bounded = st.varlen_attention(q, k, v, cu, cu, 100, 100, causal=True)
    assert_bitexact(bounded, full, "out with max_seqlen = the longest")
    short = st.varlen_attention(q, k, v, cu, cu, 50, 50, causal=True)  # the 100-token sequence breaks it
    assert_bitexact(short[:40], full[:40], "the sequences within the promise")
    assert_bitexact(short[140:], full[140:], "the sequences within the promise")
    assert torch.count_nonzero(short[40:140]) == 0, "a sequence longer than max_seqlen is treated as empty"


def test_garbage_cu_seqlens_never_touch_memory_outside_the_buffers():
    """Non-monotonic, negative and past-the-end starts: wrong numbers are the caller's, but nothing
    outside q, k, v and the outputs is read or written (guard regions stay NaN), and the process
    keeps its CUDA context."""
    total, h, d = 64, 2, 64
    guard = torch.full((3 * total, h, d), float("nan"), dtype=torch.bfloat16, device="cuda")
    out = guard[total:2 * total]
    gen = torch.Generator(device="cuda").manual_seed(17)
    q, k, v = (make(total, h, d, torch.bfloat16, "thd", gen) for _ in range(3))
    for starts in ([0, 50, 10, 64], [0, -100, 30, 64], [0, 30, 1000, 2**31 - 1], [5, 3, 2, 1]):
        cu = torch.tensor(starts, dtype=torch.int32, device="cuda")
        stridedfa.sdpa_forward(q, k, v, out, cu_seqlens_q=cu, cu_seqlens_kv=cu)
        torch.cuda.synchronize()
        assert torch.isnan(guard[:total]).all() and torch.isnan(guard[2 * total:]).all(), starts
    assert torch.isfinite(out).all()


def test_cuda_graph_replays_follow_new_cu_seqlens():
    gen = torch.Generator(device="cuda").manual_seed(19)
    total, h, d = 512, 4, 64
    q, k, v = (make(total, h, d, torch.bfloat16, "thd", gen) for _ in range(3))
    cu = cu_of([100, 200, 212])
    st.varlen_attention(q, k, v, cu, cu, causal=True)  # warm: graph built, kernel loaded
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = st.varlen_attention(q, k, v, cu, cu, causal=True)
    for lengths in ([512, 0, 0], [1, 511, 0], [250, 0, 262], [64, 64, 384]):
        cu.copy_(cu_of(lengths))
        graph.replay()
        eager = st.varlen_attention(q, k, v, cu, cu, causal=True)
        assert_bitexact(captured, eager, f"replay with lengths {lengths}")


def test_compiled_fullgraph_does_not_recompile_as_lengths_change():
    import torch._dynamo

    torch._dynamo.reset()
    gen = torch.Generator(device="cuda").manual_seed(23)
    total, h, d = 384, 4, 64
    q, k, v = (make(total, h, d, torch.bfloat16, "thd", gen).requires_grad_() for _ in range(3))

    def step(q, k, v, cu):
        return st.varlen_attention(q, k, v, cu, cu, causal=True)

    compiled = torch.compile(step, fullgraph=True)
    grad_out = make(total, h, d, torch.bfloat16, "thd", gen)
    for lengths in ([100, 284], [384], [1, 2, 381], [50, 50, 284]):
        cu = cu_of(lengths)
        out = compiled(q, k, v, cu)
        grads = torch.autograd.grad(out, (q, k, v), grad_out)
        eager = step(q, k, v, cu)
        eager_grads = torch.autograd.grad(eager, (q, k, v), grad_out)
        assert_bitexact(out, eager, f"out, lengths {lengths}")
        for g, e in zip(grads, eager_grads):
            assert_bitexact(g, e, f"gradient, lengths {lengths}")
    frames = torch._dynamo.utils.counters["frames"]
    assert frames["ok"] <= 2, dict(frames)  # one graph (plus the number of sequences: 2 vs 1 and 3)


def test_a_training_run_over_random_documents_builds_a_bounded_number_of_graphs():
    """1,000 steps of 16k-token batches, documents uniform in [64, 4096] tokens: few graphs, their
    build time reported."""
    gen = torch.Generator().manual_seed(29)
    h, d, total = 4, 64, 16384
    q, k, v = (torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    before = stridedfa.cache_info()
    start = time.perf_counter()
    for _ in range(1000):
        lengths, left = [], total
        while left > 0:
            n = min(int(torch.randint(64, 4097, (1,), generator=gen)), left)
            lengths.append(n)
            left -= n
        cu = cu_of(lengths)
        out = st.varlen_attention(q, k, v, cu, cu, causal=True)
        out.backward(torch.ones_like(out))
    torch.cuda.synchronize()
    after = stridedfa.cache_info()
    built = after["builds"] - before["builds"]
    build_seconds = after["build_seconds"] - before["build_seconds"]
    print(f"\n1,000 varlen training steps: {built} graphs built in {build_seconds:.2f} s, "
          f"{time.perf_counter() - start:.1f} s in all")
    assert built <= 16


def test_dropout_is_reproducible_and_drops_about_p():
    gen = torch.Generator(device="cuda").manual_seed(31)
    cu = cu_of([300, 212])
    total = 512
    q = k = make(total, 4, 64, torch.bfloat16, "thd", gen)
    v = torch.zeros(total, 4, 64, dtype=torch.bfloat16, device="cuda")
    v[:, :, 0] = 1  # out[..., 0] is the kept, rescaled probability mass of each row
    torch.manual_seed(5)
    a = st.varlen_attention(q, k, v, cu, cu, dropout_p=0.25)
    torch.manual_seed(5)
    b = st.varlen_attention(q, k, v, cu, cu, dropout_p=0.25)
    assert_bitexact(a, b, "same seed, same mask")
    mass = a[:, :, 0].float().mean().item()  # E[kept / (1 - p)] = 1
    assert abs(mass - 1.0) < 0.05, mass


def test_deterministic_backward_is_bitwise_reproducible():
    gen = torch.Generator(device="cuda").manual_seed(37)
    cu = cu_of(random_lengths(6, 300, torch.Generator().manual_seed(4)))
    total = int(cu[-1])
    q, k, v = (make(total, 8, 64, torch.bfloat16, "thd", gen).requires_grad_() for _ in range(3))
    grad_out = make(total, 8, 64, torch.bfloat16, "thd", gen)
    results = []
    for _ in range(2):
        out = st.varlen_attention(q, k, v, cu, cu, causal=True, deterministic=True)
        results.append(torch.autograd.grad(out, (q, k, v), grad_out))
    for a, b in zip(*results):
        assert_bitexact(a, b, "deterministic gradient")


def test_fixed_sinks_forward_matches_the_reference():
    gen = torch.Generator(device="cuda").manual_seed(41)
    cu = cu_of([50, 0, 77, 1])
    total = 128
    q, k, v = (make(total, 4, 64, torch.bfloat16, "thd", gen) for _ in range(3))
    sinks = torch.randn(4, generator=gen, device="cuda")
    with torch.no_grad():
        out, lse = st.varlen_attention(q, k, v, cu, cu, causal=True, sinks=sinks, return_lse=True)
    grad_out = torch.zeros_like(q)
    ref_out, ref_lse, _ = reference_with_sinks(q, k, v, grad_out, cu, sinks)
    assert_close(out, ref_out, atol=TOL[torch.bfloat16][0], name="out")
    finite = torch.isfinite(ref_lse)
    assert_close(lse[finite], ref_lse[finite], atol=TOL[torch.bfloat16][0], name="lse")


def reference_with_sinks(q, k, v, grad_out, cu, sinks):
    return reference(q, k, v, grad_out, cu, cu, causal=True, sinks=sinks)


def test_trainable_sinks_are_refused_by_name():
    cu = cu_of([10])
    q = torch.zeros(10, 4, 64, dtype=torch.bfloat16, device="cuda")
    sinks = torch.zeros(4, device="cuda", requires_grad=True)
    with pytest.raises(stridedfa.UnsupportedError, match="sinks' gradient"):
        st.varlen_attention(q, q, q, cu, cu, sinks=sinks)


def generic_case(seed, dtype, kv_layout):
    """GQA 8/2 inputs with trailing tokens in no sequence, and the generic call's causal (out, lse,
    gradients) on them: what the other entry points must equal bit for bit."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    cu = cu_of(random_lengths(5, 120, torch.Generator().manual_seed(seed)))
    total = int(cu[-1]) + 2
    q = make(total, 8, 64, dtype, "thd", gen)
    k, v = (make(total, 2, 64, dtype, kv_layout, gen) for _ in range(2))
    grad_out = make(total, 8, 64, dtype, "thd", gen)
    expected = run_generic(q, k, v, grad_out, cu, cu, causal=True)
    torch.cuda.synchronize()
    return q, k, v, grad_out, cu, expected


def test_cupy_varlen_equals_the_generic_call_bitwise():
    cupy = pytest.importorskip("cupy")
    import stridedfa.cupy as sc

    q, k, v, grad_out, cu, expected = generic_case(43, torch.float16, "head_major")
    as_cupy = [cupy.from_dlpack(t) for t in (q, k, v, grad_out, cu)]
    out, lse = sc.varlen_attention(*as_cupy[:3], as_cupy[4], as_cupy[4], causal=True, return_lse=True)
    grads = sc.varlen_attention_backward(*as_cupy[:3], out, lse, as_cupy[3], as_cupy[4], as_cupy[4], causal=True)
    cupy.cuda.get_current_stream().synchronize()
    assert_bitexact(torch.from_dlpack(out), expected[0], "out")
    assert_bitexact(torch.from_dlpack(lse), expected[1], "lse")
    for name, g, e in zip(("grad_q", "grad_k", "grad_v"), grads, expected[2]):
        assert_bitexact(torch.from_dlpack(g), e, name)


def test_the_torch_operators_pass_opcheck():
    gen = torch.Generator(device="cuda").manual_seed(47)
    cu = cu_of([20, 0, 44])
    q, k, v = (make(64, 4, 64, torch.bfloat16, "thd", gen).requires_grad_() for _ in range(3))
    forward = torch.ops.stridedfa.varlen_forward.default
    args = (q, k, v, cu, cu, 0, 0, None, True, "top_left", -1, -1, None, None, 0.0, None, False)
    torch.library.opcheck(forward, args)


def random_layout(tokens, heads, dim, dtype, rng, gen):
    """(tokens, heads, dim) at random valid strides in a buffer of its own: token-major or
    head-major, with random gaps after the head_dim rows, after each token's heads or between heads
    (multiples of 8 elements: 16-byte strides), and a random 16-byte aligned start."""
    gap = lambda: 8 * rng.randint(0, 2)  # noqa: E731
    d_pad, h_pad, t_pad = dim + gap(), heads + rng.randint(0, 1), gap()
    offset = 8 * rng.randint(0, 3)
    if rng.random() < 0.5:  # token-major: (tokens, heads, dim)
        strides = (h_pad * d_pad + t_pad, d_pad, 1)
    else:  # head-major: (heads, tokens, dim)
        strides = (d_pad, tokens * d_pad + t_pad, 1)
    size = offset + sum((n - 1) * s for n, s in zip((tokens, heads, dim), strides)) + 1
    buffer = torch.randn(size, generator=gen, device="cuda").to(dtype)
    return buffer.as_strided((tokens, heads, dim), strides, offset)


FUZZ_CASES = int(__import__("os").environ.get("STRIDEDFA_VARLEN_FUZZ", "24"))


@pytest.mark.parametrize("seed", range(FUZZ_CASES))
def test_fuzzed_token_and_head_strides_match_the_reference_and_contiguous_copies(seed):
    """Random lengths (empty and length-1 sequences included), heads, options and strides for every
    operand and gradient: the per-sequence reference, and contiguous copies bit for bit."""
    import random

    rng = random.Random(seed)
    gen = torch.Generator(device="cuda").manual_seed(1000 + seed)
    dtype = rng.choice([torch.bfloat16, torch.float16])
    h_kv = rng.choice([1, 2, 4])
    h_q = h_kv * rng.choice([1, 2])
    d = rng.choice([64, 128])
    n = rng.randint(1, 6)
    lengths_q = [rng.choice([0, 1, rng.randint(2, 200)]) for _ in range(n)]
    lengths_kv = lengths_q if rng.random() < 0.6 else [rng.choice([0, 1, rng.randint(2, 200)]) for _ in range(n)]
    cu_q, cu_kv = cu_of(lengths_q), cu_of(lengths_kv)
    total_q, total_kv = int(cu_q[-1]) + rng.randint(0, 3), int(cu_kv[-1]) + rng.randint(0, 3)
    if total_q == 0 or total_kv == 0:
        total_q, total_kv = total_q + 1, total_kv + 1
    options = rng.choice([dict(), dict(causal=True), dict(causal=True, causal_alignment="bottom_right"),
                          dict(window=(rng.randint(0, 64), rng.randint(0, 64))), dict(softcap=30.0)])
    q = random_layout(total_q, h_q, d, dtype, rng, gen)
    k = random_layout(total_kv, h_kv, d, dtype, rng, gen)
    v = random_layout(total_kv, h_kv, d, dtype, rng, gen)
    grad_out = random_layout(total_q, h_q, d, dtype, rng, gen)
    def make_output(shape, dtype, name):  # outputs at random strides too (token-major for GQA's dK, dV;
        # grad_q is dense: the backward needs it so)
        while True:
            t = random_layout(*shape, dtype, rng, gen).fill_(float("nan"))
            if h_q == h_kv or name not in ("grad_k", "grad_v") or t.stride(0) >= t.shape[1] * t.stride(1):
                return t

    try:
        out, lse, grads = run_generic(q, k, v, grad_out, cu_q, cu_kv, make_output, q_backward=q.contiguous(),
                                      **options)
    except stridedfa.UnsupportedError as refused:  # named refusals are allowed; say which
        pytest.skip(f"refused by name: {refused}")
    if not q.is_contiguous():  # the backward refuses the q view itself by name, writing nothing
        poisoned = [torch.full(t.shape, float("nan"), dtype=t.dtype, device="cuda") for t in (q, k, v)]
        with pytest.raises(stridedfa.UnsupportedError, match=r"^q: cuDNN's variable-length backward"):
            stridedfa.sdpa_backward(q, k, v, out, grad_out, lse, *poisoned, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv,
                                    **options)
        assert all(torch.isnan(g).all() for g in poisoned)
    ref_options = {("alignment" if name == "causal_alignment" else name): value for name, value in options.items()}
    ref_out, ref_lse, ref_grads = reference(q, k, v, grad_out, cu_q, cu_kv, **ref_options)
    atol, rel = TOL[dtype]
    assert_close(out, ref_out, atol=atol, name="out")
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite), "lse: -inf exactly where a query sees no key"
    for name, g, r in zip(("grad_q", "grad_k", "grad_v"), grads, ref_grads):
        assert_close(g, r, atol=rel * max(r.abs().max().item(), 1e-3) + 1e-3, name=name)
    copied = run_generic(q.contiguous(), k.contiguous(), v.contiguous(), grad_out.contiguous(), cu_q, cu_kv,
                         **options)
    assert_bitexact(out, copied[0], "out vs contiguous copies")
    for name, a, b in zip(("grad_q", "grad_k", "grad_v"), grads, copied[2]):
        assert_bitexact(a, b, f"{name} vs contiguous copies")


def test_jax_varlen_equals_the_generic_call_bitwise():
    """stridedfa.jax.varlen_attention (its first public THD attention) under jit and grad: out,
    lse and the gradients of the same problem bit for bit the generic call's."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    import stridedfa.jax as sj

    q, k, v, grad_out, cu, expected = generic_case(53, torch.bfloat16, "thd")
    to_jax = [jnp.asarray(t.float().cpu().numpy()).astype(jnp.bfloat16) for t in (q, k, v, grad_out)]
    cu_jax = jnp.asarray(cu.cpu().numpy())

    @jax.jit
    def forward_and_grads(q, k, v, cu, grad_out):
        (out, lse), vjp = jax.vjp(lambda q, k, v: sj.varlen_attention(q, k, v, cu, cu, causal=True,
                                                                      return_lse=True), q, k, v)
        return out, lse, vjp((grad_out, jnp.zeros_like(lse)))

    out, lse, grads = forward_and_grads(*to_jax[:3], cu_jax, to_jax[3])
    back = lambda x: torch.from_numpy(__import__("numpy").asarray(x.astype(jnp.float32))).cuda()  # noqa: E731
    assert_bitexact(back(out), expected[0].float(), "out")
    assert_bitexact(back(lse), expected[1].t().contiguous(), "lse (tokens, heads)")
    for name, g, e in zip(("grad_q", "grad_k", "grad_v"), grads, expected[2]):
        assert_bitexact(back(g), e.float(), name)


def test_the_dispatcher_serves_any_producer_and_torch():
    from helpers.producers import Producer

    gen = torch.Generator(device="cuda").manual_seed(59)
    cu = cu_of(random_lengths(4, 100, torch.Generator().manual_seed(8)))
    total = int(cu[-1]) + 1
    q, k, v = (make(total, 4, 64, torch.bfloat16, "thd", gen) for _ in range(3))
    expected = run_generic(q, k, v, torch.zeros_like(q), cu, cu, causal=True)
    out, lse = stridedfa.varlen_attention(*(Producer(t) for t in (q, k, v, cu, cu)), causal=True, return_lse=True)
    torch.cuda.synchronize()
    assert_bitexact(torch.from_dlpack(out), expected[0], "out through a generic producer")
    assert_bitexact(torch.from_dlpack(lse), expected[1], "lse through a generic producer")
    assert_bitexact(stridedfa.varlen_attention(q, k, v, cu, cu, causal=True), expected[0], "out through torch")


class _TinyTransformer(torch.nn.Module):
    """One causal attention block over token ids: embedding, fused qkv projection, attention,
    output projection, a tied read-out. `attend(q, k, v)` is the attention over (tokens, h, d)."""

    def __init__(self, vocab=97, width=256, heads=4):
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Embedding(vocab, width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)

    def forward(self, tokens, targets, attend):
        x = self.embed(tokens)
        qkv = self.qkv(x).view(tokens.shape[0], 3, self.heads, -1)
        y = attend(qkv[:, 0], qkv[:, 1], qkv[:, 2]).reshape(tokens.shape[0], -1)
        x = x + self.proj(y)
        return torch.nn.functional.cross_entropy((x @ self.embed.weight.t()).float(), targets, reduction="sum")


def test_a_transformer_on_packed_documents_equals_it_per_document():
    """Loss and every parameter's gradient of a small model on packed documents (varlen_attention,
    q/k/v slices of its fused projection) equal those of the same model run document by document
    (stridedfa.torch.attention on each), summed."""
    torch.manual_seed(61)
    model = _TinyTransformer().cuda().to(torch.bfloat16)
    lengths = [37, 1, 120, 64, 5]
    tokens = torch.randint(0, 97, (sum(lengths),), device="cuda")
    targets = torch.randint(0, 97, (sum(lengths),), device="cuda")
    cu = cu_of(lengths)
    packed_loss = model(tokens, targets, lambda q, k, v: st.varlen_attention(q, k, v, cu, cu, causal=True))
    packed_grads = torch.autograd.grad(packed_loss, list(model.parameters()))
    per_document_loss = 0
    start = 0
    for n in lengths:  # each document alone: its own dense (1, h, n, d) attention
        doc, doc_targets = tokens[start:start + n], targets[start:start + n]
        loss = model(doc, doc_targets, lambda q, k, v: st.attention(*(t.transpose(0, 1)[None] for t in (q, k, v)),
                                                      causal=True)[0].transpose(0, 1))
        per_document_loss = per_document_loss + loss
        start += n
    per_document_grads = torch.autograd.grad(per_document_loss, list(model.parameters()))
    assert abs(packed_loss.item() - per_document_loss.item()) <= 1e-2 * abs(per_document_loss.item())
    for (name, _), a, b in zip(model.named_parameters(), packed_grads, per_document_grads):
        assert_close_to_scale(a.float(), b.float(), rel=3e-2, name=name)


@pytest.mark.parametrize("dim", [1, 2])
def test_the_packed_varlen_entry_point_equals_separate_tensors_bitwise(dim):
    gen = torch.Generator(device="cuda").manual_seed(67 + dim)
    cu = cu_of(random_lengths(5, 90, torch.Generator().manual_seed(9)))
    total = int(cu[-1])
    shape = (total, 3, 4, 64) if dim == 1 else (total, 4, 3, 64)
    packed = torch.randn(shape, generator=gen, device="cuda").to(torch.bfloat16).requires_grad_()
    grad_out = make(total, 4, 64, torch.bfloat16, "thd", gen)
    out = st.varlen_packed_attention(packed, dim, cu, causal=True)
    out.backward(grad_out)
    parts = [t.detach().contiguous().requires_grad_() for t in packed.unbind(dim)]
    expected = st.varlen_attention(*parts, cu, cu, causal=True)
    expected.backward(grad_out)
    assert_bitexact(out, expected, "out")
    for i, part in enumerate(parts):
        assert_bitexact(packed.grad.select(dim, i), part.grad, f"gradient {i}")


def test_the_kv_packed_varlen_entry_point_equals_separate_tensors_bitwise():
    """k and v packed along dim 1 with q apart: the eager backward writes dK and dV into one
    gradient buffer of packed's shape (and q's gradient apart), equal bit for bit to separate
    tensors; create_graph=True takes the operators and gives the same gradients."""
    gen = torch.Generator(device="cuda").manual_seed(83)
    cu = cu_of(random_lengths(4, 70, torch.Generator().manual_seed(11)))
    total = int(cu[-1])
    kv = torch.randn(total, 2, 4, 64, generator=gen, device="cuda").to(torch.bfloat16).requires_grad_()
    q = make(total, 4, 64, torch.bfloat16, "thd", gen).requires_grad_()
    grad_out = make(total, 4, 64, torch.bfloat16, "thd", gen)
    out = st.varlen_packed_attention(kv, 1, cu, q=q, causal=True, window=(17, 0))
    out.backward(grad_out)
    assert kv.grad.shape == kv.shape and kv.grad.is_contiguous()
    parts = [t.detach().contiguous().requires_grad_() for t in (q, *kv.unbind(1))]
    expected = st.varlen_attention(*parts, cu, cu, causal=True, window=(17, 0))
    expected.backward(grad_out)
    assert_bitexact(out, expected, "out")
    assert_bitexact(q.grad, parts[0].grad, "grad_q")
    for i in range(2):
        assert_bitexact(kv.grad.select(1, i), parts[1 + i].grad, f"gradient {i} of kv")
    again = st.varlen_packed_attention(kv, 1, cu, q=q, causal=True, window=(17, 0))
    grads = torch.autograd.grad(again, (kv, q), grad_out, create_graph=True)
    assert_bitexact(grads[0], kv.grad, "kv gradient with create_graph")
    assert_bitexact(grads[1], q.grad, "q gradient with create_graph")


def test_queries_of_a_sequence_without_keys_get_zeros_and_minus_infinity():
    """lengths_q (5, 7), lengths_kv (0, 9): the first sequence's queries see no key -- out 0, lse
    -inf, zero dq, as for tokens in no sequence; the second matches the reference."""
    gen = torch.Generator(device="cuda").manual_seed(71)
    cu_q, cu_kv = cu_of([5, 7]), cu_of([0, 9])
    q, grad_out = (make(12, 4, 64, torch.bfloat16, "thd", gen) for _ in range(2))
    k, v = (make(9, 4, 64, torch.bfloat16, "thd", gen) for _ in range(2))
    out, lse, (dq, dk, dv) = run_generic(q, k, v, grad_out, cu_q, cu_kv)
    assert torch.count_nonzero(out[:5]) == 0 and torch.isneginf(lse[:, :5]).all()
    assert torch.count_nonzero(dq[:5]) == 0
    ref_out, ref_lse, ref_grads = reference(q, k, v, grad_out, cu_q, cu_kv)
    assert_close(out, ref_out, atol=TOL[torch.bfloat16][0], name="out")
    for name, g, r in zip(("grad_q", "grad_k", "grad_v"), (dq, dk, dv), ref_grads):
        assert_close_to_scale(g, r, rel=TOL[torch.bfloat16][1], name=name)
