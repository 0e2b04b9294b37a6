# Included by _core.pyx: the XLA FFI side of the boundary, for stridedfa.jax.
#
# The handlers themselves live in C++ (cpp/src/jax_ffi.cpp) and only need to be handed to JAX as
# PyCapsules. The helpers below build the handlers' own TensorViews from shapes (same functions, fake
# device addresses); _shape_calls.pxi runs the core's validator on them, so a JAX call is refused
# before anything is compiled or launched exactly when the handler would refuse it.

def _jax_optional_operands():
    """The handlers' ``optional_operands`` bits by operand, as the handlers read them (jax_ffi.hpp
    optional_bit: 1 << the operand's slot in the operand table); "lengths" and "cu_seqlens" name both
    of their pair. The one definition the JAX adapter reads."""
    cdef int s
    bit = {kOperands[s].name.decode(): 1 << s for s in range(kNumSlots)}
    return {"lengths": bit["seqlens_q"] | bit["seqlens_kv"], "sinks": bit["sinks"], "bias": bit["bias"],
            "grad_bias": bit["grad_bias"], "alibi_slopes": bit["alibi_slopes"], "rng_state": bit["rng_state"],
            "grad_sinks": bit["grad_sinks"], "cu_seqlens": bit["cu_seqlens_q"] | bit["cu_seqlens_kv"],
            "block_table": bit["block_table"]}


def _jax_ffi_targets():
    """``{target name: PyCapsule of its XLA_FFI_Handler}`` for ``jax.ffi.register_ffi_target``
    (platform "CUDA", typed FFI api_version 1)."""
    return {
        "stridedfa_sdpa_forward": PyCapsule_New(jax_forward_handler(), NULL, NULL),
        "stridedfa_sdpa_forward_inference": PyCapsule_New(jax_forward_inference_handler(), NULL, NULL),
        "stridedfa_sdpa_backward": PyCapsule_New(jax_backward_handler(), NULL, NULL),
    }


cdef DLDataType jax_dtype(str name, const char* operand=b"the operand") except *:
    cdef DLDataType t
    t.lanes = 1
    if name == "float16":
        t.code, t.bits = 2, 16   # kDLFloat
    elif name == "bfloat16":
        t.code, t.bits = 4, 16   # kDLBfloat
    elif name == "float32":
        t.code, t.bits = 2, 32
    elif name == "float64":
        t.code, t.bits = 2, 64
    elif name in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"):
        t.code, t.bits = (1 if name[0] == "u" else 0), int(name.lstrip("uint"))  # the core names the dtype
    else:
        raise LayoutError(f"{operand.decode()}: dtype {name} is not supported; attention operands must be "
                          f"float16 or bfloat16 (e.g. x.astype(jnp.bfloat16))")
    return t


cdef int jax_views(bint backward, int64_t layout, tuple shapes, object dtype, int device,
                   TensorView** views, object lengths=None, int first_length_slot=9,
                   bint same_lengths=False) except -1:
    """Fills the call's views (slot order) as the handler would, at distinct, 256-byte aligned
    fake addresses: the validator never dereferences them. `dtype`: the attention operands' dtype
    name, or one name per slot (so the validator sees each operand's own dtype)."""
    cdef int64_t dims[8]
    cdef int n = 9 if backward else 5
    cdef int i, j, rank
    cdef DLDataType data_type
    cdef DLDataType stats_type = jax_dtype("float32")
    cdef uintptr_t address = 0x100000000
    cdef int64_t nbytes
    if len(shapes) != n:
        raise ValueError(f"expected {n} shapes, got {len(shapes)}")
    for i in range(n):
        if shapes[i] is None:
            if i != 4 or backward:
                raise ValueError(f"{SLOT_NAMES[i].decode()}: a shape is required")
            continue  # a forward without statistics (the inference target)
        shape = tuple(shapes[i])
        rank = len(shape)
        if rank > 8:
            raise LayoutError(f"{SLOT_NAMES[i].decode()}: {rank} axes; stridedfa reads at most 8")
        data_type = jax_dtype(dtype if isinstance(dtype, str) else dtype[i], SLOT_NAMES[i])
        nbytes = 4 if i == 4 else data_type.bits // 8
        for j in range(rank):
            dims[j] = shape[j]
            nbytes *= shape[j]
        if i == 4 and layout == 2:  # a variable-length call's (tokens, heads) statistics
            views[i][0] = jax_thd_stats_view(SLOT_NAMES[i], dims, rank, stats_type, device, address)
        elif i == 4:
            views[i][0] = jax_stats_view(SLOT_NAMES[i], dims, rank, stats_type, device, address)
        else:
            views[i][0] = jax_array_view(SLOT_NAMES[i], dims, rank, <ArrayLayout>layout, data_type,
                                         device, address)
        address += (nbytes + 511) // 256 * 256
    if lengths is None:
        return 0
    return jax_length_views(lengths, first_length_slot, device, views, address, same_lengths)


cdef int jax_length_views(object lengths, int first, int device, TensorView** views, uintptr_t address,
                          bint same=False) except -1:
    """Two int32 vectors as the handler reads them, from (shape, dtype) pairs, into slots `first`
    and `first` + 1: the padding lengths (seqlens_q, seqlens_kv) or the cumulative starts
    (cu_seqlens_q, cu_seqlens_kv). With `same`, both are one tensor (one address), as a caller
    passing one lengths tensor for both sides gives them."""
    cdef int64_t dims[8]
    cdef int i, j, rank
    cdef int64_t nbytes
    cdef DLDataType data_type
    cdef uintptr_t first_address = address
    if len(lengths) != 2:
        raise ValueError(f"expected ({SLOT_NAMES[first].decode()}, {SLOT_NAMES[first + 1].decode()}) as "
                         f"(shape, dtype) pairs")
    for i in range(2):
        shape, name = lengths[i]
        shape = tuple(shape)
        rank = len(shape)
        if rank > 8:
            raise LayoutError(f"{SLOT_NAMES[first + i].decode()}: {rank} axes; stridedfa reads at most 8")
        nbytes = 4
        for j in range(rank):
            dims[j] = shape[j]
            nbytes *= shape[j]
        data_type = jax_lengths_dtype(name, SLOT_NAMES[first + i])
        views[first + i][0] = jax_lengths_view(SLOT_NAMES[first + i], dims, rank, data_type, device,
                                               first_address if same else address)
        address += (nbytes + 511) // 256 * 256
    return 0


