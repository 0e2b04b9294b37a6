"""Decoding by tokens (call_plan.cpp, plan_decode_by_tokens), shown on fake CUDA tensors (no GPU)
through the graph key a call would use: a paged step of 2-4 queries per sequence (2-8 for one
sequence), causal
bottom-right or unmasked, with q and out token-major inside each batch entry, is planned as one
one-query sequence per token (another graph than cuDNN's general kernel gets); what a token's
padding length cannot say keeps the general kernel's graph.
"""

from __future__ import annotations

import pytest

from helpers.fake_dlpack import spaced as fake
from helpers.switches import switched
from stridedfa import _core

H_Q, H_KV, D, BLOCK = 32, 8, 128, 16
BR = dict(causal=True, causal_alignment="bottom_right")


@pytest.fixture(autouse=True)
def by_tokens():
    with switched(_core._decode_by_tokens, True):
        yield


def token_major(b, s_q, inner=(D,), dtype="bfloat16"):
    """A (b, h, s_q, ...) view of (b, s_q, h, ...) memory."""
    shape = (b, s_q, H_Q, *inner)
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    strides[1], strides[2] = strides[2], strides[1]
    return fake((b, H_Q, s_q, *inner), dtype, strides=tuple(strides))


def key(b, s_q, q=None, lse=False, **options):
    pool, columns = 4096, 64
    q = token_major(b, s_q) if q is None else q
    extra = {"lse": token_major(b, s_q, inner=(), dtype="float32")} if lse else {}
    return _core._forward_graph_key(
        q, fake((pool, H_KV, BLOCK, D)), fake((pool, H_KV, BLOCK, D)), token_major(b, s_q),
        block_table=fake((b, columns), "int32"), seqlens_kv=fake((b,), "int32"), **extra, **options)


def general(*args, **kwargs):
    _core._decode_by_tokens(False)
    try:
        return key(*args, **kwargs)
    finally:
        _core._decode_by_tokens(True)


@pytest.mark.parametrize("b, s_q", [(8, 2), (8, 4), (1, 6), (1, 8)])
@pytest.mark.parametrize("options", [BR, {}, dict(softcap=30.0, **BR)], ids=["causal_br", "no_mask", "softcap"])
@pytest.mark.parametrize("lse", [False, True])
def test_a_few_queries_are_planned_by_tokens(b, s_q, options, lse):
    assert key(b, s_q, lse=lse, **options) != general(b, s_q, lse=lse, **options)


def test_the_graph_follows_the_tokens_not_the_lengths():
    """b x s_q one-query sequences: 4 entries of 2 tokens and 2 entries of 4 share a graph; one
    call's lengths are on the device, so a growing cache needs none."""
    assert key(4, 2, **BR) == key(2, 4, **BR) == key(1, 8, **BR)
    assert key(4, 2, **BR) != key(4, 3, **BR)


@pytest.mark.parametrize("options", [
    pytest.param(dict(causal=True), id="top_left"),
    pytest.param(dict(window=(127, 0), causal_alignment="bottom_right"), id="window"),
    pytest.param(dict(window=(None, 3), causal_alignment="bottom_right"), id="right_window"),
])
def test_masks_that_lengths_cannot_say_keep_the_general_kernel(options):
    assert key(8, 4, **options) == general(8, 4, **options)


def test_more_queries_than_pay_keep_the_general_kernel():
    """Each token rereads its keys: past 4 tokens (8 for one sequence) the general kernel is as fast
    or faster (GPU runs 66-67)."""
    assert key(8, 5, **BR) == general(8, 5, **BR)
    assert key(8, 16, **BR) == general(8, 16, **BR)
    assert key(1, 9, **BR) == general(1, 9, **BR)


def test_head_major_queries_keep_the_general_kernel():
    """(b, h, s, d) memory has no (b x s) axis to read q as; one batch entry has."""
    head_major = fake((8, H_Q, 4, D))
    assert key(8, 4, q=head_major, **BR) == general(8, 4, q=fake((8, H_Q, 4, D)), **BR)
    assert key(1, 4, q=fake((1, H_Q, 4, D)), **BR) != general(1, 4, q=fake((1, H_Q, 4, D)), **BR)


def test_operands_a_token_cannot_carry_keep_the_general_kernel():
    sinks = fake((H_Q,), "float32")
    assert key(8, 4, sinks=sinks, **BR) == general(8, 4, sinks=sinks, **BR)
    seqlens_q = fake((8,), "int32")
    assert key(8, 4, seqlens_q=seqlens_q, **BR) == general(8, 4, seqlens_q=seqlens_q, **BR)
