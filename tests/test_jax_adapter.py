"""stridedfa.jax without a GPU: lazy import, clear errors for a missing or old JAX, trace-time
validation, the custom calls and attributes it lowers to, the handlers' decoding of them, and the
graph-cache keys it shares with other callers. (GPU behaviour: tests/gpu/test_jax.py.)"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import stridedfa
from helpers.fake_dlpack import FakeTensor, row_major
from stridedfa import _core


def run_python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=300, check=False)


# --- Import behaviour (no JAX needed) -----------------------------------------------------------

def test_import_stridedfa_does_not_import_jax():
    result = run_python("""
        import sys
        import stridedfa
        stridedfa.info(); stridedfa.cache_info(); stridedfa.sdpa_forward
        loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib'))
        assert not loaded, loaded
        print('ok')
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@pytest.mark.parametrize("spelling", ["import stridedfa.jax", "import stridedfa; stridedfa.jax"])
def test_missing_jax_raises_clear_import_error(spelling):
    result = run_python(f"""
        import sys
        sys.modules['jax'] = None  # what an uninstalled package looks like to import
        try:
            {spelling}
        except ImportError as error:
            print('ImportError:', error)
        else:
            print('imported')
    """)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("ImportError:"), out
    assert "stridedfa.jax needs JAX >= 0.6.2" in out
    assert "pip install" in out


@pytest.mark.parametrize("version, with_ffi", [("0.4.20", False), ("0.5.3", True), ("0.7.0", False)])
def test_old_or_incomplete_jax_raises_version_error(version, with_ffi):
    result = run_python(f"""
        import sys, types
        jax = types.ModuleType('jax'); jax.__version__ = {version!r}; jax.__path__ = []
        sys.modules['jax'] = jax
        if {with_ffi}:
            ffi = types.ModuleType('jax.ffi')
            ffi.ffi_call = ffi.register_ffi_target = lambda *a, **k: None
            sys.modules['jax.ffi'] = jax.ffi = ffi
        try:
            import stridedfa.jax
        except ImportError as error:
            print('ImportError:', error)
        else:
            print('imported')
    """)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("ImportError:"), out
    assert f"found jax {version}" in out
    assert "JAX >= 0.6.2" in out and "jax.ffi.ffi_call" in out


def test_capsules_exist_and_differ():
    targets = _core._jax_ffi_targets()
    assert set(targets) == {"stridedfa_sdpa_forward", "stridedfa_sdpa_forward_inference",
                            "stridedfa_sdpa_backward"}
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    pointers = {name: get(capsule, None) for name, capsule in targets.items()}
    assert all(pointers.values()), pointers
    assert len(set(pointers.values())) == 3


# --- The views the handlers build, and the graphs they share (no JAX needed) ------------------------

B, H_Q, H_KV, S_Q, S_KV, D = 2, 8, 2, 128, 256, 64


def _fake(shape, strides, dtype="bfloat16", slot=0):
    return FakeTensor(shape, strides, dtype, data=0x100000000000 + slot * (1 << 30))


def _bshd_view(b, h, s, d, dtype="bfloat16", slot=0):
    """A torch-style x.transpose(1, 2) of a contiguous (b, s, h, d) tensor, as a fake DLPack tensor."""
    return _fake((b, h, s, d), (s * h * d, d, h * d, 1), dtype, slot)


def _bhsd_view(b, h, s, d, dtype="bfloat16", slot=0):
    return _fake((b, h, s, d), row_major((b, h, s, d)), dtype, slot)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("with_lse", [True, False])
def test_forward_graph_key_equals_other_callers(layout, with_lse):
    """A JAX call and an sdpa_forward/torch call on arrays with the same memory layout get the same
    cache key, hence the same cuDNN graph."""
    view = _bshd_view if layout == "bshd" else _bhsd_view
    shape = (lambda b, h, s, d: (b, s, h, d)) if layout == "bshd" else (lambda b, h, s, d: (b, h, s, d))
    options = {"scale": 0.125, "causal": True, "causal_alignment": "bottom_right"}
    lse = _fake((B, H_Q, S_Q), row_major((B, H_Q, S_Q)), "float32", 4) if with_lse else None
    expected = _core._forward_graph_key(view(B, H_Q, S_Q, D, slot=0), view(B, H_KV, S_KV, D, slot=1),
                                        view(B, H_KV, S_KV, D, slot=2), view(B, H_Q, S_Q, D, slot=3), lse,
                                        **options)
    shapes = (shape(B, H_Q, S_Q, D), shape(B, H_KV, S_KV, D), shape(B, H_KV, S_KV, D), shape(B, H_Q, S_Q, D),
              (B, H_Q, S_Q) if with_lse else None)
    key = _core._jax_graph_key(False, {"bshd": 0, "bhsd": 1}[layout], shapes, "bfloat16", **options)
    assert key == expected


def test_graph_key_depends_on_layout():
    """Same shapes, other axis order: other strides, so another graph (never a wrong one)."""
    shapes = ((B, 16, 16, D),) * 4 + ((B, 16, 16),)
    assert _core._jax_graph_key(False, 0, shapes, "float16") != _core._jax_graph_key(False, 1, shapes, "float16")


def _core_backward_operands():
    """q, k, v, out, grad_out, lse and (grad_q, grad_k, grad_v) as the handler's bshd views of the
    JAX_BACKWARD shapes, for keys computed through the core's own entry points."""
    q, k, v = _bshd_view(B, H_Q, S_Q, D, slot=0), _bshd_view(B, H_KV, S_KV, D, slot=1), \
        _bshd_view(B, H_KV, S_KV, D, slot=2)
    out, grad_out = _bshd_view(B, H_Q, S_Q, D, slot=3), _bshd_view(B, H_Q, S_Q, D, slot=5)
    lse = _fake((B, H_Q, S_Q), row_major((B, H_Q, S_Q)), "float32", 4)
    grads = (_bshd_view(B, H_Q, S_Q, D, slot=6), _bshd_view(B, H_KV, S_KV, D, slot=7),
             _bshd_view(B, H_KV, S_KV, D, slot=8))
    return q, k, v, out, grad_out, lse, grads


# The handlers' optional_operands bits by operand (1 << the operand's slot in the core's table).
BITS = _core._jax_optional_operands()


def _bits(*names: str) -> int:
    return sum(BITS[name] for name in names)


def _assert_forward_and_backward_take(calls, optional_operands: int, last: str, first: str) -> None:
    """A forward and a backward custom call, each with these optional-operand bits, its last operand
    of type `last` (one shared, unbroadcast array under jax.vmap) and its first (q) of type `first`."""
    assert len(calls) == 2, calls
    for call in calls:
        arguments = re.search(r"\} : \((.*)\) -> ", call).group(1).split(", ")
        assert f"optional_operands = {optional_operands} : i64" in call and arguments[-1] == last, call
        assert arguments[0] == first, arguments


def test_backward_graph_key_equals_other_callers():
    q, k, v, out, grad_out, lse, grads = _core_backward_operands()
    expected = _core._backward_graph_key(q, k, v, out, grad_out, lse, *grads, causal=True)
    qs, kvs = (B, S_Q, H_Q, D), (B, S_KV, H_KV, D)
    key = _core._jax_graph_key(True, 0, (qs, kvs, kvs, qs, (B, H_Q, S_Q), qs, qs, kvs, kvs), "bfloat16",
                               causal=True)
    assert key == expected


def test_vmapped_arrays_fold_into_batch():
    """Under jax.vmap the handler sees extra leading axes; row-major buffers let them fold into b."""
    folded = _core._validate_shapes(False, 0, ((3, B, S_Q, H_Q, D), (3, B, S_KV, H_KV, D), (3, B, S_KV, H_KV, D),
                                            (3, B, S_Q, H_Q, D), (3, B, H_Q, S_Q)), "float16")
    assert (folded["b"], folded["h_q"], folded["h_kv"], folded["s_q"], folded["s_kv"]) == \
        (3 * B, H_Q, H_KV, S_Q, S_KV)
    key_5d = _core._jax_graph_key(False, 1, ((3, B, H_Q, S_Q, D), (3, B, H_KV, S_KV, D), (3, B, H_KV, S_KV, D),
                                             (3, B, H_Q, S_Q, D), None), "float16")
    key_4d = _core._jax_graph_key(False, 1, ((3 * B, H_Q, S_Q, D), (3 * B, H_KV, S_KV, D),
                                             (3 * B, H_KV, S_KV, D), (3 * B, H_Q, S_Q, D), None), "float16")
    assert key_5d == key_4d


def test_core_validation_of_handler_views_is_typed():
    qs, kvs = (B, S_Q, H_Q, D), (B, S_KV, 3, D)
    with pytest.raises(stridedfa.LayoutError, match="heads"):
        _core._validate_shapes(False, 0, (qs, kvs, kvs, qs, (B, H_Q, S_Q)), "bfloat16")
    with pytest.raises(stridedfa.LayoutError, match="4 axes"):
        _core._validate_shapes(False, 0, ((S_Q, H_Q, D), kvs, kvs, qs, (B, H_Q, S_Q)), "bfloat16")
    with pytest.raises(stridedfa.LayoutError, match="layout"):
        _core._validate_shapes(False, 7, (qs, qs, qs, qs, (B, H_Q, S_Q)), "bfloat16")
    with pytest.raises(stridedfa.LayoutError, match="float16 or bfloat16"):
        _core._validate_shapes(False, 0, (qs, qs, qs, qs, (B, H_Q, S_Q)), "int8")


# --- The score bias: its views, validation and graph keys (no JAX needed) --------------------------

BIAS_SHAPES = [(B, H_Q, S_Q, S_KV), (1, H_Q, S_Q, S_KV), (B, 1, 1, S_KV), (S_Q, S_KV), (S_KV,), (H_Q, 1, S_KV)]
JAX_FORWARD = ((B, S_Q, H_Q, D), (B, S_KV, H_KV, D), (B, S_KV, H_KV, D), (B, S_Q, H_Q, D), (B, H_Q, S_Q))
JAX_BACKWARD = JAX_FORWARD[:5] + (JAX_FORWARD[0], JAX_FORWARD[0], JAX_FORWARD[1], JAX_FORWARD[2])


def _bias(shape, slot=13, dtype="bfloat16"):
    return _fake(shape, row_major(shape), dtype, slot)


@pytest.mark.parametrize("bias_shape", BIAS_SHAPES, ids=str)
def test_bias_graph_keys_equal_other_callers(bias_shape):
    """A JAX call with a bias of its own rank (the core broadcasts it) keys the graph of an
    sdpa_forward / sdpa_backward call with a dense bias of that shape; the bias is in the key."""
    q, k, v, out, grad_out, lse, grads = _core_backward_operands()
    bias = (bias_shape, "bfloat16")
    forward = _core._jax_graph_key(False, 0, JAX_FORWARD, "bfloat16", causal=True, bias=bias)
    assert forward == _core._forward_graph_key(q, k, v, out, lse, causal=True, bias=_bias(bias_shape))
    assert forward != _core._jax_graph_key(False, 0, JAX_FORWARD, "bfloat16", causal=True)
    # A bias that is not differentiated: the backward reads it and computes no grad_bias.
    constant = _core._jax_graph_key(True, 0, JAX_BACKWARD, "bfloat16", causal=True, bias=bias, grad_bias=False)
    assert constant == _core._backward_graph_key(q, k, v, out, grad_out, lse, *grads, causal=True,
                                                 bias=_bias(bias_shape))
    assert constant != _core._jax_graph_key(True, 0, JAX_BACKWARD, "bfloat16", causal=True)
    if len(bias_shape) < 2 or bias_shape[-2] == 1:  # rows shared: cuDNN's dbias is wrong, refused
        with pytest.raises(stridedfa.UnsupportedError, match="shared over query rows"):
            _core._jax_graph_key(True, 0, JAX_BACKWARD, "bfloat16", causal=True, bias=bias)
        return
    backward = _core._jax_graph_key(True, 0, JAX_BACKWARD, "bfloat16", causal=True, bias=bias)
    assert backward == _core._backward_graph_key(q, k, v, out, grad_out, lse, *grads, causal=True,
                                                 bias=_bias(bias_shape), grad_bias=_bias(bias_shape, 14))
    assert backward not in (constant, _core._jax_graph_key(True, 0, JAX_BACKWARD, "bfloat16", causal=True))


def test_bias_shapes_are_part_of_the_key():
    keys = {shape: _core._jax_graph_key(False, 0, JAX_FORWARD, "bfloat16", bias=(shape, "bfloat16"))
            for shape in [(B, H_Q, S_Q, S_KV), (1, H_Q, S_Q, S_KV), (B, 1, 1, S_KV), (1, 1, S_Q, S_KV)]}
    assert len(set(keys.values())) == len(keys)
    # Fewer axes are leading axes of 1: the same graph as the 4-axis spelling.
    assert _core._jax_graph_key(False, 0, JAX_FORWARD, "bfloat16", bias=((S_Q, S_KV), "bfloat16")) == \
        keys[(1, 1, S_Q, S_KV)]


