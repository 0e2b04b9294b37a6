# Included by _core.pyx: hooks for tests and benchmarks, never called by the package itself. Each
# exposes one piece of the production path on its own (an allocation, a layout rule, the core's
# execute in a loop), so tests can pin it down without a GPU where possible.


def _allocate_like(like, shape, strides):
    """A tensor of `like`'s framework, dtype and device with exactly these shape and strides,
    allocated through the exchange API the way _forward_alloc allocates (a test hook: it runs on
    CPU tensors too)."""
    cdef TensorView view
    cdef IntakeHold owned  # each consumed tensor's deleter runs when this returns
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
    parse_stream(None, &st)
    intake(like, b"like", False, &st, &view, &owned[0])
    owned[0].release()  # only its layout is needed
    return to_framework_object(api, allocate_strided(api, n, c_shape, c_strides, view.dtype,
                                                     view.device_id, view.device_type))


def _output_strides(out_shape, like_strides):
    """The C rule for output strides (layout_rules.hpp), for the test that keeps it equal to
    stridedfa._layouts.output_strides."""
    cdef int64_t shape[8]
    cdef int64_t like[8]
    cdef int64_t strides[8]
    cdef int i, n = len(out_shape)
    if n > 8 or len(like_strides) != n:
        raise ValueError("at most 8 axes, and as many strides as extents")
    for i in range(n):
        shape[i] = out_shape[i]
        like[i] = like_strides[i]
    dense_strides_like(shape, like, n, strides)
    return tuple(strides[i] for i in range(n))


def _gradient_strides(shape, strides):
    """The C rule for gradient strides (layout_rules.hpp), for the test that keeps it equal to
    stridedfa._layouts.gradient_strides."""
    cdef TensorView view
    cdef int64_t out[8]
    cdef int i, n = len(shape)
    if n > 8 or len(strides) != n:
        raise ValueError("at most 8 axes, and as many strides as extents")
    view.ndim = n
    for i in range(n):
        view.dims[i] = shape[i]
        view.strides[i] = strides[i]
    gradient_strides(view, out)
    return tuple(out[i] for i in range(n))


cdef int intake_named(dict tensors, CallStream* st, CallOperands* call, IntakeHold* owned) except -1:
    """intake_slots for {operand name: tensor} (the hooks below: names chosen per call)."""
    cdef SlotList slots = slot_list(" ".join(tensors))
    return intake_slots(tuple(tensors.values()), &slots, st, call, owned)


def _execute_repeatedly(q, k, v, out, lse=None, *, int64_t repeats, scale=None, causal=False,
                        causal_alignment="top_left", stream=None):
    """sdpa_forward whose prepared call is executed `repeats` times back to back in C++, for the
    host-overhead benchmark's floor: per-call cost of the core's execute alone."""
    cdef SdpaOptions options
    parse_options(scale, causal, causal_alignment, None, None, False, 0.0, &options)
    cdef CallOperands operands
    cdef IntakeHold owned
    cdef CallStream st
    cdef PreparedCall call
    cdef int64_t i
    parse_stream(stream, &st)
    intake_named(dict(q=q, k=k, v=v, out=out, lse=lse), &st, &operands, &owned)
    call = prepared(operands, options)
    with nogil:
        for i in range(repeats):
            execute(call, st.handle, NULL)


cdef dict BUFFER_DTYPES = {"float16": (2, 16), "bfloat16": (4, 16), "float32": (2, 32)}


def _device_buffer(shape, strides, dtype, device=0, stream=0):
    """An uninitialised DeviceBuffer of this layout on `stream` (an int handle), for tests and
    debugging; a zero-size one allocates nothing, so it works without a GPU."""
    cdef DLDataType dt
    cdef int64_t c_shape[8]
    cdef int64_t c_strides[8]
    cdef int i
    if dtype not in BUFFER_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(BUFFER_DTYPES)}, got {dtype!r}")
    shape, strides = tuple(int(n) for n in shape), tuple(int(s) for s in strides)
    if len(shape) != len(strides) or not 0 < len(shape) <= 8:
        raise ValueError(f"shape {shape} and strides {strides} need 1 to 8 axes each")
    if any(n < 0 for n in shape) or any(s < 0 for s in strides):
        raise ValueError(f"shape {shape} and strides {strides} must be non-negative")
    dt.code, dt.bits = BUFFER_DTYPES[dtype]
    dt.lanes = 1
    for i in range(len(shape)):
        c_shape[i], c_strides[i] = shape[i], strides[i]
    return new_buffer(len(shape), c_shape, c_strides, dt, device, stream, None)


