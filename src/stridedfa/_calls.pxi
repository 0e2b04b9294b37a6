# Included by _core.pyx: the one call path. Every entry point parses its options (_options.pxi),
# reads its tensors into the call's slots by name (_intake.pxi intake_slots), picks where its
# outputs come from (_allocators.pxi) and calls attend(): outputs allocated by the layout rule,
# validation, the graph (cached) and the launch, in C++ with the GIL released.


cdef ensure_libraries():
    if libraries_loaded():
        return
    from stridedfa import _loader
    libs = _loader.load()  # raises BackendError saying what was looked for
    cdef string cudart = libs.cudart.path.encode()
    set_libraries(<void*><uintptr_t>libs.cudnn.handle, cudart)


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


cdef inline uint64_t bit(int slot) noexcept:
    return (<uint64_t>1) << slot


cdef int allocate_outputs(CallOperands* call, Outputs outputs, uint64_t wanted) except -1:
    """The `wanted` outputs (a bit per slot) allocated through `outputs` by the layout rule
    (layout_rules.hpp output_layout) into the call's slots. Where the inputs cannot determine an
    output (a tensor of another rank, or not on a CUDA device) the validator names the problem
    before anything is allocated."""
    cdef OutputLayout layouts[8]
    cdef int slots[8]
    cdef int s, n = 0
    cdef bint derivable = True
    for s in range(kNumSlots):
        if (wanted >> s) & 1:
            layouts[n] = output_layout(call[0], s)
            slots[n] = s
            derivable = derivable and layouts[n].ndim > 0
            n += 1
    for s in (kQ, kK, kV):
        derivable = derivable and (not call.slot[s].present or call.slot[s].device_type == kDLCUDA)
    if not derivable:
        with nogil:
            validate_call(call[0])
        raise LayoutError("the inputs do not determine the outputs' shapes")
    return outputs.allocate(call, n, slots, layouts)


cdef int attend(CallOperands* call, const SdpaOptions& options, CallStream* st, Outputs outputs,
                uint64_t wanted) except -1:
    """The call, once its operands are read: the wanted outputs allocated, then validation, the
    graph (cached) and the launch."""
    if wanted:
        allocate_outputs(call, outputs, wanted)
    return outputs.launch(prepared(call[0], options), st.handle)


# cuDNN quirk sinks_grad_under_dropout, asked of the quirks table once (a test may lift it).
cdef bint SINKS_GRAD_UNDER_DROPOUT = quirk_applies_named(b"sinks_grad_under_dropout", 0)


cdef uint64_t gradients_wanted(const CallOperands* call, const SdpaOptions& options, bint with_grad_bias,
                               bint with_grad_sinks=True):
    """The gradients an allocating backward computes: dQ, dK, dV; the sinks' with sinks unless the
    caller has no use for it (a variable-length call's sinks are never trained), and not under
    dropout while cuDNN quirk sinks_grad_under_dropout applies; the bias' when asked for and the
    bias can have one (else the validator names the bias' problem)."""
    cdef uint64_t wanted = bit(kGradQ) | bit(kGradK) | bit(kGradV)
    cdef const TensorView* bias = &call.slot[kBias]
    if (with_grad_sinks and call.slot[kSinks].present
            and (options.dropout_p == 0 or not SINKS_GRAD_UNDER_DROPOUT)):
        wanted |= bit(kGradSinks)
    if with_grad_bias and bias.present and bias.device_type == kDLCUDA and 1 <= bias.ndim <= 4:
        wanted |= bit(kGradBias)
    return wanted


cdef Outputs caller_outputs(object workspace_allocator):
    cdef Outputs outputs = Outputs.__new__(Outputs)
    outputs.workspace_allocator = workspace_allocator
    return outputs


# The entry points' tensor arguments, named once (each tuple below passes them in this order).
cdef SlotList SDPA_FORWARD = slot_list("q k v out lse seqlens_q seqlens_kv sinks bias alibi_slopes rng_state "
                                       "cu_seqlens_q cu_seqlens_kv block_table")
cdef SlotList SDPA_BACKWARD = slot_list("q k v out grad_out lse grad_q grad_k grad_v seqlens_q seqlens_kv sinks "
                                        "grad_sinks bias grad_bias alibi_slopes rng_state cu_seqlens_q cu_seqlens_kv")
cdef SlotList FORWARD_INPUTS = slot_list("q k v seqlens_q seqlens_kv sinks bias alibi_slopes rng_state block_table "
                                         "cu_seqlens_q cu_seqlens_kv")
