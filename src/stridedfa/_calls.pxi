# Included by _core.pyx: the call layer. Options parsed into one SdpaOptions, every operand read
# in slot order (the core's operand table, kOperands), then validation, the graph lookup and the
# launch in C++ with the GIL released; the public sdpa_forward / sdpa_backward and the variants
# adapters and tests use.

cdef const char* SLOT_NAMES[kNumSlots]  # the argument names, from the operand table
cdef int _slot
for _slot in range(<int>kNumSlots):
    SLOT_NAMES[_slot] = kOperands[_slot].name


cdef object role_name(Role role):
    return "input" if role == Role.input else "output" if role == Role.output else None


cdef tuple int_tuple(const int64_t* values, int n, int64_t factor):
    """(values[0] * factor, ...) without a generator (a generator costs a microsecond here)."""
    cdef list items = [None] * n
    cdef int i
    for i in range(n):
        items[i] = values[i] * factor
    return tuple(items)


_EXTENTS = ("batch", "h_q", "h_kv", "s_q", "s_kv", "d_qk", "d_v", 1, 2, "batch+1", "blocks")
KIND_NAMES = ("attention", "stats", "lengths", "per_head", "scores", "philox", "cumulative", "page_table", "fp8_scale")


def _operands():
    """The core's operand table (cpp/include/stridedfa/sdpa_types.hpp, kOperands) in slot order:
    one dict per operand with its name, its role in the forward and the backward (None, "input" or
    "output"), whether each op may leave it out, its kind ("attention", "stats", "lengths",
    "per_head", "scores", "philox", "cumulative", "page_table" or "fp8_scale") and the logical extents of its (b, h, s, d)
    axes. Intake, validation, the cache key and the graph builder all walk this table."""
    cdef int slot, n = kNumSlots
    cdef const OperandInfo* info
    rows = []
    for slot in range(n):
        info = &kOperands[slot]
        rows.append({"slot": slot, "name": info.name.decode(), "forward": role_name(info.forward),
                     "backward": role_name(info.backward), "forward_optional": info.forward_optional,
                     "backward_optional": info.backward_optional, "kind": KIND_NAMES[<int>info.kind],
                     "shape": tuple(_EXTENTS[info.shape[axis]] for axis in range(4))})
    return rows


cdef int64_t window_bound(object bound, const char* side) except -2:
    if bound is None:
        return -1  # SdpaOptions::kUnbounded
    # A Python or NumPy integer (JAX callers pass NumPy's); never a bool, whatever its kind.
    if isinstance(bound, bool) or type(bound).__name__ == "bool_" or not hasattr(type(bound), "__index__"):
        raise TypeError(f"window {side.decode()} bound must be an int >= 0 or None, got {bound!r}")
    bound = bound.__index__()
    if bound < 0:
        raise ValueError(f"window {side.decode()} bound must be >= 0 (None: unbounded; FlashAttention's -1 is "
                         f"None here), got {bound}")
    if bound >= 2**31 - 1:
        raise ValueError(f"window {side.decode()} bound must be below 2**31 - 1 tokens (None: unbounded), got {bound}")
    return bound


def _window_bounds(window):
    """The one parse of ``window=(left, right)`` (None sides unbounded): (left, right) as ints, -1
    for an unbounded side, or (-1, -1) for None. parse_options and the adapters (the torch
    operators' two ints, JAX's static options) all read it here."""
    if window is None:
        return -1, -1
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window must be None or a pair (left, right) of token counts (each an int "
                        f"or None), got {window!r}")
    return window_bound(window[0], b"left"), window_bound(window[1], b"right")


