"""DLPack intake: how the Cython boundary reads tensors from producers (CPU-only)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import stridedfa
from helpers.fake_dlpack import CPU, ExchangeTensor, FakeTensor, StrictStreamTensor
from stridedfa import _core

inspect = _core._inspect_dlpack


# --- NumPy as the producer ------------------------------------------------------------------------

def numpy_view(x: np.ndarray) -> dict:
    item = x.itemsize
    return {"shape": x.shape, "strides": tuple(s // item for s in x.strides),
            "data": x.__array_interface__["data"][0]}


@pytest.mark.parametrize("make", [
    pytest.param(lambda a: a, id="contiguous"),
    pytest.param(lambda a: a.transpose(0, 2, 1, 3), id="transpose"),
    pytest.param(lambda a: a[:, 1:3, ::2], id="slice-step"),
    pytest.param(lambda a: a[1:, :, 2:], id="slice-offset"),
    pytest.param(lambda a: a[:, :, :, 0:1], id="extent-1"),
])
def test_numpy_views_are_read_as_they_are(make):
    base = np.arange(2 * 3 * 4 * 8, dtype=np.float32).reshape(2, 3, 4, 8)
    x = make(base)
    seen = inspect(x)
    expected = numpy_view(x)
    assert seen["shape"] == expected["shape"]
    assert seen["strides"] == expected["strides"]
    assert seen["data"] == expected["data"]  # NumPy folds offsets into data; no copy was made
    assert seen["dtype"] == "float32"
    assert seen["device"] == (CPU, 0)
    assert seen["read_only"] is False


def test_numpy_zero_size_and_stride_zero():
    empty = np.zeros((2, 0, 4, 8), dtype=np.float16)
    assert inspect(empty)["shape"] == (2, 0, 4, 8)
    broadcast = np.broadcast_to(np.ones((1, 1, 1, 8), np.float16), (2, 3, 4, 8))
    seen = inspect(broadcast)
    assert seen["strides"] == (0, 0, 0, 1)
    assert seen["read_only"] is True  # NumPy exports broadcast views read-only


def test_numpy_read_only_flag_is_seen():
    x = np.ones((2, 2, 2, 8), np.float32)
    x.flags.writeable = False
    seen = inspect(x)
    assert seen["read_only"] is True
    assert seen["capsule"] == "versioned"  # read-only travels only in versioned capsules


def test_numpy_array_is_rejected_by_a_call_before_any_stream_is_passed():
    q = np.ones((1, 1, 16, 64), np.float16)
    with pytest.raises(stridedfa.LayoutError, match=r"q needs a CUDA device; it lives in CPU \(numpy"):
        stridedfa.sdpa_forward(q, q, q, q.copy())


# --- Capsule protocol -----------------------------------------------------------------------------

def test_versioned_capsule_byte_offset_and_deleter_once():
    t = FakeTensor((2, 4, 8, 64), data=0x10000, byte_offset=64)
    seen = inspect(t)
    assert seen["capsule"] == "versioned"
    assert seen["data"] == 0x10000 + 64  # byte_offset folded into the address
    assert t.deleted == 1
    gc.collect()
    assert t.deleted == 1  # the used capsule's destructor must not call it again


def test_legacy_capsule_when_producer_ignores_max_version():
    t = FakeTensor((2, 4, 8, 64), versioned=False)
    seen = inspect(t)
    assert seen["capsule"] == "legacy"
    assert t.deleted == 1
    gc.collect()
    assert t.deleted == 1


def test_null_strides_mean_row_major():
    t = FakeTensor((2, 3, 5, 8), null_strides=True)
    assert inspect(t)["strides"] == (120, 40, 8, 1)


def test_unsupported_major_version_is_refused_and_released():
    t = FakeTensor((1, 1, 8, 64), version=(2, 0))
    with pytest.raises(stridedfa.UnsupportedError, match=r"DLPack 2\.0; stridedfa reads DLPack 1\.x"):
        inspect(t)
    assert t.deleted == 1


def test_read_only_output_is_refused():
    q = FakeTensor((1, 2, 16, 64))
    out = FakeTensor((1, 2, 16, 64), data=0x7F1000000000, read_only=True)
    with pytest.raises(stridedfa.LayoutError, match="out is read-only"):
        stridedfa.sdpa_forward(q, q, q, out)
    assert out.deleted == 1 and q.deleted == 3  # every consumed tensor released on the error path


def test_not_a_dlpack_object():
    with pytest.raises(TypeError, match=r"k: expected a DLPack tensor .*got builtins\.list"):
        stridedfa.sdpa_forward(FakeTensor((1, 1, 8, 64)), [1, 2], None, None)


# --- Streams ----------------------------------------------------------------------------------------

def test_default_stream_is_passed_as_1_never_0_or_minus_1():
    t = StrictStreamTensor((1, 1, 8, 64), refuse=(0, 2, -1))
    seen = inspect(t)
    assert t.streams == [1]  # legacy default stream, spelled as the protocol wants
    assert seen["stream"] == 0


@pytest.mark.parametrize("stream", [0x5000, "object"])
def test_explicit_stream_reaches_the_producer(stream):
    class Stream:
        def __cuda_stream__(self):
            return (0, 0x5000)

    t = FakeTensor((1, 1, 8, 64))
    seen = inspect(t, stream=Stream() if stream == "object" else stream)
    assert t.streams == [0x5000]
    assert seen["stream"] == 0x5000


@pytest.mark.parametrize("bad, error", [(-3, ValueError), (1.5, TypeError), (True, TypeError)])
def test_bad_stream_arguments(bad, error):
    with pytest.raises(error):
        inspect(FakeTensor((1, 1, 8, 64)), stream=bad)


def test_exchange_api_borrows_without_dlpack_and_takes_the_current_stream():
    ExchangeTensor.current_stream = 0x7000
    t = ExchangeTensor((2, 4, 8, 64), strides=(4096, 64, 512, 1))
    seen = inspect(t)
    assert seen["path"] == "exchange_api" and seen["capsule"] == "borrowed"
    assert t.borrowed == 1 and t.streams == [] and t.deleted == 0
    assert seen["strides"] == (4096, 64, 512, 1)
    assert seen["stream"] == 0x7000


def test_exchange_api_producer_on_another_stream_is_ordered_through_the_protocol():
    ExchangeTensor.current_stream = 0x7000
    t = ExchangeTensor((2, 4, 8, 64))
    seen = inspect(t, stream=0x9000)
    assert t.streams == [0x9000]  # __dlpack__(stream=ours): the producer orders its work first
    assert seen["capsule"] == "versioned" and t.deleted == 1


def test_call_stream_follows_the_first_exchange_api_tensor():
    ExchangeTensor.current_stream = 0x7000
    q = ExchangeTensor((1, 2, 16, 64))
    k = StrictStreamTensor((1, 2, 16, 64), data=0x7F2000000000, refuse=(0, 2, -1))
    _core._validate_forward(q, k, k, FakeTensor((1, 2, 16, 64), data=0x7F3000000000))
    assert k.streams == [0x7000, 0x7000]  # k and v: each ordered onto the call stream


def test_jax_arrays_are_never_written():
    class ArrayImpl(FakeTensor):  # stands in for jaxlib's array type
        pass

    ArrayImpl.__module__ = "jaxlib._jax"
    q = FakeTensor((1, 2, 16, 64))
    out = ArrayImpl((1, 2, 16, 64), data=0x7F1000000000)
    with pytest.raises(stridedfa.LayoutError, match="out is read-only .*JAX"):
        stridedfa.sdpa_forward(q, q, q, out)
    # as an input it is fine
    assert _core._validate_forward(out, out, out, FakeTensor((1, 2, 16, 64)))["b"] == 1


def test_host_memory_kinds_are_named():
    q = FakeTensor((1, 1, 8, 64), device=(3, 0))
    with pytest.raises(stridedfa.LayoutError, match="CUDA host \\(pinned\\) memory"):
        stridedfa.sdpa_forward(q, q, q, q)
    assert q.streams == []  # no __dlpack__ call for a tensor we cannot use
