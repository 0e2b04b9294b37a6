"""Attention sinks with a single query row (issue 30): cuDNN 9.19 refuses them ("decode only mode
... not supported with sink_token"), so stridedfa describes the one row twice (a query axis of 2
with stride 0, no copy). Every decoding step of gpt-oss is such a call. Outputs poisoned with NaN,
compared with the float64 reference, through the generic, torch, CuPy and JAX entry points and a
paged cache."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import stridedfa  # noqa: E402
from stridedfa import reference  # noqa: E402

pytestmark = pytest.mark.gpu


def _np(t):
    return t.detach().float().cpu().numpy().astype(np.float64)


def _check(out, lse, ref_out, ref_lse):
    out, lse = out.float(), lse.float()
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert (out - torch.from_numpy(ref_out).cuda()).abs().max().item() <= 2e-2 * np.abs(ref_out).max() + 5e-3
    assert (lse - torch.from_numpy(ref_lse).cuda()).abs().max().item() <= 2e-3 * max(1, np.abs(ref_lse).max())


CASES = [
    pytest.param({}, id="no_mask"),
    pytest.param(dict(causal=True, causal_alignment="bottom_right"), id="causal_br"),
    pytest.param(dict(causal=True), id="causal_tl-one_key"),
    pytest.param(dict(causal=True, causal_alignment="bottom_right", window=(5, None)), id="causal_br-window5"),
    pytest.param(dict(softcap=4.0, causal=True, causal_alignment="bottom_right"), id="softcap"),
    pytest.param(dict(bias=True), id="bias"),
    pytest.param(dict(seqlens=True, causal=True, causal_alignment="bottom_right"), id="padding_lengths"),
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_one_query_row_with_sinks(case, layout, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    b, h_q, h_kv, s_kv, d = 3, 8, 2, 77, 64
    q = torch.randn(b, 1, h_q, d, generator=gen, device="cuda").bfloat16()
    q = q.transpose(1, 2) if layout == "bshd" else q.reshape(b, h_q, 1, d)
    k = torch.randn(b, h_kv, s_kv, d, generator=gen, device="cuda").bfloat16()
    v = torch.randn(b, h_kv, s_kv, d, generator=gen, device="cuda").bfloat16()
    sinks = 2.0 * torch.randn(h_q, generator=gen, device="cuda")
    options = {key: value for key, value in case.items() if key not in ("bias", "seqlens")}
    extra, ref_extra = {}, {}
    if case.get("bias"):
        extra["bias"] = torch.randn(b, h_q, 1, s_kv, generator=gen, device="cuda").bfloat16()
        ref_extra["bias"] = _np(extra["bias"])
    if case.get("seqlens"):
        lengths = [77, 0, 30]
        extra["seqlens_kv"] = torch.tensor(lengths, device="cuda", dtype=torch.int32)
        ref_extra.update(seqlens_q=np.ones(b, dtype=np.int64), seqlens_kv=np.array(lengths))
    out = torch.full((b, h_q, 1, d), float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((b, h_q, 1), float("nan"), device="cuda")
    stridedfa.sdpa_forward(q, k, v, out, lse=lse, sinks=sinks, **options, **extra)
    ref_out, ref_lse = reference.sdpa_forward(_np(q), _np(k), _np(v), dtype=np.float64, sinks=_np(sinks),
                                              **options, **ref_extra)
    _check(out, lse, ref_out, ref_lse)


def test_a_paged_decoding_step_with_sinks(seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    b, h, d, block = 2, 4, 64, 16
    q = torch.randn(b, h, 1, d, generator=gen, device="cuda").bfloat16()
    k_cache = torch.randn(6, h, block, d, generator=gen, device="cuda").bfloat16()
    v_cache = torch.randn(6, h, block, d, generator=gen, device="cuda").bfloat16()
    table = torch.tensor([[4, 1, 0], [2, 5, 3]], device="cuda", dtype=torch.int32)
    lengths = [37, 9]
    sinks = torch.randn(h, generator=gen, device="cuda")
    out = torch.full((b, h, 1, d), float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((b, h, 1), float("nan"), device="cuda")
    stridedfa.sdpa_forward(q, k_cache, v_cache, out, lse=lse, block_table=table, sinks=sinks, causal=True,
                           causal_alignment="bottom_right",
                           seqlens_kv=torch.tensor(lengths, device="cuda", dtype=torch.int32))
    for i, n in enumerate(lengths):
        keys = torch.cat([k_cache[j] for j in table[i].tolist()], dim=1)[:, :n][None]
        values = torch.cat([v_cache[j] for j in table[i].tolist()], dim=1)[:, :n][None]
        ref_out, ref_lse = reference.sdpa_forward(_np(q[i:i + 1]), _np(keys), _np(values), dtype=np.float64,
                                                  sinks=_np(sinks))
        _check(out[i:i + 1], lse[i:i + 1], ref_out, ref_lse)


def test_the_framework_entry_points_decode_with_sinks(seed):
    """stridedfa.torch (inference and under autograd's no_grad), and CuPy / JAX where installed."""
    import stridedfa.torch as st

    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(2, 4, 1, 64, generator=gen, device="cuda").bfloat16()
    k = torch.randn(2, 4, 50, 64, generator=gen, device="cuda").bfloat16()
    v = torch.randn(2, 4, 50, 64, generator=gen, device="cuda").bfloat16()
    sinks = torch.randn(4, generator=gen, device="cuda")
    ref_out, ref_lse = reference.sdpa_forward(_np(q), _np(k), _np(v), dtype=np.float64, sinks=_np(sinks),
                                              causal=True, causal_alignment="bottom_right")
    out, lse = st.attention(q, k, v, sinks=sinks, causal=True, causal_alignment="bottom_right", return_lse=True)
    _check(out, lse, ref_out, ref_lse)
    try:
        import cupy

        import stridedfa.cupy as sc
    except ImportError:
        cupy = None
    if cupy is not None:
        out, lse = sc.attention(*(cupy.from_dlpack(t) for t in (q, k, v)), sinks=cupy.from_dlpack(sinks), causal=True,
                                causal_alignment="bottom_right", return_lse=True)
        _check(torch.from_dlpack(out), torch.from_dlpack(lse), ref_out, ref_lse)
    try:
        import jax
        import jax.numpy as jnp

        import stridedfa.jax as sj
    except ImportError:
        jax = None
    if jax is not None:
        args = [jnp.asarray(_np(t)).astype(jnp.bfloat16) for t in (q, k, v)]
        out, lse = jax.jit(lambda q_, k_, v_, s_: sj.attention(q_, k_, v_, layout="bhsd", sinks=s_, causal=True,
                                                               causal_alignment="bottom_right", return_lse=True))(
            *args, jnp.asarray(_np(sinks)).astype(jnp.float32))
        _check(torch.from_numpy(np.asarray(out, dtype=np.float32)).cuda(),
               torch.from_numpy(np.asarray(lse, dtype=np.float32)).cuda(), ref_out, ref_lse)
