"""The torch operators behind stridedfa.torch.attention: their definitions (torch.library), fake
kernels with the real kernels' strides (stridedfa._layouts), autograd kernels and Functions, and
the helpers every torch operator shares. stridedfa.torch holds the public entry points; importing
this module registers torch.ops.stridedfa.attention_*; packed_attention's operators are in
_torch_packed, paged and variable-length attention's in _torch_paged and _torch_varlen.
"""

import functools
import operator

import torch

from stridedfa import _core, _layouts
from stridedfa._errors import UnsupportedError
from stridedfa._quirk_workarounds import SINKS_GRAD_UNDER_DROPOUT
from stridedfa._torch_options import Options, position, schema, tensor_positions, without_tensors

# torch >= 2.10 exports the DLPack C exchange API: the core reads tensors and the current stream in
# well under a microsecond and allocates through torch's allocator. Older torch goes through
# __dlpack__, which needs the stream spelled out and tensors detached.
_HAS_EXCHANGE_API = hasattr(torch.Tensor, "__dlpack_c_exchange_api__")


# --- Operators ------------------------------------------------------------------------------------
#
# Defined with torch.library.Library rather than torch.library.custom_op: a custom_op call crosses
# from the dispatcher into Python four times (autograd wrapper, redispatch, backend wrapper with its
# aliasing check, the kernel), which cost more host time than torch's whole SDPA. Each operator here
# has three kernels:
#   - impl, the computation, for every device (CompositeExplicitAutograd; CPU tensors get the
#     validator's LayoutError);
#   - a fake kernel with exactly impl's strides (stridedfa._layouts), for meta/fake tensors;
#   - an Autograd kernel: with a gradient to record, an autograd.Function; without one, impl itself
#     on plain tensors with no mode active (eager calls, compiled graphs' calls), else the call with
#     autograd excluded (fake tensors, dispatch modes and tracers see the operator).
# So a call from a compiled graph or through torch.ops enters Python once.

_lib = torch.library.Library("stridedfa", "DEF")
_AutoDispatchBelowAutograd = torch._C._AutoDispatchBelowAutograd


def _define(name, schema, impl, fake):
    _lib.define(name + schema, tags=(torch.Tag.pt2_compliant_tag,))
    _lib.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"stridedfa::{name}", fake, lib=_lib)
    return getattr(torch.ops.stridedfa, name).default


def _below_autograd(op, impl, args, tensors):
    """`op` as if its Autograd kernel were a fallthrough: impl itself when `tensors` are plain CUDA
    tensors and no mode is active (below autograd there is then only the CUDA backend; asking the
    dispatcher for its keyset would cost more than the whole check), else a call with autograd
    excluded."""
    if _plain(tensors):
        return impl(*args)
    with _AutoDispatchBelowAutograd():
        return op(*args)


def _plain(tensors) -> bool:
    """Plain CUDA tensors (not meta, fake or subclasses) and no dispatch or function mode."""
    return (all(t is None or type(t) is _Tensor for t in tensors) and tensors[0].is_cuda
            and _dispatch_stack_depth() == 0 and not _function_mode_enabled())


class _NotDifferentiable(torch.autograd.Function):
    """A backward operator called with inputs that require grad (create_graph=True, or AOTAutograd
    tracing the joint graph): computed as usual, and differentiating through it raises."""

    @staticmethod
    def forward(ctx, op, impl, tensor_args, *args):
        ctx.name = op.name()
        return _below_autograd(op, impl, args, [args[i] for i in tensor_args])

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(f"{ctx.name} is not differentiable: stridedfa attention has no double "
                           f"backward")


def _requires_grad(*tensors) -> bool:
    return _is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _backward_kernel(op, impl, tensor_args):
    """The Autograd kernel of a backward operator whose arguments at `tensor_args` are tensors."""
    def kernel(*args):
        tensors = [args[i] for i in tensor_args]
        if _requires_grad(*tensors):
            return _NotDifferentiable.apply(op, impl, tensor_args, *args)
        return _below_autograd(op, impl, args, tensors)
    return kernel