cdef int parse_options(object scale, object causal, object causal_alignment, object window,
                       object softcap, object deterministic, object dropout_p, SdpaOptions* options) except -1:
    """The one parse of a call's options (every entry point goes through it)."""
    if scale is None:
        options.has_scale = False
    else:
        if isinstance(scale, bool):
            raise TypeError("scale must be a number, got bool")
        options.has_scale = True
        options.scale = float(scale)
    options.causal = bool(causal)
    if causal_alignment == "top_left":
        options.alignment = CausalAlignment.top_left
    elif causal_alignment == "bottom_right":
        options.alignment = CausalAlignment.bottom_right
    else:
        raise ValueError(f"causal_alignment must be 'top_left' or 'bottom_right', got {causal_alignment!r}")
    options.window_left, options.window_right = _window_bounds(window)
    options.deterministic = bool(deterministic)
    if softcap is None:
        options.softcap = 0.0
    else:
        if isinstance(softcap, bool):
            raise TypeError("softcap must be a number or None, got bool")
        options.softcap = float(softcap)
        if not 1.1754943508222875e-38 <= options.softcap <= 3.4028234663852886e38:  # a float32 > 0
            raise ValueError(f"softcap must be a positive finite float32 (None: no cap), got {softcap!r}")
    if isinstance(dropout_p, bool) or dropout_p is None:
        raise TypeError(f"dropout_p must be a number in [0, 1), got {dropout_p!r}")
    options.dropout_p = float(dropout_p)
    if not 0.0 <= options.dropout_p < 1.0:
        raise ValueError(f"dropout_p must be a probability in [0, 1), got {dropout_p!r}")
    return 0


cdef void op_slots(bint backward, CallOperands* call, TensorView** views) noexcept:
    """Sets the call's op, and views[slot] to its operand of each slot the op has in the operand
    table (NULL where it has none)."""
    call.op = GraphOp.backward if backward else GraphOp.forward
    cdef int i
    cdef Role role
    for i in range(kNumSlots):
        role = kOperands[i].backward if backward else kOperands[i].forward
        views[i] = &call.slot[i]
        if role == Role.absent:
            views[i] = NULL


cdef ensure_libraries():
    if libraries_loaded():
        return
    from stridedfa import _loader
    libs = _loader.load()  # raises BackendError saying what was looked for
    cdef string cudart = libs.cudart.path.encode()
    set_libraries(<void*><uintptr_t>libs.cudnn.handle, cudart)


cdef dict problem_dict(Problem p):
    return {"b": p.b, "h_q": p.h_q, "h_kv": p.h_kv, "s_q": p.s_q, "s_kv": p.s_kv, "d_qk": p.d_qk,
            "d_v": p.d_v, "device": p.device, "dtype": dtype_name(p.dtype).decode(),
            "nothing_to_do": p.nothing_to_do, "sequences": p.sequences if p.ragged else None}


cdef tuple SLOT_KEYS = tuple(kOperands[_slot].name.decode() for _slot in range(<int>kNumSlots))
cdef object NOT_GIVEN = object()


cdef int intake_named(dict tensors, CallStream* st, CallOperands* call, IntakeHold* owned) except -1:
    """Reads `tensors` (operand name -> tensor, None where not given) into the call's slots of
    those names, walking the operand table; call.op says which operands the op has, and a name it
    has none of is a TypeError. owned[slot] holds what intake consumed."""
    cdef int i, named = 0
    cdef Role role
    for i in range(kNumSlots):
        obj = tensors.get(SLOT_KEYS[i], NOT_GIVEN)
        if obj is NOT_GIVEN:
            continue
        named += 1
        role = kOperands[i].backward if call.op == GraphOp.backward else kOperands[i].forward
        if obj is None:
            continue
        if role == Role.absent:
            raise TypeError(f"the {'backward' if call.op == GraphOp.backward else 'forward'} has no operand "
                            f"{SLOT_KEYS[i]}")
        intake(obj, kOperands[i].name, role == Role.output, st, &call.slot[i], &owned[0][i])
    if named != len(tensors):
        raise TypeError(f"no operand is called {sorted(set(tensors) - set(SLOT_KEYS))}; the operands are "
                        f"{', '.join(SLOT_KEYS)}")
    return 0


cdef object run(bint backward, dict tensors, SdpaOptions options, object stream, object workspace_allocator):
    """One call: intake of every tensor by name, validation, the graph (cached) and the launch.
    Consumed DLPack tensors are released on every path, exactly once."""
    cdef CallOperands operands
    cdef IntakeHold owned  # each consumed tensor's deleter runs when this returns
    cdef CallStream st
    cdef PreparedCall call
    cdef void* workspace = NULL
    cdef uintptr_t workspace_address
    operands.op = GraphOp.backward if backward else GraphOp.forward
    parse_stream(stream, &st)
    intake_named(tensors, &st, &operands, &owned)
    call = prepared(operands, options)
    owner = None  # the workspace's owner lives until the launch is queued
    if call.workspace_bytes > 0 and workspace_allocator is not None:
        workspace_address, owner = workspace_allocator(call.workspace_bytes, call.problem.device)
        workspace = <void*>workspace_address
    with nogil:
        execute(call, st.handle, workspace)


