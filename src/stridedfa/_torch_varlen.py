"""stridedfa.torch's variable-length (THD) attention: its operators (torch.library, with fake
kernels and an autograd Function) and the entry points. Importing this module registers
torch.ops.stridedfa.varlen_forward and varlen_backward.

Sequences are packed along one token axis: q (total_q, h_q, d_qk), k (total_kv, h_kv, d_qk),
v (total_kv, h_kv, d_v), with int32 cu_seqlens (b + 1,) on the device saying where each starts.
The core reads cu_seqlens on the device only, so the operators have no data-dependent output
shape: torch.compile traces them without graph breaks and CUDA graphs replay them with whatever
cu_seqlens hold at replay.

Eager calls skip the dispatcher, as attention() does: with autograd they run the kernels through
the autograd Function directly. Defined through torch.library.custom_op with register_autograd,
a training step spent ~970 µs of host time here against 364 µs for attention() on the padded
batch (GPU run 41, .diag: the GPU waited for the host in a loop that synchronises per step).
"""

from __future__ import annotations

import torch

from stridedfa import _core, _layouts
from stridedfa._errors import UnsupportedError
from stridedfa._quirk_workarounds import VARLEN_BACKWARD_DENSE_QUERIES, varlen_backward_kv_heads
from stridedfa._torch_ops import (
    _HAS_EXCHANGE_API,
    _backward_kernel,
    _below_autograd,
    _bounds,
    _contiguous,
    _define,
    _draw_rng_state,
    _function_apply,
    _is_grad_enabled,
    _lib,
    _plain_eager,
    _raw,
    _readable,
    _requires_grad,
    _stream,
    _window,
    _workspace,
)
from stridedfa._torch_options import VarlenOptions, new_record, schema, tensor_positions


def _lse_like(q: torch.Tensor) -> torch.Tensor:
    """The statistics the layout rule allocates (_layouts.varlen_lse): the fakes' and torch < 2.10's."""
    shape, strides = _layouts.varlen_lse(q.shape)
    return torch.empty_strided(shape, strides, dtype=torch.float32, device=q.device)


