"""The torch adapter without a GPU: operator registration and schemas, fake kernels' strides (meta
tensors), fullgraph tracing of a transformer block, the layout rule shared by C and Python, and the
exchange-API allocation path on CPU tensors."""

import pytest

torch = pytest.importorskip("torch")

import stridedfa  # noqa: E402
import stridedfa.torch as sfa_torch  # noqa: E402
from stridedfa import _core, _layouts  # noqa: E402

META = dict(device="meta", dtype=torch.bfloat16)

# The options after causal_alignment, as the operators take them: no window (-1, -1), no softcap,
# no padding lengths, no sinks, non-deterministic backward, no bias, no ALiBi, no dropout.
DEFAULTS = (-1, -1, None, None, None, None, False, None, None, 0.0, None)



def test_operators_are_registered_with_their_schemas():
    options = ("float? scale, bool causal, str causal_alignment, int window_left, int window_right, "
               "float? softcap, Tensor? seqlens_q, Tensor? seqlens_kv, Tensor? sinks, bool deterministic, "
               "Tensor? bias, Tensor? alibi_slopes, float dropout_p, Tensor? rng_state")
    expected = {
        "attention_forward": f"(Tensor q, Tensor k, Tensor v, {options}, bool with_lse) -> (Tensor, Tensor)",
        "attention_inference": f"(Tensor q, Tensor k, Tensor v, {options}) -> Tensor",
        "attention_inference_basic": "(Tensor q, Tensor k, Tensor v, float? scale, bool causal, "
                                     "str causal_alignment) -> Tensor",
        "attention_backward": f"(Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor grad_out, "
                              f"{options}, bool with_grad_bias) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
        "packed_attention_forward": f"(Tensor packed, int dim, str layout, Tensor? q, {options}, "
                                    f"bool with_lse) -> (Tensor, Tensor)",
        "packed_attention_backward": f"(Tensor packed, int dim, str layout, Tensor? q, Tensor out, "
                                     f"Tensor lse, Tensor grad_out, {options}, bool with_grad_bias) "
                                     f"-> (Tensor, Tensor, Tensor, Tensor)",
    }
    for name, schema in expected.items():
        op = getattr(torch.ops.stridedfa, name).default
        assert str(op._schema) == f"stridedfa::{name}{schema}"


def test_operators_take_the_options_records_fields_in_order():
    # The records (stridedfa._torch_options) are the schemas' options, read by name: a field added,
    # moved or renamed there changes every operator that takes it, and nothing else has to.
    from stridedfa._torch_options import Options, VarlenOptions
    for name, record, first in (("attention_forward", Options, 3), ("attention_backward", Options, 6),
                                ("packed_attention_forward", Options, 4), ("packed_attention_backward", Options, 7),
                                ("varlen_forward", VarlenOptions, 5), ("varlen_backward", VarlenOptions, 8)):
        arguments = getattr(torch.ops.stridedfa, name).default._schema.arguments
        assert [a.name for a in arguments[first:first + len(record._fields)]] == list(record._fields), name
    options = Options.of((None, True, "top_left", -1, -1, None, None, None, "sinks", False, "bias", None, 0.0,
                          None, True))  # the flag after the options is left out
    assert (options.sinks, options.bias, options.causal) == ("sinks", "bias", True)
    from stridedfa._torch_ops import _option_grads
    grads = _option_grads("grad_sinks", "grad_bias")
    assert len(grads) == len(Options._fields) + 1  # and the flag's
    assert {i: g for i, g in enumerate(grads) if g} == {Options._fields.index("sinks"): "grad_sinks",
                                                        Options._fields.index("bias"): "grad_bias"}


def _packed_views(b=2, s=64, h=4, d=64):
    qkv = torch.empty(b, s, 3, h, d, **META)
    return qkv, [qkv[:, :, i].transpose(1, 2) for i in range(3)]


@pytest.mark.parametrize("kind", ["contiguous", "bshd_view", "packed_view", "extent1_heads"])
def test_fake_forward_strides_follow_the_layout_rule(kind):
    if kind == "contiguous":
        q = k = v = torch.empty(2, 4, 64, 32, **META)
    elif kind == "bshd_view":
        q = k = v = torch.empty(2, 64, 4, 32, **META).transpose(1, 2)
    elif kind == "packed_view":
        _, (q, k, v) = _packed_views()
    else:
        q = k = v = torch.empty(2, 64, 1, 32, **META).transpose(1, 2)
    out, lse = torch.ops.stridedfa.attention_forward(q, k, v, None, False, "top_left", *DEFAULTS, True)
    assert out.shape == (q.shape[0], q.shape[1], q.shape[2], v.shape[3])
    assert out.stride() == _layouts.output_strides(out.shape, q.stride())
    assert out.stride() == _core._output_strides(tuple(out.shape), q.stride())
    assert lse.shape == (q.shape[0], q.shape[1], q.shape[2]) and lse.is_contiguous()
    assert lse.dtype == torch.float32


