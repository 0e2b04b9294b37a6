"""stridedfa.jax on a GPU: eager, jit, grad and vmap against the fp32 NumPy reference and JAX's own
cuDNN attention; inputs never written; one compilation per shape; graphs shared through the core's
cache with JAX, sdpa_forward and torch callers; typed errors before launch.

Needs JAX with its CUDA backend (skips otherwise); torch only for the cross-framework cache and
dropout tests.
Run: ``python -m pytest -q -m gpu tests/gpu/test_jax.py`` from outside the source tree's src/.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import stridedfa  # noqa: E402
from stridedfa import reference  # noqa: E402

try:
    import stridedfa.jax as sj
except ImportError as exc:  # a JAX too old for stridedfa.jax
    pytest.skip(str(exc), allow_module_level=True)

pytestmark = pytest.mark.gpu
GPU = None  # JAX's first CUDA device, set by the fixture below


@pytest.fixture(scope="module", autouse=True)
def _jax_gpu():
    """Skips the module without a JAX CUDA backend; initialises it only when these tests run."""
    global GPU
    try:
        GPU = jax.devices("gpu")[0]
    except RuntimeError as exc:  # no CUDA plugin, or it cannot see a device
        pytest.skip(f"JAX has no GPU backend: {exc}")


DTYPES = {"float16": jnp.float16, "bfloat16": jnp.bfloat16}
# Against the fp32 reference (the values tests/helpers/checks.py uses for torch).
TOLERANCE = {  # dtype: (out atol, out rtol, lse atol, grad rel to max |ref|)
    "float16": (5e-3, 5e-3, 2e-3, 1e-2),
    "bfloat16": (2e-2, 1e-2, 2e-3, 3e-2),
}
BF16 = TOLERANCE["bfloat16"]

# (id, layout, b, h_q, h_kv, s_q, s_kv, d_qk, d_v, causal, causal_alignment)
CASES = [
    ("bshd", "bshd", 2, 4, 4, 128, 128, 64, 64, False, "top_left"),
    ("bhsd-causal", "bhsd", 2, 4, 4, 128, 128, 64, 64, True, "top_left"),
    ("bshd-gqa-causal-tl-sq<skv", "bshd", 2, 8, 2, 64, 192, 128, 128, True, "top_left"),
    ("bshd-gqa-causal-br-sq<skv", "bshd", 2, 8, 2, 64, 192, 128, 128, True, "bottom_right"),
    ("bhsd-mqa-causal-br-sq<skv", "bhsd", 1, 4, 1, 128, 256, 64, 64, True, "bottom_right"),
    ("bhsd-gqa-causal-tl-sq>skv", "bhsd", 1, 6, 2, 192, 128, 64, 64, True, "top_left"),
    ("bshd-d192-128", "bshd", 1, 4, 4, 128, 128, 192, 128, False, "top_left"),
]


def _shape(layout, b, h, s, d):
    return (b, s, h, d) if layout == "bshd" else (b, h, s, d)


def _to_logical(x, layout):
    """A JAX array in `layout` as a float32 NumPy (b, h, s, d) array."""
    x = np.asarray(x.astype(jnp.float32))
    return x.transpose(0, 2, 1, 3) if layout == "bshd" else x


def _seed(request) -> int:
    return zlib.crc32(request.node.nodeid.encode()) & 0x7FFFFFFF


def _inputs(case, dtype, seed):
    _, layout, b, h_q, h_kv, s_q, s_kv, d_qk, d_v, _, _ = case
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    shapes = (_shape(layout, b, h_q, s_q, d_qk), _shape(layout, b, h_kv, s_kv, d_qk),
              _shape(layout, b, h_kv, s_kv, d_v), _shape(layout, b, h_q, s_q, d_v))
    q, k, v, w = (jax.device_put(jax.random.normal(key, shape, jnp.float32).astype(DTYPES[dtype]), GPU)
                  for key, shape in zip(keys, shapes))
    return q, k, v, w  # w: the weights of the loss, i.e. the output gradient (random, never zeros)


def _bits(x):
    x = np.asarray(x)
    return x.view(np.uint16) if x.dtype.itemsize == 2 else x.copy()


def _assert_unchanged(arrays, saved):
    for name, x, before in zip("qkv", arrays, saved):
        assert np.array_equal(_bits(x), before), f"{name} was written by the call"


def _assert_close(actual, expected, atol, rtol, name):
    actual = np.asarray(actual, np.float32)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    assert not np.isnan(actual).any(), f"{name}: NaN in the result"
    err = np.abs(actual - expected)
    bad = err > atol + rtol * np.abs(expected)
    assert not bad.any(), (f"{name}: max abs err {err.max():.3e} (allowed {atol:.1e} + {rtol:.1e}*|ref|), "
                           f"{int(bad.sum())} of {bad.size} elements out of tolerance")


def _assert_close_to_scale(actual, expected, rel, name):
    actual = np.asarray(actual, np.float32)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    assert not np.isnan(actual).any(), f"{name}: NaN in the result"
    err, scale = float(np.abs(actual - expected).max()), float(np.abs(expected).max())
    assert err <= rel * scale, f"{name}: max abs err {err:.3e} > {rel:.1e} * max |ref| ({scale:.3e})"


def _options(case):
    return {"layout": case[1], "causal": case[9], "causal_alignment": case[10]}


def _loss(options):
    def loss(q, k, v, w):
        return jnp.sum(sj.attention(q, k, v, **options).astype(jnp.float32) * w.astype(jnp.float32))
    return loss


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_eager_jit_and_grad_match_reference(case, dtype, request):
    layout = case[1]
    options = _options(case)
    q, k, v, w = _inputs(case, dtype, _seed(request))
    saved = [_bits(x) for x in (q, k, v)]
    out_atol, out_rtol, lse_atol, grad_rel = TOLERANCE[dtype]
    ql, kl, vl, wl = (_to_logical(x, layout) for x in (q, k, v, w))
    ref_out, ref_lse = reference.sdpa_forward(ql, kl, vl, causal=case[9], causal_alignment=case[10])
    ref_grads = reference.sdpa_backward(ql, kl, vl, wl, causal=case[9], causal_alignment=case[10])

    eager = sj.attention(q, k, v, **options).block_until_ready()
    assert eager.dtype == q.dtype and eager.shape == _shape(layout, case[2], case[3], case[5], case[8])
    _assert_close(_to_logical(eager, layout), ref_out, out_atol, out_rtol, "eager out")

    jitted = jax.jit(lambda q, k, v: sj.attention(q, k, v, **options))(q, k, v).block_until_ready()
    _assert_close(_to_logical(jitted, layout), ref_out, out_atol, out_rtol, "jit out")

    # The statistics the backward reads: float32 (b, h_q, s_q) natural-log logsumexp.
    _, lse = jax.jit(lambda q, k, v: sj._forward_call(q, k, v, (), (), sj._options(layout, None, case[9], case[10]),
                                                      with_lse=True))(q, k, v)
    _assert_close(np.asarray(lse), ref_lse, lse_atol, 0.0, "lse")

    grads = jax.jit(jax.grad(_loss(options), (0, 1, 2)))(q, k, v, w)
    for name, got, want in zip(("grad_q", "grad_k", "grad_v"), grads, ref_grads):
        assert got.dtype == q.dtype
        _assert_close_to_scale(_to_logical(got, layout), want, grad_rel, name)
    eager_grads = jax.grad(_loss(options), (0, 1, 2))(q, k, v, w)
    for name, got, want in zip(("grad_q", "grad_k", "grad_v"), eager_grads, ref_grads):
        _assert_close_to_scale(_to_logical(got, layout), want, grad_rel, f"eager {name}")
    _assert_unchanged((q, k, v), saved)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("case", [c for c in CASES if c[10] == "top_left" and c[7] == c[8]],
                         ids=lambda c: c[0])
def test_matches_jax_cudnn_attention(case, dtype, request):
    """Against jax.nn.dot_product_attention(implementation="cudnn") (bshd arrays; its causal mask
    is top-left; it requires d_v == d_qk), outputs and all three gradients, within bf16 tolerance.
    Cases JAX's cuDNN path refuses (NotImplementedError) skip with its reason."""
    layout = case[1]
    options = _options(case)
    q, k, v, w = _inputs(case, dtype, _seed(request))
    to_bshd = (lambda x: x) if layout == "bshd" else (lambda x: jnp.swapaxes(x, 1, 2))

    def theirs(q, k, v):
        return to_bshd(jax.nn.dot_product_attention(to_bshd(q), to_bshd(k), to_bshd(v), is_causal=case[9],
                                                    implementation="cudnn"))

    def loss_theirs(q, k, v, w):
        return jnp.sum(theirs(q, k, v).astype(jnp.float32) * w.astype(jnp.float32))

    try:
        want = jax.jit(theirs)(q, k, v)
        want_grads = jax.jit(jax.grad(loss_theirs, (0, 1, 2)))(q, k, v, w)
    except NotImplementedError as exc:  # JAX's cuDNN path refuses some configurations
        pytest.skip(f"jax.nn.dot_product_attention(implementation='cudnn') cannot run this case: {exc}")
    got = jax.jit(lambda q, k, v: sj.attention(q, k, v, **options))(q, k, v)
    got_grads = jax.jit(jax.grad(_loss(options), (0, 1, 2)))(q, k, v, w)
    _assert_close(_to_logical(got, layout), _to_logical(want, layout), BF16[0], BF16[1], "out vs JAX cuDNN")
    for name, a, b in zip(("grad_q", "grad_k", "grad_v"), got_grads, want_grads):
        _assert_close_to_scale(_to_logical(a, layout), _to_logical(b, layout), BF16[3], f"{name} vs JAX cuDNN")