@pytest.mark.parametrize("bias_shape", BIAS_SHAPES, ids=str)
@pytest.mark.parametrize("backward, grad_bias", [(False, False), (True, True), (True, False)])
def test_bias_of_its_own_rank_validates(bias_shape, backward, grad_bias):
    shapes = JAX_BACKWARD if backward else JAX_FORWARD
    if grad_bias and (len(bias_shape) < 2 or bias_shape[-2] == 1):  # rows shared: cuDNN's dbias is wrong
        with pytest.raises(stridedfa.UnsupportedError, match="grad_bias: the gradient of a bias shared over query"):
            _core._validate_shapes(backward, 0, shapes, "bfloat16", bias=(bias_shape, "bfloat16"), grad_bias=True)
        return
    problem = _core._validate_shapes(backward, 0, shapes, "bfloat16", bias=(bias_shape, "bfloat16"),
                                     grad_bias=grad_bias)
    assert (problem["b"], problem["h_q"], problem["s_q"], problem["s_kv"]) == (B, H_Q, S_Q, S_KV)


@pytest.mark.parametrize("bias, message", [
    (((B, 3, S_Q, S_KV), "bfloat16"), r"bias: shape \(2, 3, 128, 256\) is not broadcastable .* axis 1 \(heads\) is 3"),
    (((S_Q, S_KV + 1), "bfloat16"), r"axis 1 \(seq of k\) is 257, expected 256"),
    (((S_KV, S_Q), "bfloat16"), "is not broadcastable"),
    (((1, B, H_Q, S_Q, S_KV), "bfloat16"), "expected up to 4 axes"),
    (((), "bfloat16"), "expected up to 4 axes"),
    (((S_Q, S_KV), "float16"), "share one dtype"),
    (((S_Q, S_KV), "float32"), "bias: dtype float32 is not supported"),
])
@pytest.mark.parametrize("backward", [False, True])
def test_bad_bias_is_refused_by_the_core(bias, message, backward):
    with pytest.raises(stridedfa.LayoutError, match=message):
        _core._validate_shapes(backward, 0, JAX_BACKWARD if backward else JAX_FORWARD, "bfloat16", bias=bias)


def _vmapped(calls, shapes):
    return tuple(None if shape is None else (calls, *shape) for shape in shapes)


@pytest.mark.parametrize("backward", [False, True])
def test_vmapped_bias_with_the_batch_axis_folds_into_the_batch(backward):
    """Under jax.vmap every operand gets the mapped axes in front (vmap_method broadcast_all). A
    bias with q's batch axis folds with them into the batch, like q; the key is that of the same
    problem with the batch folded by hand."""
    shapes = JAX_BACKWARD if backward else JAX_FORWARD
    # (a bias shared over rows has no gradient: the backward would refuse its grad_bias)
    for bias_shape in [(B, H_Q, S_Q, S_KV)] + ([] if backward else [(B, 1, 1, S_KV)]):
        problem = _core._validate_shapes(backward, 0, _vmapped(3, shapes), "bfloat16",
                                      bias=((3, *bias_shape), "bfloat16"))
        assert problem["b"] == 3 * B
        folded = tuple(None if s is None else (3 * B, *s[1:]) for s in shapes)
        assert _core._jax_graph_key(backward, 0, _vmapped(3, shapes), "bfloat16", bias=((3, *bias_shape), "bfloat16")) \
            == _core._jax_graph_key(backward, 0, folded, "bfloat16", bias=((3 * B, *bias_shape[1:]), "bfloat16"))


@pytest.mark.parametrize("bias_shape", [(S_Q, S_KV), (1, H_Q, S_Q, S_KV), (H_Q, 1, S_KV)], ids=str)
@pytest.mark.parametrize("backward", [False, True])
def test_vmapped_bias_shared_across_the_batch_is_refused(bias_shape, backward):
    """A bias without q's batch axis cannot fold with vmap's axes into one batch stride: refused
    with the way out, never read wrongly."""
    shapes = JAX_BACKWARD if backward else JAX_FORWARD
    with pytest.raises(stridedfa.LayoutError, match=r"bias: under jax.vmap .* needs q's batch axis: give it shape "
                                                    r"\(2, heads of q or 1, seq of q or 1, seq of k\)"):
        _core._validate_shapes(backward, 0, _vmapped(3, shapes), "bfloat16", bias=((3, *bias_shape), "bfloat16"))


def test_vmapped_bias_of_one_batch_or_one_call_folds():
    """With a batch of 1, or a mapped axis of extent 1, a shared bias is still one stride."""
    one = tuple(None if s is None else (1, *s[1:]) for s in JAX_FORWARD)
    assert _core._validate_shapes(False, 0, _vmapped(3, one), "bfloat16", bias=((3, S_Q, S_KV), "bfloat16"))["b"] == 3
    assert _core._validate_shapes(False, 0, _vmapped(1, JAX_FORWARD), "bfloat16",
                               bias=((1, S_Q, S_KV), "bfloat16"))["b"] == B
    with pytest.raises(stridedfa.LayoutError, match="besides jax.vmap's 1"):
        _core._validate_shapes(False, 0, _vmapped(3, JAX_FORWARD), "bfloat16", bias=((3,), "bfloat16"))


# --- The ALiBi slopes: their views, validation and graph keys (no JAX needed) ----------------------

def _slopes(shape=(H_Q,), dtype="float32"):
    return _fake(shape, row_major(shape), dtype, 15)


@pytest.mark.parametrize("options", [{"causal": True}, {}, {"causal": True, "causal_alignment": "bottom_right"}],
                         ids=["causal", "bidirectional", "bottom_right"])
def test_alibi_graph_keys_equal_other_callers(options):
    """A JAX call with ALiBi slopes keys the graph of an sdpa_forward / sdpa_backward call with the
    same slopes (an input of both; no gradient); the slopes are in the key."""
    q, k, v, out, grad_out, lse, grads = _core_backward_operands()
    slopes = ((H_Q,), "float32")
    forward = _core._jax_graph_key(False, 0, JAX_FORWARD, "bfloat16", alibi_slopes=slopes, **options)
    assert forward == _core._forward_graph_key(q, k, v, out, lse, alibi_slopes=_slopes(), **options)
    assert forward != _core._jax_graph_key(False, 0, JAX_FORWARD, "bfloat16", **options)
    backward = _core._jax_graph_key(True, 0, JAX_BACKWARD, "bfloat16", alibi_slopes=slopes, **options)
    assert backward == _core._backward_graph_key(q, k, v, out, grad_out, lse, *grads, alibi_slopes=_slopes(),
                                                 **options)
    assert backward != _core._jax_graph_key(True, 0, JAX_BACKWARD, "bfloat16", **options)


@pytest.mark.parametrize("backward", [False, True])
def test_alibi_slopes_validate(backward):
    shapes = JAX_BACKWARD if backward else JAX_FORWARD
    problem = _core._validate_shapes(backward, 0, shapes, "bfloat16", alibi_slopes=((H_Q,), "float32"))
    assert (problem["b"], problem["h_q"], problem["s_q"], problem["s_kv"]) == (B, H_Q, S_Q, S_KV)
    problem = _core._validate_shapes(backward, 0, shapes, "bfloat16", sinks=((H_Q,), "float32"),
                                  bias=((S_Q, S_KV), "bfloat16"), grad_bias=False,
                                  alibi_slopes=((H_Q,), "float32"))
    assert problem["h_q"] == H_Q


@pytest.mark.parametrize("slopes, message", [
    (((H_KV,), "float32"), r"^alibi_slopes: shape .* does not match \(heads of q,\) .* axis 0 \(heads\) is 2, "
                           r"expected 8"),
    (((B, H_Q), "float32"), r"^alibi_slopes: expected shape \(heads of q,\)"),
    (((), "float32"), r"^alibi_slopes: expected shape \(heads of q,\)"),
    (((H_Q,), "bfloat16"), r"^alibi_slopes: dtype bfloat16 is not supported; .*float32"),
    (((H_Q,), "float16"), r"^alibi_slopes: dtype float16 is not supported; .*float32"),
    (((H_Q,), "int32"), r"^alibi_slopes: dtype int32 is not supported"),
])
@pytest.mark.parametrize("backward", [False, True])
def test_bad_alibi_slopes_are_refused_by_the_core(slopes, message, backward):
    with pytest.raises(stridedfa.LayoutError, match=message):
        _core._validate_shapes(backward, 0, JAX_BACKWARD if backward else JAX_FORWARD, "bfloat16", alibi_slopes=slopes)


@pytest.mark.parametrize("backward", [False, True])
def test_vmapped_alibi_slopes_stay_one_set(backward):
    """Under jax.vmap stridedfa.jax keeps the slopes unmapped (one (h_q,) array) while q, k, v get
    the mapped axes in front: the key is that of the problem with the batch folded by hand."""
    shapes = JAX_BACKWARD if backward else JAX_FORWARD
    folded = tuple(None if s is None else (3 * B, *s[1:]) for s in shapes)
    slopes = ((H_Q,), "float32")
    vmapped = _core._jax_graph_key(backward, 0, _vmapped(3, shapes), "bfloat16", alibi_slopes=slopes)
    assert vmapped == _core._jax_graph_key(backward, 0, folded, "bfloat16", alibi_slopes=slopes)
    assert _core._validate_shapes(backward, 0, _vmapped(3, shapes), "bfloat16", alibi_slopes=slopes)["b"] == 3 * B
    with pytest.raises(stridedfa.LayoutError, match=r"^alibi_slopes: expected shape \(heads of q,\)"):
        _core._validate_shapes(backward, 0, _vmapped(3, shapes), "bfloat16", alibi_slopes=((3, H_Q), "float32"))


def test_alibi_with_a_bias_gradient_is_refused_by_the_core():
    """The core refuses a bias' gradient with ALiBi (cuDNN's dbias under a score modifier is wrong);
    a constant bias with ALiBi is fine."""
    slopes, bias = ((H_Q,), "float32"), ((B, H_Q, S_Q, S_KV), "bfloat16")
    with pytest.raises(stridedfa.UnsupportedError, match="bias' gradient with ALiBi"):
        _core._jax_graph_key(True, 0, JAX_BACKWARD, "bfloat16", bias=bias, alibi_slopes=slopes)
    assert _core._jax_graph_key(True, 0, JAX_BACKWARD, "bfloat16", bias=bias, grad_bias=False, alibi_slopes=slopes)


# --- Dropout's Philox state: its view, validation and graph keys (no JAX needed) -------------------

JAX_STATE = ((4,), "uint32")  # what stridedfa.jax passes: jax.random.bits(key, (4,), jnp.uint32)


def _core_state():
    return _fake((2,), (1,), "int64", 16)


@pytest.mark.parametrize("options", [{}, {"causal": True}, {"causal": True, "causal_alignment": "bottom_right"}],
                         ids=["bidirectional", "causal", "bottom_right"])
@pytest.mark.parametrize("state", [JAX_STATE, ((2,), "int64"), ((2,), "uint64"), ((4,), "int32")], ids=str)
def test_dropout_graph_keys_equal_other_callers(options, state):
    """The handler reads a uint32 (4,) state (or an int64/uint64 (2,) one) as the core's int64 (2,)
    rng_state: the key is an sdpa_forward / sdpa_backward call's with the same dropout_p, and
    dropout_p is in it."""
    q, k, v, out, grad_out, lse, grads = _core_backward_operands()
    forward = _core._jax_graph_key(False, 0, JAX_FORWARD, "bfloat16", dropout_p=0.2, rng_state=state, **options)
    assert forward == _core._forward_graph_key(q, k, v, out, lse, dropout_p=0.2, rng_state=_core_state(), **options)
    assert forward != _core._jax_graph_key(False, 0, JAX_FORWARD, "bfloat16", **options)
    assert forward != _core._jax_graph_key(False, 0, JAX_FORWARD, "bfloat16", dropout_p=0.1, rng_state=state,
                                           **options)
    backward = _core._jax_graph_key(True, 0, JAX_BACKWARD, "bfloat16", dropout_p=0.2, rng_state=state, **options)
    assert backward == _core._backward_graph_key(q, k, v, out, grad_out, lse, *grads, dropout_p=0.2,
                                                 rng_state=_core_state(), **options)
    assert backward != _core._jax_graph_key(True, 0, JAX_BACKWARD, "bfloat16", **options)
    # With dropout_p=0 the state is not read: the graph without dropout.
    assert _core._jax_graph_key(False, 0, JAX_FORWARD, "bfloat16", rng_state=state, **options) == \
        _core._jax_graph_key(False, 0, JAX_FORWARD, "bfloat16", **options)


@pytest.mark.parametrize("state", [((2,), "uint32"), ((8,), "uint32"), ((4,), "int64"), ((1,), "int64"),
                                   ((2, 2), "uint32"), ((), "uint32"), ((4,), "float32"), ((4,), "int16")],
                         ids=str)
