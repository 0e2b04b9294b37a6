# Included by _core.pyx: where a call's outputs and cuDNN's workspace come from -- one allocation
# strategy per kind of caller, each a small class over the same call path (_calls.pxi attend()):
#   Outputs          the caller's own outputs (nothing allocated); workspace from the caller's
#                    allocator, else the core's pool;
#   FrameworkOutputs the inputs' framework through the DLPack C exchange API (torch >= 2.10): its
#                    caching allocator on its current stream, valid inside its CUDA-graph capture,
#                    tensors handed back without Python-level tensor creation;
#   CupyOutputs      CuPy's pool, through Python hooks (CuPy has no exchange API);
#   BufferOutputs    stridedfa-owned DeviceBuffers (producers without an adapter).
# What is allocated for each output is one rule (layout_rules.hpp output_layout).


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


# --- CuPy's pool, through Python hooks --------------------------------------------------------------

cdef object cupy_allocate(object hooks, object allocation, int64_t nbytes):
    if allocation is None:
        return hooks.alloc(nbytes)
    with allocation:
        return hooks.alloc(nbytes)


cdef object cupy_empty(object hooks, object allocation, int ndim, const int64_t* shape,
                       const int64_t* strides, object dtype, DLDataType dl_dtype, int device,
                       const char* name, TensorView* view):
    """A new CuPy array with exactly these element strides, and its view in `view`."""
    cdef int64_t itemsize = (dl_dtype.bits * dl_dtype.lanes + 7) // 8
    cdef int64_t elements = 1
    cdef int i
    for i in range(ndim):
        elements *= shape[i]
    # Every layout the rule gives is dense in some axis order: prod(shape) elements cover it.
    memptr = cupy_allocate(hooks, allocation, elements * itemsize)
    array = hooks.new_array(int_tuple(shape, ndim, 1), dtype, memptr, int_tuple(strides, ndim, itemsize))
    view.name = name
    view.present = True
    view.ndim = ndim
    for i in range(ndim):
        view.dims[i] = shape[i]
        view.strides[i] = strides[i]
    view.dtype = dl_dtype
    view.device_type = kDLCUDA
    view.device_id = device
    view.data = <uintptr_t>memptr.ptr
    view.read_only = False
    return array


cdef int cupy_execute(const PreparedCall& call, uintptr_t stream, object hooks, object allocation) except -1:
    """Runs a prepared call with cuDNN's workspace from CuPy's pool on the call's stream (made
    current by `allocation` when it is not already): the block is reused only by work queued behind
    the kernel that uses it."""
    cdef void* workspace = NULL
    memptr = None
    if call.workspace_bytes > 0:
        memptr = cupy_allocate(hooks, allocation, call.workspace_bytes)
        workspace = <void*><uintptr_t>memptr.ptr
    with nogil:
        execute(call, stream, workspace)
    return 0


# --- Strategies ------------------------------------------------------------------------------------

cdef class Outputs:
    """The caller's outputs: nothing to allocate. cuDNN's workspace comes from
    `workspace_allocator(nbytes, device) -> (pointer, owner)` when given, else the core's pool."""
    cdef object workspace_allocator

    cdef int allocate(self, CallOperands* call, int n, const int* slots, OutputLayout* layouts) except -1:
        raise TypeError("this call allocates no outputs")

    cdef object take(self, int slot):
        """The output allocated for `slot`, handed to the caller (None where none was)."""
        return None

    cdef int launch(self, const PreparedCall& call, uintptr_t stream) except -1:
        cdef void* workspace = NULL
        cdef uintptr_t address
        owner = None  # lives until the launch is queued
        if call.workspace_bytes > 0 and self.workspace_allocator is not None:
            address, owner = self.workspace_allocator(call.workspace_bytes, call.problem.device)
            workspace = <void*>address
        with nogil:
            execute(call, stream, workspace)
        return 0