cdef SlotList BACKWARD_INPUTS = slot_list("q k v out lse grad_out seqlens_q seqlens_kv sinks bias alibi_slopes "
                                          "rng_state cu_seqlens_q cu_seqlens_kv")
cdef SlotList VARLEN_INPUTS = slot_list("q k v cu_seqlens_q cu_seqlens_kv sinks rng_state")


cdef int run(bint backward, tuple tensors, const SlotList* names, const SdpaOptions& options, object stream,
             object workspace_allocator) except -1:
    """A call into the caller's outputs."""
    cdef CallOperands call
    cdef IntakeHold owned  # each consumed tensor's deleter runs when this returns
    cdef CallStream st
    call.op = GraphOp.backward if backward else GraphOp.forward
    parse_stream(stream, &st)
    intake_slots(tensors, names, &st, &call, &owned)
    return attend(&call, options, &st, caller_outputs(workspace_allocator), 0)


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
    run(False, (q, k, v, out, lse, seqlens_q, seqlens_kv, sinks, bias, alibi_slopes, rng_state, cu_seqlens_q,
                cu_seqlens_kv, block_table), &SDPA_FORWARD, options, stream, None)


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
    tensors = (q, k, v, out, grad_out, lse, grad_q, grad_k, grad_v, seqlens_q, seqlens_kv, sinks, grad_sinks, bias,
               grad_bias, alibi_slopes, rng_state, cu_seqlens_q, cu_seqlens_kv)
    run(True, tensors, &SDPA_BACKWARD, options, stream, None)


def _forward(q, k, v, out, lse, scale, causal, causal_alignment, stream, workspace_allocator,
             window=None, softcap=None, seqlens_q=None, seqlens_kv=None, sinks=None, bias=None,
             alibi_slopes=None, dropout_p=0.0, rng_state=None, *, cu_seqlens_q=None, cu_seqlens_kv=None,
             max_seqlen_q=None, max_seqlen_kv=None, block_table=None):
    """sdpa_forward for framework adapters: ``workspace_allocator(nbytes, device) -> (pointer,
    owner)`` provides cuDNN's workspace from the framework's allocator on the call's stream."""
    cdef SdpaOptions options
    parse_options(scale, causal, causal_alignment, window, softcap, False, dropout_p, &options)
    parse_max_seqlen(max_seqlen_q, max_seqlen_kv, &options)
    run(False, (q, k, v, out, lse, seqlens_q, seqlens_kv, sinks, bias, alibi_slopes, rng_state, cu_seqlens_q,
                cu_seqlens_kv, block_table), &SDPA_FORWARD, options, stream, workspace_allocator)


def _backward(q, k, v, out, grad_out, lse, grad_q, grad_k, grad_v, scale, causal,
              causal_alignment, stream, workspace_allocator, window=None, softcap=None, seqlens_q=None,
              seqlens_kv=None, sinks=None, grad_sinks=None, deterministic=False, bias=None, grad_bias=None,
              alibi_slopes=None, dropout_p=0.0, rng_state=None, *, cu_seqlens_q=None, cu_seqlens_kv=None,
              max_seqlen_q=None, max_seqlen_kv=None):
    """sdpa_backward for framework adapters (see _forward)."""
    cdef SdpaOptions options
    parse_options(scale, causal, causal_alignment, window, softcap, deterministic, dropout_p, &options)
    parse_max_seqlen(max_seqlen_q, max_seqlen_kv, &options)
    tensors = (q, k, v, out, grad_out, lse, grad_q, grad_k, grad_v, seqlens_q, seqlens_kv, sinks, grad_sinks, bias,
               grad_bias, alibi_slopes, rng_state, cu_seqlens_q, cu_seqlens_kv)
    run(True, tensors, &SDPA_BACKWARD, options, stream, workspace_allocator)


# --- Calls that allocate their outputs ---------------------------------------------------------------

