"""Split-KV paged decoding (split_kv.hpp), shown on fake CUDA tensors (no GPU) through the graph key
a call would use: with STRIDEDFA_SPLIT_KV=auto (off by default since GPU run 64 showed cuDNN's
unmasked one-query kernel as fast unsplit; these tests set it) a paged decoding step at small batch
is planned as chunks of its keys -- another graph than the unsplit one -- whose key does not follow
the cache's lengths, only the table's width.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers.fake_dlpack import spaced as fake
from helpers.switches import switched
from stridedfa import _core

H_Q, H_KV, D, BLOCK = 32, 8, 128, 16


@pytest.fixture(autouse=True)
def split_kv():
    with switched(_core._split_kv, True):
        yield


def key(b, columns, s_q=1, **options):
    pool = 4096
    return _core._forward_graph_key(
        fake((b, H_Q, s_q, D)), fake((pool, H_KV, BLOCK, D)), fake((pool, H_KV, BLOCK, D)), fake((b, H_Q, s_q, D)),
        block_table=fake((b, columns), "int32"), seqlens_kv=fake((b,), "int32"), **options)


def test_a_small_batch_decoding_step_gets_a_split_graph():
    split = key(1, 512)
    _core._split_kv(False)
    assert key(1, 512) != split


def test_sinks_are_split_too():
    """The merge weighs each head's sink in (cuDNN computes the chunks without it)."""
    sinks = fake((H_Q,), "float32")
    split = key(1, 512, sinks=sinks)
    assert split == key(1, 512)  # the chunks' graph has no sinks: one graph with and without them
    _core._split_kv(False)
    assert key(1, 512, sinks=sinks) != split


def test_a_batch_that_fills_the_gpu_is_not_split():
    """8 entries x 32 query heads are 256 thread blocks already: the same graph either way."""
    split = key(8, 512)
    _core._split_kv(False)
    assert key(8, 512) == split


@pytest.mark.parametrize("options", [dict(causal=True), dict(window=(127, 0)), dict(s_q=2)],
                         ids=["top_left", "window", "two_queries"])
def test_what_a_chunk_would_get_wrong_is_not_split(options):
    split = key(1, 512, **options)
    _core._split_kv(False)
    assert key(1, 512, **options) == split


def test_the_key_holds_the_tables_width_not_the_cache_lengths():
    """The lengths are on the device: one graph per table width, and with bucketed decode graphs a
    growing table reaches a new one once per doubling."""
    with switched(_core._decode_graphs, True):
        keys = {key(1, columns) for columns in range(8, 513)}
    assert len(keys) == 7  # 8, 16, ..., 512 columns


def test_split_kv_is_off_unless_asked_for():
    """Off by default (GPU run 64: cuDNN's unmasked one-query kernel is as fast unsplit);
    STRIDEDFA_SPLIT_KV=auto turns it on for the process."""
    script = "from stridedfa import _core; print(_core._split_kv())"
    for setting, expected in ((None, "False"), ("off", "False"), ("auto", "True")):
        env = {k: v for k, v in os.environ.items() if k != "STRIDEDFA_SPLIT_KV"}
        if setting:
            env["STRIDEDFA_SPLIT_KV"] = setting
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        assert done.stdout.strip() == expected, setting