# Every operator takes its options as one record after its tensors (Options, _torch_options.py:
# read by name; its fields are the schema), then a flag (with_lse / with_grad_bias) at _N_OPTIONS.
_OPTIONS = schema(Options)
_N_OPTIONS = len(Options._fields)
_TENSOR_OPTIONS = tensor_positions(Options)
_AT_SINKS, _AT_BIAS = position(Options, "sinks"), position(Options, "bias")  # the differentiable options


def _option_grads(grad_sinks, grad_bias):
    """The gradients of the options and of the flag after them (with_lse / return_lse)."""
    grads = [None] * (_N_OPTIONS + 1)
    grads[_AT_SINKS], grads[_AT_BIAS] = grad_sinks, grad_bias
    return tuple(grads)


# cuDNN quirk sinks_grad_under_dropout (cudnn_quirks.hpp): a constant while tracing.
_SINKS_GRAD_UNDER_DROPOUT = SINKS_GRAD_UNDER_DROPOUT


def _graded_sinks(opts: Options):
    """The sinks whose gradient the backward computes: none with dropout (the quirk above;
    attention() refuses sinks that require grad with dropout before the forward)."""
    return opts.sinks if not (opts.dropout_p and _SINKS_GRAD_UNDER_DROPOUT) else None


def _refuse_sinks_gradient_with_dropout(wanted: bool, opts: Options) -> None:
    """A backward asked for the sinks' gradient under dropout (the operators called directly, past
    attention()'s check): refused rather than answered with None."""
    if wanted and opts.dropout_p and _SINKS_GRAD_UNDER_DROPOUT:
        raise UnsupportedError("the sinks' gradient with dropout is not supported: cuDNN 9.19 returns it scaled "
                               "by 1 - dropout_p. Use dropout_p=0 with trainable sinks, or detach them. [cuDNN quirk "
                               "sinks_grad_under_dropout]")


def _grad_or_none(grad, option):
    """An operator's gradient output for a differentiable option: None where it was not given."""
    return grad if option is not None else None


def _attention_forward_impl(q, k, v, *args):  # args: the options, then with_lse
    with_lse = args[_N_OPTIONS]
    out, lse = _forward(q, k, v, Options.of(args), with_lse)
    return out, (lse if with_lse else _no_lse(q))


def _attention_forward_fake(q, k, v, *args):
    out_shape = (q.shape[0], q.shape[1], q.shape[2], v.shape[3])
    out = q.new_empty_strided(out_shape, _layouts.output_strides(out_shape, q.stride()))
    return out, (_empty_lse(q) if args[_N_OPTIONS] else _no_lse(q))


_attention_forward = _define(
    "attention_forward", f"(Tensor q, Tensor k, Tensor v, {_OPTIONS}, bool with_lse) -> (Tensor, Tensor)",
    _attention_forward_impl, _attention_forward_fake)


def _attention_inference_impl(q, k, v, *opts):
    return _forward(q, k, v, Options.of(opts), False)[0]


def _attention_inference_fake(q, k, v, *opts):
    return _attention_forward_fake(q, k, v, *opts, False)[0]


# The forward without statistics: what a call that records no gradient runs (no placeholder lse
# to allocate).
_attention_inference = _define(
    "attention_inference", f"(Tensor q, Tensor k, Tensor v, {_OPTIONS}) -> Tensor",
    _attention_inference_impl, _attention_inference_fake)


def _direct_call(q, k, v) -> bool:
    """The inference operators' Autograd kernels may call the core themselves (the path compiled
    graphs take): _plain for exactly q, k, v, without building a list, and the exchange API."""
    return (type(q) is _Tensor and type(k) is _Tensor and type(v) is _Tensor and q.is_cuda
            and _dispatch_stack_depth() == 0 and not _function_mode_enabled() and _HAS_EXCHANGE_API)


def _attention_inference_autograd(q, k, v, *opts):
    if _direct_call(q, k, v):
        return _forward(q, k, v, Options.of(opts), False)[0]
    with _AutoDispatchBelowAutograd():
        return _attention_inference(q, k, v, *opts)