cdef class FrameworkOutputs(Outputs):
    """Outputs from the inputs' framework (its DLPack C exchange API's allocator); with `together`,
    every output of the call in one allocation (outputs that live as long as each other: out and
    the statistics eager autograd keeps; the three gradients of one backward). Not under
    torch.compile's CUDA graphs, which require each output to start a block of their pool."""
    cdef const DLPackExchangeAPI* api
    cdef bint together
    cdef DLManagedTensorVersioned* made[64]  # by slot; freed here unless taken

    def __dealloc__(self):
        cdef int i
        for i in range(64):
            if self.made[i] != NULL:
                self.made[i].deleter(self.made[i])

    cdef int allocate(self, CallOperands* call, int n, const int* slots, OutputLayout* layouts) except -1:
        cdef DLManagedTensorVersioned* tensors[8]
        cdef int ndims[8]
        cdef const int64_t* shapes[8]
        cdef const int64_t* strides[8]
        cdef DLDataType dtypes[8]
        cdef int i, grouped = 0, device = call.slot[kQ].device_id
        if self.together and n > 1:
            for i in range(n):  # the gradients of q, k and v, or out and lse; the rest alone
                if slots[i] in (kO, kLse, kGradQ, kGradK, kGradV):
                    ndims[grouped] = layouts[i].ndim
                    shapes[grouped] = layouts[i].shape
                    strides[grouped] = layouts[i].strides
                    dtypes[grouped] = layouts[i].dtype
                    grouped += 1
            if grouped > 1:
                allocate_together(self.api, grouped, ndims, shapes, strides, dtypes, device, tensors)
                grouped = 0
                for i in range(n):
                    if slots[i] in (kO, kLse, kGradQ, kGradK, kGradV):
                        self.made[slots[i]] = tensors[grouped]
                        grouped += 1
        for i in range(n):
            if self.made[slots[i]] == NULL:
                self.made[slots[i]] = allocate_strided(self.api, layouts[i].ndim, layouts[i].shape, layouts[i].strides,
                                                       layouts[i].dtype, device)
            call.slot[slots[i]] = view_from_dltensor(self.made[slots[i]].dl_tensor, False, kOperands[slots[i]].name,
                                                     ExportQuirk.none)
        return 0

    cdef object take(self, int slot):
        cdef DLManagedTensorVersioned* tensor = self.made[slot]
        if tensor == NULL:
            return None
        self.made[slot] = NULL  # to_framework_object owns it from here, whatever happens
        return to_framework_object(self.api, tensor)

    cdef int launch(self, const PreparedCall& call, uintptr_t stream) except -1:
        return execute_with_framework_workspace(self.api, call, stream, call.problem.device)


cdef FrameworkOutputs framework_outputs(object like, bint together):
    cdef FrameworkOutputs outputs = FrameworkOutputs.__new__(FrameworkOutputs)
    outputs.api = allocating_api(like)
    outputs.together = together
    return outputs


cdef class PackedOutputs(FrameworkOutputs):
    """The packed entry points' outputs, from the buffer's framework: out and a separate q's
    gradient are allocated in the packed buffer's layout axes (the layout rule's strides, permuted
    by `to_logical`), and the gradients of the q, k, v slices are slices of ONE gradient buffer with
    the packed buffer's shape (gradient_strides of it), which cuDNN writes in place. The statistics
    and the sinks' and bias' gradients are allocated as every call allocates them."""
    cdef int to_logical[4]
    cdef int dim
    cdef bint q_separate
    cdef TensorView packed
    cdef DLManagedTensorVersioned* grad_packed

    def __dealloc__(self):
        if self.grad_packed != NULL:
            self.grad_packed.deleter(self.grad_packed)

    cdef int allocate(self, CallOperands* call, int n, const int* slots, OutputLayout* layouts) except -1:
        cdef int i, axis, slot, index
        cdef int64_t shape[4]
        cdef int64_t strides[8]
        cdef TensorView whole, in_layout
        for i in range(n):
            slot = slots[i]
            if slot in (kGradK, kGradV) or (slot == kGradQ and not self.q_separate):
                if self.grad_packed == NULL:
                    gradient_strides(self.packed, strides)
                    self.grad_packed = allocate_strided(self.api, 5, self.packed.dims, strides, self.packed.dtype,
                                                        self.packed.device_id, self.packed.device_type)
                whole = view_from_dltensor(self.grad_packed.dl_tensor, False, b"grad_packed", ExportQuirk.none)
                index = slot - kGradQ  # q, k, v: slices 0, 1, 2; k, v: 0, 1 where q is separate
                if self.q_separate:
                    index -= 1
                call.slot[slot] = select_packed(whole, self.dim, index, self.to_logical, kOperands[slot].name)
            elif slot in (kO, kGradQ):  # in layout axes: layout axis to_logical[a] holds core axis a
                for axis in range(4):
                    shape[self.to_logical[axis]] = layouts[i].shape[axis]
                    strides[self.to_logical[axis]] = layouts[i].strides[axis]
                self.made[slot] = allocate_strided(self.api, 4, shape, strides, layouts[i].dtype,
                                                   self.packed.device_id, self.packed.device_type)
                in_layout = view_from_dltensor(self.made[slot].dl_tensor, False, kOperands[slot].name,
                                               ExportQuirk.none)
                call.slot[slot] = to_core_axes(in_layout, self.to_logical, kOperands[slot].name)
            else:
                FrameworkOutputs.allocate(self, call, 1, &slots[i], &layouts[i])
        return 0

    cdef object take_grad_packed(self):
        cdef DLManagedTensorVersioned* tensor = self.grad_packed
        if tensor == NULL:
            return None
        self.grad_packed = NULL  # to_framework_object owns it from here, whatever happens
        return to_framework_object(self.api, tensor)


