# Included by _core.pyx: outputs allocated by the inputs' own framework.
#
# A producer that offers the DLPack C exchange API (torch >= 2.10) also lends its allocator
# (managed_tensor_allocator) and turns a DLPack tensor back into one of its objects
# (managed_tensor_to_py_object_no_sync). Through them a whole forward call -- reading q/k/v, allocating
# out/lse/workspace with the framework's caching allocator on its current stream, running, returning
# framework tensors -- happens in C, with no Python-level tensor creation on the hot path. Allocations
# come from the framework's allocator, so they are also valid inside its CUDA-graph capture.

from cpython.exc cimport PyErr_Occurred
from cpython.ref cimport Py_DECREF
from libc.stdlib cimport free, malloc
from libc.string cimport memset, strncpy


cdef struct AllocationError:
    bint set
    char kind[64]
    char message[512]


cdef void record_allocation_error(void* context, const char* kind, const char* message) noexcept nogil:
    cdef AllocationError* error = <AllocationError*>context
    error.set = True
    if kind != NULL:
        strncpy(error.kind, kind, 63)
    if message != NULL:
        strncpy(error.message, message, 511)
    error.kind[63] = 0
    error.message[511] = 0


# A strided tensor viewing a flat allocation of the framework's: the framework allocates 1-D
# storage (its allocator's prototype carries no strides), and this wrapper gives it the strides we
# want before it is handed back to the framework. `managed` must stay the first member.
cdef struct StridedTensor:
    DLManagedTensorVersioned managed
    DLManagedTensorVersioned* storage
    int64_t shape[4]
    int64_t strides[4]


cdef void delete_strided_tensor(DLManagedTensorVersioned* self) noexcept nogil:
    cdef StridedTensor* tensor = <StridedTensor*>self.manager_ctx
    if tensor.storage != NULL and tensor.storage.deleter != NULL:
        tensor.storage.deleter(tensor.storage)
    free(tensor)


cdef DLManagedTensorVersioned* allocate_flat(const DLPackExchangeAPI* api, int64_t elements,
                                             DLDataType dtype, int device_id,
                                             int device_type=kDLCUDA) except NULL:
    cdef int64_t shape[1]
    cdef DLTensor prototype
    cdef AllocationError error
    cdef DLManagedTensorVersioned* flat = NULL
    shape[0] = elements
    memset(&prototype, 0, sizeof(prototype))
    memset(&error, 0, sizeof(error))
    prototype.device.device_type = <DLDeviceType>device_type
    prototype.device.device_id = device_id
    prototype.ndim = 1
    prototype.dtype = dtype
    prototype.shape = shape
    if api.managed_tensor_allocator(&prototype, &flat, &error, record_allocation_error) != 0 or flat == NULL:
        if PyErr_Occurred() != NULL:
            return NULL
        detail = (error.kind.decode("utf-8", "replace") + ": " + error.message.decode("utf-8", "replace")
                  if error.set else "no reason given")
        raise BackendError(f"the framework could not allocate {elements} elements of "
                           f"{dtype_name(dtype).decode()} on device {device_id} ({detail})")
    return flat


cdef DLManagedTensorVersioned* allocate_strided(const DLPackExchangeAPI* api, int ndim,
                                                const int64_t* shape, const int64_t* strides,
                                                DLDataType dtype, int device_id,
                                                int device_type=kDLCUDA) except NULL:
    cdef int64_t elements = 1
    cdef int i
    for i in range(ndim):
        if shape[i] == 0:
            elements = 0
            break
        elements += (shape[i] - 1) * strides[i]
    cdef DLManagedTensorVersioned* flat = allocate_flat(api, elements, dtype, device_id, device_type)
    cdef StridedTensor* tensor = <StridedTensor*>malloc(sizeof(StridedTensor))
    if tensor == NULL:
        flat.deleter(flat)
        raise MemoryError()
    memset(tensor, 0, sizeof(StridedTensor))
    tensor.storage = flat
    for i in range(ndim):
        tensor.shape[i] = shape[i]
        tensor.strides[i] = strides[i]
    tensor.managed.version.major = DLPACK_MAJOR_VERSION
    tensor.managed.version.minor = DLPACK_MINOR_VERSION
    tensor.managed.manager_ctx = tensor
    tensor.managed.deleter = delete_strided_tensor
    tensor.managed.dl_tensor = flat.dl_tensor
    tensor.managed.dl_tensor.ndim = ndim
    tensor.managed.dl_tensor.shape = tensor.shape
    tensor.managed.dl_tensor.strides = tensor.strides
    return &tensor.managed


