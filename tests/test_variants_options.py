"""The variants' options on the CPU (no GPU): their validation, their place in the graph key, and
the rows/keys the core hands cuDNN when a mask leaves some empty (seen through the key's dims)."""

from __future__ import annotations

import itertools

import pytest

import stridedfa
from helpers.fake_dlpack import FakeTensor
from stridedfa import _core

B, H, D = 2, 4, 64
_addresses = itertools.count(1)


def t(shape, dtype="bfloat16", strides=None):
    return FakeTensor(shape, strides, dtype, data=0x100000000000 + next(_addresses) * (1 << 30))


def forward(s_q=32, s_kv=32, **options):
    return dict(q=t((B, H, s_q, D)), k=t((B, H, s_kv, D)), v=t((B, H, s_kv, D)), out=t((B, H, s_q, D)),
                **options)


def key(s_q=32, s_kv=32, **options):
    return _core._forward_graph_key(**forward(s_q, s_kv), **options, cudnn_version=92600)


def backward_key(s_q=32, s_kv=32, h_q=H, h_kv=H, **options):
    q, k = t((B, h_q, s_q, D)), t((B, h_kv, s_kv, D))
    v, out, grad_out = t((B, h_kv, s_kv, D)), t((B, h_q, s_q, D)), t((B, h_q, s_q, D))
    lse = t((B, h_q, s_q), "float32")
    return _core._backward_graph_key(q, k, v, out, grad_out, lse, t(q.shape), t(k.shape), t(v.shape),
                                     **options, cudnn_version=92600)


@pytest.mark.parametrize("window, error, message", [
    ((-1, 0), ValueError, "left bound must be >= 0"),
    ((0, -3), ValueError, "right bound must be >= 0"),
    ((1.5, 0), TypeError, "int >= 0 or None"),
    ((True, 0), TypeError, "int >= 0 or None"),
    (5, TypeError, "pair"),
    ((1, 2, 3), TypeError, "pair"),
    ((2**31, 0), ValueError, "below 2\\*\\*31 - 1"),
    ((2**31 - 1, 0), ValueError, "below 2\\*\\*31 - 1"),  # cuDNN's left bound is left + 1, an int
])
def test_bad_windows_are_refused_naming_the_bound(window, error, message):
    with pytest.raises(error, match=message):
        _core._validate_forward(**forward(), window=window)


@pytest.mark.parametrize("name", ["seqlens_q", "seqlens_kv"])
@pytest.mark.parametrize("lengths, message", [
    (lambda: t((B,), "int64"), "int32"),
    (lambda: t((B, 2), "int32"), "expected shape \\(batch,\\)"),
    (lambda: t((B + 1,), "int32"), "does not match"),
    (lambda: t((B,), "float32"), "int32"),
])
def test_bad_padding_lengths_are_refused_naming_the_tensor(name, lengths, message):
    with pytest.raises(stridedfa.LayoutError, match=f"^{name}.*{message}"):
        _core._validate_forward(**forward(), **{name: lengths()})


@pytest.mark.parametrize("name, tensor", [
    ("seqlens_q", lambda: t((B,), "int32", strides=(2,))),   # every other int32 of a buffer
    ("sinks", lambda: t((H,), "float32", strides=(2,))),
    ("sinks", lambda: t((1, H, 1, 1), "float32")),            # one value per head: (h_q,) only
])
def test_lengths_and_sinks_must_be_contiguous_vectors(name, tensor):
    with pytest.raises(stridedfa.LayoutError, match=f"^{name}"):
        _core._validate_forward(**forward(), **{name: tensor()})


def test_one_side_of_padding_lengths_is_enough():
    problem = _core._validate_forward(**forward(), seqlens_kv=t((B,), "int32"))
    assert problem["b"] == B


def test_every_option_separates_graph_keys():
    keys = {
        "plain": key(),
        "causal": key(causal=True),
        "window": key(window=(8, 0)),
        "window_wider": key(window=(9, 0)),
        "window_right": key(window=(8, 4)),
        "window_left_unbounded": key(window=(None, 4)),
        "padding": _core._forward_graph_key(**forward(), seqlens_q=t((B,), "int32"),
                                            seqlens_kv=t((B,), "int32"), cudnn_version=92600),
    }
    assert len(set(keys.values())) == len(keys), keys
    assert backward_key(deterministic=True) != backward_key()
    # a window that spans everything is still a different graph from no window (cuDNN masks it)
    assert key(window=(100, 100)) != key()


