"""Paged KV caches in every entry point: the options (window, softcap, both alignments) over caches
at fuzzed strides, torch.compile(fullgraph=True) and CUDA-graph replays of a decode step with the
cached lengths changing, CuPy, and JAX (jit, the append with donated caches, vmap). Each result
against stridedfa's fp32-class reference on the gathered contiguous cache; outputs the caller gives
are NaN-poisoned first."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import stridedfa  # noqa: E402
from helpers.checks import assert_close  # noqa: E402
from helpers.torch_ref import torch_reference  # noqa: E402

pytestmark = pytest.mark.gpu

ATOL = {torch.bfloat16: 2.5e-2, torch.float16: 5e-3}


def random_cache(rng, num_blocks, block, h_kv, d, dtype, order, pad):
    """k and v caches, logical (num_blocks, h_kv, block, d), in one of the memory orders serving
    engines use: "bshd" (FlashAttention/vLLM: token-major in a block), "bhsd" (head-major), or
    "kv_packed" (K and V interleaved per block in one allocation); `pad` extra elements per row."""
    def fresh(shape):
        return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)).to("cuda", dtype)
    if order == "kv_packed":
        buffer = fresh((num_blocks, 2, block, h_kv, d + pad))[..., :d]
        return buffer[:, 0].transpose(1, 2), buffer[:, 1].transpose(1, 2)
    if order == "bshd":
        return tuple(fresh((num_blocks, block, h_kv, d + pad))[..., :d].transpose(1, 2) for _ in range(2))
    return tuple(fresh((num_blocks, h_kv, block, d + pad))[..., :d] for _ in range(2))


def gathered(cache, table):
    """(b, h_kv, blocks * block, d): each sequence's blocks, one after another."""
    b, blocks = table.shape
    _, h, block, d = cache.shape
    return cache[table.long()].permute(0, 2, 1, 3, 4).reshape(b, h, blocks * block, d)


def reference(q, k_cache, v_cache, table, lengths, **options):
    seqlens_q = torch.full((q.shape[0],), q.shape[2], dtype=torch.int32, device="cuda")
    ref, _ = torch_reference(q, gathered(k_cache, table), gathered(v_cache, table), seqlens_q=seqlens_q,
                             seqlens_kv=lengths, **options)
    return ref


def case(seed, dtype=torch.bfloat16, b=None, s_q=None, order=None):
    rng = np.random.default_rng(seed)
    b = b or int(rng.integers(1, 6))
    h_kv = int(rng.choice([1, 2, 4]))
    h_q = h_kv * int(rng.choice([1, 2, 4]))
    d = int(rng.choice([64, 128]))
    block = int(rng.choice([16, 32, 64]))
    blocks = int(rng.integers(1, 6))
    num_blocks = b * blocks + int(rng.integers(0, 8))
    s_q = s_q or int(rng.choice([1, 1, 3, 16]))
    order = order or str(rng.choice(["bshd", "bhsd", "kv_packed"]))
    k_cache, v_cache = random_cache(rng, num_blocks, block, h_kv, d, dtype, order, int(rng.choice([0, 8])))
    table = torch.from_numpy(rng.permutation(num_blocks)[:b * blocks].reshape(b, blocks).astype(np.int32)).cuda()
    lengths = torch.from_numpy(rng.integers(s_q, blocks * block + 1, b).astype(np.int32)).cuda()
    q_memory = rng.choice(["bshd", "bhsd"])
    q = torch.from_numpy(rng.standard_normal((b, s_q, h_q, d) if q_memory == "bshd" else (b, h_q, s_q, d),
                                             dtype=np.float32)).to("cuda", dtype)
    q = q.transpose(1, 2) if q_memory == "bshd" else q
    return q, k_cache, v_cache, table, lengths, f"b{b} hq{h_q} hkv{h_kv} d{d} block{block}x{blocks} sq{s_q} {order}"


OPTIONS = [
    ("causal_br", dict(causal=True, causal_alignment="bottom_right")),
    ("causal_br_window", dict(causal=True, causal_alignment="bottom_right", window=(47, 0))),
    ("softcap", dict(causal=True, causal_alignment="bottom_right", softcap=20.0)),
    ("no_mask", dict(causal=False)),
]