cdef object to_framework_object(const DLPackExchangeAPI* api, DLManagedTensorVersioned* tensor):
    """Hands `tensor` (ownership included) to the framework; returns its tensor object."""
    cdef void* result = NULL
    if api.managed_tensor_to_py_object_no_sync(tensor, &result) != 0 or result == NULL:
        if PyErr_Occurred() == NULL:
            raise BackendError("the framework could not wrap an output it allocated")
        raise  # re-raise the framework's error
    obj = <object>result
    Py_DECREF(obj)  # `result` was a new reference; `obj` now holds the only one we own
    return obj


cdef void order_like(const int64_t* shape, const int64_t* like_strides, int ndim, int64_t* strides) noexcept nogil:
    """Dense strides for `shape` with the axes in the memory order of `like_strides` (outermost
    first, ties in logical order); extent-1 axes go outermost whatever their strides. The same rule
    as stridedfa._layouts.output_strides, which fake tensors under torch.compile use."""
    cdef int order[8]
    cdef int i, j, axis
    cdef int64_t step = 1
    for i in range(ndim):
        order[i] = i
    for i in range(1, ndim):  # stable insertion sort: a placed before b when a is outer
        axis = order[i]
        j = i - 1
        while j >= 0 and axis_is_outer(shape, like_strides, axis, order[j]):
            order[j + 1] = order[j]
            j -= 1
        order[j + 1] = axis
    for i in range(ndim - 1, -1, -1):
        strides[order[i]] = step
        step *= shape[order[i]] if shape[order[i]] > 0 else 1


cdef inline bint axis_is_outer(const int64_t* shape, const int64_t* strides, int a, int b) noexcept nogil:
    if shape[a] == 1 or shape[b] == 1:
        return shape[a] == 1 and shape[b] != 1
    return strides[a] > strides[b]


def _allocate_like(like, shape, strides):
    """A tensor of `like`'s framework, dtype and device with exactly these shape and strides,
    allocated through the exchange API the way _forward_alloc allocates (a test hook: it runs on
    CPU tensors too)."""
    cdef TensorView view
    cdef Owned owned
    cdef CallStream st
    cdef int64_t c_shape[4]
    cdef int64_t c_strides[4]
    cdef int i, n = len(shape)
    cdef const DLPackExchangeAPI* api = exchange_api_of(type(like))
    if api == NULL or api.managed_tensor_allocator == NULL:
        raise TypeError(f"{type(like).__qualname__} does not offer the DLPack C exchange API's allocator")
    if n > 4 or len(strides) != n:
        raise ValueError("at most 4 axes, and as many strides as extents")
    for i in range(n):
        c_shape[i] = shape[i]
        c_strides[i] = strides[i]
    owned.versioned = NULL
    owned.legacy = NULL
    parse_stream(None, &st)
    try:
        intake(like, b"like", False, &st, &view, &owned)
    finally:
        release(&owned, 1)
    return to_framework_object(api, allocate_strided(api, n, c_shape, c_strides, view.dtype,
                                                     view.device_id, view.device_type))


def _output_strides(out_shape, like_strides):
    """The C rule for output strides, exposed for the test that keeps it equal to _layouts'."""
    cdef int64_t shape[8]
    cdef int64_t like[8]
    cdef int64_t strides[8]
    cdef int i, n = len(out_shape)
    if n > 8 or len(like_strides) != n:
        raise ValueError("at most 8 axes, and as many strides as extents")
    for i in range(n):
        shape[i] = out_shape[i]
        like[i] = like_strides[i]
    order_like(shape, like, n, strides)
    return tuple(strides[i] for i in range(n))


cdef DLDataType float32_dtype() noexcept nogil:
    cdef DLDataType dtype
    dtype.code = 2  # kDLFloat
    dtype.bits = 32
    dtype.lanes = 1
    return dtype


cdef DLDataType bytes_dtype() noexcept nogil:
    cdef DLDataType dtype
    dtype.code = 1  # kDLUInt
    dtype.bits = 8
    dtype.lanes = 1
    return dtype