# --- The score bias ----------------------------------------------------------------------------

# The bias' shape for a problem (b, h_q, s_q, s_kv): always the logical axes, in either layout.
BIAS_SHAPES = {
    "full": lambda b, h, s_q, s_kv: (b, h, s_q, s_kv),
    "heads": lambda b, h, s_q, s_kv: (1, h, s_q, s_kv),      # shared by the batch (T5, ALiBi-like)
    "padding": lambda b, h, s_q, s_kv: (b, 1, 1, s_kv),      # one value per key of each sequence
    "2d": lambda b, h, s_q, s_kv: (s_q, s_kv),               # fewer axes: leading axes of 1
}
# (id, layout, b, h_q, h_kv, s_q, s_kv, d_qk, d_v, causal, causal_alignment)
BIAS_CASE = ("bias", "bshd", 2, 4, 2, 128, 192, 64, 64, False, "top_left")
MASKS = {"none": (False, "top_left"), "causal-tl": (True, "top_left"), "causal-br": (True, "bottom_right")}


def _bias_input(shape, dtype, seed):
    """A random bias; the padding shape also masks the last keys of batch 1 (-1e4: no row empties)."""
    bias = np.array(jax.random.normal(jax.random.PRNGKey(seed + 11), shape, jnp.float32))
    if len(shape) == 4 and shape[1] == shape[2] == 1 and shape[0] > 1:
        bias[1, :, :, -60:] = -1e4
    return jax.device_put(jnp.asarray(bias).astype(DTYPES[dtype]), GPU)


def _bias_loss(options):
    def loss(q, k, v, bias, w):
        out = sj.attention(q, k, v, bias=bias, **options)
        return jnp.sum(out.astype(jnp.float32) * w.astype(jnp.float32))
    return loss


def _bias_problem(layout, kind, mask, dtype, request):
    """Inputs, bias, options and the fp32 reference (out, (dq, dk, dv), dbias) of a bias case."""
    causal, alignment = MASKS[mask]
    case = (BIAS_CASE[0], layout, *BIAS_CASE[2:9], causal, alignment)
    _, _, b, h_q, _, s_q, s_kv, _, _, _, _ = case
    q, k, v, w = _inputs(case, dtype, _seed(request))
    bias = _bias_input(BIAS_SHAPES[kind](b, h_q, s_q, s_kv), dtype, _seed(request))
    ql, kl, vl, wl = (_to_logical(x, layout) for x in (q, k, v, w))
    bias_ref = np.asarray(bias.astype(jnp.float32))
    mask_options = {"causal": causal, "causal_alignment": alignment}
    ref_out, _ = reference.sdpa_forward(ql, kl, vl, bias=bias_ref, **mask_options)
    *ref_grads, extra = reference.sdpa_backward(ql, kl, vl, wl, bias=bias_ref, return_extra=True, **mask_options)
    return case, (q, k, v, bias, w), _options(case), (ref_out, ref_grads, extra["dbias"])


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("kind", list(BIAS_SHAPES))
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_bias_forward_and_grads_match_reference(layout, kind, mask, dtype, request):
    """Forward (eager and jitted) and jax.grad w.r.t. q, k and v under jax.jit with a constant bias
    (not differentiated: the backward computes no grad_bias), against the fp32 reference."""
    case, (q, k, v, bias, w), options, (ref_out, ref_grads, _) = _bias_problem(layout, kind, mask, dtype, request)
    _, _, b, h_q, _, s_q, _, _, d_v, _, _ = case
    saved = [_bits(x) for x in (q, k, v, bias)]
    out_atol, out_rtol, _, grad_rel = TOLERANCE[dtype]

    eager = sj.attention(q, k, v, bias=bias, **options)
    assert eager.shape == _shape(layout, b, h_q, s_q, d_v) and eager.dtype == q.dtype
    _assert_close(_to_logical(eager, layout), ref_out, out_atol, out_rtol, "eager out")
    jitted = jax.jit(lambda q, k, v, bias: sj.attention(q, k, v, bias=bias, **options))(q, k, v, bias)
    _assert_close(_to_logical(jitted, layout), ref_out, out_atol, out_rtol, "jit out")

    grads = jax.jit(jax.grad(_bias_loss(options), (0, 1, 2)))(q, k, v, bias, w)
    for name, got, want in zip(("grad_q", "grad_k", "grad_v"), grads, ref_grads):
        assert got.dtype == q.dtype
        _assert_close_to_scale(_to_logical(got, layout), want, grad_rel, name)
    _assert_unchanged((q, k, v), saved[:3])
    assert np.array_equal(_bits(bias), saved[3]), "bias was written by the call"


