"""A prefix and a tail (call_plan.cpp, plan_prefix_tail), shown on fake CUDA tensors (no GPU) through
the graph key a call would use: a paged causal (bottom-right) step of 5-8 queries per sequence (3-8 at
batch >= 32) over a table of >= 2048 keys is planned as one-query sequences with the tokens folded into the heads
(another graph than cuDNN's general kernel gets), whatever the memory order of q, out and lse (the
launch copies q and the merge writes out and lse); what it cannot say, or where it does not pay, keeps
the general kernel's graph.
"""

from __future__ import annotations

import pytest

from helpers.fake_dlpack import spaced as fake
from helpers.switches import switched
from stridedfa import _core

H_Q, H_KV, D, BLOCK = 32, 8, 128, 16
BR = dict(causal=True, causal_alignment="bottom_right")


@pytest.fixture(autouse=True)
def defaults():
    with switched(_core._decode_prefix_tail, True), switched(_core._decode_by_tokens, True):
        yield


def key(b, s_q, columns=256, lse=False, **options):
    extra = {"lse": fake((b, H_Q, s_q), "float32")} if lse else {}
    return _core._forward_graph_key(
        fake((b, H_Q, s_q, D)), fake((4096, H_KV, BLOCK, D)), fake((4096, H_KV, BLOCK, D)), fake((b, H_Q, s_q, D)),
        block_table=fake((b, columns), "int32"), seqlens_kv=fake((b,), "int32"), **extra, **options)


def general(*args, **kwargs):
    with switched(_core._decode_prefix_tail, False), switched(_core._decode_by_tokens, False):
        return key(*args, **kwargs)


@pytest.mark.parametrize("b, s_q", [(2, 5), (8, 8), (4, 6), (32, 3), (32, 4), (64, 8)])
@pytest.mark.parametrize("lse", [False, True])
def test_several_causal_queries_over_a_long_cache_are_split(b, s_q, lse):
    assert key(b, s_q, lse=lse, **BR) != general(b, s_q, lse=lse, **BR)
    assert key(b, s_q, lse=lse, softcap=30.0, **BR) != general(b, s_q, lse=lse, softcap=30.0, **BR)


def test_the_graph_does_not_follow_the_lengths_or_the_table_width_within_its_bucket():
    """Lengths, prefixes and the tails' rows are made on the device; the table's width is bucketed."""
    assert key(8, 8, columns=200, **BR) == key(8, 8, columns=256, **BR)
    assert key(8, 8, **BR) != key(8, 9, **BR)


@pytest.mark.parametrize("options", [
    pytest.param({}, id="unmasked"),
    pytest.param(dict(causal=True), id="top_left"),
    pytest.param(dict(window=(127, 0), causal_alignment="bottom_right"), id="window"),
])
def test_masks_a_prefix_cannot_say_keep_the_general_kernel(options):
    assert key(8, 8, **options) == general(8, 8, **options)


@pytest.mark.parametrize("b, s_q, columns", [
    pytest.param(8, 8, 64, id="1k_keys"),  # the tail's fixed cost eats the gain (GPU run 70: 65 against 48 µs)
    pytest.param(8, 9, 256, id="9_queries"),  # GPU run 71: 16 queries 364 against 281 µs
    pytest.param(8, 4, 256, id="4_queries"),  # by tokens' (with q token-major) or the general kernel's
    pytest.param(16, 3, 256, id="3_queries_batch_16"),
    pytest.param(1, 8, 256, id="one_entry"),  # by tokens' one-query sequences: 49 against 126 µs
    pytest.param(32, 2, 256, id="2_queries_batch_32"),
])
def test_where_it_does_not_pay_it_is_not_planned(b, s_q, columns):
    with switched(_core._decode_by_tokens, False):
        assert key(b, s_q, columns=columns, **BR) == general(b, s_q, columns=columns, **BR)


def test_the_switch_turns_it_off():
    with switched(_core._decode_prefix_tail, False), switched(_core._decode_by_tokens, False):
        off = key(8, 8, **BR)
    assert off == general(8, 8, **BR) != key(8, 8, **BR)


@pytest.mark.parametrize("b, s_q", [(8, 8), (8, 3), (8, 16), (2, 12), (32, 4)])
def test_described_by_rows_it_is_another_graph_and_takes_3_to_16_queries(b, s_q):
    """Each key head's group x tokens as the general kernel's query rows (off by default)."""
    with switched(_core._decode_prefix_tail_rows, True):
        rows = key(b, s_q, **BR)
    assert rows != general(b, s_q, **BR)
    assert rows != key(b, s_q, **BR)  # by heads, by tokens or the general kernel
    with switched(_core._decode_prefix_tail_rows, True), switched(_core._decode_by_tokens, False):
        assert key(b, 17, **BR) == general(b, 17, **BR)
        assert key(1, 8, **BR) != general(1, 8, **BR)  # one entry too: its prefix in chunks


def test_described_by_rows_is_off_by_default():
    assert _core._decode_prefix_tail_rows() is False
