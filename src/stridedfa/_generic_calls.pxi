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
    cdef ForwardArgs fwd
    cdef Owned owned[9]
    cdef CallStream st
    cdef PreparedCall call
    cdef int64_t shape[4]
    cdef int64_t strides[4]
    cdef int i
    parse_options(scale, causal, causal_alignment, window, softcap, False, dropout_p, &options)
    for i in range(9):
        owned[i].versioned = NULL
        owned[i].legacy = NULL
    parse_stream(stream, &st)
    try:
        intake(q, b"q", False, &st, &fwd.q, &owned[0])
        intake(k, b"k", False, &st, &fwd.k, &owned[1])
        intake(v, b"v", False, &st, &fwd.v, &owned[2])
        intake_lengths(seqlens_q, seqlens_kv, &st, &fwd.seqlens_q, &fwd.seqlens_kv, &owned[3])
        intake_optional(sinks, b"sinks", &st, &fwd.sinks, &owned[5])
        intake_optional(bias, b"bias", &st, &fwd.bias, &owned[6])
        intake_optional(alibi_slopes, b"alibi_slopes", &st, &fwd.alibi_slopes, &owned[7])
        intake_optional(rng_state, b"rng_state", &st, &fwd.rng_state, &owned[8])
        if fwd.q.ndim != 4 or fwd.v.ndim != 4:
            raise LayoutError(f"q and v must be 4-D (batch, heads, seq, head_dim); got {fwd.q.ndim}-D q and "
                              f"{fwd.v.ndim}-D v")
        if fwd.q.device_type != kDLCUDA:
            with nogil:  # the validator names the device problem
                validate_forward(fwd)
        shape[0], shape[1], shape[2], shape[3] = fwd.q.dims[0], fwd.q.dims[1], fwd.q.dims[2], fwd.v.dims[3]
        dense_strides_like(shape, fwd.q.strides, 4, strides)
        owner = stream if stream is not None and not isinstance(stream, int) else None
        out = new_buffer(4, shape, strides, fwd.q.dtype, fwd.q.device_id, st.handle, owner)
        view_of_buffer(out, b"out", &fwd.out)
        lse = None
        if return_lse:
            strides[2], strides[1], strides[0] = 1, shape[2], shape[1] * shape[2]  # packed (b, h, s)
            lse = new_buffer(3, shape, strides, float32_dtype(), fwd.q.device_id, st.handle, owner)
            view_of_buffer(lse, b"lse", &fwd.lse)
        call = prepared_forward(fwd, options)
        with nogil:
            execute(call, st.handle, NULL)
        return (out, lse) if return_lse else out
    finally:
        release(owned, 9)


def _varlen_generic(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, scale, causal,
                    causal_alignment, return_lse, stream, window=None, softcap=None, sinks=None, dropout_p=0.0,
                    rng_state=None):
    """stridedfa.varlen_attention for producers without an adapter: q (total_q, h_q, d_qk), k and v
    (total_kv, h_kv, d), int32 cu_seqlens (b + 1,); out (total_q, h_q, d_v) contiguous and lse
    (h_q, total_q) over token-major memory as DeviceBuffers on the call's stream (see
    _attention_generic)."""
    cdef SdpaOptions options
    cdef ForwardArgs fwd
    cdef Owned owned[7]
    cdef CallStream st
    cdef PreparedCall call
    cdef int64_t shape[3]
    cdef int64_t strides[3]
    cdef int i
    parse_options(scale, causal, causal_alignment, window, softcap, False, dropout_p, &options)
    parse_max_seqlen(max_seqlen_q, max_seqlen_kv, &options)
    for i in range(7):
        owned[i].versioned = NULL
        owned[i].legacy = NULL
    parse_stream(stream, &st)
    try:
        intake(q, b"q", False, &st, &fwd.q, &owned[0])
        intake(k, b"k", False, &st, &fwd.k, &owned[1])
        intake(v, b"v", False, &st, &fwd.v, &owned[2])
        intake(cu_seqlens_q, b"cu_seqlens_q", False, &st, &fwd.cu_seqlens_q, &owned[3])
        intake(cu_seqlens_kv, b"cu_seqlens_kv", False, &st, &fwd.cu_seqlens_kv, &owned[4])
        intake_optional(sinks, b"sinks", &st, &fwd.sinks, &owned[5])
        intake_optional(rng_state, b"rng_state", &st, &fwd.rng_state, &owned[6])
        if fwd.q.ndim != 3 or fwd.v.ndim != 3:
            raise LayoutError(f"q and v must be 3-D (tokens, heads, head_dim); got {fwd.q.ndim}-D q and "
                              f"{fwd.v.ndim}-D v")
        if fwd.q.device_type != kDLCUDA:
            with nogil:  # the validator names the device problem
                validate_forward(fwd)
        shape[0], shape[1], shape[2] = fwd.q.dims[0], fwd.q.dims[1], fwd.v.dims[2]
        strides[0], strides[1], strides[2] = shape[1] * shape[2], shape[2], 1
        owner = stream if stream is not None and not isinstance(stream, int) else None
        out = new_buffer(3, shape, strides, fwd.q.dtype, fwd.q.device_id, st.handle, owner)
        view_of_buffer(out, b"out", &fwd.out)
        lse = None
        if return_lse:  # (h_q, total_q) over (total_q, h_q) memory
            shape[0], shape[1] = fwd.q.dims[1], fwd.q.dims[0]
            strides[0], strides[1] = 1, fwd.q.dims[1]
            lse = new_buffer(2, shape, strides, float32_dtype(), fwd.q.device_id, st.handle, owner)
            view_of_buffer(lse, b"lse", &fwd.lse)
        call = prepared_forward(fwd, options)
        with nogil:
            execute(call, st.handle, NULL)
        return (out, lse) if return_lse else out
    finally:
        release(owned, 7)
