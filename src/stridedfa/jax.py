"""The JAX adapter: stridedfa attention as a JAX function that works eagerly, under ``jax.jit``,
``jax.grad`` and ``jax.vmap``.

Each call lowers to an XLA custom call (the typed XLA FFI) served by stridedfa's C++ core: the same
validation, the same process-wide cuDNN graph cache and the same execution path as
:func:`stridedfa.sdpa_forward` and :mod:`stridedfa.torch`. Outputs, the softmax statistics and
cuDNN's workspace are allocated by XLA; kernels run on XLA's stream. Input arrays are only read.

Importing this module imports JAX (``import stridedfa`` alone never does) and registers the custom
call targets for the CUDA platform.
"""

from __future__ import annotations

import functools
from typing import Any

from stridedfa import _core
from stridedfa._errors import LayoutError, UnsupportedError
from stridedfa._jax_paged import attention_with_kvcache, paged_attention
from stridedfa._jax_runtime import (
    _BACKWARD,
    _DTYPES,
    _FORWARD,
    _FORWARD_INFERENCE,
    _LAYOUTS,
    _WITH_ALIBI_SLOPES,
    _WITH_BIAS,
    _WITH_GRAD_BIAS,
    _WITH_GRAD_SINKS,
    _WITH_LENGTHS,
    _WITH_RNG_STATE,
    _WITH_SINKS,
    _check_devices,
    _ensure_runtime,
    _Options,
    _options,
    _rng_state,
    jax,
    jnp,
)
from stridedfa._jax_varlen import varlen_attention

__all__ = ["attention", "attention_with_kvcache", "paged_attention", "varlen_attention"]


