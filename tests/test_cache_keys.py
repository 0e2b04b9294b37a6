"""Graph-cache keys: everything that determines a cuDNN graph is in the key (CPU-only).

Omissions here are silent wrong results elsewhere (FlashInfer keyed without strides; PyTorch without
dO/stats layout), so every stride of every operand must separate keys, while strides cuDNN never
uses (extent-1 axes) must not.
"""

from __future__ import annotations

import itertools

import pytest

import stridedfa
from helpers.fake_dlpack import FakeTensor
from stridedfa import _core

B, H, S, D = 2, 4, 32, 64
_addresses = itertools.count(1)


def t(shape=(B, H, S, D), strides=None, dtype="bfloat16"):
    return FakeTensor(shape, strides, dtype, data=0x100000000000 + next(_addresses) * (1 << 30))


def bshd(shape=(B, H, S, D)):
    b, h, s, d = shape
    return t(shape, (s * h * d, d, h * d, 1))


def fwd_key(**kw):
    args = dict(q=t(), k=t(), v=t(), out=t(), lse=None)
    options = {name: kw.pop(name) for name in ("scale", "causal", "causal_alignment", "sm_version",
                                                 "cudnn_version") if name in kw}
    args.update(kw)
    return _core._forward_graph_key(args["q"], args["k"], args["v"], args["out"], args["lse"], **options)


def bwd_key(**kw):
    args = dict(q=t(), k=t(), v=t(), out=t(), grad_out=t(), lse=t((B, H, S), dtype="float32"),
                grad_q=t(), grad_k=t(), grad_v=t())
    options = {name: kw.pop(name) for name in ("sm_version", "cudnn_version") if name in kw}
    args.update(kw)
    return _core._backward_graph_key(*(args[n] for n in ("q", "k", "v", "out", "grad_out", "lse", "grad_q",
                                                          "grad_k", "grad_v")), **options)


def described_strides(key, slot):
    """The strides a key describes operand `slot` (0 q ... 8 grad_v) with, as cuDNN gets them."""
    at = 2
    for _ in range(slot):
        at += 9 if key[at] else 1
    assert key[at] == 1, "operand absent"
    return key[at + 5:at + 9]


def test_same_layout_same_key_whatever_the_addresses():
    assert fwd_key() == fwd_key()


@pytest.mark.parametrize("slot", ["q", "k", "v", "out"])
def test_forward_one_operand_layout_changes_the_key(slot):
    assert fwd_key(**{slot: bshd()}) != fwd_key()


@pytest.mark.parametrize("slot", ["q", "k", "v", "out", "grad_out", "grad_q", "grad_k", "grad_v"])
def test_backward_one_operand_layout_changes_the_key(slot):
    assert bwd_key(**{slot: bshd()}) != bwd_key()


def test_a_single_stride_changes_the_key():
    padded = t(strides=(H * S * (D + 8), S * (D + 8), D + 8, 1))  # rows padded by 8 elements
    assert fwd_key(k=padded) != fwd_key()
    batch_gap = t(strides=(H * S * D + 64, S * D, D, 1))
    assert fwd_key(v=batch_gap) != fwd_key()


def test_stats_layout_changes_the_backward_key():
    other = t((B, H, S), strides=(S, B * S, 1), dtype="float32")  # heads outermost
    assert bwd_key(lse=other, cudnn_version=92600) != bwd_key(cudnn_version=92600)


def test_backward_below_9_26_refuses_unpacked_stats_naming_the_packed_layout():
    other = t((B, H, S), strides=(S, B * S, 1), dtype="float32")
    with pytest.raises(stridedfa.UnsupportedError,
                       match=rf"lse: cuDNN 9.19 reads .* packed .* lse has strides \({S}, {B * S}, 1\) "
                             rf".* the packed layout is \({H * S}, {S}, 1\)"):
        bwd_key(lse=other, cudnn_version=91900)
    bwd_key(lse=other, cudnn_version=92600)  # 9.26 reads any layout


def test_forward_below_9_12_refuses_unpacked_stats():
    other = t((B, H, S), strides=(S, B * S, 1), dtype="float32")
    with pytest.raises(stridedfa.UnsupportedError, match=r"lse: cuDNN 9.10 writes .* \(cuDNN 9.12 lifts this\)"):
        fwd_key(lse=other, cudnn_version=91000)
    fwd_key(lse=other, cudnn_version=91200)


