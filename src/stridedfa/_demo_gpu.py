"""The GPU half of ``python -m stridedfa``: cuDNN through stridedfa on q/k/v views of one packed
[b, s, 3, h, d] buffer, with device memory from whatever is installed -- torch, else CuPy, else
cuda-python's cuda.core (no array framework at all).

Each backend only allocates, uploads, views and downloads; the demo itself (poisoned outputs, the
packed-vs-contiguous bit-exactness check, the fp32 NumPy reference, the timing) is shared.
"""

from __future__ import annotations

import ctypes
import time

import numpy as np

import stridedfa
from stridedfa import reference

B, S, H, D = 4, 2048, 16, 128
REPS = 20


class TorchBackend:
    name, dtype = "torch", "bfloat16"

    def __init__(self):
        import torch
        if not torch.cuda.is_available():
            raise ImportError("torch is installed without CUDA")
        self.torch = torch
        self.device_name = torch.cuda.get_device_name()
        self.stream = None  # torch's current stream, which stridedfa picks up itself

    def upload(self, host):
        return self.torch.from_numpy(host).to("cuda", self.torch.bfloat16)

    def full_nan(self, shape, dtype):
        return self.torch.full(shape, float("nan"), device="cuda",
                               dtype=self.torch.float32 if dtype == "float32" else self.torch.bfloat16)

    def strided(self, base, shape, strides, offset=0):
        return base.as_strided(shape, strides, offset)

    def contiguous(self, view):
        return view.contiguous()

    def download(self, x):
        return x.float().cpu().numpy()

    host_copy = download

    def sync(self):
        self.torch.cuda.synchronize()


class CupyBackend:
    name, dtype = "cupy", "float16"  # NumPy (and so CuPy) has no bfloat16

    def __init__(self):
        import cupy
        self.cp = cupy
        self.device_name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
        self.stream = None  # CuPy's current stream, which stridedfa picks up itself

    def upload(self, host):
        return self.cp.asarray(host.astype(np.float16))

    def full_nan(self, shape, dtype):
        return self.cp.full(shape, np.nan, dtype=np.float32 if dtype == "float32" else np.float16)

    def strided(self, base, shape, strides, offset=0):
        itemsize = base.dtype.itemsize
        return self.cp.lib.stride_tricks.as_strided(base.ravel()[offset:], shape,
                                                    tuple(s * itemsize for s in strides))

    def contiguous(self, view):
        return self.cp.ascontiguousarray(view)

    def download(self, x):
        return self.cp.asnumpy(x).astype(np.float32)

    host_copy = download

    def sync(self):
        self.cp.cuda.Device().synchronize()


class CudaCoreBackend:
    """Device memory from cuda.core's DeviceMemoryResource (the driver's stream-ordered pool),
    presented to stridedfa as typed StridedMemoryViews: a DLPack producer without an adapter."""

    name, dtype = "cuda.core", "float16"

    def __init__(self):
        from cuda.core import Buffer, Device, LegacyPinnedMemoryResource
        from cuda.core.utils import StridedMemoryView
        self.Buffer, self.View = Buffer, StridedMemoryView
        self.device = Device()
        self.device.set_current()
        self.device_name = self.device.name
        self.stream = self.device.create_stream()  # passed to stridedfa by __cuda_stream__
        self.memory = self.device.memory_resource
        self.pinned = LegacyPinnedMemoryResource()

    def _typed(self, buffer, shape, dtype):
        shape = tuple(shape)
        strides = tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
        return self.View.from_buffer(buffer, shape, strides, dtype=np.dtype(dtype))

    def _put(self, host):
        """A device copy of a C-contiguous NumPy array, by Buffer copies through pinned memory
        (cuda.core 1.2.0's StridedMemoryView.copy_from is not implemented yet)."""
        staging = self.pinned.allocate(host.nbytes)
        ctypes.memmove(int(staging.handle), host.ctypes.data, host.nbytes)
        device = self.memory.allocate(host.nbytes, stream=self.stream)
        device.copy_from(staging, stream=self.stream)
        self.stream.sync()
        staging.close()
        return self._typed(device, host.shape, host.dtype)

    def upload(self, host):
        self._host = np.ascontiguousarray(host, dtype=np.float16)  # the rounded numbers, kept
        self._packed = self._put(self._host)
        return self._packed

    def host_copy(self, packed):
        return self._host.astype(np.float32)

    def full_nan(self, shape, dtype):
        dtype = np.dtype(np.float32 if dtype == "float32" else np.float16)
        buffer = self.memory.allocate(int(np.prod(shape)) * dtype.itemsize, stream=self.stream)
        buffer.fill(np.array(np.nan, dtype).tobytes(), stream=self.stream)
        return self._typed(buffer, shape, dtype)

    def strided(self, base, shape, strides, offset=0):
        itemsize = base.dtype.itemsize
        size = (int(np.prod(base.shape)) - offset) * itemsize
        memory = self.Buffer.from_handle(base.ptr + offset * itemsize, size, owner=base)
        return self.View.from_buffer(memory, tuple(shape), tuple(strides), dtype=base.dtype)

    def contiguous(self, view):
        # The same rounded numbers uploaded afresh: a device-side strided copy would need a kernel.
        offset = (view.ptr - self._packed.ptr) // 2
        host = np.lib.stride_tricks.as_strided(self._host.ravel()[offset:], view.shape,
                                               tuple(s * 2 for s in view.strides))
        return self._put(np.ascontiguousarray(host))

    def download(self, x):  # a dense view
        host = np.empty(x.shape, dtype=x.dtype)
        staging = self.pinned.allocate(host.nbytes)
        staging.copy_from(self.Buffer.from_handle(x.ptr, host.nbytes, owner=x), stream=self.stream)
        self.stream.sync()
        ctypes.memmove(host.ctypes.data, int(staging.handle), host.nbytes)
        staging.close()
        return host.astype(np.float32)

    def sync(self):
        self.stream.sync()