_lib.impl("attention_inference", _attention_inference_autograd, "Autograd")


# The same forward for calls that use none of the variants' options (plain and causal attention):
# the dispatcher boxes every argument into Python on each call, so the call torch.compile'd code
# and dispatch modes make most often takes three options, not twelve.
_BASIC_OPTIONS = "float? scale, bool causal, str causal_alignment"
_VARIANT_DEFAULTS = Options(scale=None, causal=False, causal_alignment="top_left", window_left=-1, window_right=-1,
                            softcap=None, seqlens_q=None, seqlens_kv=None, sinks=None, deterministic=False, bias=None,
                            alibi_slopes=None, dropout_p=0.0, rng_state=None)[3:]  # the fields after the basic three


def _attention_inference_basic_impl(q, k, v, scale, causal, causal_alignment):
    return _forward(q, k, v, Options(scale, causal, causal_alignment, *_VARIANT_DEFAULTS), False)[0]


def _attention_inference_basic_fake(q, k, v, scale, causal, causal_alignment):
    return _attention_inference_fake(q, k, v, scale, causal, causal_alignment, *_VARIANT_DEFAULTS)


_attention_inference_basic = _define(
    "attention_inference_basic", f"(Tensor q, Tensor k, Tensor v, {_BASIC_OPTIONS}) -> Tensor",
    _attention_inference_basic_impl, _attention_inference_basic_fake)


def _attention_inference_basic_autograd(q, k, v, scale, causal, causal_alignment):
    if _direct_call(q, k, v):
        return _forward_alloc(q, k, v, scale, causal, causal_alignment, False)[0]
    with _AutoDispatchBelowAutograd():
        return _attention_inference_basic(q, k, v, scale, causal, causal_alignment)


_lib.impl("attention_inference_basic", _attention_inference_basic_autograd, "Autograd")


def _attention_backward_impl(q, k, v, out, lse, grad_out, *args, together=False):
    """(grad_q, grad_k, grad_v, grad_sinks: (h_q,) float32 or empty without sinks, grad_bias: of
    bias' shape, contiguous, or empty unless args' last flag (with_grad_bias) asks for it)."""
    opts = Options.of(args)
    with_grad_bias = args[_N_OPTIONS] and opts.bias is not None
    if _HAS_EXCHANGE_API:  # reading, allocating dQ/dK/dV and launching in one C call
        grad_q, grad_k, grad_v, grad_sinks, grad_bias = _core._backward_alloc(
            q, k, v, out, lse, grad_out, opts.scale, opts.causal, opts.causal_alignment, _contiguous, together,
            _window(opts.window_left, opts.window_right), opts.softcap, opts.seqlens_q, opts.seqlens_kv, opts.sinks,
            opts.deterministic, opts.bias, with_grad_bias, opts.alibi_slopes, opts.dropout_p, opts.rng_state)
        return (grad_q, grad_k, grad_v, grad_sinks if grad_sinks is not None else _no_lse(q),
                grad_bias if grad_bias is not None else _no_lse(q))
    grad_q, grad_k, grad_v = _gradient_like(q), _gradient_like(k), _gradient_like(v)
    sinks = _graded_sinks(opts)
    grad_sinks = _sinks_gradient_like(sinks, q)
    grad_bias = _bias_gradient_like(opts.bias, with_grad_bias, q)
    _core_backward(_raw(q), _raw(k), _raw(v), _raw(out), _readable(grad_out), _raw(lse), grad_q, grad_k,
                   grad_v, opts, _stream(q), None if sinks is None else grad_sinks,
                   grad_bias if with_grad_bias else None)
    return grad_q, grad_k, grad_v, grad_sinks, grad_bias


def _attention_backward_fake(q, k, v, out, lse, grad_out, *args):
    opts = Options.of(args)
    return (_gradient_like(q), _gradient_like(k), _gradient_like(v), _sinks_gradient_like(_graded_sinks(opts), q),
            _bias_gradient_like(opts.bias, args[_N_OPTIONS], q))