def test_fake_backward_and_packed_strides():
    qkv, (q, k, v) = _packed_views()
    out, lse = torch.ops.stridedfa.attention_forward(q, k, v, None, True, "top_left", *DEFAULTS, True)
    grads = torch.ops.stridedfa.attention_backward(q, k, v, out, lse, torch.empty_like(out), None, True,
                                                   "top_left", *DEFAULTS, False)
    for grad, t in zip(grads, (q, k, v)):  # views of a packed buffer: compact, in their axis order
        assert grad.stride() == _layouts.gradient_strides(t.shape, t.stride())
        assert grad.is_contiguous() is False  # bshd order, not bhsd
    out_p, lse_p = torch.ops.stridedfa.packed_attention_forward(qkv, 2, "bshd", None, None, True,
                                                                "top_left", *DEFAULTS, True)
    assert out_p.shape == (2, 64, 4, 64) and out_p.is_contiguous()
    grad_packed, grad_q, _, _ = torch.ops.stridedfa.packed_attention_backward(
        qkv, 2, "bshd", None, out_p, lse_p, torch.empty_like(out_p), None, True, "top_left", *DEFAULTS, False)
    assert grad_packed.shape == qkv.shape and grad_packed.stride() == qkv.stride()
    assert grad_q.numel() == 0


def test_extent1_axes_do_not_steer_the_output_layout():
    # The same memory described with different (arbitrary) strides on its extent-1 axis.
    a = _layouts.output_strides((2, 1, 64, 32), (2048, 32, 32, 1))
    b = _layouts.output_strides((2, 1, 64, 32), (2048, 99999, 32, 1))
    assert a == b


def test_exchange_api_allocation_on_cpu_tensors():
    like = torch.randn(2, 3, 4, 8)
    t = _core._allocate_like(like, (2, 5, 3, 8), (120, 8, 40, 1))
    assert type(t) is torch.Tensor and t.shape == (2, 5, 3, 8) and t.stride() == (120, 8, 40, 1)
    assert t.dtype == like.dtype and t.device == like.device
    t.fill_(2.0)  # the whole strided extent is backed by memory
    assert t.sum().item() == 2.0 * t.numel()
    empty = _core._allocate_like(like, (2, 0, 3, 8), (0, 8, 40, 1))
    assert empty.numel() == 0


def test_cpu_tensors_get_a_layout_error_not_an_allocation():
    x = torch.randn(1, 2, 16, 16, dtype=torch.bfloat16)
    with pytest.raises(stridedfa.LayoutError, match="CUDA device"):
        sfa_torch.attention(x, x, x)


def _block(entry, x, w_qkv, w_o, h=4, d=64, window=None):
    b, s, _ = x.shape
    qkv = (x @ w_qkv).view(b, s, 3, h, d)
    if entry == "packed":
        out = sfa_torch.packed_attention(qkv, 2, causal=True, window=window)
    else:
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        out = sfa_torch.attention(q, k, v, causal=True, window=window).transpose(1, 2)
    return out.reshape(b, s, h * d) @ w_o


@pytest.mark.parametrize("window", [None, (16, 0)])
@pytest.mark.parametrize("entry", ["packed", "views"])
def test_block_traces_fullgraph_with_backward_and_no_recompile(entry, window):
    """Dynamo + AOTAutograd trace the block (forward and backward) on meta tensors in one graph;
    a second call with equal shapes and strides reuses it."""
    import torch._dynamo.testing

    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(lambda *a: _block(entry, *a, window=window), fullgraph=True, backend=counter)
    args = [torch.empty(2, 64, 256, **META, requires_grad=True),
            torch.empty(256, 768, **META, requires_grad=True),
            torch.empty(256, 256, **META, requires_grad=True)]
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled(*args).sum().backward()
        fresh = [a.detach().clone().requires_grad_() for a in args]
        compiled(*fresh).sum().backward()
    assert counter.frame_count == 1
    assert all(a.grad is not None and a.grad.shape == a.shape for a in args)
    ops = {str(node.target) for node in counter.graphs[0].graph.nodes if node.op == "call_function"}
    want = "stridedfa.packed_attention_forward" if entry == "packed" else "stridedfa.attention_forward"
    assert any(want in op for op in ops), ops


@pytest.mark.parametrize("args,error", [
    (dict(dim=1), stridedfa.LayoutError),
    (dict(dim=7), ValueError),
    (dict(dim=2, layout="bsdx"), ValueError),
])
def test_packed_attention_argument_errors(args, error):
    qkv, _ = _packed_views()
    with pytest.raises(error):
        sfa_torch.packed_attention(qkv, **args)