cdef PreparedCall prepared(const CallOperands& operands, const SdpaOptions& options) except *:
    """prepare_call, loading cuDNN on the first call (after validation, so bad input is reported
    even where cuDNN is missing)."""
    cdef PreparedCall call
    if not libraries_loaded():
        with nogil:
            validate_call(operands)
        ensure_libraries()
    with nogil:
        call = prepare_call(operands, options)
    return call


cdef int parse_max_seqlen(object max_seqlen_q, object max_seqlen_kv, SdpaOptions* options) except -1:
    """A variable-length call's promised longest sequences (None: bounded by the token count)."""
    cdef int side
    cdef int64_t values[2]
    for side, value in enumerate((max_seqlen_q, max_seqlen_kv)):
        if value is None:
            values[side] = 0
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            if hasattr(value, "__index__") and not isinstance(value, bool):
                value = value.__index__()
            else:
                raise TypeError(f"max_seqlen_{'q' if side == 0 else 'kv'} must be a Python int or None (a tensor "
                                f"would need a host synchronisation), got {type(value).__name__}")
        if value < 1 or value >= 2**31:
            raise ValueError(f"max_seqlen_{'q' if side == 0 else 'kv'} must be in [1, 2**31) or None, got {value}")
        values[side] = value
    options.max_seqlen_q, options.max_seqlen_kv = values[0], values[1]
    return 0


