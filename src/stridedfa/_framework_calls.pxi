# Included by _core.pyx: the calls of framework adapters whose tensors offer the DLPack C exchange
# API (stridedfa.torch): one C call reads the inputs, allocates the outputs through the framework
# (_framework_alloc.pxi), validates, launches and returns the framework's tensors.


# cuDNN quirk sinks_grad_under_dropout, asked of the quirks table once (a test may lift it).
cdef bint SINKS_GRAD_UNDER_DROPOUT = quirk_applies_named(b"sinks_grad_under_dropout", 0)


def _forward_alloc(q, k, v, scale, causal, causal_alignment, bint with_lse, bint together=False,
                   window=None, softcap=None, seqlens_q=None, seqlens_kv=None, sinks=None, bias=None,
                   alibi_slopes=None, dropout_p=0.0, rng_state=None, block_table=None):
    """Forward with outputs allocated by q's framework (its tensors must offer the DLPack C
    exchange API, as torch >= 2.10 does), on its current stream.

    out is dense in q's axis order (stridedfa._layouts.output_strides); lse, when asked for, is a
    packed float32 (batch, h_q, s_q); with `together`, in the same allocation as out (one trip
    through the allocator; the memory returns when both are gone -- for eager autograd, which keeps
    both. Not under torch.compile's CUDA graphs: they require every output to start a block of
    their pool). cuDNN's workspace comes from the same allocator. With a block_table, k and v are
    paged caches (see sdpa_forward).
    Returns (out, lse or None) as the framework's tensors.
    """
    cdef SdpaOptions options
    cdef CallOperands fwd
    cdef IntakeHold owned  # each consumed tensor's deleter runs when this returns
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
    parse_options(scale, causal, causal_alignment, window, softcap, False, dropout_p, &options)
    cdef const DLPackExchangeAPI* api = exchange_api_of(type(q))
    if api == NULL or api.managed_tensor_allocator == NULL or api.managed_tensor_to_py_object_no_sync == NULL:
        raise TypeError(f"q ({type(q).__module__}.{type(q).__qualname__}) does not offer the DLPack C "
                        f"exchange API's allocator; pass preallocated outputs to sdpa_forward instead")
    parse_stream(None, &st)
    try:
        intake(q, b"q", False, &st, &fwd.slot[kQ], &owned[0])
        intake(k, b"k", False, &st, &fwd.slot[kK], &owned[1])
        intake(v, b"v", False, &st, &fwd.slot[kV], &owned[2])
        intake_lengths(seqlens_q, seqlens_kv, &st, &fwd.slot[kSeqLensQ], &fwd.slot[kSeqLensKV], &owned[3])
        intake_optional(sinks, b"sinks", &st, &fwd.slot[kSinks], &owned[5])
        intake_optional(bias, b"bias", &st, &fwd.slot[kBias], &owned[6])
        intake_optional(alibi_slopes, b"alibi_slopes", &st, &fwd.slot[kAlibiSlopes], &owned[7])
        intake_optional(rng_state, b"rng_state", &st, &fwd.slot[kRngState], &owned[8])
        intake_optional(block_table, b"block_table", &st, &fwd.slot[kBlockTable], &owned[9])
        if fwd.slot[kQ].ndim != 4 or fwd.slot[kV].ndim != 4:
            name, ndim = ("q", fwd.slot[kQ].ndim) if fwd.slot[kQ].ndim != 4 else ("v", fwd.slot[kV].ndim)
            raise LayoutError(f"{name} must have 4 axes (batch, heads, seq, head_dim); it has {ndim}")
        if fwd.slot[kQ].device_type != kDLCUDA:
            with nogil:  # the validator names the device problem
                validate_call(fwd)
        out_shape[0] = fwd.slot[kQ].dims[0]
        out_shape[1] = fwd.slot[kQ].dims[1]
        out_shape[2] = fwd.slot[kQ].dims[2]
        out_shape[3] = fwd.slot[kV].dims[3]
        dense_strides_like(out_shape, fwd.slot[kQ].strides, 4, out_strides)
        if with_lse and together:
            lse_shape[0], lse_shape[1], lse_shape[2] = out_shape[0], out_shape[1], out_shape[2]
            lse_strides[0], lse_strides[1], lse_strides[2] = out_shape[1] * out_shape[2], out_shape[2], 1
            ndims[0], ndims[1] = 4, 3
            shapes[0], shapes[1] = out_shape, lse_shape
            strides[0], strides[1] = out_strides, lse_strides
            dtypes[0], dtypes[1] = fwd.slot[kQ].dtype, float32_dtype()
            allocate_together(api, 2, ndims, shapes, strides, dtypes, fwd.slot[kQ].device_id, pair)
            out_tensor, lse_tensor = pair[0], pair[1]
            fwd.slot[kLse] = view_from_dltensor(lse_tensor.dl_tensor, False, b"lse", ExportQuirk.none)
        else:
            out_tensor = allocate_strided(api, 4, out_shape, out_strides, fwd.slot[kQ].dtype, fwd.slot[kQ].device_id)
            if with_lse:
                lse_tensor = allocate_stats(api, fwd.slot[kQ])
                fwd.slot[kLse] = view_from_dltensor(lse_tensor.dl_tensor, False, b"lse", ExportQuirk.none)
        fwd.slot[kO] = view_from_dltensor(out_tensor.dl_tensor, False, b"out", ExportQuirk.none)
        call = prepared(fwd, options)
        execute_with_framework_workspace(api, call, st.handle, fwd.slot[kQ].device_id)
        out = to_framework_object(api, out_tensor)
        out_tensor = NULL
        lse = None
        if lse_tensor != NULL:
            lse = to_framework_object(api, lse_tensor)
            lse_tensor = NULL
        return out, lse
    finally:
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
    owned.release()
    copy = make_readable(obj)
    keep_alive.append(copy)
    intake(copy, b"grad_out", False, st, view, owned)
    return 0