@pytest.mark.parametrize("backward", [False, True])
def test_bad_rng_state_is_refused(state, backward):
    shapes = JAX_BACKWARD if backward else JAX_FORWARD
    with pytest.raises(stridedfa.LayoutError, match=r"^rng_state: expected the Philox seed and offset as a uint32 "
                                                     r"\(4,\) array .* or an int64 \(2,\) one, got "):
        _core._validate_shapes(backward, 0, shapes, "bfloat16", dropout_p=0.2, rng_state=state)


@pytest.mark.parametrize("backward", [False, True])
def test_dropout_validation_through_the_handler_views(backward):
    """dropout_p > 0 needs the state, dropout_p must be a probability; an unmapped state with
    jax.vmap's axes on q, k, v is the folded problem's."""
    shapes = JAX_BACKWARD if backward else JAX_FORWARD
    with pytest.raises(stridedfa.LayoutError, match="dropout_p > 0 needs rng_state"):
        _core._validate_shapes(backward, 0, shapes, "bfloat16", dropout_p=0.2)
    for p in (1.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match=r"dropout_p must be a probability in \[0, 1\)"):
            _core._validate_shapes(backward, 0, shapes, "bfloat16", dropout_p=p, rng_state=JAX_STATE)
    assert _core._validate_shapes(backward, 0, _vmapped(3, shapes), "bfloat16", dropout_p=0.2,
                               rng_state=JAX_STATE)["b"] == 3 * B
    folded = tuple(None if s is None else (3 * B, *s[1:]) for s in shapes)
    assert _core._jax_graph_key(backward, 0, _vmapped(3, shapes), "bfloat16", dropout_p=0.2, rng_state=JAX_STATE) \
        == _core._jax_graph_key(backward, 0, folded, "bfloat16", dropout_p=0.2, rng_state=JAX_STATE)


def test_what_the_plan_refuses_with_dropout_is_refused_while_tracing():
    """Dropout with a bottom-right mask and padding lengths, and the s_q = s_kv = 1 backward, are
    typed errors of _validate_shapes (hence while tracing), not when XLA runs the call."""
    lengths = (((B,), "int32"), ((B,), "int32"))
    for backward in (False, True):
        shapes = JAX_BACKWARD if backward else JAX_FORWARD
        with pytest.raises(stridedfa.UnsupportedError, match="dropout with a bottom-right causal mask or window and "
                                                             "padding lengths"):
            _core._validate_shapes(backward, 0, shapes, "bfloat16", causal=True, causal_alignment="bottom_right",
                                lengths=lengths, dropout_p=0.2, rng_state=JAX_STATE)
        _core._validate_shapes(backward, 0, shapes, "bfloat16", causal=True, lengths=lengths, dropout_p=0.2,
                            rng_state=JAX_STATE)
    q, kv = (B, 1, H_Q, D), (B, 1, H_KV, D)
    single = (q, kv, kv, q, (B, H_Q, 1), q, q, kv, kv)
    with pytest.raises(stridedfa.UnsupportedError, match="s_q = s_kv = 1 .* and dropout is not supported"):
        _core._validate_shapes(True, 0, single, "bfloat16", dropout_p=0.2, rng_state=JAX_STATE)
    _core._validate_shapes(False, 0, single[:5], "bfloat16", dropout_p=0.2, rng_state=JAX_STATE)
    _core._validate_shapes(True, 0, single, "bfloat16")


# --- With JAX (CPU backend) ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def sj():
    pytest.importorskip("jax")
    import stridedfa.jax

    return stridedfa.jax


@pytest.fixture(scope="module")
def jax(sj):
    import jax

    return jax


def _spec(jax, shape, dtype="bfloat16"):
    return jax.ShapeDtypeStruct(shape, jax.numpy.dtype(dtype))


def test_stridedfa_jax_attribute_is_the_module(sj):
    assert stridedfa.jax is sj
    assert callable(sj.attention)


@pytest.mark.parametrize("layout, q, k, v, out", [
    ("bshd", (2, 128, 8, 64), (2, 256, 2, 64), (2, 256, 2, 64), (2, 128, 8, 64)),
    ("bhsd", (2, 8, 128, 64), (2, 2, 256, 64), (2, 2, 256, 32), (2, 8, 128, 32)),
    ("bshd", (1, 16, 4, 128), (1, 16, 1, 128), (1, 16, 1, 128), (1, 16, 4, 128)),
])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_shapes_eval_grad_and_vmap(sj, jax, layout, q, k, v, out, dtype):
    args = [_spec(jax, s, dtype) for s in (q, k, v)]

    def f(q, k, v):
        return sj.attention(q, k, v, layout=layout, causal=True)

    result = jax.eval_shape(f, *args)
    assert (result.shape, str(result.dtype)) == (out, dtype)
    grads = jax.eval_shape(jax.grad(lambda *a: f(*a).astype("float32").sum(), (0, 1, 2)), *args)
    assert [(g.shape, str(g.dtype)) for g in grads] == [(s, dtype) for s in (q, k, v)]
    batched_args = [_spec(jax, (3, *s), dtype) for s in (q, k, v)]
    batched = jax.eval_shape(jax.vmap(f), *batched_args)
    assert batched.shape == (3, *out)
    batched_grads = jax.eval_shape(jax.vmap(jax.grad(lambda *a: f(*a).astype("float32").sum(), (0, 1, 2))),
                                   *batched_args)
    assert [g.shape for g in batched_grads] == [(3, *s) for s in (q, k, v)]
    shared_kv = jax.eval_shape(jax.vmap(f, in_axes=(0, None, None)), batched_args[0], *args[1:])
    assert shared_kv.shape == (3, *out)


def _custom_calls(text: str) -> list[str]:
    return [line for line in text.splitlines() if "custom_call" in line]


def test_lowering_uses_inference_target_and_typed_attributes(sj, jax):
    q, kv = _spec(jax, (2, 128, 8, 64)), _spec(jax, (2, 256, 2, 64))
    f = jax.jit(lambda q, k, v: sj.attention(q, k, v, scale=0.3, causal=True, causal_alignment="bottom_right"))
    calls = _custom_calls(f.lower(q, kv, kv).as_text())
    assert len(calls) == 1 and "@stridedfa_sdpa_forward_inference(" in calls[0], calls
    # The options travel as one dictionary of the core's SdpaOptions fields (the handlers decode the
    # same list, STRIDEDFA_SDPA_OPTION_FIELDS), typed as the handlers read them.
    options = calls[0][calls[0].index("options = {"):]
    options = options[:options.index("}")]
    for attribute in ("causal = true", "alignment = 1 : i64", "has_scale = true", "scale = 3.000000e-01 : f64",
                      "window_left = -1 : i64", "softcap = 0.000000e+00 : f64", "dropout_p = 0.000000e+00 : f64",
                      "deterministic = false", "max_seqlen_q = 0 : i64", "max_seqlen_kv = 0 : i64"):
        assert attribute in options, calls[0]
    assert re.findall(r"(\w+) = ", options[len("options = {"):]) == sorted(_core._sdpa_options())  # every field
    for attribute in ("layout = 0 : i64", "optional_operands = 0 : i64"):
        assert attribute in calls[0], calls[0]


def test_lowering_of_grad_uses_forward_with_statistics_and_backward(sj, jax):
    q, kv = _spec(jax, (2, 8, 128, 64), "float16"), _spec(jax, (2, 2, 256, 64), "float16")
    def loss(q, k, v):
        return sj.attention(q, k, v, layout="bhsd").astype("float32").sum()
    calls = _custom_calls(jax.jit(jax.grad(loss, (0, 1, 2))).lower(q, kv, kv).as_text())
    assert len(calls) == 2, calls
    assert "@stridedfa_sdpa_forward(" in calls[0] and "@stridedfa_sdpa_backward(" in calls[1]
    for call in calls:
        assert "has_scale = false" in call and "layout = 1 : i64" in call and "causal = false" in call


def test_is_causal_alias(sj, jax):
    q = _spec(jax, (1, 16, 2, 64))
    text = jax.jit(lambda q: sj.attention(q, q, q, is_causal=True)).lower(q).as_text()
    assert "causal = true" in _custom_calls(text)[0]
    with pytest.raises(ValueError, match="disagree"):
        jax.eval_shape(lambda q: sj.attention(q, q, q, causal=True, is_causal=False), q)


BAD_CALLS = [
    # (q, k, v, dtypes, kwargs, error, message)
    ((2, 128, 8, 64), (2, 256, 2, 64), (2, 256, 2, 64), ("float32",) * 3, {}, stridedfa.LayoutError,
     "dtype float32 is not supported"),
    ((2, 128, 8, 64), (2, 256, 2, 64), (2, 256, 2, 64), ("bfloat16", "float16", "bfloat16"), {},
     stridedfa.LayoutError, "share one dtype"),
    ((128, 8, 64), (2, 256, 2, 64), (2, 256, 2, 64), ("bfloat16",) * 3, {}, stridedfa.LayoutError,
     r"q: expected 4 axes \(batch, seq, heads, head_dim\)"),
    ((2, 8, 128, 64), (2, 2, 256, 64), (2, 2, 256), ("bfloat16",) * 3, {"layout": "bhsd"}, stridedfa.LayoutError,
     r"v: expected 4 axes \(batch, heads, seq, head_dim\)"),
    ((2, 128, 8, 64), (3, 256, 2, 64), (3, 256, 2, 64), ("bfloat16",) * 3, {}, stridedfa.LayoutError,
     "batch"),
    ((2, 128, 8, 64), (2, 256, 3, 64), (2, 256, 3, 64), ("bfloat16",) * 3, {}, stridedfa.LayoutError,
     "multiple"),
    ((2, 128, 8, 64), (2, 256, 2, 32), (2, 256, 2, 64), ("bfloat16",) * 3, {}, stridedfa.LayoutError,
     "k: head_dim"),
    ((2, 128, 8, 64), (2, 256, 2, 64), (2, 200, 2, 64), ("bfloat16",) * 3, {}, stridedfa.LayoutError,
     r"v: axis 1 \(seq\) is 200"),
    ((2, 128, 8, 64), (2, 256, 2, 64), (2, 256, 4, 64), ("bfloat16",) * 3, {}, stridedfa.LayoutError,
     r"v: axis 2 \(heads\) is 4"),
    ((2, 128, 8, 60), (2, 256, 2, 60), (2, 256, 2, 64), ("float16",) * 3, {}, stridedfa.LayoutError,
     r"stride is head_dim \(60\), which must then be a multiple of 8"),
    ((2, 128, 8, 64), (2, 256, 2, 64), (2, 256, 2, 64), ("bfloat16",) * 3, {"layout": "sbhd"}, ValueError,
     "layout must be"),
    ((2, 128, 8, 64), (2, 256, 2, 64), (2, 256, 2, 64), ("bfloat16",) * 3, {"causal_alignment": "center"},
     ValueError, "causal_alignment"),
    ((2, 128, 8, 64), (2, 256, 2, 64), (2, 256, 2, 64), ("bfloat16",) * 3, {"scale": True}, TypeError,
     "scale"),
    ((2, 128, 8, 64), (2, 256, 2, 64), (2, 256, 2, 64), ("bfloat16",) * 3, {"scale": float("inf")},
     ValueError, "finite"),
]


@pytest.mark.parametrize("q, k, v, dtypes, kwargs, error, message", BAD_CALLS)
@pytest.mark.parametrize("how", ["eval_shape", "jit_lower"])
def test_bad_calls_raise_typed_errors_while_tracing(sj, jax, q, k, v, dtypes, kwargs, error, message, how):
    args = [_spec(jax, s, d) for s, d in zip((q, k, v), dtypes)]

    def f(q, k, v):
        return sj.attention(q, k, v, **kwargs)

    with pytest.raises(error, match=message):
        if how == "eval_shape":
            jax.eval_shape(f, *args)
        else:
            jax.jit(f).lower(*args)


# The bias in the caller's terms: logical (batch, h_q, s_q, s_kv) axes in either layout.
JAX_BIAS_SHAPES = [(2, 8, 128, 256), (1, 8, 128, 256), (2, 1, 1, 256), (128, 256), (256,), (8, 1, 256)]


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("bias_shape", JAX_BIAS_SHAPES, ids=str)
def test_bias_shapes_and_its_cotangent(sj, jax, layout, bias_shape):
    """The bias' cotangent has the bias' own shape and dtype (after jnp.asarray), for every
    broadcastable shape, under jax.grad and jax.jit."""
    shape = (lambda b, h, s, d: (b, s, h, d)) if layout == "bshd" else (lambda b, h, s, d: (b, h, s, d))
    q, kv = _spec(jax, shape(2, 8, 128, 64), "float16"), _spec(jax, shape(2, 2, 256, 64), "float16")
    bias = _spec(jax, bias_shape, "float16")

    def loss(q, k, v, bias):
        return sj.attention(q, k, v, layout=layout, causal=True, bias=bias).astype("float32").sum()

    out = jax.eval_shape(lambda q, k, v, b: sj.attention(q, k, v, layout=layout, bias=b), q, kv, kv, bias)
    assert (out.shape, str(out.dtype)) == (shape(2, 8, 128, 64), "float16")
    grads = jax.eval_shape(jax.jit(jax.grad(loss, (0, 1, 2))), q, kv, kv, bias)  # a constant bias
    assert [(g.shape, str(g.dtype)) for g in grads] == [(x.shape, "float16") for x in (q, kv, kv)]
    if len(bias_shape) < 2 or bias_shape[-2] == 1:  # shared along seq of q: see the test below
        return
    grads = jax.eval_shape(jax.jit(jax.grad(loss, (0, 1, 2, 3))), q, kv, kv, bias)
    assert [(g.shape, str(g.dtype)) for g in grads] == [(x.shape, "float16") for x in (q, kv, kv, bias)]
    with_lse = jax.eval_shape(jax.grad(lambda q, k, v, b: sj.attention(q, k, v, layout=layout, bias=b,
                                                                       return_lse=True)[0].sum(), 3),
                              q, kv, kv, bias)
    assert with_lse.shape == bias_shape


