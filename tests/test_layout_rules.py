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
