# Included by _core.pyx: the packed entry point. q/k/v (or k/v) are slices of one buffer, read as
# views (layout_rules.hpp select_packed), and the backward writes dQ/dK/dV into one packed gradient
# buffer allocated by the buffer's framework. The views of q, k, v and of the gradients are cut here;
# the other operands are read, and the statistics and the sinks' and bias' gradients allocated, as
# every call does (_calls.pxi).

# The options' tensors, named once.
cdef SlotList PACKED_OPTIONS = slot_list("seqlens_q seqlens_kv sinks bias alibi_slopes rng_state")
# What intake holds beyond the slots: the packed buffer, and q, out and grad_out in layout axes.
cdef enum:
    kHeldPacked = kNumSlots
    kHeldQ
    kHeldOut
    kHeldGradOut


cdef int parse_to_logical(object to_logical, int* out) except -1:
    if len(to_logical) != 4 or sorted(to_logical) != [0, 1, 2, 3]:
        raise ValueError(f"to_logical must be a permutation of (0, 1, 2, 3), got {to_logical!r}")
    for i in range(4):
        out[i] = to_logical[i]
    return 0


cdef int check_packed(const TensorView& packed, int dim, int want) except -1:
    if packed.ndim != 5:
        raise LayoutError(f"packed must have 5 axes (four named by the layout plus the packing axis); "
                          f"it has {packed.ndim}")
    if dim < 0 or dim > 4 or packed.dims[dim] != want:
        raise LayoutError(f"packed must have extent {want} along dim {dim}")
    return 0


def _packed_forward_alloc(packed, int dim, to_logical, q, scale, causal, causal_alignment,
                          bint with_lse, window=None, softcap=None, seqlens_q=None, seqlens_kv=None, sinks=None,
                          bias=None, alibi_slopes=None, dropout_p=0.0, rng_state=None):
    """Forward of the packed entry point, outputs allocated by packed's framework (see
    _forward_alloc). `packed` holds q, k, v (or k, v with `q` given in the same layout) along
    `dim`; its other axes are in layout order, and `to_logical[i]` is the layout axis holding the
    core's axis i (b, h, s, d); a bias is in the core's (b, h, s_q, s_kv) axes. Returns (out in
    layout axes, dense in q's memory order; lse or None)."""
    cdef SdpaOptions options
    cdef CallOperands fwd
    cdef IntakeHold owned  # each consumed tensor's deleter runs when this returns
    cdef CallStream st
    cdef PreparedCall call
    cdef TensorView packed_view, q_layout, v_layout, out_layout
    cdef DLManagedTensorVersioned* out_tensor = NULL
    cdef int perm[4]
    cdef int64_t out_shape[4]
    cdef int64_t out_strides[4]
    cdef int i
    parse_options(scale, causal, causal_alignment, window, softcap, False, dropout_p, &options)
    parse_to_logical(to_logical, perm)
    cdef FrameworkOutputs outputs = framework_outputs(packed, False)
    cdef const DLPackExchangeAPI* api = outputs.api
    parse_stream(None, &st)
    try:
        intake(packed, b"packed", False, &st, &packed_view, &owned[kHeldPacked])
        check_packed(packed_view, dim, 3 if q is None else 2)
        intake_slots((seqlens_q, seqlens_kv, sinks, bias, alibi_slopes, rng_state), &PACKED_OPTIONS, &st, &fwd,
                     &owned)
        if q is None:
            q_layout = select_packed(packed_view, dim, 0, NULL, b"q")
            fwd.slot[kK] = select_packed(packed_view, dim, 1, perm, b"k")
            fwd.slot[kV] = select_packed(packed_view, dim, 2, perm, b"v")
        else:
            intake(q, b"q", False, &st, &q_layout, &owned[kHeldQ])
            if q_layout.ndim != 4:
                raise LayoutError(f"q must have 4 axes in the packed buffer's layout; it has {q_layout.ndim}")
            fwd.slot[kK] = select_packed(packed_view, dim, 0, perm, b"k")
            fwd.slot[kV] = select_packed(packed_view, dim, 1, perm, b"v")
        fwd.slot[kQ] = to_core_axes(q_layout, perm, b"q")
        if packed_view.device_type != kDLCUDA:
            with nogil:
                validate_call(fwd)
        for i in range(4):
            out_shape[i] = q_layout.dims[i]
        out_shape[perm[3]] = fwd.slot[kV].dims[3]  # head_dim of v
        dense_strides_like(out_shape, q_layout.strides, 4, out_strides)
        out_tensor = allocate_strided(api, 4, out_shape, out_strides, packed_view.dtype, packed_view.device_id)
        out_layout = view_from_dltensor(out_tensor.dl_tensor, False, b"out", ExportQuirk.none)
        fwd.slot[kO] = to_core_axes(out_layout, perm, b"out")
        if with_lse:  # as every forward allocates it
            allocate_outputs(&fwd, outputs, bit(kLse))
        outputs.launch(prepared(fwd, options), st.handle)
        out = to_framework_object(api, out_tensor)
        out_tensor = NULL
        return out, outputs.take(kLse)
    finally:
        if out_tensor != NULL:
            out_tensor.deleter(out_tensor)