def _out_like(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """out as the layout rule allocates it: contiguous (tokens, heads, d_v)."""
    return torch.empty((q.shape[0], q.shape[1], v.shape[2]), dtype=q.dtype, device=q.device)


def _cudnn_version() -> int:
    """The cuDNN this process runs (loaded on first use, as the first call would)."""
    _core._load_libraries()
    return _core._runtime_versions()["cudnn"]


def _max(value: int):
    return value if value > 0 else None


# Both operators take their options as one record after their tensors (VarlenOptions,
# _torch_options.py: read by name; its fields are the schema).
_OPTIONS = schema(VarlenOptions)
_TENSOR_OPTIONS = tensor_positions(VarlenOptions)  # sinks, rng_state


def _varlen_forward_impl(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, scale, causal,
                         causal_alignment, window_left, window_right, softcap, sinks, dropout_p, rng_state,
                         deterministic):
    """(out, lse) of a THD call."""
    window = _window(window_left, window_right)
    # Reading, allocating out and lse (the layout rule's) and launching in one C call; each output in
    # its own block (this is also the operator's kernel, which compiled graphs' CUDA graphs run).
    if _HAS_EXCHANGE_API:
        return _core._forward_alloc(q, k, v, scale, causal, causal_alignment, True, False, window, softcap, None, None,
                                    sinks, None, None, dropout_p, rng_state, cu_seqlens_q=cu_seqlens_q,
                                    cu_seqlens_kv=cu_seqlens_kv, max_seqlen_q=_max(max_seqlen_q),
                                    max_seqlen_kv=_max(max_seqlen_kv))
    out, lse = _out_like(q, v), _lse_like(q)
    _core._forward(_raw(q), _raw(k), _raw(v), out, lse, scale, causal, causal_alignment, _stream(q), _workspace,
                   window, softcap, None, None,
                   None if sinks is None else _raw(sinks), None, None, dropout_p, rng_state,
                   cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv, max_seqlen_q=_max(max_seqlen_q),
                   max_seqlen_kv=_max(max_seqlen_kv))
    return out, lse


def _dense_queries(q):
    """q as the variable-length backward can read it (cuDNN quirk varlen_backward_dense_queries:
    a dense copy of a q at other strides, while the quirk applies)."""
    return q.contiguous() if VARLEN_BACKWARD_DENSE_QUERIES else q


def _varlen_forward_fake(q, k, v, *args):
    return _out_like(q, v), _lse_like(q)


varlen_forward = _define("varlen_forward", f"(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_kv, "
                         f"{_OPTIONS}) -> (Tensor, Tensor)", _varlen_forward_impl, _varlen_forward_fake)


def _varlen_backward_impl(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv, *options):
    """(grad_q, grad_k, grad_v), token-major (tokens, heads, dim) whatever q, k, v's strides:
    cuDNN sums grouped heads only into token-major gradients, and its variable-length backward
    computes dQ right only from a dense q into a dense dQ (cuDNN quirk
    varlen_backward_dense_queries), so a q at other strides (a view of a qkv projection,
    head-major, ...) is copied for the backward."""
    if _HAS_EXCHANGE_API:  # reading, allocating the gradients (the layout rule's) and launching in one C call
        opts = VarlenOptions.of(options)
        return _core._backward_alloc(
            _dense_queries(q), k, v, out, lse, grad_out, opts.scale, opts.causal, opts.causal_alignment, _contiguous,
            False, _window(opts.window_left, opts.window_right), opts.softcap, None, None, opts.sinks,
            opts.deterministic, None, False, None, opts.dropout_p, opts.rng_state, cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_kv=cu_seqlens_kv, max_seqlen_q=_max(opts.max_seqlen_q),
            max_seqlen_kv=_max(opts.max_seqlen_kv), with_grad_sinks=False)[:3]  # sinks are never trained here
    grad_q, grad_k, grad_v = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    _varlen_backward_into(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv, grad_q, grad_k, grad_v, options)
    return grad_q, grad_k, grad_v


def _varlen_backward_into(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv, grad_q, grad_k, grad_v, options):
    """The varlen backward into the given gradient buffers (grad_q dense, grad_k and grad_v
    token-major: see _varlen_backward_impl)."""
    opts = VarlenOptions.of(options)
    _core._backward(_raw(_dense_queries(q)), _raw(k), _raw(v), _raw(out), _readable(grad_out), _raw(lse), grad_q,
                    grad_k, grad_v, opts.scale, opts.causal, opts.causal_alignment, _stream(q), _workspace,
                    _window(opts.window_left, opts.window_right), opts.softcap, None, None,
                    None if opts.sinks is None else _raw(opts.sinks), None, opts.deterministic, None, None, None,
                    opts.dropout_p, opts.rng_state, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
                    max_seqlen_q=_max(opts.max_seqlen_q), max_seqlen_kv=_max(opts.max_seqlen_kv))


def _varlen_backward_fake(grad_out, q, k, v, *args):
    return tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))


varlen_backward = _define(
    "varlen_backward", f"(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor cu_seqlens_q, "
    f"Tensor cu_seqlens_kv, {_OPTIONS}) -> (Tensor, Tensor, Tensor)", _varlen_backward_impl, _varlen_backward_fake)
# Its tensors: grad_out, q, k, v, out, lse, the cu_seqlens, sinks and rng_state.
_lib.impl("varlen_backward", _backward_kernel(varlen_backward, _varlen_backward_impl,
                                              (*range(8), *(8 + i for i in _TENSOR_OPTIONS))), "Autograd")


def _forward_tensors(q, k, v, cu_seqlens_q, cu_seqlens_kv, options):
    return (q, k, v, cu_seqlens_q, cu_seqlens_kv, *(options[i] for i in _TENSOR_OPTIONS))


class _VarlenFunction(torch.autograd.Function):
    """varlen_forward with a gradient to record: from the operator's Autograd kernel (eager False:
    compiled graphs, modes) or straight from varlen_attention (eager True: the kernels called
    directly). lse is not differentiable; sinks are never trainable here (refused before)."""

    @staticmethod
    def forward(ctx, eager, q, k, v, cu_seqlens_q, cu_seqlens_kv, *options):
        args = (q, k, v, cu_seqlens_q, cu_seqlens_kv, *options)
        out, lse = (_varlen_forward_impl(*args) if eager else
                    _below_autograd(varlen_forward, _varlen_forward_impl, args,
                                    _forward_tensors(q, k, v, cu_seqlens_q, cu_seqlens_kv, options)))
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv)
        ctx.options = options
        ctx.eager = eager
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # no zeros made for lse's (absent) gradient
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, _grad_lse):
        if grad_out is None:  # out took no part in what is differentiated
            return (None,) * (6 + len(ctx.options))
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv = ctx.saved_tensors
        args = (grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv, *ctx.options)
        if ctx.eager and not _is_grad_enabled():
            grads = _varlen_backward_impl(*args)
        else:  # create_graph=True: through the operator, which refuses a double backward
            grads = varlen_backward(*args)
        return (None, *grads, None, None) + (None,) * len(ctx.options)


