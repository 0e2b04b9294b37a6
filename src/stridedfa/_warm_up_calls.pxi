# Included by _core.pyx: graphs built before the calls that need them (stridedfa.warm_up), from
# shapes alone. The views are those of dense arrays in a layout (the XLA handler's, _jax_ffi.pxi):
# what JAX passes, and what torch and CuPy pass for contiguous tensors in that axis order.


def _warm_up_shapes(bint backward, int64_t layout, tuple shapes, dtype, int device, *, scale=None, causal=False,
                    causal_alignment="top_left", window=None, softcap=None, deterministic=False, lengths=None,
                    sinks=None, bias=None, grad_bias=False, alibi_slopes=None, dropout_p=0.0, rng_state=None,
                    cu_seqlens=None, max_seqlen_q=None, max_seqlen_kv=None, validate_only=False, key_only=False,
                    sm_version=90, cudnn_version=91900):
    """Validates the call these shapes describe (arguments as _jax_validate's, on `device`) and
    gets its graph into the graph cache -- loaded from the persisted plans, else built -- without
    launching anything. With ``validate_only``, only validates (no GPU needed); with ``key_only``,
    returns the graph-cache key it would use on a device of these facts (no GPU needed)."""
    cdef ForwardArgs fwd
    cdef BackwardArgs bwd
    cdef SdpaOptions options
    cdef TensorView* views[kNumSlots]
    cdef vector[int64_t] key
    cdef int sm = sm_version
    cdef int64_t cudnn = cudnn_version
    parse_options(scale, causal, causal_alignment, window, softcap, deterministic, dropout_p, &options)
    parse_max_seqlen(max_seqlen_q, max_seqlen_kv, &options)
    slot_views(backward, &fwd, &bwd, views)
    shape_views(backward, layout, shapes, dtype, device, views, lengths, cu_seqlens, None, sinks, sinks is not None,
                bias, grad_bias, alibi_slopes, rng_state)
    if validate_only:
        with nogil:
            validate_options(options, validate_backward(bwd) if backward else validate_forward(fwd))
        return None
    if key_only:
        with nogil:
            if backward:
                key = backward_graph_key(bwd, options, sm, cudnn)
            else:
                key = forward_graph_key(fwd, options, sm, cudnn)
        return tuple(key)
    if not libraries_loaded():
        with nogil:  # bad input is reported even where cuDNN is missing
            validate_backward(bwd) if backward else validate_forward(fwd)
        ensure_libraries()
    with nogil:
        prepare_backward(bwd, options) if backward else prepare_forward(fwd, options)
    return None


def _length_bucket(int64_t n):
    """The bucket a variable-length call's token or sequence count `n` is keyed by (ragged.hpp)."""
    return length_bucket(n)
