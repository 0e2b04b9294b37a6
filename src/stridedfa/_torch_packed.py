"""The torch operators behind stridedfa.torch.packed_attention: q, k and v read as views of one
packed buffer, and -- in the backward -- their gradients written into one buffer of its shape
(their definitions, fake kernels and autograd Function). Built on _torch_ops' shared helpers;
importing this module registers torch.ops.stridedfa.packed_attention_*.
"""

import torch

from stridedfa import _core, _layouts
from stridedfa._errors import LayoutError
from stridedfa._torch_ops import (
    _AT_BIAS,
    _AT_SINKS,
    _HAS_EXCHANGE_API,
    _N_OPTIONS,
    _OPTIONS,
    _TENSOR_OPTIONS,
    _backward_kernel,
    _below_autograd,
    _bias_gradient_like,
    _check_backward,
    _core_backward,
    _core_forward,
    _define,
    _function_apply,
    _grad_or_none,
    _graded_sinks,
    _gradient_like,
    _is_grad_enabled,
    _lib,
    _no_lse,
    _option_grads,
    _raw,
    _readable,
    _refuse_sinks_gradient_with_dropout,
    _requires_grad,
    _sinks_gradient_like,
    _stream,
    _window,
)
from stridedfa._torch_options import Options

_LOGICAL = "bhsd"  # the core's axis names: batch, heads, sequence, head_dim


def _packed_forward_impl(packed, dim, layout, q, *args):  # args: the options, then with_lse
    opts, with_lse = Options.of(args), args[_N_OPTIONS]
    if _HAS_EXCHANGE_API:  # views, allocation and launch in one C call
        out_l, lse = _core._packed_forward_alloc(
            packed, dim, _to_logical(layout), q, opts.scale, opts.causal, opts.causal_alignment, with_lse,
            _window(opts.window_left, opts.window_right), opts.softcap, opts.seqlens_q, opts.seqlens_kv, opts.sinks,
            opts.bias, opts.alibi_slopes, opts.dropout_p, opts.rng_state)
        return out_l, (lse if with_lse else _no_lse(packed))
    q_l, k_l, v_l = _unpack(packed, dim, q)
    out_l = _empty_packed_output(q_l, v_l)
    lse = _empty_lse_for(q_l, layout) if with_lse else _no_lse(packed)
    to_logical = _to_logical(layout)
    _core_forward(_raw(q_l.permute(to_logical)), _raw(k_l.permute(to_logical)), _raw(v_l.permute(to_logical)),
                  out_l.permute(to_logical), lse if with_lse else None, opts, _stream(packed))
    return out_l, lse


def _packed_forward_fake(packed, dim, layout, q, *args):
    q_l, _, v_l = _unpack(packed, dim, q)
    return (_empty_packed_output(q_l, v_l),
            _empty_lse_for(q_l, layout) if args[_N_OPTIONS] else _no_lse(packed))


_packed_attention_forward = _define(
    "packed_attention_forward",
    f"(Tensor packed, int dim, str layout, Tensor? q, {_OPTIONS}, bool with_lse) -> (Tensor, Tensor)",
    _packed_forward_impl, _packed_forward_fake)


