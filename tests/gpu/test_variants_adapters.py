"""The variants' options through every adapter: torch (eager, autograd, packed, torch.compile with
fullgraph, CUDA-graph capture), CuPy, JAX (jit, grad, traced lengths) and stridedfa.attention.

Each adapter's result must equal the generic entry point's on the same inputs bit for bit (same
cuDNN graph), and the generic entry point is checked against the reference in test_variants.py;
torch's gradients are also checked against the NumPy reference here.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import stridedfa  # noqa: E402
import stridedfa.torch as sfa_torch  # noqa: E402
from stridedfa import reference  # noqa: E402

pytestmark = pytest.mark.gpu

B, H, S, D = 2, 4, 128, 64
LENGTHS = [128, 45]
CASES = {
    "window": dict(window=(15, 0)),
    "window_causal_br": dict(causal=True, causal_alignment="bottom_right", window=(33, None)),
    "padding": dict(lengths=True),
    "padding_causal": dict(lengths=True, causal=True),
    "deterministic": dict(causal=True, deterministic=True),
    "softcap_gemma2": dict(softcap=2.0, causal=True, window=(47, None)),
    "sinks": dict(sinks=True, causal=True, window=(31, None)),
    "alibi": dict(alibi=True, causal=True, causal_alignment="bottom_right"),
    "mask_bias": dict(mask_bias=True),  # a constant (batch, 1, s, s) bias, as transformers' masks: no dbias
}


def _options(case, device="cuda"):
    options = {k: v for k, v in CASES[case].items() if k not in ("lengths", "sinks", "alibi", "mask_bias")}
    if CASES[case].get("sinks"):
        options["sinks"] = torch.linspace(-1.0, 2.0, H, device=device)
    if CASES[case].get("alibi"):
        options["alibi_slopes"] = 2.0 ** (-8.0 * torch.arange(1, H + 1, device=device) / H)
    if CASES[case].get("mask_bias"):
        gen = torch.Generator(device=device).manual_seed(5)
        options["bias"] = torch.randn(B, 1, S, S, device=device, generator=gen).to(torch.bfloat16)
    if CASES[case].get("lengths"):
        lengths = torch.tensor(LENGTHS, device=device, dtype=torch.int32)
        options.update(seqlens_q=lengths, seqlens_kv=lengths)
    return options


def _packed(seed, requires_grad=False):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    qkv = torch.randn(B, S, 3, H, D, device="cuda", generator=gen).to(torch.bfloat16)
    return qkv.requires_grad_(requires_grad)


def _views(qkv):
    return [qkv[:, :, i].transpose(1, 2) for i in range(3)]


def _generic(q, k, v, grad_out, options):
    """The generic entry points: (out, lse, grad_q, grad_k, grad_v)."""
    q, k, v = (t.detach() for t in (q, k, v))
    out = torch.empty(q.shape[:3] + (v.shape[3],), device="cuda", dtype=q.dtype)
    lse = torch.empty(q.shape[:3], device="cuda")
    fwd = {k_: v_ for k_, v_ in options.items() if k_ != "deterministic"}
    stridedfa.sdpa_forward(q, k, v, out, lse=lse, **fwd)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    extra = {}
    if options.get("sinks") is not None:
        extra["grad_sinks"] = torch.empty_like(options["sinks"])
    stridedfa.sdpa_backward(q, k, v, out, grad_out, lse, *grads, **options, **extra)
    return (out, lse, *grads, *extra.values())


@pytest.mark.parametrize("case", CASES)
def test_torch_attention_eager_autograd_equals_generic(case, seed):
    options = _options(case)
    if "sinks" in options:
        options["sinks"] = options["sinks"].clone().requires_grad_()
    qkv = _packed(seed, requires_grad=True)
    q, k, v = _views(qkv)
    out, lse = sfa_torch.attention(q, k, v, return_lse=True, **options)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    generic_options = {k_: (v_.detach() if isinstance(v_, torch.Tensor) else v_) for k_, v_ in options.items()}
    want = _generic(q, k, v, grad_out, generic_options)
    assert torch.equal(out, want[0]) and torch.equal(lse, want[1])
    dq, dk, dv = _views(qkv.grad)
    for got, expected in zip((dq, dk, dv), want[2:5]):
        assert torch.equal(got, expected)
    if "sinks" in options:  # cuDNN sums dsink over rows in an order that varies: float rounding apart
        torch.testing.assert_close(options["sinks"].grad, want[5], rtol=1e-5, atol=1e-6)
    # against the reference too (float64)
    ref = {k_: v_ for k_, v_ in options.items() if k_ not in ("deterministic",)}
    for name, value in ref.items():
        if isinstance(value, torch.Tensor):
            ref[name] = (value.detach().float() if value.is_floating_point() else value).cpu().numpy()
    np_q, np_k, np_v, np_do = (t.detach().double().cpu().numpy() for t in (q, k, v, grad_out))
    r_dq, r_dk, r_dv = reference.sdpa_backward(np_q, np_k, np_v, np_do, dtype=np.float64,
                                               causal_alignment=ref.pop("causal_alignment", "top_left"), **ref)
    for got, expected, name in zip((dq, dk, dv), (r_dq, r_dk, r_dv), ("dq", "dk", "dv")):
        err = np.abs(got.double().cpu().numpy() - expected).max()
        assert err <= 3e-2 * np.abs(expected).max() + 5e-3, f"{name}: max err {err:.3e}"


@pytest.mark.parametrize("case", CASES)
def test_torch_packed_attention_equals_generic(case, seed):
    options = _options(case)
    qkv = _packed(seed, requires_grad=True)
    out = sfa_torch.packed_attention(qkv, 2, **options)  # (b, s, h, d)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    want = _generic(*_views(qkv), grad_out.transpose(1, 2), options)
    assert torch.equal(out.transpose(1, 2), want[0])
    for got, expected in zip(_views(qkv.grad), want[2:]):
        assert torch.equal(got, expected)


@pytest.mark.parametrize("case", ["window", "padding_causal", "deterministic", "softcap_gemma2", "sinks", "alibi",
                                  "mask_bias"])
def test_torch_compile_fullgraph_and_cuda_graphs(case, seed):
    options = _options(case)

    def step(qkv):
        q, k, v = _views(qkv)
        return sfa_torch.attention(q, k, v, **options)

    qkv = _packed(seed)
    eager = step(qkv)
    compiled = torch.compile(step, fullgraph=True)
    assert torch.equal(compiled(qkv), eager)
    # CUDA-graph capture, then replay with new lengths written into the same tensor (no host sync)
    static = qkv.clone()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step(static)  # warm up: graphs built outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(static)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
    if "seqlens_q" in options:
        options["seqlens_q"].copy_(torch.tensor([100, 17], device="cuda", dtype=torch.int32))
        options["seqlens_kv"].copy_(torch.tensor([100, 17], device="cuda", dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, step(static)), "replay with new lengths differs from eager"


def test_torch_opcheck_fake_strides_with_options(seed):
    """Fake tensors under torch.compile give the real strides with every option (no recompiles as
    lengths change: they are data)."""
    torch._dynamo.reset()
    lengths = torch.tensor(LENGTHS, device="cuda", dtype=torch.int32)

    def step(qkv, lengths):
        q, k, v = _views(qkv)
        return sfa_torch.attention(q, k, v, causal=True, window=(31, 0), seqlens_q=lengths, seqlens_kv=lengths)

    compiled = torch.compile(step, fullgraph=True)
    qkv = _packed(seed)
    first = compiled(qkv, lengths)
    second = compiled(qkv, torch.tensor([77, 128], device="cuda", dtype=torch.int32))
    assert first.stride() == step(qkv, lengths).stride()
    assert torch.equal(second, step(qkv, torch.tensor([77, 128], device="cuda", dtype=torch.int32)))


@pytest.mark.parametrize("case", ["window", "padding", "deterministic"])
def test_dispatcher_with_torch_and_generic_producers(case, seed):
    options = _options(case)
    options.pop("deterministic", None)
    q, k, v = _views(_packed(seed))
    via_dispatch = stridedfa.attention(q, k, v, **options)
    assert torch.equal(via_dispatch, sfa_torch.attention(q, k, v, **options))


@pytest.mark.parametrize("case", ["window", "padding_causal", "deterministic", "softcap_gemma2", "sinks", "alibi",
                                  "mask_bias"])
def test_cupy_attention_equals_generic(case, seed):
    cp = pytest.importorskip("cupy")
    options = _options(case)
    if "bias" in options:  # the attention dtype here: float16
        options["bias"] = options["bias"].half()
    qkv = _packed(seed).to(torch.float16)
    q, k, v = _views(qkv)
    cq, ck, cv = (cp.from_dlpack(t) for t in (q, k, v))
    cupy_options = {k_: (cp.from_dlpack(v_) if isinstance(v_, torch.Tensor) else v_) for k_, v_ in options.items()}
    fwd = {k_: v_ for k_, v_ in cupy_options.items() if k_ != "deterministic"}
    out, lse = stridedfa.cupy.attention(cq, ck, cv, return_lse=True, **fwd)
    grad_out = cp.random.standard_normal(out.shape, dtype=cp.float32).astype(cp.float16)
    grads = stridedfa.cupy.attention_backward(cq, ck, cv, out, lse, grad_out, **cupy_options)
    cp.cuda.get_current_stream().synchronize()
    want = _generic(q, k, v, torch.from_dlpack(grad_out), options)
    assert torch.equal(torch.from_dlpack(out), want[0])
    for got, expected in zip(grads[:3], want[2:5]):
        assert torch.equal(torch.from_dlpack(got), expected)
    if len(grads) == 4:  # grad_sinks: summed over rows in an order that varies
        torch.testing.assert_close(torch.from_dlpack(grads[3]), want[5], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["window", "padding", "padding_causal", "deterministic", "softcap_gemma2",
                                  "sinks", "alibi"])
def test_jax_jit_and_grad_equal_generic(case, seed):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    import stridedfa.jax as sfa_jax

    options = _options(case)
    qkv = _packed(seed)
    q, k, v = _views(qkv)
    jq, jk, jv = (jnp.asarray(t.contiguous().cpu().float().numpy()).astype(jnp.bfloat16) for t in (q, k, v))
    jax_options = {k_: (jnp.asarray(v_.cpu().numpy()) if isinstance(v_, torch.Tensor) else v_)
                   for k_, v_ in options.items()}
    static = {k_: v_ for k_, v_ in jax_options.items() if not k_.startswith("seqlens")}
    lengths = {k_: v_ for k_, v_ in jax_options.items() if k_.startswith("seqlens")}

    def loss(q, k, v, lengths, grad_out):
        out = sfa_jax.attention(q, k, v, layout="bhsd", **static, **lengths)
        return (out.astype(jnp.float32) * grad_out).sum(), out

    gen = torch.Generator(device="cuda").manual_seed(seed + 7)
    grad_out = torch.randn(B, H, S, D, device="cuda", generator=gen).to(torch.bfloat16)
    jgrad_out = jnp.asarray(grad_out.float().cpu().numpy())
    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(
        jq, jk, jv, lengths, jgrad_out)
    tq, tk, tv = (torch.from_numpy(np.asarray(x.astype(jnp.float32))).cuda().to(torch.bfloat16)
                  for x in (jq, jk, jv))
    want = _generic(tq, tk, tv, grad_out, options)
    got_out = torch.from_numpy(np.asarray(out.astype(jnp.float32))).cuda()
    assert torch.equal(got_out, want[0].float())
    for got, expected in zip(grads, want[2:]):
        assert torch.equal(torch.from_numpy(np.asarray(got.astype(jnp.float32))).cuda(), expected.float())


@pytest.mark.parametrize("case", CASES)
def test_packed_views_equal_contiguous_copies_bit_for_bit(case, seed):
    """Each variant on views of one packed projection and on contiguous copies of the same values:
    the same numbers, bit for bit (strides change where cuDNN reads, not what it computes)."""
    options = _options(case)
    q, k, v = _views(_packed(seed))
    grad_out = torch.randn(B, H, S, D, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed + 3))
    grad_out = grad_out.to(torch.bfloat16)
    packed = _generic(q, k, v, grad_out, options)
    copies = _generic(q.contiguous(), k.contiguous(), v.contiguous(), grad_out, options)
    for name, a, b in zip(("out", "lse", "grad_q", "grad_k", "grad_v"), packed, copies):
        assert torch.equal(a, b), f"{name}: packed views and contiguous copies differ"
    if len(packed) == 6:  # grad_sinks: cuDNN sums it over rows in an order that varies from call to call
        torch.testing.assert_close(packed[5], copies[5], rtol=1e-5, atol=1e-6)