def _cupy_allocate_like_forward(q, v, bint with_lse, hooks):
    """The outputs stridedfa.cupy.attention would allocate for q and v (the same code), without a
    call: for the tests of the layout rule on machines without a GPU."""
    cdef CallOperands call
    cdef IntakeHold owned  # each consumed tensor's deleter runs when this returns
    cdef CallStream st
    parse_stream(0, &st)
    intake_named(dict(q=q, v=v), &st, &call, &owned)
    outputs = cupy_outputs(hooks, None, q.dtype)
    allocate_outputs(&call, outputs, bit(kO) | (bit(kLse) if with_lse else 0))
    return outputs.take(kO), outputs.take(kLse)


def _cupy_allocate_gradients(q, k, v, hooks):
    """The gradients stridedfa.cupy.attention_backward would allocate (see
    _cupy_allocate_like_forward)."""
    cdef CallOperands call
    cdef IntakeHold owned  # each consumed tensor's deleter runs when this returns
    cdef CallStream st
    call.op = GraphOp.backward
    parse_stream(0, &st)
    intake_named(dict(q=q, k=k, v=v), &st, &call, &owned)
    outputs = cupy_outputs(hooks, None, q.dtype)
    allocate_outputs(&call, outputs, bit(kGradQ) | bit(kGradK) | bit(kGradV))
    return outputs.take(kGradQ), outputs.take(kGradK), outputs.take(kGradV)


cdef dict forward_operands(q, k, v, out, lse, seqlens_q, seqlens_kv, sinks, bias, alibi_slopes, rng_state,
                           cu_seqlens_q, cu_seqlens_kv, block_table):
    return dict(q=q, k=k, v=v, out=out, lse=lse, seqlens_q=seqlens_q, seqlens_kv=seqlens_kv, sinks=sinks, bias=bias,
                alibi_slopes=alibi_slopes, rng_state=rng_state, cu_seqlens_q=cu_seqlens_q,
                cu_seqlens_kv=cu_seqlens_kv, block_table=block_table)


cdef dict validated(bint backward, dict tensors, SdpaOptions options, object stream):
    """Intake and validation of a call, nothing else: what validation established."""
    cdef CallOperands operands
    cdef IntakeHold owned
    cdef CallStream st
    cdef Problem problem
    operands.op = GraphOp.backward if backward else GraphOp.forward
    parse_stream(stream, &st)
    intake_named(tensors, &st, &operands, &owned)
    with nogil:
        problem = validate_call(operands)
        validate_options(options, problem)
    return problem_dict(problem)


cdef tuple graph_key(bint backward, dict tensors, SdpaOptions options, int sm_version, int64_t cudnn_version):
    """Intake, validation and the graph-cache key for these device facts."""
    cdef CallOperands operands
    cdef IntakeHold owned
    cdef CallStream st
    cdef vector[int64_t] key
    operands.op = GraphOp.backward if backward else GraphOp.forward
    parse_stream(None, &st)
    intake_named(tensors, &st, &operands, &owned)
    with nogil:
        key = call_graph_key(operands, options, sm_version, cudnn_version)
    return tuple(key)


def _validate_forward(q, k, v, out, lse=None, stream=None, *, seqlens_q=None, seqlens_kv=None, sinks=None,
                      bias=None, alibi_slopes=None, dropout_p=0.0, rng_state=None, scale=None, causal=False,
                      causal_alignment="top_left",
                      window=None, softcap=None, cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None,
                      max_seqlen_kv=None, block_table=None, **operands):
    """Intake and validation of a forward call, nothing else (for tests on machines without a GPU;
    the pointers are never dereferenced); `operands` are further tensors under the operand table's
    names. Returns what validation established, or raises."""
    cdef SdpaOptions options
    parse_options(scale, causal, causal_alignment, window, softcap, False, dropout_p, &options)
    parse_max_seqlen(max_seqlen_q, max_seqlen_kv, &options)
    tensors = forward_operands(q, k, v, out, lse, seqlens_q, seqlens_kv, sinks, bias, alibi_slopes, rng_state,
                               cu_seqlens_q, cu_seqlens_kv, block_table)
    tensors.update(operands)
    return validated(False, tensors, options, stream)


