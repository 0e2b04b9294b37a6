"""stridedfa.jax.paged_attention and attention_with_kvcache without a GPU: lowering to the forward
XLA FFI target with the block_table operand, typed errors while tracing, and the cache append
(plain jnp, so it runs on the CPU) against writing the tokens by hand."""

from __future__ import annotations

import numpy as np
import pytest

import stridedfa


@pytest.fixture(scope="module")
def sj():
    pytest.importorskip("jax")
    import stridedfa.jax

    return stridedfa.jax


@pytest.fixture(scope="module")
def jax(sj):
    import jax

    return jax


def spec(jax, shape, dtype="bfloat16"):
    return jax.ShapeDtypeStruct(shape, jax.numpy.dtype(dtype))


def args(jax, layout="bshd", b=3, s_q=1, h_q=8, h_kv=2, d=64, blocks=40, block=16, per_seq=6):
    q = (b, s_q, h_q, d) if layout == "bshd" else (b, h_q, s_q, d)
    cache = (blocks, block, h_kv, d) if layout == "bshd" else (blocks, h_kv, block, d)
    return (spec(jax, q), spec(jax, cache), spec(jax, cache), spec(jax, (b, per_seq), "int32"),
            spec(jax, (b,), "int32"))


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_lowering_passes_the_block_table_and_the_cached_lengths(sj, jax, layout):
    f = jax.jit(lambda *x: sj.paged_attention(*x, layout=layout, window=(255, 0), softcap=30.0))
    found = [line for line in f.lower(*args(jax, layout)).as_text().splitlines() if "custom_call" in line]
    assert len(found) == 1 and "@stridedfa_sdpa_forward_inference(" in found[0], found
    # q, k_cache, v_cache, then seqlens_q (the full s_q), cache_seqlens, block_table
    assert found[0].count("%") >= 6
    bits = stridedfa._core._jax_optional_operands()
    for attribute in (f"optional_operands = {bits['lengths'] + bits['block_table']} : i64", "causal = true",
                      "alignment = 1 : i64",
                      f"layout = {0 if layout == 'bshd' else 1} : i64", "window_left = 255 : i64"):
        assert attribute in found[0], found[0]
    out = jax.eval_shape(lambda *x: sj.paged_attention(*x, layout=layout), *args(jax, layout))
    assert out.shape == args(jax, layout)[0].shape


def test_with_kvcache_returns_the_updated_caches(sj, jax):
    a = args(jax, s_q=2)
    new = spec(jax, (3, 2, 2, 64))
    out, k_cache, v_cache = jax.eval_shape(lambda *x: sj.attention_with_kvcache(*x), *a, new, new)
    assert out.shape == (3, 2, 8, 64) and k_cache.shape == v_cache.shape == (40, 16, 2, 64)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_append_writes_at_each_sequence_length_and_clamps(sj, jax, layout):
    from stridedfa._jax_paged import _append

    jnp = jax.numpy
    rng = np.random.default_rng(0)
    blocks, block, h, d, b, per_seq, s_new = 12, 4, 2, 8, 3, 3, 3
    cache = rng.standard_normal((blocks, block, h, d)).astype(np.float32)
    table = rng.permutation(blocks)[:b * per_seq].reshape(b, per_seq).astype(np.int32)
    table[2, 2] = 99  # out of range: clamped to the last block
    lengths = np.array([0, 5, 11], np.int32)  # sequence 2 runs past its table: clamped into its last block
    new = rng.standard_normal((b, s_new, h, d)).astype(np.float32)
    expected = cache.copy()
    for i in range(b):
        for t in range(s_new):
            position = lengths[i] + t
            column = min(position // block, per_seq - 1)
            expected[min(table[i, column], blocks - 1), position % block] = new[i, t]
    given = cache if layout == "bshd" else cache.transpose(0, 2, 1, 3)
    result = np.asarray(_append(jnp.asarray(given), jnp.asarray(new), jnp.asarray(table), jnp.asarray(lengths),
                                layout))
    if layout == "bhsd":
        result = result.transpose(0, 2, 1, 3)
    np.testing.assert_array_equal(result, expected)


@pytest.mark.parametrize("change, message", [
    (lambda a, jax: (*a[:3], spec(jax, (3, 6), "float32"), a[4]), "block_table: dtype float32"),
    (lambda a, jax: (*a[:3], spec(jax, (3,), "int32"), a[4]), "block_table: expected a (batch, blocks per seq"),
    (lambda a, jax: (*a[:4], spec(jax, (2,), "int32")), "seqlens_kv"),
    (lambda a, jax: (a[0], spec(jax, (40, 16, 3, 64)), spec(jax, (40, 16, 3, 64)), *a[3:]), "multiple of the heads"),
    (lambda a, jax: (a[0], spec(jax, (40, 16, 2)), *a[2:]), "k_cache: expected 4 axes (num_blocks, block_size"),
])
def test_bad_calls_are_refused_while_tracing(sj, jax, change, message):
    with pytest.raises(stridedfa.LayoutError, match=message.replace("(", r"\(")):
        jax.eval_shape(lambda *x: sj.paged_attention(*x), *change(args(jax), jax))


def test_options_a_paged_cache_does_not_take_are_refused(sj, jax):
    with pytest.raises(ValueError, match="both k and v"):
        sj.attention_with_kvcache(*args(jax), k=spec(jax, (3, 1, 2, 64)))
    with pytest.raises(ValueError, match="layout"):
        sj.paged_attention(*args(jax), layout="thd")
