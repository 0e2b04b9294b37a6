"""Additive score bias and its gradient (``bias=`` / ``grad_bias=``) through the generic entry points
and the torch adapter -- and the probe of which bias layouts cuDNN accepts.

Scores are ``S = softcap(scale * q @ k^T) + bias``, then the masks. Each case draws fresh inputs from
a seeded torch generator, poisons every output with NaN, runs forward (and backward) and compares
with the float64 NumPy reference (``stridedfa.reference``: the bias is added after the softcap, and
``extra["dbias"]`` is dS summed to the bias' own shape). Where a row sees no key the documented
values must be there (out = 0, lse = -inf, zero gradients), and grad_bias must be exactly 0 wherever
no score that sums into it takes part (a masked or padded position, or a -inf bias).

Which bias layouts cuDNN accepts is not known in advance, so the layout tests are probes: a layout
cuDNN refuses (``stridedfa.UnsupportedError``, carrying cuDNN's support-check message) is recorded
as an xfail whose reason is that message -- ``pytest -ra`` lists every refused layout -- while an
accepted layout that gives wrong numbers FAILS. The option tests (masks, padding, softcap, ...) use
a contiguous full bias and fail on a refusal, except the cases marked ``refusal_ok``, where refusing
is an acceptable answer.

The cases marked ``misaligned`` give cuDNN a bias that is not 16-byte aligned (rows of 200 bytes, a
pointer 2 bytes off, 2-byte strides, a bias the core slices from an odd key). They run in a child
process (see ISOLATED), so that a fault there cannot take the rest of the run with it, and a
LayoutError from stridedfa's own rules is recorded for them like a refusal.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import stridedfa  # noqa: E402
from stridedfa import reference  # noqa: E402

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
B, H_Q, H_KV, S, D = 2, 4, 2, 128, 64
NEG_INF = float("-inf")

# (out atol, grad rel, grad atol), as in test_variants.py. The absolute floor of the gradients:
# cuDNN's backward reads the forward's rounded out (D = rowsum(dO * out)), so a gradient that is ~0
# carries that rounding. grad_bias sums dS over the bias' shared axes: its floor is scaled by the
# square root of the number of scores summed into each of its elements.
TOL = {torch.float16: (5e-3, 1e-2, 1e-3), torch.bfloat16: (2.5e-2, 3e-2, 5e-3)}


# ----------------------------------------------------------------------------------------- inputs


def _generator(seed):
    return torch.Generator(device=DEVICE).manual_seed(seed)


def _randn(gen, *shape, dtype):
    return torch.randn(*shape, generator=gen, device=DEVICE, dtype=torch.float32).to(dtype)


def _poisoned(shape, dtype):
    return torch.full(tuple(shape), float("nan"), device=DEVICE, dtype=dtype)


def _np(t):
    return t.detach().float().cpu().numpy().astype(np.float64)


def _on_device(a):
    return torch.from_numpy(np.ascontiguousarray(a)).to(DEVICE).float()


def make_bias(layout, gen, *, b, h_q, s_q, s_kv, dtype):
    """A bias of the named layout, N(0, 1) values (0 / -inf for the key-padding mask).

    Shapes follow NumPy broadcasting against (b, h_q, s_q, s_kv): fewer axes are leading 1s, an
    extent-1 axis is shared. The ``expanded_*`` layouts are stride-0 views of the full shape; the
    others keep the key axis contiguous with various strides on the other axes.
    """

    def r(*shape):
        return _randn(gen, *shape, dtype=dtype)

    full = (b, h_q, s_q, s_kv)
    if layout == "full":
        return r(*full)
    if layout == "heads":  # one bias per head, shared over the batch (T5 / ALiBi-like tables)
        return r(1, h_q, s_q, s_kv)
    if layout == "batch":
        return r(b, 1, s_q, s_kv)
    if layout == "shared":
        return r(1, 1, s_q, s_kv)
    if layout == "keys":  # key-padding style
        return r(b, 1, 1, s_kv)
    if layout == "per_query":  # shared over keys: shifts each row, changes no probability
        return r(b, h_q, s_q, 1)
    if layout == "2d":
        return r(s_q, s_kv)
    if layout == "1d":
        return r(s_kv)
    if layout == "expanded_keys":  # stride 0 on heads and queries
        return r(b, 1, 1, s_kv).expand(full)
    if layout == "expanded_shared":  # stride 0 on batch and heads
        return r(s_q, s_kv).expand(full)
    if layout == "transposed":  # memory order (h, s_q, b, s_kv): strides not in axis order
        return r(h_q, s_q, b, s_kv).permute(2, 0, 1, 3)
    if layout == "row_slice":  # rows of a wider buffer: row stride s_kv + 64
        return r(b, h_q, s_q, s_kv + 64)[..., :s_kv]
    if layout == "misaligned_ptr":  # data pointer 2 bytes past a 16-byte boundary
        return r(b, h_q, s_q, s_kv + 8)[..., 1 : 1 + s_kv]
    if layout == "keys_padding_mask":  # a boolean (b, s_kv) key mask as 0 / -inf; every row keeps a key
        lengths = torch.randint(1, s_kv + 1, (b,), generator=gen, device=DEVICE)
        lengths[0] = s_kv
        keep = torch.arange(s_kv, device=DEVICE)[None, :] < lengths[:, None]
        return torch.zeros(b, 1, 1, s_kv, device=DEVICE, dtype=dtype).masked_fill(~keep[:, None, None, :], NEG_INF)
    if layout == "full_random_mask":  # N(0, 1) with ~30% -inf; key 0 always kept (seen by every row)
        keep = torch.rand(full, generator=gen, device=DEVICE) < 0.7
        keep[..., 0] = True
        return r(*full).masked_fill(~keep, NEG_INF)
    raise ValueError(f"unknown bias layout {layout!r}")


def _grad_bias_output(shape, dtype, grad_layout):
    """(grad_bias, the buffer behind it or None): bias' exact shape, poisoned with NaN."""
    if grad_layout == "contiguous":
        return _poisoned(shape, dtype), None
    if grad_layout == "row_slice":  # a view of wider rows: the spare columns must stay NaN
        buffer = _poisoned((*shape[:-1], shape[-1] + 8), dtype)
        return buffer[..., : shape[-1]], buffer
    raise ValueError(f"unknown grad_bias layout {grad_layout!r}")


