"""A prefix and a tail (call_plan.cpp, plan_prefix_tail): a paged causal (bottom-right) step of 5-8
queries per sequence at batch >= 2 (3-8 at batch >= 32) over a cache of >= 2048 keys (its table's
capacity) runs as one paged graph of one-query sequences -- per entry the prefix every token sees,
its tokens folded into the query heads, and one short tail per token, its table row shifted to the
prefix's end -- merged by their log-sum-exp. Each test also runs with the split described by rows (a
key head's group x tokens as the general kernel's query rows, `_decode_prefix_tail_rows`), which
takes 3-16 queries. Against the fp64 reference on the gathered cache and the same call on cuDNN's
general kernel (the split switched off), outputs poisoned first; the prefix boundary (a multiple of
the block size at most L - s_q) is crossed by the lengths chosen; tokens that see no key get out 0,
lse -inf."""

from __future__ import annotations

import random

import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import stridedfa  # noqa: E402
from helpers.checks import assert_close  # noqa: E402
from helpers.switches import switched  # noqa: E402
from helpers.torch_ref import torch_reference  # noqa: E402
from stridedfa import _core  # noqa: E402

pytestmark = pytest.mark.gpu

BLOCK, BLOCKS, H_Q, H_KV, D = 16, 136, 8, 2, 128  # 2,176 keys per entry: a table declared 256 wide
FULL = BLOCKS * BLOCK


@pytest.fixture(params=["heads", "rows"])
def prefix_tail(request):
    """Both descriptions of the split: the folded tokens as heads of one query (the default) or, with
    the group, as the general kernel's query rows (_decode_prefix_tail_rows, off by default)."""
    with switched(_core._decode_prefix_tail, True), switched(_core._decode_prefix_tail_rows, request.param == "rows"):
        yield request.param


def make_cache(b, gen, head_major=False, spare=7):
    blocks = b * BLOCKS + spare
    cache = torch.randn(blocks, 2, BLOCK, H_KV, D, generator=gen, device="cuda").to(torch.bfloat16)
    if head_major:  # (blocks, h_kv, block, d) memory
        cache = cache.permute(0, 1, 3, 2, 4).contiguous().permute(0, 1, 3, 2, 4)
    table = torch.randperm(blocks, generator=torch.Generator().manual_seed(b * 31 + spare))[:b * BLOCKS]
    return cache[:, 0].transpose(1, 2), cache[:, 1].transpose(1, 2), table.view(b, BLOCKS).to(torch.int32).cuda()


def gathered(cache, table):
    b = table.shape[0]
    return cache[table.long()].permute(0, 2, 1, 3, 4).reshape(b, H_KV, FULL, D)


def reference(q, k_cache, v_cache, table, seqlens, **mask):
    b, _, s_q, _ = q.shape
    return torch_reference(q, gathered(k_cache, table), gathered(v_cache, table), causal=True,
                           alignment="bottom_right", softcap=mask.get("softcap"), sinks=mask.get("sinks"),
                           seqlens_q=torch.full((b,), s_q, dtype=torch.int32, device="cuda"), seqlens_kv=seqlens)


# Lengths around the prefix's end P = floor((L - s_q) / 16) x 16 (with 8 queries, 24 puts it right
# before the first token's last key, 25 one key earlier), the full cache, and short caches where early
# tokens see no key (0, 1, 7 < s_q).
LENGTHS = [FULL, 2000, 16 + 8, 17 + 8, 0, 1, 7, 1023, 1500, FULL - 3]


def assert_split(q, k_cache, v_cache, out, table, seqlens):
    """The call is planned as the split (another graph than with the split off), so the test checks it."""
    def key():
        return _core._forward_graph_key(q, k_cache, v_cache, out, block_table=table, seqlens_kv=seqlens, causal=True,
                                        causal_alignment="bottom_right")
    with switched(_core._decode_prefix_tail, False), switched(_core._decode_by_tokens, False):
        general = key()
    assert key() != general, "not planned as a prefix + tail split"