def backend():
    """The first way to get device memory that is installed, or the reason there is none."""
    errors = []
    for make in (TorchBackend, CupyBackend, CudaCoreBackend):
        try:
            return make(), None
        except Exception as e:  # not installed, or installed without a usable GPU
            errors.append(f"{make.name}: {e}")
    return None, "; ".join(errors)


def run(be) -> int:
    rng = np.random.default_rng(0)
    packed = be.upload(rng.standard_normal((B, S, 3, H, D)).astype(np.float32))
    host_packed = be.host_copy(packed)  # the numbers as rounded to the device dtype
    row = 3 * H * D
    q, k, v = (be.strided(packed, (B, H, S, D), (S * row, D, row, 1), i * H * D) for i in range(3))
    out_base = be.full_nan((B, S, H, D), be.dtype)
    out = be.strided(out_base, (B, H, S, D), (S * H * D, D, H * D, 1))  # written into a bshd view
    lse = be.full_nan((B, H, S), "float32")

    stridedfa.sdpa_forward(q, k, v, out, lse=lse, causal=True, stream=be.stream)  # builds the graph
    be.sync()
    start = time.perf_counter()
    for _ in range(REPS):
        stridedfa.sdpa_forward(q, k, v, out, lse=lse, causal=True, stream=be.stream)
    be.sync()
    ms = (time.perf_counter() - start) / REPS * 1e3
    tflops = 4 * B * H * S * S * D / 2 / (ms * 1e-3) / 1e12

    q_c, k_c, v_c = (be.contiguous(x) for x in (q, k, v))
    out_c = be.full_nan((B, H, S, D), be.dtype)
    lse_c = be.full_nan((B, H, S), "float32")
    stridedfa.sdpa_forward(q_c, k_c, v_c, out_c, lse=lse_c, causal=True, stream=be.stream)
    be.sync()
    out_h = be.download(out_base).transpose(0, 2, 1, 3)
    lse_h = be.download(lse)
    bit_exact = np.array_equal(out_h, be.download(out_c)) and np.array_equal(lse_h, be.download(lse_c))

    hq, hk, hv = (host_packed[:1, :, i, :2].transpose(0, 2, 1, 3) for i in range(3))
    ref_out, ref_lse = reference.sdpa_forward(hq, hk, hv, causal=True)
    err_out = float(np.abs(out_h[:1, :2] - ref_out).max())
    err_lse = float(np.abs(lse_h[:1, :2] - ref_lse).max())
    written = not (np.isnan(out_h).any() or np.isnan(lse_h).any())
    ok = bit_exact and written and err_out < 2e-2 and err_lse < 1e-3

    print(f"\ncuDNN through stridedfa on {be.device_name}, device memory from {be.name}: packed "
          f"[b={B}, s={S}, 3, h={H}, d={D}] {be.dtype} q/k/v views, causal, out written into a "
          f"bshd view")
    print(f"  forward: {ms:.3f} ms/call (wall, {REPS} calls back to back), {tflops:.0f} TFLOP/s")
    print(f"  every output element written: {written}")
    print(f"  packed views vs contiguous copies bit-exact (out and lse): {bit_exact}")
    print(f"  max |error| vs the fp32 NumPy reference: out {err_out:.2e}, lse {err_lse:.2e}")
    print(f"  graph cache: {stridedfa.cache_info()}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1