def attention(q, k, v, *, layout: str = "bshd", scale: float | None = None, causal: bool = False,
              is_causal: bool | None = None, causal_alignment: str = "top_left", window=None,
              softcap: float | None = None, seqlens_q=None, seqlens_kv=None, sinks=None, bias=None,
              alibi_slopes=None, dropout_p: float = 0.0, dropout_key=None, deterministic: bool = False,
              return_lse: bool = False):
    """Scaled-dot-product attention with cuDNN's fused kernels, as a differentiable JAX function.

    ``softmax(scale * q @ k^T + bias + mask) @ v`` per batch and query head. Works eagerly, under
    ``jax.jit``, ``jax.grad`` / ``jax.vjp`` (reverse mode, through stridedfa's cuDNN backward) and
    ``jax.vmap`` (extra leading axes fold into the batch). Forward-mode differentiation
    (``jax.jvp``) is not available.

    Args:
        q: query, float16 or bfloat16 array on a CUDA device: (batch, s_q, h_q, d_qk) for
            ``layout="bshd"`` (the axis order of ``jax.nn.dot_product_attention``), or
            (batch, h_q, s_q, d_qk) for ``layout="bhsd"``.
        k: keys, (batch, s_kv, h_kv, d_qk) resp. (batch, h_kv, s_kv, d_qk); h_q must be a multiple
            of h_kv (grouped-query attention; MQA is h_kv = 1, no repeat needed).
        v: values, (batch, s_kv, h_kv, d_v) resp. (batch, h_kv, s_kv, d_v); same dtype as q and k.
        layout: the axis order of q, k, v and of the result: ``"bshd"`` or ``"bhsd"``.
        scale: score scale, a Python number (it is compiled into the call); ``1 / sqrt(d_qk)``
            when None.
        causal: mask keys after the query position. ``is_causal`` is accepted as JAX's name for it.
        causal_alignment: ``"top_left"`` (query i sees keys j <= i) or ``"bottom_right"``
            (query i sees keys j <= i + s_kv - s_q: the last query sees every key, as when decoding
            against a KV cache; with s_q > s_kv the first rows see no key and give 0).
        window: ``(left, right)`` sliding window in tokens (Python ints or None for unbounded; see
            :func:`stridedfa.sdpa_forward` for the exact rule and a picture).
        softcap: ``softcap * tanh(scores / softcap)`` before the mask, a Python number (None: no cap).
        seqlens_q, seqlens_kv: int32 (batch,) arrays of sequence lengths in a padded batch (traced
            values are fine: they are read on the device; one may be left out). What
            ``jax.nn.dot_product_attention`` calls ``query_seq_lengths`` / ``key_value_seq_lengths``.
        sinks: float32 (h_q,) attention-sink logits, differentiable (gpt-oss): an extra term per
            query head in each row's softmax denominator (see :func:`stridedfa.sdpa_forward`).
            Under ``jax.vmap`` the sinks must not be mapped (``in_axes=None``, or closed over: one
            set shared by every mapped call; mapped sinks are refused while tracing); the forward
            folds the mapped calls into one, the backward runs them one after another
            (``jax.lax.map``: each mapped call gets its own sinks' gradient, which ``jax.grad`` of
            a vmapped function sums).
        bias: additive score bias in q's dtype, differentiable (T5 / ALiBi-style positions, or a
            mask as 0 / -inf): ``S = softcap(scale * q @ k^T) + bias``, then the masks. Its axes
            are the logical (batch, h_q, s_q, s_kv) in either layout (what
            ``jax.nn.dot_product_attention`` takes), broadcast by NumPy rules: 1 to 4 axes, each the
            full extent or 1 (shared), e.g. (s_q, s_kv), (1, h_q, s_q, s_kv), (batch, 1, 1, s_kv).
            It is read as given (no broadcast copy); under ``jax.grad`` its cotangent has its shape
            and dtype (cuDNN sums over the shared axes), computed only when the bias is
            differentiated (a constant mask costs the backward nothing). Differentiating a bias
            shared along a seq axis (extent 1 there, e.g. (batch, 1, 1, s_kv)) is refused for now
            (``stridedfa.UnsupportedError`` while tracing): broadcast it to full seq axes first
            (``jnp.broadcast_to``), or ``jax.lax.stop_gradient`` a constant mask. Under ``jax.vmap``
            (mapped or not) it needs q's batch axis, (batch, h_q or 1, s_q or 1, s_kv) (e.g.
            ``jnp.broadcast_to``): a bias shared across the batch is refused when the call runs
            (while tracing in a call with ``sinks`` or ``alibi_slopes``).
            With a bottom-right ``window`` cuDNN takes it only where the band is a shifted top-left
            one (otherwise ``stridedfa UnsupportedError`` when the call runs).
        alibi_slopes: float32 (h_q,) array of ALiBi slopes (BLOOM, MPT; FlashAttention's
            ``alibi_slopes``): ``scores -= alibi_slopes[h] * |i + off - j|``, off the diagonal
            offset of ``causal_alignment`` (0 for ``"top_left"``, s_kv - s_q for
            ``"bottom_right"``: FlashAttention's definition); any slopes, with or without causal;
            not differentiable (their cotangent is zero). Traced values are fine (read on the
            device). Under ``jax.vmap`` the slopes must not be mapped (``in_axes=None``: one set
            shared by every mapped call; mapped slopes are refused while tracing). The core refuses
            (``stridedfa UnsupportedError`` when the call runs) ALiBi with ``"bottom_right"``
            alignment together with padding lengths, and a differentiated ``bias`` with ALiBi.
        dropout_p: attention dropout probability in [0, 1), a Python number (it is compiled into
            the call; pass ``dropout_p if training else 0.0``): each softmax weight is zeroed with
            this probability and the kept ones are scaled by ``1 / (1 - dropout_p)``, i.e.
            ``out = (softmax(S) * keep / (1 - dropout_p)) @ v``; ``lse`` (``return_lse``) is that of
            the undropped softmax. cuDNN draws the mask with its Philox generator; the backward
            regenerates the same mask from the forward's state (nothing is stored). Not supported
            (``stridedfa.UnsupportedError`` while tracing): a bottom-right causal mask or window
            together with padding lengths, the backward of a problem that is s_q = s_kv = 1
            after the mask (cuDNN refuses it, and only its generator knows which weights it dropped),
            and differentiating ``sinks`` (cuDNN 9.19 returns the sinks' gradient scaled by
            ``1 - dropout_p``; sinks that are not differentiated take part).
        dropout_key: with ``dropout_p > 0``, required: a ``jax.random`` key (``jax.random.key(seed)``
            or a legacy ``jax.random.PRNGKey(seed)``) that picks the mask, consumed as JAX keys are
            (split it for each step: the same key, shapes and options give the same mask, bit for
            bit). It becomes the Philox seed and offset, ``jax.random.bits(dropout_key, (4,),
            jnp.uint32)``, read on the device (traced keys are fine). Ignored with ``dropout_p=0``.
            Under ``jax.vmap`` the key must not be mapped (``in_axes=None``, or closed over; a mapped
            key is refused while tracing): the mapped calls fold into one cuDNN call, which draws
            from one state, so a key per example would need a call per example. The folded calls
            still get different masks (the mask depends on the position in the folded batch).
        deterministic: the backward uses cuDNN's deterministic algorithm (bitwise-reproducible
            gradients, slower).
        return_lse: also return the float32 log-sum-exp of each row, (batch, h_q, s_q) in either
            layout (-inf for rows that see no key); not differentiable.

    Returns:
        The attention output in ``layout``: (batch, s_q, h_q, d_v) for bshd, (batch, h_q, s_q, d_v)
        for bhsd, in q's dtype; with ``return_lse``, ``(out, lse)``.

    Raises:
        stridedfa.LayoutError: a dtype, rank, shape or alignment the kernels cannot read (raised
            while tracing, before anything is compiled or launched).
        stridedfa.UnsupportedError: a configuration stridedfa cannot run (raised while tracing).
            Configurations only cuDNN itself can refuse (e.g. a head dimension the GPU's kernels
            lack) fail when the computation runs, as a JAX runtime error whose message starts
            with ``stridedfa UnsupportedError:``.
        stridedfa.BackendError: cuDNN or the CUDA runtime cannot be loaded.
        ValueError / TypeError: an unknown ``layout`` or ``causal_alignment``, a bad ``scale`` or
            ``dropout_p``, ``dropout_p > 0`` without ``dropout_key``.

    Example::

        q = jax.random.normal(key, (2, 1024, 16, 128), jnp.bfloat16)      # (b, s, h, d)
        out = stridedfa.jax.attention(q, k, v, causal=True)               # (2, 1024, 16, 128)
        grads = jax.grad(lambda q, k, v: stridedfa.jax.attention(q, k, v).sum(), (0, 1, 2))(q, k, v)
    """
    if is_causal is not None:
        if causal and not is_causal:
            raise ValueError("causal=True and is_causal=False disagree; pass one of them")
        causal = bool(is_causal)
    padded = seqlens_q is not None or seqlens_kv is not None
    options = _options(layout, scale, causal, causal_alignment, window, deterministic, padded, softcap, dropout_p)
    if options.dropout_p > 0 and dropout_key is None:
        raise ValueError(f"dropout_key: dropout_p={options.dropout_p} needs a jax.random key that picks the mask, "
                         f"e.g. dropout_key=jax.random.key(0) (split it for each step)")
    q, k, v = (jnp.asarray(x) for x in (q, k, v))
    _check_devices(q, k, v)
    lengths: tuple[Any, ...] = ()
    if padded:
        lengths = _lengths(q, k, seqlens_q, seqlens_kv, layout)
    sink_args: tuple[Any, ...] = () if sinks is None else (jnp.asarray(sinks),)
    bias_args: tuple[Any, ...] = () if bias is None else (jnp.asarray(bias),)
    slopes_args: tuple[Any, ...] = () if alibi_slopes is None else (jnp.asarray(alibi_slopes),)
    rng_args: tuple[Any, ...] = (_rng_state(dropout_key),) if options.dropout_p > 0 else ()
    _check_problem(tuple(q.shape), tuple(k.shape), tuple(v.shape),
                   (str(q.dtype), str(k.dtype), str(v.dtype)), options,
                   _described(lengths), _described(sink_args), _described(bias_args), _described(slopes_args),
                   _described(rng_args))
    _ensure_runtime()
    if return_lse:
        out, lse = _attention_with_lse(q, k, v, lengths, sink_args, bias_args, slopes_args, rng_args, options)
        return out, lse
    return _attention(q, k, v, lengths, sink_args, bias_args, slopes_args, rng_args, options)


