"""The validator: every rule, checked with fake CUDA tensors on a CPU-only machine.

Failing calls go through the public API: they must raise before cuDNN is even loaded. Passing
layouts go through _core._validate_forward/_backward, which stop after validation (the fake
pointers are never touched).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stridedfa
from helpers.fake_dlpack import CPU, FakeTensor
from stridedfa import _core

B, H, S, D = 2, 4, 16, 64
GiB = 1 << 30
_next_base = itertools.count(1)


def buffer() -> int:
    """A fresh, 256-byte aligned fake address, far from every other buffer."""
    return 0x100000000000 + next(_next_base) * GiB


def tensor(shape=(B, H, S, D), strides=None, dtype="bfloat16", data=None, **kw) -> FakeTensor:
    return FakeTensor(shape, strides, dtype, data=buffer() if data is None else data, **kw)


def forward_args(**override):
    args = {"q": tensor(), "k": tensor(), "v": tensor(), "out": tensor(), "lse": None}
    args.update(override)
    return args


def fails(match, **override):
    args = forward_args(**override)
    with pytest.raises(stridedfa.LayoutError, match=match):
        stridedfa.sdpa_forward(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("out"), **args)


def passes(**override):
    args = forward_args(**override)
    return _core._validate_forward(args["q"], args["k"], args["v"], args["out"], args["lse"])


def test_baseline_passes():
    assert passes() == {"b": B, "h_q": H, "h_kv": H, "s_q": S, "s_kv": S, "d_qk": D, "d_v": D,
                        "device": 0, "dtype": "bfloat16", "nothing_to_do": False, "sequences": None}


# --- Devices and dtypes ---------------------------------------------------------------------------

def test_cpu_tensor():
    fails(r"k needs a CUDA device; it lives in CPU", k=tensor(device=(CPU, 0)))


def test_devices_must_agree():
    fails(r"v is on cuda:1 but q is on cuda:0", v=tensor(device=(2, 1)))


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8"])
def test_operand_dtype(dtype):
    fails(rf"q: dtype {dtype} is not supported; attention operands must be float16 or bfloat16",
          q=tensor(dtype=dtype))


def test_mixed_dtypes():
    fails(r"out: dtype float16 differs from q's bfloat16", out=tensor(dtype="float16"))


def test_stats_dtype():
    fails(r"lse: dtype bfloat16 is not supported; .*float32", lse=tensor((B, H, S), dtype="bfloat16"))


# --- Shapes -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("override, match", [
    ({"q": tensor((B, H, S))}, r"q: expected 4 axes .*got 3"),
    ({"k": tensor((B + 1, H, S, D))}, r"k: batch \(axis 0\) is 3 but q's is 2"),
    ({"k": tensor((B, H, S, 32))}, r"k: head_dim \(axis 3\) is 32 but q's is 64"),
    ({"v": tensor((B, H, S + 8, D))}, r"v: axis 2 \(seq\) is 24 but k's is 16"),
    ({"k": tensor((B, 3, S, D)), "v": tensor((B, 3, S, D))}, r"q has 4 heads and k has 3; .*multiple"),
    ({"out": tensor((B, H, S, 32))}, r"out: shape \(2, 4, 16, 32\) .*axis 3 \(head_dim\) is 32, expected 64"),
    ({"out": tensor((B, H, 8, D))}, r"out: .*axis 2 \(seq\) is 8, expected 16"),
    ({"lse": tensor((B, H, S + 1), dtype="float32")}, r"lse: shape \(2, 4, 17, 1\) does not match"),
    ({"lse": tensor((B, H, S, 2), dtype="float32")}, r"lse: expected shape \(batch, heads of q, seq of q\)"),
])
def test_shape_mismatches(override, match):
    fails(match, **override)


def test_gqa_mqa_and_d_v_pass():
    gqa = passes(q=tensor((B, 8, S, D)), k=tensor((B, 2, 32, D)), v=tensor((B, 2, 32, 128)),
                 out=tensor((B, 8, S, 128)), lse=tensor((B, 8, S), dtype="float32"))
    assert (gqa["h_q"], gqa["h_kv"], gqa["s_kv"], gqa["d_v"]) == (8, 2, 32, 128)
    mqa = passes(k=tensor((B, 1, S, D)), v=tensor((B, 1, S, D)))
    assert mqa["h_kv"] == 1
    assert passes(lse=tensor((B, H, S, 1), dtype="float32"))["s_q"] == S


# --- Strides and alignment -----------------------------------------------------------------------

def test_head_dim_must_be_contiguous():
    fails(r"q: axis 3 \(head_dim\) has stride 2; cuDNN needs the head_dim axis contiguous",
          q=tensor(strides=(H * S * D * 2, S * D * 2, D * 2, 2)))


def test_negative_stride():
    fails(r"k: axis 2 \(seq\) has negative stride -64", k=tensor(strides=(H * S * D, S * D, -D, 1)))


def test_broadcast_input():
    fails(r"k: axis 1 \(heads\) has stride 0 \(a broadcast view\).*GQA", k=tensor(strides=(S * D, 0, D, 1)))


def test_broadcast_output():
    fails(r"out: axis 0 \(batch\) has stride 0 .*output needs", out=tensor(strides=(0, S * D, D, 1)))


def test_misaligned_stride():
    # seq stride of 68 bf16 elements = 136 bytes: what a row padded by 4 elements gives.
    fails(r"v: axis 2 \(seq\) has stride 68 elements = 136 bytes, not a multiple of 16 bytes.*8 elements",
          v=tensor(strides=(H * S * 68, S * 68, 68, 1)))


def test_misaligned_pointer():
    fails(r"q: data pointer 0x[0-9a-f]+ is 8 bytes past a 16-byte boundary", q=tensor(data=buffer() + 8))


def test_byte_offset_counts_for_alignment():
    fails(r"q: data pointer .* is 2 bytes past", q=tensor(byte_offset=2))


def test_extent_one_axes_take_any_stride():
    # b = 1 and h = 1 with odd, negative and zero strides on those axes.
    one = dict(shape=(1, 1, S, D), strides=(3, -7, D, 1))
    assert passes(q=tensor(**one), k=tensor(**one), v=tensor(**one),
                  out=tensor((1, 1, S, D), strides=(0, 1, D, 1)))["b"] == 1


def test_stats_strides_are_not_alignment_checked():
    # lse with a seq stride of 1 and a heads stride of S + 1 (not a multiple of 4 floats).
    assert passes(lse=tensor((B, H, S), strides=(H * (S + 1), S + 1, 1), dtype="float32"))["b"] == B


# --- Aliasing ---------------------------------------------------------------------------------------

def packed_qkv(b=B, s=S, h=H, d=D, data=None):
    """q, k, v as views of one packed [b, s, 3, h, d] buffer."""
    base = buffer() if data is None else data
    strides = (s * 3 * h * d, d, 3 * h * d, 1)
    return [tensor((b, h, s, d), strides, data=base + i * h * d * 2) for i in range(3)]


def test_packed_views_pass_as_inputs_and_outputs():
    q, k, v = packed_qkv()
    assert passes(q=q, k=k, v=v)["s_q"] == S
    # gradients written into the three slices of one packed buffer: disjoint, though interleaved
    q, k, v, out, d_out = tensor(), tensor(), tensor(), tensor(), tensor()
    dq, dk, dv = packed_qkv()
    lse = tensor((B, H, S), dtype="float32")
    assert not _core._validate_backward(q, k, v, out, d_out, lse, dq, dk, dv)["nothing_to_do"]


def test_output_overlapping_an_input():
    q, k, v = packed_qkv()
    fails(r"out overlaps k in memory", q=q, k=k, v=v, out=tensor(q.shape, q.strides, data=k.data))


def test_output_overlapping_itself():
    # heads stride 32 < head_dim 64: heads share elements.
    fails(r"out: two of its elements share memory", out=tensor(strides=(H * S * D, 32, H * 32 + D, 1)))


def test_gradients_overlapping_each_other():
    q, k, v, out, d_out = tensor(), tensor(), tensor(), tensor(), tensor()
    lse = tensor((B, H, S), dtype="float32")
    dq = tensor()
    dk = tensor(data=dq.data + 64 * 2 * 8)  # 8 rows into dq
    with pytest.raises(stridedfa.LayoutError, match=r"grad_k overlaps grad_q"):
        stridedfa.sdpa_backward(q, k, v, out, d_out, lse, dq, dk, tensor())


def test_lse_overlapping_out():
    out = tensor()
    fails(r"lse overlaps out", out=out, lse=tensor((B, H, S), dtype="float32", data=out.data + 4096))


def test_inputs_may_alias_each_other():
    q = tensor()
    assert passes(q=q, k=q, v=q)["b"] == B


# --- Empty problems ---------------------------------------------------------------------------------

def test_empty_output_means_nothing_to_do():
    empty = dict(shape=(0, H, S, D))
    assert passes(q=tensor(**empty), k=tensor(**empty), v=tensor(**empty), out=tensor(**empty))["nothing_to_do"]
    zero_seq = passes(q=tensor((B, H, 0, D)), out=tensor((B, H, 0, D)))
    assert zero_seq["nothing_to_do"]


def test_empty_keys_with_a_nonempty_output_are_unsupported():
    k = tensor((B, H, 0, D))
    with pytest.raises(stridedfa.UnsupportedError, match=r"s_kv is 0 while an output has elements"):
        stridedfa.sdpa_forward(tensor(), k, tensor((B, H, 0, D)), tensor())


def test_zero_size_tensors_skip_pointer_and_stride_rules():
    # CuPy exports zero-size arrays with all-zero strides and a NULL pointer.
    z = dict(shape=(B, H, 0, D), strides=(0, 0, 0, 0), data=0)
    assert passes(q=tensor(**z), out=tensor(**z))["nothing_to_do"]


# --- Options -----------------------------------------------------------------------------------------

def test_bad_options():
    q = tensor()
    with pytest.raises(ValueError, match="causal_alignment must be 'top_left' or 'bottom_right'"):
        stridedfa.sdpa_forward(q, q, q, tensor(), causal=True, causal_alignment="center")
    with pytest.raises(stridedfa.LayoutError, match="scale must be a finite number"):
        stridedfa.sdpa_forward(q, q, q, tensor(), scale=float("nan"))


# --- Exact overlap against brute force -------------------------------------------------------------

def footprint(shape, strides, base, item):
    """Every byte a tensor covers."""
    bytes_ = set()
    for index in itertools.product(*(range(n) for n in shape)):
        start = base + item * sum(i * s for i, s in zip(index, strides))
        bytes_.update(range(start, start + item))
    return bytes_


extents = st.lists(st.integers(1, 3), min_size=3, max_size=3)      # b, h, s (head_dim is 8)
strides8 = st.lists(st.integers(1, 12), min_size=3, max_size=3)    # b, h, s strides / 8 elements
offsets = st.integers(0, 40)                                        # base offset / 16 bytes


@settings(max_examples=200, deadline=None)
@given(extents, strides8, offsets, strides8, offsets)
def test_overlap_is_exact(shape3, out_strides8, out_offset, in_strides8, in_offset):
    """The validator's verdict on (out vs itself, out vs q) equals a brute-force byte comparison."""
    shape, base = tuple(shape3) + (8,), 0x100000000
    out_strides = tuple(8 * s for s in out_strides8) + (1,)
    in_strides = tuple(8 * s for s in in_strides8) + (1,)
    out_bytes = footprint(shape, out_strides, base + 16 * out_offset, 2)
    in_bytes = footprint(shape, in_strides, base + 16 * in_offset, 2)
    if len(out_bytes) < 2 * int(np.prod(shape)):
        expected = "share memory"
    elif out_bytes & in_bytes:
        expected = "out overlaps q"
    else:
        expected = None

    q = FakeTensor(shape, in_strides, data=base + 16 * in_offset)
    out = FakeTensor(shape, out_strides, data=base + 16 * out_offset)
    if expected is None:
        _core._validate_forward(q, q, q, out)
    else:
        with pytest.raises(stridedfa.LayoutError, match=expected):
            _core._validate_forward(q, q, q, out)


@pytest.mark.parametrize("name", ["scale", "softcap", "dropout_p"])
@pytest.mark.parametrize("value", [True, np.True_, "0.5", b"1"], ids=repr)
def test_the_options_parse_refuses_bools_and_strings_of_any_producer(name, value):
    """The one parse of a call's options (every entry point's, JAX's too): a number, never a bool
    (NumPy's included, whose type NumPy 2 names "bool") or a string, refused by type."""
    with pytest.raises(TypeError, match=f"^{name} must be a number"):
        _core._sdpa_options(**{name: value})
    assert _core._sdpa_options(**{name: np.float32(0.25)})[name] == 0.25