def _packed_backward_alloc(packed, int dim, to_logical, q, out, lse, grad_out, scale, causal,
                           causal_alignment, window=None, softcap=None, seqlens_q=None, seqlens_kv=None, sinks=None,
                           deterministic=False, bias=None, bint with_grad_bias=False, alibi_slopes=None,
                           dropout_p=0.0, rng_state=None):
    """Backward of the packed entry point: allocates one gradient buffer with packed's strides
    (dense in its axis order if packed is not dense) and, with a separate q, q's gradient (same
    rule); cuDNN writes dQ/dK/dV straight into their slices. `out` and `grad_out` are in layout
    axes. Returns (grad_packed, grad_q or None, grad_sinks or None, grad_bias or None: contiguous, of
    bias' shape, when `with_grad_bias`)."""
    cdef SdpaOptions options
    cdef CallOperands bwd
    cdef IntakeHold owned  # each consumed tensor's deleter runs when this returns
    cdef CallStream st
    cdef PreparedCall call
    cdef TensorView packed_view, q_layout, out_layout, grad_out_layout, grad_packed_view, grad_q_layout
    cdef DLManagedTensorVersioned* grad_packed_tensor = NULL
    cdef DLManagedTensorVersioned* grad_q_tensor = NULL
    cdef int perm[4]
    cdef int64_t strides[8]
    cdef uint64_t wanted
    bwd.op = GraphOp.backward
    parse_options(scale, causal, causal_alignment, window, softcap, deterministic, dropout_p, &options)
    parse_to_logical(to_logical, perm)
    cdef FrameworkOutputs outputs = framework_outputs(packed, False)
    cdef const DLPackExchangeAPI* api = outputs.api
    parse_stream(None, &st)
    try:
        intake(packed, b"packed", False, &st, &packed_view, &owned[kHeldPacked])
        check_packed(packed_view, dim, 3 if q is None else 2)
        intake_slots((seqlens_q, seqlens_kv, sinks, bias, alibi_slopes, rng_state), &PACKED_OPTIONS, &st, &bwd,
                     &owned)
        intake(out, b"out", False, &st, &out_layout, &owned[kHeldOut])
        intake(grad_out, b"grad_out", False, &st, &grad_out_layout, &owned[kHeldGradOut])
        intake(lse, b"lse", False, &st, &bwd.slot[kLse], &owned[kLse])
        if out_layout.ndim != 4 or grad_out_layout.ndim != 4:
            raise LayoutError("out and grad_out must have 4 axes in the packed buffer's layout")
        bwd.slot[kO] = to_core_axes(out_layout, perm, b"out")
        bwd.slot[kGradO] = to_core_axes(grad_out_layout, perm, b"grad_out")
        gradient_strides(packed_view, strides)
        grad_packed_tensor = allocate_strided(api, 5, packed_view.dims, strides, packed_view.dtype,
                                              packed_view.device_id)
        grad_packed_view = view_from_dltensor(grad_packed_tensor.dl_tensor, False, b"grad_packed", ExportQuirk.none)
        if q is None:
            bwd.slot[kQ] = select_packed(packed_view, dim, 0, perm, b"q")
            bwd.slot[kK] = select_packed(packed_view, dim, 1, perm, b"k")
            bwd.slot[kV] = select_packed(packed_view, dim, 2, perm, b"v")
            bwd.slot[kGradQ] = select_packed(grad_packed_view, dim, 0, perm, b"grad_q")
            bwd.slot[kGradK] = select_packed(grad_packed_view, dim, 1, perm, b"grad_k")
            bwd.slot[kGradV] = select_packed(grad_packed_view, dim, 2, perm, b"grad_v")
        else:
            intake(q, b"q", False, &st, &q_layout, &owned[kHeldQ])
            if q_layout.ndim != 4:
                raise LayoutError(f"q must have 4 axes in the packed buffer's layout; it has {q_layout.ndim}")
            bwd.slot[kQ] = to_core_axes(q_layout, perm, b"q")
            bwd.slot[kK] = select_packed(packed_view, dim, 0, perm, b"k")
            bwd.slot[kV] = select_packed(packed_view, dim, 1, perm, b"v")
            gradient_strides(q_layout, strides)
            grad_q_tensor = allocate_strided(api, 4, q_layout.dims, strides, q_layout.dtype, q_layout.device_id)
            grad_q_layout = view_from_dltensor(grad_q_tensor.dl_tensor, False, b"grad_q", ExportQuirk.none)
            bwd.slot[kGradQ] = to_core_axes(grad_q_layout, perm, b"grad_q")
            bwd.slot[kGradK] = select_packed(grad_packed_view, dim, 0, perm, b"grad_k")
            bwd.slot[kGradV] = select_packed(grad_packed_view, dim, 1, perm, b"grad_v")
        # The sinks' and the bias' gradients as every backward allocates them.
        wanted = gradients_wanted(&bwd, options, with_grad_bias) & (bit(kGradSinks) | bit(kGradBias))
        if wanted:
            allocate_outputs(&bwd, outputs, wanted)
        outputs.launch(prepared(bwd, options), st.handle)
        grad_packed = to_framework_object(api, grad_packed_tensor)
        grad_packed_tensor = NULL
        grad_q = None
        if grad_q_tensor != NULL:
            grad_q = to_framework_object(api, grad_q_tensor)
            grad_q_tensor = NULL
        return grad_packed, grad_q, outputs.take(kGradSinks), outputs.take(kGradBias)
    finally:
        if grad_packed_tensor != NULL:
            grad_packed_tensor.deleter(grad_packed_tensor)
        if grad_q_tensor != NULL:
            grad_q_tensor.deleter(grad_q_tensor)
