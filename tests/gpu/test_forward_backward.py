"""sdpa_forward / sdpa_backward against a high-precision reference, every layout.

Each test draws fresh N(0, 1) inputs from a per-test seed, poisons every output (out, lse,
grad_q/k/v) with NaN, runs the forward and then the backward with the forward's lse, and
checks: every output element written, nothing outside the output views written, out and
lse close to the reference, all three gradients close relative to the reference's scale.
"""

import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import numpy as np  # noqa: E402

from helpers.cases import DEVICE, Case, check_against_reference, check_fully_written, run_case  # noqa: E402
from helpers.layouts import make_qkv  # noqa: E402
from helpers.torch_ref import torch_reference, torch_reference_grads  # noqa: E402

pytestmark = pytest.mark.gpu

GQA = dict(h_q=8, h_kv=2)
MQA = dict(h_q=8, h_kv=1)
CROSS = dict(s_q=128, s_kv=256)  # s_q != s_kv

CASES = [
    # contiguous and strided views of separate q, k, v
    pytest.param(Case("bhsd", "fp16"), id="bhsd-fp16"),
    pytest.param(Case("bhsd", "bf16"), id="bhsd-bf16"),
    pytest.param(Case("bshd", "bf16", out_layout="bshd", dout_layout="bshd", grad_layout="bshd"),
                 id="bshd-bf16-all_bshd"),
    pytest.param(Case("sbhd", "fp16", out_layout="sbhd", grad_layout="sbhd"),
                 id="sbhd-fp16-all_sbhd"),
    pytest.param(Case("bshd_padded", "bf16", out_layout="bshd_padded", dout_layout="bshd_padded",
                      grad_layout="bshd_padded"), id="padded_strides-bf16"),
    pytest.param(Case("hsbd", "fp16", out_layout="shbd", dout_layout="hbsd", grad_layout="sbhd"),
                 id="mixed_orders-fp16"),
    # packed q/k/v views; gradients into one packed buffer of the same packing
    pytest.param(Case("bs3hd", "bf16", out_layout="bshd", dout_layout="bshd", grad_layout="bs3hd"),
                 id="bs3hd-bf16-dqkv_packed"),
    pytest.param(Case("bs3hd", "fp16", out_layout="bshd", grad_layout="bshd"), id="bs3hd-fp16"),
    pytest.param(Case("sb3hd", "fp16", out_layout="sbhd", dout_layout="sbhd", grad_layout="sb3hd"),
                 id="sb3hd-fp16-dqkv_packed"),
    pytest.param(Case("sbh3d", "bf16", out_layout="sbhd", grad_layout="sbh3d"),
                 id="sbh3d-bf16-dqkv_packed"),
    pytest.param(Case("sbh3d", "fp16", causal=True, grad_layout="bhsd"), id="sbh3d-fp16-causal"),
    # contiguous inputs, gradients into a packed (b, s, 3, h, d) buffer
    pytest.param(Case("bhsd", "bf16", out_layout="bshd", grad_layout="bs3hd"),
                 id="bhsd-bf16-grads_into_bs3hd"),
    # GQA / MQA
    pytest.param(Case("bs2hd_kv", "bf16", **GQA, grad_layout="bs2hd_kv", out_layout="bshd"),
                 id="gqa8x2-kvpacked-bf16-dkv_packed"),
    pytest.param(Case("bs2hd_kv", "fp16", **GQA, **CROSS, causal=True, alignment="bottom_right",
                      grad_layout="bs2hd_kv"), id="gqa8x2-kvpacked-fp16-causal_br-sq128_skv256"),
    pytest.param(Case("bhsd", "bf16", **MQA), id="mqa8x1-bhsd-bf16"),
    pytest.param(Case("bshd", "fp16", **MQA, causal=True, out_layout="bshd", grad_layout="bshd"),
                 id="mqa8x1-bshd-fp16-causal"),
    # causal masks, both alignments, s_q != s_kv and s_q == s_kv
    *[pytest.param(Case("bhsd", dt, **CROSS, causal=True, alignment=al),
                   id=f"causal_{al}-sq128_skv256-{dt}")
      for al in ("top_left", "bottom_right") for dt in ("fp16", "bf16")],
    *[pytest.param(Case("bshd", "bf16", causal=True, alignment=al, out_layout="bshd"),
                   id=f"causal_{al}-sq256_skv256-bf16") for al in ("top_left", "bottom_right")],
    pytest.param(Case("bhsd", "bf16", s_q=100, s_kv=200, causal=True, alignment="bottom_right"),
                 id="causal_bottom_right-sq100_skv200-bf16"),
    pytest.param(Case("bhsd", "fp16", s_q=384, s_kv=128), id="noncausal-sq384_skv128-fp16"),
    # d_qk != d_v
    pytest.param(Case("bhsd", "bf16", d_qk=128, d_v=64), id="d128x64-bf16"),
    pytest.param(Case("bshd", "fp16", d_qk=128, d_v=64, causal=True, out_layout="bshd"),
                 id="d128x64-bshd-fp16-causal"),
    pytest.param(Case("bhsd", "bf16", d_qk=192, d_v=128, b=1), id="d192x128-bf16"),
    pytest.param(Case("bshd", "fp16", d_qk=192, d_v=128, b=1, **GQA, out_layout="bshd"),
                 id="d192x128-gqa-fp16"),
    pytest.param(Case("bhsd", "fp16", d_qk=128, d_v=128, s_q=512, s_kv=512, h_q=8, h_kv=8),
                 id="d128-s512-fp16"),
    # explicit scale
    pytest.param(Case("bshd", "bf16", scale=0.3, causal=True), id="scale0.3-bf16-causal"),
]