def _validate_backward(q, k, v, out, grad_out, lse, grad_q, grad_k, grad_v, stream=None, *,
                       seqlens_q=None, seqlens_kv=None, sinks=None, grad_sinks=None, bias=None, grad_bias=None,
                       alibi_slopes=None, dropout_p=0.0, rng_state=None,
                       scale=None, causal=False,
                       causal_alignment="top_left", window=None, softcap=None, deterministic=False,
                       cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None, max_seqlen_kv=None, **operands):
    """Intake and validation of a backward call, nothing else (see _validate_forward)."""
    cdef SdpaOptions options
    parse_options(scale, causal, causal_alignment, window, softcap, deterministic, dropout_p, &options)
    parse_max_seqlen(max_seqlen_q, max_seqlen_kv, &options)
    tensors = dict(q=q, k=k, v=v, out=out, grad_out=grad_out, lse=lse, grad_q=grad_q, grad_k=grad_k, grad_v=grad_v,
                   seqlens_q=seqlens_q, seqlens_kv=seqlens_kv, sinks=sinks, grad_sinks=grad_sinks, bias=bias,
                   grad_bias=grad_bias, alibi_slopes=alibi_slopes, rng_state=rng_state, cu_seqlens_q=cu_seqlens_q,
                   cu_seqlens_kv=cu_seqlens_kv)
    tensors.update(operands)
    return validated(True, tensors, options, stream)


def _forward_graph_key(q, k, v, out, lse=None, *, scale=None, causal=False, causal_alignment="top_left",
                       window=None, softcap=None, seqlens_q=None, seqlens_kv=None, sinks=None, bias=None,
                       alibi_slopes=None, dropout_p=0.0, rng_state=None, sm_version=90,
                       cudnn_version=91900, cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None,
                       max_seqlen_kv=None, block_table=None):
    """The graph-cache key a forward call would use on a device with these facts (validates
    first; needs no GPU). Calls with equal keys share one cuDNN graph; () when cuDNN has nothing
    to compute (every row masked)."""
    cdef SdpaOptions options
    parse_options(scale, causal, causal_alignment, window, softcap, False, dropout_p, &options)
    parse_max_seqlen(max_seqlen_q, max_seqlen_kv, &options)
    return graph_key(False, forward_operands(q, k, v, out, lse, seqlens_q, seqlens_kv, sinks, bias, alibi_slopes,
                                             rng_state, cu_seqlens_q, cu_seqlens_kv, block_table), options,
                     sm_version, cudnn_version)


def _backward_graph_key(q, k, v, out, grad_out, lse, grad_q, grad_k, grad_v, *, scale=None,
                        causal=False, causal_alignment="top_left", window=None, softcap=None, seqlens_q=None,
                        seqlens_kv=None, sinks=None, grad_sinks=None, bias=None, grad_bias=None,
                        alibi_slopes=None, dropout_p=0.0, rng_state=None,
                        deterministic=False, sm_version=90,
                        cudnn_version=91900, cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None,
                        max_seqlen_kv=None):
    """The graph-cache key of a backward call (see _forward_graph_key)."""
    cdef SdpaOptions options
    parse_options(scale, causal, causal_alignment, window, softcap, deterministic, dropout_p, &options)
    parse_max_seqlen(max_seqlen_q, max_seqlen_kv, &options)
    tensors = dict(q=q, k=k, v=v, out=out, grad_out=grad_out, lse=lse, grad_q=grad_q, grad_k=grad_k, grad_v=grad_v,
                   seqlens_q=seqlens_q, seqlens_kv=seqlens_kv, sinks=sinks, grad_sinks=grad_sinks, bias=bias,
                   grad_bias=grad_bias, alibi_slopes=alibi_slopes, rng_state=rng_state, cu_seqlens_q=cu_seqlens_q,
                   cu_seqlens_kv=cu_seqlens_kv)
    return graph_key(True, tensors, options, sm_version, cudnn_version)


# A plan store of its own directory per call (the process-wide one is plan_store(), configured from
# the environment): the file format, trust and eviction rules without cuDNN or a GPU.

