# Included by _core.pyx: stridedfa.cupy's calls in C. CuPy has no DLPack C exchange API, so its
# allocator is reached through Python callables (`hooks`, built by stridedfa.cupy: alloc(nbytes) ->
# a MemoryPointer, new_array(shape, dtype, memptr, byte_strides) -> cupy.ndarray, float32, and
# contiguous(x) -> a copy). Everything else -- reading the arrays (CuPy intake), the layout rule
# of what is allocated, the views of the new arrays, validation, launch -- stays in C. `allocation`,
# when given, is a context manager that makes the call's device and stream current for CuPy's
# allocator; it is entered around the allocations only, so the inputs are read, and ordered, on the
# caller's current stream.


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


cdef tuple cupy_forward_outputs(object q, object hooks, object allocation, bint with_lse,
                                CallOperands* fwd):
    """out dense in q's axis order and, with_lse, packed float32 (b, h, s) statistics."""
    cdef int64_t shape[4]
    cdef int64_t strides[4]
    if fwd.slot[kQ].ndim != 4 or fwd.slot[kV].ndim != 4:
        name, ndim = ("q", fwd.slot[kQ].ndim) if fwd.slot[kQ].ndim != 4 else ("v", fwd.slot[kV].ndim)
        raise LayoutError(f"{name} must be 4-D (batch, heads, seq, head_dim); it has {ndim} axes")
    if fwd.slot[kQ].device_type != kDLCUDA:
        with nogil:  # the validator names the device problem
            validate_call(fwd[0])
    shape[0], shape[1], shape[2] = fwd.slot[kQ].dims[0], fwd.slot[kQ].dims[1], fwd.slot[kQ].dims[2]
    shape[3] = fwd.slot[kV].dims[3]
    dense_strides_like(shape, fwd.slot[kQ].strides, 4, strides)
    out = cupy_empty(hooks, allocation, 4, shape, strides, q.dtype, fwd.slot[kQ].dtype, fwd.slot[kQ].device_id, b"out",
                     &fwd.slot[kO])
    lse = None
    if with_lse:
        strides[2] = 1
        strides[1] = shape[2]
        strides[0] = shape[1] * shape[2]
        lse = cupy_empty(hooks, allocation, 3, shape, strides, hooks.float32, float32_dtype(),
                         fwd.slot[kQ].device_id, b"lse", &fwd.slot[kLse])
    return out, lse


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


def _cupy_forward(q, k, v, scale, causal, causal_alignment, bint with_lse, stream, allocation, hooks,
                  window=None, softcap=None, seqlens_q=None, seqlens_kv=None, sinks=None, bias=None,
                  alibi_slopes=None, dropout_p=0.0, rng_state=None):
    """stridedfa.cupy.attention in one C call: returns (out, lse or None)."""
    cdef SdpaOptions options
    cdef CallOperands fwd
    cdef IntakeHold owned  # each consumed tensor's deleter runs when this returns
    cdef CallStream st
    cdef PreparedCall call
    cdef int i
    parse_options(scale, causal, causal_alignment, window, softcap, False, dropout_p, &options)
    parse_stream(stream, &st)
    intake(q, b"q", False, &st, &fwd.slot[kQ], &owned[0])
    intake(k, b"k", False, &st, &fwd.slot[kK], &owned[1])
    intake(v, b"v", False, &st, &fwd.slot[kV], &owned[2])
    intake_lengths(seqlens_q, seqlens_kv, &st, &fwd.slot[kSeqLensQ], &fwd.slot[kSeqLensKV], &owned[3])
    intake_optional(sinks, b"sinks", &st, &fwd.slot[kSinks], &owned[5])
    intake_optional(bias, b"bias", &st, &fwd.slot[kBias], &owned[6])
    intake_optional(alibi_slopes, b"alibi_slopes", &st, &fwd.slot[kAlibiSlopes], &owned[7])
    intake_optional(rng_state, b"rng_state", &st, &fwd.slot[kRngState], &owned[8])
    out, lse = cupy_forward_outputs(q, hooks, allocation, with_lse, &fwd)
    call = prepared(fwd, options)
    cupy_execute(call, st.handle, hooks, allocation)
    return out, lse


