"""A DLPack producer written with ctypes, independent of stridedfa's Cython intake.

FakeTensor describes memory it does not own (any address, device and strides), so CPU-only tests can
hand the core "CUDA tensors" of any layout and exercise intake and validation without a GPU. The
pointers are never dereferenced: tests only use it for calls that must fail validation or for
stridedfa._core._validate_* (which stops after validation).

It speaks both capsule kinds (versioned / legacy), records the ``stream`` each ``__dlpack__`` call
received and how often its deleter ran, and a subclass can also publish the DLPack C exchange API
(``__dlpack_c_exchange_api__``) like torch >= 2.10 does.
"""

from __future__ import annotations

import ctypes
import itertools
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_char_p,
    c_int,
    c_int32,
    c_int64,
    c_uint8,
    c_uint16,
    c_uint32,
    c_uint64,
    c_void_p,
    py_object,
)

CPU, CUDA, CUDA_HOST, CUDA_MANAGED = 1, 2, 3, 13
DTYPES = {  # name -> (DLPack code, bits)
    "float16": (2, 16), "bfloat16": (4, 16), "float32": (2, 32), "float64": (2, 64), "int8": (0, 8),
    "int32": (0, 32), "int64": (0, 64),
}
READ_ONLY = 1


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int32), ("dtype", DLDataType),
                ("shape", POINTER(c_int64)), ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


class DLPackVersion(Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


class DLManagedTensor(Structure):
    pass


class DLManagedTensorVersioned(Structure):
    pass


LegacyDeleter = CFUNCTYPE(None, POINTER(DLManagedTensor))
VersionedDeleter = CFUNCTYPE(None, POINTER(DLManagedTensorVersioned))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p), ("deleter", LegacyDeleter)]
DLManagedTensorVersioned._fields_ = [("version", DLPackVersion), ("manager_ctx", c_void_p),
                                     ("deleter", VersionedDeleter), ("flags", c_uint64), ("dl_tensor", DLTensor)]

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = py_object
_capsule_new.argtypes = [c_void_p, c_char_p, c_void_p]

# Capsule names must outlive the capsules: module-level bytes.
VERSIONED_NAME = b"dltensor_versioned"
LEGACY_NAME = b"dltensor"


def row_major(shape):
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return tuple(reversed(strides))


class FakeTensor:
    """A DLPack view of memory at `data` with the given layout (nothing is allocated)."""

    def __init__(self, shape, strides=None, dtype="bfloat16", *, data=0x7F0000000000, device=(CUDA, 0),
                 byte_offset=0, read_only=False, versioned=True, version=(1, 3), null_strides=False,
                 export_device=True):
        self.shape = tuple(shape)
        self.strides = tuple(strides) if strides is not None else row_major(self.shape)
        self.dtype = dtype
        self.data = data
        self.device = device
        self.byte_offset = byte_offset
        self.read_only = read_only
        self.versioned = versioned
        self.version = version
        self.null_strides = null_strides
        self.streams = []  # the stream argument of every __dlpack__ call
        self.deleted = 0  # how often the producer's deleter ran
        self._keep = []
        if not export_device:
            self.__dlpack_device__ = None

    def __dlpack_device__(self):
        return self.device

    def _dl_tensor(self) -> DLTensor:
        n = len(self.shape)
        shape = (c_int64 * max(n, 1))(*self.shape)
        strides = (c_int64 * max(n, 1))(*self.strides)
        self._keep += [shape, strides]
        code, bits = DTYPES[self.dtype]
        return DLTensor(c_void_p(self.data), DLDevice(*self.device), n, DLDataType(code, bits, 1),
                        shape, None if self.null_strides else strides, self.byte_offset)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.streams.append(stream)
        if self.versioned and max_version is not None and max_version[0] >= 1:
            managed = DLManagedTensorVersioned()
            managed.version = DLPackVersion(*self.version)
            managed.flags = READ_ONLY if self.read_only else 0
            managed.dl_tensor = self._dl_tensor()
            deleter = VersionedDeleter(self._on_delete)
            name = VERSIONED_NAME
        else:
            managed = DLManagedTensor()
            managed.dl_tensor = self._dl_tensor()
            deleter = LegacyDeleter(self._on_delete)
            name = LEGACY_NAME
        managed.deleter = deleter
        self._keep += [managed, deleter]
        # No capsule destructor: a real producer's would call the deleter for an unconsumed capsule,
        # but it runs in C with exceptions pending, which a ctypes callback cannot. Every capsule
        # here is consumed, and `deleted` counts the consumer's calls alone.
        return _capsule_new(ctypes.addressof(managed), name, None)

    def _on_delete(self, _managed):
        self.deleted += 1


