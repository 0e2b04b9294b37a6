# Included by _core.pyx: the packed entry point. q/k/v (or k/v) are slices of one buffer, read as
# views (layout_rules.hpp select_packed), and the backward writes dQ/dK/dV into one packed gradient
# buffer allocated by the buffer's framework (_allocators.pxi PackedOutputs). The views of q, k, v
# are cut here; the other operands are read, and the call made, as every call does (_calls.pxi
# attend).

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


cdef int cut_qkv(const TensorView& packed_view, int dim, const int* perm, object q, CallStream* st,
                 IntakeHold* owned, CallOperands* call) except -1:
    """The call's q, k and v slots in the core's axes: slices of the packed buffer, q read apart
    where it is given separately."""
    cdef TensorView q_layout
    if q is None:
        call.slot[kQ] = select_packed(packed_view, dim, 0, perm, b"q")
    else:
        intake(q, b"q", False, st, &q_layout, &owned[0][kHeldQ])
        if q_layout.ndim != 4:
            raise LayoutError(f"q must have 4 axes in the packed buffer's layout; it has {q_layout.ndim}")
        call.slot[kQ] = to_core_axes(q_layout, perm, b"q")
    call.slot[kK] = select_packed(packed_view, dim, 0 if q is not None else 1, perm, b"k")
    call.slot[kV] = select_packed(packed_view, dim, 1 if q is not None else 2, perm, b"v")
    return 0


def _packed_forward_alloc(packed, int dim, to_logical, q, scale, causal, causal_alignment,
                          bint with_lse, window=None, softcap=None, seqlens_q=None, seqlens_kv=None, sinks=None,
                          bias=None, alibi_slopes=None, dropout_p=0.0, rng_state=None):
    """Forward of the packed entry point, outputs allocated by packed's framework (PackedOutputs).
    `packed` holds q, k, v (or k, v with `q` given in the same layout) along `dim`; its other axes
    are in layout order, and `to_logical[i]` is the layout axis holding the core's axis i (b, h, s,
    d); a bias is in the core's (b, h, s_q, s_kv) axes. Returns (out in layout axes, dense in q's
    memory order; lse or None)."""
    cdef SdpaOptions options
    cdef CallOperands fwd
    cdef IntakeHold owned  # each consumed tensor's deleter runs when this returns
    cdef CallStream st
    cdef TensorView packed_view
    cdef int perm[4]
    parse_options(scale, causal, causal_alignment, window, softcap, False, dropout_p, &options)
    parse_to_logical(to_logical, perm)
    parse_stream(None, &st)
    intake(packed, b"packed", False, &st, &packed_view, &owned[kHeldPacked])
    check_packed(packed_view, dim, 3 if q is None else 2)
    intake_slots((seqlens_q, seqlens_kv, sinks, bias, alibi_slopes, rng_state), &PACKED_OPTIONS, &st, &fwd, &owned)
    cut_qkv(packed_view, dim, perm, q, &st, &owned, &fwd)
    outputs = packed_outputs(packed, packed_view, dim, perm, q is not None)
    attend(&fwd, options, &st, outputs, bit(kO) | (bit(kLse) if with_lse else 0))
    return outputs.take(kO), outputs.take(kLse)


def _packed_backward_alloc(packed, int dim, to_logical, q, out, lse, grad_out, scale, causal,
                           causal_alignment, window=None, softcap=None, seqlens_q=None, seqlens_kv=None, sinks=None,
                           deterministic=False, bias=None, bint with_grad_bias=False, alibi_slopes=None,
                           dropout_p=0.0, rng_state=None):
    """Backward of the packed entry point (PackedOutputs): one gradient buffer with packed's strides
    (dense in its axis order if packed is not dense) into whose slices cuDNN writes dQ/dK/dV, and,
    with a separate q, q's gradient in layout axes. `out` and `grad_out` are in layout axes.
    Returns (grad_packed, grad_q or None, grad_sinks or None, grad_bias or None: contiguous, of
    bias' shape, when `with_grad_bias`)."""
    cdef SdpaOptions options
    cdef CallOperands bwd
    cdef IntakeHold owned  # each consumed tensor's deleter runs when this returns
    cdef CallStream st
    cdef TensorView packed_view, out_layout, grad_out_layout
    cdef int perm[4]
    bwd.op = GraphOp.backward
    parse_options(scale, causal, causal_alignment, window, softcap, deterministic, dropout_p, &options)
    parse_to_logical(to_logical, perm)
    parse_stream(None, &st)
    intake(packed, b"packed", False, &st, &packed_view, &owned[kHeldPacked])
    check_packed(packed_view, dim, 3 if q is None else 2)
    intake_slots((seqlens_q, seqlens_kv, sinks, bias, alibi_slopes, rng_state), &PACKED_OPTIONS, &st, &bwd, &owned)
    intake(out, b"out", False, &st, &out_layout, &owned[kHeldOut])
    intake(grad_out, b"grad_out", False, &st, &grad_out_layout, &owned[kHeldGradOut])
    intake(lse, b"lse", False, &st, &bwd.slot[kLse], &owned[kLse])
    if out_layout.ndim != 4 or grad_out_layout.ndim != 4:
        raise LayoutError("out and grad_out must have 4 axes in the packed buffer's layout")
    bwd.slot[kO] = to_core_axes(out_layout, perm, b"out")
    bwd.slot[kGradO] = to_core_axes(grad_out_layout, perm, b"grad_out")
    cut_qkv(packed_view, dim, perm, q, &st, &owned, &bwd)
    outputs = packed_outputs(packed, packed_view, dim, perm, q is not None)
    attend(&bwd, options, &st, outputs, gradients_wanted(&bwd, options, with_grad_bias))
    return (outputs.take_grad_packed(), outputs.take(kGradQ) if q is not None else None, outputs.take(kGradSinks),
            outputs.take(kGradBias))
