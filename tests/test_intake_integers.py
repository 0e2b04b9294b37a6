"""Intake of implausible integers (CPU-only): negative, zero, huge and absurd strides, extents and
offsets from NumPy, from a hand-made producer through both capsule kinds and through the DLPack C
exchange API, and CuPy's unsigned stride export. Whatever a producer hands over, the call either
reads it exactly or refuses it with a LayoutError naming the tensor and axis -- before anything
could be launched -- and every consumed tensor is released once.

(A CUDA-device FakeTensor's pointers are never dereferenced: these calls stop at validation,
which runs before cuDNN is even loaded.)
"""

from __future__ import annotations

import numpy as np
import pytest

import stridedfa
from helpers.fake_dlpack import ExchangeTensor, FakeTensor
from stridedfa import _core

inspect = _core._inspect_dlpack
SHAPE = (2, 4, 128, 64)
ROW_MAJOR = (4 * 128 * 64, 128 * 64, 64, 1)
BASE = 0x7F0000000000  # a typical device address, 2^47 - 2^40
STRIDE_2_63_MINUS_64 = 2**63 - 64  # what CuPy 14.2 exports for a float16 stride of -64 elements


def producers():
    """The three intake paths a hand-made producer can take."""
    return [
        pytest.param(lambda **kw: FakeTensor(**kw), id="versioned"),
        pytest.param(lambda **kw: FakeTensor(versioned=False, **kw), id="legacy"),
        pytest.param(lambda **kw: ExchangeTensor(**kw), id="exchange-api"),
    ]


def with_stride(axis, value, strides=ROW_MAJOR):
    return tuple(value if i == axis else s for i, s in enumerate(strides))


def released_once(t) -> bool:
    # A consumed capsule's deleter runs exactly once; the exchange API borrows (no deleter).
    return t.deleted == 1 if not isinstance(t, ExchangeTensor) else t.deleted == 0


# --- Refused: layouts no memory can hold -----------------------------------------------------------

@pytest.mark.parametrize("make", producers())
@pytest.mark.parametrize("stride", [2**62, -(2**62), STRIDE_2_63_MINUS_64, 2**63 - 1, -(2**63)])
def test_absurd_strides_are_refused_naming_tensor_and_axis(make, stride):
    q = make(shape=SHAPE, strides=with_stride(2, stride), data=BASE)
    with pytest.raises(stridedfa.LayoutError, match=rf"q: its layout reaches memory (below address 0|beyond "
                                                    rf"2\^57).*axis 2 has stride {stride} elements"):
        stridedfa.sdpa_forward(q, q, q, FakeTensor(SHAPE, data=BASE + (1 << 40)))
    assert released_once(q)


@pytest.mark.parametrize("make", producers())
def test_a_valid_stride_ending_past_2_57_is_refused(make):
    # Each stride alone is plausible; together with the pointer the tensor leaves the address space.
    q = make(shape=SHAPE, strides=with_stride(0, 2**55), data=2**56)
    with pytest.raises(stridedfa.LayoutError, match=r"q: .*beyond 2\^57.*axis 0 has stride 36028797018963968"):
        stridedfa.sdpa_forward(q, q, q, FakeTensor(SHAPE))


@pytest.mark.parametrize("make", producers())
def test_negative_strides_below_address_zero_are_refused(make):
    q = make(shape=SHAPE, strides=with_stride(2, -64), data=0x1000)  # 127 rows of 128 bytes below
    with pytest.raises(stridedfa.LayoutError, match=r"q: its layout reaches memory below address 0"):
        stridedfa.sdpa_forward(q, q, q, FakeTensor(SHAPE))


@pytest.mark.parametrize("make", producers())
def test_plausible_negative_strides_get_the_validators_reason(make):
    q = make(shape=SHAPE, strides=with_stride(2, -64), data=BASE)
    with pytest.raises(stridedfa.LayoutError,
                       match=r"q: axis 2 \(seq\) has negative stride -64; .*cupy\.ascontiguousarray"):
        stridedfa.sdpa_forward(q, q, q, FakeTensor(SHAPE, data=BASE + (1 << 40)))


@pytest.mark.parametrize("make", producers())
def test_negative_extent_is_refused(make):
    q = make(shape=(2, -4, 128, 64), data=BASE)
    with pytest.raises(stridedfa.LayoutError, match=r"q: axis 1 has extent -4; extents cannot be negative"):
        stridedfa.sdpa_forward(q, q, q, FakeTensor(SHAPE))


def test_element_count_past_int64_is_refused():
    q = FakeTensor((2**40, 2**40, 1, 64), strides=(0, 0, 0, 1))  # a broadcast of absurd extent
    with pytest.raises(stridedfa.LayoutError, match=r"q: its extents multiply to more than 2\^63 elements"):
        stridedfa.sdpa_forward(q, q, q, FakeTensor(SHAPE))


