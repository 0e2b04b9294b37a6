"""Decoding builds a bounded number of cuDNN graphs (issue 33 item 1), shown on fake CUDA tensors
(no GPU) through the graph-cache key a call would use: calls with equal keys share one graph.

With STRIDEDFA_DECODE_GRAPHS=bucketed (the default since GPU run 63; the tests set it in case the
environment chose exact), a decoding step -- a few queries against a cache one token longer than the last
step's -- is described by heads (call_plan.cpp, plan_decode_by_heads; one query over a head-major cache
through a paged view of it since run 66, plan_decode_heads_paged): the key holds the keys' extent rounded up
to a power of two and none of the strides that grow with the cache, so 1,000 steps of growing
length build one graph per doubling of the cache.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from helpers.fake_dlpack import spaced as fake
from helpers.switches import switched
from stridedfa import _core

B, H_Q, H_KV, D = 2, 32, 8, 128


@pytest.fixture(autouse=True)
def bucketed():
    """Decode graphs bucketed (STRIDEDFA_DECODE_GRAPHS=bucketed) for each test, as before after."""
    with switched(_core._decode_graphs, True):
        yield


def cache(length, layout):
    """A KV cache of `length` tokens as the call sees it: head-major (b, h, L, d) contiguous, as
    transformers' dynamic cache concatenates it; token-major (b, L, h, d) memory; or the first
    `length` tokens of a 4096-token static cache (head-major)."""
    if layout == "head_major":
        return fake((B, H_KV, length, D))
    if layout == "token_major":
        return fake((B, H_KV, length, D), strides=(length * H_KV * D, D, H_KV * D, 1))
    return fake((B, H_KV, length, D), strides=(H_KV * 4096 * D, 4096 * D, D, 1))


def step_key(length, layout, s_q=1, lse=False, **options):
    q = fake((B, H_Q, s_q, D))
    out = fake((B, H_Q, s_q, D))
    stats = fake((B, H_Q, s_q), "float32") if lse else None
    return _core._forward_graph_key(q, cache(length, layout), cache(length, layout), out, stats,
                                    causal=True, causal_alignment="bottom_right", **options)


@pytest.mark.parametrize("layout", ["head_major", "token_major", "static_slice"])
@pytest.mark.parametrize("lse", [False, True])
def test_a_thousand_growing_decode_steps_build_at_most_eight_graphs(layout, lse):
    keys = {step_key(length, layout, lse=lse) for length in range(100, 1100)}
    assert len(keys) == 5  # 128, 256, 512, 1024 and 2048 keys: one graph per doubling of the cache
    assert () not in keys


@pytest.mark.parametrize("lse", [False, True])
def test_one_query_steps_through_a_paged_view_build_one_graph_per_doubling(lse):
    """The default: a head-major cache's one-query steps described by heads as one-token blocks of
    a paged problem (cuDNN's fast one-query kernel): the keys' extent and the cache's rows are
    powers of two, so 1,000 growing steps still build a graph per doubling. Other caches, and
    STRIDEDFA_DECODE_GRAPHS=ragged, keep the ragged form's keys."""
    def keys(layout, **kw):
        return {step_key(length, layout, **kw) for length in range(100, 1100)}

    paged, token_major, multi = keys("head_major", lse=lse), keys("token_major", lse=lse), keys("head_major", s_q=5)
    with switched(_core._decode_heads_paged, False):
        ragged = keys("head_major", lse=lse)
        assert token_major == keys("token_major", lse=lse)
        assert multi == keys("head_major", s_q=5)
    assert len(paged) <= 8 and len(ragged) <= 8
    assert paged.isdisjoint(ragged)


@pytest.mark.parametrize("s_q", [2, 7, 16])
def test_multi_token_decode_steps_build_one_graph_per_doubling(s_q):
    keys = {step_key(length, "head_major", s_q=s_q) for length in range(300, 1300)}
    assert len(keys) == 3  # 512, 1024, 2048 keys


@pytest.mark.parametrize("lse", [False, True])
def test_decoding_steps_with_sinks_build_one_graph_per_doubling(lse):
    """gpt-oss's sinks: folded in after cuDNN, so a step with sinks is described by heads too."""
    sinks = fake((H_Q,), "float32")
    keys = {step_key(length, "head_major", lse=lse, sinks=sinks) for length in range(100, 1100)}
    assert len(keys) == 5


def varlen_step_key(length, sequences=4, promise=True, s_q=1):
    """A variable-length decoding step (flash_attn_varlen_func's form): `sequences` sequences of
    `s_q` queries each against caches of `length` + 7 i keys, tokens packed (t, h, d)."""
    t_q, t_kv = sequences * s_q, sum(length + 7 * i for i in range(sequences))
    promised = dict(max_seqlen_q=s_q, max_seqlen_kv=length + 7 * (sequences - 1)) if promise else {}
    return _core._forward_graph_key(
        fake((t_q, H_Q, D)), fake((t_kv, H_KV, D)), fake((t_kv, H_KV, D)), fake((t_q, H_Q, D)),
        fake((H_Q, t_q), "float32", strides=(1, H_Q)), causal=True, causal_alignment="bottom_right",
        cu_seqlens_q=fake((sequences + 1,), "int32"), cu_seqlens_kv=fake((sequences + 1,), "int32"), **promised)


@pytest.mark.parametrize("promise", [True, False])
def test_a_thousand_growing_variable_length_decode_steps_build_one_graph_per_doubling(promise):
    keys = {varlen_step_key(length, promise=promise) for length in range(100, 1100)}
    # The longest cache (promised) or the key total from ~400 to ~4,400 tokens: 5 powers of two.
    assert len(keys) == 5


def test_variable_length_prefill_and_training_keep_their_finer_buckets():
    """More than 16 queries per sequence is not decoding: the keys keep four buckets per doubling."""
    keys = {varlen_step_key(length, s_q=64) for length in range(100, 1100)}
    assert len(keys) > 8

def test_options_that_take_part_in_decoding_stay_in_the_key():
    assert step_key(300, "head_major") == step_key(301, "head_major")
    assert step_key(300, "head_major", softcap=30.0) != step_key(300, "head_major")
    assert step_key(300, "head_major", window=(127, 0)) != step_key(300, "head_major")
    assert step_key(300, "head_major", window=(127, 0)) == step_key(400, "head_major", window=(127, 0))


def test_a_prompt_keeps_its_exact_graph():
    """Self-attention over a new prompt (as many queries as keys) and steps of more than 16
    queries are not decoding: planned with their own extents, as before."""
    assert step_key(300, "head_major", s_q=300) != step_key(301, "head_major", s_q=301)
    assert step_key(300, "head_major", s_q=17) != step_key(301, "head_major", s_q=17)


def test_bucketed_decode_graphs_are_the_default_and_can_be_set_per_process():
    """A process plans decoding steps by heads (one graph for a growing cache) unless
    STRIDEDFA_DECODE_GRAPHS=exact asks for their exact extents (a graph per cache length); one-query
    steps over head-major caches go through a paged view of the cache unless ragged is asked for
    (paged, the name of the view while it was unverified, is the default's)."""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from stridedfa import _core
        from test_decode_graphs import step_key
        print(len({{step_key(n, "head_major") for n in range(300, 340)}}), _core._decode_heads_paged())
    """)
    for setting, graphs in ((None, "1 True"), ("exact", "40 False"), ("bucketed", "1 True"), ("ragged", "1 False"),
                            ("paged", "1 True")):
        env = {k: v for k, v in os.environ.items() if k != "STRIDEDFA_DECODE_GRAPHS"}
        if setting:
            env["STRIDEDFA_DECODE_GRAPHS"] = setting
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        assert done.stdout.strip() == graphs, setting