@contextlib.contextmanager
def _refusals(step, layout, *, record, layout_errors=False):
    """Record a refusal as an xfail with its message (``record``), or let it fail the test."""
    try:
        yield
    except stridedfa.UnsupportedError as error:
        if not record:
            raise
        pytest.xfail(f"{step} with bias layout {layout!r} refused (UnsupportedError): {error}")
    except stridedfa.LayoutError as error:
        if not layout_errors:
            raise
        pytest.xfail(f"{step} with bias layout {layout!r} refused by stridedfa's rules (LayoutError): {error}")


def _forward(q, k, v, bias, **options):
    """The generic forward into NaN-poisoned out (b, h_q, s_q, d_v) and lse (b, h_q, s_q)."""
    out = _poisoned((*q.shape[:3], v.shape[3]), q.dtype)
    lse = _poisoned(q.shape[:3], torch.float32)
    stridedfa.sdpa_forward(q, k, v, out, lse=lse, bias=bias, **options)
    torch.cuda.synchronize()
    return out, lse


# ----------------------------------------------------------------------------------------- checks


def _sum_to_shape(x, shape):
    """``x`` (b, h_q, s_q, s_kv) summed over the axes along which ``shape`` broadcasts to it."""
    x = x.sum(axis=tuple(range(x.ndim - len(shape))))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    return x.sum(axis=axes, keepdims=True).reshape(shape)


def _live(seen, bias_np, full):
    """Boolean (b, h_q, s_q, s_kv): the score takes part (seen under the masks, bias not -inf)."""
    return np.broadcast_to(seen, full) & np.isfinite(np.broadcast_to(bias_np, full))


def _check_grad(name, got, want, dtype, count=1):
    """max |got - want| <= grad_rel * max |want| + grad_atol * sqrt(count); no NaN (unwritten)."""
    _, grad_rel, grad_atol = TOL[dtype]
    g = got.detach().float()
    n_nan = int(torch.isnan(g).sum())
    assert n_nan == 0, f"{name}: {n_nan} of {g.numel()} elements NaN (left unwritten?)"
    w = _on_device(want)
    assert tuple(g.shape) == tuple(w.shape), f"{name}: shape {tuple(g.shape)} != reference {tuple(w.shape)}"
    diff = (g - w).abs()
    err = diff.max().item()
    scale = max(w.abs().max().item(), 1e-3)
    limit = grad_rel * scale + grad_atol * math.sqrt(count)
    if err > limit:
        idx = tuple(int(i) for i in np.unravel_index(int(diff.argmax()), tuple(g.shape)))
        raise AssertionError(
            f"{name}: max err {err:.3e} > {limit:.3e} (max |ref| {scale:.3e}, {count} summed); "
            f"worst at {idx}: got {g[idx].item():.5g}, want {w[idx].item():.5g}"
        )


def _check_out(out, ref_out, rows, dtype):
    """out vs the reference; rows that see no key (``rows`` False, (b, h_q, s_q)) exactly 0."""
    got = out.detach().float()
    n_nan = int(torch.isnan(got).sum())
    assert n_nan == 0, f"out: {n_nan} elements NaN (unwritten?)"
    diff = (got - _on_device(ref_out)).abs()
    limit = TOL[dtype][0] + 1e-2 * float(np.abs(ref_out).max())
    if diff.max().item() > limit:
        idx = tuple(int(i) for i in np.unravel_index(int(diff.argmax()), tuple(got.shape)))
        raise AssertionError(f"out: max err {diff.max().item():.3e} > {limit:.3e}, worst at {idx}")
    if (~rows).any():
        assert (got[~rows] == 0).all(), "out: rows that see no key must be 0"


def _check_lse(lse, ref_lse, rows):
    assert not torch.isnan(lse).any(), f"lse: {int(torch.isnan(lse).sum())} elements NaN (unwritten?)"
    if (~rows).any():
        assert torch.isneginf(lse[~rows]).all(), f"lse: rows that see no key must be -inf, got {lse[~rows][:4]}"
    err = (lse[rows] - _on_device(ref_lse)[rows]).abs()
    scale = max(1.0, float(np.abs(ref_lse[np.isfinite(ref_lse)]).max(initial=0.0)))
    assert err.numel() == 0 or err.max().item() <= 2e-3 * scale, f"lse: max err {err.max().item():.3e}"