def _dbias_params():
    # s_q = 128 < s_kv = 192; the padding kind (shared along seq of q) is refused while tracing (the
    # core's grad_bias was wrong there, and dq with it). The top-left causal cases were strict
    # xfails (no cuDNN engine once keys no row sees were cut off the packed dbias); since the core
    # keeps every key for a bias' gradient they run: GPU runs 31 and 33 reported all six as
    # failing their strict xfail (13236f8; not yet seen passing without the mark).
    for layout in ("bshd", "bhsd"):
        for kind in BIAS_SHAPES:
            for mask in MASKS:
                yield pytest.param(layout, kind, mask, id=f"{layout}-{kind}-{mask}")


@pytest.mark.parametrize("layout, kind, mask", list(_dbias_params()))
def test_bias_gradient_matches_reference(layout, kind, mask, request):
    """jax.grad w.r.t. q, k, v and the bias under jax.jit: the bias' cotangent has the bias' shape
    and dtype, its shared axes summed, as the reference's dbias."""
    dtype = "bfloat16"
    _, (q, k, v, bias, w), options, (_, ref_grads, ref_dbias) = _bias_problem(layout, kind, mask, dtype, request)
    grad_rel = TOLERANCE[dtype][3]
    if kind == "padding":  # (b, 1, 1, s_kv): refused while tracing, before anything runs
        with pytest.raises(stridedfa.UnsupportedError, match="bias shared over query rows"):
            jax.jit(jax.grad(_bias_loss(options), (0, 1, 2, 3)))(q, k, v, bias, w)
        return
    grads = jax.jit(jax.grad(_bias_loss(options), (0, 1, 2, 3)))(q, k, v, bias, w)
    for name, got, want in zip(("grad_q", "grad_k", "grad_v"), grads[:3], ref_grads):
        _assert_close_to_scale(_to_logical(got, layout), want, grad_rel, name)
    grad_bias = grads[3]
    assert grad_bias.shape == bias.shape and grad_bias.dtype == bias.dtype
    _assert_close_to_scale(grad_bias, ref_dbias, grad_rel, "grad_bias")
    eager = jax.grad(_bias_loss(options), 3)(q, k, v, bias, w)
    _assert_close_to_scale(eager, ref_dbias, grad_rel, "eager grad_bias")


def test_fixed_sinks_get_no_gradient_and_the_others_stay_right(request):
    """Sinks closed over (not differentiated): the backward asks cuDNN for no sinks' gradient
    (optional_operands bit 64 off: the handler has no grad_sinks result), and the gradients of q, k
    and v still match the reference with those sinks (they enter through lse). Written after GPU
    run 33: not yet run."""
    case = ("fixed-sinks", "bhsd", 2, 4, 2, 128, 192, 64, 64, True, "top_left")
    _, layout, _, h_q, _, _, _, _, _, causal, alignment = case
    options = _options(case)
    q, k, v, w = _inputs(case, "bfloat16", _seed(request))
    sinks = jax.device_put(jnp.linspace(-1.0, 2.0, h_q, dtype=jnp.float32), GPU)

    def loss(q, k, v, w):
        out = sj.attention(q, k, v, sinks=sinks, **options)
        return jnp.sum(out.astype(jnp.float32) * w.astype(jnp.float32))

    grads = jax.jit(jax.grad(loss, (0, 1, 2)))(q, k, v, w)
    ql, kl, vl, wl = (_to_logical(x, layout) for x in (q, k, v, w))
    ref = reference.sdpa_backward(ql, kl, vl, wl, sinks=np.asarray(sinks), causal=causal, causal_alignment=alignment)
    for name, got, want in zip(("grad_q", "grad_k", "grad_v"), grads, ref):
        _assert_close_to_scale(_to_logical(got, layout), want, TOLERANCE["bfloat16"][3], name)


def test_bias_with_sinks_and_padding_matches_reference(request):
    """Every optional operand at once (seqlens_kv, sinks, bias: the handlers' order), each
    differentiable one with its gradient."""
    case = ("bias-all", "bhsd", 2, 4, 2, 128, 192, 64, 64, True, "top_left")
    _, layout, b, h_q, _, s_q, s_kv, _, _, causal, alignment = case
    options = _options(case)
    q, k, v, w = _inputs(case, "bfloat16", _seed(request))
    bias = _bias_input((1, h_q, s_q, s_kv), "bfloat16", _seed(request))
    sinks = jax.device_put(jnp.linspace(-1.0, 2.0, h_q, dtype=jnp.float32), GPU)
    lengths = jax.device_put(jnp.asarray([s_kv, 100], jnp.int32), GPU)

    def loss(q, k, v, bias, sinks, w):
        out = sj.attention(q, k, v, bias=bias, sinks=sinks, seqlens_kv=lengths, **options)
        return jnp.sum(out.astype(jnp.float32) * w.astype(jnp.float32)), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2, 3, 4), has_aux=True))(q, k, v, bias, sinks, w)
    ql, kl, vl, wl = (_to_logical(x, layout) for x in (q, k, v, w))
    variants = {"bias": np.asarray(bias.astype(jnp.float32)), "sinks": np.asarray(sinks),
                "seqlens_kv": np.asarray(lengths), "causal": causal, "causal_alignment": alignment}
    ref_out, _ = reference.sdpa_forward(ql, kl, vl, **variants)
    *ref_grads, extra = reference.sdpa_backward(ql, kl, vl, wl, return_extra=True, **variants)
    _assert_close(_to_logical(out, layout), ref_out, *BF16[:2], "out")
    for name, got, want in zip(("grad_q", "grad_k", "grad_v"), grads[:3], ref_grads):
        _assert_close_to_scale(_to_logical(got, layout), want, BF16[3], name)
    assert grads[3].shape == bias.shape and grads[4].shape == sinks.shape
    _assert_close_to_scale(grads[3], extra["dbias"], BF16[3], "grad_bias")
    _assert_close_to_scale(grads[4], extra["dsinks"], BF16[3], "grad_sinks")


