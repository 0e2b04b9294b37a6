"""Dropout (Philox, seed and offset in an int64 (2,) rng_state) through every entry point.

The mask cuDNN draws is read back without a dump: with v one-hot over a block of keys
(v[j, j - start] = 1), out[i, t] = P[i, start + t] * keep / (1 - p), so the kept positions of that
block are out != 0 (P > 0 wherever a key is seen). The same rng_state, shapes and layout draw the
same mask (checked), so the mask read that way is the one the real call used: its out and, with
the same state, its gradients are compared with the fp32+ reference given that mask. Outputs are
poisoned first; the keep rate is checked against 1 - p; equal states give bitwise-equal results,
other states other masks; packed views and contiguous copies agree bit for bit; the torch adapter
draws the state from torch's generator (torch.manual_seed decides it, CUDA-graph replays draw
anew), also under torch.compile.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import stridedfa  # noqa: E402
import stridedfa.torch as sfa_torch  # noqa: E402
from helpers.layouts import random_qkv  # noqa: E402 (imports torch)
from stridedfa import reference  # noqa: E402

pytestmark = pytest.mark.gpu

# (out atol, grad rel, grad atol), as test_variants: dropout scales the kept weights by 1 / (1 - p).
TOL = {torch.float16: (8e-3, 1.5e-2, 2e-3), torch.bfloat16: (3e-2, 3e-2, 6e-3)}


def _state(seed, offset=0):
    return torch.tensor([seed, offset], device="cuda", dtype=torch.int64)


def _np(t):
    return t.detach().float().cpu().numpy().astype(np.float64)


def _one_hot_like(v, start):
    """v's shape and strides, 1 at (key start + t, column t): out then holds P * keep there."""
    onehot = torch.empty_strided(v.shape, v.stride(), device="cuda", dtype=v.dtype).zero_()
    n = min(v.shape[3], v.shape[2] - start)
    idx = torch.arange(n, device="cuda")
    onehot[:, :, start + idx, idx] = 1
    return onehot, n


def keep_mask(q, k, v, call):
    """(b, h_q, s_q, s_kv) bool: where the mask of `call(q, k, v_onehot, out)` kept a score."""
    b, h_q, s_q, d_v = q.shape[0], q.shape[1], q.shape[2], v.shape[3]
    s_kv = k.shape[2]
    keep = torch.zeros(b, h_q, s_q, s_kv, device="cuda", dtype=torch.bool)
    for start in range(0, s_kv, d_v):
        onehot, n = _one_hot_like(v, start)
        out = torch.full((b, h_q, s_q, d_v), float("nan"), device="cuda", dtype=q.dtype)
        call(q, k, onehot, out)
        keep[..., start:start + n] = out[..., :n] != 0
    return keep