def _packed_backward_impl(packed, dim, layout, q, out, lse, grad_out, *args):
    """(grad_packed, grad_q or empty, grad_sinks or empty, grad_bias or empty: see
    _attention_backward_impl)."""
    opts = Options.of(args)
    with_grad_bias = args[_N_OPTIONS] and opts.bias is not None
    if _HAS_EXCHANGE_API:
        to_logical = _to_logical(layout)
        logical = grad_out.permute(to_logical)
        readable = _readable(logical)
        if readable is not logical:  # copied: hand the copy over in layout axes
            grad_out = readable.permute([to_logical.index(axis) for axis in range(4)])
        grad_packed, grad_q, grad_sinks, grad_bias = _core._packed_backward_alloc(
            packed, dim, to_logical, q, out, lse, grad_out, opts.scale, opts.causal, opts.causal_alignment,
            _window(opts.window_left, opts.window_right), opts.softcap, opts.seqlens_q, opts.seqlens_kv, opts.sinks,
            opts.deterministic, opts.bias, with_grad_bias, opts.alibi_slopes, opts.dropout_p, opts.rng_state)
        return (grad_packed, grad_q if grad_q is not None else _no_lse(packed),
                grad_sinks if grad_sinks is not None else _no_lse(packed),
                grad_bias if grad_bias is not None else _no_lse(packed))
    grad_packed = _gradient_like(packed)
    grad_q = _gradient_like(q) if q is not None else _no_lse(packed)
    sinks = _graded_sinks(opts)
    grad_sinks = _sinks_gradient_like(sinks, packed)
    grad_bias = _bias_gradient_like(opts.bias, with_grad_bias, packed)
    q_l, k_l, v_l = _unpack(packed, dim, q)
    dq_l, dk_l, dv_l = _unpack(grad_packed, dim, grad_q if q is not None else None)
    to_logical = _to_logical(layout)
    _core_backward(_raw(q_l.permute(to_logical)), _raw(k_l.permute(to_logical)), _raw(v_l.permute(to_logical)),
                   _raw(out.permute(to_logical)), _readable(grad_out.permute(to_logical)), _raw(lse),
                   dq_l.permute(to_logical), dk_l.permute(to_logical), dv_l.permute(to_logical), opts,
                   _stream(packed), None if sinks is None else grad_sinks, grad_bias if with_grad_bias else None)
    return grad_packed, grad_q, grad_sinks, grad_bias


def _packed_backward_fake(packed, dim, layout, q, out, lse, grad_out, *args):
    opts = Options.of(args)
    return (_gradient_like(packed), _gradient_like(q) if q is not None else _no_lse(packed),
            _sinks_gradient_like(_graded_sinks(opts), packed),
            _bias_gradient_like(opts.bias, args[_N_OPTIONS], packed))


_packed_attention_backward = _define(
    "packed_attention_backward",
    f"(Tensor packed, int dim, str layout, Tensor? q, Tensor out, Tensor lse, Tensor grad_out, {_OPTIONS}, "
    "bool with_grad_bias) -> (Tensor, Tensor, Tensor, Tensor)", _packed_backward_impl, _packed_backward_fake)
# Its tensors: packed, q, out, lse, grad_out and the tensor options.
_lib.impl("packed_attention_backward", _backward_kernel(_packed_attention_backward, _packed_backward_impl,
                                                        (0, 3, 4, 5, 6, *(7 + i for i in _TENSOR_OPTIONS))),
          "Autograd")


class _PackedAttentionFunction(torch.autograd.Function):
    """packed_attention_forward with a gradient to record (see _AttentionFunction)."""

    @staticmethod
    def forward(ctx, eager, packed, dim, layout, q, *args):  # args: the options, then with_lse
        op_args = (packed, dim, layout, q, *args)
        out, lse = (_packed_forward_impl(*op_args) if eager else
                    _below_autograd(_packed_attention_forward, _packed_forward_impl, op_args,
                                    (packed, q, *(args[i] for i in _TENSOR_OPTIONS))))
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(packed, q, out, lse)
        ctx.options = (dim, layout, Options.of(args))
        ctx.eager = eager
        ctx.with_lse = args[_N_OPTIONS]
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, _grad_lse):
        if not ctx.with_lse:
            raise RuntimeError("stridedfa: this packed_attention call was made without autograd (no "
                               "input required grad when it ran), so it kept no statistics to "
                               "differentiate with")
        packed, q, out, lse = ctx.saved_tensors
        dim, layout, opts = ctx.options
        wants_bias = ctx.needs_input_grad[5 + _AT_BIAS]
        _refuse_sinks_gradient_with_dropout(ctx.needs_input_grad[5 + _AT_SINKS], opts)
        args = (packed, dim, layout, q, out, lse, grad_out, *opts, wants_bias)
        if ctx.eager and not _is_grad_enabled():
            grad_packed, grad_q, grad_sinks, grad_bias = _packed_backward_impl(*args)
        else:
            grad_packed, grad_q, grad_sinks, grad_bias = _packed_attention_backward(*args)
        return (None, grad_packed, None, None, grad_q if q is not None else None,
                *_option_grads(_grad_or_none(grad_sinks, _graded_sinks(opts)), grad_bias if wants_bias else None))