@pytest.mark.parametrize("name, options", OPTIONS, ids=[o[0] for o in OPTIONS])
def test_options_over_fuzzed_cache_strides(name, options):
    """The generic entry point over caches in random memory orders, padded rows and q at either
    order, into NaN-poisoned outputs: equal to the reference on the gathered cache."""
    for seed in range(8):
        q, k_cache, v_cache, table, lengths, label = case(1000 * len(name) + seed)
        out = torch.full_like(q, float("nan"))
        stridedfa.sdpa_forward(q, k_cache, v_cache, out, block_table=table, seqlens_kv=lengths, **options)
        ref_options = {key: value for key, value in options.items() if key != "causal_alignment"}
        ref = reference(q, k_cache, v_cache, table, lengths, alignment=options.get("causal_alignment", "top_left"),
                        **ref_options)
        assert_close(out, ref, atol=ATOL[q.dtype], name=f"out ({label})")


def test_compiled_decode_step_follows_the_cache_without_recompiling():
    import torch._dynamo
    import torch._dynamo.testing

    import stridedfa.torch as st

    torch._dynamo.reset()
    q, k_cache, v_cache, table, lengths, _ = case(7, b=4, s_q=1, order="kv_packed")
    lengths = (lengths - 3).clamp(min=0).to(torch.int32)
    gen = torch.Generator(device="cuda").manual_seed(8)

    def step(q, k_cache, v_cache, table, lengths, k, v):
        return st.attention_with_kvcache(q, k_cache, v_cache, table, lengths, k, v)

    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = torch.compile(step, fullgraph=True, backend=counter)
    eager_k, eager_v = k_cache.clone(), v_cache.clone()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(3):  # three decode steps: the cached lengths advance on the device
            k, v = (torch.randn(4, k_cache.shape[1], 1, k_cache.shape[3], generator=gen, device="cuda")
                    .to(k_cache.dtype) for _ in range(2))
            out = compiled(q, k_cache, v_cache, table, lengths, k, v)
            expected = step(q, eager_k, eager_v, table, lengths, k, v)
            assert torch.equal(k_cache, eager_k) and torch.equal(v_cache, eager_v), "the compiled append"
            assert_close(out, expected.float(), atol=1e-2, name="compiled decode step")
            lengths = (lengths + 1).to(torch.int32)
    assert counter.frame_count == 1, f"compiled {counter.frame_count} frames (graph breaks?)"


def test_paged_operator_passes_opcheck():
    import stridedfa.torch  # noqa: F401  (registers torch.ops.stridedfa.paged_forward)

    q, k_cache, v_cache, table, lengths, _ = case(5, b=2, s_q=3, order="kv_packed")
    torch.library.opcheck(torch.ops.stridedfa.paged_forward.default,
                          (q, k_cache, v_cache, table, lengths, None, True, "bottom_right", 31, 0, None))