def test_bias_under_vmap(request):
    """A bias with q's batch axis folds into the batch under jax.vmap (mapped or not); a bias shared
    across the batch is refused when the call runs, naming the way out."""
    case = BIAS_CASE
    options = _options(case)
    _, _, b, h_q, _, s_q, s_kv, _, _, _, _ = case
    batched = [jnp.stack([x, x * 0.5]) for x in _inputs(case, "bfloat16", _seed(request))]
    q, k, v, w = batched
    bias = jnp.stack([_bias_input((b, 1, s_q, s_kv), "bfloat16", _seed(request) + i) for i in range(2)])
    out = jax.jit(jax.vmap(lambda q, k, v, bias: sj.attention(q, k, v, bias=bias, **options)))(q, k, v, bias)
    grads = jax.jit(jax.vmap(jax.grad(_bias_loss(options), (0, 3))))(q, k, v, bias, w)
    for i in range(2):
        one = sj.attention(q[i], k[i], v[i], bias=bias[i], **options)
        _assert_close(np.asarray(out[i], np.float32), np.asarray(one, np.float32), BF16[0], BF16[1],
                      f"vmapped out[{i}]")
        one_grads = jax.grad(_bias_loss(options), (0, 3))(q[i], k[i], v[i], bias[i], w[i])
        for name, a, c in zip(("grad_q", "grad_bias"), grads, one_grads):
            _assert_close_to_scale(a[i], np.asarray(c, np.float32), BF16[3], f"vmapped {name}[{i}]")
    # Not mapped (in_axes None): broadcast to every call, its cotangent summed over them.
    shared = jax.jit(jax.vmap(jax.grad(_bias_loss(options), 3), in_axes=(0, 0, 0, None, 0)))(q, k, v, bias[0], w)
    summed = sum(jax.grad(_bias_loss(options), 3)(q[i], k[i], v[i], bias[0], w[i]).astype(jnp.float32)
                 for i in range(2))
    _assert_close_to_scale(shared.astype(jnp.float32).sum(0), np.asarray(summed), BF16[3], "unmapped grad_bias")
    with pytest.raises(Exception, match=r"stridedfa LayoutError: bias: under jax.vmap .* needs q's batch axis"):
        jax.block_until_ready(jax.vmap(lambda q, k, v: sj.attention(q, k, v, bias=bias[0, 0, 0], **options))(q, k, v))


def test_bias_through_the_dispatcher(request):
    """stridedfa.attention on jax arrays: (b, h, s, d) axes (layout bhsd), the bias passed on."""
    case = ("bias-dispatch", "bhsd", *BIAS_CASE[2:])
    q, k, v, _ = _inputs(case, "bfloat16", _seed(request))
    bias = _bias_input((case[5], case[6]), "bfloat16", _seed(request))
    got = stridedfa.attention(q, k, v, bias=bias)
    want = sj.attention(q, k, v, bias=bias, layout="bhsd")
    assert np.array_equal(_bits(got), _bits(want))


# --- ALiBi slopes ------------------------------------------------------------------------------

# (id, layout, b, h_q, h_kv, s_q, s_kv, d_qk, d_v, causal, causal_alignment): GQA, s_q < s_kv.
ALIBI_CASE = ("alibi", "bshd", 2, 8, 2, 128, 192, 64, 64, False, "top_left")
ALIBI_MASKS = {"none": (False, "top_left"), "causal-tl": (True, "top_left")}


def _alibi_slopes(h_q):
    """BLOOM's slopes 2**(-8 (h + 1) / h_q), float32 (h_q,) on the GPU."""
    return jax.device_put(jnp.asarray(2.0 ** (-8.0 * np.arange(1, h_q + 1) / h_q), jnp.float32), GPU)


def _alibi_problem(layout, mask, dtype, request):
    """Inputs, slopes, options and the fp32 reference (out, (dq, dk, dv)) of an ALiBi case."""
    causal, alignment = ALIBI_MASKS[mask]
    case = (ALIBI_CASE[0], layout, *ALIBI_CASE[2:9], causal, alignment)
    q, k, v, w = _inputs(case, dtype, _seed(request))
    slopes = _alibi_slopes(case[3])
    ql, kl, vl, wl = (_to_logical(x, layout) for x in (q, k, v, w))
    variants = {"alibi_slopes": np.asarray(slopes), "causal": causal, "causal_alignment": alignment}
    ref_out, _ = reference.sdpa_forward(ql, kl, vl, **variants)
    ref_grads = reference.sdpa_backward(ql, kl, vl, wl, **variants)
    return case, (q, k, v, slopes, w), _options(case), (ref_out, ref_grads)