cdef tuple cupy_gradients(tuple inputs, object hooks, object allocation, CallOperands* bwd):
    """grad_q, grad_k, grad_v: each with its input's strides when the input is dense, else dense
    in the input's axis order."""
    cdef TensorView* views[3]
    cdef TensorView* grads[3]
    cdef const char* names[3]
    cdef int64_t strides[8]
    cdef int i
    views[0], views[1], views[2] = &bwd.slot[kQ], &bwd.slot[kK], &bwd.slot[kV]
    grads[0], grads[1], grads[2] = &bwd.slot[kGradQ], &bwd.slot[kGradK], &bwd.slot[kGradV]
    names[0], names[1], names[2] = b"grad_q", b"grad_k", b"grad_v"
    for i in range(3):
        if views[i].ndim != 4:
            raise LayoutError(f"{SLOT_NAMES[i].decode()} must be 4-D (batch, heads, seq, head_dim); it has "
                              f"{views[i].ndim} axes")
        if views[i].device_type != kDLCUDA:
            grads[i][0] = views[i][0]  # placeholders: the validator names the device problem first
    if (bwd.slot[kQ].device_type != kDLCUDA or bwd.slot[kK].device_type != kDLCUDA
            or bwd.slot[kV].device_type != kDLCUDA):
        with nogil:
            validate_call(bwd[0])
    result = []
    for i in range(3):
        gradient_strides(views[i][0], strides)
        result.append(cupy_empty(hooks, allocation, 4, views[i].dims, strides, inputs[i].dtype,
                                 views[i].dtype, views[i].device_id, names[i], grads[i]))
    return tuple(result)


def _cupy_backward(q, k, v, out, lse, grad_out, scale, causal, causal_alignment, stream, allocation,
                   hooks, window=None, softcap=None, seqlens_q=None, seqlens_kv=None, sinks=None, deterministic=False,
                   bias=None, bint with_grad_bias=False, alibi_slopes=None, dropout_p=0.0, rng_state=None):
    """stridedfa.cupy.attention_backward in one C call: returns (grad_q, grad_k, grad_v, grad_sinks
    or None, grad_bias or None: contiguous, of bias' shape, when `with_grad_bias`)."""
    cdef SdpaOptions options
    cdef CallOperands bwd
    cdef IntakeHold owned  # each consumed tensor's deleter runs when this returns
    cdef CallStream st
    cdef PreparedCall call
    cdef int64_t shape[1]
    cdef int64_t strides[4]
    cdef int i
    bwd.op = GraphOp.backward
    parse_options(scale, causal, causal_alignment, window, softcap, deterministic, dropout_p, &options)
    keep_alive = []
    parse_stream(stream, &st)
    intake(q, b"q", False, &st, &bwd.slot[kQ], &owned[0])
    intake(k, b"k", False, &st, &bwd.slot[kK], &owned[1])
    intake(v, b"v", False, &st, &bwd.slot[kV], &owned[2])
    intake(out, b"out", False, &st, &bwd.slot[kO], &owned[3])
    intake(lse, b"lse", False, &st, &bwd.slot[kLse], &owned[4])
    # A copy of an unreadable grad_out runs on the caller's stream, where grad_out was produced.
    intake_readable(grad_out, hooks.contiguous, &st, &bwd.slot[kGradO], &owned[5], keep_alive)
    intake_lengths(seqlens_q, seqlens_kv, &st, &bwd.slot[kSeqLensQ], &bwd.slot[kSeqLensKV], &owned[6])
    intake_optional(sinks, b"sinks", &st, &bwd.slot[kSinks], &owned[8])
    intake_optional(bias, b"bias", &st, &bwd.slot[kBias], &owned[9])
    intake_optional(alibi_slopes, b"alibi_slopes", &st, &bwd.slot[kAlibiSlopes], &owned[10])
    intake_optional(rng_state, b"rng_state", &st, &bwd.slot[kRngState], &owned[11])
    grads = cupy_gradients((q, k, v), hooks, allocation, &bwd)
    grad_sinks = None
    if sinks is not None and options.dropout_p == 0:  # one float32 per query head; see _backward_alloc
        shape[0], strides[0] = bwd.slot[kQ].dims[1], 1
        grad_sinks = cupy_empty(hooks, allocation, 1, shape, strides, hooks.float32, float32_dtype(),
                                bwd.slot[kQ].device_id, b"grad_sinks", &bwd.slot[kGradSinks])
    grad_bias = None
    if (with_grad_bias and bias is not None and bwd.slot[kBias].device_type == kDLCUDA
            and 1 <= bwd.slot[kBias].ndim <= 4):
        contiguous_strides(bwd.slot[kBias].dims, bwd.slot[kBias].ndim, strides)
        grad_bias = cupy_empty(hooks, allocation, bwd.slot[kBias].ndim, bwd.slot[kBias].dims, strides, q.dtype,
                               bwd.slot[kBias].dtype,
                               bwd.slot[kBias].device_id, b"grad_bias", &bwd.slot[kGradBias])
    call = prepared(bwd, options)
    cupy_execute(call, st.handle, hooks, allocation)
    return (*grads, grad_sinks, grad_bias)