def run_case(*, b=2, h_q=4, h_kv=2, s_q=128, s_kv=128, d=64, dtype=torch.bfloat16, layout="bhsd", p=0.2,
             causal=False, alignment="top_left", window=None, seqlens=None, softcap=None, bias=None,
             bias_grad=False, alibi=False, sinks=False, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = random_qkv(b, h_q, h_kv, s_q, s_kv, d, dtype, layout, gen)
    rng = _state(1000 + seed, 7 * seed)
    options = dict(causal=causal, causal_alignment=alignment, window=window, softcap=softcap, dropout_p=p,
                   rng_state=rng)
    extra = {}
    if seqlens is not None:
        extra.update(seqlens_q=torch.tensor(seqlens[0], device="cuda", dtype=torch.int32),
                     seqlens_kv=torch.tensor(seqlens[1], device="cuda", dtype=torch.int32))
    if bias is not None:
        extra["bias"] = torch.randn(*bias, generator=gen, device="cuda").to(dtype)
    if alibi:
        extra["alibi_slopes"] = 2.0 ** (-8.0 * torch.arange(1, h_q + 1, device="cuda") / h_q)
    if sinks:
        extra["sinks"] = torch.randn(h_q, generator=gen, device="cuda")
    out = torch.full((b, h_q, s_q, d), float("nan"), device="cuda", dtype=dtype)
    lse = torch.full((b, h_q, s_q), float("nan"), device="cuda")
    stridedfa.sdpa_forward(q, k, v, out, lse=lse, **options, **extra)
    grad_out = torch.randn(out.shape, generator=gen, device="cuda").to(dtype)
    dq, dk, dv = (torch.full(t.shape, float("nan"), device="cuda", dtype=dtype) for t in (q, k, v))
    grads = {}
    if bias_grad:
        grads["grad_bias"] = torch.full(extra["bias"].shape, float("nan"), device="cuda", dtype=dtype)
    stridedfa.sdpa_backward(q, k, v, out, grad_out, lse, dq, dk, dv, **options, **extra, **grads)

    keep = keep_mask(q, k, v, lambda q_, k_, v_, o_: stridedfa.sdpa_forward(q_, k_, v_, o_, **options, **extra))
    ref_extra = {name: _np(x) for name, x in extra.items() if name not in ("seqlens_q", "seqlens_kv")}
    if seqlens is not None:
        ref_extra.update(seqlens_q=np.array(seqlens[0]), seqlens_kv=np.array(seqlens[1]))
    ref_opts = dict(causal=causal, causal_alignment=alignment, window=window, softcap=softcap, dtype=np.float64,
                    dropout_p=p, dropout_mask=keep.cpu().numpy().astype(np.float64))
    ref_out, ref_lse = reference.sdpa_forward(_np(q), _np(k), _np(v), **ref_opts, **ref_extra)
    ref_dq, ref_dk, ref_dv, ref_grads = reference.sdpa_backward(_np(q), _np(k), _np(v), _np(grad_out), **ref_opts,
                                                                **ref_extra, return_extra=True)
    out_atol, grad_rel, grad_atol = TOL[dtype]
    got = out.float()
    assert not torch.isnan(got).any(), "out: elements left unwritten (NaN)"
    err = (got - torch.from_numpy(ref_out).cuda().float()).abs().max().item()
    assert err <= out_atol + 1e-2 * np.abs(ref_out).max(), f"out: max err {err:.3e}"
    finite = torch.from_numpy(np.isfinite(ref_lse)).cuda()
    lse_err = (lse[finite] - torch.from_numpy(ref_lse).cuda().float()[finite]).abs().max().item()
    assert lse_err <= 2e-3 * max(1.0, float(np.abs(ref_lse[np.isfinite(ref_lse)]).max())), f"lse: max err {lse_err}"
    pairs = [("grad_q", dq, ref_dq), ("grad_k", dk, ref_dk), ("grad_v", dv, ref_dv)]
    if bias_grad:
        pairs.append(("grad_bias", grads["grad_bias"], ref_grads["dbias"]))
    for name, g, want in pairs:
        g = g.float()
        assert not torch.isnan(g).any(), f"{name}: elements left unwritten (NaN)"
        w = torch.from_numpy(np.ascontiguousarray(want)).cuda().float()
        scale = max(w.abs().max().item(), 1e-3)
        assert (g - w).abs().max().item() <= grad_rel * scale + grad_atol, \
            f"{name}: max err {(g - w).abs().max().item():.3e} vs scale {scale:.3e}"
    seen = torch.from_numpy(reference.visible_mask(
        s_q, s_kv, causal=causal, causal_alignment=alignment, window=window, b=b,
        **({} if seqlens is None else dict(seqlens_q=np.array(seqlens[0]), seqlens_kv=np.array(seqlens[1]))))).cuda()
    seen = seen.expand(b, h_q, s_q, s_kv)
    rate = keep[seen].float().mean().item()
    assert abs(rate - (1 - p)) < 0.02, f"kept {rate:.4f} of the seen scores, expected {1 - p}"
    return out, keep


CASES = [
    pytest.param(dict(), id="plain-bf16"),
    pytest.param(dict(p=0.5, dtype=torch.float16, layout="bshd", h_q=8, h_kv=2), id="p0.5-fp16-bshd-gqa"),
    pytest.param(dict(causal=True), id="causal"),
    pytest.param(dict(causal=True, alignment="bottom_right", s_q=96, s_kv=160), id="causal_br-sq96_skv160"),
    pytest.param(dict(causal=True, alignment="bottom_right", s_q=160, s_kv=96), id="causal_br-sq160_skv96"),
    pytest.param(dict(window=(31, 0)), id="window31_0"),
    pytest.param(dict(window=(20, 5), alignment="bottom_right", s_q=64, s_kv=192), id="window_br-sq64_skv192"),
    pytest.param(dict(causal=True, seqlens=([128, 77], [128, 90])), id="causal-padding"),
    pytest.param(dict(bias=(1, 4, 128, 128), bias_grad=True), id="bias-grad"),
    pytest.param(dict(bias=(2, 1, 1, 128)), id="key_bias"),
    pytest.param(dict(bias=(1, 4, 64, 192), causal=True, alignment="bottom_right", s_q=64, s_kv=192,
                      window=(40, None)), id="bias-causal_br-window"),
    pytest.param(dict(softcap=30.0, causal=True), id="softcap-causal"),
    pytest.param(dict(alibi=True, causal=True), id="alibi-causal"),
    pytest.param(dict(sinks=True), id="sinks-without_their_gradient"),
    pytest.param(dict(layout="packed", h_q=4, h_kv=4, dtype=torch.float16), id="packed-fp16"),
    pytest.param(dict(b=4, h_q=8, h_kv=2, s_q=1, s_kv=200, d=128), id="decode-sq1-gqa"),
]


@pytest.mark.parametrize("case", CASES)
def test_dropout_matches_the_reference_given_its_mask(case, seed):
    run_case(**case, seed=seed)


def test_equal_states_equal_masks_other_states_other_masks(seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = random_qkv(2, 4, 4, 128, 128, 64, torch.bfloat16, "bhsd", gen)

    def forward(rng):
        out = torch.full_like(q, float("nan"))
        stridedfa.sdpa_forward(q, k, v, out, dropout_p=0.3, rng_state=rng)
        return out

    a, b = forward(_state(5, 0)), forward(_state(5, 0))
    assert torch.equal(a, b), "the same rng_state must give the same result, bit for bit"
    assert not torch.equal(a, forward(_state(6, 0))), "another seed must give another mask"
    assert not torch.equal(a, forward(_state(5, 1 << 20))), "another offset must give another mask"
    # A strided rng_state (its two values 3 elements apart) reads the same seed and offset.
    spread = torch.zeros(6, device="cuda", dtype=torch.int64)
    spread[0], spread[3] = 5, 0
    assert torch.equal(a, forward(spread[::3]))
    # the mask differs between heads and batches (not one mask broadcast)
    keep = keep_mask(q, k, v, lambda q_, k_, v_, o_: stridedfa.sdpa_forward(q_, k_, v_, o_, dropout_p=0.3,
                                                                          rng_state=_state(5, 0)))
    assert not torch.equal(keep[0, 0], keep[0, 1]) and not torch.equal(keep[0, 0], keep[1, 0])


def test_packed_views_and_contiguous_copies_agree_bit_for_bit(seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = random_qkv(2, 4, 4, 128, 128, 64, torch.float16, "packed", gen)
    copies = [t.contiguous() for t in (q, k, v)]
    rng = _state(11, 3)
    grad_out = torch.randn(2, 4, 128, 64, generator=gen, device="cuda").half()
    results = []
    for q_, k_, v_ in ((q, k, v), copies):
        out = torch.full_like(copies[0], float("nan"))
        lse = torch.empty(2, 4, 128, device="cuda")
        stridedfa.sdpa_forward(q_, k_, v_, out, lse=lse, causal=True, dropout_p=0.25, rng_state=rng)
        grads = [torch.full_like(c, float("nan")) for c in copies]
        stridedfa.sdpa_backward(q_, k_, v_, out, grad_out, lse, *grads, causal=True, dropout_p=0.25, rng_state=rng)
        results.append((out, *grads))
    for name, a, b in zip(("out", "grad_q", "grad_k", "grad_v"), *results):
        assert torch.equal(a, b), f"{name}: packed views and contiguous copies differ"


def test_deterministic_backward_with_dropout_is_bitwise_repeatable(seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = random_qkv(2, 8, 2, 256, 256, 64, torch.bfloat16, "bshd", gen)
    rng = _state(3, 9)
    out = torch.empty(2, 8, 256, 64, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(2, 8, 256, device="cuda")
    stridedfa.sdpa_forward(q, k, v, out, lse=lse, causal=True, dropout_p=0.1, rng_state=rng)
    grad_out = torch.randn(out.shape, generator=gen, device="cuda").bfloat16()
    first = None
    for _ in range(20):
        grads = [torch.full(t.shape, float("nan"), device="cuda", dtype=t.dtype) for t in (q, k, v)]
        stridedfa.sdpa_backward(q, k, v, out, grad_out, lse, *grads, causal=True, dropout_p=0.1, rng_state=rng,
                                deterministic=True)
        if first is None:
            first = grads
        for a, b in zip(first, grads):
            assert torch.equal(a, b)


def test_what_cudnn_cannot_run_with_dropout_is_refused_before_launch(seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = random_qkv(2, 4, 4, 96, 160, 64, torch.bfloat16, "bhsd", gen)
    out = torch.full_like(q, float("nan"))
    lengths = dict(seqlens_q=torch.tensor([96, 50], device="cuda", dtype=torch.int32),
                   seqlens_kv=torch.tensor([160, 70], device="cuda", dtype=torch.int32))
    with pytest.raises(stridedfa.UnsupportedError, match="dropout with a bottom-right"):
        stridedfa.sdpa_forward(q, k, v, out, causal=True, causal_alignment="bottom_right", dropout_p=0.1,
                               rng_state=_state(1), **lengths)
    assert torch.isnan(out).all(), "nothing may be written before a refusal"
    with pytest.raises(stridedfa.LayoutError, match="dropout_p > 0 needs rng_state"):
        stridedfa.sdpa_forward(q, k, v, out, dropout_p=0.1)
    one = [t[:, :, :1].contiguous() for t in (q, k, v)]
    o1, lse1 = torch.empty_like(one[0]), torch.empty(2, 4, 1, device="cuda")
    stridedfa.sdpa_forward(*one, o1, lse=lse1, dropout_p=0.1, rng_state=_state(1))
    grads = [torch.full_like(t, float("nan")) for t in one]
    with pytest.raises(stridedfa.UnsupportedError, match="s_q = s_kv = 1"):
        stridedfa.sdpa_backward(*one, o1, o1, lse1, *grads, dropout_p=0.1, rng_state=_state(1))
    assert all(torch.isnan(g).all() for g in grads)
    # cuDNN 9.19 returns the sinks' gradient scaled by 1 - p under dropout (GPU run 32): refused.
    sinks, grad_sinks = torch.randn(4, device="cuda"), torch.full((4,), float("nan"), device="cuda")
    o2, lse2 = torch.empty_like(q), torch.empty(2, 4, 96, device="cuda")
    stridedfa.sdpa_forward(q, k, v, o2, lse=lse2, sinks=sinks, dropout_p=0.1, rng_state=_state(1))
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    with pytest.raises(stridedfa.UnsupportedError, match="sinks' gradient with dropout"):
        stridedfa.sdpa_backward(q, k, v, o2, o2, lse2, *grads, sinks=sinks, grad_sinks=grad_sinks, dropout_p=0.1,
                                rng_state=_state(1))
    with pytest.raises(stridedfa.UnsupportedError, match="sinks' gradient with dropout"):
        sfa_torch.attention(q, k, v, sinks=sinks.requires_grad_(), dropout_p=0.1)
    # With dropout the backward cuts the keys the forward cut: a bias' gradient there is not packed.
    bias = torch.randn(1, 4, 96, 160, device="cuda").bfloat16()
    o3, lse3 = torch.empty_like(q), torch.empty(2, 4, 96, device="cuda")
    # keys from 32 on are seen: the bias' cut starts on a 16-byte boundary (64 bytes in)
    options = dict(causal=True, causal_alignment="bottom_right", window=(32, None), dropout_p=0.1,
                   rng_state=_state(2), bias=bias)
    stridedfa.sdpa_forward(q, k, v, o3, lse=lse3, **options)
    with pytest.raises(stridedfa.UnsupportedError, match="grad_bias: cuDNN writes the bias' gradient only"):
        stridedfa.sdpa_backward(q, k, v, o3, o3, lse3, *grads, grad_bias=torch.empty_like(bias), **options)


# --- stridedfa.torch -------------------------------------------------------------------------------

def _drawn_state():
    """The state stridedfa.torch draws first after a torch.manual_seed (its documented draw)."""
    return torch.randint(0, 1 << 62, (2,), dtype=torch.int64, device="cuda")


@pytest.mark.parametrize("layout", ["bhsd", "packed"])
def test_torch_adapter_draws_from_torchs_generator(layout, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (t.detach().requires_grad_() for t in random_qkv(2, 4, 4, 128, 128, 64, torch.bfloat16, layout, gen))
    grad_out = torch.randn(2, 4, 128, 64, generator=gen, device="cuda").bfloat16()
    torch.manual_seed(123)
    out = sfa_torch.attention(q, k, v, causal=True, dropout_p=0.2)
    out.backward(grad_out)
    torch.manual_seed(123)
    again = sfa_torch.attention(q, k, v, causal=True, dropout_p=0.2)
    assert torch.equal(out, again), "torch.manual_seed must decide the mask"
    assert not torch.equal(again, sfa_torch.attention(q, k, v, causal=True, dropout_p=0.2)), \
        "the generator advances: the next call draws another mask"
    torch.manual_seed(123)
    rng = _drawn_state()
    want = torch.empty_like(out)
    lse = torch.empty(2, 4, 128, device="cuda")
    stridedfa.sdpa_forward(q.detach(), k.detach(), v.detach(), want, lse=lse, causal=True, dropout_p=0.2,
                           rng_state=rng)
    assert torch.equal(out.detach(), want)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    stridedfa.sdpa_backward(q.detach(), k.detach(), v.detach(), want, grad_out, lse, *grads, causal=True,
                            dropout_p=0.2, rng_state=rng)
    for name, a, b in zip(("q", "k", "v"), (q.grad, k.grad, v.grad), grads):
        assert torch.equal(a, b), f"grad of {name}: autograd's backward must regenerate the forward's mask"


def test_torch_packed_attention_with_dropout_matches_attention(seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    qkv = torch.randn(2, 128, 3, 4, 64, generator=gen, device="cuda").bfloat16().requires_grad_()
    torch.manual_seed(9)
    packed = sfa_torch.packed_attention(qkv, 2, causal=True, dropout_p=0.3)
    packed.sum().backward()
    grad_packed = qkv.grad.clone()
    qkv.grad = None
    torch.manual_seed(9)
    views = [qkv[:, :, i].transpose(1, 2) for i in range(3)]
    out = sfa_torch.attention(*views, causal=True, dropout_p=0.3)
    out.sum().backward()
    assert torch.equal(packed, out.transpose(1, 2))
    assert torch.equal(grad_packed, qkv.grad)


def test_torch_compile_fullgraph_with_dropout(seed):
    torch._dynamo.reset()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = random_qkv(2, 4, 4, 128, 128, 64, torch.bfloat16, "bhsd", gen)

    @torch.compile(fullgraph=True)
    def f(q, k, v):
        return sfa_torch.attention(q, k, v, causal=True, dropout_p=0.25)

    torch.manual_seed(4)
    a = f(q, k, v)
    torch.manual_seed(4)
    assert torch.equal(a, f(q, k, v)), "torch.manual_seed must decide the mask under torch.compile too"
    keep = keep_mask(q, k, v, lambda q_, k_, v_, o_: o_.copy_(f(q_, k_, v_)))
    seen = torch.ones(128, 128, device="cuda", dtype=torch.bool).tril().expand_as(keep)
    assert abs(keep[seen].float().mean().item() - 0.75) < 0.02
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    f(qg, kg, vg).float().square().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (qg, kg, vg))


def test_cuda_graph_replays_draw_new_masks(seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = random_qkv(2, 4, 4, 128, 128, 64, torch.bfloat16, "bhsd", gen)
    onehot, _ = _one_hot_like(v, 0)
    sfa_torch.attention(q, k, onehot, dropout_p=0.4)  # warm-up: the graph is built outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sfa_torch.attention(q, k, onehot, dropout_p=0.4)
    masks = []
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        masks.append(out[..., :64] != 0)
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2]), \
        "each replay must draw a new mask"
    for m in masks:
        assert abs(m.float().mean().item() - 0.6) < 0.02


# --- stridedfa.cupy --------------------------------------------------------------------------------

def test_cupy_dropout_equals_the_generic_call(seed):
    cp = pytest.importorskip("cupy")
    import stridedfa.cupy

    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = random_qkv(2, 4, 2, 128, 128, 64, torch.float16, "bshd", gen)
    grad_out = torch.randn(2, 4, 128, 64, generator=gen, device="cuda").half()
    rng = _state(77, 5)
    torch.cuda.synchronize()
    qc, kc, vc, gc, rc = (cp.from_dlpack(t) for t in (q, k, v, grad_out, rng))
    out_c, lse_c = stridedfa.cupy.attention(qc, kc, vc, causal=True, dropout_p=0.2, rng_state=rc, return_lse=True)
    dq_c, dk_c, dv_c = stridedfa.cupy.attention_backward(qc, kc, vc, out_c, lse_c, gc, causal=True, dropout_p=0.2,
                                                         rng_state=rc)
    cp.cuda.get_current_stream().synchronize()
    out = torch.empty_strided((2, 4, 128, 64), torch.from_dlpack(out_c).stride(), device="cuda",
                              dtype=torch.float16)  # the same layouts: the same graph
    lse = torch.empty(2, 4, 128, device="cuda")
    stridedfa.sdpa_forward(q, k, v, out, lse=lse, causal=True, dropout_p=0.2, rng_state=rng)
    grads = [torch.empty_strided(t.shape, torch.from_dlpack(g).stride(), device="cuda", dtype=t.dtype)
             for t, g in zip((q, k, v), (dq_c, dk_c, dv_c))]
    stridedfa.sdpa_backward(q, k, v, out, grad_out, lse, *grads, causal=True, dropout_p=0.2, rng_state=rng)
    torch.cuda.synchronize()
    for name, a, b in zip(("out", "grad_q", "grad_k", "grad_v"), (out_c, dq_c, dk_c, dv_c), (out, *grads)):
        assert torch.equal(torch.from_dlpack(a), b), name


def test_torch_backward_with_fixed_sinks_and_dropout(seed):
    """Sinks that do not require grad take part in a dropout step: the backward asks cuDNN for no
    sinks' gradient (which it gets wrong under dropout) and equals sdpa_backward with the same state."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (t.detach().requires_grad_() for t in random_qkv(2, 4, 4, 128, 128, 64, torch.bfloat16, "bhsd", gen))
    sinks = torch.randn(4, generator=gen, device="cuda")
    grad_out = torch.randn(2, 4, 128, 64, generator=gen, device="cuda").bfloat16()
    torch.manual_seed(5)
    out = sfa_torch.attention(q, k, v, sinks=sinks, dropout_p=0.2)
    out.backward(grad_out)
    torch.manual_seed(5)
    rng = _drawn_state()
    want, lse = torch.empty_like(out), torch.empty(2, 4, 128, device="cuda")
    stridedfa.sdpa_forward(q.detach(), k.detach(), v.detach(), want, lse=lse, sinks=sinks, dropout_p=0.2,
                           rng_state=rng)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    stridedfa.sdpa_backward(q.detach(), k.detach(), v.detach(), want, grad_out, lse, *grads, sinks=sinks,
                            dropout_p=0.2, rng_state=rng)
    assert torch.equal(out.detach(), want)
    for a, b in zip((q.grad, k.grad, v.grad), grads):
        assert torch.equal(a, b)