def _alibi_loss(options):
    def loss(q, k, v, slopes, w):
        out = sj.attention(q, k, v, alibi_slopes=slopes, **options)
        return jnp.sum(out.astype(jnp.float32) * w.astype(jnp.float32))
    return loss


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("mask", list(ALIBI_MASKS))
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_alibi_forward_and_grads_match_reference(layout, mask, dtype, request):
    """Forward (eager and jitted) and jax.grad w.r.t. q, k and v under jax.jit with ALiBi slopes
    2**(-8 (h + 1) / h_q), bidirectional and causal top-left, against the fp32 reference; the
    slopes' own cotangent is zero and nothing is written."""
    case, (q, k, v, slopes, w), options, (ref_out, ref_grads) = _alibi_problem(layout, mask, dtype, request)
    _, _, b, h_q, _, s_q, _, _, d_v, _, _ = case
    saved = [_bits(x) for x in (q, k, v, slopes)]
    out_atol, out_rtol, _, grad_rel = TOLERANCE[dtype]

    eager = sj.attention(q, k, v, alibi_slopes=slopes, **options)
    assert eager.shape == _shape(layout, b, h_q, s_q, d_v) and eager.dtype == q.dtype
    _assert_close(_to_logical(eager, layout), ref_out, out_atol, out_rtol, "eager out")
    jitted = jax.jit(lambda q, k, v, s: sj.attention(q, k, v, alibi_slopes=s, **options))(q, k, v, slopes)
    _assert_close(_to_logical(jitted, layout), ref_out, out_atol, out_rtol, "jit out")
    without = sj.attention(q, k, v, **options)  # the slopes change the result (a term that matters)
    assert float(jnp.abs(without.astype(jnp.float32) - eager.astype(jnp.float32)).max()) > 10 * out_atol

    grads = jax.jit(jax.grad(_alibi_loss(options), (0, 1, 2, 3)))(q, k, v, slopes, w)
    for name, got, want in zip(("grad_q", "grad_k", "grad_v"), grads[:3], ref_grads):
        assert got.dtype == q.dtype
        _assert_close_to_scale(_to_logical(got, layout), want, grad_rel, name)
    assert grads[3].shape == slopes.shape and not np.asarray(grads[3]).any(), "the slopes have no gradient"
    _assert_unchanged((q, k, v), saved[:3])
    assert np.array_equal(_bits(slopes), saved[3]), "alibi_slopes were written by the call"


def test_alibi_with_return_lse_and_sinks_matches_reference(request):
    """ALiBi with the statistics returned and with sinks and a constant bias (every input operand
    but the lengths, in the handlers' order), jitted, with the sinks' gradient."""
    case = ("alibi-all", "bhsd", 2, 4, 2, 128, 192, 64, 64, True, "top_left")
    layout, h_q, s_q, s_kv = case[1], case[3], case[5], case[6]
    options = _options(case)
    q, k, v, w = _inputs(case, "bfloat16", _seed(request))
    slopes = _alibi_slopes(h_q)
    sinks = jax.device_put(jnp.linspace(-1.0, 2.0, h_q, dtype=jnp.float32), GPU)
    bias = _bias_input((1, h_q, s_q, s_kv), "bfloat16", _seed(request))

    def loss(q, k, v, sinks, w):
        out, lse = sj.attention(q, k, v, alibi_slopes=slopes, sinks=sinks, bias=bias, return_lse=True, **options)
        return jnp.sum(out.astype(jnp.float32) * w.astype(jnp.float32)), (out, lse)

    (_, (out, lse)), grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2, 3), has_aux=True))(q, k, v, sinks, w)
    ql, kl, vl, wl = (_to_logical(x, layout) for x in (q, k, v, w))
    variants = {"alibi_slopes": np.asarray(slopes), "sinks": np.asarray(sinks),
                "bias": np.asarray(bias.astype(jnp.float32)), "causal": True, "causal_alignment": "top_left"}
    ref_out, ref_lse = reference.sdpa_forward(ql, kl, vl, **variants)
    *ref_grads, extra = reference.sdpa_backward(ql, kl, vl, wl, return_extra=True, **variants)
    _assert_close(_to_logical(out, layout), ref_out, *BF16[:2], "out")
    _assert_close(np.asarray(lse), ref_lse, BF16[2], 1e-3, "lse")
    for name, got, want in zip(("grad_q", "grad_k", "grad_v"), grads[:3], ref_grads):
        _assert_close_to_scale(_to_logical(got, layout), want, BF16[3], name)
    _assert_close_to_scale(grads[3], extra["dsinks"], BF16[3], "grad_sinks")


def test_alibi_under_vmap(request):
    """Slopes shared by the mapped calls (in_axes=None) under jax.vmap, jitted, forward and grads,
    equal each call made alone; mapped slopes are refused while tracing."""
    case = ALIBI_CASE
    options = _options(case)
    q, k, v, w = (jnp.stack([x, x * 0.5]) for x in _inputs(case, "bfloat16", _seed(request)))
    slopes = _alibi_slopes(case[3])
    out = jax.jit(jax.vmap(lambda q, k, v, s: sj.attention(q, k, v, alibi_slopes=s, **options),
                           in_axes=(0, 0, 0, None)))(q, k, v, slopes)
    grads = jax.jit(jax.vmap(jax.grad(_alibi_loss(options), (0, 1, 2)), in_axes=(0, 0, 0, None, 0)))(
        q, k, v, slopes, w)
    for i in range(2):
        one = sj.attention(q[i], k[i], v[i], alibi_slopes=slopes, **options)
        _assert_close(np.asarray(out[i], np.float32), np.asarray(one, np.float32), BF16[0], BF16[1],
                      f"vmapped out[{i}]")
        one_grads = jax.grad(_alibi_loss(options), (0, 1, 2))(q[i], k[i], v[i], slopes, w[i])
        for name, a, c in zip(("grad_q", "grad_k", "grad_v"), grads, one_grads):
            _assert_close_to_scale(a[i], np.asarray(c, np.float32), BF16[3], f"vmapped {name}[{i}]")
    with pytest.raises(stridedfa.UnsupportedError, match="alibi_slopes: mapped by jax.vmap"):
        jax.vmap(lambda q, k, v, s: sj.attention(q, k, v, alibi_slopes=s, **options))(
            q, k, v, jnp.stack([slopes, slopes * 2]))


def test_alibi_bottom_right_with_padding_is_refused_when_the_call_runs(request):
    """The core refuses ALiBi with bottom-right alignment and padding lengths: while tracing, as
    stridedfa.UnsupportedError (the adapter plans the call then; GPU run 33 saw the handler's runtime
    error, which this test first expected, no longer reached)."""
    case = ALIBI_CASE
    q, k, v, _ = _inputs(case, "bfloat16", _seed(request))
    lengths = jax.device_put(jnp.asarray([case[6], 100], jnp.int32), GPU)
    with pytest.raises((stridedfa.UnsupportedError, jax.errors.JaxRuntimeError),
                       match=r"ALiBi with bottom-right alignment and padding lengths"):
        jax.block_until_ready(sj.attention(q, k, v, alibi_slopes=_alibi_slopes(case[3]), seqlens_kv=lengths,
                                           causal=True, causal_alignment="bottom_right"))


def test_alibi_through_the_dispatcher(request):
    """stridedfa.attention on jax arrays: (b, h, s, d) axes (layout bhsd), the slopes passed on."""
    case = ("alibi-dispatch", "bhsd", *ALIBI_CASE[2:])
    q, k, v, _ = _inputs(case, "bfloat16", _seed(request))
    slopes = _alibi_slopes(case[3])
    got = stridedfa.attention(q, k, v, alibi_slopes=slopes)
    want = sj.attention(q, k, v, alibi_slopes=slopes, layout="bhsd")
    assert np.array_equal(_bits(got), _bits(want))