# --- Validation (at trace time: nothing is compiled or launched when it fails) -----------------

def _lengths(q, k, seqlens_q, seqlens_kv, layout):
    """Both padding lengths as arrays (the side left out: its full length; a constant XLA folds)."""
    b = q.shape[0]
    s_q, s_kv = (q.shape[1], k.shape[1]) if layout == "bshd" else (q.shape[2], k.shape[2])
    if seqlens_q is None:
        seqlens_q = jnp.full((b,), s_q, jnp.int32)
    if seqlens_kv is None:
        seqlens_kv = jnp.full((b,), s_kv, jnp.int32)
    return jnp.asarray(seqlens_q), jnp.asarray(seqlens_kv)


def _described(arrays) -> tuple[tuple[tuple[int, ...], str], ...]:
    """(shape, dtype name) of each array: what validation reads of an optional operand."""
    return tuple((tuple(x.shape), str(x.dtype)) for x in arrays)


def _axes(layout: str) -> str:
    return "(batch, seq, heads, head_dim)" if layout == "bshd" else "(batch, heads, seq, head_dim)"


def _logical(shape: tuple[int, ...], layout: str) -> tuple[int, int, int, int]:
    """(b, h, s, d) of a rank-4 array in `layout`."""
    b, x, y, d = shape
    return (b, y, x, d) if layout == "bshd" else (b, x, y, d)