@pytest.mark.parametrize("bias_shape", [(2, 1, 1, 256), (256,), (8, 1, 256), (1, 1, 1, 256)], ids=str)
def test_differentiating_a_bias_shared_along_a_seq_axis_is_refused(sj, jax, bias_shape):
    """cuDNN 9.19 computes the gradient of a bias shared over query rows wrongly (seen on an H200):
    the core refuses differentiating one, while tracing the forward, naming the broadcast that
    works; as a constant it is fine, and so is the broadcast one differentiated."""
    jnp = jax.numpy
    q, kv, bias = _spec(jax, (2, 128, 8, 64)), _spec(jax, (2, 256, 2, 64)), _spec(jax, bias_shape)

    def loss(q, k, v, bias):
        return sj.attention(q, k, v, bias=bias).astype(jnp.float32).sum()

    with pytest.raises(stridedfa.UnsupportedError, match=r"shared over query rows.*jnp.broadcast_to\(bias, "):
        jax.eval_shape(jax.grad(loss, 3), q, kv, kv, bias)
    assert jax.eval_shape(jax.grad(loss, 0), q, kv, kv, bias).shape == q.shape

    def broadcast(q, k, v, bias):
        full = (1,) * (4 - len(bias_shape)) + bias_shape
        return loss(q, k, v, jnp.broadcast_to(bias, (*full[:2], 128, 256)))

    assert jax.eval_shape(jax.grad(broadcast, 3), q, kv, kv, bias).shape == bias_shape


def test_bias_as_numpy_array(sj, jax):
    """A NumPy bias goes through jnp.asarray; one of another dtype than q's is refused with the cast to make."""
    jnp = jax.numpy
    q, kv = _spec(jax, (1, 16, 2, 64)), _spec(jax, (1, 32, 1, 64))
    bias = np.zeros((16, 32), jnp.bfloat16)
    out = jax.eval_shape(lambda q, k, v: sj.attention(q, k, v, bias=bias), q, kv, kv)
    assert out.shape == (1, 16, 2, 64)
    with pytest.raises(stridedfa.LayoutError, match=r"bias: dtype float32 is not q's dtype bfloat16"):
        jax.eval_shape(lambda q, k, v: sj.attention(q, k, v, bias=np.zeros((16, 32), np.float32)), q, kv, kv)


def test_lowering_with_bias_announces_its_operands(sj, jax):
    """The optional operands are named by the `optional_operands` attribute (a bit per operand of the
    core's table), in the forward and in the backward, whose trailing results are grad_sinks, then
    grad_bias only when the bias is differentiated."""
    jnp = jax.numpy
    q, kv = _spec(jax, (2, 128, 8, 64)), _spec(jax, (2, 256, 2, 64))
    bias, sinks, lengths = _spec(jax, (1, 8, 128, 256)), _spec(jax, (8,), "float32"), _spec(jax, (2,), "int32")

    def inference(q, k, v, bias):
        return sj.attention(q, k, v, bias=bias)

    calls = _custom_calls(jax.jit(inference).lower(q, kv, kv, bias).as_text())
    assert len(calls) == 1 and f"optional_operands = {_bits('bias')} : i64" in calls[0], calls

    def loss(q, k, v, bias, sinks, lengths):
        out = sj.attention(q, k, v, bias=bias, sinks=sinks, seqlens_kv=lengths, causal=True)
        return out.astype(jnp.float32).sum()

    def results(call):
        return call.rsplit("->", 1)[1]

    # + grad_sinks where the sinks are differentiated (the backward returns their gradient only then)
    given = _bits("lengths", "sinks", "bias")
    for argnums, backward_bits, gradients in [((0, 1, 2, 3, 4), given + _bits("grad_sinks", "grad_bias"), 5),
                                              ((0, 1, 2, 4), given + _bits("grad_sinks"), 4), ((0,), given, 3)]:
        text = jax.jit(jax.grad(loss, argnums)).lower(q, kv, kv, bias, sinks, lengths).as_text()
        calls = _custom_calls(text)
        assert len(calls) == 2 and "@stridedfa_sdpa_backward(" in calls[1], calls
        assert f"optional_operands = {given} : i64" in calls[0], calls[0]
        assert f"optional_operands = {backward_bits} : i64" in calls[1], (argnums, calls[1])
        # grad_q, grad_k, grad_v and, when wanted, grad_sinks (f32 (8,)) and grad_bias (bf16 (1, 8, 128, 256)).
        assert results(calls[1]).count("tensor<") == gradients
        assert ("tensor<8xf32>" in results(calls[1])) == (4 in argnums)
        assert ("tensor<1x8x128x256xbf16>" in results(calls[1])) == (3 in argnums)
    without = _custom_calls(jax.jit(jax.grad(lambda q, k, v: sj.attention(q, k, v).astype(jnp.float32).sum()))
                            .lower(q, kv, kv).as_text())
    assert all("optional_operands = 0 : i64" in call for call in without), without


def test_constant_bias_gets_no_gradient_and_lse_alone_differentiates(sj, jax):
    """A bias that is not differentiated (closed over, or not among argnums) has no grad_bias in
    the backward; with return_lse a loss of lse alone still lowers (out's cotangent a symbolic zero)."""
    jnp = jax.numpy
    q, kv = _spec(jax, (2, 128, 8, 64)), _spec(jax, (2, 256, 2, 64))
    mask = jnp.zeros((2, 1, 1, 256), jnp.bfloat16)

    def loss(q, k, v):
        return sj.attention(q, k, v, bias=mask).astype(jnp.float32).sum()

    calls = _custom_calls(jax.jit(jax.grad(loss, (0, 1, 2))).lower(q, kv, kv).as_text())
    assert f"optional_operands = {_bits('bias')} : i64" in calls[1], calls
    assert calls[1].rsplit("->", 1)[1].count("tensor<") == 3, calls
    grads = jax.eval_shape(jax.grad(loss, (0, 1, 2)), q, kv, kv)
    assert [g.shape for g in grads] == [q.shape, kv.shape, kv.shape]

    def lse_loss(q, k, v, bias):
        return sj.attention(q, k, v, bias=bias, return_lse=True)[1].sum()

    grads = jax.eval_shape(jax.jit(jax.grad(lse_loss, (0, 3))), q, kv, kv, _spec(jax, (1, 8, 128, 256)))
    assert [g.shape for g in grads] == [q.shape, (1, 8, 128, 256)]


def test_vmapped_bias_shapes(sj, jax):
    """Abstractly every bias is fine under jax.vmap (a shared one is refused when the call runs):
    shapes and cotangents carry the mapped axis."""
    q, kv = _spec(jax, (3, 2, 128, 8, 64)), _spec(jax, (3, 2, 256, 2, 64))
    bias = _spec(jax, (3, 2, 1, 128, 256))

    def loss(q, k, v, bias):
        return sj.attention(q, k, v, bias=bias).astype("float32").sum()

    out = jax.eval_shape(jax.vmap(lambda q, k, v, b: sj.attention(q, k, v, bias=b)), q, kv, kv, bias)
    assert out.shape == (3, 2, 128, 8, 64)
    grads = jax.eval_shape(jax.vmap(jax.grad(loss, (0, 3))), q, kv, kv, bias)
    assert [g.shape for g in grads] == [q.shape, bias.shape]
    shared = jax.eval_shape(jax.vmap(jax.grad(loss, 3), in_axes=(0, 0, 0, None)), q, kv, kv,
                            _spec(jax, (2, 1, 128, 256)))
    assert shared.shape == (3, 2, 1, 128, 256)


BAD_BIAS = [
    # (bias shape, dtype, error message)
    ((2, 8, 128, 256), "float32", r"bias: dtype float32 is not q's dtype bfloat16; .* bias.astype\(q.dtype\)"),
    ((2, 8, 128, 256), "float16", "bias: dtype float16 is not q's dtype bfloat16"),
    ((2, 3, 128, 256), "bfloat16", r"bias: shape \(2, 3, 128, 256\) is not broadcastable .* axis 1 \(heads\) is 3"),
    ((3, 8, 128, 256), "bfloat16", r"axis 0 \(batch\) is 3, expected 2 or 1"),
    ((128, 128), "bfloat16", r"axis 1 \(seq of k\) is 128, expected 256"),
    ((256, 128), "bfloat16", "is not broadcastable"),
    ((1, 2, 8, 128, 256), "bfloat16", "bias: expected up to 4 axes"),
    ((), "bfloat16", "bias: expected up to 4 axes"),
]


def _trace(jax, how, f, args, wrt):
    """Traces f(*args) as named: eval_shape, jit's lowering, or the lowering of jit(grad) w.r.t.
    argument `wrt` of a scalar loss."""
    if how == "eval_shape":
        jax.eval_shape(f, *args)
    elif how == "jit_lower":
        jax.jit(f).lower(*args)
    else:
        jax.jit(jax.grad(lambda *a: f(*a).astype("float32").sum(), wrt)).lower(*args)


@pytest.mark.parametrize("shape, dtype, message", BAD_BIAS)
@pytest.mark.parametrize("how", ["eval_shape", "jit_lower", "grad"])
def test_bad_bias_raises_typed_errors_while_tracing(sj, jax, shape, dtype, message, how):
    q, kv, bias = _spec(jax, (2, 128, 8, 64)), _spec(jax, (2, 256, 2, 64)), _spec(jax, shape, dtype)

    def f(q, k, v, bias):
        return sj.attention(q, k, v, bias=bias)

    with pytest.raises(stridedfa.LayoutError, match=message):
        _trace(jax, how, f, (q, kv, kv, bias), wrt=3)


def test_dispatcher_passes_bias_to_the_jax_adapter(sj, jax):
    """stridedfa.attention on jax arrays takes (b, h, s, d) arrays (layout bhsd) and the bias with them."""
    q, kv, bias = _spec(jax, (2, 8, 128, 64)), _spec(jax, (2, 2, 256, 64)), _spec(jax, (128, 256))
    out = jax.eval_shape(lambda q, k, v, b: stridedfa.attention(q, k, v, bias=b), q, kv, kv, bias)
    assert out.shape == (2, 8, 128, 64)
    grad = jax.eval_shape(jax.grad(lambda b, q, k, v: stridedfa.attention(q, k, v, bias=b).astype("float32").sum()),
                          bias, q, kv, kv)
    assert grad.shape == (128, 256)
    with pytest.raises(stridedfa.LayoutError, match="bias: shape"):
        jax.eval_shape(lambda q, k, v, b: stridedfa.attention(q, k, v, bias=b), q, kv, kv, _spec(jax, (3, 128, 256)))


# --- The ALiBi slopes through stridedfa.jax (CPU backend: tracing and lowering) --------------------

def _alibi_slopes(h_q):
    return 2.0 ** (-8.0 * np.arange(1, h_q + 1) / h_q)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("causal", [True, False])
def test_alibi_shapes_and_no_cotangent(sj, jax, layout, causal):
    """With ALiBi slopes the output and the q, k, v cotangents keep their shapes, under jax.grad and
    jax.jit; the slopes, not differentiable, get a zero cotangent."""
    jnp = jax.numpy
    shape = (lambda b, h, s, d: (b, s, h, d)) if layout == "bshd" else (lambda b, h, s, d: (b, h, s, d))
    q, kv = _spec(jax, shape(2, 8, 128, 64), "float16"), _spec(jax, shape(2, 2, 256, 64), "float16")
    slopes = _spec(jax, (8,), "float32")

    def loss(q, k, v, slopes):
        out = sj.attention(q, k, v, layout=layout, causal=causal, alibi_slopes=slopes)
        return out.astype(jnp.float32).sum()

    out = jax.eval_shape(lambda q, k, v, s: sj.attention(q, k, v, layout=layout, alibi_slopes=s), q, kv, kv, slopes)
    assert (out.shape, str(out.dtype)) == (shape(2, 8, 128, 64), "float16")
    grads = jax.eval_shape(jax.jit(jax.grad(loss, (0, 1, 2))), q, kv, kv, slopes)
    assert [(g.shape, str(g.dtype)) for g in grads] == [(x.shape, "float16") for x in (q, kv, kv)]
    assert jax.eval_shape(jax.grad(loss), q, kv, kv, slopes).shape == q.shape
    # Asked for anyway, the slopes' cotangent is zero (test_alibi_slopes_get_a_zero_gradient).
    assert jax.eval_shape(jax.grad(loss, 3), q, kv, kv, slopes).shape == (8,)
    lse = jax.eval_shape(lambda q, k, v, s: sj.attention(q, k, v, layout=layout, alibi_slopes=s, return_lse=True),
                         q, kv, kv, slopes)
    assert lse[1].shape == (2, 8, 128)