def _varlen_forward_autograd(q, k, v, cu_seqlens_q, cu_seqlens_kv, *options):
    if _requires_grad(q, k, v):
        return _VarlenFunction.apply(False, q, k, v, cu_seqlens_q, cu_seqlens_kv, *options)
    return _below_autograd(varlen_forward, _varlen_forward_impl, (q, k, v, cu_seqlens_q, cu_seqlens_kv, *options),
                           _forward_tensors(q, k, v, cu_seqlens_q, cu_seqlens_kv, options))


_lib.impl("varlen_forward", _varlen_forward_autograd, "Autograd")
_eager_varlen = _function_apply.__get__(None, _VarlenFunction)  # autograd's C entry (see _torch_ops)


class _VarlenPackedFunction(torch.autograd.Function):
    """varlen_packed_attention on plain tensors in eager mode, with a gradient to record: q, k, v
    read as views of `packed` (q apart when given), and the backward writes dK and dV straight into
    one gradient buffer of packed's shape (token-major views, which cuDNN writes at any stride)
    and copies in only dQ, which cuDNN 9.19 writes right only dense. No per-tensor gradients
    stacked by autograd. Compiled graphs take the operators on views instead (same results)."""

    @staticmethod
    def forward(ctx, packed, dim, q, cu_seqlens_q, cu_seqlens_kv, *options):
        parts = packed.unbind(dim)
        q_view, k, v = (q, *parts) if q is not None else parts
        out, lse = _varlen_forward_impl(q_view, k, v, cu_seqlens_q, cu_seqlens_kv, *options)
        ctx.save_for_backward(packed, q, out, lse, cu_seqlens_q, cu_seqlens_kv)
        ctx.dim, ctx.options = dim, options
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, _grad_lse):
        n = 5 + len(ctx.options)
        if grad_out is None:
            return (None,) * n
        packed, q, out, lse, cu_seqlens_q, cu_seqlens_kv = ctx.saved_tensors
        dim = ctx.dim
        parts = packed.unbind(dim)
        q_view, k, v = (q, *parts) if q is not None else parts
        if _is_grad_enabled():  # create_graph=True: through the operator, which refuses a double backward
            grads = varlen_backward(grad_out, q_view, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv, *ctx.options)
            grad_q, grad_packed = grads[0], torch.stack(grads if q is None else grads[1:], dim)
        else:
            grad_packed = torch.empty(packed.shape, dtype=packed.dtype, device=packed.device)
            grad_parts = grad_packed.unbind(dim)
            grad_q = torch.empty(q_view.shape, dtype=q_view.dtype, device=q_view.device)
            _varlen_backward_into(grad_out, q_view, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv, grad_q,
                                  *grad_parts[-2:], ctx.options)
            if q is None:
                grad_parts[0].copy_(grad_q)
        needs = ctx.needs_input_grad
        return (grad_packed if needs[0] else None, None, grad_q if q is not None and needs[2] else None,
                *(None,) * (n - 3))


_eager_varlen_packed = _function_apply.__get__(None, _VarlenPackedFunction)


def cut_rows(start: torch.Tensor, count: torch.Tensor, length: int) -> torch.Tensor:
    """int32 cu_seqlens (3 b + 1,) cutting each row of b * ``length`` flattened tokens into three
    sequences: the tokens before ``start``, the ``count`` from it, the rest of the row. Every row
    has three (some empty), so that sequence i of one side pairs with sequence i of the other: a
    row's run with its run, its padding with padding."""
    rows = torch.arange(start.shape[0], device=start.device) * length
    bounds = torch.stack([rows + start, rows + start + count, rows + length], dim=1).reshape(-1)
    return torch.cat([bounds.new_zeros(1), bounds]).to(torch.int32)