def test_fake_kernels_trace_with_symbolic_shapes():
    """Dynamic shapes (what opcheck's aot_dispatch_dynamic and torch.compile(dynamic=True) use):
    the fake kernels must accept SymInt shapes and strides."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(qkv):
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        out, lse = torch.ops.stridedfa.attention_forward(q, k, v, None, True, "top_left", *DEFAULTS, True)
        grads = torch.ops.stridedfa.attention_backward(q, k, v, out, lse, out, None, True, "top_left", *DEFAULTS,
                                                       False)
        out_p, lse_p = torch.ops.stridedfa.packed_attention_forward(qkv, 2, "bshd", None, None, True,
                                                                    "top_left", *DEFAULTS, True)
        grad_p, _, _, _ = torch.ops.stridedfa.packed_attention_backward(qkv, 2, "bshd", None, out_p, lse_p,
                                                                     out_p, None, True, "top_left", *DEFAULTS,
                                                                     False)
        return (out, *grads, out_p, grad_p)

    qkv = torch.empty(2, 64, 3, 4, 32, **META)
    graph = make_fx(step, tracing_mode="symbolic")(qkv)
    targets = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
    assert sum("stridedfa" in t for t in targets) == 4


def test_dense_packed_gradient_keeps_the_packed_strides():
    qkv, _ = _packed_views()
    assert _core._gradient_strides(tuple(qkv.shape), qkv.stride()) == qkv.stride()
    padded = torch.empty(2, 64, 3, 4, 80, **META)[..., :64]
    assert _core._gradient_strides(tuple(padded.shape), padded.stride()) == (49152, 768, 256, 64, 1)


@pytest.mark.parametrize("window, error", [((-2, 0), ValueError), ((1.5, 0), TypeError), ((1, 2, 3), TypeError)])
def test_torch_attention_refuses_bad_windows_by_name(window, error):
    q = torch.zeros(1, 2, 16, 64, dtype=torch.bfloat16)
    with pytest.raises(error, match="window"):
        sfa_torch.attention(q, q, q, window=window)


def test_torch_attention_on_cpu_tensors_names_the_device_with_every_option():
    q = torch.zeros(1, 2, 16, 64, dtype=torch.bfloat16)
    lengths = torch.tensor([16], dtype=torch.int32)
    with pytest.raises(stridedfa.LayoutError, match="CUDA device"):
        sfa_torch.attention(q, q, q, causal=True, window=(7, 0), softcap=30.0, seqlens_q=lengths, seqlens_kv=lengths,
                            sinks=torch.zeros(2), deterministic=True, return_lse=True)


@pytest.mark.parametrize("options,operator", [
    (dict(causal=True), "stridedfa.attention_inference_basic"),
    (dict(window=(8, 0)), "stridedfa.attention_inference.default"),
    (dict(softcap=30.0), "stridedfa.attention_inference.default"),
])
def test_inference_calls_record_the_operator_with_the_fewest_arguments(options, operator):
    """A traced call without gradient records the basic operator unless a variant option is set
    (the dispatcher boxes each argument on every call of the compiled graph)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    q = k = v = torch.empty(2, 4, 64, 32, **META)
    graph = make_fx(lambda q, k, v: sfa_torch.attention(q, k, v, **options))(q, k, v)
    targets = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
    assert len(targets) == 1 and targets[0].startswith(operator), targets


@pytest.mark.parametrize("q_order", ["bhsd", "bshd"])
def test_paged_operator_fake_gives_out_in_the_axis_order_of_q(q_order):
    """paged_forward (defined with torch.library, like the dense operators) allocates out by the
    layout rule, so eager calls (the core's allocation) and traced ones (the fake) agree."""
    op = torch.ops.stridedfa.paged_forward.default
    assert str(op._schema) == (
        "stridedfa::paged_forward(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, Tensor seqlens_kv, "
        "float? scale, bool causal, str causal_alignment, int window_left, int window_right, float? softcap) -> Tensor")
    q = (torch.empty(3, 32, 5, 128, **META) if q_order == "bhsd"
         else torch.empty(3, 5, 32, 128, **META).transpose(1, 2))
    cache = torch.empty(40, 16, 8, 128, **META).transpose(1, 2)  # (blocks, h_kv, block, d) views
    table = torch.empty(3, 4, device="meta", dtype=torch.int32)
    lengths = torch.empty(3, device="meta", dtype=torch.int32)
    out = op(q, cache, cache, table, lengths, None, True, "bottom_right", -1, -1, None)
    assert out.shape == (3, 32, 5, 128)
    assert out.stride() == _layouts.output_strides(out.shape, q.stride())


