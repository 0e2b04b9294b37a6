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
    cdef int64_t c_shape[8]
    cdef int64_t c_strides[8]
    cdef int i, n = len(shape)
    cdef const DLPackExchangeAPI* api = exchange_api_of(type(like))
    if api == NULL or api.managed_tensor_allocator == NULL:
        raise TypeError(f"{type(like).__qualname__} does not offer the DLPack C exchange API's allocator")
    if n > 8 or len(strides) != n:
        raise ValueError("at most 8 axes, and as many strides as extents")
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


cdef PreparedCall prepared_forward(const ForwardArgs& fwd, const SdpaOptions& options) except *:
    """prepare_forward, loading cuDNN on the first call (after validation, so bad input is
    reported even where cuDNN is missing)."""
    cdef PreparedCall call
    if not libraries_loaded():
        with nogil:
            validate_forward(fwd)
        ensure_libraries()
    with nogil:
        call = prepare_forward(fwd, options)
    return call


cdef PreparedCall prepared_backward(const BackwardArgs& bwd, const SdpaOptions& options) except *:
    """prepare_backward, loading cuDNN on the first call (see prepared_forward)."""
    cdef PreparedCall call
    if not libraries_loaded():
        with nogil:
            validate_backward(bwd)
        ensure_libraries()
    with nogil:
        call = prepare_backward(bwd, options)
    return call


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


def _forward_alloc(q, k, v, scale, causal, causal_alignment, bint with_lse, bint together=False):
    """Forward with outputs allocated by q's framework (its tensors must offer the DLPack C
    exchange API, as torch >= 2.10 does), on its current stream.

    out is dense in q's axis order (stridedfa._layouts.output_strides); lse, when asked for, is a
    packed float32 (batch, h_q, s_q); with `together`, in the same allocation as out (one trip
    through the allocator; the memory returns when both are gone -- for eager autograd, which keeps
    both. Not under torch.compile's CUDA graphs: they require every output to start a block of
    their pool). cuDNN's workspace comes from the same allocator.
    Returns (out, lse or None) as the framework's tensors.
    """
    cdef SdpaOptions options
    cdef ForwardArgs fwd
    cdef Owned owned[3]
    cdef CallStream st
    cdef PreparedCall call
    cdef DLManagedTensorVersioned* out_tensor = NULL
    cdef DLManagedTensorVersioned* lse_tensor = NULL
    cdef DLManagedTensorVersioned* pair[2]
    cdef int64_t out_shape[4]
    cdef int64_t out_strides[4]
    cdef int64_t lse_shape[3]
    cdef int64_t lse_strides[3]
    cdef int ndims[2]
    cdef const int64_t* shapes[2]
    cdef const int64_t* strides[2]
    cdef DLDataType dtypes[2]
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
        if with_lse and together:
            lse_shape[0], lse_shape[1], lse_shape[2] = out_shape[0], out_shape[1], out_shape[2]
            lse_strides[0], lse_strides[1], lse_strides[2] = out_shape[1] * out_shape[2], out_shape[2], 1
            ndims[0], ndims[1] = 4, 3
            shapes[0], shapes[1] = out_shape, lse_shape
            strides[0], strides[1] = out_strides, lse_strides
            dtypes[0], dtypes[1] = fwd.q.dtype, float32_dtype()
            allocate_together(api, 2, ndims, shapes, strides, dtypes, fwd.q.device_id, pair)
            out_tensor, lse_tensor = pair[0], pair[1]
            fwd.lse = view_from_dltensor(lse_tensor.dl_tensor, False, b"lse", ExportQuirk.none)
        else:
            out_tensor = allocate_strided(api, 4, out_shape, out_strides, fwd.q.dtype, fwd.q.device_id)
            if with_lse:
                lse_tensor = allocate_stats(api, fwd.q)
                fwd.lse = view_from_dltensor(lse_tensor.dl_tensor, False, b"lse", ExportQuirk.none)
        fwd.out = view_from_dltensor(out_tensor.dl_tensor, False, b"out", ExportQuirk.none)
        call = prepared_forward(fwd, options)
        execute_with_framework_workspace(api, call, st.handle, fwd.q.device_id)
        out = to_framework_object(api, out_tensor)
        out_tensor = NULL
        lse = None
        if lse_tensor != NULL:
            lse = to_framework_object(api, lse_tensor)
            lse_tensor = NULL
        return out, lse
    finally:
        release(owned, 3)
        if out_tensor != NULL:
            out_tensor.deleter(out_tensor)
        if lse_tensor != NULL:
            lse_tensor.deleter(lse_tensor)