def _seq_extents(k):
    """(s_q, s_kv) cuDNN is given: q's and k's seq dims in the key (op, dtype, then per operand:
    present flag, 4 dims, 4 strides)."""
    q_dims = k[3:7]
    k_dims = k[3 + 9: 3 + 9 + 4]
    return q_dims[2], k_dims[2]


def test_bottom_right_causal_with_more_queries_describes_only_the_rows_that_see_keys():
    assert _seq_extents(key(s_q=256, s_kv=48, causal=True, causal_alignment="bottom_right")) == (48, 48)
    # with a right bound of 10 keys the first 256 - 48 - 10 rows see nothing
    assert _seq_extents(key(s_q=256, s_kv=48, window=(None, 10), causal_alignment="bottom_right")) == (58, 48)


def test_top_left_windows_cut_rows_and_keys_no_row_sees():
    # rows i >= s_kv + left see no key; keys j > last row + right are seen by none
    assert _seq_extents(key(s_q=256, s_kv=48, window=(16, None))) == (64, 48)
    assert _seq_extents(key(s_q=32, s_kv=512, causal=True)) == (32, 32)


def test_calls_cudnn_has_nothing_to_compute_for_build_no_graph():
    assert backward_key(s_q=1, s_kv=1, h_q=4, h_kv=4) == ()  # dQ = dK = 0, dV = dO: no cuDNN graph
    assert key(s_q=1, s_kv=1) != ()  # the forward runs in cuDNN


def test_one_query_one_key_backward_with_grouped_heads_folds_the_group_into_rows():
    k = backward_key(s_q=1, s_kv=1, h_q=8, h_kv=2, causal=True, causal_alignment="bottom_right")
    q_dims = k[3:7]
    assert tuple(q_dims) == (B, 2, 4, D)  # 4 query heads per kv head described as 4 query rows


@pytest.mark.parametrize("softcap, error", [(0.0, ValueError), (-3.0, ValueError), (float("inf"), ValueError),
                                            (float("nan"), ValueError), (True, TypeError),
                                            (1e-300, ValueError), (1e39, ValueError)])  # not a float32
def test_bad_softcaps_are_refused(softcap, error):
    with pytest.raises(error, match="softcap"):
        _core._validate_forward(**forward(), softcap=softcap)


def test_softcap_separates_graph_keys():
    assert len({key(), key(softcap=30.0), key(softcap=50.0), key(softcap=30.0, causal=True)}) == 4


def test_sinks_are_in_the_key_and_their_gradient_needs_them():
    sinks = t((H,), "float32")
    assert _core._forward_graph_key(**forward(), sinks=sinks, cudnn_version=92600) != key()
    q, k, v, out, grad_out = (t((B, H, 32, D)) for _ in range(5))
    lse = t((B, H, 32), "float32")
    with pytest.raises(stridedfa.LayoutError, match="grad_sinks is given without sinks"):
        _core._validate_backward(q, k, v, out, grad_out, lse, t(q.shape), t(k.shape), t(v.shape),
                                 grad_sinks=t((H,), "float32"))


def test_sinks_with_keys_no_row_sees_are_fine_and_not_sliced():
    """Decoding against a long cache with a window, planned at its exact extents: leading keys are
    cut, every row still sees a key, so sinks are accepted (they are per head: the cut does not touch
    them). (Decoding by heads, the default, keeps the keys' power-of-two extent: test_decode_graphs.py.)"""
    before = _core._decode_graphs()
    _core._decode_graphs(False)
    try:
        k = _core._forward_graph_key(**forward(s_q=4, s_kv=256), causal=True, causal_alignment="bottom_right",
                                     window=(31, None), sinks=t((H,), "float32"), cudnn_version=92600)
    finally:
        _core._decode_graphs(before)
    assert _seq_extents(k) == (4, 35)  # keys 221..255
    with pytest.raises(stridedfa.UnsupportedError, match="sinks"):
        _core._forward_graph_key(**forward(s_q=64, s_kv=16), causal=True, causal_alignment="bottom_right",
                                 sinks=t((H,), "float32"), cudnn_version=92600)


def test_an_empty_batch_with_sinks_is_nothing_for_cudnn():
    """b = 0: every attention output is empty, the sinks' gradient is zeros (a fill, no graph)."""
    q, k, v, out, grad_out = (t((0, H, 32, D)) for _ in range(5))
    problem = _core._validate_backward(q, k, v, out, grad_out, t((0, H, 32), "float32"), t(q.shape), t(k.shape),
                                       t(v.shape), sinks=t((H,), "float32"), grad_sinks=t((H,), "float32"))
    assert problem["nothing_to_do"]
