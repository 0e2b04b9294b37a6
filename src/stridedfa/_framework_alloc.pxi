# Included by _core.pyx: outputs allocated by the inputs' own framework.
#
# A producer that offers the DLPack C exchange API (torch >= 2.10) also lends its allocator
# (managed_tensor_allocator) and turns a DLPack tensor back into one of its objects
# (managed_tensor_to_py_object_no_sync). Through them a whole call -- reading the inputs, allocating
# outputs and workspace with the framework's caching allocator on its current stream, running,
# returning framework tensors -- happens in C (_framework_calls.pxi, _packed.pxi), with no
# Python-level tensor creation on the hot path. Allocations come from the framework's allocator,
# so they are also valid inside its CUDA-graph capture. The strides of what is allocated follow
# the core's layout rules (cpp/include/stridedfa/layout_rules.hpp).


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
    int* storage_refs  # NULL: the storage is this tensor's alone; else shared, freed by the last one
    int64_t shape[8]
    int64_t strides[8]

cdef extern from *:
    """
    static inline int stridedfa_release_ref(int* refs) { return __atomic_sub_fetch(refs, 1, __ATOMIC_ACQ_REL); }
    """
    int release_ref "stridedfa_release_ref"(int* refs) nogil

cdef void delete_strided_tensor(DLManagedTensorVersioned* self) noexcept nogil:
    # Deleters may run on any thread, with or without the GIL: shared storage is counted atomically.
    cdef StridedTensor* tensor = <StridedTensor*>self.manager_ctx
    cdef bint last = tensor.storage_refs == NULL or release_ref(tensor.storage_refs) == 0
    if last:
        if tensor.storage_refs != NULL:
            free(tensor.storage_refs)
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

cdef int64_t strided_elements(int ndim, const int64_t* shape, const int64_t* strides) noexcept nogil:
    """Elements of flat storage a layout (non-negative strides) needs: its last offset plus one."""
    cdef int64_t elements = 1
    cdef int i
    for i in range(ndim):
        if shape[i] == 0:
            return 0
        elements += (shape[i] - 1) * strides[i]
    return elements

cdef StridedTensor* new_strided_tensor(DLManagedTensorVersioned* flat, int* refs, int64_t byte_offset,
                                       int ndim, const int64_t* shape, const int64_t* strides,
                                       DLDataType dtype) noexcept nogil:
    """The wrapper giving `flat` (from byte_offset on) this layout; NULL when out of memory."""
    cdef StridedTensor* tensor = <StridedTensor*>malloc(sizeof(StridedTensor))
    cdef int i
    if tensor == NULL:
        return NULL
    memset(tensor, 0, sizeof(StridedTensor))
    tensor.storage = flat
    tensor.storage_refs = refs
    for i in range(ndim):
        tensor.shape[i] = shape[i]
        tensor.strides[i] = strides[i]
    tensor.managed.version.major = DLPACK_MAJOR_VERSION
    tensor.managed.version.minor = DLPACK_MINOR_VERSION
    tensor.managed.manager_ctx = tensor
    tensor.managed.deleter = delete_strided_tensor
    tensor.managed.dl_tensor = flat.dl_tensor
    tensor.managed.dl_tensor.data = <char*>flat.dl_tensor.data + flat.dl_tensor.byte_offset + byte_offset
    tensor.managed.dl_tensor.byte_offset = 0
    tensor.managed.dl_tensor.dtype = dtype
    tensor.managed.dl_tensor.ndim = ndim
    tensor.managed.dl_tensor.shape = tensor.shape
    tensor.managed.dl_tensor.strides = tensor.strides
    return tensor

cdef DLManagedTensorVersioned* allocate_strided(const DLPackExchangeAPI* api, int ndim,
                                                const int64_t* shape, const int64_t* strides,
                                                DLDataType dtype, int device_id,
                                                int device_type=kDLCUDA) except NULL:
    cdef DLManagedTensorVersioned* flat = allocate_flat(api, strided_elements(ndim, shape, strides), dtype,
                                                        device_id, device_type)
    cdef StridedTensor* tensor = new_strided_tensor(flat, NULL, 0, ndim, shape, strides, dtype)
    if tensor == NULL:
        flat.deleter(flat)
        raise MemoryError()
    return &tensor.managed