def _check_grad_bias(grad_bias, ref_dbias, live, shape, dtype):
    """grad_bias vs the reference, and exactly 0 where no score summed into it takes part."""
    full = live.shape
    count = math.prod(full) // math.prod(shape)
    _check_grad("grad_bias", grad_bias, ref_dbias, dtype, count)
    untouched = torch.from_numpy(_sum_to_shape(live.astype(np.int64), shape) == 0).to(DEVICE)
    if untouched.any():
        vals = grad_bias.detach().float()[untouched]
        assert (vals == 0).all(), (
            f"grad_bias: {int((vals != 0).sum())} of {vals.numel()} elements whose "
            f"scores are all masked are not 0 (max |.| {vals.abs().max().item():.3e})"
        )


# -------------------------------------------------------------------------------------- one case


def run_case(
    *,
    layout="full",
    b=B,
    h_q=H_Q,
    h_kv=H_KV,
    s_q=S,
    s_kv=S,
    d=D,
    dtype=torch.bfloat16,
    scale=None,
    causal=False,
    alignment="top_left",
    window=None,
    softcap=None,
    seqlens=None,
    deterministic=False,
    backward=True,
    with_grad_bias=True,
    grad_layout="contiguous",
    record_refusals=False,
    layout_errors_ok=False,
    seed=0,
):
    """Forward (and backward) of one configuration against the reference; returns the tensors.

    ``record_refusals``: an UnsupportedError becomes an xfail with its message (a probe);
    ``layout_errors_ok``: so does a LayoutError. ``seqlens``: (seqlens_q, seqlens_kv) lists, either
    None for the full length.
    """
    gen = _generator(seed)
    q = _randn(gen, b, h_q, s_q, d, dtype=dtype)
    k = _randn(gen, b, h_kv, s_kv, d, dtype=dtype)
    v = _randn(gen, b, h_kv, s_kv, d, dtype=dtype)
    bias = make_bias(layout, gen, b=b, h_q=h_q, s_q=s_q, s_kv=s_kv, dtype=dtype)
    grad_out = _randn(gen, b, h_q, s_q, d, dtype=dtype)
    options = dict(scale=scale, causal=causal, causal_alignment=alignment, window=window, softcap=softcap)
    lengths, ref_lengths = {}, {}
    if seqlens is not None:
        for name, x in zip(("seqlens_q", "seqlens_kv"), seqlens):
            if x is not None:
                lengths[name] = torch.tensor(x, device=DEVICE, dtype=torch.int32)
                ref_lengths[name] = np.array(x)
    refusals = dict(record=record_refusals, layout_errors=layout_errors_ok)

    with _refusals("forward", layout, **refusals):
        out, lse = _forward(q, k, v, bias, **options, **lengths)

    full = (b, h_q, s_q, s_kv)
    np_q, np_k, np_v, np_bias = _np(q), _np(k), _np(v), _np(bias)
    ref_out, ref_lse = reference.sdpa_forward(
        np_q, np_k, np_v, dtype=np.float64, bias=np_bias, **options, **ref_lengths
    )
    seen = reference.visible_mask(
        s_q, s_kv, causal=causal, causal_alignment=alignment, window=window, b=b, **ref_lengths
    )  # (b, 1, s_q, s_kv)
    live = _live(seen, np_bias, full)
    rows = torch.from_numpy(live.any(axis=3).copy()).to(DEVICE)  # (b, h_q, s_q): the row sees a key
    _check_out(out, ref_out, rows, dtype)
    _check_lse(lse, ref_lse, rows)
    result = dict(q=q, k=k, v=v, bias=bias, out=out, lse=lse, grad_out=grad_out)
    if not backward:
        return result

    dq, dk, dv = (_poisoned(t.shape, dtype) for t in (q, k, v))
    grad_bias, grad_buffer = (
        _grad_bias_output(tuple(bias.shape), dtype, grad_layout) if with_grad_bias else (None, None)
    )
    with _refusals("backward", layout, **refusals):
        stridedfa.sdpa_backward(
            q,
            k,
            v,
            out,
            grad_out,
            lse,
            dq,
            dk,
            dv,
            bias=bias,
            grad_bias=grad_bias,
            deterministic=deterministic,
            **options,
            **lengths,
        )
        torch.cuda.synchronize()

    ref_dq, ref_dk, ref_dv, extra = reference.sdpa_backward(
        np_q, np_k, np_v, _np(grad_out), dtype=np.float64, bias=np_bias, **options, **ref_lengths, return_extra=True
    )
    for name, got, want in (("grad_q", dq, ref_dq), ("grad_k", dk, ref_dk), ("grad_v", dv, ref_dv)):
        _check_grad(name, got, want, dtype)
    if (~rows).any():
        assert (dq.float()[~rows] == 0).all(), "grad_q: rows that see no key must be 0"
    keys = torch.from_numpy(live.reshape(b, h_kv, h_q // h_kv, s_q, s_kv).any(axis=(2, 3)).copy()).to(DEVICE)
    if (~keys).any():  # (b, h_kv, s_kv): keys no row of the group sees (masked, padded or -inf bias)
        assert (dk.float()[~keys] == 0).all() and (dv.float()[~keys] == 0).all(), (
            "grad_k / grad_v: keys no row sees must get zero gradients"
        )
    if grad_bias is not None:
        _check_grad_bias(grad_bias, extra["dbias"], live, tuple(bias.shape), dtype)
        if grad_buffer is not None:
            spare = grad_buffer[..., bias.shape[-1] :]
            assert torch.isnan(spare).all(), (
                f"grad_bias: {int((~torch.isnan(spare)).sum())} elements outside the view were written"
            )
    result.update(grad_q=dq, grad_k=dk, grad_v=dv, grad_bias=grad_bias)
    return result


# ------------------------------------------------------------- cases run in a child process

# Cases whose bias reaches cuDNN not 16-byte aligned (a row or a pointer off 16 bytes, an axis of
# extent > 1 with a 2-byte stride, or a bias the core slices from an odd key). Whether cuDNN reads
# them right, refuses them, or faults is what they probe; a fault (a sticky CUDA error) would break
# every later test of the process, so they run in one child process (a new one after a case that
# broke its CUDA context), each reported under its own test id. key -> (function, its kwargs).
ISOLATED = {}

_CHILD = r"""
import importlib.util, json, sys, traceback
import pytest
sys.path.insert(0, sys.argv[2])
spec = importlib.util.spec_from_file_location("stridedfa_bias_isolated_cases", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
for key in json.loads(sys.argv[3]):
    function, kwargs = module.ISOLATED[key]
    try:
        getattr(module, function)(**kwargs)
        outcome = ["passed", ""]
    except pytest.xfail.Exception as error:
        outcome = ["xfailed", str(error)]
    except BaseException:
        outcome = ["failed", traceback.format_exc()]
    print(json.dumps([key, *outcome]), flush=True)
    if outcome[0] == "failed" and not module._cuda_healthy():
        sys.exit(3)  # the remaining cases run in a fresh process
"""


def _isolate(group, params, function, **kwargs):
    """Register the ``misaligned`` cases of a parameter list to run in the child process."""
    for param in params:
        case = param.values[0]
        if case.get("misaligned"):
            key = f"{group}[{param.id}]"
            ISOLATED[key] = (function, dict(case=case, seed=zlib.crc32(key.encode()) & 0x7FFFFFFF, **kwargs))


def _cuda_healthy():
    try:
        torch.cuda.synchronize()
        return torch.ones(1, device=DEVICE).add_(1).item() == 2
    except Exception:
        return False


@functools.cache
def _isolated_results():
    """{key: (outcome, detail)} of every ISOLATED case, run in child processes."""
    tests_dir = str(Path(__file__).resolve().parents[1])
    results, remaining = {}, list(ISOLATED)
    while remaining:
        command = [sys.executable, "-c", _CHILD, str(Path(__file__).resolve()), tests_dir, json.dumps(remaining)]
        try:
            child = subprocess.run(command, capture_output=True, text=True, timeout=300)
            stdout, returncode = child.stdout, child.returncode
            ending = f"exit status {returncode}; stderr:\n{child.stderr[-6000:]}"
        except subprocess.TimeoutExpired as timeout:
            stdout = timeout.stdout.decode() if isinstance(timeout.stdout, bytes) else (timeout.stdout or "")
            returncode, ending = None, "timed out after 300 s"
        for line in stdout.splitlines():
            if line.startswith("["):
                key, outcome, detail = json.loads(line)
                results[key] = (outcome, detail)
        before, remaining = len(remaining), [key for key in remaining if key not in results]
        # Exit status 3: the child stopped after a case that broke its CUDA context (reported).
        # Anything else with cases left, or no case reported: it died inside the first of them.
        if remaining and (returncode != 3 or len(remaining) == before):
            results[remaining.pop(0)] = ("failed", f"the child process ended inside this case ({ending})")
    return results


def _from_child(key):
    outcome, detail = _isolated_results()[key]
    if outcome == "xfailed":
        pytest.xfail(detail)
    if outcome != "passed":
        pytest.fail(f"{key} (run in a child process):\n{detail}", pytrace=False)


# -------------------------------------------------------------------------- the layout probe


def _probe_case(case, *, backward, seed):
    """A probe: refusals are recorded; a LayoutError too for the misaligned layouts."""
    case = dict(case)
    misaligned = case.pop("misaligned", False)
    run_case(**case, backward=backward, record_refusals=True, layout_errors_ok=misaligned, seed=seed)


PROBES = [
    pytest.param(dict(layout="full"), id="full-b_h_sq_skv"),
    pytest.param(dict(layout="heads"), id="heads-1_h_sq_skv"),
    pytest.param(dict(layout="batch"), id="batch-b_1_sq_skv"),
    pytest.param(dict(layout="shared"), id="shared-1_1_sq_skv"),
    pytest.param(dict(layout="keys"), id="keys-b_1_1_skv"),
    pytest.param(dict(layout="2d"), id="2d-sq_skv"),
    pytest.param(dict(layout="1d"), id="1d-skv"),
    pytest.param(dict(layout="expanded_keys"), id="expanded_stride0-from_b_1_1_skv"),
    pytest.param(dict(layout="expanded_shared"), id="expanded_stride0-from_sq_skv"),
    pytest.param(dict(layout="transposed"), id="transposed-memory_h_sq_b_skv"),
    pytest.param(dict(layout="row_slice"), id="row_slice-of_wider_rows"),
    pytest.param(dict(layout="per_query", misaligned=True), id="per_query-b_h_sq_1"),  # queries 2 bytes apart
    pytest.param(dict(layout="full", s_q=100, s_kv=100, misaligned=True), id="full-s100-rows_of_200_bytes"),
    pytest.param(dict(layout="misaligned_ptr", misaligned=True), id="pointer_2_bytes_off_16"),
]
_isolate("test_bias_layout_forward", PROBES, "_probe_case", backward=False)


@pytest.mark.parametrize("case", PROBES)
def test_bias_layout_forward(case, seed, request):
    """Probe: out and lse with this bias layout match the reference, or cuDNN's refusal is recorded
    (xfail with its message). GQA (h_q = 4, h_kv = 2), bf16, no mask."""
    if case.get("misaligned"):
        _from_child(f"test_bias_layout_forward[{request.node.callspec.id}]")
        return
    _probe_case(case, backward=False, seed=seed)


BACKWARD_PROBES = [
    *PROBES,
    pytest.param(dict(layout="full", grad_layout="row_slice"), id="full-grad_bias_a_row_slice_of_wider_rows"),
]
_isolate("test_bias_layout_backward", BACKWARD_PROBES, "_probe_case", backward=True)


@pytest.mark.parametrize("case", BACKWARD_PROBES)
def test_bias_layout_backward(case, seed, request):
    """Probe: dq, dk, dv and grad_bias (bias' own shape, summed over its shared axes, poisoned with
    NaN first) match the reference, or cuDNN's refusal is recorded."""
    if case.get("misaligned"):
        _from_child(f"test_bias_layout_backward[{request.node.callspec.id}]")
        return
    _probe_case(case, backward=True, seed=seed)


# ---------------------------------------------------------------------- the bias with the options


def _option_case(case, *, seed):
    case = dict(case)
    refusal_ok, misaligned = case.pop("refusal_ok", False), case.pop("misaligned", False)
    run_case(**case, record_refusals=refusal_ok, layout_errors_ok=misaligned, seed=seed)


OPTIONS = [
    pytest.param(dict(causal=True, dtype=torch.float16), id="causal_tl-fp16"),
    pytest.param(dict(causal=True, alignment="bottom_right", s_q=64, s_kv=192), id="causal_br-sq64_skv192"),
    pytest.param(
        # the rows cut off leave grad_bias a non-packed view, which cuDNN does not write: refused
        dict(causal=True, alignment="bottom_right", s_q=192, s_kv=64, refusal_ok=True),
        id="causal_br-sq192_skv64-rows_without_keys",
    ),
    pytest.param(dict(window=(16, 0)), id="window16_0"),
    pytest.param(dict(seqlens=([128, 77], [128, 77])), id="padding-77"),
    # A bottom-right diagonal per sequence (offset seqlens_kv[b] - seqlens_q[b] differs from s_kv - s_q).
    pytest.param(
        dict(seqlens=([20, 128], [120, 128]), causal=True, alignment="bottom_right", refusal_ok=True),
        id="padding-causal_br-per_sequence_offsets",
    ),
    # scale 3 makes the scores' spread ~24, so a cap of 30 bends them.
    # cuDNN's dbias under a score modifier is wrong (run 30): the gradient is refused, the forward runs
    pytest.param(dict(softcap=30.0, scale=3.0, causal=True, refusal_ok=True), id="softcap30-causal"),
    pytest.param(dict(softcap=30.0, scale=3.0, causal=True, with_grad_bias=False), id="softcap30-causal-no_dbias"),
    pytest.param(dict(causal=True, deterministic=True), id="deterministic-causal"),
    pytest.param(dict(with_grad_bias=False), id="grad_bias_omitted"),
    pytest.param(
        dict(layout="keys_padding_mask", dtype=torch.float16, refusal_ok=True),
        id="minus_inf_key_padding_mask-b_1_1_skv-fp16",
    ),
    pytest.param(dict(layout="full_random_mask", causal=True), id="minus_inf_random_mask-full-causal"),
    # Leading keys no row sees are cut off the problem: the core then gives cuDNN the bias from key
    # 221 on (a pointer 442 bytes in).
    pytest.param(
        dict(
            causal=True, alignment="bottom_right", window=(31, None), s_q=4, s_kv=256, refusal_ok=True, misaligned=True
        ),
        id="causal_br-window31-decode-leading_keys_cut",
    ),
]
_isolate("test_bias_with_masks_padding_and_softcap", OPTIONS, "_option_case")


@pytest.mark.parametrize("case", OPTIONS)
def test_bias_with_masks_padding_and_softcap(case, seed, request):
    """Bias with causal (both alignments, s_q < s_kv and s_q > s_kv), a window, padding lengths,
    softcap, the deterministic backward and -inf masking biases: out, lse, dq, dk, dv and grad_bias
    match the reference; rows without keys get out = 0, lse = -inf, zero gradients; grad_bias is 0
    where every score summed into it is masked. GQA (h_q = 4, h_kv = 2)."""
    if case.get("misaligned"):
        _from_child(f"test_bias_with_masks_padding_and_softcap[{request.node.callspec.id}]")
        return
    _option_case(case, seed=seed)


def _one_query_one_key_case(case, *, seed):
    case = dict(case)
    misaligned = case.pop("misaligned", False)
    r = run_case(s_q=1, s_kv=1, record_refusals=True, layout_errors_ok=misaligned, seed=seed, **case)
    assert (r["grad_bias"] == 0).all(), f"grad_bias must be exactly 0 with one key, got {r['grad_bias'].flatten()}"
    if case.get("h_kv") == H_Q:
        assert (r["grad_q"] == 0).all() and (r["grad_k"] == 0).all(), "grad_q, grad_k must be exactly 0"
        assert torch.equal(r["grad_v"], r["grad_out"]), "grad_v must be grad_out (one key, no groups)"


ONE_BY_ONE = [
    pytest.param(dict(layout="2d"), id="gqa-bias_1_1"),
    pytest.param(dict(layout="full", misaligned=True), id="gqa-bias_b_h_1_1"),  # heads 2 bytes apart
    pytest.param(dict(layout="full", h_kv=H_Q, misaligned=True), id="mha-bias_b_h_1_1"),
]
_isolate("test_one_query_one_key_backward_with_bias", ONE_BY_ONE, "_one_query_one_key_case")


@pytest.mark.parametrize("case", ONE_BY_ONE)
def test_one_query_one_key_backward_with_bias(case, seed, request):
    """s_q = s_kv = 1: the forward's lse carries the bias; the backward (which cuDNN cannot run; the
    core computes it) gives dq = dk = 0, dv = grad_out summed over each GQA group and grad_bias = 0
    exactly. Without GQA nothing reaches cuDNN: dq, dk are exact zeros and dv is grad_out's bits.
    Whether cuDNN takes a bias at s = 1 is probed (refusals recorded)."""
    if case.get("misaligned"):
        _from_child(f"test_one_query_one_key_backward_with_bias[{request.node.callspec.id}]")
        return
    _one_query_one_key_case(case, seed=seed)


@pytest.mark.parametrize("layout", ["expanded_keys", "expanded_shared", "keys"])
def test_shared_bias_equals_materialised_copy_bit_for_bit(layout, seed):
    """A bias given as a stride-0 view (or with extent-1 axes) and the same values materialised as a
    contiguous (b, h_q, s_q, s_kv) tensor give bit-identical out and lse: the layout changes where
    the bias is read, not what is computed."""
    gen = _generator(seed)
    dtype = torch.bfloat16
    q = _randn(gen, B, H_Q, S, D, dtype=dtype)
    k, v = (_randn(gen, B, H_KV, S, D, dtype=dtype) for _ in range(2))
    bias = make_bias(layout, gen, b=B, h_q=H_Q, s_q=S, s_kv=S, dtype=dtype)
    dense = bias.expand(B, H_Q, S, S).contiguous()
    with _refusals("forward", layout, record=True):
        shared_out, shared_lse = _forward(q, k, v, bias)
    dense_out, dense_lse = _forward(q, k, v, dense)
    assert torch.equal(shared_out, dense_out), (
        f"out: {int((shared_out != dense_out).sum())} elements differ between the shared and the dense bias"
    )
    assert torch.equal(shared_lse, dense_lse), "lse differs between the shared and the dense bias"


# --------------------------------------------------------------------------- refused before a launch

BAD_BIAS = [
    pytest.param(lambda gen, dt: _randn(gen, B, H_Q, S, 2 * S, dtype=dt)[..., ::2], id="key_axis_stride_2"),
    pytest.param(lambda gen, dt: _randn(gen, B, H_Q, S, S, dtype=torch.float32), id="float32"),
    pytest.param(lambda gen, dt: _randn(gen, B, H_Q, S, S + 1, dtype=dt), id="key_extent_mismatch"),
    pytest.param(lambda gen, dt: _randn(gen, B, 3, S, S, dtype=dt), id="heads_neither_h_q_nor_1"),
    pytest.param(lambda gen, dt: _randn(gen, 1, B, H_Q, S, S, dtype=dt), id="five_axes"),
]


@pytest.mark.parametrize("make", BAD_BIAS)
def test_invalid_bias_raises_layout_error_and_writes_nothing(make, seed):
    """A bias the rules refuse (key axis not contiguous, wrong dtype or shape, more than 4 axes)
    raises LayoutError naming the bias, forward and backward, and no output is written."""
    gen = _generator(seed)
    dtype = torch.bfloat16
    q = _randn(gen, B, H_Q, S, D, dtype=dtype)
    k, v = (_randn(gen, B, H_KV, S, D, dtype=dtype) for _ in range(2))
    bias = make(gen, dtype)
    out, lse = _poisoned(q.shape, dtype), _poisoned(q.shape[:3], torch.float32)
    with pytest.raises(stridedfa.LayoutError, match="bias"):
        stridedfa.sdpa_forward(q, k, v, out, lse=lse, bias=bias)
    torch.cuda.synchronize()
    assert torch.isnan(out).all() and torch.isnan(lse).all(), "a refused forward wrote its outputs"
    out, lse, grad_out = q.clone(), torch.zeros(q.shape[:3], device=DEVICE), q.clone()  # never read
    grads = [_poisoned(t.shape, dtype) for t in (q, k, v)]
    with pytest.raises(stridedfa.LayoutError, match="bias"):
        stridedfa.sdpa_backward(q, k, v, out, grad_out, lse, *grads, bias=bias)
    torch.cuda.synchronize()
    assert all(torch.isnan(g).all() for g in grads), "a refused backward wrote its gradients"


BAD_GRAD_BIAS = [
    pytest.param(
        "full", lambda: _poisoned((B, 1, 1, S), torch.bfloat16).expand(B, H_Q, S, S), id="stride0_expanded_output"
    ),
    pytest.param("keys", lambda: _poisoned((B, H_Q, S, S), torch.bfloat16), id="full_shape_for_a_b_1_1_skv_bias"),
    pytest.param("full", lambda: _poisoned((B, H_Q, S, S), torch.float32), id="float32"),
    pytest.param(None, lambda: _poisoned((B, H_Q, S, S), torch.bfloat16), id="without_bias"),
]


@pytest.mark.parametrize("layout, make", BAD_GRAD_BIAS)
def test_invalid_grad_bias_raises_layout_error_and_writes_nothing(layout, make, seed):
    """grad_bias must have exactly bias' shape, the attention dtype and its own memory (no stride
    0), and needs the bias: otherwise LayoutError naming grad_bias, and no gradient is written."""
    gen = _generator(seed)
    dtype = torch.bfloat16
    q = _randn(gen, B, H_Q, S, D, dtype=dtype)
    k, v = (_randn(gen, B, H_KV, S, D, dtype=dtype) for _ in range(2))
    bias = None if layout is None else make_bias(layout, gen, b=B, h_q=H_Q, s_q=S, s_kv=S, dtype=dtype)
    out, lse, grad_out = q.clone(), torch.zeros(q.shape[:3], device=DEVICE), q.clone()  # never read
    grads = [_poisoned(t.shape, dtype) for t in (q, k, v)]
    grad_bias = make()
    with pytest.raises(stridedfa.LayoutError, match="grad_bias"):
        stridedfa.sdpa_backward(q, k, v, out, grad_out, lse, *grads, bias=bias, grad_bias=grad_bias)
    torch.cuda.synchronize()
    assert all(torch.isnan(g).all() for g in grads), "a refused backward wrote its gradients"
    assert torch.isnan(grad_bias).all(), "a refused backward wrote grad_bias"


# ---------------------------------------------------------------------------------- torch adapter


def _torch_inputs(layout, seed, *, qkv_grad=True, bias_grad=True, dtype=torch.bfloat16):
    """q, k, v, the bias leaf ((b, h_q, s, s) for "full", else a (b, 1, s, s) mask) and grad_out."""
    gen = _generator(seed)
    q = _randn(gen, B, H_Q, S, D, dtype=dtype).requires_grad_(qkv_grad)
    k, v = (_randn(gen, B, H_KV, S, D, dtype=dtype).requires_grad_(qkv_grad) for _ in range(2))
    leaf_shape = (B, H_Q, S, S) if layout == "full" else (B, 1, S, S)
    leaf = _randn(gen, *leaf_shape, dtype=dtype).requires_grad_(bias_grad)
    grad_out = _randn(gen, B, H_Q, S, D, dtype=dtype)
    return q, k, v, leaf, grad_out


def _bias_from_leaf(layout, leaf):
    """The bias the adapter gets: the leaf, or (keys_expanded) a stride-0 view of it whose gradient
    torch sums back to the leaf's shape."""
    return leaf.expand(B, H_Q, S, S) if layout == "keys_expanded" else leaf


TORCH_CASES = [
    pytest.param(dict(layout="full"), id="full_leaf"),
    pytest.param(dict(layout="full", causal=True), id="full_leaf-causal"),
    pytest.param(dict(layout="keys"), id="b_1_s_s_leaf"),
    pytest.param(dict(layout="keys_expanded"), id="b_1_s_s_leaf-expanded_in_the_loss"),
    pytest.param(dict(layout="full", qkv_grad=False), id="full_leaf-only_the_bias_requires_grad"),
    pytest.param(dict(layout="full", bias_grad=False), id="full-bias_not_requiring_grad"),
]


@pytest.mark.parametrize("case", TORCH_CASES)
def test_torch_attention_bias_autograd_matches_reference(case, seed):
    """stridedfa.torch.attention(q, k, v, bias=...) then .backward(): out, q.grad, k.grad, v.grad
    and bias.grad (the leaf's shape, also through torch's expand) match the reference; a tensor
    that does not require grad gets no .grad."""
    import stridedfa.torch as sfa_torch

    layout, causal = case["layout"], case.get("causal", False)
    qkv_grad, bias_grad = case.get("qkv_grad", True), case.get("bias_grad", True)
    q, k, v, leaf, grad_out = _torch_inputs(layout, seed, qkv_grad=qkv_grad, bias_grad=bias_grad)
    with _refusals("torch attention", layout, record=layout != "full"):
        out = sfa_torch.attention(q, k, v, bias=_bias_from_leaf(layout, leaf), causal=causal)
        out.backward(grad_out)
        torch.cuda.synchronize()

    dtype = q.dtype
    np_q, np_k, np_v, np_bias = _np(q), _np(k), _np(v), _np(leaf)
    options = dict(causal=causal, dtype=np.float64, bias=np_bias)
    ref_out, _ = reference.sdpa_forward(np_q, np_k, np_v, **options)
    ref_dq, ref_dk, ref_dv, extra = reference.sdpa_backward(
        np_q, np_k, np_v, _np(grad_out), **options, return_extra=True
    )
    full = (B, H_Q, S, S)
    live = _live(reference.visible_mask(S, S, causal=causal, b=B), np_bias, full)
    _check_out(out, ref_out, torch.from_numpy(live.any(axis=3).copy()).to(DEVICE), dtype)
    for name, t, want in (("q.grad", q, ref_dq), ("k.grad", k, ref_dk), ("v.grad", v, ref_dv)):
        if qkv_grad:
            _check_grad(name, t.grad, want, dtype)
        else:
            assert t.grad is None, f"{name}: q, k, v do not require grad"
    if bias_grad:
        assert leaf.grad is not None and leaf.grad.shape == leaf.shape, (
            f"bias.grad: {None if leaf.grad is None else tuple(leaf.grad.shape)}, expected {tuple(leaf.shape)}"
        )
        _check_grad_bias(leaf.grad, extra["dbias"], live, tuple(leaf.shape), dtype)
    else:
        assert leaf.grad is None, "bias.grad: the bias does not require grad"


def test_torch_attention_bias_compiled_fullgraph_equals_eager(seed):
    """torch.compile(fullgraph=True) of attention with a (b, 1, 1, s) bias leaf expanded inside the
    function: out equals eager bit for bit; q, k, v and bias gradients agree with eager to float
    rounding (cuDNN's dK/dV accumulation order and torch's sum of the expanded bias' gradient may
    differ from run to run)."""
    import stridedfa.torch as sfa_torch

    torch._dynamo.reset()
    q, k, v, leaf, grad_out = _torch_inputs("keys_expanded", seed)
    leaves = (q, k, v, leaf)

    def step(q, k, v, leaf):
        return sfa_torch.attention(q, k, v, bias=leaf.expand(B, H_Q, S, S))

    def train(fn):
        for t in leaves:
            t.grad = None
        out = fn(*leaves)
        out.backward(grad_out)
        torch.cuda.synchronize()
        return out.detach().clone(), [t.grad.clone() for t in leaves]

    with _refusals("torch attention", "keys_expanded", record=True):
        eager_out, eager_grads = train(step)
    compiled_out, compiled_grads = train(torch.compile(step, fullgraph=True))
    assert torch.equal(compiled_out, eager_out), (
        f"out: {int((compiled_out != eager_out).sum())} elements differ between compiled and eager"
    )
    for name, got, want in zip(("q.grad", "k.grad", "v.grad", "bias.grad"), compiled_grads, eager_grads):
        assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != eager {tuple(want.shape)}"
        err = (got.float() - want.float()).abs().max().item()
        limit = 1e-2 * want.float().abs().max().item() + 1e-6
        assert err <= limit, f"{name}: compiled differs from eager by {err:.3e} (> {limit:.3e})"


def test_a_bias_cut_to_one_row_and_key_is_refused_with_lse(seed):
    """GPU run 31's fuzz failure, isolated by run 32's diagnostic: s_kv = 1, causal bottom-right with
    s_q = 33 (only the last row sees the key, so the core describes one row and one key) and a (1, h,
    33, 1) bias: cuDNN 9.19 put a wrong value into lse (2.4 off) for the non-packed slice of the bias.
    Refused with lse, before anything is written; without lse the output (the key's value) is right."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(2, 6, 33, 128, generator=gen, device="cuda").bfloat16()
    k, v = (torch.randn(2, 6, 1, 128, generator=gen, device="cuda").bfloat16() for _ in range(2))
    bias = torch.randn(1, 6, 33, 1, generator=gen, device="cuda").bfloat16()
    out = torch.full_like(q, float("nan"))
    lse = torch.full((2, 6, 33), float("nan"), device="cuda")
    options = dict(causal=True, causal_alignment="bottom_right", bias=bias)
    with pytest.raises(stridedfa.UnsupportedError, match="s_q = s_kv = 1 .*packed"):
        stridedfa.sdpa_forward(q, k, v, out, lse=lse, **options)
    assert torch.isnan(out).all() and torch.isnan(lse).all(), "a refusal writes nothing"
    stridedfa.sdpa_forward(q, k, v, out, **options)
    assert (out[:, :, :32] == 0).all(), "rows that see no key are 0"
    assert torch.equal(out[:, :, 32], v[:, :, 0]), "the one row that sees the one key gets its value"