@pytest.mark.parametrize("b,h,s", [(2, 1, 32), (2, 4, 1), (1, 1, 1), (1, 4, 32), (2, 1, 1)])
def test_packed_stats_with_extent_one_axes_are_described_packed(b, h, s):
    """What torch, CuPy and stridedfa allocate -- a contiguous (b, h, s) float32 -- whatever its
    producer exports on extent-1 axes, reaches cuDNN as packed BHSD (below 9.26 it must)."""
    q, out = t((b, h, s, D)), t((b, h, s, D))
    kv = dict(k=t((b, h, S, D)), v=t((b, h, S, D)), grad_k=t((b, h, S, D)), grad_v=t((b, h, S, D)))
    for lse_strides in [(h * s, s, 1), (h * s, 1, 1), (12345, 777, 1)]:
        lse_strides = tuple(st if n != 1 else odd for st, n, odd in zip((h * s, s, 1), (b, h, s), lse_strides))
        lse = t((b, h, s), strides=lse_strides, dtype="float32")
        key = bwd_key(q=q, out=out, grad_out=t((b, h, s, D)), grad_q=t((b, h, s, D)), lse=lse, **kv,
                      cudnn_version=91900)
        assert described_strides(key, 4) == (h * s, s, 1, 1)


def test_extent_one_axes_get_the_packed_stride():
    # (1, H, S, D) bshd: the batch axis is described with the stride a packed tensor has there.
    key = fwd_key(q=t((1, H, S, D), (999, D, H * D, 1)), k=t((1, H, S, D)), v=t((1, H, S, D)),
                  out=t((1, H, S, D)))
    assert described_strides(key, 0) == (H * D, D, H * D, 1)

def test_presence_of_stats_changes_the_forward_key():
    assert fwd_key(lse=t((B, H, S), dtype="float32")) != fwd_key()


@pytest.mark.parametrize("option", [
    {"scale": 0.1}, {"causal": True}, {"causal": True, "causal_alignment": "bottom_right"},
    {"sm_version": 100}, {"cudnn_version": 92600},
])
def test_options_and_device_facts_change_the_key(option):
    assert fwd_key(**option) != fwd_key()


def test_dtype_and_shape_change_the_key():
    half = dict(q=t(dtype="float16"), k=t(dtype="float16"), v=t(dtype="float16"), out=t(dtype="float16"))
    assert fwd_key(**half) != fwd_key()
    longer = dict(k=t((B, H, 2 * S, D)), v=t((B, H, 2 * S, D)))
    assert fwd_key(**longer) != fwd_key()


def test_extent_one_strides_do_not_change_the_key():
    one = (1, H, S, D)
    a = dict(q=t(one, (12345, S * D, D, 1)), k=t(one), v=t(one), out=t(one))
    b = dict(q=t(one, (7, S * D, D, 1)), k=t(one), v=t(one), out=t(one))
    assert fwd_key(**a) == fwd_key(**b)


def test_default_scale_equals_explicit_default():
    assert fwd_key() == fwd_key(scale=D ** -0.5)


def test_bottom_right_with_as_many_queries_as_keys_is_keyed_as_top_left():
    # the same mask; the core says top-left, whose backward cuDNN runs ~1.6x faster (GPU run 46)
    assert fwd_key(causal=True, causal_alignment="bottom_right") == fwd_key(causal=True)
    longer = dict(k=t((B, H, 2 * S, D)), v=t((B, H, 2 * S, D)))
    assert fwd_key(causal=True, causal_alignment="bottom_right", **longer) != fwd_key(causal=True, **longer)


def test_one_lengths_tensor_for_both_sides_is_keyed_as_top_left():
    """With one tensor as seqlens_q and seqlens_kv every sequence has as many queries as keys:
    bottom-right is top-left (and a keys' padding bias may join it, as the transformers
    integration's unchecked padding does); two tensors keep the per-sequence diagonal."""
    q, k, v, out = t(), t(), t(), t()
    lengths, other = t((B,), dtype="int32"), t((B,), dtype="int32")
    bias = t((B, 1, 1, S), (S, S, S, 1))

    def key(alignment, seqlens_kv, with_bias=False):
        return _core._forward_graph_key(q, k, v, out, None, causal=True, causal_alignment=alignment,
                                        seqlens_q=lengths, seqlens_kv=seqlens_kv,
                                        bias=bias if with_bias else None)

    assert key("bottom_right", lengths) == key("top_left", lengths)
    assert key("bottom_right", lengths, with_bias=True) == key("top_left", lengths, with_bias=True)
    assert key("bottom_right", other) != key("top_left", other)
    with pytest.raises(stridedfa.UnsupportedError, match="padding lengths"):
        key("bottom_right", other, with_bias=True)


def test_a_keys_padding_bias_with_a_decoding_query_is_accepted():
    """The transformers integration's unchecked padding after a cache: one query, the keys'
    padding as a (b, 1, 1, s_kv) bias, causal bottom-right without lengths (shifted to top-left)."""
    one = (B, H, 1, D)
    key = _core._forward_graph_key(t(one), t(), t(), t(one), None, causal=True, causal_alignment="bottom_right",
                                   bias=t((B, 1, 1, S), (S, S, S, 1)))
    assert key