cdef int intake_readable(object obj, object make_readable, CallStream* st, TensorView* view,
                         Owned* owned, list keep_alive) except -1:
    """Reads an input that autograd handed over (grad_out); only a layout cuDNN cannot read (a
    broadcast from out.sum().backward(), say) is replaced by make_readable(obj), a copy."""
    intake(obj, b"grad_out", False, st, view, owned)
    if view.device_type != kDLCUDA or cudnn_can_read(view[0]):
        return 0
    release(owned, 1)
    copy = make_readable(obj)
    keep_alive.append(copy)
    intake(copy, b"grad_out", False, st, view, owned)
    return 0


def _backward_alloc(q, k, v, out, lse, grad_out, scale, causal, causal_alignment, make_readable,
                    bint together):
    """Backward with grad_q, grad_k, grad_v allocated by q's framework (DLPack C exchange API) on
    its current stream, each with its input's strides when the input is dense, else dense in the
    input's axis order (stridedfa._layouts.gradient_strides); cuDNN's workspace from the same
    allocator. With `together` (eager autograd wanting all three, which then live alike as the
    .grad of three parameters) they share one allocation (never under torch.compile's CUDA graphs,
    which require each output to start a block of their pool). grad_out is passed through make_readable (a copy)
    only when cuDNN cannot read it. Returns (grad_q, grad_k, grad_v) as the framework's tensors."""
    cdef SdpaOptions options
    cdef BackwardArgs bwd
    cdef Owned owned[6]
    cdef CallStream st
    cdef PreparedCall call
    cdef DLManagedTensorVersioned* grads[3]
    cdef TensorView* inputs[3]
    cdef TensorView* outputs[3]
    cdef const char* names[3]
    cdef int64_t grad_strides[3][4]
    cdef int ndims[3]
    cdef const int64_t* shapes[3]
    cdef const int64_t* strides_of[3]
    cdef DLDataType dtypes[3]
    cdef int i
    parse_options(scale, causal, causal_alignment, &options)
    cdef const DLPackExchangeAPI* api = allocating_api(q)
    for i in range(6):
        owned[i].versioned = NULL
        owned[i].legacy = NULL
    for i in range(3):
        grads[i] = NULL
    inputs[0], inputs[1], inputs[2] = &bwd.q, &bwd.k, &bwd.v
    outputs[0], outputs[1], outputs[2] = &bwd.grad_q, &bwd.grad_k, &bwd.grad_v
    names[0], names[1], names[2] = b"grad_q", b"grad_k", b"grad_v"
    keep_alive = []
    parse_stream(None, &st)
    try:
        intake(q, b"q", False, &st, &bwd.q, &owned[0])
        intake(k, b"k", False, &st, &bwd.k, &owned[1])
        intake(v, b"v", False, &st, &bwd.v, &owned[2])
        intake(out, b"out", False, &st, &bwd.out, &owned[3])
        intake(lse, b"lse", False, &st, &bwd.lse, &owned[4])
        intake_readable(grad_out, make_readable, &st, &bwd.grad_out, &owned[5], keep_alive)
        for i in range(3):
            if inputs[i].ndim != 4:
                raise LayoutError(f"{SLOT_NAMES[i].decode()} must have 4 axes (batch, heads, seq, head_dim); "
                                  f"it has {inputs[i].ndim}")
            if inputs[i].device_type != kDLCUDA:
                outputs[i][0] = inputs[i][0]  # placeholders: the validator names the device problem
        if bwd.q.device_type != kDLCUDA or bwd.k.device_type != kDLCUDA or bwd.v.device_type != kDLCUDA:
            with nogil:
                validate_backward(bwd)
        for i in range(3):
            gradient_layout(inputs[i][0], grad_strides[i])
            ndims[i], shapes[i], strides_of[i], dtypes[i] = 4, inputs[i].dims, grad_strides[i], inputs[i].dtype
        if together:
            allocate_together(api, 3, ndims, shapes, strides_of, dtypes, bwd.q.device_id, grads)
        for i in range(3):
            if not together:
                grads[i] = allocate_strided(api, 4, inputs[i].dims, grad_strides[i], inputs[i].dtype,
                                            inputs[i].device_id)
            outputs[i][0] = view_from_dltensor(grads[i].dl_tensor, False, names[i], ExportQuirk.none)
        call = prepared_backward(bwd, options)
        execute_with_framework_workspace(api, call, st.handle, bwd.q.device_id)
        result = []
        for i in range(3):
            result.append(to_framework_object(api, grads[i]))
            grads[i] = NULL
        return tuple(result)
    finally:
        release(owned, 6)
        for i in range(3):
            if grads[i] != NULL:
                grads[i].deleter(grads[i])