def _forward_alloc(q, k, v, scale, causal, causal_alignment, bint with_lse, bint together=False,
                   window=None, softcap=None, seqlens_q=None, seqlens_kv=None, sinks=None, bias=None,
                   alibi_slopes=None, dropout_p=0.0, rng_state=None, block_table=None, *, cu_seqlens_q=None,
                   cu_seqlens_kv=None, max_seqlen_q=None, max_seqlen_kv=None):
    """Forward with outputs allocated by q's framework (its tensors must offer the DLPack C
    exchange API, as torch >= 2.10 does), on its current stream, by the layout rule; with
    `together`, out and lse in one allocation (FrameworkOutputs). cuDNN's workspace comes from the
    same allocator. With a block_table, k and v are paged caches; with cu_seqlens, q, k and v are
    (tokens, heads, head_dim) sequences one after another (see sdpa_forward).
    Returns (out, lse or None) as the framework's tensors."""
    cdef SdpaOptions options
    cdef CallOperands call
    cdef IntakeHold owned  # each consumed tensor's deleter runs when this returns
    cdef CallStream st
    parse_options(scale, causal, causal_alignment, window, softcap, False, dropout_p, &options)
    parse_max_seqlen(max_seqlen_q, max_seqlen_kv, &options)
    cdef FrameworkOutputs outputs = framework_outputs(q, together)
    parse_stream(None, &st)
    intake_slots((q, k, v, seqlens_q, seqlens_kv, sinks, bias, alibi_slopes, rng_state, block_table, cu_seqlens_q,
                  cu_seqlens_kv), &FORWARD_INPUTS, &st, &call, &owned)
    attend(&call, options, &st, outputs, bit(kO) | (bit(kLse) if with_lse else 0))
    return outputs.take(kO), outputs.take(kLse)


def _backward_alloc(q, k, v, out, lse, grad_out, scale, causal, causal_alignment, make_readable,
                    bint together, window=None, softcap=None, seqlens_q=None, seqlens_kv=None, sinks=None,
                    deterministic=False, bias=None, bint with_grad_bias=False, alibi_slopes=None,
                    dropout_p=0.0, rng_state=None, *, cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None,
                    max_seqlen_kv=None, bint with_grad_sinks=True):
    """Backward with the gradients allocated by q's framework (DLPack C exchange API) on its current
    stream, by the layout rule (each gradient with its input's strides when the input is dense,
    else dense in its axis order); with `together` (eager autograd wanting all three, which then
    live alike as the .grad of three parameters), dQ, dK and dV in one allocation. grad_out is
    passed through make_readable (a copy) only when cuDNN cannot read it. Returns (grad_q, grad_k,
    grad_v, grad_sinks or None, grad_bias or None) as the framework's tensors (gradients_wanted
    says which are computed)."""
    cdef SdpaOptions options
    cdef CallOperands call
    cdef IntakeHold owned  # each consumed tensor's deleter runs when this returns
    cdef CallStream st
    call.op = GraphOp.backward
    parse_options(scale, causal, causal_alignment, window, softcap, deterministic, dropout_p, &options)
    parse_max_seqlen(max_seqlen_q, max_seqlen_kv, &options)
    cdef FrameworkOutputs outputs = framework_outputs(q, together)
    keep_alive = []
    parse_stream(None, &st)
    intake_slots((q, k, v, out, lse, grad_out, seqlens_q, seqlens_kv, sinks, bias, alibi_slopes, rng_state,
                  cu_seqlens_q, cu_seqlens_kv), &BACKWARD_INPUTS, &st, &call, &owned)
    make_readable_grad_out(&call, grad_out, make_readable, &st, &owned, keep_alive)
    attend(&call, options, &st, outputs, gradients_wanted(&call, options, with_grad_bias, with_grad_sinks))
    return (outputs.take(kGradQ), outputs.take(kGradK), outputs.take(kGradV), outputs.take(kGradSinks),
            outputs.take(kGradBias))


def _cupy_forward(q, k, v, scale, causal, causal_alignment, bint with_lse, stream, allocation, hooks,
                  window=None, softcap=None, seqlens_q=None, seqlens_kv=None, sinks=None, bias=None,
                  alibi_slopes=None, dropout_p=0.0, rng_state=None, block_table=None, cu_seqlens_q=None,
                  cu_seqlens_kv=None, max_seqlen_q=None, max_seqlen_kv=None):
    """stridedfa.cupy.attention (and its paged and variable-length calls) in one C call, outputs
    from CuPy's pool (CupyOutputs): returns (out, lse or None)."""
    cdef SdpaOptions options
    cdef CallOperands call
    cdef IntakeHold owned  # each consumed tensor's deleter runs when this returns
    cdef CallStream st
    parse_options(scale, causal, causal_alignment, window, softcap, False, dropout_p, &options)
    parse_max_seqlen(max_seqlen_q, max_seqlen_kv, &options)
    parse_stream(stream, &st)
    intake_slots((q, k, v, seqlens_q, seqlens_kv, sinks, bias, alibi_slopes, rng_state, block_table, cu_seqlens_q,
                  cu_seqlens_kv), &FORWARD_INPUTS, &st, &call, &owned)
    outputs = cupy_outputs(hooks, allocation, q.dtype)
    attend(&call, options, &st, outputs, bit(kO) | (bit(kLse) if with_lse else 0))
    return outputs.take(kO), outputs.take(kLse)