@functools.lru_cache(maxsize=512)
def _check_problem(q_shape, k_shape, v_shape, dtypes, options: _Options, lengths=(), sinks=(), bias=(),
                   alibi_slopes=(), rng_state=()) -> None:
    """Everything about a call that can be known from shapes and dtypes, with messages in the
    caller's terms; then the core's own validation of the views the XLA handler will build.
    Cached: a successful check is a pure function of its arguments."""
    names = ("q", "k", "v")
    for name, shape in zip(names, (q_shape, k_shape, v_shape)):
        if len(shape) != 4:
            raise LayoutError(f"{name}: expected 4 axes {_axes(options.layout)} for layout "
                              f"{options.layout!r}, got shape {shape}")
    if bias and dtypes[0] in _DTYPES and bias[0][1] != dtypes[0]:
        raise LayoutError(f"bias: dtype {bias[0][1]} is not q's dtype {dtypes[0]}; a score bias has the attention "
                          f"dtype: pass bias.astype(q.dtype) (a boolean mask m becomes "
                          f"jnp.where(m, 0, -jnp.inf).astype(q.dtype))")
    out_shape = _out_shape(q_shape, v_shape[3])
    _core._validate_shapes(False, _LAYOUTS[options.layout],
                        (q_shape, k_shape, v_shape, out_shape, _lse_shape(q_shape, options.layout)),
                        dtypes + (dtypes[0], "float32"), lengths=lengths or None, sinks=sinks[0] if sinks else None,
                        bias=bias[0] if bias else None, alibi_slopes=alibi_slopes[0] if alibi_slopes else None,
                        rng_state=rng_state[0] if rng_state else None, **options.core_options())


# --- The differentiable function -----------------------------------------------------------------

def _out_shape(q_shape, d_v):
    return (*q_shape[:-1], d_v)