def test_cuda_graph_replays_follow_new_cached_lengths():
    import stridedfa.torch as st

    q, k_cache, v_cache, table, lengths, _ = case(9, b=3, s_q=1, order="bshd")
    static_lengths = lengths.clone()
    st.attention_with_kvcache(q, k_cache, v_cache, table, static_lengths)  # warm: graph built
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = st.attention_with_kvcache(q, k_cache, v_cache, table, static_lengths)
    capacity = table.shape[1] * k_cache.shape[2]
    for new in ([1, 1, 1], [capacity, 2, min(17, capacity)], [5, capacity, capacity // 2]):  # within the table
        static_lengths.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        eager = st.attention_with_kvcache(q, k_cache, v_cache, table, static_lengths)
        assert torch.equal(captured, eager), f"replay with cached lengths {new}"
        assert_close(captured, reference(q, k_cache, v_cache, table, static_lengths, causal=True,
                                         alignment="bottom_right"), atol=ATOL[q.dtype], name="replay")


def test_cupy_paged_and_with_kvcache():
    cp = pytest.importorskip("cupy")
    import stridedfa.cupy as sc

    q, k_cache, v_cache, table, lengths, label = case(21, dtype=torch.float16, b=3, s_q=2, order="kv_packed")
    lengths = (lengths - 2).clamp(min=0).to(torch.int32)
    k_new, v_new = (torch.randn(3, k_cache.shape[1], 2, k_cache.shape[3], device="cuda").half() for _ in range(2))
    k_full, v_full = gathered(k_cache, table).clone(), gathered(v_cache, table).clone()
    for b in range(3):
        n = int(lengths[b])
        k_full[b, :, n:n + 2], v_full[b, :, n:n + 2] = k_new[b], v_new[b]
    torch.cuda.synchronize()
    out = sc.attention_with_kvcache(*(cp.from_dlpack(t) for t in (q, k_cache, v_cache, table, lengths, k_new,
                                                                    v_new)))
    cp.cuda.get_current_stream().synchronize()
    assert torch.equal(gathered(k_cache, table)[:, :, :int(lengths.max()) + 2].isfinite(),
                       k_full[:, :, :int(lengths.max()) + 2].isfinite())
    seqlens_q = torch.full((3,), 2, dtype=torch.int32, device="cuda")
    ref, _ = torch_reference(q, k_full, v_full, causal=True, alignment="bottom_right", seqlens_q=seqlens_q,
                             seqlens_kv=lengths + 2)
    assert_close(torch.from_dlpack(out), ref, atol=ATOL[q.dtype], name=f"cupy with_kvcache ({label})")
    plain = sc.paged_attention(*(cp.from_dlpack(t) for t in (q, k_cache, v_cache, table)),
                               cp.from_dlpack((lengths + 2).to(torch.int32)))
    cp.cuda.get_current_stream().synchronize()
    assert torch.equal(torch.from_dlpack(plain), torch.from_dlpack(out))


@pytest.fixture(scope="module")
def sj():
    jax = pytest.importorskip("jax")
    try:
        jax.devices("gpu")
    except RuntimeError as exc:
        pytest.skip(f"JAX has no GPU backend: {exc}")
    import stridedfa.jax

    return stridedfa.jax


def _to_jax(t):
    import jax.numpy as jnp

    return jnp.asarray(t.float().cpu().numpy()).astype(jnp.bfloat16) if t.is_floating_point() \
        else jnp.asarray(t.cpu().numpy())


def _from_jax(x):
    return torch.from_numpy(np.asarray(x.astype("float32"))).cuda()


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_jax_paged_jit_with_kvcache_and_vmap(sj, layout):
    import jax

    q, k_cache, v_cache, table, lengths, label = case(31, b=3, s_q=1, order="bshd")
    lengths = (lengths - 1).clamp(min=0).to(torch.int32)
    k_new, v_new = (torch.randn(3, k_cache.shape[1], 1, k_cache.shape[3], device="cuda").bfloat16() for _ in range(2))
    k_full, v_full = gathered(k_cache, table).clone(), gathered(v_cache, table).clone()
    for b in range(3):
        n = int(lengths[b])
        k_full[b, :, n:n + 1], v_full[b, :, n:n + 1] = k_new[b], v_new[b]
    seqlens_q = torch.full((3,), 1, dtype=torch.int32, device="cuda")
    ref, _ = torch_reference(q, k_full, v_full, causal=True, alignment="bottom_right", seqlens_q=seqlens_q,
                             seqlens_kv=lengths + 1)

    def framed(t):  # logical (b | blocks, h, s, d) <-> the layout's axis order
        return t.transpose(1, 2) if layout == "bshd" else t

    q_j, k_j, v_j = (_to_jax(framed(t)) for t in (q, k_cache, v_cache))
    table_j, lengths_j = _to_jax(table), _to_jax(lengths)
    step = jax.jit(lambda *a: sj.attention_with_kvcache(*a, layout=layout), donate_argnums=(1, 2))
    out, k_after, v_after = step(q_j, k_j, v_j, table_j, lengths_j, _to_jax(framed(k_new)), _to_jax(framed(v_new)))
    assert_close(framed(_from_jax(out)), ref, atol=ATOL[torch.bfloat16], name=f"jax with_kvcache {layout} ({label})")
    assert_close(gathered(framed(_from_jax(k_after)), table), k_full.float(), atol=0.0, name="appended k cache")
    assert_close(gathered(framed(_from_jax(v_after)), table), v_full.float(), atol=0.0, name="appended v cache")

    new_lengths = lengths_j + 1
    plain = jax.jit(lambda *a: sj.paged_attention(*a, layout=layout))(q_j, k_after, v_after, table_j, new_lengths)
    one_by_one = jax.vmap(lambda q1, t1, n1: sj.paged_attention(q1[None], k_after, v_after, t1[None], n1[None],
                                                                layout=layout)[0])(q_j, table_j, new_lengths)
    assert_close(_from_jax(plain), _from_jax(out), atol=0.0, name="paged_attention after the append")
    assert_close(_from_jax(one_by_one), _from_jax(out), atol=ATOL[torch.bfloat16], name="vmap over sequences")