# --- The packed entry point: q/k/v (or k/v) as slices of one buffer, one packed gradient -----------

cdef void select_and_order(const TensorView& packed, int dim, int index, const int* to_logical,
                           const char* name, TensorView* out) noexcept nogil:
    """out = packed.select(dim, index) with its four remaining (layout-ordered) axes permuted by
    `to_logical` (or kept in layout order when it is NULL). No memory is touched."""
    cdef int remaining[4]
    cdef int i, n = 0
    cdef int64_t itemsize
    for i in range(5):
        if i != dim:
            remaining[n] = i
            n += 1
    out[0] = packed
    out.name = name
    out.ndim = 4
    for i in range(4):
        n = remaining[to_logical[i] if to_logical != NULL else i]
        out.dims[i] = packed.dims[n]
        out.strides[i] = packed.strides[n]
    itemsize = (<int64_t>packed.dtype.bits * packed.dtype.lanes + 7) // 8
    out.data = packed.data + <uintptr_t>(index * packed.strides[dim] * itemsize)


cdef void reorder(const TensorView& layout_view, const int* to_logical, const char* name,
                  TensorView* out) noexcept nogil:
    """A 4-axis view in layout order, permuted to the core's (b, h, s, d) axes."""
    cdef int i
    out[0] = layout_view
    out.name = name
    for i in range(4):
        out.dims[i] = layout_view.dims[to_logical[i]]
        out.strides[i] = layout_view.strides[to_logical[i]]


cdef bint is_dense_view(const int64_t* dims, const int64_t* strides, int ndim) noexcept nogil:
    """Same rule as stridedfa._layouts.is_dense: axes by increasing stride (stable), extent-1 axes
    skipped, each stride the product of the extents inside it."""
    cdef int order[8]
    cdef int i, j, axis
    cdef int64_t expected = 1
    for i in range(ndim):
        order[i] = i
    for i in range(1, ndim):
        axis = order[i]
        j = i - 1
        while j >= 0 and strides[order[j]] > strides[axis]:
            order[j + 1] = order[j]
            j -= 1
        order[j + 1] = axis
    for i in range(ndim):
        axis = order[i]
        if dims[axis] == 1:
            continue
        if strides[axis] != expected:
            return False
        expected *= dims[axis]
    return True


cdef void gradient_layout(const TensorView& like, int64_t* strides) noexcept nogil:
    """stridedfa._layouts.gradient_strides: like's strides when dense, else dense in its order."""
    cdef int i
    if is_dense_view(like.dims, like.strides, like.ndim):
        for i in range(like.ndim):
            strides[i] = like.strides[i]
    else:
        order_like(like.dims, like.strides, like.ndim, strides)


cdef int parse_to_logical(object to_logical, int* out) except -1:
    if len(to_logical) != 4 or sorted(to_logical) != [0, 1, 2, 3]:
        raise ValueError(f"to_logical must be a permutation of (0, 1, 2, 3), got {to_logical!r}")
    for i in range(4):
        out[i] = to_logical[i]
    return 0


cdef const DLPackExchangeAPI* allocating_api(object like) except NULL:
    cdef const DLPackExchangeAPI* api = exchange_api_of(type(like))
    if api == NULL or api.managed_tensor_allocator == NULL or api.managed_tensor_to_py_object_no_sync == NULL:
        raise TypeError(f"{type(like).__module__}.{type(like).__qualname__} does not offer the DLPack C "
                        f"exchange API's allocator; use sdpa_forward/sdpa_backward with preallocated outputs")
    return api


cdef int check_packed(const TensorView& packed, int dim, int want) except -1:
    if packed.ndim != 5:
        raise LayoutError(f"packed must have 5 axes (four named by the layout plus the packing axis); "
                          f"it has {packed.ndim}")
    if dim < 0 or dim > 4 or packed.dims[dim] != want:
        raise LayoutError(f"packed must have extent {want} along dim {dim}")
    return 0