def _lse_shape(q_shape, layout):
    # float32 (batch..., h_q, s_q), row-major: what cuDNN's backward reads on every cuDNN version.
    b, h, s, _ = _logical(q_shape[-4:], layout)
    return (*q_shape[:-4], b, h, s)


def _optional_operands(lengths, sinks, bias, grad_bias=False, alibi_slopes=(), rng_state=(),
                       grad_sinks=False) -> int:
    """The handlers' `optional_operands` attribute for these optional operands."""
    return ((_WITH_LENGTHS if lengths else 0) | (_WITH_SINKS if sinks else 0) | (_WITH_BIAS if bias else 0)
            | (_WITH_GRAD_BIAS if grad_bias else 0) | (_WITH_ALIBI_SLOPES if alibi_slopes else 0)
            | (_WITH_RNG_STATE if rng_state else 0) | (_WITH_GRAD_SINKS if grad_sinks else 0))


def _custom_call(target: str, results, args, attributes, shared=None, validate=None, per_call: bool = False,
                 fold_needs: int | None = None):
    """The XLA custom call `target` on `args`, its results' shapes `results(args)` (a
    ShapeDtypeStruct or a tuple of them).

    Under jax.vmap (vmap_method "broadcast_all") every operand gets the mapped axes in front, those
    not mapped broadcast, and the handler folds them into the batch. `shared` ({operand index:
    name}: the sinks, the ALiBi slopes, dropout's state) names operands that stay as they are
    instead, one array shared by every mapped call (the handler reads one); those mapped -- one
    per mapped call -- are refused while tracing (_mapped_refusal). Such calls go through a
    custom_vmap rule, which sees which operands are mapped (also under jax.jit inside jax.vmap) and
    runs `validate(args)` on the batched operands first, so that what the folded batch breaks (a
    bias shared across the batch, a buffer beyond 4 GiB) is a typed error while tracing. With
    `per_call` (the backward with sinks, whose grad_sinks the handler sums over the whole folded
    batch, while each mapped call needs its own: jax.vmap of jax.grad) the mapped calls run one
    after another (jax.lax.map); with dropout the sinks' gradient is refused earlier, by the
    core's plan (_attention_bwd validates first).
    `fold_needs` (the backward with dropout: the forward's lse) names an operand that must be
    mapped for the folded call to draw what the forward drew: when it is not (the forward ran
    once, and only the cotangent is mapped: jax.jacrev, jax.vmap of a vjp), the mapped calls run one
    after another too, each on the forward's own problem, so each regenerates the forward's mask
    (folded, mapped call i would read the masks of batch rows i * b.., which no forward drew)."""
    def ffi(*args):
        return jax.ffi.ffi_call(target, results(args), vmap_method="broadcast_all")(*args, **attributes)

    if not shared:
        return ffi(*args)

    @jax.custom_batching.custom_vmap
    def call(*args):
        return ffi(*args)

    @call.def_vmap
    def _batched(axis_size, in_batched, *args):
        for i, name in shared.items():
            if in_batched[i]:
                raise UnsupportedError(_mapped_refusal(name))
        unfolded = fold_needs is not None and not in_batched[fold_needs]
        if per_call or unfolded:
            mapped = [i for i, batched in enumerate(in_batched) if batched]

            def one(xs):
                operands = list(args)
                for i, x in zip(mapped, xs):
                    operands[i] = x
                return call(*operands)

            outs = jax.lax.map(one, [args[i] for i in mapped])
        else:
            args = [x if batched or i in shared else jnp.broadcast_to(x, (axis_size, *x.shape))
                    for i, (x, batched) in enumerate(zip(args, in_batched))]
            if validate is not None:
                validate(args)
            outs = call(*args)
        return outs, jax.tree.map(lambda _: True, outs)

    return call(*args)