_attention_backward = _define(
    "attention_backward",
    f"(Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor grad_out, {_OPTIONS}, bool with_grad_bias) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor)", _attention_backward_impl, _attention_backward_fake)
# Its tensors: q, k, v, out, lse, grad_out and the tensor options.
_lib.impl("attention_backward", _backward_kernel(_attention_backward, _attention_backward_impl,
                                                 (0, 1, 2, 3, 4, 5, *(6 + i for i in _TENSOR_OPTIONS))), "Autograd")


class _AttentionFunction(torch.autograd.Function):
    """attention_forward with a gradient to record, as the operator's Autograd kernel runs it."""

    @staticmethod
    def forward(ctx, q, k, v, *args):  # args: the options, then with_lse
        out, lse = _below_autograd(_attention_forward, _attention_forward_impl, (q, k, v, *args),
                                   (q, k, v, *(args[i] for i in _TENSOR_OPTIONS)))
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = Options.of(args)
        ctx.with_lse = args[_N_OPTIONS]
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, _grad_lse):
        if not ctx.with_lse:
            raise RuntimeError("stridedfa: this attention call was made without autograd (no input "
                               "required grad when it ran), so it kept no statistics to differentiate "
                               "with")
        q, k, v, out, lse = ctx.saved_tensors
        opts = ctx.options
        wants_bias = ctx.needs_input_grad[3 + _AT_BIAS]
        _refuse_sinks_gradient_with_dropout(ctx.needs_input_grad[3 + _AT_SINKS], opts)
        grad_q, grad_k, grad_v, grad_sinks, grad_bias = _attention_backward(
            q, k, v, out, lse, grad_out, *opts, wants_bias)
        return (grad_q, grad_k, grad_v, *_option_grads(_grad_or_none(grad_sinks, _graded_sinks(opts)),
                                                       grad_bias if wants_bias else None))