@pytest.mark.parametrize("case", CASES)
def test_forward_backward_match_reference(case, seed):
    run = run_case(case, seed)
    check_fully_written(run)
    check_against_reference(run, case.torch_dtype, case.ref_options)


@pytest.mark.parametrize("causal,alignment", [(False, "top_left"), (True, "top_left"),
                                              (True, "bottom_right")],
                         ids=["noncausal", "causal_top_left", "causal_bottom_right"])
def test_torch_reference_agrees_with_numpy_reference(causal, alignment, seed):
    """The GPU torch reference used everywhere here equals stridedfa.reference (NumPy)."""
    from stridedfa import reference

    dims = dict(b=1, h_q=4, h_kv=2, s_q=32, s_kv=48, d_qk=32, d_v=16)
    q, k, v, _ = make_qkv("bhsd", *dims.values(), torch.float16, DEVICE, seed)
    dout = torch.randn(1, 4, 32, 16, device=DEVICE).half()
    opts = dict(scale=0.2, causal=causal)
    out, lse = torch_reference(q, k, v, alignment=alignment, **opts)
    grads = torch_reference_grads(q, k, v, dout, alignment=alignment, **opts)

    def np32(t):
        return t.detach().float().cpu().numpy()

    np_out, np_lse = reference.sdpa_forward(np32(q), np32(k), np32(v), causal_alignment=alignment,
                                            **opts)
    np_grads = reference.sdpa_backward(np32(q), np32(k), np32(v), np32(dout),
                                       causal_alignment=alignment, **opts)
    pairs = [("out", out, np_out), ("lse", lse, np_lse)]
    pairs += list(zip(("grad_q", "grad_k", "grad_v"), grads, np_grads))
    for name, ours, theirs in pairs:
        theirs = np.asarray(theirs, dtype=np.float64).reshape(tuple(ours.shape))
        err = np.abs(np32(ours).astype(np.float64) - theirs).max()
        assert err < 1e-4, f"{name}: torch reference vs stridedfa.reference max abs err {err:.3e}"
