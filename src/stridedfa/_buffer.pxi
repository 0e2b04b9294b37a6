# Included by _core.pyx: DeviceBuffer, the device memory stridedfa owns and hands out when the
# caller's framework has no adapter (_calls.pxi's generic entry points allocate it, BufferOutputs).
#
# DeviceBuffer is a DLPack producer. Lifetime: every exported DLManagedTensor holds a reference to
# the buffer, dropped by its deleter; the memory goes back to the pool when the buffer object and all
# exported tensors are gone. Ordering: the buffer remembers the stream its contents were produced
# on; a consumer that asks for another stream gets an event dependency, and memory that was handed
# to other (or unknown) streams is freed only after the device has finished its work.
#
# Memory comes from the core's pool (cpp/src/runtime.cpp), not cuda.core: in GPU run 20
# (benchmarks/results/latest/2026-12-03-h200-run20/allocation.json, cuda.core 1.2.0) cuda.core's
# DeviceMemoryResource alloc+free alone cost 0.52-0.85x ours, but a whole call with its output
# typed through cuda.core cost 1.10x (18.95 vs 17.20 us). Allocating DeviceBuffer's memory from
# cuda.core's resource while keeping this typed export is the open experiment.


cdef tuple int_tuple(const int64_t* values, int n, int64_t factor):
    """(values[0] * factor, ...) without a generator (a generator costs a microsecond here)."""
    cdef list items = [None] * n
    cdef int i
    for i in range(n):
        items[i] = values[i] * factor
    return tuple(items)


cdef extern from "Python.h":
    int Py_IsInitialized() nogil

cdef struct VersionedExport:  # one malloc per export: the tensor, then its shape and strides
    DLManagedTensorVersioned tensor
    int64_t shape[8]
    int64_t strides[8]

cdef struct LegacyExport:
    DLManagedTensor tensor
    int64_t shape[8]
    int64_t strides[8]

cdef void drop_owner(void* owner) noexcept nogil:
    # Deleters may run on any thread, with or without the GIL, even during interpreter teardown
    # (then the buffer is leaked rather than touched).
    if owner == NULL or not Py_IsInitialized():
        return
    with gil:
        Py_DECREF(<object>owner)

cdef void versioned_deleter(DLManagedTensorVersioned* tensor) noexcept nogil:
    drop_owner(tensor.manager_ctx)
    free(tensor)

cdef void legacy_deleter(DLManagedTensor* tensor) noexcept nogil:
    drop_owner(tensor.manager_ctx)
    free(tensor)

cdef void versioned_capsule_destructor(object capsule) noexcept:
    # Only an unconsumed capsule still owns its tensor; a consumer renames it to used_dltensor_*.
    if PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        tensor = <DLManagedTensorVersioned*>PyCapsule_GetPointer(capsule, b"dltensor_versioned")
        tensor.deleter(tensor)

cdef void legacy_capsule_destructor(object capsule) noexcept:
    if PyCapsule_IsValid(capsule, b"dltensor"):
        tensor = <DLManagedTensor*>PyCapsule_GetPointer(capsule, b"dltensor")
        tensor.deleter(tensor)

cdef uintptr_t consumer_stream(object stream) except? 0:
    """The cudaStream_t a consumer named in __dlpack__(stream=...), by the array-API rules; 0 for
    "do not synchronise" (-1). The legacy default stream is cudaStreamLegacy (1)."""
    if stream is None:
        return 1  # the standard: assume the legacy default stream
    if isinstance(stream, bool) or not isinstance(stream, int):
        raise TypeError(f"stream must be None or an int, got {type(stream).__name__}")
    if stream == -1:
        return 0
    if stream == 0:
        return 1  # disallowed by the standard; older consumers meant the legacy default stream
    if stream < -1:
        raise ValueError(f"stream must be -1, 1, 2 or a cudaStream_t handle, got {stream}")
    return <uintptr_t>stream