@pytest.mark.parametrize("b, s_q", [(2, 5), (3, 8), (8, 8), (4, 6), (32, 3), (32, 4)])
@pytest.mark.parametrize("layout", ["head_major", "token_major"])
def test_prefix_and_tail_match_the_reference(b, s_q, layout, prefix_tail):
    gen = torch.Generator(device="cuda").manual_seed(300 + b * 17 + s_q)
    k_cache, v_cache, table = make_cache(b, gen, head_major=layout == "head_major")
    lengths = [LENGTHS[(i * 3 + s_q) % len(LENGTHS)] for i in range(b)]
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    if layout == "token_major":  # (b, s, h, d) memory, as a projection gives it
        q = torch.randn(b, s_q, H_Q, D, generator=gen, device="cuda").to(torch.bfloat16).transpose(1, 2)
        out = torch.full((b, s_q, H_Q, D), float("nan"), device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        lse = torch.full((b, s_q, H_Q), float("nan"), device="cuda").transpose(1, 2)
    else:
        q = torch.randn(b, H_Q, s_q, D, generator=gen, device="cuda").to(torch.bfloat16)
        out = torch.full_like(q, float("nan"))
        lse = torch.full((b, H_Q, s_q), float("nan"), device="cuda")
    assert_split(q, k_cache, v_cache, out, table, seqlens)
    stridedfa.sdpa_forward(q, k_cache, v_cache, out, lse=lse, block_table=table, seqlens_kv=seqlens, causal=True,
                           causal_alignment="bottom_right")
    ref_out, ref_lse = reference(q, k_cache, v_cache, table, seqlens)
    assert_close(out, ref_out, atol=2.5e-2, name=f"out, lengths {lengths}")
    assert_close(lse, ref_lse, atol=2e-3, name=f"lse, lengths {lengths}")
    with switched(_core._decode_prefix_tail, False):  # cuDNN's general kernel agrees
        general = torch.full_like(out, float("nan"))
        stridedfa.sdpa_forward(q, k_cache, v_cache, general, block_table=table, seqlens_kv=seqlens, causal=True,
                               causal_alignment="bottom_right")
    seen = ref_lse.isfinite().unsqueeze(-1).expand_as(out)
    assert_close(out[seen], general[seen], atol=2e-2, name="out vs the general kernel")


@pytest.mark.parametrize("b, s_q", [(8, 3), (8, 16), (2, 12), (5, 9), (1, 8), (1, 16)])
@pytest.mark.parametrize("layout", ["head_major", "token_major"])
def test_rows_take_3_to_16_queries(b, s_q, layout):
    """Described by rows, the split also takes 3-4 queries below batch 32, 9-16 queries and one entry;
    at these batches (2 key heads) its prefix is cut into 2-8 chunks."""
    with switched(_core._decode_prefix_tail, True), switched(_core._decode_prefix_tail_rows, True):
        test_prefix_and_tail_match_the_reference(b, s_q, layout, "rows")


@pytest.mark.parametrize("extra", ["softcap", "sinks", "no_lse", "fp16"])
def test_variants_match_the_reference(extra, prefix_tail):
    """Softcap (cuDNN's, in both parts), sinks (the merge's, once per row), no lse asked for, float16."""
    b, s_q = 3, 8
    gen = torch.Generator(device="cuda").manual_seed(77)
    k_cache, v_cache, table = make_cache(b, gen)
    dtype = torch.float16 if extra == "fp16" else torch.bfloat16
    k_cache, v_cache = k_cache.to(dtype), v_cache.to(dtype)
    seqlens = torch.tensor([FULL, 1500, 40], dtype=torch.int32, device="cuda")  # every token sees a key
    q = torch.randn(b, H_Q, s_q, D, generator=gen, device="cuda").to(dtype)
    out = torch.full_like(q, float("nan"))
    lse = None if extra == "no_lse" else torch.full((b, H_Q, s_q), float("nan"), device="cuda")
    mask = {"softcap": 20.0} if extra == "softcap" else {}
    if extra == "sinks":
        mask["sinks"] = 2.0 * torch.randn(H_Q, generator=gen, device="cuda")
    stridedfa.sdpa_forward(q, k_cache, v_cache, out, lse=lse, block_table=table, seqlens_kv=seqlens, causal=True,
                           causal_alignment="bottom_right", **mask)
    ref_out, ref_lse = reference(q, k_cache, v_cache, table, seqlens, **mask)
    assert_close(out, ref_out, atol=2.5e-2, name="out")
    if lse is not None:
        assert_close(lse, ref_lse, atol=2e-3, name="lse")


def test_a_growing_cache_reuses_the_graph(prefix_tail):
    """Lengths, prefixes and the tails' shifted rows are made on the device: one graph for every length."""
    b, s_q = 2, 6
    gen = torch.Generator(device="cuda").manual_seed(8)
    k_cache, v_cache, table = make_cache(b, gen)
    q = torch.randn(b, H_Q, s_q, D, generator=gen, device="cuda").to(torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    step = dict(block_table=table, causal=True, causal_alignment="bottom_right")
    stridedfa.sdpa_forward(q, k_cache, v_cache, out, seqlens_kv=torch.full((b,), 100, dtype=torch.int32,
                                                                            device="cuda"), **step)
    builds = stridedfa.cache_info()["builds"]
    for length in range(101, FULL, 97):
        seqlens = torch.full((b,), length, dtype=torch.int32, device="cuda")
        stridedfa.sdpa_forward(q, k_cache, v_cache, out, seqlens_kv=seqlens, **step)
    assert stridedfa.cache_info()["builds"] == builds
    ref, _ = reference(q, k_cache, v_cache, table, seqlens)
    assert_close(out, ref, atol=2.5e-2, name="out")


def test_random_strides_match_the_reference(prefix_tail):
    """Fuzz: q, out and lse in random memory orders and paddings, the cache token- or head-major,
    random lengths (0 included), 5-8 queries (3-8 at batch 32), with or without an lse."""
    rng = random.Random(20261208)
    gen = torch.Generator(device="cuda").manual_seed(20261208)
    refused = []
    for trial in range(24):
        b = rng.choice((2, 3, 32))
        s_q = rng.randint(3 if b >= 32 else 5, 8)
        k_cache, v_cache, table = make_cache(b, gen, head_major=rng.random() < 0.5, spare=rng.choice((0, 5)))
        lengths = [rng.choice((0, 1, s_q, rng.randint(1, FULL), FULL)) for _ in range(b)]
        seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
        order = rng.sample(range(3), 3)  # the memory order of (b, h, s); d innermost

        def strided(shape, fill, order=order):
            lead = [shape[axis] + rng.choice((0, 0, 1, 3)) for axis in order]
            inner = list(shape[3:])
            memory = (torch.full(lead + inner, float("nan"), device="cuda", dtype=torch.bfloat16 if inner
                                 else torch.float32) if fill == "nan"
                      else torch.randn(lead + inner, generator=gen, device="cuda").to(torch.bfloat16))
            view = memory[tuple(slice(0, shape[axis]) for axis in order)]
            return view.permute([order.index(axis) for axis in range(3)] + list(range(3, len(shape))))

        q = strided((b, H_Q, s_q, D), "randn")
        out = strided((b, H_Q, s_q, D), "nan")
        lse = strided((b, H_Q, s_q), "nan") if rng.random() < 0.7 else None
        layout = f"trial {trial}: b={b} s_q={s_q} lengths={lengths} q{q.stride()} out{out.stride()} " \
                 f"lse{None if lse is None else lse.stride()} k{k_cache.stride()}"
        try:
            assert_split(q, k_cache, v_cache, out, table, seqlens)
            stridedfa.sdpa_forward(q, k_cache, v_cache, out, lse=lse, block_table=table, seqlens_kv=seqlens,
                                   causal=True, causal_alignment="bottom_right")
        except stridedfa.UnsupportedError as error:  # a layout refused (an lse cuDNN cannot take): before writing
            assert out.isnan().all() and (lse is None or lse.isnan().all()), f"refused but wrote, {layout}: {error}"
            refused.append(f"{layout}: {error}")
            continue
        ref_out, ref_lse = reference(q, k_cache, v_cache, table, seqlens)
        assert_close(out, ref_out, atol=2.5e-2, name=f"out, {layout}")
        if lse is not None:
            assert_close(lse, ref_lse, atol=2e-3, name=f"lse, {layout}")
    assert len(refused) <= 6, "most layouts were refused:\n" + "\n".join(refused)


def test_every_entry_point(prefix_tail):
    """torch's adapter eager, torch.compile'd (fullgraph) and replayed from a CUDA graph with new
    cached lengths, CuPy, JAX under jit: the launch's scratch (the copied queries, partials and tail
    rows) comes from each framework's allocator; each result against the reference."""
    import numpy as np

    import stridedfa.torch as st

    b, s_q = 3, 8
    gen = torch.Generator(device="cuda").manual_seed(41)
    k_cache, v_cache, table = make_cache(b, gen)
    q = torch.randn(b, s_q, H_Q, D, generator=gen, device="cuda").to(torch.bfloat16).transpose(1, 2)
    lengths = torch.tensor([FULL, 2001, 30], dtype=torch.int32, device="cuda")
    ref, _ = reference(q, k_cache, v_cache, table, lengths)

    def step(q, k_cache, v_cache, table, lengths):
        return st.attention_with_kvcache(q, k_cache, v_cache, table, lengths)

    assert_close(step(q, k_cache, v_cache, table, lengths), ref, atol=2.5e-2, name="torch eager")
    compiled = torch.compile(step, fullgraph=True)
    assert_close(compiled(q, k_cache, v_cache, table, lengths), ref, atol=2.5e-2, name="torch.compile")
    static = lengths.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(q, k_cache, v_cache, table, static)
    for new in ([2100, 40, FULL], [9, FULL, 1500]):
        static.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        replay_ref, _ = reference(q, k_cache, v_cache, table, static)
        assert_close(captured, replay_ref, atol=2.5e-2, name=f"CUDA-graph replay, lengths {new}")

    try:
        import cupy as cp
    except ImportError:
        cp = None
    if cp is not None:
        import stridedfa.cupy as sc

        torch.cuda.synchronize()
        out = sc.paged_attention(*(cp.from_dlpack(t) for t in (q, k_cache, v_cache, table, lengths)))
        cp.cuda.get_current_stream().synchronize()
        assert_close(torch.from_dlpack(out), ref, atol=2.5e-2, name="cupy")

    try:
        import jax
        import jax.numpy as jnp

        jax.devices("gpu")
    except (ImportError, RuntimeError):
        return
    import stridedfa.jax as sj

    def to_jax(t):
        return jnp.asarray(t.float().cpu().numpy()).astype(jnp.bfloat16) if t.is_floating_point() \
            else jnp.asarray(t.cpu().numpy())

    q_j, k_j, v_j = (to_jax(t.transpose(1, 2)) for t in (q, k_cache, v_cache))  # bshd
    out_j = jax.jit(sj.paged_attention)(q_j, k_j, v_j, to_jax(table), to_jax(lengths))
    out = torch.from_numpy(np.asarray(out_j.astype("float32"))).cuda().transpose(1, 2)
    assert_close(out, ref, atol=2.5e-2, name="jax jit")