def test_attention_with_kvcache_on_cpu_tensors_names_the_device():
    q = torch.zeros(2, 4, 1, 64, dtype=torch.bfloat16)
    cache = torch.zeros(8, 2, 16, 64, dtype=torch.bfloat16)
    table = torch.zeros(2, 4, dtype=torch.int32)
    lengths = torch.full((2,), 3, dtype=torch.int32)
    with pytest.raises(stridedfa.LayoutError, match="CUDA device"):
        sfa_torch.attention_with_kvcache(q, cache, cache, table, lengths)


WINDOWS = [None, (None, None), (4, None), (None, 0), (0, 7), [3, 2], (2**31 - 2, 0), (2**31 - 1, 0), (-1, 0),
           (0, -5), (True, 0), (1.0, 0), ("1", 0), (1,), (1, 2, 3), 5, "(1, 2)"]


@pytest.mark.parametrize("window", WINDOWS, ids=repr)
def test_torch_window_parse_answers_as_the_cores(window):
    """_torch_ops._bounds restates the core's window parse (torch.compile cannot call the compiled
    module): the same bounds, or the same error type and message, for every input."""
    import numpy as np

    from stridedfa._torch_ops import _bounds

    def answer(parse, w):
        try:
            return parse(w)
        except (TypeError, ValueError) as error:
            return type(error), str(error)

    assert answer(_bounds, window) == answer(_core._window_bounds, window)
    if isinstance(window, tuple) and len(window) == 2 and all(type(b) is int for b in window):
        as_numpy = tuple(np.int64(b) for b in window)
        assert answer(_bounds, as_numpy) == answer(_core._window_bounds, as_numpy)
        numpy_bool = (np.True_, window[1])  # a bool, whatever NumPy names its type
        assert answer(_bounds, numpy_bool)[0] is TypeError
        assert answer(_bounds, numpy_bool) == answer(_core._window_bounds, numpy_bool)



@pytest.mark.parametrize("window", [(47, None), (15, 0), None], ids=repr)
def test_torch_window_parse_traces_under_fullgraph_compile(window):
    """attention() parses the window in Python so that torch.compile traces it: under
    fullgraph=True a bound taken through ``__index__()`` broke the graph (GPU run 59)."""
    from stridedfa._torch_ops import _bounds

    def bounds_as_tensor(x):
        left, right = _bounds(window)
        return x + left + right

    x = torch.zeros(2)
    compiled = torch.compile(bounds_as_tensor, fullgraph=True, backend="eager")
    assert torch.equal(compiled(x), bounds_as_tensor(x))

PACKED_CASES = [  # (packed shape, dim, layout, separate q shape or None)
    ((2, 16, 3, 4, 64), 2, "bshd", None),
    ((16, 2, 3, 4, 64), 2, "sbhd", None),
    ((2, 16, 4, 3, 64), 3, "bshd", None),
    ((2, 4, 3, 16, 64), 2, "bhsd", None),
    ((1, 16, 3, 1, 64), 2, "bshd", None),
    ((2, 16, 2, 2, 64), 2, "bshd", (2, 16, 4, 64)),
]


@pytest.mark.parametrize("shape, dim, layout, q_shape", PACKED_CASES, ids=str)
def test_packed_outputs_follow_the_fakes_and_slice_one_gradient(shape, dim, layout, q_shape):
    """PackedOutputs (the packed entry points' allocation, on CPU tensors): out in the layout's axes
    with the strides the fake kernel gives; in the backward ONE gradient buffer of packed's
    strides whose slices are the slots of dQ (unless q is separate, then its own gradient as the
    fake's), dK and dV."""
    from stridedfa._torch_packed import _to_logical, _unpack
    packed = torch.randn(shape, dtype=torch.bfloat16)
    q = None if q_shape is None else torch.randn(q_shape, dtype=torch.bfloat16)
    perm = _to_logical(layout)
    q_l, _, v_l = _unpack(packed, dim, q)
    out, _, _, given = _core._packed_allocate(packed, dim, perm, q, False)
    assert out.shape == (*q_l.shape[:-1], v_l.shape[-1])
    assert out.stride() == _layouts.output_strides(out.shape, q_l.stride())
    assert given["out"] == (out.data_ptr(), out.permute(perm).stride())
    _, grad_packed, grad_q, given = _core._packed_allocate(packed, dim, perm, q, True)
    assert grad_packed.shape == packed.shape
    assert grad_packed.stride() == _layouts.gradient_strides(packed.shape, packed.stride())
    grad_slices = _unpack(grad_packed, dim, grad_q)
    for name, grad in zip(("grad_q", "grad_k", "grad_v"), grad_slices):
        assert given[name] == (grad.data_ptr(), grad.permute(perm).stride()), name
    if q is not None:
        assert grad_q.stride() == _layouts.gradient_strides(q.shape, q.stride())
    else:
        assert grad_q is None