def _mapped_refusal(name: str) -> str:
    if name == "dropout_key":
        # One folded call reads one Philox state; a state per mapped call would take one call each.
        return ("dropout_key: mapped by jax.vmap (a key per mapped call) is not supported: the mapped calls fold "
                "into one cuDNN call, which draws its mask from one Philox state, so a key per example would need "
                "one call per example; pass one key unmapped (in_axes=None, or closed over): the folded calls "
                "still get different masks")
    return (f"{name}: mapped by jax.vmap (a set of {name} per mapped call) is not supported: the {name} are per "
            f"head, one (heads of q,) array shared by every mapped call; pass them unmapped (in_axes=None, or "
            f"closed over)")


def _shared(first: int, lengths, sinks, bias, alibi_slopes, rng_state=()) -> dict[int, str]:
    """{operand index: name} of the operands kept unmapped under jax.vmap (_custom_call): the
    per-head ones and dropout's state (named by the argument it comes from); `first` is the index
    of the first optional operand."""
    shared = {}
    if sinks:
        shared[first + len(lengths)] = "sinks"
    if alibi_slopes:
        shared[first + len(lengths) + len(sinks) + len(bias)] = "alibi_slopes"
    if rng_state:
        shared[first + len(lengths) + len(sinks) + len(bias) + len(alibi_slopes)] = "dropout_key"
    return shared


def _validator(backward: bool, options: _Options, first: int, lengths, sinks, bias, alibi_slopes,
               grad_bias: bool = False, rng_state=(), grad_sinks: bool = False):
    """validate(args) for _custom_call: the core's validation of the batched operands, whose
    leading axes the handler folds into the batch."""
    n_lengths, n_sinks, n_bias, n_slopes = len(lengths), len(sinks), len(bias), len(alibi_slopes)

    def validate(args):
        rest = args[first:]
        lengths = _described(rest[:n_lengths])
        sinks = _described(rest[n_lengths:n_lengths + n_sinks])
        bias = _described(rest[n_lengths + n_sinks:n_lengths + n_sinks + n_bias])
        slopes = _described(rest[n_lengths + n_sinks + n_bias:n_lengths + n_sinks + n_bias + n_slopes])
        rng = _described(rest[n_lengths + n_sinks + n_bias + n_slopes:])
        q, k, v = (tuple(x.shape) for x in args[:3])
        if backward:
            shapes = (*(tuple(x.shape) for x in args[:6]), q, k, v)
            dtypes = str(args[0].dtype)
        else:
            shapes = (q, k, v, _out_shape(q, v[-1]), _lse_shape(q, options.layout))
            dtypes = (*(str(x.dtype) for x in args[:3]), str(args[0].dtype), "float32")
        _core._validate_shapes(backward, _LAYOUTS[options.layout], shapes, dtypes, lengths=lengths or None,
                            sinks=sinks[0] if sinks else None, bias=bias[0] if bias else None,
                            alibi_slopes=slopes[0] if slopes else None, rng_state=rng[0] if rng else None,
                            **({"grad_bias": grad_bias, "grad_sinks": grad_sinks} if backward else {}),
                            **options.core_options())

    return validate


def _forward_call(q, k, v, lengths, sinks, options: _Options, with_lse: bool, bias=(), alibi_slopes=(),
                  rng_state=()):
    attributes = options.attributes(_optional_operands(lengths, sinks, bias, alibi_slopes=alibi_slopes,
                                                       rng_state=rng_state))
    layout = options.layout

    def results(args):
        q, v = args[0], args[2]
        out = jax.ShapeDtypeStruct(_out_shape(q.shape, v.shape[-1]), q.dtype)
        return (out, jax.ShapeDtypeStruct(_lse_shape(q.shape, layout), jnp.float32)) if with_lse else out

    args = (q, k, v, *lengths, *sinks, *bias, *alibi_slopes, *rng_state)
    shared = _shared(3, lengths, sinks, bias, alibi_slopes, rng_state)
    validate = _validator(False, options, 3, lengths, sinks, bias, alibi_slopes, rng_state=rng_state)
    if not with_lse:
        return _custom_call(_FORWARD_INFERENCE, results, args, attributes, shared, validate), None
    out, lse = _custom_call(_FORWARD, results, args, attributes, shared, validate)
    return out, lse