cdef class DeviceBuffer:
    """A strided CUDA array owned by stridedfa: what :func:`stridedfa.attention` returns for
    producers without an adapter. Import it zero-copy with ``torch.from_dlpack(buf)``,
    ``cupy.from_dlpack(buf)`` or ``jax.dlpack.from_dlpack(buf)``; the memory stays alive as long as
    the buffer or any tensor imported from it does.

    Attributes: ``shape``, ``strides`` (in elements), ``dtype`` (a name such as ``"float16"``),
    ``device`` (CUDA ordinal), ``nbytes``, ``data_ptr`` (device address) and ``stream`` (the
    cudaStream_t its contents are produced on; 0 is the legacy default stream).

    ``__dlpack__(stream=s)`` follows the array-API rules (None or 1: the legacy default stream,
    2: the per-thread default stream, -1: no synchronisation): a consumer stream other than the
    producing one waits for the buffer's contents. The memory is returned stream-ordered on the
    producing stream, so a stream given as a bare int handle must outlive the buffer (a stream
    object is kept alive by the buffer); once the buffer was exported to another or an unknown
    stream, the free waits for the device to finish instead.
    """
    cdef void* ptr
    cdef int64_t _nbytes
    cdef int32_t _device
    cdef int32_t ndim
    cdef int64_t _shape[8]
    cdef int64_t _strides[8]
    cdef DLDataType _dtype
    cdef uintptr_t _stream
    cdef object _stream_owner  # a stream object passed by the caller, kept alive for the free
    cdef bint _shared          # handed to a consumer on another or an unknown stream

    def __cinit__(self):
        self.ptr = NULL
        self._shared = False

    def __init__(self):
        raise TypeError("DeviceBuffer is created by stridedfa calls (stridedfa.attention), "
                        "not directly")

    def __dealloc__(self):
        cdef void* ptr = self.ptr
        self.ptr = NULL
        if ptr != NULL:
            with nogil:  # a shared buffer's free waits for the device; let other threads run
                buffer_free(self._device, ptr, self._stream, self._shared)

    @property
    def shape(self):
        return int_tuple(self._shape, self.ndim, 1)

    @property
    def strides(self):
        return int_tuple(self._strides, self.ndim, 1)

    @property
    def dtype(self):
        return dtype_name(self._dtype).decode()

    @property
    def device(self):
        return self._device

    @property
    def nbytes(self):
        return self._nbytes

    @property
    def data_ptr(self):
        return <uintptr_t>self.ptr

    @property
    def stream(self):
        return self._stream

    def __repr__(self):
        return (f"DeviceBuffer(shape={self.shape}, strides={self.strides}, dtype={self.dtype}, "
                f"device=cuda:{self._device}, nbytes={self._nbytes})")

    def __dlpack_device__(self):
        return (<int>kDLCUDA, self._device)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        cdef uintptr_t consumer = consumer_stream(stream)
        if dl_device is not None and tuple(dl_device) != (<int>kDLCUDA, self._device):
            raise BufferError(f"DeviceBuffer lives on cuda:{self._device} and exports no copies "
                              f"to device {tuple(dl_device)}")
        if copy:
            raise BufferError("DeviceBuffer exports its memory only (copy=True is not supported)")
        if consumer == 0:
            self._shared = True  # used on a stream we are not told
        elif canonical_handle(consumer) != canonical_handle(self._stream):
            if self.ptr != NULL:
                stream_wait_stream(self._device, consumer, self._stream)
            self._shared = True
        if max_version is not None and max_version[0] >= 1:
            return self._export_versioned()
        return self._export_legacy()

    cdef fill(self, DLTensor* t, int64_t* shape, int64_t* strides):
        memcpy(shape, self._shape, sizeof(int64_t) * self.ndim)
        memcpy(strides, self._strides, sizeof(int64_t) * self.ndim)
        t.data = self.ptr
        t.device.device_type = kDLCUDA
        t.device.device_id = self._device
        t.ndim = self.ndim
        t.dtype = self._dtype
        t.shape = shape
        t.strides = strides
        t.byte_offset = 0

    cdef object _export_versioned(self):
        cdef VersionedExport* e = <VersionedExport*>malloc(sizeof(VersionedExport))
        if e == NULL:
            raise MemoryError()
        self.fill(&e.tensor.dl_tensor, e.shape, e.strides)
        e.tensor.version.major = DLPACK_MAJOR_VERSION
        e.tensor.version.minor = DLPACK_MINOR_VERSION
        e.tensor.flags = 0
        e.tensor.deleter = versioned_deleter
        e.tensor.manager_ctx = <void*>self
        Py_INCREF(self)  # dropped by the deleter
        try:
            return PyCapsule_New(e, b"dltensor_versioned", versioned_capsule_destructor)
        except BaseException:
            versioned_deleter(&e.tensor)
            raise

    cdef object _export_legacy(self):
        cdef LegacyExport* e = <LegacyExport*>malloc(sizeof(LegacyExport))
        if e == NULL:
            raise MemoryError()
        self.fill(&e.tensor.dl_tensor, e.shape, e.strides)
        e.tensor.deleter = legacy_deleter
        e.tensor.manager_ctx = <void*>self
        Py_INCREF(self)
        try:
            return PyCapsule_New(e, b"dltensor", legacy_capsule_destructor)
        except BaseException:
            legacy_deleter(&e.tensor)
            raise

cdef DeviceBuffer new_buffer(int n, const int64_t* shape, const int64_t* strides, DLDataType dtype,
                             int32_t device, uintptr_t stream, object stream_owner):
    """Allocates a buffer of this layout (n axes, non-negative strides) from `device`'s pool on
    `stream`."""
    cdef DeviceBuffer buf = DeviceBuffer.__new__(DeviceBuffer)
    cdef int64_t extent = 1, last = 0
    cdef int i
    buf.ndim = n
    for i in range(n):
        buf._shape[i] = shape[i]
        buf._strides[i] = strides[i]
        if buf._shape[i] == 0:
            extent = 0
        last += (buf._shape[i] - 1) * buf._strides[i] if buf._shape[i] > 0 else 0
    buf._dtype = dtype
    buf._device = device
    buf._stream = stream
    buf._stream_owner = stream_owner
    # cudaStreamPerThread (2) names another stream on every thread, and the free may run on any.
    buf._shared = stream == 2
    buf._nbytes = (last + 1) * ((dtype.bits * dtype.lanes + 7) // 8) if extent else 0
    if buf._nbytes > 0:
        ensure_libraries()
        with nogil:
            buf.ptr = buffer_alloc(device, buf._nbytes, stream)
    return buf

cdef int view_of_buffer(DeviceBuffer buf, const char* name, TensorView* view) except -1:
    """The core's view of a buffer stridedfa just allocated (no DLPack round trip)."""
    cdef int i
    view.name = name
    view.present = True
    view.ndim = buf.ndim
    for i in range(buf.ndim):
        view.dims[i] = buf._shape[i]
        view.strides[i] = buf._strides[i]
    view.dtype = buf._dtype
    view.device_type = kDLCUDA
    view.device_id = buf._device
    view.data = <uintptr_t>buf.ptr
    view.read_only = False
    return 0