def test_alibi_slopes_get_a_zero_gradient(sj, jax):
    """jax.grad with respect to the slopes gives zeros (they are not differentiable), traced on CPU
    with the calls themselves never run: the zeros come from the rule, not from a kernel."""
    jnp = jax.numpy
    q, kv = _spec(jax, (1, 16, 2, 64)), _spec(jax, (1, 32, 1, 64))
    jaxpr = jax.make_jaxpr(jax.grad(lambda q, k, v, s: sj.attention(q, k, v, alibi_slopes=s)
                                    .astype(jnp.float32).sum(), 3))(q, kv, kv, _spec(jax, (2,), "float32"))
    assert jaxpr.out_avals[0].shape == (2,)
    # The gradient is a broadcast literal zero, not a result of the backward call.
    (made,) = [e for e in jaxpr.jaxpr.eqns if jaxpr.jaxpr.outvars[0] in e.outvars]
    assert made.primitive.name == "broadcast_in_dim" and float(made.invars[0].val) == 0.0, made
    # The calls (in custom_vmap_call, which keeps the slopes unmapped under jax.vmap): the backward
    # has the three results of q, k, v only.
    calls = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "custom_vmap_call"]
    assert [len(e.outvars) for e in calls] == [2, 3], jaxpr


def test_lowering_with_alibi_announces_its_operand(sj, jax):
    """The slopes are one more trailing input (their bit of optional_operands), after the lengths, the
    sinks and the bias, of the forward and of the backward; they add no result."""
    jnp = jax.numpy
    q, kv = _spec(jax, (2, 128, 8, 64)), _spec(jax, (2, 256, 2, 64))
    slopes, bias, sinks = _spec(jax, (8,), "float32"), _spec(jax, (1, 8, 128, 256)), _spec(jax, (8,), "float32")
    lengths = _spec(jax, (2,), "int32")

    calls = _custom_calls(jax.jit(lambda q, k, v, s: sj.attention(q, k, v, alibi_slopes=s))
                          .lower(q, kv, kv, slopes).as_text())
    assert len(calls) == 1 and f"optional_operands = {_bits('alibi_slopes')} : i64" in calls[0], calls
    assert calls[0].count("tensor<8xf32>") == 1

    def loss(q, k, v, slopes, bias, sinks, lengths):
        out = sj.attention(q, k, v, alibi_slopes=slopes, bias=bias, sinks=sinks, seqlens_kv=lengths, causal=True)
        return out.astype(jnp.float32).sum()

    calls = _custom_calls(jax.jit(jax.grad(loss, (0, 1, 2, 5))).lower(q, kv, kv, slopes, bias, sinks, lengths)
                          .as_text())
    assert len(calls) == 2 and "@stridedfa_sdpa_backward(" in calls[1], calls
    given = _bits("lengths", "sinks", "bias", "alibi_slopes")  # a constant bias
    assert f"optional_operands = {given} : i64" in calls[0], calls[0]
    assert f"optional_operands = {given + _bits('grad_sinks')} : i64" in calls[1], calls[1]
    # The operand types: q, k, v, out, lse, grad_out, seqlens_q, seqlens_kv, sinks, bias, alibi_slopes
    # (the slopes last); the results grad_q, grad_k, grad_v, grad_sinks (the slopes have no gradient).
    arguments, results = re.search(r"\} : \((.*)\) -> (.*)$", calls[1]).groups()
    arguments = arguments.split(", ")
    assert len(arguments) == 11 and arguments[-2:] == ["tensor<1x8x128x256xbf16>", "tensor<8xf32>"], arguments
    assert results.count("tensor<") == 4, results
    forward_arguments = re.search(r"\} : \((.*)\) -> ", calls[0]).group(1).split(", ")
    assert len(forward_arguments) == 8 and forward_arguments[-1] == "tensor<8xf32>", forward_arguments


@pytest.mark.parametrize("shape, dtype, message", [
    ((4,), "float32", r"^alibi_slopes: shape .* axis 0 \(heads\) is 4, expected 8"),
    ((2, 8), "float32", r"^alibi_slopes: expected shape \(heads of q,\)"),
    ((8,), "bfloat16", r"^alibi_slopes: dtype bfloat16 is not supported; .*float32"),
    ((8,), "float16", r"^alibi_slopes: dtype float16 is not supported; .*float32"),
])
@pytest.mark.parametrize("how", ["eval_shape", "jit_lower", "grad"])
def test_bad_alibi_slopes_raise_typed_errors_while_tracing(sj, jax, shape, dtype, message, how):
    q, kv, slopes = _spec(jax, (2, 128, 8, 64)), _spec(jax, (2, 256, 2, 64)), _spec(jax, shape, dtype)

    def f(q, k, v, slopes):
        return sj.attention(q, k, v, alibi_slopes=slopes)

    with pytest.raises(stridedfa.LayoutError, match=message):
        _trace(jax, how, f, (q, kv, kv, slopes), wrt=0)


def test_alibi_slopes_as_numpy_array(sj, jax):
    """NumPy slopes go through jnp.asarray and become the call's operand."""
    q, kv = _spec(jax, (1, 16, 2, 64)), _spec(jax, (1, 32, 1, 64))
    slopes = _alibi_slopes(2).astype(np.float32)
    out = jax.eval_shape(lambda q, k, v: sj.attention(q, k, v, alibi_slopes=slopes, causal=True), q, kv, kv)
    assert out.shape == (1, 16, 2, 64)
    text = jax.jit(lambda q, k, v: sj.attention(q, k, v, alibi_slopes=slopes)).lower(q, kv, kv).as_text()
    assert f"optional_operands = {_bits('alibi_slopes')} : i64" in _custom_calls(text)[0]


def test_vmapped_alibi_slopes(sj, jax):
    """Under jax.vmap slopes shared by the mapped calls (in_axes=None, or closed over) are fine,
    also for the backward and nested vmaps; the calls get them unbroadcast (one (h_q,) array).
    Mapped slopes are refused while tracing, also when jax.jit is inside the vmap."""
    jnp = jax.numpy
    q, kv = _spec(jax, (3, 2, 128, 8, 64)), _spec(jax, (3, 2, 256, 2, 64))
    slopes = _spec(jax, (8,), "float32")

    def f(q, k, v, s):
        return sj.attention(q, k, v, causal=True, alibi_slopes=s)

    def loss(q, k, v, s):
        return f(q, k, v, s).astype(jnp.float32).sum()

    out = jax.eval_shape(jax.vmap(f, in_axes=(0, 0, 0, None)), q, kv, kv, slopes)
    assert out.shape == (3, 2, 128, 8, 64)
    grads = jax.eval_shape(jax.vmap(jax.grad(loss, (0, 1, 2)), in_axes=(0, 0, 0, None)), q, kv, kv, slopes)
    assert [g.shape for g in grads] == [q.shape, kv.shape, kv.shape]
    # The calls get the slopes as they are, (8,), not broadcast along the mapped axis.
    text = jax.jit(jax.vmap(jax.grad(loss), in_axes=(0, 0, 0, None))).lower(q, kv, kv, slopes).as_text()
    _assert_forward_and_backward_take(_custom_calls(text), _bits("alibi_slopes"), "tensor<8xf32>",
                                      "tensor<3x2x128x8x64xbf16>")
    closed = jnp.asarray(_alibi_slopes(8), jnp.float32)
    assert jax.eval_shape(jax.vmap(lambda q, k, v: f(q, k, v, closed)), q, kv, kv).shape == out.shape
    nested = jax.eval_shape(jax.vmap(jax.vmap(f, in_axes=(0, 0, 0, None)), in_axes=(0, 0, 0, None)),
                            _spec(jax, (4, 3, 2, 128, 8, 64)), _spec(jax, (4, 3, 2, 256, 2, 64)),
                            _spec(jax, (4, 3, 2, 256, 2, 64)), slopes)
    assert nested.shape == (4, 3, 2, 128, 8, 64)
    # A derived value of shared slopes stays shared.
    derived = jax.eval_shape(jax.vmap(lambda q, k, v, s: f(q, k, v, s * 0.5), in_axes=(0, 0, 0, None)),
                             q, kv, kv, slopes)
    assert derived.shape == out.shape

    mapped = _spec(jax, (3, 8), "float32")
    refused = r"alibi_slopes: mapped by jax.vmap .* pass them unmapped \(in_axes=None"
    with pytest.raises(stridedfa.UnsupportedError, match=refused):
        jax.eval_shape(jax.vmap(f), q, kv, kv, mapped)
    with pytest.raises(stridedfa.UnsupportedError, match=refused):
        jax.eval_shape(jax.vmap(jax.grad(loss, (0, 3))), q, kv, kv, mapped)
    with pytest.raises(stridedfa.UnsupportedError, match=refused):  # mapped by the outer of two vmaps
        jax.eval_shape(jax.vmap(lambda q, k, v, s: jax.vmap(lambda q: f(q, k, v, s))(q), in_axes=(0, None, None, 0)),
                       _spec(jax, (4, 3, 2, 128, 8, 64)), _spec(jax, (2, 256, 2, 64)), _spec(jax, (2, 256, 2, 64)),
                       _spec(jax, (4, 8), "float32"))
    with pytest.raises(stridedfa.UnsupportedError, match=refused):  # derived from a mapped value
        jax.eval_shape(jax.vmap(lambda q, k, v, x: f(q, k, v, closed * x)), q, kv, kv, _spec(jax, (3,), "float32"))
    with pytest.raises(stridedfa.UnsupportedError, match=refused):  # jax.jit inside: batched from its jaxpr
        jax.eval_shape(jax.vmap(jax.jit(f)), q, kv, kv, mapped)
    with pytest.raises(stridedfa.UnsupportedError, match=refused):
        jax.jit(jax.vmap(jax.jit(jax.grad(loss)))).lower(q, kv, kv, mapped)
    # vmap of a jitted call with shared slopes: fine, the slopes stay (8,).
    text = jax.jit(jax.vmap(jax.jit(f), in_axes=(0, 0, 0, None))).lower(q, kv, kv, slopes).as_text()
    assert re.search(r"\} : \((.*)\) -> ", _custom_calls(text)[0]).group(1).endswith("tensor<8xf32>")


# --- Dropout through stridedfa.jax (CPU backend: tracing and lowering) -----------------------------

def _stridedfa_calls(text: str) -> list[str]:
    """The lowering's stridedfa custom calls (a typed key adds a @Sharding one of JAX's own)."""
    return [line for line in _custom_calls(text) if "@stridedfa_" in line]


def _operands(call: str) -> list[str]:
    """The SSA names of a custom call's operands."""
    return re.search(r"custom_call @\w+\(([^)]*)\)", call).group(1).split(", ")


KEYS = {"typed": lambda jax: jax.random.key(3), "legacy": lambda jax: jax.random.PRNGKey(3)}


@pytest.mark.parametrize("key_kind", list(KEYS))
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_dropout_shapes_and_grad(sj, jax, key_kind, layout):
    """With dropout the output, lse and the q, k, v cotangents keep their shapes, under jax.grad and
    jax.jit, with either kind of key (traced too)."""
    jnp = jax.numpy
    shape = (lambda b, h, s, d: (b, s, h, d)) if layout == "bshd" else (lambda b, h, s, d: (b, h, s, d))
    q, kv = _spec(jax, shape(2, 8, 128, 64), "float16"), _spec(jax, shape(2, 2, 256, 64), "float16")
    key = KEYS[key_kind](jax)

    def f(q, k, v, key):
        return sj.attention(q, k, v, layout=layout, causal=True, dropout_p=0.2, dropout_key=key)

    def loss(q, k, v, key):
        return f(q, k, v, key).astype(jnp.float32).sum()

    out = jax.eval_shape(f, q, kv, kv, key)
    assert (out.shape, str(out.dtype)) == (shape(2, 8, 128, 64), "float16")
    grads = jax.eval_shape(jax.jit(jax.grad(loss, (0, 1, 2))), q, kv, kv, key)
    assert [(g.shape, str(g.dtype)) for g in grads] == [(x.shape, "float16") for x in (q, kv, kv)]
    closed = jax.eval_shape(jax.grad(lambda q, k, v: loss(q, k, v, key), (0, 1, 2)), q, kv, kv)
    assert [g.shape for g in closed] == [q.shape, kv.shape, kv.shape]
    out, lse = jax.eval_shape(lambda q, k, v: sj.attention(q, k, v, layout=layout, dropout_p=0.2, dropout_key=key,
                                                           return_lse=True), q, kv, kv)
    assert out.shape == shape(2, 8, 128, 64) and lse.shape == (2, 8, 128)