# `lengths` (0 or 2 int32 arrays), `sinks` (0 or 1 float32 array), `bias` (0 or 1 array of q's
# dtype), `alibi_slopes` (0 or 1 float32 array) and `rng_state` (0 or 1 uint32 (4,) array: dropout's
# Philox state, a residual so that the backward draws the forward's mask) follow q, k, v as
# operands; the lengths, the slopes and rng_state get no cotangent (None), the sinks and the bias
# their gradients. Under vmap_method "broadcast_all" jax.vmap puts its axes in front of every
# operand; q's, k's and v's fold into the batch, and so does a bias' (jax_ffi.hpp, scores_view);
# the sinks, the slopes and rng_state stay unmapped (_custom_call).
#
# symbolic_zeros: the forward rule learns which inputs are differentiated (CustomVJPPrimal), so
# that the backward computes grad_bias only for a bias that is (an undifferentiated bias, such as
# a constant mask, gets a None cotangent and costs cuDNN no dbias), and grad_sinks only for sinks
# that are (fixed sinks also run with dropout, under which cuDNN 9.19 gets the sinks' gradient
# wrong). The residuals say it by their structure: `bias_wanted` / `sinks_wanted` is the operand
# when its gradient is wanted, else ().
@functools.partial(jax.custom_vjp, nondiff_argnums=(8,))
def _attention(q, k, v, lengths, sinks, bias, alibi_slopes, rng_state, options: _Options):
    return _forward_call(q, k, v, lengths, sinks, options, with_lse=False, bias=bias, alibi_slopes=alibi_slopes,
                         rng_state=rng_state)[0]


def _forward_rule(q, k, v, lengths, sinks, bias, alibi_slopes, rng_state, options: _Options):
    """(out, lse), residuals: the forward of both differentiable functions."""
    bias_perturbed = bool(bias) and bias[0].perturbed
    sinks_perturbed = bool(sinks) and sinks[0].perturbed
    q, k, v, lengths, sinks, bias, alibi_slopes, rng_state = jax.custom_derivatives.custom_vjp_primal_tree_values(
        (q, k, v, lengths, sinks, bias, alibi_slopes, rng_state))
    # What the backward would refuse (a bias' gradient cuDNN does not compute, dropout where cuDNN's
    # backward cannot run, ...) is refused now, before the forward is traced.
    out_shape = _out_shape(tuple(q.shape), v.shape[-1])
    _validate_backward(q.shape, k.shape, v.shape, out_shape, _lse_shape(tuple(q.shape), options.layout), str(q.dtype),
                       options, lengths, sinks, sinks_perturbed, bias, bias_perturbed, alibi_slopes, rng_state)
    out, lse = _forward_call(q, k, v, lengths, sinks, options, with_lse=True, bias=bias, alibi_slopes=alibi_slopes,
                             rng_state=rng_state)
    return (out, lse), (q, k, v, lengths, sinks, sinks if sinks_perturbed else (), bias,
                        bias if bias_perturbed else (), alibi_slopes, rng_state, out, lse)


def _attention_fwd(q, k, v, lengths, sinks, bias, alibi_slopes, rng_state, options: _Options):
    (out, _), residuals = _forward_rule(q, k, v, lengths, sinks, bias, alibi_slopes, rng_state, options)
    return out, residuals