def sdpa_forward(q, k, v, out, *, lse=None, scale=None, causal=False, causal_alignment="top_left",
                 window=None, softcap=None, seqlens_q=None, seqlens_kv=None, sinks=None, bias=None, alibi_slopes=None,
                 dropout_p=0.0, rng_state=None, stream=None, cu_seqlens_q=None, cu_seqlens_kv=None,
                 max_seqlen_q=None, max_seqlen_kv=None, block_table=None):
    """Scaled-dot-product attention forward, written into ``out`` (and ``lse``) in place.

    ``out = softmax(scale * q @ k^T + mask) @ v`` for every batch and query head, computed by
    cuDNN's fused kernels from the tensors' real strides: views into packed buffers need no copy.

    Args:
        q: (batch, h_q, s_q, d_qk) query. Any DLPack tensor (torch, CuPy, JAX, ...) on a CUDA
            device, float16 or bfloat16. Logical axes are fixed; memory order is given by strides
            alone (a bshd tensor ``x`` is passed as ``x.transpose(1, 2)``).
        k: (batch, h_kv, s_kv, d_qk) keys; h_q must be a multiple of h_kv (GQA; MQA: h_kv = 1).
        v: (batch, h_kv, s_kv, d_v) values.
        out: (batch, h_q, s_q, d_v) output, written in place; any strides satisfying the rules below.
        lse: optional float32 (batch, h_q, s_q) (or with a trailing axis of 1) output receiving the
            natural-log log-sum-exp of each row of scaled, masked scores (what the backward needs).
        scale: score scale; ``1 / sqrt(d_qk)`` when None.
        causal: mask keys after the query position.
        causal_alignment: ``"top_left"``: query i sees keys j <= i. ``"bottom_right"``: query i sees
            keys j <= i + s_kv - s_q (the last query sees every key; for decoding with a KV cache).
            With s_q > s_kv the first s_q - s_kv rows see no key: they get out = 0, lse = -inf
            and zero gradients (FlashAttention's definition), computed without a copy::

                causal, s_q = 5, s_kv = 3 (x: seen)
                top_left     bottom_right
                  x . .        . . .   <- no key: out 0, lse -inf
                  x x .        . . .
                  x x x        x . .
                  x x x        x x .
                  x x x        x x x
        window: ``(left, right)`` sliding window in tokens, either side None for unbounded
            (FlashAttention's ``window_size``, with None for its -1): query i sees key j iff
            ``i + off - left <= j <= i + off + right``, where ``off`` is 0 for ``"top_left"`` and
            ``s_kv - s_q`` for ``"bottom_right"``. ``causal=True`` caps ``right`` at 0. Mistral's
            4096-token window is ``window=(4095, 0)`` or ``causal=True, window=(4095, None)``::

                top_left, causal, window=(2, None), s_q = s_kv = 5 (x: seen)
                    x . . . .
                    x x . . .
                    x x x . .
                    . x x x .
                    . . x x x

            Rows that see no key get out = 0, lse = -inf and zero gradients.
        softcap: cap the scores smoothly before the mask: ``softcap * tanh(scale * q @ k^T /
            softcap)`` (Gemma 2's logit soft-capping, FlashAttention's ``softcap``); None: no cap.
            With padding lengths, a row inside a sequence that sees no key (bottom-right with
            seqlens_q[b] > seqlens_kv[b]) is not defined with a softcap (not tested).
        seqlens_q, seqlens_kv: optional int32 (batch,) device tensors: the valid length of each
            sequence in a padded batch (one may be left out: full length on that side). Keys
            j >= seqlens_kv[b] are never read; with ``"bottom_right"`` the diagonal is aligned per
            sequence (off = seqlens_kv[b] - seqlens_q[b]). Padded query rows (i >= seqlens_q[b])
            get out = 0 and lse = -inf, padded positions zero gradients. Read on the device only
            (no host synchronisation: CUDA graphs and torch.compile see no data-dependent shapes).
        sinks: optional float32 (h_q,) attention-sink logits (gpt-oss): one extra term per query
            head in every row's softmax denominator, ``P[i, j] = exp(S[i, j]) / (exp(sinks[h]) +
            sum_j exp(S[i, j]))``, attending to nothing (out is not shifted); lse includes it.
        bias: optional additive score bias (T5-style relative positions, ALiBi, or any mask as 0 /
            -inf), q's dtype, broadcastable to (batch, h_q, s_q, s_kv) by NumPy rules -- fewer axes
            are leading 1s, and an axis of extent 1 (or stride 0) is shared, e.g. a key-padding
            bias (batch, 1, 1, s_kv). Added after the scale and the softcap, before the mask:
            ``S = softcap(scale * q @ k^T) + bias``. The key axis must be contiguous (stride 1) and
            the pointer 16-byte aligned; not with bottom-right alignment and padding lengths.
            A key that is -inf for every row of a query is masked; a row whose every key is -inf
            is undefined (as in torch's SDPA).
        alibi_slopes: optional float32 (h_q,) ALiBi slopes (BLOOM, MPT; FlashAttention's
            ``alibi_slopes``): ``S[i, j] -= alibi_slopes[h] * |i + off - j|`` after the softcap,
            ``off`` the alignment's diagonal offset (0 top-left; s_kv - s_q bottom-right, per
            sequence with padding lengths: FlashAttention's definition with ``"bottom_right"``).
            Any slopes, with or without causal. Not differentiable.
        dropout_p: attention dropout (torch SDPA's ``dropout_p``): each weight of the softmax is
            zeroed with probability ``dropout_p`` and the kept ones scaled by ``1 / (1 -
            dropout_p)``, ``out = (P * keep / (1 - dropout_p)) @ v``; lse is the statistics of the
            undropped softmax. The mask comes from cuDNN's Philox generator keyed by
            ``rng_state``: equal states, shapes and mask give equal masks, and the backward
            given the same state regenerates it. With a bottom-right mask, not with padding
            lengths; a bottom-right window with a bias then keeps every key.
        rng_state: int64 (2,) device tensor, the Philox seed and offset (FlashAttention's
            ``rng_state``); needed when ``dropout_p > 0``, read on the device only (under a CUDA
            graph each replay reads the values of that moment). stridedfa.torch draws it from
            torch's CUDA generator, stridedfa.jax from a key, stridedfa.cupy from CuPy's generator.
        cu_seqlens_q, cu_seqlens_kv: a variable-length (THD) call: int32 (b + 1,) device tensors,
            0 then each sequence's end; q, k, v, out are then (tokens, heads, head_dim) and lse
            (h_q, tokens_q), at any valid strides -- except that a backward needs q and grad_q
            dense (tokens, heads, head_dim), from which alone cuDNN 9.19 computes dQ right. Read
            on the device only, clamped into the buffers.
            Tokens in no sequence get out = 0, lse = -inf. No bias, ALiBi or padding lengths.
        max_seqlen_q, max_seqlen_kv: with cu_seqlens, optional Python ints: the longest sequence
            (a promise; a sequence longer than its bucket, at most 1.25x, is treated as empty).
            None bounds it by the token count.
        block_table: a paged KV cache: int32 (batch, blocks per sequence) ids of the blocks of k and
            v, which are then (num_blocks, h_kv, block_size, d) caches at any valid strides;
            ``seqlens_kv`` (each sequence's cached length) is required. Read on the device only,
            every id clamped into the cache. Forward only; no bias, ALiBi, sinks or dropout yet.
        stream: a ``cudaStream_t`` as an int, or any object with ``__cuda_stream__``. When None, q
            decides: the call runs on its producer's current stream where the DLPack C exchange
            API reports it (torch) and on CuPy's current stream for a CuPy array, else on the
            legacy default stream; producers on another stream are ordered before the call
            through ``__dlpack__(stream=...)``.

    Rules (checked before anything runs; a failure raises LayoutError naming the tensor, axis,
    value and fix, and writes nothing): one CUDA device; one dtype for q, k, v, out; head_dim
    stride 1; no negative or zero strides on axes with extent > 1; every pointer and every stride
    (in bytes) of such an axis a multiple of 16; out and lse writable and sharing no memory with
    each other or any input. Axes of extent 1 may carry any stride. Configurations cuDNN cannot run
    raise UnsupportedError with cuDNN's reason; a missing or failing cuDNN/CUDA raises BackendError.

    Example::

        qkv = torch.randn(2, 128, 3, 8, 64, device="cuda", dtype=torch.bfloat16)  # packed [b,s,3,h,d]
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))               # views, no copy
        out = torch.empty(2, 128, 8, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        stridedfa.sdpa_forward(q, k, v, out, causal=True)
    """
    cdef SdpaOptions options
    parse_options(scale, causal, causal_alignment, window, softcap, False, dropout_p, &options)
    parse_max_seqlen(max_seqlen_q, max_seqlen_kv, &options)
    run(False, dict(q=q, k=k, v=v, out=out, lse=lse, seqlens_q=seqlens_q, seqlens_kv=seqlens_kv, sinks=sinks,
                    bias=bias, alibi_slopes=alibi_slopes, rng_state=rng_state, cu_seqlens_q=cu_seqlens_q,
                    cu_seqlens_kv=cu_seqlens_kv, block_table=block_table), options, stream, None)