class _EagerAttention(torch.autograd.Function):
    """attention() on plain CUDA tensors with a gradient to record, eager (never inside a compiled
    graph): the kernels called directly, out and lse in one allocation, and the gradients in one
    when all three are wanted. Returns out, or (out, lse) with return_lse (lse not differentiable).

    Host time is the point of this class (a training step that is host-bound must not lose to
    torch's C++ autograd node): apply takes the sinks and the bias (the differentiable options) and
    the options as one tuple, and lse is saved on ctx rather than as a saved tensor (it is never
    modified in place, and only an output needs the version check) and is an output only when
    asked for."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, bias, opts: Options, return_lse):
        out, lse = _forward_alloc(q, k, v, opts.scale, opts.causal, opts.causal_alignment, True, True,
                                  _window(opts.window_left, opts.window_right), opts.softcap, opts.seqlens_q,
                                  opts.seqlens_kv, sinks, bias, opts.alibi_slopes, opts.dropout_p, opts.rng_state)
        ctx.save_for_backward(q, k, v, out)
        ctx.lse = lse
        ctx.options = opts
        if return_lse:
            ctx.mark_non_differentiable(lse)
            return out, lse
        return out

    @staticmethod
    def backward(ctx, grad_out, *_grad_lse):
        q, k, v, out = ctx.saved_tensors
        needs = ctx.needs_input_grad
        _refuse_sinks_gradient_with_dropout(needs[3], ctx.options)
        opts = ctx.options
        if _is_grad_enabled():  # create_graph=True: through the operator, which refuses a double backward
            grads = _attention_backward(q, k, v, out, ctx.lse, grad_out, *opts, needs[4])
        else:  # one C call (read, allocate, launch); absent gradients are None, not the operator's placeholders
            grads = _core._backward_alloc(
                q, k, v, out, ctx.lse, grad_out, opts.scale, opts.causal, opts.causal_alignment, _contiguous,
                needs[0] and needs[1] and needs[2], _window(opts.window_left, opts.window_right), opts.softcap,
                opts.seqlens_q, opts.seqlens_kv, opts.sinks, opts.deterministic, opts.bias,
                needs[4] and opts.bias is not None, opts.alibi_slopes, opts.dropout_p, opts.rng_state)
        grad_q, grad_k, grad_v, grad_sinks, grad_bias = grads
        return (grad_q, grad_k, grad_v, _grad_or_none(grad_sinks, _graded_sinks(opts)),
                grad_bias if needs[4] else None, None, None)


def _attention_forward_autograd(q, k, v, *args):
    if _requires_grad(q, k, v, args[_AT_SINKS], args[_AT_BIAS]):  # the record only where a backward follows
        _check_backward(q, k, v, Options.of(args))
        return _AttentionFunction.apply(q, k, v, *args)
    return _below_autograd(_attention_forward, _attention_forward_impl, (q, k, v, *args),
                           (q, k, v, *(args[i] for i in _TENSOR_OPTIONS)))


_lib.impl("attention_forward", _attention_forward_autograd, "Autograd")


# Eager calls with autograd enter the Functions through autograd's C entry point: Function.apply's
# Python wrapper only unwraps functorch tensors, and _plain_eager has ruled those out.
_function_apply = torch._C._FunctionBase.__dict__["apply"]
_eager_attention = _function_apply.__get__(None, _EagerAttention)


# --- Helpers --------------------------------------------------------------------------------------

def _causal(causal: bool, is_causal: bool | None) -> bool:
    if is_causal is None:
        return bool(causal)
    if causal and not is_causal:
        raise ValueError("causal=True and is_causal=False disagree; pass one of them")
    return bool(is_causal)


# Looked up once: attention() is on the host-time hot path.
_Tensor = torch.Tensor
_is_grad_enabled = torch.is_grad_enabled
_is_compiling = torch.compiler.is_compiling
_function_mode_enabled = torch._C._is_torch_function_mode_enabled
_dispatch_stack_depth = torch._C._len_torch_dispatch_stack
_functorch_active = torch._C._are_functorch_transforms_active
_forward_alloc = _core._forward_alloc


def _plain_eager(q, k, v) -> bool:
    """True when a call can bypass the operator: plain CUDA tensors, eager, no torch function or
    dispatch mode active (those — fake tensors, tracing, opcheck — must see the operator)."""
    return (_HAS_EXCHANGE_API and type(q) is _Tensor and type(k) is _Tensor and type(v) is _Tensor
            and q.is_cuda and not _is_compiling() and not _function_mode_enabled()
            and _dispatch_stack_depth() == 0 and not _functorch_active())


def _forward(q, k, v, opts: Options, with_lse, together=False):
    if _HAS_EXCHANGE_API:
        return _forward_alloc(q, k, v, opts.scale, opts.causal, opts.causal_alignment, with_lse, together,
                              _window(opts.window_left, opts.window_right), opts.softcap, opts.seqlens_q,
                              opts.seqlens_kv, opts.sinks, opts.bias, opts.alibi_slopes, opts.dropout_p,
                              opts.rng_state)
    out_shape = (q.shape[0], q.shape[1], q.shape[2], v.shape[3])
    out = q.new_empty_strided(out_shape, _layouts.output_strides(out_shape, q.stride()))
    lse = _empty_lse(q) if with_lse else None
    _core_forward(_raw(q), _raw(k), _raw(v), out, lse, opts, _stream(q))
    return out, lse


def _core_forward(q, k, v, out, lse, opts: Options, stream):
    """The core's forward through __dlpack__ (torch < 2.10)."""
    _core._forward(q, k, v, out, lse, opts.scale, opts.causal, opts.causal_alignment, stream, _workspace,
                   _window(opts.window_left, opts.window_right), opts.softcap, opts.seqlens_q, opts.seqlens_kv,
                   None if opts.sinks is None else _raw(opts.sinks), None if opts.bias is None else _raw(opts.bias),
                   opts.alibi_slopes, opts.dropout_p, opts.rng_state)