def _packed_forward_alloc(packed, int dim, to_logical, q, scale, causal, causal_alignment,
                          bint with_lse):
    """Forward of the packed entry point, outputs allocated by packed's framework (see
    _forward_alloc). `packed` holds q, k, v (or k, v with `q` given in the same layout) along
    `dim`; its other axes are in layout order, and `to_logical[i]` is the layout axis holding the
    core's axis i (b, h, s, d). Returns (out in layout axes, dense in q's memory order; lse or
    None)."""
    cdef SdpaOptions options
    cdef ForwardArgs fwd
    cdef Owned owned[2]
    cdef CallStream st
    cdef PreparedCall call
    cdef TensorView packed_view, q_layout, v_layout, out_layout
    cdef DLManagedTensorVersioned* out_tensor = NULL
    cdef DLManagedTensorVersioned* lse_tensor = NULL
    cdef int perm[4]
    cdef int64_t out_shape[4]
    cdef int64_t out_strides[4]
    cdef int i
    parse_options(scale, causal, causal_alignment, &options)
    parse_to_logical(to_logical, perm)
    cdef const DLPackExchangeAPI* api = allocating_api(packed)
    for i in range(2):
        owned[i].versioned = NULL
        owned[i].legacy = NULL
    parse_stream(None, &st)
    try:
        intake(packed, b"packed", False, &st, &packed_view, &owned[0])
        check_packed(packed_view, dim, 3 if q is None else 2)
        if q is None:
            select_and_order(packed_view, dim, 0, NULL, b"q", &q_layout)
            select_and_order(packed_view, dim, 1, perm, b"k", &fwd.k)
            select_and_order(packed_view, dim, 2, perm, b"v", &fwd.v)
        else:
            intake(q, b"q", False, &st, &q_layout, &owned[1])
            if q_layout.ndim != 4:
                raise LayoutError(f"q must have 4 axes in the packed buffer's layout; it has {q_layout.ndim}")
            select_and_order(packed_view, dim, 0, perm, b"k", &fwd.k)
            select_and_order(packed_view, dim, 1, perm, b"v", &fwd.v)
        reorder(q_layout, perm, b"q", &fwd.q)
        if packed_view.device_type != kDLCUDA:
            with nogil:
                validate_forward(fwd)
        for i in range(4):
            out_shape[i] = q_layout.dims[i]
        out_shape[perm[3]] = fwd.v.dims[3]  # head_dim of v
        order_like(out_shape, q_layout.strides, 4, out_strides)
        out_tensor = allocate_strided(api, 4, out_shape, out_strides, packed_view.dtype, packed_view.device_id)
        out_layout = view_from_dltensor(out_tensor.dl_tensor, False, b"out", ExportQuirk.none)
        reorder(out_layout, perm, b"out", &fwd.out)
        if with_lse:
            lse_tensor = allocate_stats(api, fwd.q)
            fwd.lse = view_from_dltensor(lse_tensor.dl_tensor, False, b"lse", ExportQuirk.none)
        call = prepared_forward(fwd, options)
        execute_with_framework_workspace(api, call, st.handle, packed_view.device_id)
        out = to_framework_object(api, out_tensor)
        out_tensor = NULL
        lse = None
        if lse_tensor != NULL:
            lse = to_framework_object(api, lse_tensor)
            lse_tensor = NULL
        return out, lse
    finally:
        release(owned, 2)
        if out_tensor != NULL:
            out_tensor.deleter(out_tensor)
        if lse_tensor != NULL:
            lse_tensor.deleter(lse_tensor)