cdef int allocate_together(const DLPackExchangeAPI* api, int n, const int* ndims, const int64_t** shapes,
                           const int64_t** strides, const DLDataType* dtypes, int device_id,
                           DLManagedTensorVersioned** tensors) except -1:
    """n (at most 4) strided tensors in one allocation of the framework's (each at a 256-byte
    boundary), for outputs that live as long as each other (out and the statistics a backward keeps;
    the three gradients of one backward): one trip through the framework's allocator instead of n.
    The memory goes back when the last of them is freed. Fills tensors[0..n)."""
    cdef int64_t offsets[4]
    cdef int64_t total = 0
    cdef int i, j
    cdef int* refs
    cdef StridedTensor* tensor
    cdef DLManagedTensorVersioned* flat
    for i in range(n):
        tensors[i] = NULL
        offsets[i] = total
        total += (strided_elements(ndims[i], shapes[i], strides[i]) * ((dtypes[i].bits * dtypes[i].lanes + 7) // 8)
                  + 255) // 256 * 256
    flat = allocate_flat(api, total, bytes_dtype(), device_id)
    refs = <int*>malloc(sizeof(int))
    if refs == NULL:
        flat.deleter(flat)
        raise MemoryError()
    refs[0] = n
    for i in range(n):
        tensor = new_strided_tensor(flat, refs, offsets[i], ndims[i], shapes[i], strides[i], dtypes[i])
        if tensor == NULL:
            # Hand the remaining references over to the tensors made so far: the last frees `flat`.
            for j in range(i, n):
                if release_ref(refs) == 0:
                    free(refs)
                    flat.deleter(flat)
            raise MemoryError()
        tensors[i] = &tensor.managed
    return 0

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

cdef DLManagedTensorVersioned* allocate_stats(const DLPackExchangeAPI* api, const TensorView& q) except NULL:
    """The softmax statistics for logical (b, h, s, d) `q`: packed float32 (b, h, s), the layout
    cuDNN's backward reads."""
    cdef int64_t shape[3]
    cdef int64_t strides[3]
    shape[0] = q.dims[0]
    shape[1] = q.dims[1]
    shape[2] = q.dims[2]
    strides[2] = 1
    strides[1] = shape[2]
    strides[0] = shape[1] * shape[2]
    return allocate_strided(api, 3, shape, strides, float32_dtype(), q.device_id)

cdef DLManagedTensorVersioned* allocate_per_head(const DLPackExchangeAPI* api, const TensorView& q) except NULL:
    """One float32 per query head of logical (b, h, s, d) `q` (the gradient of attention sinks)."""
    cdef int64_t shape[1]
    cdef int64_t strides[1]
    shape[0] = q.dims[1]
    strides[0] = 1
    return allocate_strided(api, 1, shape, strides, float32_dtype(), q.device_id)


cdef void contiguous_strides(const int64_t* shape, int ndim, int64_t* strides) noexcept nogil:
    """Row-major (C-contiguous) element strides of `shape` (a score bias' gradient)."""
    cdef int64_t inner = 1
    cdef int i
    for i in range(ndim - 1, -1, -1):
        strides[i] = inner
        inner *= shape[i] if shape[i] > 1 else 1


cdef const DLPackExchangeAPI* allocating_api(object like) except NULL:
    cdef const DLPackExchangeAPI* api = exchange_api_of(type(like))
    if api == NULL or api.managed_tensor_allocator == NULL or api.managed_tensor_to_py_object_no_sync == NULL:
        raise TypeError(f"{type(like).__module__}.{type(like).__qualname__} does not offer the DLPack C "
                        f"exchange API's allocator; use sdpa_forward/sdpa_backward with preallocated outputs")
    return api

cdef int execute_with_framework_workspace(const DLPackExchangeAPI* api, const PreparedCall& call,
                                          uintptr_t stream, int device_id) except -1:
    """Runs a prepared call on `stream` with cuDNN's workspace from the framework's allocator. The
    workspace goes back right after the launch: its reuse is ordered on the stream the kernel was
    queued on (the framework's current stream), so it cannot race the kernel."""
    cdef DLManagedTensorVersioned* workspace_tensor = NULL
    cdef void* workspace = NULL
    if call.workspace_bytes > 0:
        workspace_tensor = allocate_flat(api, call.workspace_bytes, bytes_dtype(), device_id)
        workspace = <char*>workspace_tensor.dl_tensor.data + workspace_tensor.dl_tensor.byte_offset
    try:
        with nogil:
            execute(call, stream, workspace)
    finally:
        if workspace_tensor != NULL:
            workspace_tensor.deleter(workspace_tensor)
    return 0