def _forward_alloc(q, k, v, scale, causal, causal_alignment, bint with_lse):
    """Forward with outputs allocated by q's framework (its tensors must offer the DLPack C
    exchange API, as torch >= 2.10 does), on its current stream.

    out is dense in q's axis order (stridedfa._layouts.output_strides); lse, when asked for, is a
    packed float32 (batch, h_q, s_q). cuDNN's workspace comes from the same allocator. Returns
    (out, lse or None) as the framework's tensors.
    """
    cdef SdpaOptions options
    cdef ForwardArgs fwd
    cdef Owned owned[3]
    cdef CallStream st
    cdef PreparedCall call
    cdef Problem problem
    cdef DLManagedTensorVersioned* out_tensor = NULL
    cdef DLManagedTensorVersioned* lse_tensor = NULL
    cdef DLManagedTensorVersioned* workspace_tensor = NULL
    cdef void* workspace = NULL
    cdef int64_t out_shape[4]
    cdef int64_t out_strides[4]
    cdef int64_t lse_shape[3]
    cdef int64_t lse_strides[3]
    cdef int i
    parse_options(scale, causal, causal_alignment, &options)
    cdef const DLPackExchangeAPI* api = exchange_api_of(type(q))
    if api == NULL or api.managed_tensor_allocator == NULL or api.managed_tensor_to_py_object_no_sync == NULL:
        raise TypeError(f"q ({type(q).__module__}.{type(q).__qualname__}) does not offer the DLPack C "
                        f"exchange API's allocator; pass preallocated outputs to sdpa_forward instead")
    for i in range(3):
        owned[i].versioned = NULL
        owned[i].legacy = NULL
    parse_stream(None, &st)
    try:
        intake(q, b"q", False, &st, &fwd.q, &owned[0])
        intake(k, b"k", False, &st, &fwd.k, &owned[1])
        intake(v, b"v", False, &st, &fwd.v, &owned[2])
        if fwd.q.ndim != 4 or fwd.v.ndim != 4:
            name, ndim = ("q", fwd.q.ndim) if fwd.q.ndim != 4 else ("v", fwd.v.ndim)
            raise LayoutError(f"{name} must have 4 axes (batch, heads, seq, head_dim); it has {ndim}")
        if fwd.q.device_type != kDLCUDA:
            with nogil:  # the validator names the device problem
                validate_forward(fwd)
        out_shape[0] = fwd.q.dims[0]
        out_shape[1] = fwd.q.dims[1]
        out_shape[2] = fwd.q.dims[2]
        out_shape[3] = fwd.v.dims[3]
        order_like(out_shape, fwd.q.strides, 4, out_strides)
        out_tensor = allocate_strided(api, 4, out_shape, out_strides, fwd.q.dtype, fwd.q.device_id)
        fwd.out = view_from_dltensor(out_tensor.dl_tensor, False, b"out")
        if with_lse:
            lse_shape[0] = out_shape[0]
            lse_shape[1] = out_shape[1]
            lse_shape[2] = out_shape[2]
            lse_strides[2] = 1
            lse_strides[1] = lse_shape[2]
            lse_strides[0] = lse_shape[1] * lse_shape[2]
            lse_tensor = allocate_strided(api, 3, lse_shape, lse_strides, float32_dtype(), fwd.q.device_id)
            fwd.lse = view_from_dltensor(lse_tensor.dl_tensor, False, b"lse")
        if not libraries_loaded():
            with nogil:
                problem = validate_forward(fwd)
            ensure_libraries()
        with nogil:
            call = prepare_forward(fwd, options)
        if call.workspace_bytes > 0:
            workspace_tensor = allocate_flat(api, call.workspace_bytes, bytes_dtype(), fwd.q.device_id)
            workspace = <char*>workspace_tensor.dl_tensor.data + workspace_tensor.dl_tensor.byte_offset
        with nogil:
            execute(call, st.handle, workspace)
        out = to_framework_object(api, out_tensor)
        out_tensor = NULL
        lse = None
        if lse_tensor != NULL:
            lse = to_framework_object(api, lse_tensor)
            lse_tensor = NULL
        return out, lse
    finally:
        release(owned, 3)
        # The workspace goes back to the framework's allocator now: its reuse is ordered on the stream
        # the kernel was queued on (the framework's current stream), so it cannot race the kernel.
        if workspace_tensor != NULL:
            workspace_tensor.deleter(workspace_tensor)
        if out_tensor != NULL:
            out_tensor.deleter(out_tensor)
        if lse_tensor != NULL:
            lse_tensor.deleter(lse_tensor)