def test_lowering_with_dropout_passes_one_state_to_forward_and_backward(sj, jax):
    """Dropout adds the dropout_p attribute (f64) and one trailing uint32 (4,) input (its bit of
    optional_operands), after every other optional operand; the backward gets the forward's state
    (the same SSA value: one mask), and no result for it."""
    jnp = jax.numpy
    q, kv = _spec(jax, (2, 128, 8, 64)), _spec(jax, (2, 256, 2, 64))
    key = jax.random.key(0)

    calls = _stridedfa_calls(jax.jit(lambda q, k, v, key: sj.attention(q, k, v, dropout_p=0.2, dropout_key=key))
                             .lower(q, kv, kv, key).as_text())
    assert len(calls) == 1 and "@stridedfa_sdpa_forward_inference(" in calls[0], calls
    assert "dropout_p = 2.000000e-01 : f64" in calls[0], calls[0]
    assert f"optional_operands = {_bits('rng_state')} : i64" in calls[0], calls[0]
    assert re.search(r"\} : \((.*)\) -> ", calls[0]).group(1).split(", ")[-1] == "tensor<4xui32>", calls[0]

    slopes, bias = _spec(jax, (8,), "float32"), _spec(jax, (1, 8, 128, 256))
    lengths = _spec(jax, (2,), "int32")

    def loss(q, k, v, slopes, bias, lengths, key):  # no sinks: their gradient is refused under dropout
        out = sj.attention(q, k, v, alibi_slopes=slopes, bias=bias, seqlens_kv=lengths, causal=True,
                           dropout_p=0.25, dropout_key=key)
        return out.astype(jnp.float32).sum()

    text = jax.jit(jax.grad(loss, (0, 1, 2))).lower(q, kv, kv, slopes, bias, lengths, key).as_text()
    forward, backward = _stridedfa_calls(text)
    assert "@stridedfa_sdpa_forward(" in forward and "@stridedfa_sdpa_backward(" in backward
    given = _bits("lengths", "bias", "alibi_slopes", "rng_state")  # a constant bias
    for call in (forward, backward):
        assert f"optional_operands = {given} : i64" in call and "dropout_p = 2.500000e-01 : f64" in call, call
    arguments, results = re.search(r"\} : \((.*)\) -> (.*)$", backward).groups()
    arguments = arguments.split(", ")
    assert len(arguments) == 11 and arguments[-2:] == ["tensor<8xf32>", "tensor<4xui32>"], arguments
    assert results.count("tensor<") == 3, results  # grad_q, grad_k, grad_v
    assert len(_operands(forward)) == 8 and re.search(r"\} : \((.*)\) -> ", forward).group(1).endswith(
        "tensor<4xui32>")
    assert _operands(forward)[-1] == _operands(backward)[-1], (forward, backward)

    # dropout_p=0: no state, no dropout (a key given anyway is not used)
    for call in _stridedfa_calls(jax.jit(jax.grad(lambda q, k, v, key: sj.attention(
            q, k, v, dropout_p=0.0, dropout_key=key).astype(jnp.float32).sum())).lower(q, kv, kv, key).as_text()):
        assert "optional_operands = 0 : i64" in call and "dropout_p = 0.000000e+00 : f64" in call, call
    # without dropout the attribute is there too, 0
    call = _stridedfa_calls(jax.jit(lambda q, k, v: sj.attention(q, k, v)).lower(q, kv, kv).as_text())[0]
    assert "dropout_p = 0.000000e+00 : f64" in call, call


def test_equal_keys_give_one_state_and_different_keys_another(sj, jax):
    """The state is jax.random.bits(key, (4,), uint32), computed on whatever device runs it: equal
    keys give equal states (equal masks), split keys other ones."""
    jnp = jax.numpy
    key = jax.random.key(7)
    state = np.asarray(sj._rng_state(key))
    assert state.dtype == np.uint32 and state.shape == (4,)
    assert np.array_equal(state, np.asarray(jax.random.bits(jax.random.key(7), (4,), jnp.uint32)))
    assert np.array_equal(state, np.asarray(sj._rng_state(jax.random.PRNGKey(7))))
    assert not np.array_equal(state, np.asarray(sj._rng_state(jax.random.split(key)[0])))


BAD_DROPOUT = [
    # (kwargs, error, message)
    ({"dropout_p": 0.2}, ValueError, r"^dropout_key: dropout_p=0.2 needs a jax.random key"),
    ({"dropout_p": 1.0, "dropout_key": "key"}, ValueError, r"dropout_p must be a probability in \[0, 1\), got 1.0"),
    ({"dropout_p": -0.1, "dropout_key": "key"}, ValueError, r"dropout_p must be a probability in \[0, 1\)"),
    ({"dropout_p": float("nan"), "dropout_key": "key"}, ValueError, r"dropout_p must be a probability"),
    ({"dropout_p": True, "dropout_key": "key"}, TypeError, r"dropout_p must be a number in \[0, 1\), got bool"),
    ({"dropout_p": "0.1", "dropout_key": "key"}, TypeError, r"dropout_p must be a number"),
    ({"dropout_p": 0.2, "dropout_key": 5}, TypeError, r"^dropout_key: expected one jax.random key"),
    ({"dropout_p": 0.2, "dropout_key": "keys"}, ValueError, r"^dropout_key: expected one jax.random key .* a key "
                                                            r"array of shape \(3,\)"),
]


@pytest.mark.parametrize("kwargs, error, message", BAD_DROPOUT)
@pytest.mark.parametrize("how", ["eval_shape", "jit_lower", "grad"])
def test_bad_dropout_arguments_raise_while_tracing(sj, jax, kwargs, error, message, how):
    q, kv = _spec(jax, (2, 128, 8, 64)), _spec(jax, (2, 256, 2, 64))
    stand_in = {"key": jax.random.key(0), "keys": jax.random.split(jax.random.key(0), 3)}
    kwargs = {name: stand_in.get(x, x) if isinstance(x, str) and name == "dropout_key" else x
              for name, x in kwargs.items()}

    def f(q, k, v):
        return sj.attention(q, k, v, **kwargs)

    with pytest.raises(error, match=message):
        _trace(jax, how, f, (q, kv, kv), wrt=0)


def test_traced_dropout_p_is_refused(sj, jax):
    q = _spec(jax, (1, 16, 2, 64))
    with pytest.raises(TypeError, match="dropout_p must be a Python number"):
        jax.jit(lambda q, p: sj.attention(q, q, q, dropout_p=p, dropout_key=jax.random.key(0))).lower(q, 0.5)


def test_what_the_plan_refuses_with_dropout_is_refused_while_tracing_a_jax_call(sj, jax):
    """The core's refusals reach a JAX caller while tracing, in the forward's check (a bottom-right
    mask with padding lengths) or in the backward's rule (the s_q = s_kv = 1 backward)."""
    jnp = jax.numpy
    key = jax.random.key(0)
    q, kv = _spec(jax, (2, 128, 8, 64)), _spec(jax, (2, 256, 2, 64))
    lengths = jnp.asarray([256, 100], jnp.int32)
    with pytest.raises(stridedfa.UnsupportedError, match="dropout with a bottom-right causal mask"):
        jax.eval_shape(lambda q, k, v: sj.attention(q, k, v, causal=True, causal_alignment="bottom_right",
                                                    seqlens_kv=lengths, dropout_p=0.2, dropout_key=key), q, kv, kv)
    one = _spec(jax, (2, 1, 2, 64))

    def loss(q, k, v):
        return sj.attention(q, k, v, dropout_p=0.2, dropout_key=key).astype(jnp.float32).sum()

    assert jax.eval_shape(lambda q: sj.attention(q, q, q, dropout_p=0.2, dropout_key=key), one).shape == one.shape
    with pytest.raises(stridedfa.UnsupportedError, match="s_q = s_kv = 1 .* and dropout is not supported"):
        jax.eval_shape(jax.grad(loss), one, one, one)


def test_vmapped_dropout(sj, jax):
    """Under jax.vmap one key shared by the mapped calls (in_axes=None, or closed over) is fine, also
    for the backward: the calls get one (4,) state, unbroadcast. A mapped key (a key per example)
    is refused while tracing, also with jax.jit inside, and so is the backward of dropout with
    sinks under jax.vmap (it runs the mapped calls one by one)."""
    jnp = jax.numpy
    q, kv = _spec(jax, (3, 2, 128, 8, 64)), _spec(jax, (3, 2, 256, 2, 64))
    key = jax.random.key(1)

    def f(q, k, v, key):
        return sj.attention(q, k, v, causal=True, dropout_p=0.2, dropout_key=key)

    def loss(q, k, v, key):
        return f(q, k, v, key).astype(jnp.float32).sum()

    axes = (0, 0, 0, None)
    assert jax.eval_shape(jax.vmap(f, in_axes=axes), q, kv, kv, key).shape == q.shape
    grads = jax.eval_shape(jax.vmap(jax.grad(loss, (0, 1, 2)), in_axes=axes), q, kv, kv, key)
    assert [g.shape for g in grads] == [q.shape, kv.shape, kv.shape]
    text = jax.jit(jax.vmap(jax.grad(loss), in_axes=axes)).lower(q, kv, kv, key).as_text()
    calls = _stridedfa_calls(text)
    _assert_forward_and_backward_take(calls, _bits("rng_state"), "tensor<4xui32>", "tensor<3x2x128x8x64xbf16>")
    assert _operands(calls[0])[-1] == _operands(calls[1])[-1]
    assert jax.eval_shape(jax.vmap(lambda q, k, v: f(q, k, v, key)), q, kv, kv).shape == q.shape

    keys = jax.random.split(key, 3)
    refused = r"^dropout_key: mapped by jax.vmap .* one call per example; pass one key unmapped \(in_axes=None"
    with pytest.raises(stridedfa.UnsupportedError, match=refused):
        jax.eval_shape(jax.vmap(f), q, kv, kv, keys)
    with pytest.raises(stridedfa.UnsupportedError, match=refused):
        jax.eval_shape(jax.vmap(jax.grad(loss, (0, 1, 2))), q, kv, kv, keys)
    with pytest.raises(stridedfa.UnsupportedError, match=refused):  # jax.jit inside: batched from its jaxpr
        jax.eval_shape(jax.vmap(jax.jit(f)), q, kv, kv, keys)
    with pytest.raises(stridedfa.UnsupportedError, match=refused):  # derived from a mapped value
        jax.eval_shape(jax.vmap(lambda q, k, v, i: f(q, k, v, jax.random.fold_in(key, i))), q, kv, kv,
                       jnp.arange(3))

    sinks = jnp.zeros((8,), jnp.float32)

    def with_sinks(q, k, v):
        return sj.attention(q, k, v, sinks=sinks, dropout_p=0.2, dropout_key=key)

    assert jax.eval_shape(jax.vmap(with_sinks), q, kv, kv).shape == q.shape
    # Fixed (closed-over) sinks take part and are not differentiated: the backward asks for no
    # sinks' gradient, so dropout differentiates, folded under jax.vmap too.
    grads = jax.eval_shape(jax.vmap(jax.grad(lambda *a: with_sinks(*a).astype(jnp.float32).sum())), q, kv, kv)
    assert grads.shape == q.shape
    # Differentiated sinks are refused with dropout: cuDNN 9.19 returns their gradient scaled by 1 - p
    # (GPU run 32); under jax.vmap the per-call backward is refused first.
    def trained(q, k, v, sinks):
        return sj.attention(q, k, v, sinks=sinks, dropout_p=0.2, dropout_key=key).astype(jnp.float32).sum()

    refused = "dropout with sinks under jax.vmap cannot be differentiated|sinks' gradient with dropout"
    with pytest.raises(stridedfa.UnsupportedError, match=refused):
        jax.eval_shape(jax.vmap(jax.grad(trained, 3), in_axes=(0, 0, 0, None)), q, kv, kv, sinks)
    with pytest.raises(stridedfa.UnsupportedError, match="sinks' gradient with dropout"):
        jax.eval_shape(jax.grad(trained, 3), _spec(jax, q.shape[1:]), _spec(jax, kv.shape[1:]),
                       _spec(jax, kv.shape[1:]), sinks)