def test_row_major_strides_of_an_absurd_shape_are_refused_by_its_element_count():
    q = FakeTensor((2**33, 2**33, 1, 64), null_strides=True)
    with pytest.raises(stridedfa.LayoutError, match=r"x: its extents multiply to more than 2\^63 elements"):
        inspect(q)
    assert inspect(FakeTensor((0, 2**40, 2**40, 64), null_strides=True))["shape"][0] == 0


def test_byte_offset_that_wraps_the_address_space_is_refused():
    q = FakeTensor(SHAPE, data=2**64 - 4096, byte_offset=8192)
    with pytest.raises(stridedfa.LayoutError, match=r"q: data pointer \d+ plus byte_offset 8192 wraps around"):
        stridedfa.sdpa_forward(q, q, q, FakeTensor(SHAPE))
    assert q.deleted == 1


def test_negative_device_ordinal_is_refused():
    q = FakeTensor(SHAPE, device=(2, -1))
    with pytest.raises(stridedfa.LayoutError, match=r"q: its producer reports CUDA device -1"):
        stridedfa.sdpa_forward(q, q, q, FakeTensor(SHAPE, device=(2, -1), data=BASE + (1 << 40)))


def test_absurd_strides_of_an_output_are_refused_and_nothing_else_read():
    q = FakeTensor(SHAPE)
    out = FakeTensor(SHAPE, strides=with_stride(1, 2**61), data=BASE + (1 << 40))
    with pytest.raises(stridedfa.LayoutError, match=r"out: its layout reaches memory beyond 2\^57"):
        stridedfa.sdpa_forward(q, q, q, out)
    assert out.deleted == 1 and q.deleted == 3


def test_backward_operands_are_checked_too():
    good = [FakeTensor(SHAPE, data=BASE + (i << 36)) for i in range(8)]
    lse = FakeTensor(SHAPE[:3], dtype="float32", data=BASE + (9 << 36), strides=(2**62, 128, 1))
    with pytest.raises(stridedfa.LayoutError,
                       match=r"lse: its layout reaches memory beyond 2\^57.*\(axis 0 has stride 4611686018427387904"):
        stridedfa.sdpa_backward(*good[:5], lse, *good[5:])


# --- Accepted exactly: zero, negative and huge strides that describe real memory --------------------

@pytest.mark.parametrize("make", producers())
@pytest.mark.parametrize("stride", [2**31 + 64, 2**32 + 64, 2**40])
def test_huge_valid_strides_are_read_exactly_and_validate(make, stride):
    q = make(shape=SHAPE, strides=with_stride(0, stride), data=BASE)
    assert inspect(q)["strides"] == with_stride(0, stride)
    q = make(shape=SHAPE, strides=with_stride(0, stride), data=BASE)
    out = FakeTensor(SHAPE, data=BASE + (1 << 44))
    problem = _core._validate_forward(q, q, q, out)
    assert problem["b"] == 2


@pytest.mark.parametrize("make", producers())
def test_any_stride_of_an_extent_one_axis_is_accepted(make):
    shape = (2, 1, 128, 64)
    for odd in (0, -5, 3, 2**62, -(2**63)):
        q = make(shape=shape, strides=(128 * 64, odd, 64, 1), data=BASE)
        assert _core._validate_forward(q, q, q, FakeTensor(shape, data=BASE + (1 << 40)))["h_q"] == 1


@pytest.mark.parametrize("make", producers())
def test_empty_tensors_take_any_strides(make):
    q = make(shape=(2, 0, 128, 64), strides=(2**62, -(2**62), 2**63 - 1, 1), data=0)
    assert inspect(q)["shape"] == (2, 0, 128, 64)


# --- NumPy as the producer (CPU intake) -------------------------------------------------------------

def test_numpy_negative_strides_are_read_exactly():
    a = np.zeros(SHAPE, np.float16)
    r = a[:, :, ::-1]
    seen = inspect(r)
    assert seen["strides"] == (32768, 8192, -64, 1)
    assert seen["data"] == r.__array_interface__["data"][0]


def test_numpy_zero_and_huge_strides_are_read_exactly():
    a = np.zeros(8, np.float16)
    z = np.lib.stride_tricks.as_strided(a, shape=(2, 4, 128, 8), strides=(0, 0, 0, 2))
    assert inspect(z)["strides"] == (0, 0, 0, 1)
    huge = np.lib.stride_tricks.as_strided(a, shape=(2, 1, 1, 8), strides=((2**31 + 64) * 2, 2, 2, 2))
    assert inspect(huge)["strides"] == (2**31 + 64, 1, 1, 1)