# --- Dropout ----------------------------------------------------------------------------------

# (id, layout, b, h_q, h_kv, s_q, s_kv, d_qk, d_v, causal, causal_alignment): GQA, s_q < s_kv, in
# bhsd, the layout of contiguous (b, h, s, d) torch tensors.
DROPOUT_CASE = ("dropout", "bhsd", 2, 8, 2, 128, 192, 64, 64, True, "top_left")
DROPOUT_P = 0.2


def _dropout_options(case, **more):
    return dict(_options(case), dropout_p=DROPOUT_P, **more)


def _torch_bits(t):
    """A torch tensor's bits as NumPy (what _bits gives for a JAX array of its dtype)."""
    import torch

    return t.view(torch.int16).cpu().numpy().view(np.uint16) if t.element_size() == 2 else t.cpu().numpy()


def test_dropout_equal_keys_equal_results_other_keys_other_masks(request):
    """Under jax.jit with dropout_p=0.2: equal keys (made anew, typed or legacy) give bitwise-equal
    outputs, eagerly too and through the dispatcher; another key another result; the kept share of
    the weights is about 1 - p, read through a one-hot v (out = P * keep / (1 - p))."""
    case = DROPOUT_CASE
    b, h_kv, s_kv, d_v = case[2], case[4], case[6], case[8]
    options = _dropout_options(case)
    seed = _seed(request)
    q, k, v, _ = _inputs(case, "bfloat16", seed)
    f = jax.jit(lambda q, k, v, key: sj.attention(q, k, v, dropout_key=key, **options))
    first = f(q, k, v, jax.random.key(seed))
    assert np.array_equal(_bits(first), _bits(f(q, k, v, jax.random.key(seed)))), "equal keys, other results"
    assert np.array_equal(_bits(first), _bits(f(q, k, v, jax.random.PRNGKey(seed)))), "legacy key of the seed"
    assert np.array_equal(_bits(first), _bits(sj.attention(q, k, v, dropout_key=jax.random.key(seed), **options)))
    assert np.array_equal(_bits(first), _bits(stridedfa.attention(q, k, v, dropout_p=DROPOUT_P,
                                                                  dropout_key=jax.random.key(seed),
                                                                  causal=True)))
    other = f(q, k, v, jax.random.split(jax.random.key(seed))[0])
    differ = float(np.mean(_bits(first) != _bits(other)))
    assert differ > 0.5, f"another key changed only {differ:.1%} of the outputs"
    without = sj.attention(q, k, v, **_options(case))
    assert not np.array_equal(_bits(first), _bits(without))

    # The kept share through a one-hot v over keys 0 .. d_v - 1 (causal top-left: rows from d_v on
    # see them all, each weight > 0).
    onehot = jnp.zeros((b, h_kv, s_kv, d_v), jnp.bfloat16).at[:, :, jnp.arange(d_v), jnp.arange(d_v)].set(1)
    onehot = jax.device_put(onehot, GPU)
    read = np.asarray(f(q, k, onehot, jax.random.key(seed)).astype(jnp.float32))[:, :, d_v:, :]
    kept = float(np.mean(read != 0))
    assert abs(kept - (1 - DROPOUT_P)) < 0.02, f"kept {kept:.3f} of the weights, expected about {1 - DROPOUT_P}"


def test_dropout_matches_sdpa_forward_and_backward_through_torch(request):
    """The JAX call is the generic call on the same data with rng_state the same four uint32 words
    read as two int64 (seed, offset): bitwise, forward without and with statistics, and jax.grad
    (deterministic backward) against sdpa_backward given that state and the forward's out and lse."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    case = DROPOUT_CASE
    options = _dropout_options(case, deterministic=True)
    mask = {"causal": case[9], "causal_alignment": case[10]}
    q, k, v, w = _inputs(case, "bfloat16", _seed(request))
    key = jax.random.key(_seed(request))
    words = np.asarray(jax.random.bits(key, (4,), jnp.uint32))  # what the adapter passes, on the host
    device = torch.device("cuda", GPU.id)
    rng_state = torch.from_numpy(words.view(np.int64).copy()).to(device)  # little-endian: (seed, offset)

    out = jax.jit(lambda q, k, v: sj.attention(q, k, v, dropout_key=key, **options))(q, k, v)
    out_lse, lse = jax.jit(lambda q, k, v: sj.attention(q, k, v, dropout_key=key, return_lse=True, **options))(q, k, v)

    def loss(q, k, v, w):
        return jnp.sum(sj.attention(q, k, v, dropout_key=key, **options).astype(jnp.float32) * w.astype(jnp.float32))

    grads = jax.jit(jax.grad(loss, (0, 1, 2)))(q, k, v, w)
    jax.block_until_ready((out, out_lse, lse, grads))

    _, _, b, h_q, _, s_q, _, _, d_v, _, _ = case
    tq, tk, tv, tw = (torch.from_dlpack(x).clone() for x in (q, k, v, w))  # contiguous (b, h, s, d)
    t_out = torch.full((b, h_q, s_q, d_v), float("nan"), device=device, dtype=torch.bfloat16)
    stridedfa.sdpa_forward(tq, tk, tv, t_out, dropout_p=DROPOUT_P, rng_state=rng_state, **mask)
    t_out_lse = torch.full_like(t_out, float("nan"))
    t_lse = torch.full(lse.shape, float("nan"), device=device, dtype=torch.float32)
    stridedfa.sdpa_forward(tq, tk, tv, t_out_lse, lse=t_lse, dropout_p=DROPOUT_P, rng_state=rng_state, **mask)
    t_grads = [torch.full_like(t, float("nan")) for t in (tq, tk, tv)]
    # jax.grad's cotangent of out is w (loss = sum(out * w), w already bfloat16)
    stridedfa.sdpa_backward(tq, tk, tv, t_out_lse, tw, t_lse, *t_grads, dropout_p=DROPOUT_P, rng_state=rng_state,
                            deterministic=True, **mask)
    torch.cuda.synchronize()
    assert np.array_equal(_bits(out), _torch_bits(t_out)), "out differs from sdpa_forward's"
    assert np.array_equal(_bits(out_lse), _torch_bits(t_out_lse)), "out (with lse) differs from sdpa_forward's"
    assert np.array_equal(np.asarray(lse), t_lse.cpu().numpy()), "lse differs from sdpa_forward's"
    for name, got, want in zip(("grad_q", "grad_k", "grad_v"), grads, t_grads):
        assert np.array_equal(_bits(got), _torch_bits(want)), f"{name} differs from sdpa_backward's"


def test_dropout_vjp_of_mapped_cotangents_regenerates_the_forward_mask(request):
    """jax.vmap over the cotangents of one forward (what jax.jacrev does): each mapped backward
    equals the vjp with that cotangent alone, bit for bit (deterministic backward), i.e. it
    regenerated the forward's mask rather than the masks of a folded, larger batch."""
    case = DROPOUT_CASE
    options = _dropout_options(case, deterministic=True)
    q, k, v, w = _inputs(case, "bfloat16", _seed(request))
    key = jax.random.key(_seed(request))
    _, vjp = jax.vjp(lambda q, k, v: sj.attention(q, k, v, dropout_key=key, **options), q, k, v)
    cotangents = jnp.stack([w, -w, (2 * w.astype(jnp.float32)).astype(w.dtype)])
    mapped = jax.jit(jax.vmap(vjp))(cotangents)
    for i in range(cotangents.shape[0]):
        for name, got, want in zip(("grad_q", "grad_k", "grad_v"), mapped, jax.jit(vjp)(cotangents[i])):
            assert np.array_equal(_bits(got[i]), _bits(want)), f"{name} of mapped cotangent {i}"


