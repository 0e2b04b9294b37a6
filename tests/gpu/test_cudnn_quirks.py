"""Each quirk of cuDNN that stridedfa refuses or works around (cpp/include/stridedfa/cudnn_quirks.hpp)
still reproduces on the installed cuDNN: the call runs in a child process with the quirk lifted
(STRIDEDFA_LIFT_QUIRKS) and must still come out wrong -- or be refused by cuDNN itself. When a
cuDNN fixes one, its test here fails: set the row's fixed_in and the refusal goes for that version.

A child that fails for any other reason (a Python error, stridedfa's own refusal) fails the test:
run 58's three "reproductions" died on a tuple from the reference and passed without computing
anything (found in stop 39; the reference's out is now taken, and _still_wrong is strict). Run 59
(cuDNN 9.19, H100) ran them all: every quirk reproduced except stop 39's first try at
unpacked_bias_one_by_one, which missed the defect's conditions and was rewritten after the case
that found it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

pytestmark = pytest.mark.gpu

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The child's common part: fresh random bf16 data, stridedfa's torch adapter, the fp32 reference.
PRELUDE = """
import json, sys, torch
sys.path.insert(0, {tests!r})
import stridedfa.torch as st
from stridedfa import _core
from stridedfa._torch_ops import _workspace
from helpers.torch_ref import _attention
torch.manual_seed(0)
def rand(*shape, grad=True):
    return (torch.randn(*shape, device="cuda") * 0.5).to(torch.bfloat16).requires_grad_(grad)
def report(**fields):
    print("RESULT " + json.dumps(fields))
def relative(ours, ref):
    return (ours.float() - ref).abs().max().item() / max(ref.abs().max().item(), 1e-6)
# A variable-length (THD) call's options as the operators take them (VarlenOptions: no bounds
# promised, no scale, not causal, no window, softcap, sinks or dropout).
VARLEN = (0, 0, None, False, "top_left", -1, -1, None, None, 0.0, None, False)
def varlen_gradients(q, k, v, cu, grad_out):  # the fp32 reference's (dq, dk, dv), one dense call per sequence
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    for start, end in zip(cu.tolist()[:-1], cu.tolist()[1:]):
        part = [t[start:end].transpose(0, 1)[None] for t in (qf, kf, vf)]
        out = _attention(*part, q.shape[-1] ** -0.5, False, "top_left")[0]
        out.backward(grad_out[start:end].transpose(0, 1)[None].float())
    return qf.grad, kf.grad, vf.grad
def varlen_errors(q, k, v):  # two sequences through the core's varlen backward, past the adapters
    cu = torch.tensor([0, 40, q.shape[0]], dtype=torch.int32, device="cuda")
    out, lse = torch.ops.stridedfa.varlen_forward(q, k, v, cu, cu, *VARLEN)
    grad_out = rand(*out.shape, grad=False)
    grads = [torch.empty(t.shape, dtype=t.dtype, device="cuda") for t in (q, k, v)]
    _core._backward(q, k, v, out, grad_out, lse, *grads, None, False, "top_left", None, _workspace, None, None,
                    None, None, None, None, False, None, None, None, 0.0, None, cu_seqlens_q=cu, cu_seqlens_kv=cu)
    return [relative(ours, ref) for ours, ref in zip(grads, varlen_gradients(q, k, v, cu, grad_out))]
