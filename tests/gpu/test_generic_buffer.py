"""stridedfa.attention for producers without an adapter, and the DeviceBuffer it returns: values,
layout, zero-copy import by torch / CuPy / JAX, lifetime, and stream ordering for consumers."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import stridedfa  # noqa: E402
from helpers.producers import Producer  # noqa: E402
from stridedfa import _layouts, reference  # noqa: E402

pytestmark = pytest.mark.gpu

SLEEP_CYCLES = 200_000_000  # ~0.1 s
TOL = {torch.float16: (5e-3, 5e-3, 2e-3), torch.bfloat16: (2e-2, 1e-2, 2e-3)}  # out atol, rtol; lse


def _qkv(layout, dtype=torch.float16, b=2, h=4, s=128, d=64):
    """Fresh random q, k, v (b, h, s, d) torch views in `layout`, and float32 host copies."""
    if layout == "packed":
        qkv = torch.randn(b, s, 3, h, d, device="cuda", dtype=dtype)
        views = [qkv[:, :, i].transpose(1, 2) for i in range(3)]
    elif layout == "bshd":
        views = [torch.randn(b, s, h, d, device="cuda", dtype=dtype).transpose(1, 2) for _ in range(3)]
    else:
        views = [torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(3)]
    torch.cuda.synchronize()
    return views, [t.float().cpu().numpy() for t in views]


def _check(out, lse, hosts, dtype, **options):
    atol, rtol, lse_atol = TOL[dtype]
    want_out, want_lse = reference.sdpa_forward(*hosts, **options)
    got = out.float().cpu().numpy()
    assert not np.isnan(got).any(), "out has NaN elements"
    err = np.abs(got - want_out)
    assert (err <= atol + rtol * np.abs(want_out)).all(), f"out: max abs err {err.max():.3e}"
    if lse is not None:
        lse_err = np.abs(lse.float().cpu().numpy() - want_lse).max()
        assert lse_err <= lse_atol, f"lse: max abs err {lse_err:.3e}"


@pytest.mark.parametrize("layout", ["bhsd", "bshd", "packed"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_generic_producer_gets_a_device_buffer_torch_imports_zero_copy(layout, dtype, seed):
    (q, k, v), hosts = _qkv(layout, dtype)
    out, lse = stridedfa.attention(Producer(q), Producer(k), Producer(v), causal=True,
                                   return_lse=True)
    assert isinstance(out, stridedfa.DeviceBuffer) and isinstance(lse, stridedfa.DeviceBuffer)
    assert out.shape == tuple(q.shape) and out.device == q.device.index
    assert out.dtype == str(dtype).removeprefix("torch.")
    assert out.strides == _layouts.output_strides(out.shape, q.stride())
    assert out.nbytes == q.numel() * q.element_size()
    assert (lse.shape, lse.strides, lse.dtype) == (tuple(q.shape[:3]), (4 * 128, 128, 1), "float32")
    assert out.__dlpack_device__() == (2, q.device.index)

    t_out, t_lse = torch.from_dlpack(out), torch.from_dlpack(lse)
    assert t_out.data_ptr() == out.data_ptr and t_lse.data_ptr() == lse.data_ptr  # no copy
    assert t_out.stride() == out.strides and t_out.dtype == dtype
    _check(t_out, t_lse, hosts, dtype, causal=True)


def test_cupy_imports_a_device_buffer_zero_copy(cupy, seed):
    cp = cupy
    (q, k, v), hosts = _qkv("bshd")
    out = stridedfa.attention(Producer(q), Producer(k), Producer(v))
    array = cp.from_dlpack(out)
    assert array.data.ptr == out.data_ptr
    assert tuple(s // array.itemsize for s in array.strides) == out.strides
    _check(torch.from_numpy(cp.asnumpy(array)), None, hosts, torch.float16)


def test_jax_imports_a_device_buffer_zero_copy(jax_gpu, seed):
    jax, _ = jax_gpu
    (q, k, v), hosts = _qkv("bhsd")  # a row-major output: the layout every JAX import takes as is
    out = stridedfa.attention(Producer(q), Producer(k), Producer(v), causal=True)
    array = jax.dlpack.from_dlpack(out)
    assert array.unsafe_buffer_pointer() == out.data_ptr
    values = np.asarray(array.astype(jax.numpy.float32))
    _check(torch.from_numpy(values), None, hosts, torch.float16, causal=True)


def test_cupy_arrays_wrapped_as_plain_producers(cupy, seed):
    """A producer that is CuPy underneath: the same values as through the CuPy adapter."""
    cp = cupy
    rng = np.random.default_rng(seed)
    arrays = [cp.asarray(rng.standard_normal((2, 4, 128, 64), dtype=np.float32).astype(np.float16))
              for _ in range(3)]
    cp.cuda.Device().synchronize()
    out = stridedfa.attention(*(Producer(a) for a in arrays), causal=True)
    assert isinstance(out, stridedfa.DeviceBuffer)
    assert cp.array_equal(cp.from_dlpack(out), stridedfa.cupy.attention(*arrays, causal=True))


def test_device_buffer_outlives_itself_in_its_consumers(seed):
    """The memory stays with the consumer's tensor after the DeviceBuffer is gone: other
    allocations never get it, and the values stay correct."""
    (q, k, v), hosts = _qkv("bshd")
    out = stridedfa.attention(Producer(q), Producer(k), Producer(v))
    address, shape, strides = out.data_ptr, out.shape, out.strides
    consumers = [torch.from_dlpack(out)]
    del out
    gc.collect()

    others = []  # churn: stream-ordered pool blocks of the very same size, and torch's allocator
    for _ in range(4):
        other = stridedfa._core._device_buffer(shape, strides, "float16")
        assert other.data_ptr != address, "the consumer's memory was handed out again"
        torch.from_dlpack(other).fill_(float("nan"))
        others.append(other)
        others.append(torch.full((1 << 20,), float("nan"), device="cuda"))
    del others
    torch.cuda.synchronize()
    assert consumers[0].data_ptr() == address
    _check(consumers[0], None, hosts, torch.float16)


def test_consumer_on_another_stream_sees_finished_results(seed):
    (q, k, v), hosts = _qkv("bshd", s=256)
    producer, consumer = torch.cuda.Stream(), torch.cuda.Stream()
    shape = tuple(q.shape)
    strides = _layouts.output_strides(shape, q.stride())
    with torch.cuda.stream(producer):
        # Leave a NaN-filled block of the output's size in the pool on the producing stream, so an
        # early read shows NaN rather than stale data; then keep the producing stream busy.
        poison = stridedfa._core._device_buffer(shape, strides, "float16",
                                                stream=producer.cuda_stream)
        torch.from_dlpack(poison).fill_(float("nan"))
        del poison
        torch.cuda._sleep(SLEEP_CYCLES)
        out = stridedfa.attention(Producer(q), Producer(k), Producer(v), stream=producer)
    assert out.stream == producer.cuda_stream
    with torch.cuda.stream(consumer):
        t = torch.from_dlpack(out)  # asks for the consumer stream: it must wait for the producer
        copy = t.clone()
    consumer.synchronize()
    _check(copy, None, hosts, torch.float16)
    producer.synchronize()


def test_device_buffers_go_back_into_stridedfa(seed):
    """A DeviceBuffer works as an input (dispatching to the generic path again) and as an output
    of sdpa_forward."""
    (q, k, v), hosts = _qkv("bhsd")
    bufs = [stridedfa._core._device_buffer(q.shape, q.stride(), "float16") for _ in range(3)]
    for buf, src in zip(bufs, (q, k, v)):
        torch.from_dlpack(buf).copy_(src)
    out = stridedfa.attention(*bufs)
    _check(torch.from_dlpack(out), None, hosts, torch.float16)

    target = stridedfa._core._device_buffer(q.shape, (64 * 4 * 128, 64, 4 * 64, 1), "float16")
    torch.from_dlpack(target).fill_(float("nan"))
    stridedfa.sdpa_forward(q, k, v, target)
    _check(torch.from_dlpack(target), None, hosts, torch.float16)


def test_export_to_another_stream_marks_the_buffer_shared_and_frees_safely(seed):
    """Many exports to other streams and frees in any order must neither crash nor leak."""
    (q, k, v), hosts = _qkv("bhsd")
    streams = [torch.cuda.Stream() for _ in range(3)]
    keep = []
    for _ in range(10):
        out = stridedfa.attention(Producer(q), Producer(k), Producer(v))
        for stream in streams:
            with torch.cuda.stream(stream):
                keep.append(torch.from_dlpack(out) * 1)
        capsule = out.__dlpack__(stream=-1, max_version=(1, 3))
        del out, capsule  # an unconsumed capsule releases its reference too
    for stream in streams:
        stream.synchronize()
    for t in keep:
        _check(t, None, hosts, torch.float16)


@pytest.mark.parametrize("consumer_stream", ["same", "other", "unknown"])
def test_device_buffer_memory_is_returned(consumer_stream):
    """2 GiB buffers, exported and dropped 100 times: 200 GiB in all, more than the GPU holds, so a
    leak fails with out-of-memory."""
    side = torch.cuda.Stream()
    for _ in range(100):
        buf = stridedfa._core._device_buffer((1 << 30,), (1,), "float16")
        if consumer_stream == "same":
            t = torch.from_dlpack(buf)  # torch's current stream: the legacy default, as buf's
        elif consumer_stream == "other":
            with torch.cuda.stream(side):
                t = torch.from_dlpack(buf)
        else:
            t = torch.utils.dlpack.from_dlpack(buf.__dlpack__(stream=-1))
        t[:1].fill_(1.0)
        del buf, t
    torch.cuda.synchronize()
