"""The layout rule has two halves that must agree: the C++ one the core allocates with
(cpp/include/stridedfa/layout_rules.hpp) and the symbolic Python twin fake tensors use under
torch.compile (stridedfa._layouts). Checked on an exhaustive grid of small layouts (every axis
order, padded or not, extent-1 axes with arbitrary strides, empty axes) and on random ones."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from stridedfa import _core, _layouts


def grid(ndim):
    """Shapes with extents in {0, 1, 2, 3} and, for each, strides of every axis order, dense or
    padded by one element per axis, and extent-1 axes given an unrelated stride."""
    for shape in itertools.product((0, 1, 2, 3), repeat=ndim):
        for order in itertools.permutations(range(ndim)):
            for pad in (0, 1):
                strides, step = [0] * ndim, 1
                for axis in reversed(order):
                    strides[axis] = step
                    step = step * max(shape[axis], 1) + pad
                yield shape, tuple(strides)
                odd = tuple(7919 if n == 1 else s for n, s in zip(shape, strides))
                if odd != tuple(strides):
                    yield shape, odd


def test_output_strides_agree_on_the_grid():
    for shape, strides in grid(4):
        assert _core._output_strides(shape, strides) == _layouts.output_strides(shape, strides), (shape, strides)


def test_gradient_strides_agree_on_the_grid():
    for ndim in (4, 5):  # attention operands, and the packed entry point's 5-axis buffer
        for shape, strides in grid(ndim):
            assert _core._gradient_strides(shape, strides) == _layouts.gradient_strides(shape, strides), (
                shape, strides)


@settings(max_examples=300, deadline=None)
@given(shape=st.lists(st.integers(0, 9), min_size=4, max_size=4),
       strides=st.lists(st.integers(0, 5000), min_size=4, max_size=4))
def test_output_strides_agree_on_random_layouts(shape, strides):
    assert _core._output_strides(tuple(shape), tuple(strides)) == _layouts.output_strides(shape, strides)


@settings(max_examples=300, deadline=None)
@given(shape=st.lists(st.integers(0, 6), min_size=5, max_size=5),
       strides=st.lists(st.integers(0, 3000), min_size=5, max_size=5))
def test_gradient_strides_agree_on_random_layouts(shape, strides):
    assert _core._gradient_strides(tuple(shape), tuple(strides)) == _layouts.gradient_strides(shape, strides)


@settings(max_examples=60, deadline=None)
@given(tokens=st.integers(1, 300), tokens_kv=st.integers(1, 300), heads=st.sampled_from([(8, 8), (8, 2), (4, 1)]),
       d=st.sampled_from([(64, 64), (128, 64)]), q_order=st.sampled_from(["token_major", "head_major", "packed"]))
def test_varlen_outputs_follow_the_symbolic_twin(tokens, tokens_kv, heads, d, q_order):
    """A variable-length call's out, lse and gradients as the C++ rule allocates them, against
    _layouts (the fakes' rule), whatever q's strides (views of a packed projection, head-major)."""
    from helpers.fake_dlpack import FakeTensor, row_major
    h_q, h_kv = heads
    d_qk, d_v = d
    q_strides = {"token_major": row_major((tokens, h_q, d_qk)), "head_major": (d_qk, tokens * d_qk, 1),
                 "packed": (3 * h_q * d_qk, d_qk, 1)}[q_order]
    inputs = {"q": FakeTensor((tokens, h_q, d_qk), q_strides), "k": FakeTensor((tokens_kv, h_kv, d_qk)),
              "v": FakeTensor((tokens_kv, h_kv, d_v), data=0x7F0000100000),
              "cu_seqlens_q": FakeTensor((3,), dtype="int32"), "cu_seqlens_kv": FakeTensor((3,), dtype="int32")}
    rule = _core._output_layouts(inputs, "out lse grad_q grad_k grad_v")
    out_shape = (tokens, h_q, d_v)
    assert rule["out"] == (out_shape, _layouts.contiguous_strides(out_shape))
    assert rule["lse"] == _layouts.varlen_lse((tokens, h_q, d_qk))
    for name, shape in (("grad_q", (tokens, h_q, d_qk)), ("grad_k", (tokens_kv, h_kv, d_qk)),
                        ("grad_v", (tokens_kv, h_kv, d_v))):
        assert rule[name] == (shape, _layouts.contiguous_strides(shape)), name