"""


def _lifted(quirk: str, body: str, **settings: str) -> dict:
    """Runs ``body`` (after PRELUDE) with ``quirk`` lifted (and the environment ``settings``);
    returns what it reported, or the error it raised as {"raised": message}."""
    code = PRELUDE.format(tests=HERE) + textwrap.dedent(body)
    env = dict(os.environ, STRIDEDFA_LIFT_QUIRKS=quirk, **settings)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    # the exception's own line (a message may span several), else the last line there is
    lines = done.stderr.strip().splitlines() or ["(no output)"]
    raised = [line for line in lines if re.match(r"^[\w.]+(Error|Exception): ", line)]
    return {"raised": raised[-1] if raised else lines[-1]}


def _still_wrong(result: dict, quirk: str, tolerance: float):
    if "raised" in result:  # only cuDNN itself refusing the graph means the gap is still there
        raised = result["raised"]
        assert "quirk" not in raised, f"{quirk}: stridedfa still refused it: {raised}"
        kind, _, message = raised.partition(": ")
        # cuDNN's refusals come as these errors with a message that starts "cuDNN " (cudnn_graphs.cpp check)
        assert kind in ("stridedfa._errors.BackendError", "stridedfa._errors.UnsupportedError") and \
            message.startswith("cuDNN "), f"{quirk}: the reproduction itself failed: {raised}"
        return
    # a NaN error is a wrong result too (NaN compares false)
    assert not result["error"] <= tolerance, (
        f"{quirk} no longer reproduces on cuDNN {torch.backends.cudnn.version()}: error {result['error']:.3g} "
        f"<= {tolerance}; set its fixed_in in cudnn_quirks.hpp")


def test_bias_grad_under_score_modifier():
    result = _lifted("bias_grad_under_score_modifier", """
        q, k, v = rand(1, 2, 64, 64), rand(1, 2, 64, 64), rand(1, 2, 64, 64)
        bias = rand(1, 2, 64, 64)
        st.attention(q, k, v, bias=bias, softcap=5.0).float().square().sum().backward()
        ours = bias.grad.float().clone()
        bias.grad = None
        qf, kf, vf, bf = (t.detach().float().requires_grad_() for t in (q, k, v, bias))
        _attention(qf, kf, vf, 64 ** -0.5, False, "top_left", softcap=5.0, bias=bf)[0].square().sum().backward()
        report(error=(ours - bf.grad).abs().max().item() / max(bf.grad.abs().max().item(), 1e-6))
    """)
    _still_wrong(result, "bias_grad_under_score_modifier", 0.05)


def test_bias_grad_shared_rows():
    result = _lifted("bias_grad_shared_rows", """
        q, k, v = rand(1, 2, 64, 64), rand(1, 2, 64, 64), rand(1, 2, 64, 64)
        bias = rand(1, 2, 1, 64)
        st.attention(q, k, v, bias=bias).float().square().sum().backward()
        ours = bias.grad.float().clone()
        qf, kf, vf, bf = (t.detach().float().requires_grad_() for t in (q, k, v, bias))
        _attention(qf, kf, vf, 64 ** -0.5, False, "top_left", bias=bf)[0].square().sum().backward()
        report(error=(ours - bf.grad).abs().max().item() / max(bf.grad.abs().max().item(), 1e-6))
    """)
    _still_wrong(result, "bias_grad_shared_rows", 0.05)


def test_sinks_with_one_query():
    result = _lifted("sinks_with_one_query", """
        q, k, v = rand(2, 4, 1, 64, grad=False), rand(2, 4, 40, 64, grad=False), rand(2, 4, 40, 64, grad=False)
        sinks = torch.randn(4, device="cuda")
        out = st.attention(q, k, v, sinks=sinks)
        ref = _attention(q.float(), k.float(), v.float(), 64 ** -0.5, False, "top_left", sinks=sinks)[0]
        report(error=(out.float() - ref).abs().max().item())
    """, STRIDEDFA_DECODE_GRAPHS="exact")  # decoding by heads folds sinks in itself: cuDNN never sees them
    _still_wrong(result, "sinks_with_one_query", 0.02)


def test_sinks_grad_under_dropout():
    # The sinks' true gradient under dropout: out_i depends on sink h only through the softmax's
    # normaliser, so d loss / d sink_h = -sum_i P_sink(i) * (grad_out_i . out_i), with out the
    # dropped output the forward returned and P_sink from the fp32 scores (dropout acts after the
    # softmax). The quirk returns (1 - dropout_p) times that.
    result = _lifted("sinks_grad_under_dropout", """
        q, k, v = rand(1, 2, 64, 64), rand(1, 2, 64, 64), rand(1, 2, 64, 64)
        sinks = torch.randn(2, device="cuda", requires_grad=True)
        out = st.attention(q, k, v, sinks=sinks, dropout_p=0.3)
        grad_out = rand(1, 2, 64, 64, grad=False)
        out.backward(grad_out)
        scores = q.detach().float() @ k.detach().float().transpose(-2, -1) * 64 ** -0.5
        sink = sinks.detach()[None, :, None, None].expand(1, 2, 64, 1)
        p_sink = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., -1]
        expected = -(p_sink * (grad_out.float() * out.detach().float()).sum(-1)).sum(dim=(0, 2))
        report(error=relative(sinks.grad, expected))
    """)
    _still_wrong(result, "sinks_grad_under_dropout", 0.05)


def test_unpacked_bias_one_by_one():
    # GPU run 31's fuzz case (tests/gpu/test_bias.py, refused there): s_kv = 1 and causal
    # bottom-right over 33 queries, so the core describes the one row that sees the key, with the
    # batch-broadcast (1, h, 33, 1) bias cut to that row (head stride 33: not packed). Stop 39's
    # first reproduction, a (b, h, 1, 1) slice with every axis present, came out right on cuDNN 9.19
    # (GPU run 59): the defect needs the cut row.
    result = _lifted("unpacked_bias_one_by_one", """
        import stridedfa
        q = rand(2, 6, 33, 128, grad=False)
        k, v = rand(2, 6, 1, 128, grad=False), rand(2, 6, 1, 128, grad=False)
        bias = torch.randn(1, 6, 33, 1, device="cuda").to(torch.bfloat16)
        out, lse = torch.empty_like(q), torch.empty(2, 6, 33, device="cuda")
        stridedfa.sdpa_forward(q, k, v, out, lse=lse, causal=True, causal_alignment="bottom_right", bias=bias)
        ref_lse = _attention(q.float(), k.float(), v.float(), 128 ** -0.5, True, "bottom_right",
                             bias=bias.float())[1]
        report(error=(lse[:, :, 32] - ref_lse[:, :, 32]).abs().max().item())  # the one row that sees a key
    """)
    _still_wrong(result, "unpacked_bias_one_by_one", 0.05)


def test_varlen_backward_dense_queries():
    # q, k and v as views of one (tokens, 3, heads, dim) projection: q is not dense, dQ is.
    result = _lifted("varlen_backward_dense_queries", """
        qkv = rand(96, 3, 4, 64, grad=False)
        report(error=varlen_errors(qkv[:, 0], qkv[:, 1], qkv[:, 2])[0])  # dQ
    """)
    _still_wrong(result, "varlen_backward_dense_queries", 0.05)


def test_varlen_backward_mqa_dk():
    # One key/value head for four query heads, everything dense: dK is the wrong one.
    result = _lifted("varlen_backward_mqa_dk", """
        report(error=varlen_errors(rand(96, 4, 64, grad=False), rand(96, 1, 64, grad=False),
                                   rand(96, 1, 64, grad=False))[1])  # dK
    """)
    _still_wrong(result, "varlen_backward_mqa_dk", 0.05)