cdef int jax_block_table_view_of(object block_table, int device, TensorView** views) except -1:
    """A paged call's block table as the handler reads it, from its (shape, dtype)."""
    cdef int64_t dims[8]
    cdef int j, rank
    shape, name = block_table
    shape = tuple(shape)
    rank = len(shape)
    if rank > 8:
        raise LayoutError(f"block_table: {rank} axes; stridedfa reads at most 8")
    for j in range(rank):
        dims[j] = shape[j]
    views[<int>kBlockTable][0] = jax_block_table_view(b"block_table", dims, rank,
                                                      jax_lengths_dtype(name, b"block_table"), device, 0x6800000000)
    return 0


cdef int jax_sink_views(bint backward, object sinks, bint grad_sinks, int device, TensorView** views) except -1:
    """The sinks (and in the backward, with `grad_sinks`, their gradient) as the handler reads them,
    from (shape, dtype)."""
    cdef int64_t dims[8]
    cdef int j, rank
    cdef uintptr_t address = 0x7000000000
    shape, name = sinks
    shape = tuple(shape)
    rank = len(shape)
    if rank > 8:
        raise LayoutError(f"sinks: {rank} axes; stridedfa reads at most 8")
    for j in range(rank):
        dims[j] = shape[j]
    views[11][0] = jax_per_head_view(b"sinks", dims, rank, jax_dtype(name, b"sinks"), device, address)
    if backward and grad_sinks:
        views[12][0] = jax_per_head_view(b"grad_sinks", dims, rank, jax_dtype(name, b"grad_sinks"), device,
                                         address + 0x100000)
    return 0


cdef int jax_bias_views(bint backward, object bias, bint grad_bias, int64_t mapped, int device,
                        TensorView** views) except -1:
    """The score bias (and in the backward, with `grad_bias`, its gradient of the same shape) as the
    handler reads them, from (shape, dtype); `mapped`: the axes jax.vmap put in front of q's four
    (and the bias' own). Needs q's view in views[0] (the bias folds its mapped axes into q's batch)."""
    cdef int64_t dims[8]
    cdef int j, rank
    cdef uintptr_t address = 0x7800000000
    shape, name = bias
    shape = tuple(shape)
    rank = len(shape)
    if rank > 8:
        raise LayoutError(f"bias: {rank} axes; stridedfa reads at most 8")
    for j in range(rank):
        dims[j] = shape[j]
    views[13][0] = jax_scores_view(b"bias", dims, rank, mapped, views[0].dims[0], jax_dtype(name, b"bias"), device,
                                   address)
    if backward and grad_bias:
        views[14][0] = jax_scores_view(b"grad_bias", dims, rank, mapped, views[0].dims[0],
                                       jax_dtype(name, b"grad_bias"), device, address + 0x4000000000)
    return 0


cdef int jax_alibi_views(object alibi_slopes, int device, TensorView** views) except -1:
    """The ALiBi slopes as the handler reads them, from (shape, dtype): an input of the forward and
    of the backward alike, without jax.vmap's axes (stridedfa.jax keeps them unmapped); they have
    no gradient."""
    cdef int64_t dims[8]
    cdef int j, rank
    cdef uintptr_t address = 0x7400000000
    shape, name = alibi_slopes
    shape = tuple(shape)
    rank = len(shape)
    if rank > 8:
        raise LayoutError(f"alibi_slopes: {rank} axes; stridedfa reads at most 8")
    for j in range(rank):
        dims[j] = shape[j]
    views[15][0] = jax_slopes_view(b"alibi_slopes", dims, rank, jax_dtype(name, b"alibi_slopes"), device, address)
    return 0


cdef int jax_rng_views(object rng_state, int device, TensorView** views) except -1:
    """Dropout's Philox state as the handler reads it, from (shape, dtype): a uint32 (4,) array
    (what stridedfa.jax passes) or an int64 (2,) one, as int64 (2,) either way; an input of the
    forward and of the backward alike, never mapped by jax.vmap, without a gradient."""
    cdef int64_t dims[8]
    cdef int j, rank
    cdef uintptr_t address = 0x7c00000000
    shape, name = rng_state
    shape = tuple(shape)
    rank = len(shape)
    if rank > 8:
        raise LayoutError(f"rng_state: {rank} axes; stridedfa reads at most 8")
    for j in range(rank):
        dims[j] = shape[j]
    views[16][0] = jax_rng_state_view(b"rng_state", dims, rank, jax_dtype(name, b"rng_state"), device, address)
    return 0


cdef DLDataType jax_lengths_dtype(str name, const char* operand) except *:
    cdef DLDataType t
    t.lanes = 1
    if name in ("int32", "int64", "uint32", "int16"):
        t.code, t.bits = (1 if name[0] == "u" else 0), int(name.lstrip("uint"))  # the core names the dtype
        return t
    raise LayoutError(f"{operand.decode()}: dtype {name} is not supported; sequence lengths, offsets and block ids "
                      f"are int32 (e.g. x.astype(jnp.int32))")