def _check_max_seqlen(max_seqlen_q, max_seqlen_kv) -> None:
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_kv", max_seqlen_kv)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{name} must be a Python int or None, got {type(value).__name__}: a tensor would need a "
                            f"host synchronisation (leave it None to bound it by the token count)")
        if value is not None and not 1 <= value < 2**31:
            raise ValueError(f"{name} must be in [1, 2**31) or None, got {value}")


def _varlen_options(like, max_seqlen_q, max_seqlen_kv, scale, causal, causal_alignment, window, softcap, sinks,
                  dropout_p, deterministic) -> VarlenOptions:
    """The operators' options from the entry points' keywords; dropout's Philox state drawn on
    like's device."""
    left, right = _bounds(window)
    rng_state = _draw_rng_state(like, dropout_p) if dropout_p > 0 else None
    return new_record(VarlenOptions, (max_seqlen_q or 0, max_seqlen_kv or 0, scale, bool(causal), causal_alignment,
                                      left, right, softcap, sinks, float(dropout_p), rng_state,
                                      bool(deterministic)))  # in its fields' order


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_kv: torch.Tensor, max_seqlen_q: int | None = None,
                     max_seqlen_kv: int | None = None, *, scale: float | None = None, causal: bool = False,
                     causal_alignment: str = "top_left", window: tuple[int | None, int | None] | None = None,
                     softcap: float | None = None, sinks: torch.Tensor | None = None, dropout_p: float = 0.0,
                     deterministic: bool = False, return_lse: bool = False):
    """Attention over sequences packed along one token axis (THD, FlashAttention's varlen), differentiable.

    Args:
        q: (total_q, h_q, d_qk) CUDA tensor, float16 or bfloat16: the queries of every sequence,
            one after another. Any valid token and head strides (head-major, padded rows, slices
            of one fused (total, 3, h, d) projection, ...): read in place by the forward; the
            backward reads a contiguous copy of a q at other strides (cuDNN 9.19's variable-length
            backward computes a wrong dQ from one: quirk varlen_backward_dense_queries). k and v
            are never copied.
        k: (total_kv, h_kv, d_qk); h_q a multiple of h_kv (GQA). v: (total_kv, h_kv, d_v). With
            one key/value head (MQA) and a backward to come, k and v are repeated to two heads
            first (cuDNN 9.19's varlen backward gets MQA's dK wrong; the gradients sum back).
        cu_seqlens_q, cu_seqlens_kv: int32 (b + 1,) CUDA tensors, 0 then the end of each sequence
            (FlashAttention's cu_seqlens): sequence i is tokens [cu[i], cu[i + 1]). Read on the
            device only: no host synchronisation, so torch.compile and CUDA graphs (whose replays
            may change them) see no data-dependent values. Contract: non-decreasing, within the
            token counts; entries outside that are clamped into the buffers (nothing outside them
            is read or written) and give wrong results for the sequences concerned.
        max_seqlen_q, max_seqlen_kv: optional Python ints, the longest sequence on each side (a
            promise: a sequence longer than its bucket, at most 1.25x the promise, is treated as
            empty -- zeros out). None bounds it by the token count, always correct; a tighter bound
            spares cuDNN launching blocks for padding.
            Graphs are keyed by a bucket of these and of the token counts (at most 1.25x apart),
            so a training run over random document lengths builds a bounded number.
        scale, causal, causal_alignment, window, softcap, sinks, dropout_p, deterministic: as in
            :func:`stridedfa.torch.attention`, applied per sequence ("bottom_right" aligns each
            sequence's last query with its last key). Sinks only without a backward before cuDNN
            9.26 (refused by name before the forward when q, k or v require grad), never trainable.
        return_lse: also return the float32 log-sum-exp, shape (h_q, total_q) (FlashAttention's
            softmax_lse layout; its memory is token-major, strides (1, h_q)); not differentiable.

    Returns:
        out (total_q, h_q, d_v), contiguous; with ``return_lse`` (out, lse). Tokens in no sequence
        (after cu_seqlens_q[-1]) get out = 0 and lse = -inf, and zero gradients; so do the
        queries of a sequence with no keys.
    """
    _check_max_seqlen(max_seqlen_q, max_seqlen_kv)
    if sinks is not None and torch.is_grad_enabled():
        if sinks.requires_grad:
            raise UnsupportedError("varlen_attention does not compute the sinks' gradient (cuDNN before 9.26 reads "
                                   "out of bounds there); pass sinks.detach(), or use attention() on padded tensors "
                                   "with seqlens_q / seqlens_kv for trainable sinks.")
        if any(t.requires_grad for t in (q, k, v)) and _cudnn_version() < 92600:
            raise UnsupportedError("attention sinks in a variable-length backward need cuDNN 9.26 or newer (earlier "
                                   "versions read out of bounds there), also fixed sinks; run with sinks under "
                                   "torch.no_grad(), or use attention() on padded tensors with seqlens_q / "
                                   "seqlens_kv.")
    heads = varlen_backward_kv_heads(q.shape[1], k.shape[1])
    if heads != k.shape[1] and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        # k and v repeated (quirk varlen_backward_mqa_dk); autograd sums the heads' gradients back
        k, v = (t.expand(-1, heads, -1).contiguous() for t in (k, v))
    options = _varlen_options(q, max_seqlen_q, max_seqlen_kv, scale, causal, causal_alignment, window, softcap, sinks,
                            dropout_p, deterministic)
    if _plain_eager(q, k, v):
        if _requires_grad(q, k, v):
            out, lse = _eager_varlen(True, q, k, v, cu_seqlens_q, cu_seqlens_kv, *options)
        else:
            out, lse = _varlen_forward_impl(q, k, v, cu_seqlens_q, cu_seqlens_kv, *options)
    else:
        out, lse = varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_kv, *options)
    return (out, lse) if return_lse else out


