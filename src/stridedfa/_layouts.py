"""How adapters lay out what they allocate: the one rule every framework adapter follows.

Works on plain shape/stride tuples (in elements), so torch (also on fake tensors under
torch.compile), CuPy and the core's own allocation path produce identical strides:

- the attention output is dense in q's axis order (a bshd-ordered q gives a bshd-ordered out);
- a gradient has its input's strides when the input is dense, else it is dense in the input's axis
  order (q/k/v views of a packed buffer get compact gradients; the packed entry points instead
  allocate one packed gradient buffer);
- a variable-length (THD) call's out and gradients are contiguous (token-major: cuDNN sums grouped
  heads only into those), its statistics (heads, tokens) over token-major memory.
"""

from __future__ import annotations

from collections.abc import Sequence


def axis_order(strides: Sequence[int], shape: Sequence[int]) -> list[int]:
    """Axes from outermost to innermost in memory; ties keep the logical order.

    Axes of extent 1 go outermost (in logical order) whatever their strides: such a stride is
    arbitrary (producers differ in what they export for it), so it must not decide the strides of
    what is allocated from it.
    """
    # bool()/int() turn torch.SymInt comparisons (fake tensors under dynamic shapes) into guards.
    return sorted(range(len(strides)),
                  key=lambda axis: (bool(shape[axis] != 1),
                                    -int(strides[axis]) if bool(shape[axis] != 1) else 0))


def dense_strides(shape: Sequence[int], order: Sequence[int]) -> tuple[int, ...]:
    """Strides of a dense array of `shape` whose axes lie in memory in `order` (outer to inner)."""
    strides = [0] * len(shape)
    step = 1
    for axis in reversed(order):
        strides[axis] = step
        if bool(shape[axis] > 1):
            step = step * shape[axis]
    return tuple(strides)


def is_dense(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """True when the array covers exactly prod(shape) contiguous elements (any axis order)."""
    expected = 1
    for axis in sorted(range(len(shape)), key=lambda a: int(strides[a])):
        if bool(shape[axis] == 1):
            continue
        if bool(strides[axis] != expected):
            return False
        expected = expected * shape[axis]
    return True


def output_strides(out_shape: Sequence[int], q_strides: Sequence[int]) -> tuple[int, ...]:
    """Strides of the attention output: dense, in q's axis order. out and q share their b, h and s
    extents, so out's shape tells which axes have extent 1."""
    return dense_strides(out_shape, axis_order(q_strides, out_shape))


def gradient_strides(shape: Sequence[int], strides: Sequence[int]) -> tuple[int, ...]:
    """Strides of the gradient of an input with this shape and these strides."""
    if is_dense(shape, strides):
        return tuple(strides)
    return dense_strides(shape, axis_order(strides, shape))


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides: a variable-length call's out (tokens, heads, d_v) and gradients."""
    return dense_strides(shape, range(len(shape)))


def varlen_lse(q_shape: Sequence[int]) -> tuple[tuple[int, int], tuple[int, int]]:
    """A variable-length call's statistics, (shape, strides): (heads, tokens) over (tokens, heads)
    memory, strides (1, heads). They do not depend on the token count, so one graph serves every
    batch of a length bucket (a contiguous (heads, tokens) would key each token count)."""
    tokens, heads = q_shape[0], q_shape[1]
    return (heads, tokens), (1, heads)