def test_dropout_under_vmap_is_the_folded_call(request):
    """Under jax.vmap with one key (in_axes=None) the mapped calls fold into one: equal bitwise to
    the call on the batch folded by hand, forward and grads; equal inputs in two mapped calls still
    get different masks."""
    case = DROPOUT_CASE
    b = case[2]
    options = _dropout_options(case, deterministic=True)
    q, k, v, w = (jnp.stack([x, x]) for x in _inputs(case, "bfloat16", _seed(request)))
    key = jax.random.key(_seed(request))

    def f(q, k, v, key):
        return sj.attention(q, k, v, dropout_key=key, **options)

    def loss(q, k, v, w, key):
        return jnp.sum(f(q, k, v, key).astype(jnp.float32) * w.astype(jnp.float32))

    out = jax.jit(jax.vmap(f, in_axes=(0, 0, 0, None)))(q, k, v, key)
    fold = lambda x: x.reshape(2 * b, *x.shape[2:])  # noqa: E731
    folded = jax.jit(f)(fold(q), fold(k), fold(v), key)
    assert np.array_equal(_bits(fold(out)), _bits(folded))
    assert not np.array_equal(_bits(out[0]), _bits(out[1])), "the mapped calls drew one mask"
    grads = jax.jit(jax.vmap(jax.grad(loss, (0, 1, 2)), in_axes=(0, 0, 0, 0, None)))(q, k, v, w, key)
    folded_grads = jax.jit(jax.grad(loss, (0, 1, 2)))(fold(q), fold(k), fold(v), fold(w), key)
    for name, a, c in zip(("grad_q", "grad_k", "grad_v"), grads, folded_grads):
        assert np.array_equal(_bits(fold(a)), _bits(c)), f"vmapped {name} is not the folded call's"


def test_vmap_folds_into_batch(request):
    case = CASES[2]
    options = _options(case)
    batched = [jnp.stack([x, x * 0.5]) for x in _inputs(case, "bfloat16", _seed(request))]
    q, k, v, w = batched
    out = jax.jit(jax.vmap(lambda q, k, v: sj.attention(q, k, v, **options)))(q, k, v)
    grads = jax.jit(jax.vmap(jax.grad(_loss(options), (0, 1, 2))))(q, k, v, w)
    for i in range(2):
        one = sj.attention(q[i], k[i], v[i], **options)
        _assert_close(np.asarray(out[i], np.float32), np.asarray(one, np.float32), BF16[0], BF16[1],
                      f"vmapped out[{i}]")
        one_grads = jax.grad(_loss(options), (0, 1, 2))(q[i], k[i], v[i], w[i])
        for name, a, b in zip(("grad_q", "grad_k", "grad_v"), grads, one_grads):
            _assert_close_to_scale(a[i], np.asarray(b, np.float32), BF16[3], f"vmapped {name}[{i}]")
    # Unbatched k and v (in_axes None) are broadcast to the batch before the call.
    shared = jax.jit(jax.vmap(lambda q, k, v: sj.attention(q, k, v, **options), in_axes=(0, None, None)))(q, k[0], v[0])
    for i in range(2):
        one = sj.attention(q[i], k[0], v[0], **options)
        _assert_close(np.asarray(shared[i], np.float32), np.asarray(one, np.float32), BF16[0], BF16[1],
                      f"vmapped out with shared k, v [{i}]")


def test_jit_compiles_once_for_repeated_shapes(request):
    case = CASES[1]
    options = _options(case)
    traces = []

    @jax.jit
    def f(q, k, v):
        traces.append(q.shape)
        return sj.attention(q, k, v, **options)

    first = _inputs(case, "float16", _seed(request))
    second = _inputs(case, "float16", _seed(request) + 1)
    for q, k, v, _ in (first, second, first, second):
        f(q, k, v).block_until_ready()
    assert len(traces) == 1, f"traced {len(traces)} times for one shape"
    if hasattr(f, "_cache_size"):
        assert f._cache_size() == 1


def _counters():
    info = stridedfa.cache_info()
    return {key: info[key] for key in ("hits", "misses", "builds")}


def _delta(before, after):
    return {key: after[key] - before[key] for key in before}


def test_jax_calls_share_cached_graphs(request):
    """A new problem builds its graph once; later JAX calls (eager or jitted, new data) hit."""
    case = ("cache", "bshd", 1, 4, 4, 320, 320, 64, 64, True, "top_left")  # a shape no other test uses
    options = _options(case)
    q, k, v, _ = _inputs(case, "bfloat16", _seed(request))
    before = _counters()
    sj.attention(q, k, v, **options).block_until_ready()
    assert _delta(before, _counters()) == {"hits": 0, "misses": 1, "builds": 1}
    q2, k2, v2, _ = _inputs(case, "bfloat16", _seed(request) + 1)
    before = _counters()
    sj.attention(q2, k2, v2, **options).block_until_ready()
    jax.jit(lambda q, k, v: sj.attention(q, k, v, **options))(q2, k2, v2).block_until_ready()
    assert _delta(before, _counters()) == {"hits": 2, "misses": 0, "builds": 0}