def _backward_alloc(q, k, v, out, lse, grad_out, scale, causal, causal_alignment, make_readable,
                    bint together, window=None, softcap=None, seqlens_q=None, seqlens_kv=None, sinks=None,
                    deterministic=False, bias=None, bint with_grad_bias=False, alibi_slopes=None,
                    dropout_p=0.0, rng_state=None):
    """Backward with grad_q, grad_k, grad_v allocated by q's framework (DLPack C exchange API) on
    its current stream, each with its input's strides when the input is dense, else dense in the
    input's axis order (stridedfa._layouts.gradient_strides); cuDNN's workspace from the same
    allocator. With `together` (eager autograd wanting all three, which then live alike as the
    .grad of three parameters) they share one allocation (never under torch.compile's CUDA graphs,
    which require each output to start a block of their pool). grad_out is passed through make_readable (a copy)
    only when cuDNN cannot read it. Returns (grad_q, grad_k, grad_v, grad_sinks, grad_bias) as the
    framework's tensors, grad_sinks a float32 (h_q,) when sinks are given, grad_bias (contiguous, of
    bias' shape) when `with_grad_bias`, else None."""
    cdef SdpaOptions options
    cdef CallOperands bwd
    cdef IntakeHold owned  # each consumed tensor's deleter runs when this returns
    cdef CallStream st
    cdef PreparedCall call
    cdef DLManagedTensorVersioned* grads[3]
    cdef DLManagedTensorVersioned* bias_grad = NULL
    cdef int64_t bias_strides[4]
    cdef TensorView* inputs[3]
    cdef TensorView* outputs[3]
    cdef const char* names[3]
    cdef int64_t grad_strides[3][4]
    cdef int ndims[3]
    cdef const int64_t* shapes[3]
    cdef const int64_t* strides_of[3]
    cdef DLDataType dtypes[3]
    cdef DLManagedTensorVersioned* sinks_grad = NULL
    cdef int i
    bwd.op = GraphOp.backward
    parse_options(scale, causal, causal_alignment, window, softcap, deterministic, dropout_p, &options)
    cdef const DLPackExchangeAPI* api = allocating_api(q)
    for i in range(3):
        grads[i] = NULL
    inputs[0], inputs[1], inputs[2] = &bwd.slot[kQ], &bwd.slot[kK], &bwd.slot[kV]
    outputs[0], outputs[1], outputs[2] = &bwd.slot[kGradQ], &bwd.slot[kGradK], &bwd.slot[kGradV]
    names[0], names[1], names[2] = b"grad_q", b"grad_k", b"grad_v"
    keep_alive = []
    parse_stream(None, &st)
    try:
        intake(q, b"q", False, &st, &bwd.slot[kQ], &owned[0])
        intake(k, b"k", False, &st, &bwd.slot[kK], &owned[1])
        intake(v, b"v", False, &st, &bwd.slot[kV], &owned[2])
        intake(out, b"out", False, &st, &bwd.slot[kO], &owned[3])
        intake(lse, b"lse", False, &st, &bwd.slot[kLse], &owned[4])
        intake_readable(grad_out, make_readable, &st, &bwd.slot[kGradO], &owned[5], keep_alive)
        intake_lengths(seqlens_q, seqlens_kv, &st, &bwd.slot[kSeqLensQ], &bwd.slot[kSeqLensKV], &owned[6])
        intake_optional(sinks, b"sinks", &st, &bwd.slot[kSinks], &owned[8])
        intake_optional(bias, b"bias", &st, &bwd.slot[kBias], &owned[9])
        intake_optional(alibi_slopes, b"alibi_slopes", &st, &bwd.slot[kAlibiSlopes], &owned[10])
        intake_optional(rng_state, b"rng_state", &st, &bwd.slot[kRngState], &owned[11])
        for i in range(3):
            if inputs[i].ndim != 4:
                raise LayoutError(f"{SLOT_NAMES[i].decode()} must have 4 axes (batch, heads, seq, head_dim); "
                                  f"it has {inputs[i].ndim}")
            if inputs[i].device_type != kDLCUDA:
                outputs[i][0] = inputs[i][0]  # placeholders: the validator names the device problem
        if (bwd.slot[kQ].device_type != kDLCUDA or bwd.slot[kK].device_type != kDLCUDA
                or bwd.slot[kV].device_type != kDLCUDA):
            with nogil:
                validate_call(bwd)
        for i in range(3):
            gradient_strides(inputs[i][0], grad_strides[i])
            ndims[i], shapes[i], strides_of[i], dtypes[i] = 4, inputs[i].dims, grad_strides[i], inputs[i].dtype
        if together:
            allocate_together(api, 3, ndims, shapes, strides_of, dtypes, bwd.slot[kQ].device_id, grads)
        for i in range(3):
            if not together:
                grads[i] = allocate_strided(api, 4, inputs[i].dims, grad_strides[i], inputs[i].dtype,
                                            inputs[i].device_id)
            outputs[i][0] = view_from_dltensor(grads[i].dl_tensor, False, names[i], ExportQuirk.none)
        # Under dropout the sinks' gradient is not asked for (cuDNN quirk sinks_grad_under_dropout).
        if sinks is not None and (options.dropout_p == 0 or not SINKS_GRAD_UNDER_DROPOUT):
            sinks_grad = allocate_per_head(api, bwd.slot[kQ])
            bwd.slot[kGradSinks] = view_from_dltensor(sinks_grad.dl_tensor, False, b"grad_sinks", ExportQuirk.none)
        if (with_grad_bias and bias is not None and bwd.slot[kBias].device_type == kDLCUDA
                and 1 <= bwd.slot[kBias].ndim <= 4):
            contiguous_strides(bwd.slot[kBias].dims, bwd.slot[kBias].ndim, bias_strides)
            bias_grad = allocate_strided(api, bwd.slot[kBias].ndim, bwd.slot[kBias].dims, bias_strides,
                                         bwd.slot[kBias].dtype,
                                         bwd.slot[kBias].device_id)
            bwd.slot[kGradBias] = view_from_dltensor(bias_grad.dl_tensor, False, b"grad_bias", ExportQuirk.none)
        call = prepared(bwd, options)
        execute_with_framework_workspace(api, call, st.handle, bwd.slot[kQ].device_id)
        result = []
        for i in range(3):
            result.append(to_framework_object(api, grads[i]))
            grads[i] = NULL
        result.append(None)
        if sinks_grad != NULL:
            result[3] = to_framework_object(api, sinks_grad)
            sinks_grad = NULL
        result.append(None)
        if bias_grad != NULL:
            result[4] = to_framework_object(api, bias_grad)
            bias_grad = NULL
        return tuple(result)
    finally:
        if bias_grad != NULL:
            bias_grad.deleter(bias_grad)
        for i in range(3):
            if grads[i] != NULL:
                grads[i].deleter(grads[i])
        if sinks_grad != NULL:
            sinks_grad.deleter(sinks_grad)


# --- The packed entry point: q/k/v (or k/v) as slices of one buffer, one packed gradient -----------