@pytest.mark.parametrize("stride", [2**62, -(2**62)])
def test_numpy_absurd_strides_are_refused(stride):
    a = np.zeros(1, np.int8)
    absurd = np.lib.stride_tricks.as_strided(a, shape=(2, 2), strides=(stride, 1))
    with pytest.raises(stridedfa.LayoutError, match=rf"x: its layout reaches memory .*axis 0 has stride {stride}"):
        inspect(absurd)


# --- CuPy's unsigned stride export -------------------------------------------------------------------

class CupyExport(FakeTensor):
    """Exports strides the way CuPy 14.2's toDlpack computes them: the signed byte stride divided
    by an unsigned itemsize (its type's module makes intake treat it as CuPy's)."""

    def __init__(self, shape, byte_strides, dtype="float16", **kwargs):
        itemsize = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}[dtype]
        unsigned = tuple((s % 2**64) // itemsize for s in byte_strides)
        as_int64 = tuple(u - 2**64 if u >= 2**63 else u for u in unsigned)
        super().__init__(shape, as_int64, dtype, **kwargs)


CupyExport.__module__ = "cupy._core.fake_export"  # not "ndarray": intake takes the DLPack path


@pytest.mark.parametrize("dtype,byte_strides,elements", [
    ("float16", (65536, 16384, -128, 2), (32768, 8192, -64, 1)),  # c[:, :, ::-1], the reported case
    ("float16", (65536, 16384, 128, -2), (32768, 8192, 64, -1)),
    ("float32", (-32, 4), (-8, 1)),
    ("float64", (-8 * 1000, 8), (-1000, 1)),
])
def test_cupy_unsigned_stride_export_is_read_as_the_signed_stride(dtype, byte_strides, elements):
    shape = SHAPE if len(byte_strides) == 4 else (4, 8)
    t = CupyExport(shape, byte_strides, dtype, data=BASE)
    assert t.strides != elements  # what the producer really exported
    assert inspect(t, stream=0)["strides"] == elements


def test_cupy_reversed_view_gets_the_negative_stride_error_not_a_launch():
    q = CupyExport(SHAPE, (65536, 16384, -128, 2), "bfloat16", data=BASE)
    assert q.strides[2] == STRIDE_2_63_MINUS_64
    with pytest.raises(stridedfa.LayoutError, match=r"q: axis 2 \(seq\) has negative stride -64"):
        stridedfa.sdpa_forward(q, FakeTensor(SHAPE), FakeTensor(SHAPE), FakeTensor(SHAPE, data=BASE + (1 << 40)),
                               stream=0)
    assert q.deleted == 1


def test_the_same_value_from_another_producer_is_refused_as_implausible():
    q = FakeTensor(SHAPE, strides=with_stride(2, STRIDE_2_63_MINUS_64), data=BASE)
    with pytest.raises(stridedfa.LayoutError, match=r"q: its layout reaches memory beyond 2\^57"):
        stridedfa.sdpa_forward(q, q, q, FakeTensor(SHAPE))


# --- The backward's 32-bit offsets for out and grad_out ---------------------------------------------

@pytest.mark.parametrize("slot", ["out", "grad_out"])
def test_backward_refuses_out_and_grad_out_beyond_4_gib(slot):
    args = {name: FakeTensor(SHAPE, data=BASE + (i << 36)) for i, name in
            enumerate(("q", "k", "v", "out", "grad_out", "grad_q", "grad_k", "grad_v"))}
    args["lse"] = FakeTensor(SHAPE[:3], dtype="float32", data=BASE + (9 << 36))
    args[slot] = FakeTensor(SHAPE, strides=with_stride(0, 2**31 - 4096), data=BASE + (10 << 36))
    order = ("q", "k", "v", "out", "grad_out", "lse", "grad_q", "grad_k", "grad_v")
    with pytest.raises(stridedfa.UnsupportedError, match=rf"{slot}: its elements reach \d+ bytes .* 4 GiB"):
        _core._validate_backward(*(args[n] for n in order))
    for other in ("q", "k", "v", "grad_q", "grad_k", "grad_v"):
        args = {name: FakeTensor(SHAPE, data=BASE + (i << 36)) for i, name in enumerate(order)}
        args["lse"] = FakeTensor(SHAPE[:3], dtype="float32", data=BASE + (9 << 36))
        # read and written correctly beyond 2^31 elements (seen on cuDNN 9.19) ...
        args[other] = FakeTensor(SHAPE, strides=with_stride(0, 2**31 + 64), data=BASE + (10 << 36))
        assert _core._validate_backward(*(args[n] for n in order))["b"] == 2
        # ... but not beyond 2^32 elements
        args[other] = FakeTensor(SHAPE, strides=with_stride(0, 2**32 + 64), data=BASE + (10 << 36))
        with pytest.raises(stridedfa.UnsupportedError, match=rf"{other}: its elements reach \d+ elements"):
            _core._validate_backward(*(args[n] for n in order))