def varlen_packed_attention(packed: torch.Tensor, dim: int, cu_seqlens_q: torch.Tensor,
                            cu_seqlens_kv: torch.Tensor | None = None, max_seqlen_q: int | None = None,
                            max_seqlen_kv: int | None = None, *, q: torch.Tensor | None = None, **options):
    """:func:`varlen_attention` on a packed projection (FlashAttention's varlen qkvpacked /
    kvpacked functions): ``packed`` holds q, k and v interleaved along axis ``dim`` (extent 3) of
    a (total, 3, h, d) (``dim=1``) or (total, h, 3, d) (``dim=2``) tensor, or k and v (extent 2)
    with ``q`` (total_q, h_q, d) given apart. ``cu_seqlens_kv`` defaults to ``cu_seqlens_q`` (and
    ``max_seqlen_kv`` to ``max_seqlen_q``) for self-attention. The gradient flows into ``packed``
    as one tensor of its shape. Options as in :func:`varlen_attention`.

    q, k and v are read in place as views of ``packed`` (the backward reads a contiguous copy of
    q, as :func:`varlen_attention` says).
    """
    if packed.dim() != 4 or dim not in (1, 2, -3, -2):
        raise ValueError(f"packed must be (total, n, h, d) with dim=1 or (total, h, n, d) with dim=2, got shape "
                         f"{tuple(packed.shape)} and dim={dim}")
    parts = packed.unbind(dim)
    if len(parts) == 3 and q is None:
        q, k, v = parts
    elif len(parts) == 2 and q is not None:
        k, v = parts
    else:
        raise ValueError(f"packed's axis {dim} must have extent 3 (q, k, v) without q, or 2 (k, v) with q "
                         f"given; got extent {len(parts)} with q {'given' if q is not None else 'not given'}")
    if cu_seqlens_kv is None:
        cu_seqlens_kv, max_seqlen_kv = cu_seqlens_q, max_seqlen_q if max_seqlen_kv is None else max_seqlen_kv
    if (_plain_eager(packed, packed, packed if q is None else q) and _requires_grad(packed, q)
            and not options.get("return_lse") and options.get("sinks") is None and k.shape[1] == q.shape[1]):
        # eager training on the projection itself: one gradient buffer (_VarlenPackedFunction)
        return _packed_eager(packed, dim, None if len(parts) == 3 else q, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                             max_seqlen_kv, **options)
    return varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, **options)


def _packed_eager(packed, dim, q, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, *, scale=None,
                  causal=False, causal_alignment="top_left", window=None, softcap=None, sinks=None, dropout_p=0.0,
                  deterministic=False, return_lse=False):
    """varlen_packed_attention's eager training path (sinks None and return_lse False: checked by
    the caller)."""
    _check_max_seqlen(max_seqlen_q, max_seqlen_kv)
    options = _varlen_options(packed, max_seqlen_q, max_seqlen_kv, scale, causal, causal_alignment, window, softcap,
                            None, dropout_p, deterministic)
    return _eager_varlen_packed(packed, dim, q, cu_seqlens_q, cu_seqlens_kv, *options)[0]