def _core_backward(q, k, v, out, grad_out, lse, grad_q, grad_k, grad_v, opts: Options, stream, grad_sinks=None,
                   grad_bias=None):
    """The core's backward through __dlpack__ (torch < 2.10)."""
    _core._backward(q, k, v, out, grad_out, lse, grad_q, grad_k, grad_v, opts.scale, opts.causal,
                    opts.causal_alignment, stream, _workspace, _window(opts.window_left, opts.window_right),
                    opts.softcap, opts.seqlens_q, opts.seqlens_kv, None if opts.sinks is None else _raw(opts.sinks),
                    grad_sinks, opts.deterministic, None if opts.bias is None else _raw(opts.bias), grad_bias,
                    opts.alibi_slopes, opts.dropout_p, opts.rng_state)


def _bounds(window) -> tuple[int, int]:
    """window=(left, right) or None as the operators' two ints, -1 for an unbounded side. The
    core's parse (_core._window_bounds) with its rules and messages, restated in Python because
    torch.compile traces this code and cannot call into the compiled module
    (tests/test_torch_registration.py holds the two to the same answers)."""
    if window is None:
        return -1, -1
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window must be None or a pair (left, right) of token counts (each an int or None), "
                        f"got {window!r}")
    bounds = []
    for side, bound in zip(("left", "right"), window):
        if bound is None:
            bounds.append(-1)
            continue
        if type(bound) is not int:  # (a plain int is taken as it is: torch.compile traces no call)
            # a NumPy integer, never a bool of Python or NumPy
            if (isinstance(bound, bool) or type(bound).__name__ in ("bool_", "bool")
                    or not hasattr(type(bound), "__index__")):
                raise TypeError(f"window {side} bound must be an int >= 0 or None, got {bound!r}")
            bound = operator.index(bound)
        if bound < 0:
            raise ValueError(f"window {side} bound must be >= 0 (None: unbounded; FlashAttention's -1 is None "
                             f"here), got {bound}")
        if bound >= 2**31 - 1:
            raise ValueError(f"window {side} bound must be below 2**31 - 1 tokens (None: unbounded), got {bound}")
        bounds.append(bound)
    return bounds[0], bounds[1]


def _window(left: int, right: int):
    """The operators' two ints back as the core's window (None when unbounded on both sides)."""
    if left < 0 and right < 0:
        return None
    return (None if left < 0 else left, None if right < 0 else right)


def _empty_lse(q):
    # Packed (b, h, s) float32: the layout cuDNN's backward reads (it ignores strides before 9.26).
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2]), dtype=torch.float32)


def _sinks_gradient_like(sinks, like):
    """The sinks' gradient buffer, or an empty placeholder (an operator returns a tensor) without sinks."""
    return _no_lse(like) if sinks is None else sinks.new_empty(sinks.shape)


def _bias_gradient_like(bias, wanted, like):
    """The bias' gradient buffer (contiguous, bias' shape, as the core allocates it), or an empty
    placeholder when there is no bias or its gradient is not wanted."""
    return bias.new_empty(bias.shape) if bias is not None and wanted else _no_lse(like)