def _packed_backward_alloc(packed, int dim, to_logical, q, out, lse, grad_out, scale, causal,
                           causal_alignment):
    """Backward of the packed entry point: allocates one gradient buffer with packed's strides
    (dense in its axis order if packed is not dense) and, with a separate q, q's gradient (same
    rule); cuDNN writes dQ/dK/dV straight into their slices. `out` and `grad_out` are in layout
    axes. Returns (grad_packed, grad_q or None)."""
    cdef SdpaOptions options
    cdef BackwardArgs bwd
    cdef Owned owned[5]
    cdef CallStream st
    cdef PreparedCall call
    cdef TensorView packed_view, q_layout, out_layout, grad_out_layout, grad_packed_view, grad_q_layout
    cdef DLManagedTensorVersioned* grad_packed_tensor = NULL
    cdef DLManagedTensorVersioned* grad_q_tensor = NULL
    cdef int perm[4]
    cdef int64_t strides[8]
    cdef int i
    parse_options(scale, causal, causal_alignment, &options)
    parse_to_logical(to_logical, perm)
    cdef const DLPackExchangeAPI* api = allocating_api(packed)
    for i in range(5):
        owned[i].versioned = NULL
        owned[i].legacy = NULL
    parse_stream(None, &st)
    try:
        intake(packed, b"packed", False, &st, &packed_view, &owned[0])
        check_packed(packed_view, dim, 3 if q is None else 2)
        intake(out, b"out", False, &st, &out_layout, &owned[1])
        intake(grad_out, b"grad_out", False, &st, &grad_out_layout, &owned[2])
        intake(lse, b"lse", False, &st, &bwd.lse, &owned[3])
        if out_layout.ndim != 4 or grad_out_layout.ndim != 4:
            raise LayoutError("out and grad_out must have 4 axes in the packed buffer's layout")
        reorder(out_layout, perm, b"out", &bwd.out)
        reorder(grad_out_layout, perm, b"grad_out", &bwd.grad_out)
        gradient_layout(packed_view, strides)
        grad_packed_tensor = allocate_strided(api, 5, packed_view.dims, strides, packed_view.dtype,
                                              packed_view.device_id)
        grad_packed_view = view_from_dltensor(grad_packed_tensor.dl_tensor, False, b"grad_packed", ExportQuirk.none)
        if q is None:
            select_and_order(packed_view, dim, 0, perm, b"q", &bwd.q)
            select_and_order(packed_view, dim, 1, perm, b"k", &bwd.k)
            select_and_order(packed_view, dim, 2, perm, b"v", &bwd.v)
            select_and_order(grad_packed_view, dim, 0, perm, b"grad_q", &bwd.grad_q)
            select_and_order(grad_packed_view, dim, 1, perm, b"grad_k", &bwd.grad_k)
            select_and_order(grad_packed_view, dim, 2, perm, b"grad_v", &bwd.grad_v)
        else:
            intake(q, b"q", False, &st, &q_layout, &owned[4])
            if q_layout.ndim != 4:
                raise LayoutError(f"q must have 4 axes in the packed buffer's layout; it has {q_layout.ndim}")
            reorder(q_layout, perm, b"q", &bwd.q)
            select_and_order(packed_view, dim, 0, perm, b"k", &bwd.k)
            select_and_order(packed_view, dim, 1, perm, b"v", &bwd.v)
            gradient_layout(q_layout, strides)
            grad_q_tensor = allocate_strided(api, 4, q_layout.dims, strides, q_layout.dtype, q_layout.device_id)
            grad_q_layout = view_from_dltensor(grad_q_tensor.dl_tensor, False, b"grad_q", ExportQuirk.none)
            reorder(grad_q_layout, perm, b"grad_q", &bwd.grad_q)
            select_and_order(grad_packed_view, dim, 0, perm, b"grad_k", &bwd.grad_k)
            select_and_order(grad_packed_view, dim, 1, perm, b"grad_v", &bwd.grad_v)
        call = prepared_backward(bwd, options)
        execute_with_framework_workspace(api, call, st.handle, packed_view.device_id)
        grad_packed = to_framework_object(api, grad_packed_tensor)
        grad_packed_tensor = NULL
        grad_q = None
        if grad_q_tensor != NULL:
            grad_q = to_framework_object(api, grad_q_tensor)
            grad_q_tensor = NULL
        return grad_packed, grad_q
    finally:
        release(owned, 5)
        if grad_packed_tensor != NULL:
            grad_packed_tensor.deleter(grad_packed_tensor)
        if grad_q_tensor != NULL:
            grad_q_tensor.deleter(grad_q_tensor)


def _gradient_strides(shape, strides):
    """The C rule for gradient strides, exposed for the test that keeps it equal to _layouts'."""
    cdef TensorView view
    cdef int64_t out[8]
    cdef int i, n = len(shape)
    if n > 8 or len(strides) != n:
        raise ValueError("at most 8 axes, and as many strides as extents")
    view.ndim = n
    for i in range(n):
        view.dims[i] = shape[i]
        view.strides[i] = strides[i]
    gradient_layout(view, out)
    return tuple(out[i] for i in range(n))
