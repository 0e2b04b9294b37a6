# Included by _core.pyx: calls described by shapes alone, on the views of dense arrays in a layout
# (the XLA handler's views, built by _jax_ffi.pxi's helpers) -- what JAX passes, and what torch and
# CuPy pass for contiguous tensors in that axis order. Three uses: JAX's trace-time validation, the
# torch adapter's check of a training step's backward before its forward, and stridedfa.warm_up.


cdef int shape_views(bint backward, int64_t layout, tuple shapes, object dtype, int device, TensorView** views,
                     lengths, cu_seqlens, block_table, sinks, grad_sinks, bias, grad_bias, alibi_slopes,
                     rng_state, bint shared_lengths=False) except -1:
    """Every view of a call on dense arrays of these shapes (see _validate_shapes), as the handler
    builds them, on `device`; with `shared_lengths` the two padding lengths are one tensor."""
    jax_views(backward, layout, shapes, dtype, device, views, lengths, 9, shared_lengths)
    if cu_seqlens is not None:
        jax_length_views(cu_seqlens, kCuSeqlensQ, device, views, 0x6000000000)
    if block_table is not None:
        if backward:
            raise UnsupportedError("a paged KV cache (block_table) has no backward: paged calls serve")
        jax_block_table_view_of(block_table, device, views)
    if sinks is not None:
        jax_sink_views(backward, sinks, grad_sinks, device, views)
    if bias is not None:
        jax_bias_views(backward, bias, grad_bias, len(shapes[0]) - 4, device, views)
    if alibi_slopes is not None:
        jax_alibi_views(alibi_slopes, device, views)
    if rng_state is not None:
        jax_rng_views(rng_state, device, views)
    return 0


def _validate_shapes(bint backward, int64_t layout, tuple shapes, dtype, *, scale=None, causal=False,
                     causal_alignment="top_left", window=None, softcap=None, deterministic=False, lengths=None,
                     sinks=None, grad_sinks=True, bias=None, grad_bias=True, alibi_slopes=None, dropout_p=0.0,
                     rng_state=None, cu_seqlens=None, max_seqlen_q=None, max_seqlen_kv=None, block_table=None,
                     shared_lengths=False):
    """Runs the core's validation on the views the XLA handler would build for arrays of these shapes (slot order:
    q, k, v, out, lse[, grad_out, grad_q, grad_k, grad_v]; a forward's lse may be None) in ``layout`` (0: bshd, 1:
    bhsd, 2: thd), padding ``lengths`` as ((shape, dtype) of seqlens_q, of seqlens_kv), a variable-length call's
    ``cu_seqlens`` likewise, a paged call's ``block_table``, ``sinks``, ``bias``, ``alibi_slopes`` and dropout's
    ``rng_state`` each as (shape, dtype) when given (a backward's grad_sinks, with ``grad_sinks``, of the sinks',
    its grad_bias, with ``grad_bias``, of the bias' shape; the slopes and rng_state have no gradient), and the
    options' rules (``dropout_p`` > 0 needs ``rng_state``) -- then plans the call and describes its graph as the
    handler would, so what the plan refuses (a bias' gradient cuDNN does not compute, a band it cannot shift, ...)
    is refused while tracing, not when XLA runs it. Needs no GPU. Returns what validation established, or raises
    LayoutError / UnsupportedError."""
    cdef CallOperands operands
    cdef Problem problem
    cdef SdpaOptions options
    cdef vector[int64_t] key
    cdef TensorView* views[kNumSlots]
    parse_options(scale, causal, causal_alignment, window, softcap, deterministic, dropout_p, &options)
    parse_max_seqlen(max_seqlen_q, max_seqlen_kv, &options)
    op_slots(backward, &operands, views)
    shape_views(backward, layout, shapes, dtype, 0, views, lengths, cu_seqlens, block_table, sinks, grad_sinks, bias,
                grad_bias, alibi_slopes, rng_state, shared_lengths)
    with nogil:
        problem = validate_call(operands)
        validate_options(options, problem)
        # cuDNN 9.26's rules for the statistics: JAX's lse is packed, which every version reads
        key = call_graph_key(operands, options, 90, 92600)
    return problem_dict(problem)


def _jax_graph_key(bint backward, int64_t layout, tuple shapes, str dtype, *, scale=None,
                   causal=False, causal_alignment="top_left", window=None, softcap=None, deterministic=False,
                   bias=None, grad_bias=True, alibi_slopes=None, dropout_p=0.0, rng_state=None, sm_version=90,
                   cudnn_version=91900):
    """The graph-cache key of the handler's call for these shapes on device 0 (see
    _forward_graph_key), with ``bias``, ``alibi_slopes`` and ``rng_state`` as (shape, dtype) when
    given (and a backward's grad_bias with ``grad_bias``): equal keys mean JAX and other callers
    share one cuDNN graph."""
    return _warm_up_shapes(backward, layout, shapes, dtype, 0, scale=scale, causal=causal,
                           causal_alignment=causal_alignment, window=window, softcap=softcap,
                           deterministic=deterministic, bias=bias, grad_bias=grad_bias, alibi_slopes=alibi_slopes,
                           dropout_p=dropout_p, rng_state=rng_state, key_only=True, sm_version=sm_version,
                           cudnn_version=cudnn_version)


def _warm_up_shapes(bint backward, int64_t layout, tuple shapes, dtype, int device, *, scale=None, causal=False,
                    causal_alignment="top_left", window=None, softcap=None, deterministic=False, lengths=None,
                    sinks=None, bias=None, grad_bias=False, alibi_slopes=None, dropout_p=0.0, rng_state=None,
                    grad_sinks=True, cu_seqlens=None, max_seqlen_q=None, max_seqlen_kv=None, shared_lengths=False,
                    key_only=False, sm_version=90, cudnn_version=91900):
    """Validates the call these shapes describe (arguments as _validate_shapes's, on `device`) and
    gets its graph into the graph cache -- loaded from the persisted plans, else built -- without
    launching anything. With ``key_only``, returns the graph-cache key it would use on a device of
    these facts instead (no GPU needed)."""
    cdef CallOperands operands
    cdef SdpaOptions options
    cdef TensorView* views[kNumSlots]
    cdef vector[int64_t] key
    cdef int sm = sm_version
    cdef int64_t cudnn = cudnn_version
    parse_options(scale, causal, causal_alignment, window, softcap, deterministic, dropout_p, &options)
    parse_max_seqlen(max_seqlen_q, max_seqlen_kv, &options)
    op_slots(backward, &operands, views)
    shape_views(backward, layout, shapes, dtype, device, views, lengths, cu_seqlens, None, sinks, grad_sinks, bias,
                grad_bias, alibi_slopes, rng_state, shared_lengths)
    if key_only:
        with nogil:
            key = call_graph_key(operands, options, sm, cudnn)
        return tuple(key)
    if not libraries_loaded():
        with nogil:  # bad input is reported even where cuDNN is missing
            validate_call(operands)
        ensure_libraries()
    with nogil:
        prepare_call(operands, options)
    return None


def _length_bucket(int64_t n):
    """The bucket a variable-length call's token or sequence count `n` is keyed by (ragged.hpp)."""
    return length_bucket(n)
