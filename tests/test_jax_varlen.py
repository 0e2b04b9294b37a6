"""stridedfa.jax.varlen_attention without a GPU: shapes, lowering to the XLA FFI targets with the
`thd` layout and the cu_seqlens operands, gradients, vmap, and typed errors while tracing."""

from __future__ import annotations

import pytest

import stridedfa


@pytest.fixture(scope="module")
def sj():
    pytest.importorskip("jax")
    import stridedfa.jax

    return stridedfa.jax


@pytest.fixture(scope="module")
def jax(sj):
    import jax

    return jax


def spec(jax, shape, dtype="bfloat16"):
    return jax.ShapeDtypeStruct(shape, jax.numpy.dtype(dtype))


def calls(text):
    return [line for line in text.splitlines() if "custom_call" in line]


def args(jax, total_q=300, total_kv=400, h_q=8, h_kv=2, d=64, d_v=64, sequences=5):
    return (spec(jax, (total_q, h_q, d)), spec(jax, (total_kv, h_kv, d)), spec(jax, (total_kv, h_kv, d_v)),
            spec(jax, (sequences + 1,), "int32"), spec(jax, (sequences + 1,), "int32"))


def test_shapes_of_out_lse_and_gradients(sj, jax):
    a = args(jax, d_v=128)
    out, lse = jax.eval_shape(lambda *x: sj.varlen_attention(*x, causal=True, return_lse=True), *a)
    assert out.shape == (300, 8, 128) and lse.shape == (300, 8) and str(lse.dtype) == "float32"

    def loss(q, k, v, cu_q, cu_kv):
        return sj.varlen_attention(q, k, v, cu_q, cu_kv, causal=True).astype("float32").sum()

    grads = jax.eval_shape(jax.grad(loss, (0, 1, 2)), *a)
    assert [g.shape for g in grads] == [(300, 8, 64), (400, 2, 64), (400, 2, 128)]


def test_lowering_uses_the_thd_layout_and_the_cu_seqlens_operands(sj, jax):
    f = jax.jit(lambda *x: sj.varlen_attention(*x, 256, 300, causal=True, window=(127, 0)))
    found = calls(f.lower(*args(jax)).as_text())
    assert len(found) == 1 and "@stridedfa_sdpa_forward(" in found[0], found
    cu_seqlens = stridedfa._core._jax_optional_operands()["cu_seqlens"]
    for attribute in ("layout = 2 : i64", f"optional_operands = {cu_seqlens} : i64", "max_seqlen_q = 256 : i64",
                      "max_seqlen_kv = 300 : i64", "window_left = 127 : i64", "causal = true"):
        assert attribute in found[0], found[0]


def test_grad_lowers_to_forward_and_backward(sj, jax):
    def loss(q, k, v, cu_q, cu_kv):
        return sj.varlen_attention(q, k, v, cu_q, cu_kv).astype("float32").sum()

    found = calls(jax.jit(jax.grad(loss, (0, 1, 2))).lower(*args(jax)).as_text())
    assert len(found) == 2 and "@stridedfa_sdpa_forward(" in found[0] and "@stridedfa_sdpa_backward(" in found[1]
    assert all("layout = 2 : i64" in call for call in found)


def test_dropout_passes_the_philox_state(sj, jax):
    key = jax.random.key(0)
    f = jax.jit(lambda *x: sj.varlen_attention(*x, dropout_p=0.1, dropout_key=key))
    found = calls(f.lower(*args(jax)).as_text())
    bits = stridedfa._core._jax_optional_operands()
    assert f"optional_operands = {bits['cu_seqlens'] + bits['rng_state']} : i64" in found[0], found[0]
    assert "dropout_p = 1.000000e-01" in found[0], found[0]


def test_vmap_runs_each_packed_batch(sj, jax):
    batched = [spec(jax, (3, *a.shape), str(a.dtype)) for a in args(jax)]
    out = jax.eval_shape(jax.vmap(lambda *x: sj.varlen_attention(*x)), *batched)
    assert out.shape == (3, 300, 8, 64)


@pytest.mark.parametrize("change, error, match", [
    ({"q": ((1, 300, 8, 64), "bfloat16")}, stridedfa.LayoutError, r"^q: expected \(tokens, heads, head_dim\)"),
    ({"cu_q": ((6,), "float32")}, stridedfa.LayoutError, r"^cu_seqlens_q: dtype float32 is not supported"),
    ({"cu_kv": ((7,), "int32")}, stridedfa.LayoutError, "cu_seqlens_q has 6 entries but cu_seqlens_kv 7"),
    ({"v": ((400, 3, 64), "bfloat16")}, stridedfa.LayoutError, "k and v must share heads"),
    ({"q": ((300, 8, 60), "bfloat16"), "k": ((400, 2, 60), "bfloat16")}, stridedfa.LayoutError,
     r"stride is head_dim \(60\), which must then be a multiple of 8"),
])
def test_bad_calls_are_refused_while_tracing(sj, jax, change, error, match):
    names = ("q", "k", "v", "cu_q", "cu_kv")
    a = list(args(jax))
    for name, (shape, dtype) in change.items():
        a[names.index(name)] = spec(jax, shape, dtype)
    with pytest.raises(error, match=match):
        jax.eval_shape(lambda *x: sj.varlen_attention(*x), *a)


def test_max_seqlen_must_be_a_python_int(sj, jax):
    with pytest.raises(TypeError, match="max_seqlen_q must be a Python int"):
        jax.eval_shape(lambda *x: sj.varlen_attention(*x, max_seqlen_q=1.5), *args(jax))
    with pytest.raises(ValueError, match="dropout_key"):
        jax.eval_shape(lambda *x: sj.varlen_attention(*x, dropout_p=0.1), *args(jax))


def test_mqa_repeats_the_one_head_and_its_gradient_sums_back(sj, jax):
    """cuDNN 9.19's varlen backward gets MQA's dK wrong (GPU run 39): the call repeats k and v to
    two heads; the gradients keep k's and v's one head."""
    a = args(jax, h_q=6, h_kv=1)
    text = jax.jit(lambda *x: sj.varlen_attention(*x, causal=True)).lower(*a).as_text()
    assert "300x6x64" in text and "400x2x64" in text  # q as given; k, v repeated to 2 heads

    def loss(q, k, v, cu_q, cu_kv):
        return sj.varlen_attention(q, k, v, cu_q, cu_kv, causal=True).astype("float32").sum()

    grads = jax.eval_shape(jax.grad(loss, (0, 1, 2)), *a)
    assert [g.shape for g in grads] == [(300, 6, 64), (400, 1, 64), (400, 1, 64)]