def _validate_backward(q_shape, k_shape, v_shape, out_shape, lse_shape, dtype: str, options: _Options, lengths, sinks,
                       grad_sinks, bias, grad_bias, alibi_slopes, rng_state) -> None:
    """The core's validation of the backward's views (the handler's), with its gradients of the
    sinks and the bias when wanted."""
    shapes = (q_shape, k_shape, v_shape, out_shape, lse_shape, out_shape, q_shape, k_shape, v_shape)
    _core._validate_shapes(True, _LAYOUTS[options.layout], tuple(map(tuple, shapes)), dtype,
                           lengths=_described(lengths) or None,
                           sinks=_described(sinks)[0] if sinks else None, grad_sinks=bool(grad_sinks),
                           bias=_described(bias)[0] if bias else None, grad_bias=bool(grad_bias),
                           alibi_slopes=_described(alibi_slopes)[0] if alibi_slopes else None,
                           rng_state=_described(rng_state)[0] if rng_state else None, **options.core_options())


def _attention_bwd(options: _Options, residuals, grad_out):
    q, k, v, lengths, sinks, sinks_wanted, bias, bias_wanted, alibi_slopes, rng_state, out, lse = residuals
    if isinstance(grad_out, jax.custom_derivatives.SymbolicZero):  # only lse was used (it has no gradient)
        grad_out = jnp.zeros(out.shape, out.dtype)
    grad_out = grad_out.astype(out.dtype)
    _validate_backward(q.shape, k.shape, v.shape, out.shape, lse.shape, str(q.dtype), options, lengths, sinks,
                       sinks_wanted, bias, bias_wanted, alibi_slopes, rng_state)
    attributes = options.attributes(_optional_operands(lengths, sinks, bias, grad_bias=bool(bias_wanted),
                                                       alibi_slopes=alibi_slopes, rng_state=rng_state,
                                                       grad_sinks=bool(sinks_wanted)))
    n_lengths, n_sinks, with_grad_bias = len(lengths), len(sinks), bool(bias_wanted)
    with_grad_sinks = bool(sinks_wanted)

    def results(args):  # the gradients of q, k, v, differentiated sinks and bias: their shapes
        q, k, v, rest = args[0], args[1], args[2], args[6 + n_lengths:]
        wanted = (*(rest[:n_sinks] if with_grad_sinks else ()),
                  *(rest[n_sinks:n_sinks + 1] if with_grad_bias else ()))
        return tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v, *wanted))

    args = (q, k, v, out, lse, grad_out, *lengths, *sinks, *bias, *alibi_slopes, *rng_state)
    shared = _shared(6, lengths, sinks, bias, alibi_slopes, rng_state)
    validate = _validator(True, options, 6, lengths, sinks, bias, alibi_slopes, grad_bias=with_grad_bias,
                          rng_state=rng_state, grad_sinks=with_grad_sinks)
    grad_q, grad_k, grad_v, *more = _custom_call(_BACKWARD, results, args, attributes, shared, validate,
                                                 per_call=with_grad_sinks, fold_needs=4 if rng_state else None)
    n_grad_sinks = len(sinks) if with_grad_sinks else 0
    grad_sinks = tuple(more[:n_grad_sinks]) if with_grad_sinks else tuple(None for _ in sinks)
    grad_bias = tuple(more[n_grad_sinks:]) if bias_wanted else tuple(None for _ in bias)
    return (grad_q, grad_k, grad_v, tuple(None for _ in lengths), grad_sinks, grad_bias,
            tuple(None for _ in alibi_slopes), tuple(None for _ in rng_state))


_attention.defvjp(_attention_fwd, _attention_bwd, symbolic_zeros=True)


# With the statistics returned too: the same forward (with lse) and backward; lse carries no
# gradient (a cotangent for it is ignored).
@functools.partial(jax.custom_vjp, nondiff_argnums=(8,))
def _attention_with_lse(q, k, v, lengths, sinks, bias, alibi_slopes, rng_state, options: _Options):
    return _forward_call(q, k, v, lengths, sinks, options, with_lse=True, bias=bias, alibi_slopes=alibi_slopes,
                         rng_state=rng_state)


def _attention_with_lse_bwd(options: _Options, residuals, cotangents):
    return _attention_bwd(options, residuals, cotangents[0])


_attention_with_lse.defvjp(_forward_rule, _attention_with_lse_bwd, symbolic_zeros=True)