def _plan_store_save(str directory, int64_t max_bytes, key, str context, bytes payload):
    """Saves `payload` under (key, context) in `directory`; returns (saved, that store's counters)."""
    cdef PlanStore* store = new PlanStore(directory.encode(), max_bytes)
    cdef vector[int64_t] c_key = key
    cdef vector[uint8_t] c_payload = payload
    cdef string c_context = context.encode()
    cdef cbool saved
    try:
        with nogil:
            saved = store.save(c_key, c_context, c_payload)
        return saved, store_info(store[0])
    finally:
        del store


def _plan_store_load(str directory, key, str context):
    """The payload stored under (key, context) in `directory`, or None; and that store's counters."""
    cdef PlanStore* store = new PlanStore(directory.encode(), 0)
    cdef vector[int64_t] c_key = key
    cdef string c_context = context.encode()
    cdef optional[vector[uint8_t]] payload
    try:
        with nogil:
            payload = store.load(c_key, c_context)
        data = None
        if payload.has_value():
            data = bytes(payload.value()) if payload.value().size() else b""
        return data, store_info(store[0])
    finally:
        del store


def _plan_store_clear(str directory):
    """Removes the plan files (and leftover temporary files) of `directory`; returns how many."""
    cdef PlanStore* store = new PlanStore(directory.encode(), 0)
    try:
        return store.clear()
    finally:
        del store


def _packed_allocate(packed, int dim, to_logical, q, bint backward):
    """What the packed entry points allocate (PackedOutputs by the layout rule) for these inputs,
    without a call and on any device (the strategy's test on machines without a GPU). Returns
    (out, None, None) or, for a backward, (None, grad_packed, grad_q or None), plus the data
    addresses and core-axis strides the call's out or gradient slots were given, by name."""
    cdef CallOperands call
    cdef IntakeHold owned  # each consumed tensor's deleter runs when this returns
    cdef CallStream st
    cdef TensorView packed_view
    cdef OutputLayout layouts[3]
    cdef int slots[3]
    cdef int perm[4]
    cdef int i, n
    parse_to_logical(to_logical, perm)
    parse_stream(None, &st)
    intake(packed, b"packed", False, &st, &packed_view, &owned[kHeldPacked])
    check_packed(packed_view, dim, 3 if q is None else 2)
    cut_qkv(packed_view, dim, perm, q, &st, &owned, &call)
    outputs = packed_outputs(packed, packed_view, dim, perm, q is not None)
    if backward:
        call.op = GraphOp.backward
        n = 3
        slots[0], slots[1], slots[2] = kGradQ, kGradK, kGradV
    else:
        n = 1
        slots[0] = kO
    for i in range(n):
        layouts[i] = output_layout(call, slots[i])
    outputs.allocate(&call, n, slots, layouts)
    given = {kOperands[slots[i]].name.decode(): (call.slot[slots[i]].data,
                                                 tuple(call.slot[slots[i]].strides[a] for a in range(4)))
             for i in range(n)}
    if backward:
        return None, outputs.take_grad_packed(), outputs.take(kGradQ) if q is not None else None, given
    return outputs.take(kO), None, None, given


def _output_layouts(dict inputs, str outputs, bint backward=False):
    """The layout rule (layout_rules.hpp output_layout) for the space-separated `outputs` of a call
    whose inputs are {operand name: DLPack tensor} (fake ones will do: nothing is read or run):
    {output name: (shape, strides)}, or None where the inputs do not determine it. For the tests
    of the rule's symbolic twin (_layouts.py)."""
    cdef CallOperands call
    cdef IntakeHold owned  # each consumed tensor's deleter runs when this returns
    cdef CallStream st
    cdef OutputLayout layout
    cdef SlotList wanted = slot_list(outputs)
    cdef int i
    call.op = GraphOp.backward if backward else GraphOp.forward
    parse_stream(0, &st)
    intake_named(inputs, &st, &call, &owned)
    result = {}
    for i in range(wanted.n):
        layout = output_layout(call, wanted.slot[i])
        result[kOperands[wanted.slot[i]].name.decode()] = (
            (tuple(layout.shape[a] for a in range(layout.ndim)), tuple(layout.strides[a] for a in range(layout.ndim)))
            if layout.ndim else None)
    return result
