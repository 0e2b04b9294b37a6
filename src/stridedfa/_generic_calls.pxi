# Included by _core.pyx: the framework-free attention path (stridedfa.attention for producers
# without an adapter): any DLPack inputs, outputs as stridedfa-owned DeviceBuffers (_buffer.pxi).


def _attention_generic(q, k, v, scale, causal, causal_alignment, return_lse, stream, window=None, softcap=None,
                       seqlens_q=None, seqlens_kv=None, sinks=None, bias=None, alibi_slopes=None, dropout_p=0.0,
                       rng_state=None):
    """stridedfa.attention for producers without an adapter: outputs are DeviceBuffers allocated on
    the call's stream (the explicit one, else the one intake settles on: the producer's current work
    stream where it exports the DLPack C exchange API, else the legacy default stream); each input
    is read once; cuDNN's workspace comes from the core's pool."""
    cdef SdpaOptions options
    cdef CallOperands fwd
    cdef IntakeHold owned  # each consumed tensor's deleter runs when this returns
    cdef CallStream st
    cdef PreparedCall call
    cdef int64_t shape[4]
    cdef int64_t strides[4]
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
    if fwd.slot[kQ].ndim != 4 or fwd.slot[kV].ndim != 4:
        raise LayoutError(f"q and v must be 4-D (batch, heads, seq, head_dim); got {fwd.slot[kQ].ndim}-D q and "
                          f"{fwd.slot[kV].ndim}-D v")
    if fwd.slot[kQ].device_type != kDLCUDA:
        with nogil:  # the validator names the device problem
            validate_call(fwd)
    shape[0], shape[1], shape[2] = fwd.slot[kQ].dims[0], fwd.slot[kQ].dims[1], fwd.slot[kQ].dims[2]
    shape[3] = fwd.slot[kV].dims[3]
    dense_strides_like(shape, fwd.slot[kQ].strides, 4, strides)
    owner = stream if stream is not None and not isinstance(stream, int) else None
    out = new_buffer(4, shape, strides, fwd.slot[kQ].dtype, fwd.slot[kQ].device_id, st.handle, owner)
    view_of_buffer(out, b"out", &fwd.slot[kO])
    lse = None
    if return_lse:
        strides[2], strides[1], strides[0] = 1, shape[2], shape[1] * shape[2]  # packed (b, h, s)
        lse = new_buffer(3, shape, strides, float32_dtype(), fwd.slot[kQ].device_id, st.handle, owner)
        view_of_buffer(lse, b"lse", &fwd.slot[kLse])
    call = prepared(fwd, options)
    with nogil:
        execute(call, st.handle, NULL)
    return (out, lse) if return_lse else out


def _varlen_generic(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, scale, causal,
                    causal_alignment, return_lse, stream, window=None, softcap=None, sinks=None, dropout_p=0.0,
                    rng_state=None):
    """stridedfa.varlen_attention for producers without an adapter: q (total_q, h_q, d_qk), k and v
    (total_kv, h_kv, d), int32 cu_seqlens (b + 1,); out (total_q, h_q, d_v) contiguous and lse
    (h_q, total_q) over token-major memory as DeviceBuffers on the call's stream (see
    _attention_generic)."""
    cdef SdpaOptions options
    cdef CallOperands fwd
    cdef IntakeHold owned  # each consumed tensor's deleter runs when this returns
    cdef CallStream st
    cdef PreparedCall call
    cdef int64_t shape[3]
    cdef int64_t strides[3]
    cdef int i
    parse_options(scale, causal, causal_alignment, window, softcap, False, dropout_p, &options)
    parse_max_seqlen(max_seqlen_q, max_seqlen_kv, &options)
    parse_stream(stream, &st)
    intake(q, b"q", False, &st, &fwd.slot[kQ], &owned[0])
    intake(k, b"k", False, &st, &fwd.slot[kK], &owned[1])
    intake(v, b"v", False, &st, &fwd.slot[kV], &owned[2])
    intake(cu_seqlens_q, b"cu_seqlens_q", False, &st, &fwd.slot[kCuSeqlensQ], &owned[3])
    intake(cu_seqlens_kv, b"cu_seqlens_kv", False, &st, &fwd.slot[kCuSeqlensKV], &owned[4])
    intake_optional(sinks, b"sinks", &st, &fwd.slot[kSinks], &owned[5])
    intake_optional(rng_state, b"rng_state", &st, &fwd.slot[kRngState], &owned[6])
    if fwd.slot[kQ].ndim != 3 or fwd.slot[kV].ndim != 3:
        raise LayoutError(f"q and v must be 3-D (tokens, heads, head_dim); got {fwd.slot[kQ].ndim}-D q and "
                          f"{fwd.slot[kV].ndim}-D v")
    if fwd.slot[kQ].device_type != kDLCUDA:
        with nogil:  # the validator names the device problem
            validate_call(fwd)
    shape[0], shape[1], shape[2] = fwd.slot[kQ].dims[0], fwd.slot[kQ].dims[1], fwd.slot[kV].dims[2]
    strides[0], strides[1], strides[2] = shape[1] * shape[2], shape[2], 1
    owner = stream if stream is not None and not isinstance(stream, int) else None
    out = new_buffer(3, shape, strides, fwd.slot[kQ].dtype, fwd.slot[kQ].device_id, st.handle, owner)
    view_of_buffer(out, b"out", &fwd.slot[kO])
    lse = None
    if return_lse:  # (h_q, total_q) over (total_q, h_q) memory
        shape[0], shape[1] = fwd.slot[kQ].dims[1], fwd.slot[kQ].dims[0]
        strides[0], strides[1] = 1, fwd.slot[kQ].dims[1]
        lse = new_buffer(2, shape, strides, float32_dtype(), fwd.slot[kQ].device_id, st.handle, owner)
        view_of_buffer(lse, b"lse", &fwd.slot[kLse])
    call = prepared(fwd, options)
    with nogil:
        execute(call, st.handle, NULL)
    return (out, lse) if return_lse else out