cdef PackedOutputs packed_outputs(object packed, const TensorView& packed_view, int dim, const int* to_logical,
                                  bint q_separate):
    cdef PackedOutputs outputs = PackedOutputs.__new__(PackedOutputs)
    cdef int i
    outputs.api = allocating_api(packed)
    outputs.together = False
    outputs.packed = packed_view
    outputs.dim = dim
    outputs.q_separate = q_separate
    for i in range(4):
        outputs.to_logical[i] = to_logical[i]
    return outputs


cdef class CupyOutputs(Outputs):
    """Outputs and workspace from CuPy's pool through `hooks` (stridedfa.cupy's: alloc(nbytes) ->
    MemoryPointer, new_array(shape, dtype, memptr, byte_strides), float32, contiguous(x)), inside
    `allocation` (a context manager making the call's device and stream current) when given."""
    cdef object hooks, allocation, dtype  # dtype: the attention operands' (numpy) dtype
    cdef list made

    cdef int allocate(self, CallOperands* call, int n, const int* slots, OutputLayout* layouts) except -1:
        cdef int i
        for i in range(n):
            dtype = self.hooks.float32 if layouts[i].dtype.bits == 32 else self.dtype
            self.made[slots[i]] = cupy_empty(self.hooks, self.allocation, layouts[i].ndim, layouts[i].shape,
                                             layouts[i].strides, dtype, layouts[i].dtype, call.slot[kQ].device_id,
                                             kOperands[slots[i]].name, &call.slot[slots[i]])
        return 0

    cdef object take(self, int slot):
        return self.made[slot]

    cdef int launch(self, const PreparedCall& call, uintptr_t stream) except -1:
        return cupy_execute(call, stream, self.hooks, self.allocation)


cdef CupyOutputs cupy_outputs(object hooks, object allocation, object dtype):
    cdef CupyOutputs outputs = CupyOutputs.__new__(CupyOutputs)
    outputs.hooks, outputs.allocation, outputs.dtype = hooks, allocation, dtype
    outputs.made = [None] * kNumSlots
    return outputs


cdef class BufferOutputs(Outputs):
    """Outputs as stridedfa-owned DeviceBuffers allocated on the call's stream (`owner`: the stream
    object to keep alive with them, if any); cuDNN's workspace from the core's pool."""
    cdef uintptr_t stream
    cdef object owner
    cdef list made

    cdef int allocate(self, CallOperands* call, int n, const int* slots, OutputLayout* layouts) except -1:
        cdef int i
        for i in range(n):
            buffer = new_buffer(layouts[i].ndim, layouts[i].shape, layouts[i].strides, layouts[i].dtype,
                                call.slot[kQ].device_id, self.stream, self.owner)
            view_of_buffer(buffer, kOperands[slots[i]].name, &call.slot[slots[i]])
            self.made[slots[i]] = buffer
        return 0

    cdef object take(self, int slot):
        return self.made[slot]


cdef BufferOutputs buffer_outputs(uintptr_t stream, object owner):
    cdef BufferOutputs outputs = BufferOutputs.__new__(BufferOutputs)
    outputs.stream, outputs.owner = stream, owner
    outputs.made = [None] * kNumSlots
    return outputs