def _packed_forward_autograd(packed, dim, layout, q, *args):
    op_args = (packed, dim, layout, q, *args)
    if _requires_grad(packed, q, args[_AT_SINKS], args[_AT_BIAS]):  # the record only where a backward follows
        _check_packed_backward(packed, dim, layout, q, Options.of(args))
        return _PackedAttentionFunction.apply(False, *op_args)
    return _below_autograd(_packed_attention_forward, _packed_forward_impl, op_args,
                           (packed, q, *(args[i] for i in _TENSOR_OPTIONS)))


_lib.impl("packed_attention_forward", _packed_forward_autograd, "Autograd")


_eager_packed_attention = _function_apply.__get__(None, _PackedAttentionFunction)  # see _torch_ops


# --- Helpers --------------------------------------------------------------------------------------

def _check_packed(packed, dim, layout, q) -> int:
    if not isinstance(packed, torch.Tensor) or packed.dim() != 5:
        raise LayoutError(f"packed must be a 5-D tensor (four axes named by layout plus the packing "
                          f"axis); got {getattr(packed, 'shape', type(packed).__name__)}")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -5 <= dim < 5:
        raise ValueError(f"dim must be an axis of packed (-5 to 4), got {dim!r}")
    dim %= 5
    if sorted(layout) != sorted(_LOGICAL) or len(layout) != 4:
        raise ValueError(f"layout must name packed's other four axes with the letters b, s, h, d "
                         f"(e.g. 'bshd'), got {layout!r}")
    want = 3 if q is None else 2
    if packed.shape[dim] != want:
        what = "q, k and v" if q is None else "k and v (q is given separately)"
        raise LayoutError(f"packed must hold {what} along dim {dim}, i.e. extent {want} there; its shape "
                          f"is {tuple(packed.shape)}")
    if q is not None and q.dim() != 4:
        raise LayoutError(f"q must be 4-D in layout {layout!r}; got shape {tuple(q.shape)}")
    return dim


def _check_packed_backward(packed, dim, layout, q, opts: Options) -> None:
    """_check_backward for a packed call: its q, k, v views in (b, h, s, d)."""
    if opts.bias is not None or opts.sinks is not None or opts.dropout_p:
        perm = _to_logical(layout)
        q_l, k_l, v_l = (t.permute(perm) for t in _unpack(packed, dim, q))
        _check_backward(q_l, k_l, v_l, opts)


def _unpack(packed, dim, q):
    """q, k, v in the packed layout's axes: zero-copy slices of `packed` (q separate if given)."""
    if q is None:
        return packed.select(dim, 0), packed.select(dim, 1), packed.select(dim, 2)
    return q, packed.select(dim, 0), packed.select(dim, 1)


_TO_LOGICAL: dict[str, list[int]] = {}  # layout -> the permutation taking its axes to (b, h, s, d)


def _to_logical(layout: str) -> list[int]:
    perm = _TO_LOGICAL.get(layout)
    if perm is None:
        perm = _TO_LOGICAL[layout] = [layout.index(axis) for axis in _LOGICAL]
    return perm


def _empty_packed_output(q_l, v_l):
    """The output in the layout's axes: q's shape with v's head_dim, dense in q's memory order."""
    shape = tuple(q_l.shape[:-1]) + (v_l.shape[-1],)
    return q_l.new_empty_strided(shape, _layouts.output_strides(shape, q_l.stride()))


def _empty_lse_for(q_l, layout):
    sizes = dict(zip(layout, q_l.shape))
    return q_l.new_empty((sizes["b"], sizes["h"], sizes["s"]), dtype=torch.float32)