def sdpa_backward(q, k, v, out, grad_out, lse, grad_q, grad_k, grad_v, *, scale=None,
                  causal=False, causal_alignment="top_left", window=None, softcap=None, seqlens_q=None,
                  seqlens_kv=None, sinks=None, grad_sinks=None, bias=None, grad_bias=None, alibi_slopes=None,
                  dropout_p=0.0, rng_state=None, deterministic=False, stream=None, cu_seqlens_q=None,
                  cu_seqlens_kv=None, max_seqlen_q=None, max_seqlen_kv=None):
    """Gradients of :func:`sdpa_forward`, written into ``grad_q``, ``grad_k``, ``grad_v`` in place.

    Args:
        q, k, v, out: as in the forward call that produced ``out``.
        grad_out: (batch, h_q, s_q, d_v) gradient of the loss with respect to ``out``.
        lse: the float32 statistics written by the forward. cuDNN before 9.26 reads them as a packed
            (batch, h_q, s_q) array; other strides are rejected there with UnsupportedError.
        grad_q, grad_k, grad_v: outputs shaped like q, k, v, with any valid strides (e.g. the
            three slices of one packed gradient buffer). With GQA, grad_k and grad_v receive the sum
            over the query heads sharing each kv head.
        scale, causal, causal_alignment, window, softcap, seqlens_q, seqlens_kv, stream: as in
            :func:`sdpa_forward`; use the forward's values.
        sinks: the forward's sinks. grad_sinks: optional float32 (h_q,) output receiving their
            gradient, ``-sum over batch and rows of exp(sinks[h] - lse) * rowsum(grad_out * out)``.
            cuDNN sums it in an order that varies from call to call: equal to float rounding
            (~1e-6 relative), not bitwise, also with ``deterministic``.
        alibi_slopes: the forward's slopes.
        dropout_p, rng_state: the forward's: the same mask is regenerated on the device (not with
            s_q = s_kv = 1 after the mask, which cuDNN's backward refuses, nor with grad_sinks, which
            cuDNN 9.19 returns scaled by 1 - dropout_p; with grad_bias only where the mask cuts no
            key, since the backward cuts the keys the forward cut and cuDNN writes dbias packed).
        bias: the forward's bias. grad_bias: optional output of bias' shape receiving its gradient
            ``dS = P * (dP - rowsum(grad_out * out))`` summed over bias' shared batch and head axes
            (zero where a score is masked); q's dtype, contiguous. cuDNN 9.19 computes it only for a
            bias with a row per query, without softcap or ALiBi, and not where the mask leaves whole
            rows out (bottom-right with s_q > s_kv); those raise UnsupportedError before anything
            runs.
        deterministic: pick cuDNN's deterministic backward algorithm: bitwise-identical gradients
            from run to run (dK/dV are otherwise accumulated in an order that varies), at a cost in
            speed measured in benchmarks/.

    The same rules as the forward apply; the gradients must not overlap each other or any input.
    """
    cdef SdpaOptions options
    parse_options(scale, causal, causal_alignment, window, softcap, deterministic, dropout_p, &options)
    parse_max_seqlen(max_seqlen_q, max_seqlen_kv, &options)
    tensors = dict(q=q, k=k, v=v, out=out, grad_out=grad_out, lse=lse, grad_q=grad_q, grad_k=grad_k, grad_v=grad_v,
                   seqlens_q=seqlens_q, seqlens_kv=seqlens_kv, sinks=sinks, grad_sinks=grad_sinks, bias=bias,
                   grad_bias=grad_bias, alibi_slopes=alibi_slopes, rng_state=rng_state, cu_seqlens_q=cu_seqlens_q,
                   cu_seqlens_kv=cu_seqlens_kv)
    run(True, tensors, options, stream, None)


