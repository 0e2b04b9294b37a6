"""Paged KV caches on fake CUDA tensors (no GPU): q (b, h_q, s_q, d) dense, k and v caches of
(num_blocks, h_kv, block_size, d) at any valid strides, an int32 block table (b, blocks per
sequence) and the cached lengths seqlens_kv (b,). What validation accepts, refuses, and keys."""

from __future__ import annotations

import pytest

import stridedfa
from helpers.fake_dlpack import FakeTensor
from helpers.fake_dlpack import spaced as fake
from stridedfa import _core

B, H_Q, H_KV, D, NUM_BLOCKS, BLOCK, BLOCKS = 4, 8, 2, 128, 64, 16, 12


def args(s_q=1, **change):
    a = {"q": fake((B, H_Q, s_q, D)), "k": fake((NUM_BLOCKS, H_KV, BLOCK, D)), "v": fake((NUM_BLOCKS, H_KV, BLOCK, D)),
         "out": fake((B, H_Q, s_q, D)), "block_table": fake((B, BLOCKS), "int32"),
         "seqlens_kv": fake((B,), "int32")}
    a.update(change)
    return {name: x for name, x in a.items() if x is not None}


def test_a_decode_step_validates_with_the_cache_extent():
    problem = _core._validate_forward(**args())
    assert (problem["b"], problem["s_q"], problem["s_kv"]) == (B, 1, BLOCKS * BLOCK)


def test_caches_at_any_valid_strides_and_views_of_one_allocation_pass():
    # K and V as views of one (num_blocks, 2, block_size, h_kv, d) allocation, bshd inside a block
    base = 0x200000000000
    strides = (2 * BLOCK * H_KV * D, D, H_KV * D, 1)
    k, v = (FakeTensor((NUM_BLOCKS, H_KV, BLOCK, D), strides, "bfloat16", data=base + i * BLOCK * H_KV * D * 2)
            for i in range(2))
    _core._validate_forward(**args(k=k, v=v))


@pytest.mark.parametrize("change, error, match", [
    ({"block_table": fake((B, BLOCKS), "int64")}, stridedfa.LayoutError, r"^block_table: dtype int64"),
    ({"block_table": fake((B + 1, BLOCKS), "int32")}, stridedfa.LayoutError, r"^block_table: shape"),
    ({"block_table": fake((B, BLOCKS), "int32", strides=(1, B))}, stridedfa.LayoutError, "must be contiguous"),
    ({"seqlens_kv": None}, stridedfa.LayoutError, "needs seqlens_kv"),
    ({"v": fake((NUM_BLOCKS + 1, H_KV, BLOCK, D))}, stridedfa.LayoutError, "hold the same blocks"),
    ({"alibi_slopes": fake((H_Q,), "float32")}, stridedfa.UnsupportedError, "not supported with a paged KV cache"),
])
def test_bad_paged_calls_are_refused_by_name(change, error, match):
    with pytest.raises(error, match=match):
        _core._validate_forward(**args(**change))


def test_dropout_with_a_paged_cache_is_refused():
    with pytest.raises(stridedfa.UnsupportedError, match="dropout is not supported with a paged"):
        _core._forward_graph_key(**args(), dropout_p=0.1, rng_state=fake((2,), "int64"), causal=True)


@pytest.fixture(params=[False, True], ids=["exact", "bucketed"])
def decode_graphs(request):
    """Decode graphs bucketed (the default) or exact (STRIDEDFA_DECODE_GRAPHS=exact) for a test, with
    split-KV off (its chunked graphs have keys of their own: tests/test_split_kv.py)."""
    before, split_before = _core._decode_graphs(), _core._split_kv()
    _core._decode_graphs(request.param)
    _core._split_kv(False)
    yield request.param
    _core._decode_graphs(before)
    _core._split_kv(split_before)


def test_the_key_holds_the_cache_and_table_layout_not_the_table_contents(decode_graphs):
    base = _core._forward_graph_key(**args(), causal=True, causal_alignment="bottom_right")
    assert base == _core._forward_graph_key(**args(), causal=True, causal_alignment="bottom_right")
    # bucketed, the table's width is declared a power of two >= 8: 12 and 13 blocks share one graph
    wider = _core._forward_graph_key(**args(block_table=fake((B, BLOCKS + 1), "int32")), causal=True,
                                     causal_alignment="bottom_right")
    assert (base == wider) == decode_graphs
    assert base != _core._forward_graph_key(**args(block_table=fake((B, BLOCKS + 5), "int32")), causal=True,
                                            causal_alignment="bottom_right")
    # a table whose rows have a stride of their own is read packed (its range-checked copy): one graph
    wide_rows = fake((B, BLOCKS), "int32", strides=(2 * BLOCKS, 1))
    assert base == _core._forward_graph_key(**args(block_table=wide_rows), causal=True,
                                            causal_alignment="bottom_right")
    bshd = fake((NUM_BLOCKS, H_KV, BLOCK, D), strides=(BLOCK * H_KV * D, D, H_KV * D, 1))
    assert base != _core._forward_graph_key(**args(k=bshd), causal=True, causal_alignment="bottom_right")


def test_a_thousand_decode_steps_with_a_growing_table_build_one_graph_per_doubling(decode_graphs):
    """A caller that passes each step only the blocks its cache fills (100 -> 1,099 tokens of
    16-token blocks: 7 -> 69 blocks) gets tables declared 8, 16, 32, 64 and 128 blocks wide."""
    keys = {_core._forward_graph_key(**args(block_table=fake((B, -(-n // BLOCK)), "int32")), causal=True,
                                     causal_alignment="bottom_right")
            for n in range(100, 1100)}
    assert len(keys) == (5 if decode_graphs else 63)  # exact: a graph per table width


def test_the_torch_entry_point_appends_and_attends_through_the_fakes():
    """attention_with_kvcache on meta tensors: the append's indexing and the operator's fake."""
    torch = pytest.importorskip("torch")
    import stridedfa.torch as st

    cache = torch.empty(NUM_BLOCKS, 2, BLOCK, H_KV, D, dtype=torch.bfloat16, device="meta")
    k_cache, v_cache = cache[:, 0].transpose(1, 2), cache[:, 1].transpose(1, 2)
    q = torch.empty(B, H_Q, 1, D, dtype=torch.bfloat16, device="meta")
    table = torch.empty(B, BLOCKS, dtype=torch.int32, device="meta")
    lengths = torch.empty(B, dtype=torch.int32, device="meta")
    new = torch.empty(B, H_KV, 1, D, dtype=torch.bfloat16, device="meta")
    out = st.attention_with_kvcache(q, k_cache, v_cache, table, lengths, new, new)
    assert out.shape == (B, H_Q, 1, D) and out.transpose(1, 2).is_contiguous()
    with pytest.raises(ValueError, match="give both k and v"):
        st.attention_with_kvcache(q, k_cache, v_cache, table, lengths, new)