class StrictStreamTensor(FakeTensor):
    """Refuses the stream values its framework refuses: torch rejects 0 and 2, JAX rejects -1,
    host arrays (NumPy) accept only None."""

    def __init__(self, *args, refuse=(0, 2), **kwargs):
        super().__init__(*args, **kwargs)
        self.refuse = refuse

    def __dlpack__(self, *, stream=None, **kwargs):
        if stream in self.refuse:
            raise BufferError(f"stream={stream!r} is not supported")
        return super().__dlpack__(stream=stream, **kwargs)


# --- The DLPack C exchange API, published on a type like torch.Tensor does ------------------------

DLTensorFromPyObject = CFUNCTYPE(c_int, c_void_p, POINTER(DLTensor))
ManagedFromPyObject = CFUNCTYPE(c_int, c_void_p, c_void_p)
CurrentWorkStream = CFUNCTYPE(c_int, c_int32, c_int32, POINTER(c_void_p))


class DLPackExchangeAPIHeader(Structure):
    _fields_ = [("version", DLPackVersion), ("prev_api", c_void_p)]


class DLPackExchangeAPI(Structure):
    _fields_ = [("header", DLPackExchangeAPIHeader), ("managed_tensor_allocator", c_void_p),
                ("managed_tensor_from_py_object_no_sync", c_void_p),
                ("managed_tensor_to_py_object_no_sync", c_void_p),
                ("dltensor_from_py_object_no_sync", DLTensorFromPyObject),
                ("current_work_stream", CurrentWorkStream)]


def _fill_dltensor(obj_address, out):
    obj = ctypes.cast(obj_address, py_object).value
    obj.borrowed += 1
    out[0] = obj._dl_tensor()
    return 0


def _current_work_stream(device_type, device_id, out):
    ExchangeTensor.stream_queries += 1
    out[0] = ExchangeTensor.current_stream
    return 0


_fill_fn = DLTensorFromPyObject(_fill_dltensor)
_stream_fn = CurrentWorkStream(_current_work_stream)
_api = DLPackExchangeAPI(DLPackExchangeAPIHeader(DLPackVersion(1, 3), None), None, None, None, _fill_fn, _stream_fn)
EXCHANGE_API_NAME = b"dlpack_exchange_api"
_api_capsule = _capsule_new(ctypes.addressof(_api), EXCHANGE_API_NAME, None)


class ExchangeTensor(FakeTensor):
    """A FakeTensor whose type offers the DLPack C exchange API (like torch.Tensor)."""

    __dlpack_c_exchange_api__ = _api_capsule
    current_stream = None  # what current_work_stream reports (None = NULL, the legacy stream)
    stream_queries = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.borrowed = 0  # how often the exchange API filled a DLTensor for it


_spaced_bases = itertools.count(1)


def spaced(shape, dtype="bfloat16", strides=None) -> FakeTensor:
    """A FakeTensor at an address of its own, 1 GiB from every other spaced() tensor's, so that no
    two overlap (validation refuses outputs that overlap inputs)."""
    return FakeTensor(shape, strides, dtype, data=0x100000000000 + next(_spaced_bases) * (1 << 30))