def _forward(q, k, v, out, lse, scale, causal, causal_alignment, stream, workspace_allocator,
             window=None, softcap=None, seqlens_q=None, seqlens_kv=None, sinks=None, bias=None,
             alibi_slopes=None, dropout_p=0.0, rng_state=None, *, cu_seqlens_q=None, cu_seqlens_kv=None,
             max_seqlen_q=None, max_seqlen_kv=None, block_table=None):
    """sdpa_forward for framework adapters: ``workspace_allocator(nbytes, device) -> (pointer,
    owner)`` provides cuDNN's workspace from the framework's allocator on the call's stream."""
    cdef SdpaOptions options
    parse_options(scale, causal, causal_alignment, window, softcap, False, dropout_p, &options)
    parse_max_seqlen(max_seqlen_q, max_seqlen_kv, &options)
    run(False, dict(q=q, k=k, v=v, out=out, lse=lse, seqlens_q=seqlens_q, seqlens_kv=seqlens_kv, sinks=sinks,
                    bias=bias, alibi_slopes=alibi_slopes, rng_state=rng_state, cu_seqlens_q=cu_seqlens_q,
                    cu_seqlens_kv=cu_seqlens_kv, block_table=block_table), options, stream, workspace_allocator)


def _backward(q, k, v, out, grad_out, lse, grad_q, grad_k, grad_v, scale, causal,
              causal_alignment, stream, workspace_allocator, window=None, softcap=None, seqlens_q=None,
              seqlens_kv=None, sinks=None, grad_sinks=None, deterministic=False, bias=None, grad_bias=None,
              alibi_slopes=None, dropout_p=0.0, rng_state=None, *, cu_seqlens_q=None, cu_seqlens_kv=None,
              max_seqlen_q=None, max_seqlen_kv=None):
    """sdpa_backward for framework adapters (see _forward)."""
    cdef SdpaOptions options
    parse_options(scale, causal, causal_alignment, window, softcap, deterministic, dropout_p, &options)
    parse_max_seqlen(max_seqlen_q, max_seqlen_kv, &options)
    tensors = dict(q=q, k=k, v=v, out=out, grad_out=grad_out, lse=lse, grad_q=grad_q, grad_k=grad_k, grad_v=grad_v,
                   seqlens_q=seqlens_q, seqlens_kv=seqlens_kv, sinks=sinks, grad_sinks=grad_sinks, bias=bias,
                   grad_bias=grad_bias, alibi_slopes=alibi_slopes, rng_state=rng_state, cu_seqlens_q=cu_seqlens_q,
                   cu_seqlens_kv=cu_seqlens_kv)
    run(True, tensors, options, stream, workspace_allocator)