def test_a_mapped_cotangent_of_one_dropout_forward_is_not_folded(sj, jax):
    """jax.jacrev (a vmap over the cotangent of one forward): the forward drew its mask for its own
    batch rows, so the backward runs each mapped cotangent on the forward's own problem (one call
    after another) instead of folding them into a larger batch, whose rows i * b.. would read masks
    no forward drew. Where the forward itself was mapped (vmap of grad), the backward folds."""
    jnp = jax.numpy
    q, kv = _spec(jax, (1, 16, 2, 64)), _spec(jax, (1, 16, 2, 64))
    key = jax.random.key(3)

    def f(q, k, v):
        return sj.attention(q, k, v, dropout_p=0.1, dropout_key=key).astype(jnp.float32).sum(axis=(2, 3))

    forward, backward = _stridedfa_calls(jax.jit(jax.jacrev(f)).lower(q, kv, kv).as_text())
    for call in (forward, backward):
        assert re.search(r"\} : \((.*)\) -> ", call).group(1).split(", ")[0] == "tensor<1x16x2x64xbf16>", call

    def g(q, k, v):
        return sj.attention(q, k, v, dropout_p=0.1, dropout_key=key).astype(jnp.float32).sum()

    batched = (_spec(jax, (3, 1, 16, 2, 64)),) * 3
    forward, backward = _stridedfa_calls(jax.jit(jax.vmap(jax.grad(g))).lower(*batched).as_text())
    for call in (forward, backward):
        assert re.search(r"\} : \((.*)\) -> ", call).group(1).split(", ")[0] == "tensor<3x1x16x2x64xbf16>", call


def test_dispatcher_passes_dropout_to_the_jax_adapter(sj, jax):
    """stridedfa.attention on jax arrays takes dropout_p and dropout_key (layout bhsd); the generic
    entry point's rng_state is not the JAX adapter's."""
    q, kv = _spec(jax, (2, 8, 128, 64)), _spec(jax, (2, 2, 256, 64))
    key = jax.random.key(2)
    text = jax.jit(lambda q, k, v, key: stridedfa.attention(q, k, v, dropout_p=0.2, dropout_key=key)).lower(
        q, kv, kv, key).as_text()
    calls = _stridedfa_calls(text)
    assert len(calls) == 1 and "layout = 1 : i64" in calls[0]
    assert f"optional_operands = {_bits('rng_state')} : i64" in calls[0]
    assert "dropout_p = 2.000000e-01 : f64" in calls[0]
    grads = jax.eval_shape(jax.grad(lambda q, k, v: stridedfa.attention(q, k, v, dropout_p=0.2, dropout_key=key)
                                    .astype("float32").sum(), (0, 1, 2)), q, kv, kv)
    assert [g.shape for g in grads] == [q.shape, kv.shape, kv.shape]
    with pytest.raises(ValueError, match="^dropout_key: "):
        jax.eval_shape(lambda q, k, v: stridedfa.attention(q, k, v, dropout_p=0.2), q, kv, kv)
    with pytest.raises(TypeError, match="takes no option 'rng_state'"):
        jax.eval_shape(lambda q, k, v: stridedfa.attention(q, k, v, dropout_p=0.2, rng_state=key), q, kv, kv)


# --- Attention sinks under jax.vmap ------------------------------------------------------------------

def _sinks_reference(jnp, q, k, v, sinks):
    """Attention with sinks in bshd, h_kv == h_q, default scale, in float32: (out, lse)."""
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    top = jnp.maximum(scores.max(-1), sinks[None, :, None])
    weights = jnp.exp(scores - top[..., None])
    total = weights.sum(-1) + jnp.exp(sinks[None, :, None] - top)
    out = jnp.einsum("bhqk,bkhd->bqhd", weights / total[..., None], v)
    return out, top + jnp.log(total)


@pytest.fixture
def handler_stand_in(jax, monkeypatch):
    """jax.ffi.ffi_call replaced by a jnp stand-in of the handlers, which fold every leading axis
    into the batch as they do (so grad_sinks sums over the whole folded batch)."""
    jnp = jax.numpy
    calls = []

    def ffi_call(target, result_shape_dtypes, vmap_method=None):
        def run(*args, **attributes):
            # the sinks only (and, in the backward, their gradient)
            wanted = _bits("sinks", "grad_sinks") if target == "stridedfa_sdpa_backward" else _bits("sinks")
            assert attributes["optional_operands"] == wanted, attributes
            calls.append((target, tuple(tuple(x.shape) for x in args)))
            q, k, v, *rest = args
            shapes = [tuple(x.shape) for x in (q, k, v)]
            q, k, v = (x.reshape(-1, *x.shape[-3:]) for x in (q, k, v))
            if target == "stridedfa_sdpa_backward":
                out, lse, grad_out, sinks = rest[0], rest[1], rest[2], rest[3]
                assert sinks.shape == (q.shape[2],), sinks.shape
                _, vjp = jax.vjp(lambda q, k, v, s: _sinks_reference(jnp, q, k, v, s)[0], q, k, v, sinks)
                dq, dk, dv, ds = vjp(grad_out.reshape(-1, *grad_out.shape[-3:]).astype(jnp.float32))
                results = [g.reshape(shape) for g, shape in zip((dq, dk, dv), shapes)] + [ds]
            else:
                (sinks,) = rest
                assert sinks.shape == (q.shape[2],), sinks.shape
                out, lse = _sinks_reference(jnp, q, k, v, sinks)
                results = [out.reshape(shapes[0]), lse.reshape(*shapes[0][:-3], *lse.shape[1:])]
            specs = result_shape_dtypes if isinstance(result_shape_dtypes, tuple) else (result_shape_dtypes,)
            assert [tuple(r.shape) for r in results[:len(specs)]] == [tuple(s.shape) for s in specs]
            results = tuple(r.astype(s.dtype) for r, s in zip(results, specs))
            return results if isinstance(result_shape_dtypes, tuple) else results[0]

        return run

    monkeypatch.setattr(jax.ffi, "ffi_call", ffi_call)
    return calls