def test_graphs_shared_with_sdpa_forward_and_torch(request):
    """The XLA handlers describe a bshd array exactly like torch's x.transpose(1, 2) of a contiguous
    (b, s, h, d) tensor, so sdpa_forward / sdpa_backward and stridedfa.torch reuse the graphs JAX
    calls built (forward without statistics, forward with statistics, backward)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    import stridedfa.torch

    b, h_q, h_kv, s_q, s_kv, d = 2, 8, 2, 192, 448, 64  # a problem no other test uses
    case = ("share", "bshd", b, h_q, h_kv, s_q, s_kv, d, d, True, "bottom_right")
    options = _options(case)
    q, k, v, w = _inputs(case, "bfloat16", _seed(request))

    before = _counters()
    sj.attention(q, k, v, **options).block_until_ready()  # forward without statistics
    jax.block_until_ready(jax.grad(_loss(options), (0, 1, 2))(q, k, v, w))  # forward with them + backward
    assert _delta(before, _counters()) == {"hits": 0, "misses": 3, "builds": 3}

    device, dt = torch.device("cuda", GPU.id), torch.bfloat16
    mask = {"causal": True, "causal_alignment": "bottom_right"}

    def bshd(h, s, requires_grad=False):  # a contiguous (b, s, h, d) tensor seen as (b, h, s, d)
        x = torch.randn(b, s, h, d, device=device, dtype=dt, requires_grad=requires_grad)
        return x.transpose(1, 2)

    tq, tk, tv = bshd(h_q, s_q), bshd(h_kv, s_kv), bshd(h_kv, s_kv)
    out, grad_out = bshd(h_q, s_q), bshd(h_q, s_q)
    lse = torch.empty(b, h_q, s_q, device=device, dtype=torch.float32)
    grads = bshd(h_q, s_q), bshd(h_kv, s_kv), bshd(h_kv, s_kv)
    before = _counters()
    stridedfa.sdpa_forward(tq, tk, tv, out, **mask)
    stridedfa.sdpa_forward(tq, tk, tv, out, lse=lse, **mask)
    stridedfa.sdpa_backward(tq, tk, tv, out, grad_out, lse, *grads, **mask)
    torch.cuda.synchronize()
    assert _delta(before, _counters()) == {"hits": 3, "misses": 0, "builds": 0}

    # The torch adapter's training forward allocates out and statistics like the JAX targets do.
    lq, lk, lv = bshd(h_q, s_q, True), bshd(h_kv, s_kv, True), bshd(h_kv, s_kv, True)
    before = _counters()
    stridedfa.torch.attention(lq, lk, lv, **mask)
    torch.cuda.synchronize()
    assert _delta(before, _counters()) == {"hits": 1, "misses": 0, "builds": 0}


def test_bad_configurations_raise_typed_errors_before_launch(request):
    case = CASES[0]
    q, k, v, _ = _inputs(case, "bfloat16", _seed(request))
    before = _counters()
    with pytest.raises(stridedfa.LayoutError, match="dtype float32"):
        sj.attention(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32))
    with pytest.raises(stridedfa.LayoutError, match="share one dtype"):
        sj.attention(q, k.astype(jnp.float16), v)
    with pytest.raises(stridedfa.LayoutError, match="multiple"):
        sj.attention(q, k[:, :, :3], v[:, :, :3])
    with pytest.raises(stridedfa.LayoutError, match="head_dim"):
        sj.attention(q, k[..., :32], v)
    with pytest.raises(stridedfa.LayoutError, match="expected 4 axes"):
        jax.jit(lambda q, k, v: sj.attention(q[0], k[0], v[0]))(q, k, v)
    with pytest.raises(ValueError, match="layout"):
        sj.attention(q, k, v, layout="sbhd")
    with pytest.raises(ValueError, match="window left bound must be >= 0"):
        sj.attention(q, k, v, window=(-1, 0))
    with pytest.raises(stridedfa.LayoutError, match="lives on cpu"):
        cpu = jax.devices("cpu")[0]
        sj.attention(*(jax.device_put(x, cpu) for x in (q, k, v)))
    assert _delta(before, _counters()) == {"hits": 0, "misses": 0, "builds": 0}


def test_handler_errors_carry_the_stridedfa_error_kind():
    """An error inside the XLA handler reaches the caller as a JAX runtime error whose message
    starts with the core's error kind (attention() itself never passes a bad attribute; this
    calls the target directly to provoke one)."""
    q = jnp.ones((1, 64, 2, 64), jnp.bfloat16, device=GPU)
    attributes = sj._options("bshd", None, False, "top_left").attributes()
    attributes["options"] = {**attributes["options"], "alignment": np.int64(5)}  # SdpaOptions' field
    call = jax.ffi.ffi_call("stridedfa_sdpa_forward_inference", jax.ShapeDtypeStruct(q.shape, q.dtype))
    with pytest.raises(Exception, match="stridedfa LayoutError: unknown causal_alignment code 5"):
        jax.block_until_ready(call(q, q, q, **attributes))


@pytest.mark.parametrize("d", [512, 1024])  # cuDNN 9.19 on an H200 ran d=1024 through sdpa_forward
def test_large_head_dims_correct_or_refused_with_stridedfa_error(d, request):
    """Beyond 256 cuDNN may or may not have a kernel: either a correct result, or an error that
    names the stridedfa error kind (raised while tracing, or by the handler when it runs)."""
    key = jax.random.PRNGKey(_seed(request))
    q, k, v = (jax.device_put(jax.random.normal(kk, (1, 64, 2, d), jnp.float32).astype(jnp.bfloat16), GPU)
               for kk in jax.random.split(key, 3))
    try:
        out = sj.attention(q, k, v).block_until_ready()
    except stridedfa.StridedFAError as exc:
        assert isinstance(exc, stridedfa.UnsupportedError), repr(exc)
        return
    except Exception as exc:  # noqa: BLE001  (a JAX runtime error carrying the handler's message)
        assert "stridedfa UnsupportedError" in str(exc), str(exc)
        return
    ref, _ = reference.sdpa_forward(*(_to_logical(x, "bshd") for x in (q, k, v)))
    _assert_close(_to_logical(out, "bshd"), ref, *TOLERANCE["bfloat16"][:2], f"out with head_dim {d}")


def test_zero_sized_batch_returns_empty(request):
    q = jnp.zeros((0, 64, 2, 64), jnp.bfloat16, device=GPU)
    out = sj.attention(q, q, q).block_until_ready()
    assert out.shape == (0, 64, 2, 64)