def _cupy_backward(q, k, v, out, lse, grad_out, scale, causal, causal_alignment, stream, allocation,
                   hooks, window=None, softcap=None, seqlens_q=None, seqlens_kv=None, sinks=None, deterministic=False,
                   bias=None, bint with_grad_bias=False, alibi_slopes=None, dropout_p=0.0, rng_state=None,
                   cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None, max_seqlen_kv=None,
                   bint with_grad_sinks=True):
    """stridedfa.cupy.attention_backward (and its variable-length call) in one C call: returns
    (grad_q, grad_k, grad_v, grad_sinks or None, grad_bias or None), as _backward_alloc computes
    them."""
    cdef SdpaOptions options
    cdef CallOperands call
    cdef IntakeHold owned  # each consumed tensor's deleter runs when this returns
    cdef CallStream st
    call.op = GraphOp.backward
    parse_options(scale, causal, causal_alignment, window, softcap, deterministic, dropout_p, &options)
    parse_max_seqlen(max_seqlen_q, max_seqlen_kv, &options)
    keep_alive = []
    parse_stream(stream, &st)
    intake_slots((q, k, v, out, lse, grad_out, seqlens_q, seqlens_kv, sinks, bias, alibi_slopes, rng_state,
                  cu_seqlens_q, cu_seqlens_kv), &BACKWARD_INPUTS, &st, &call, &owned)
    # A copy of an unreadable grad_out runs on the caller's stream, where grad_out was produced.
    make_readable_grad_out(&call, grad_out, hooks.contiguous, &st, &owned, keep_alive)
    outputs = cupy_outputs(hooks, allocation, q.dtype)
    attend(&call, options, &st, outputs, gradients_wanted(&call, options, with_grad_bias, with_grad_sinks))
    return (outputs.take(kGradQ), outputs.take(kGradK), outputs.take(kGradV), outputs.take(kGradSinks),
            outputs.take(kGradBias))


def _attention_generic(q, k, v, scale, causal, causal_alignment, return_lse, stream, window=None, softcap=None,
                       seqlens_q=None, seqlens_kv=None, sinks=None, bias=None, alibi_slopes=None, dropout_p=0.0,
                       rng_state=None):
    """stridedfa.attention for producers without an adapter: outputs are DeviceBuffers allocated on
    the call's stream (the explicit one, else the one intake settles on: the producer's current work
    stream where it exports the DLPack C exchange API, else the legacy default stream); each input
    is read once; cuDNN's workspace comes from the core's pool."""
    cdef SdpaOptions options
    cdef CallOperands call
    cdef IntakeHold owned  # each consumed tensor's deleter runs when this returns
    cdef CallStream st
    parse_options(scale, causal, causal_alignment, window, softcap, False, dropout_p, &options)
    parse_stream(stream, &st)
    intake_slots((q, k, v, seqlens_q, seqlens_kv, sinks, bias, alibi_slopes, rng_state, None, None, None),
                 &FORWARD_INPUTS, &st, &call, &owned)
    outputs = buffer_outputs(st.handle, stream if stream is not None and not isinstance(stream, int) else None)
    attend(&call, options, &st, outputs, bit(kO) | (bit(kLse) if return_lse else 0))
    return (outputs.take(kO), outputs.take(kLse)) if return_lse else outputs.take(kO)


def _varlen_generic(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, scale, causal,
                    causal_alignment, return_lse, stream, window=None, softcap=None, sinks=None, dropout_p=0.0,
                    rng_state=None):
    """stridedfa.varlen_attention for producers without an adapter: q (total_q, h_q, d_qk), k and v
    (total_kv, h_kv, d), int32 cu_seqlens (b + 1,); out (total_q, h_q, d_v) contiguous and lse
    (h_q, total_q) over token-major memory as DeviceBuffers on the call's stream (see
    _attention_generic)."""
    cdef SdpaOptions options
    cdef CallOperands call
    cdef IntakeHold owned  # each consumed tensor's deleter runs when this returns
    cdef CallStream st
    parse_options(scale, causal, causal_alignment, window, softcap, False, dropout_p, &options)
    parse_max_seqlen(max_seqlen_q, max_seqlen_kv, &options)
    parse_stream(stream, &st)
    intake_slots((q, k, v, cu_seqlens_q, cu_seqlens_kv, sinks, rng_state), &VARLEN_INPUTS, &st, &call, &owned)
    outputs = buffer_outputs(st.handle, stream if stream is not None and not isinstance(stream, int) else None)
    attend(&call, options, &st, outputs, bit(kO) | (bit(kLse) if return_lse else 0))
    return (outputs.take(kO), outputs.take(kLse)) if return_lse else outputs.take(kO)