def test_vmapped_sinks_values_with_a_handler_stand_in(sj, jax, handler_stand_in):
    """With a jnp stand-in of the handlers: under jax.vmap the unmapped sinks reach the calls as
    one (h_q,) array; the forward folds the mapped calls into one, and the sinks' gradient is right
    both ways round: jax.grad of a vmapped loss (the sum over the mapped calls) and jax.vmap of
    jax.grad (one gradient per mapped call), also under nested vmaps."""
    jnp = jax.numpy
    keys = jax.random.split(jax.random.PRNGKey(0), 5)
    q = jax.random.normal(keys[0], (3, 2, 16, 4, 64), jnp.float32).astype(jnp.bfloat16)
    k = jax.random.normal(keys[1], (3, 2, 32, 4, 64), jnp.float32).astype(jnp.bfloat16)
    v = jax.random.normal(keys[2], (3, 2, 32, 4, 64), jnp.float32).astype(jnp.bfloat16)
    w = jax.random.normal(keys[3], (3, 2, 16, 4, 64), jnp.float32)
    sinks = jnp.linspace(-1.0, 2.0, 4, dtype=jnp.float32)

    def loss(q, k, v, s, w):
        return (sj.attention(q, k, v, sinks=s).astype(jnp.float32) * w).sum()

    def reference(q, k, v, s, w):
        return (_sinks_reference(jnp, q, k, v, s)[0] * w).sum()

    axes = (0, 0, 0, None, 0)
    out = jax.jit(jax.vmap(lambda q, k, v, s: sj.attention(q, k, v, sinks=s), in_axes=axes[:4]))(q, k, v, sinks)
    expected = jax.vmap(lambda q, k, v, s: _sinks_reference(jnp, q, k, v, s)[0], in_axes=axes[:4])(q, k, v, sinks)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(expected), atol=2e-2)
    # (custom_vmap traces the call per example first, for its shapes; the last call is the one run)
    assert handler_stand_in[-1] == ("stridedfa_sdpa_forward_inference", (q.shape, k.shape, v.shape, (4,)))

    total = jax.jit(jax.grad(lambda *a: jax.vmap(loss, in_axes=axes)(*a).sum(), (0, 3)))(q, k, v, sinks, w)
    expected = jax.grad(lambda *a: jax.vmap(reference, in_axes=axes)(*a).sum(), (0, 3))(q, k, v, sinks, w)
    assert total[1].shape == (4,)
    np.testing.assert_allclose(np.asarray(total[1]), np.asarray(expected[1]), rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(np.asarray(total[0], np.float32), np.asarray(expected[0]), atol=5e-2)

    per_call = jax.jit(jax.vmap(jax.grad(loss, (0, 3)), in_axes=axes))(q, k, v, sinks, w)
    expected = jax.vmap(jax.grad(reference, (0, 3)), in_axes=axes)(q, k, v, sinks, w)
    assert per_call[1].shape == (3, 4)
    np.testing.assert_allclose(np.asarray(per_call[1]), np.asarray(expected[1]), rtol=2e-2, atol=2e-2)
    assert not np.allclose(np.asarray(per_call[1][0]), np.asarray(per_call[1][1]))  # not one sum for all
    np.testing.assert_allclose(np.asarray(per_call[0], np.float32), np.asarray(expected[0]), atol=5e-2)

    nest = lambda x: x.reshape(3, 1, *x.shape[1:])  # noqa: E731
    inner = jax.vmap(jax.grad(loss, 3), in_axes=axes)
    nested = jax.jit(jax.vmap(inner, in_axes=axes))(nest(q), nest(k), nest(v), sinks, nest(w))
    assert nested.shape == (3, 1, 4)
    np.testing.assert_allclose(np.asarray(nested[:, 0]), np.asarray(expected[1]), rtol=2e-2, atol=2e-2)


def test_vmapped_sinks(sj, jax):
    """Under jax.vmap sinks shared by the mapped calls (in_axes=None, or closed over) reach the calls
    unbroadcast, one (h_q,) array: the forward as one folded call, the backward per mapped call
    (its grad_sinks is that call's own). Mapped sinks are refused while tracing, also when jax.jit
    is inside the vmap."""
    jnp = jax.numpy
    q, kv = _spec(jax, (3, 2, 128, 8, 64)), _spec(jax, (3, 2, 256, 2, 64))
    sinks = _spec(jax, (8,), "float32")

    def f(q, k, v, s):
        return sj.attention(q, k, v, causal=True, sinks=s)

    def loss(q, k, v, s):
        return f(q, k, v, s).astype(jnp.float32).sum()

    axes = (0, 0, 0, None)
    assert jax.eval_shape(jax.vmap(f, in_axes=axes), q, kv, kv, sinks).shape == (3, 2, 128, 8, 64)
    grads = jax.eval_shape(jax.vmap(jax.grad(loss, (0, 1, 2, 3)), in_axes=axes), q, kv, kv, sinks)
    assert [g.shape for g in grads] == [q.shape, kv.shape, kv.shape, (3, 8)]
    summed = jax.eval_shape(jax.grad(lambda *a: jax.vmap(loss, in_axes=axes)(*a).sum(), 3), q, kv, kv, sinks)
    assert summed.shape == (8,)
    text = jax.jit(jax.grad(lambda *a: jax.vmap(loss, in_axes=axes)(*a).sum(), (0, 3))).lower(
        q, kv, kv, sinks).as_text()
    forward, backward = _custom_calls(text)
    arguments, results = re.search(r"\} : \((.*)\) -> (.*)$", forward).groups()
    assert f"optional_operands = {_bits('sinks')} : i64" in forward and arguments.split(", ") == [
        "tensor<3x2x128x8x64xbf16>", "tensor<3x2x256x2x64xbf16>", "tensor<3x2x256x2x64xbf16>", "tensor<8xf32>"]
    arguments, results = re.search(r"\} : \((.*)\) -> (.*)$", backward).groups()
    arguments = arguments.split(", ")
    assert f"optional_operands = {_bits('sinks', 'grad_sinks')} : i64" in backward, backward
    assert arguments[0] == "tensor<2x128x8x64xbf16>", backward
    assert arguments[-1] == "tensor<8xf32>" and results.count("tensor<") == 4 and "tensor<8xf32>" in results, backward
    closed = jnp.zeros((8,), jnp.float32)
    assert jax.eval_shape(jax.vmap(lambda q, k, v: f(q, k, v, closed)), q, kv, kv).shape == (3, 2, 128, 8, 64)
    assert jax.eval_shape(jax.vmap(jax.grad(lambda q, k, v: loss(q, k, v, closed))), q, kv, kv).shape == q.shape
    nested = jax.eval_shape(jax.vmap(jax.vmap(jax.grad(loss, (0, 3)), in_axes=axes), in_axes=axes),
                            _spec(jax, (4, 3, 2, 128, 8, 64)), _spec(jax, (4, 3, 2, 256, 2, 64)),
                            _spec(jax, (4, 3, 2, 256, 2, 64)), sinks)
    assert [g.shape for g in nested] == [(4, 3, 2, 128, 8, 64), (4, 3, 8)]
    # With the slopes too, both stay (8,).
    text = jax.jit(jax.vmap(lambda q, k, v, s: sj.attention(q, k, v, sinks=s, alibi_slopes=s), in_axes=axes)).lower(
        q, kv, kv, sinks).as_text()
    (call,) = _custom_calls(text)
    assert f"optional_operands = {_bits('sinks', 'alibi_slopes')} : i64" in call
    assert re.search(r"\} : \((.*)\) -> ", call).group(1).endswith("tensor<8xf32>, tensor<8xf32>"), call

    mapped = _spec(jax, (3, 8), "float32")
    refused = r"^sinks: mapped by jax.vmap .* pass them unmapped \(in_axes=None"
    with pytest.raises(stridedfa.UnsupportedError, match=refused):
        jax.eval_shape(jax.vmap(f), q, kv, kv, mapped)
    with pytest.raises(stridedfa.UnsupportedError, match=refused):
        jax.eval_shape(jax.vmap(jax.grad(loss, (0, 3))), q, kv, kv, mapped)
    with pytest.raises(stridedfa.UnsupportedError, match=refused):  # jax.jit inside: batched from its jaxpr
        jax.eval_shape(jax.vmap(jax.jit(f)), q, kv, kv, mapped)
    with pytest.raises(stridedfa.UnsupportedError, match=refused):
        jax.jit(jax.vmap(jax.jit(jax.grad(loss)))).lower(q, kv, kv, mapped)
    with pytest.raises(stridedfa.UnsupportedError, match=refused):  # mapped by the outer of two vmaps
        jax.eval_shape(jax.vmap(lambda q, k, v, s: jax.vmap(lambda q: f(q, k, v, s))(q), in_axes=(0, None, None, 0)),
                       _spec(jax, (4, 3, 2, 128, 8, 64)), _spec(jax, (2, 256, 2, 64)), _spec(jax, (2, 256, 2, 64)),
                       _spec(jax, (4, 8), "float32"))


@pytest.mark.parametrize("extra", ["sinks", "alibi_slopes"])
@pytest.mark.parametrize("how", ["eval_shape", "jit_lower", "vmap_of_jit"])
def test_vmapped_batch_shared_bias_is_refused_while_tracing(sj, jax, extra, how):
    """A call with sinks or ALiBi slopes goes through the custom_vmap rule, which validates the
    folded batch: a bias shared across the batch (1, h_q, s_q, s_kv) with b > 1 under jax.vmap is
    a typed error while tracing, not an XLA runtime error. Its own batch of the vmapped call folds."""
    q, kv = _spec(jax, (3, 2, 128, 8, 64)), _spec(jax, (3, 2, 256, 2, 64))
    per_head = _spec(jax, (8,), "float32")

    def f(q, k, v, bias, x):
        return sj.attention(q, k, v, bias=bias, **{extra: x})

    vmapped = {"eval_shape": lambda g, *a: jax.eval_shape(jax.vmap(g, in_axes=(0, 0, 0, None, None)), *a),
               "jit_lower": lambda g, *a: jax.jit(jax.vmap(g, in_axes=(0, 0, 0, None, None))).lower(*a),
               "vmap_of_jit": lambda g, *a: jax.eval_shape(jax.vmap(jax.jit(g), in_axes=(0, 0, 0, None, None)), *a)}
    with pytest.raises(stridedfa.LayoutError, match=r"^bias: under jax.vmap .* needs q's batch axis"):
        vmapped[how](f, q, kv, kv, _spec(jax, (1, 8, 128, 256)), per_head)
    assert vmapped["eval_shape"](f, q, kv, kv, _spec(jax, (2, 8, 128, 256)), per_head).shape == q.shape
    # Under jax.grad too (refused by the forward's rule, traced before the backward).
    with pytest.raises(stridedfa.LayoutError, match=r"^bias: under jax.vmap .* needs q's batch axis"):
        vmapped[how](jax.grad(lambda *a: f(*a).astype("float32").sum(), 0), q, kv, kv,
                     _spec(jax, (1, 8, 128, 256)), per_head)


def test_dispatcher_passes_alibi_slopes_to_the_jax_adapter(sj, jax):
    q, kv, slopes = _spec(jax, (2, 8, 128, 64)), _spec(jax, (2, 2, 256, 64)), _spec(jax, (8,), "float32")
    text = jax.jit(lambda q, k, v, s: stridedfa.attention(q, k, v, alibi_slopes=s)).lower(q, kv, kv, slopes).as_text()
    calls = _custom_calls(text)
    assert len(calls) == 1 and "layout = 1 : i64" in calls[0]
    assert f"optional_operands = {_bits('alibi_slopes')} : i64" in calls[0]


def test_traced_scale_is_refused(sj, jax):
    q = _spec(jax, (1, 16, 2, 64))
    with pytest.raises(TypeError, match="static"):
        jax.jit(lambda q, s: sj.attention(q, q, q, scale=s)).lower(q, 0.5)


def test_eager_call_on_cpu_arrays_names_the_device(sj, jax):
    q = jax.numpy.ones((1, 16, 2, 64), "bfloat16", device=jax.devices("cpu")[0])
    with pytest.raises(stridedfa.LayoutError, match="q lives on cpu"):
        sj.attention(q, q, q)


def test_handlers_decode_every_operand_and_attribute(sj):
    """Registered for the CPU platform (in a subprocess), each handler runs XLA's decoding of its
    arguments, results and attributes; on CPU only the GPU stream (operand 0) cannot be had.
    Anything else reported (a wrong attribute name or type, a missing result) fails here."""
    result = run_python("""
        import numpy as np
        import jax, jax.numpy as jnp
        import stridedfa.jax as sj
        from stridedfa import _core
        for name, capsule in _core._jax_ffi_targets().items():
            jax.ffi.register_ffi_target(name, capsule, platform="cpu")
        q = jnp.ones((1, 16, 2, 64), jnp.bfloat16)
        kv = jnp.ones((1, 32, 1, 64), jnp.bfloat16)
        options = sj._Options("bshd", 0.5, True, "bottom_right")
        lengths = (jnp.full((1,), 16, jnp.int32), jnp.full((1,), 32, jnp.int32))
        padded = sj._Options("bshd", 0.5, True, "bottom_right", window=(7, None), softcap=30.0,
                             deterministic=True, padded=True)
        # every operand at once: top-left without a softcap, as the core refuses a bias with a
        # bottom-right mask and padding, and a bias' gradient under a softcap or ALiBi
        padded_all = sj._Options("bshd", 0.5, True, "top_left", window=(7, None), deterministic=True, padded=True)
        sinks = (jnp.zeros((2,), jnp.float32),)
        bias = (jnp.zeros((16, 32), jnp.bfloat16),)
        slopes = (jnp.ones((2,), jnp.float32),)
        state = (sj._rng_state(jax.random.key(0)),)
        dropout = sj._Options("bshd", 0.5, True, "bottom_right", dropout_p=0.2)
        # top-left: the core refuses dropout with a bottom-right mask and padding
        dropout_all = sj._Options("bshd", 0.5, True, "top_left", window=(7, None), deterministic=True, padded=True,
                                  dropout_p=0.2)
        def backward(q, k, v, lengths=(), options=options, sinks=(), bias=(), bias_wanted=(), slopes=(), rng=(),
                     sinks_wanted=None):
            out, lse = jnp.ones_like(q), jnp.zeros((1, 2, 16), jnp.float32)  # inputs made up
            wanted = sinks if sinks_wanted is None else sinks_wanted
            residuals = (q, k, v, lengths, sinks, wanted, bias, bias_wanted, slopes, rng, out, lse)
            return sj._attention_bwd(options, residuals, out)
        def wrong_attribute_type(q, k, v):  # one option's type, as the handlers decode the options
            attributes = options.attributes()
            attributes["options"] = dict(attributes["options"], scale=np.float32(0.5))
            return jax.ffi.ffi_call("stridedfa_sdpa_forward_inference", jax.ShapeDtypeStruct(q.shape, q.dtype))(
                q, k, v, **attributes)
        def missing_option(q, k, v):
            attributes = options.attributes()
            del attributes["options"]["softcap"]
            return jax.ffi.ffi_call("stridedfa_sdpa_forward_inference", jax.ShapeDtypeStruct(q.shape, q.dtype))(
                q, k, v, **attributes)
        calls = {
            "inference": lambda q, k, v: sj._forward_call(q, k, v, (), (), options, with_lse=False)[0],
            "forward": lambda q, k, v: sj._forward_call(q, k, v, (), (), options, with_lse=True),
            "backward": backward,
            "inference_padded": lambda q, k, v: sj._forward_call(q, k, v, lengths, (), padded, with_lse=False)[0],
            "forward_padded": lambda q, k, v: sj._forward_call(q, k, v, lengths, (), padded, with_lse=True),
            "backward_padded": lambda q, k, v: backward(q, k, v, lengths, padded),
            "forward_sinks": lambda q, k, v: sj._forward_call(q, k, v, lengths, sinks, padded, with_lse=True),
            "backward_sinks": lambda q, k, v: backward(q, k, v, lengths, padded, sinks),
            "backward_fixed_sinks": lambda q, k, v: backward(q, k, v, lengths, padded, sinks, sinks_wanted=()),
            "inference_bias": lambda q, k, v: sj._forward_call(q, k, v, (), (), options, False, bias)[0],
            "forward_bias": lambda q, k, v: sj._forward_call(q, k, v, (), (), options, True, bias),
            "backward_bias": lambda q, k, v: backward(q, k, v, bias=bias, bias_wanted=bias),
            "backward_constant_bias": lambda q, k, v: backward(q, k, v, bias=bias),
            "forward_all": lambda q, k, v: sj._forward_call(q, k, v, lengths, sinks, padded_all, True, bias),
            "backward_all": lambda q, k, v: backward(q, k, v, lengths, padded_all, sinks, bias, bias),
            "inference_alibi": lambda q, k, v: sj._forward_call(q, k, v, (), (), options, False, (), slopes)[0],
            "forward_alibi": lambda q, k, v: sj._forward_call(q, k, v, (), (), options, True, (), slopes),
            "backward_alibi": lambda q, k, v: backward(q, k, v, slopes=slopes),
            "forward_all_alibi": lambda q, k, v: sj._forward_call(q, k, v, lengths, sinks, padded_all, True, bias,
                                                                  slopes),
            "backward_all_alibi": lambda q, k, v: backward(q, k, v, lengths, padded_all, sinks, bias, (), slopes),
            "inference_dropout": lambda q, k, v: sj._forward_call(q, k, v, (), (), dropout, False, rng_state=state)[0],
            "forward_dropout": lambda q, k, v: sj._forward_call(q, k, v, (), (), dropout, True, rng_state=state),
            "backward_dropout": lambda q, k, v: backward(q, k, v, options=dropout, rng=state),
            "forward_all_dropout": lambda q, k, v: sj._forward_call(q, k, v, lengths, sinks, dropout_all, True, bias,
                                                                    slopes, state),
            # (no sinks: cuDNN gets their gradient wrong under dropout, which the core refuses)
            "backward_all_dropout": lambda q, k, v: backward(q, k, v, lengths, dropout_all, (), bias, (), slopes,
                                                             state),
            "control": wrong_attribute_type,
            "control_missing": missing_option,
        }
        for name, f in calls.items():
            try:
                jax.block_until_ready(jax.jit(f)(q, kv, kv))
            except Exception as error:
                message = str(error).replace(chr(10), " | ")
                print(f"{name}: {message}")
            else:
                print(f"{name}: ran")
    """)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(": ", 1) for line in result.stdout.strip().splitlines())
    decoded = ("inference", "forward", "backward", "inference_padded", "forward_padded", "backward_padded",
               "forward_sinks", "backward_sinks", "backward_fixed_sinks", "inference_bias", "forward_bias",
               "backward_bias",
               "backward_constant_bias", "forward_all", "backward_all", "inference_alibi", "forward_alibi",
               "backward_alibi", "forward_all_alibi", "backward_all_alibi", "inference_dropout", "forward_dropout",
               "backward_dropout", "forward_all_dropout", "backward_all_dropout")
    assert set(lines) == {*decoded, "control", "control_missing"}, result.stdout
    for name in decoded:
        assert "bad operands at: 0)" in lines[name], (name, lines[name])
        assert "platform stream" in lines[name], (name, lines[name])
    # The controls pass the option scale as f32, and no softcap: decoding must report the options
    # attribute too (operand 8: after 3 contexts, 3 arguments, the remaining arguments and 1 result,
    # options is the first attribute), naming the field.
    assert "bad operands at: 0, 8)" in lines["control"], lines["control"]
    assert "options.scale" in lines["control"], lines["control"]
    assert "bad operands at: 0, 8)" in lines["control_missing"], lines["control_missing"]
    assert "options.softcap" in lines["control_missing"], lines["control_missing"]


def test_what_the_plan_refuses_is_refused_while_tracing():
    """_validate_shapes plans the call as the handler would: a bias' gradient under a softcap, a band
    that cannot be shifted, are typed errors at trace time, not XLA runtime failures."""
    bias = ((S_Q, S_KV), "bfloat16")
    with pytest.raises(stridedfa.UnsupportedError, match="the bias' gradient with a softcap"):
        _core._validate_shapes(True, 0, JAX_BACKWARD, "bfloat16", softcap=30.0, bias=bias, grad_bias=True)
    _core._validate_shapes(True, 0, JAX_BACKWARD, "bfloat16", softcap=30.0, bias=bias, grad_bias=False)
    with pytest.raises(stridedfa.UnsupportedError, match="because the bias. gradient keeps every key"):
        _core._validate_shapes(True, 0, JAX_BACKWARD, "bfloat16", causal_alignment="bottom_right", window=(3, None),
                            bias=bias, grad_bias=True)