def _draw_rng_state(like, dropout_p) -> torch.Tensor:
    """dropout's Philox seed and offset as an int64 (2,) tensor on like's device, drawn from torch's
    generator for that device as any random op draws (torch.manual_seed and the generator's state
    decide them, the generator advances; under CUDA-graph capture each replay draws anew; under
    torch.compile it is one more random op of the graph). No host synchronisation."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be a probability in [0, 1), got {dropout_p!r}")
    return torch.randint(0, 1 << 62, (2,), dtype=torch.int64, device=like.device)


def _check_backward(q, k, v, opts: Options) -> None:
    """Before a training forward with a bias, dropout or sinks: the core's verdict on the backward
    this step will need (its rules on the bias' gradient, dropout and sinks), from shapes alone, so
    that a step whose backward would be refused fails before anything runs. q, k, v: (b, h, s, d).
    Skipped for symbolic shapes (torch.compile with dynamic shapes): their backward is checked when
    it runs."""
    sinks, bias = opts.sinks, opts.bias
    if bias is None and sinks is None and not opts.dropout_p:
        return
    shapes = (tuple(q.shape), tuple(k.shape), tuple(v.shape))
    if not all(type(n) is int for shape in shapes for n in shape):
        return
    seqlens_q, seqlens_kv = opts.seqlens_q, opts.seqlens_kv
    # lengths: 0 none, 1 two tensors, 2 one tensor for both sides (the core aligns such a call
    # top-left where the diagonals coincide, and refuses less)
    lengths = 0 if seqlens_q is None and seqlens_kv is None else 2 if _same_memory(seqlens_q, seqlens_kv) else 1
    _backward_verdict(shapes, str(q.dtype).removeprefix("torch."), without_tensors(opts), lengths,
                      sinks is not None and sinks.requires_grad, sinks is not None,
                      None if bias is None else tuple(bias.shape), bias is not None and bias.requires_grad,
                      opts.alibi_slopes is not None)


def _same_memory(a, b) -> bool:
    """One lengths tensor for both sides, as the core tells it: the same address and stride (so
    also a view or a detached alias of one tensor). Fake and meta tensors have no address: the same
    object only."""
    if a is b:
        return True
    if a is None or b is None:
        return False
    try:
        return a.device == b.device and a.data_ptr() == b.data_ptr() and a.stride(0) == b.stride(0)
    except (RuntimeError, NotImplementedError):
        return False


@functools.lru_cache(maxsize=256)
def _backward_verdict(shapes, dtype, opts: Options, lengths, grad_sinks, sinks, bias, grad_bias, alibi) -> None:
    """_check_backward's core call, on dense (b, h, s, d) stand-ins (a success is cached: it
    depends on nothing else; opts without its tensors)."""
    q, k, v = shapes
    out = (*q[:3], v[3])
    dropout_p = float(opts.dropout_p)
    int32 = ((q[0],), "int32")
    _core._validate_shapes(
        True, 1, (q, k, v, out, q[:3], out, q, k, v), dtype, scale=opts.scale, causal=opts.causal,
        causal_alignment=opts.causal_alignment, window=_window(opts.window_left, opts.window_right),
        softcap=opts.softcap, deterministic=opts.deterministic,
        lengths=(int32, int32) if lengths else None, shared_lengths=lengths == 2,
        sinks=((q[1],), "float32") if sinks else None,
        grad_sinks=grad_sinks, bias=(bias, dtype) if bias is not None else None, grad_bias=grad_bias,
        alibi_slopes=((q[1],), "float32") if alibi else None, dropout_p=dropout_p,
        rng_state=((2,), "int64") if dropout_p else None)


def _no_lse(like):
    return like.new_empty((0,), dtype=torch.float32)


def _gradient_like(t):
    """A gradient buffer with t's strides when t is dense, else dense in t's axis order."""
    return t.new_empty_strided(t.shape, _layouts.gradient_strides(t.shape, t.stride()))


def _raw(t: torch.Tensor) -> torch.Tensor:
    # The exchange API reads any tensor; __dlpack__ refuses tensors that require grad.
    return t if _HAS_EXCHANGE_API else t.detach()


def _stream(t: torch.Tensor):
    if _HAS_EXCHANGE_API or t.device.type != "cuda":
        return None  # the core takes torch's current stream from the exchange API
    return torch.cuda.current_stream(t.device).cuda_stream


def _workspace(nbytes: int, device: int):
    # Allocated on the current stream by torch's caching allocator, so reusing the block after
    # this call is ordered behind the kernel that uses it.
    buffer = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device))
    return buffer.data_ptr(), buffer


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous()


def _readable(t: torch.Tensor) -> torch.Tensor:
    """grad_out as cuDNN can read it. Autograd may hand a broadcast gradient (stride 0, e.g. from
    out.sum().backward()) or another layout cuDNN cannot read; only then is a copy made. The rule
    is the validator's (_core._can_read)."""
    return _raw(t) if _core._can_read(_raw(t)) else t.contiguous()
