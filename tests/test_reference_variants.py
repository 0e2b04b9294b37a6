"""CPU tests of the attention variants of stridedfa.reference (window, padding,
empty rows, softcap, sinks, bias, ALiBi, dropout) against an independent
row-by-row float64 oracle and central finite differences of it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stridedfa import reference

fwd = reference.sdpa_forward
bwd = reference.sdpa_backward
F64 = dict(dtype=np.float64)


# ----------------------------------------------------------------- oracles
def sees(i, j, *, len_q, len_kv, causal=False, align="top_left",
         window=None):
    """The visibility rule, restated: does query row i see key j?"""
    if i >= len_q or j >= len_kv:
        return False
    off = len_kv - len_q if align == "bottom_right" else 0
    left, right = window if window is not None else (None, None)
    if causal:
        right = 0 if right is None else min(right, 0)
    if left is not None and j < i + off - left:
        return False
    return right is None or j <= i + off + right


def naive(q, k, v, *, scale=None, causal=False, align="top_left", window=None,
          seqlens_q=None, seqlens_kv=None, softcap=None, sinks=None,
          bias=None, alibi=None, keep_mask=None, dropout_p=0.0):
    """(out, lse) with plain loops over (batch, head, row, key)."""
    q, k, v = (np.array(x, dtype=np.float64) for x in (q, k, v))
    b, h_q, s_q, d_qk = q.shape
    h_kv, s_kv, d_v = k.shape[1], k.shape[2], v.shape[3]
    scale = 1.0 / math.sqrt(d_qk) if scale is None else scale
    full = (b, h_q, s_q, s_kv)
    bias = None if bias is None else np.broadcast_to(bias, full)
    keep = None if keep_mask is None else np.broadcast_to(keep_mask, full)
    out = np.zeros((b, h_q, s_q, d_v))
    lse = np.full((b, h_q, s_q), -np.inf)
    for bi in range(b):
        lq = s_q if seqlens_q is None else int(seqlens_q[bi])
        lkv = s_kv if seqlens_kv is None else int(seqlens_kv[bi])
        for h in range(h_q):
            kh = h // (h_q // h_kv)
            for i in range(lq):
                keys = [j for j in range(s_kv)
                        if sees(i, j, len_q=lq, len_kv=lkv, causal=causal,
                                align=align, window=window)]
                logits = []
                for j in keys:
                    x = scale * float(np.dot(q[bi, h, i], k[bi, kh, j]))
                    if softcap is not None:
                        x = softcap * math.tanh(x / softcap)
                    if bias is not None:
                        x += bias[bi, h, i, j]
                    if alibi is not None:
                        off = lkv - lq if align == "bottom_right" else 0
                        x -= alibi[h] * abs(i + off - j)
                    logits.append(x)
                extra = [] if sinks is None else [float(sinks[h])]
                if not logits + extra:
                    continue
                m = max(logits + extra)
                w = [math.exp(x - m) for x in logits]
                tot = math.fsum(w + [math.exp(x - m) for x in extra])
                lse[bi, h, i] = m + math.log(tot)
                for wj, j in zip(w, keys):
                    kj = 1.0 if keep is None else keep[bi, h, i, j] / (
                        1 - dropout_p)
                    out[bi, h, i] += (wj / tot) * kj * v[bi, kh, j]
    return out, lse


def numgrad(loss, x, eps=1e-6):
    """Central differences of loss() with respect to array x (in place)."""
    d = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        x0 = x[idx]
        x[idx] = x0 + eps
        up = loss()
        x[idx] = x0 - eps
        down = loss()
        x[idx] = x0
        d[idx] = (up - down) / (2 * eps)
    return d


def problem(seed, b=2, h_q=2, h_kv=1, s_q=4, s_kv=5, d_qk=3, d_v=2):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((b, h_q, s_q, d_qk)),
            rng.standard_normal((b, h_kv, s_kv, d_qk)),
            rng.standard_normal((b, h_kv, s_kv, d_v)),
            rng.standard_normal((b, h_q, s_q, d_v)))


def ref_kw(kw):
    """The oracle's keywords for the reference's keywords."""
    kw = dict(kw)
    kw["align"] = kw.pop("causal_alignment", "top_left")
    kw["alibi"] = kw.pop("alibi_slopes", None)
    kw["keep_mask"] = kw.pop("dropout_mask", None)
    return kw


def check_grads(q, k, v, g, rtol=1e-5, atol=1e-7, **kw):
    """Reference backward (and extras) against finite differences."""
    with np.errstate(divide="raise", invalid="raise"):
        dq, dk, dv, extra = bwd(q, k, v, g, return_extra=True, **kw, **F64)
    want_keys = {n for n, key in (("dsinks", "sinks"), ("dbias", "bias"))
                 if kw.get(key) is not None}
    assert set(extra) == want_keys
    nkw = ref_kw(kw)
    args = dict(q=q.copy(), k=k.copy(), v=v.copy())
    for name in ("sinks", "bias"):
        if kw.get(name) is not None:
            args[name] = np.array(kw[name], dtype=np.float64)

    def loss():
        opts = {**nkw, **{n: args[n] for n in ("sinks", "bias") if n in args}}
        return float(np.sum(naive(args["q"], args["k"], args["v"],
                                  **opts)[0] * g))

    got = dict(q=dq, k=dk, v=dv, **{n[1:]: a for n, a in extra.items()})
    for name, a in got.items():
        assert a.shape == np.shape(args[name]), name
        assert a.dtype == np.float64 and np.isfinite(a).all(), name
        np.testing.assert_allclose(a, numgrad(loss, args[name]), rtol=rtol,
                                   atol=atol, err_msg=f"d{name}")
    return got


def check_forward(q, k, v, **kw):
    with np.errstate(divide="raise", invalid="raise"):
        out, lse = fwd(q, k, v, **kw, **F64)
    want_out, want_lse = naive(q, k, v, **ref_kw(kw))
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
    fin = np.isfinite(want_lse)
    np.testing.assert_allclose(lse[fin], want_lse[fin], rtol=1e-12,
                               atol=1e-12)
    return out, lse


# --------------------------------------------------------- visibility mask
MASK_CASES = [
    # (s_q, s_kv, causal, align, window)
    (4, 7, False, "top_left", (1, 1)),
    (4, 7, False, "bottom_right", (1, 1)),
    (4, 7, False, "bottom_right", (0, 0)),
    (4, 7, True, "top_left", (2, None)),
    (4, 7, True, "bottom_right", (2, None)),
    (4, 7, True, "bottom_right", (2, 3)),       # causal wins: right = 0
    (7, 4, True, "bottom_right", None),         # first 3 rows empty
    (7, 4, True, "bottom_right", (1, None)),
    (7, 4, False, "bottom_right", (None, 0)),
    (7, 4, False, "top_left", (None, 1)),
    (7, 4, False, "top_left", (1, None)),
    (7, 4, False, "bottom_right", (0, 2)),
    (5, 5, True, "top_left", (0, None)),        # the diagonal only
    (3, 8, False, "top_left", (0, 0)),
    (6, 6, False, "top_left", None),
]


@pytest.mark.parametrize("s_q,s_kv,causal,align,window", MASK_CASES)
def test_visible_mask_matches_definition(s_q, s_kv, causal, align, window):
    got = reference.visible_mask(s_q, s_kv, causal=causal,
                                 causal_alignment=align, window=window)
    assert got.shape == (1, 1, s_q, s_kv) and got.dtype == np.bool_
    for i in range(s_q):
        for j in range(s_kv):
            assert got[0, 0, i, j] == sees(i, j, len_q=s_q, len_kv=s_kv,
                                           causal=causal, align=align,
                                           window=window), (i, j)


def test_visible_mask_by_hand():
    # Spelled out, not derived: bottom_right offset 2, window (1, 0).
    got = reference.visible_mask(3, 5, causal_alignment="bottom_right",
                                 window=(1, 0))[0, 0]
    want = np.array([[0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]])
    np.testing.assert_array_equal(got, want.astype(bool))
    # s_q > s_kv bottom_right causal: offset -2, rows 0 and 1 see nothing.
    got = reference.visible_mask(4, 2, causal=True,
                                 causal_alignment="bottom_right")[0, 0]
    want = np.array([[0, 0], [0, 0], [1, 0], [1, 1]])
    np.testing.assert_array_equal(got, want.astype(bool))


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("causal,window", [(False, None), (True, None),
                                           (True, (1, None)),
                                           (False, (2, 1))])
def test_visible_mask_with_padding(align, causal, window):
    s_q, s_kv = 5, 6
    lq, lkv = np.array([5, 3, 0, 4]), np.array([2, 6, 4, 0])
    got = reference.visible_mask(s_q, s_kv, causal=causal,
                                 causal_alignment=align, window=window,
                                 seqlens_q=lq, seqlens_kv=lkv, b=4)
    assert got.shape == (4, 1, s_q, s_kv)
    for bi in range(4):
        for i in range(s_q):
            for j in range(s_kv):
                assert got[bi, 0, i, j] == sees(
                    i, j, len_q=lq[bi], len_kv=lkv[bi], causal=causal,
                    align=align, window=window), (bi, i, j)
    # Only one length given: the other is the full extent.
    only_q = reference.visible_mask(s_q, s_kv, causal=True,
                                    causal_alignment="bottom_right",
                                    seqlens_q=lq, b=4)
    for bi in range(4):
        assert only_q[bi, 0, 0, :].sum() == (
            min(s_kv, s_kv - lq[bi] + 1) if lq[bi] else 0)


# ----------------------------------------------------------------- windows
@pytest.mark.parametrize("s_q,s_kv,causal,align,window", MASK_CASES)
def test_window_forward_matches_naive(s_q, s_kv, causal, align, window):
    q, k, v, _ = problem(1, h_q=4, h_kv=2, s_q=s_q, s_kv=s_kv)
    out, _ = check_forward(q, k, v, causal=causal, causal_alignment=align,
                           window=window)
    # One-hot values: out is P itself; zero exactly where nothing is seen.
    onehot = np.broadcast_to(np.eye(s_kv), (2, 2, s_kv, s_kv))
    p, _ = fwd(q, k, onehot, causal=causal, causal_alignment=align,
               window=window, **F64)
    seen = reference.visible_mask(s_q, s_kv, causal=causal,
                                  causal_alignment=align, window=window)
    seen = np.broadcast_to(seen, p.shape)
    assert np.all(p[~seen] == 0) and np.all(p[seen] > 0)
    rows = seen.any(-1)
    np.testing.assert_allclose(p.sum(-1)[rows], 1, rtol=1e-14)
    assert np.all(out[~rows] == 0)


def test_window_defaults_and_equivalences():
    q, k, v, g = problem(2, s_q=5, s_kv=5)
    base = fwd(q, k, v, **F64)
    for same in (dict(window=(None, None)), dict(window=(9, 9)),
                 dict(window=(None, 4), causal_alignment="bottom_right")):
        for a, e in zip(fwd(q, k, v, **same, **F64), base):
            np.testing.assert_array_equal(a, e)
    causal = fwd(q, k, v, causal=True, **F64)
    for same in (dict(window=(None, 0)), dict(window=(4, 0)),
                 dict(causal=True, window=(None, 3))):
        for a, e in zip(fwd(q, k, v, **same, **F64), causal):
            np.testing.assert_array_equal(a, e)
    explicit = dict(window=None, seqlens_q=None, seqlens_kv=None,
                    softcap=None, sinks=None, bias=None, alibi_slopes=None,
                    dropout_mask=None, dropout_p=0.0)
    for a, e in zip(bwd(q, k, v, g, causal=True, **explicit, **F64),
                    bwd(q, k, v, g, causal=True, **F64)):
        np.testing.assert_array_equal(a, e)


@pytest.mark.parametrize("causal,align,window,h_q,h_kv,s_q,s_kv", [
    (False, "top_left", (1, 1), 2, 1, 4, 5),
    (False, "bottom_right", (0, 1), 2, 2, 4, 5),
    (True, "bottom_right", (1, None), 4, 2, 3, 5),
    (True, "top_left", (1, None), 2, 1, 5, 3),
])
def test_window_backward_matches_finite_differences(causal, align, window,
                                                    h_q, h_kv, s_q, s_kv):
    q, k, v, g = problem(3, b=1, h_q=h_q, h_kv=h_kv, s_q=s_q, s_kv=s_kv)
    check_grads(q, k, v, g, causal=causal, causal_alignment=align,
                window=window)


# -------------------------------------------------------------- empty rows
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bottom_right_long_query_rows_are_empty(dtype):
    s_q, s_kv = 7, 3
    q, k, v, g = problem(4, h_q=4, h_kv=2, s_q=s_q, s_kv=s_kv)
    kw = dict(causal=True, causal_alignment="bottom_right", dtype=dtype)
    with np.errstate(divide="raise", invalid="raise"):
        out, lse = fwd(q, k, v, **kw)
        dq, dk, dv = bwd(q, k, v, g, **kw)
    empty = s_q - s_kv
    assert np.all(out[:, :, :empty] == 0) and np.all(dq[:, :, :empty] == 0)
    assert np.all(lse[:, :, :empty] == -np.inf)
    assert np.isfinite(lse[:, :, empty:]).all()
    for a in (out, dq, dk, dv):
        assert np.isfinite(a).all()
    # The remaining rows are the equal-length problem, and the empty rows
    # add nothing to dk / dv (changing their q or dO changes nothing).
    want_out, want_lse = naive(q[:, :, empty:], k, v, causal=True)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else {}
    np.testing.assert_allclose(out[:, :, empty:], want_out, **tol)
    np.testing.assert_allclose(lse[:, :, empty:], want_lse, **tol)
    q2, g2 = q.copy(), g.copy()
    q2[:, :, :empty] *= -3
    g2[:, :, :empty] = 7
    _, dk2, dv2 = bwd(q2, k, v, g2, **kw)
    np.testing.assert_array_equal(dk2, dk)
    np.testing.assert_array_equal(dv2, dv)


def test_empty_rows_finite_differences():
    q, k, v, g = problem(5, b=1, h_q=2, h_kv=1, s_q=5, s_kv=2)
    got = check_grads(q, k, v, g, causal=True,
                      causal_alignment="bottom_right")
    assert np.all(got["q"][:, :, :3] == 0)


def test_window_can_empty_rows():
    # window (0, 0) bottom_right with s_q > s_kv: row i sees key i - 2 only.
    q, k, v, _ = problem(6, s_q=5, s_kv=3)
    out, lse = check_forward(q, k, v, causal_alignment="bottom_right",
                             window=(0, 0))
    assert np.all(lse[:, :, :2] == -np.inf) and np.all(out[:, :, :2] == 0)


# ----------------------------------------------------------------- padding
LQ, LKV = np.array([3, 5, 0]), np.array([6, 2, 4])


@pytest.mark.parametrize("causal,align,window", [
    (False, "top_left", None), (True, "top_left", None),
    (True, "bottom_right", None), (False, "bottom_right", (1, 1)),
    (True, "bottom_right", (2, None)),
])
def test_padding_forward(causal, align, window):
    q, k, v, _ = problem(7, b=3, h_q=4, h_kv=2, s_q=5, s_kv=6)
    kw = dict(causal=causal, causal_alignment=align, window=window)
    out, lse = check_forward(q, k, v, seqlens_q=LQ, seqlens_kv=LKV, **kw)
    for bi in range(3):
        lq, lkv = LQ[bi], LKV[bi]
        assert np.all(out[bi, :, lq:] == 0)
        assert np.all(lse[bi, :, lq:] == -np.inf)
        if lq == 0:
            continue
        # Each batch is its own unpadded problem (per-batch offset).
        want_out, want_lse = naive(q[bi:bi + 1, :, :lq],
                                   k[bi:bi + 1, :, :lkv],
                                   v[bi:bi + 1, :, :lkv], causal=causal,
                                   align=align, window=window)
        np.testing.assert_allclose(out[bi:bi + 1, :, :lq], want_out,
                                   rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(lse[bi:bi + 1, :, :lq], want_lse,
                                   rtol=1e-12)  # equal -inf positions too


def test_padding_content_is_ignored_and_gets_zero_grads():
    q, k, v, g = problem(8, b=3, h_q=2, h_kv=1, s_q=5, s_kv=6)
    kw = dict(seqlens_q=LQ, seqlens_kv=LKV, causal=True,
              causal_alignment="bottom_right", **F64)
    out, lse = fwd(q, k, v, **kw)
    dq, dk, dv = bwd(q, k, v, g, **kw)
    q2, k2, v2, g2 = (x.copy() for x in (q, k, v, g))
    for bi in range(3):
        q2[bi, :, LQ[bi]:] = 1e3
        g2[bi, :, LQ[bi]:] = -5
        k2[bi, :, LKV[bi]:] = -1e3
        v2[bi, :, LKV[bi]:] = 1e3
        assert np.all(dq[bi, :, LQ[bi]:] == 0)
        assert np.all(dk[bi, :, LKV[bi]:] == 0)
        assert np.all(dv[bi, :, LKV[bi]:] == 0)
    for a, e in zip(fwd(q2, k2, v2, **kw) + bwd(q2, k2, v2, g2, **kw),
                    (out, lse, dq, dk, dv)):
        np.testing.assert_array_equal(a, e)


def test_padding_finite_differences():
    q, k, v, g = problem(9, b=3, h_q=2, h_kv=1, s_q=4, s_kv=4)
    check_grads(q, k, v, g, seqlens_q=np.array([4, 2, 3]),
                seqlens_kv=np.array([1, 4, 0]), causal=True,
                causal_alignment="bottom_right")


# ----------------------------------------------------------------- softcap
def test_softcap_forward_direct_formula():
    q, k, v, _ = problem(10, b=1, h_q=2, h_kv=2, s_q=3, s_kv=4, d_qk=4)
    q, k = 4 * q, 4 * k  # large scores, so the cap matters
    c, scale = 1.5, 0.7
    s = c * np.tanh(scale * q @ k.swapaxes(-1, -2) / c)
    s = np.where(np.tril(np.ones((3, 4), bool)), s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    want = (e / e.sum(-1, keepdims=True)) @ v
    out, lse = fwd(q, k, v, softcap=c, scale=scale, causal=True, **F64)
    np.testing.assert_allclose(out, want, rtol=1e-12)
    np.testing.assert_allclose(lse, np.log(np.exp(s).sum(-1)), rtol=1e-12)
    plain, _ = fwd(q, k, v, scale=scale, causal=True, **F64)
    assert not np.allclose(out, plain, atol=1e-3)
    check_forward(q, k, v, softcap=c, scale=scale, causal=True)


def test_softcap_backward_finite_differences():
    q, k, v, g = problem(11, b=1, h_q=4, h_kv=2, s_q=3, s_kv=4)
    check_grads(2 * q, 2 * k, v, g, softcap=0.8, scale=1.3)


# ------------------------------------------------------------------- sinks
def test_sinks_forward_direct_formula():
    q, k, v, _ = problem(12, b=2, h_q=2, h_kv=1, s_q=3, s_kv=4)
    sinks = np.array([0.5, -1.0])
    s = (q @ k.swapaxes(-1, -2)) / math.sqrt(3)
    z = np.exp(sinks)[None, :, None] + np.exp(s).sum(-1)
    out, lse = fwd(q, k, v, sinks=sinks, **F64)
    np.testing.assert_allclose(out, (np.exp(s) / z[..., None]) @ v,
                               rtol=1e-12)
    np.testing.assert_allclose(lse, np.log(z), rtol=1e-12)
    check_forward(q, k, v, sinks=sinks, causal=True)


def test_sinks_empty_and_padded_rows():
    q, k, v, _ = problem(13, b=2, h_q=2, h_kv=1, s_q=5, s_kv=2)
    sinks = np.array([0.25, -2.0])
    kw = dict(sinks=sinks, causal=True, causal_alignment="bottom_right",
              seqlens_q=np.array([5, 4]))
    out, lse = check_forward(q, k, v, **kw)
    # Batch 0: offset -3, rows 0..2 see no key -> out 0, lse = sink.
    assert np.all(out[0, :, :3] == 0)
    np.testing.assert_array_equal(lse[0, :, :3], np.repeat(sinks[:, None],
                                                           3, axis=1))
    # Batch 1: row 4 is padding -> lse -inf even with a sink.
    assert np.all(lse[1, :, 4] == -np.inf) and np.all(out[1, :, 4] == 0)


@pytest.mark.parametrize("kw", [
    dict(),
    dict(causal=True, causal_alignment="bottom_right"),    # empty rows
    dict(window=(1, 0), seqlens_q=np.array([3, 2]),
         seqlens_kv=np.array([3, 1])),
])
def test_dsinks_finite_differences(kw):
    q, k, v, g = problem(14, b=2, h_q=4, h_kv=2, s_q=4, s_kv=3)
    got = check_grads(q, k, v, g, sinks=np.array([0.3, -0.7, 1.1, 0.0]),
                      **kw)
    assert np.all(got["sinks"] != 0)


# -------------------------------------------------------------------- bias
@pytest.mark.parametrize("shape", [(2, 2, 3, 4), (1, 2, 3, 4), (2, 1, 1, 4),
                                   (3, 4), (1, 1, 1, 1), (2, 2, 1, 1)])
def test_bias_forward_and_dbias(shape):
    q, k, v, g = problem(15, b=2, h_q=2, h_kv=1, s_q=3, s_kv=4)
    bias = np.random.default_rng(16).standard_normal(shape)
    check_forward(q, k, v, bias=bias, causal=True)
    got = check_grads(q, k, v, g, bias=bias, causal=True, softcap=2.0)
    assert got["bias"].shape == shape


def test_bias_direct_formula_and_minus_inf():
    q, k, v, _ = problem(17, b=1, h_q=2, h_kv=2, s_q=3, s_kv=4)
    bias = np.random.default_rng(18).standard_normal((1, 2, 3, 4))
    s = (q @ k.swapaxes(-1, -2)) * 0.5 + bias
    p = np.exp(s) / np.exp(s).sum(-1, keepdims=True)
    out, lse = fwd(q, k, v, bias=bias, scale=0.5, **F64)
    np.testing.assert_allclose(out, p @ v, rtol=1e-12)
    np.testing.assert_allclose(lse, np.log(np.exp(s).sum(-1)), rtol=1e-12)
    # A -inf bias is an additive mask; a whole -inf row is an empty row.
    bias[0, 0, 1] = -np.inf
    bias[0, 1, 2, :2] = -np.inf
    with np.errstate(divide="raise", invalid="raise"):
        out, lse = fwd(q, k, v, bias=bias, **F64)
        dq, dk, dv, extra = bwd(q, k, v, np.ones_like(out), bias=bias,
                                return_extra=True, **F64)
    assert np.all(out[0, 0, 1] == 0) and lse[0, 0, 1] == -np.inf
    assert np.all(dq[0, 0, 1] == 0) and np.all(extra["dbias"][0, 0, 1] == 0)
    s_row = q[0, 1, 2] @ k[0, 1, 2:].T / math.sqrt(3) + bias[0, 1, 2, 2:]
    p_row = np.exp(s_row) / np.exp(s_row).sum()
    np.testing.assert_allclose(out[0, 1, 2], p_row @ v[0, 1, 2:], rtol=1e-12)
    assert np.all(extra["dbias"][0, 1, 2, :2] == 0)


# ------------------------------------------------------------------- ALiBi
def test_alibi_matches_naive_in_either_alignment_with_or_without_causal():
    q, k, v, g = problem(19, b=1, h_q=2, h_kv=1, s_q=3, s_kv=5)
    slopes = np.array([0.5, 0.125])
    for align in ("top_left", "bottom_right"):
        for causal in (False, True):
            check_forward(q, k, v, alibi_slopes=slopes, causal=causal,
                          causal_alignment=align)
            check_grads(q, k, v, g, alibi_slopes=slopes, causal=causal,
                        causal_alignment=align)
    # Bottom-right it is FlashAttention's bias -slope_h * |i + s_kv - s_q - j|.
    distance = np.abs(np.arange(3)[:, None] + 2 - np.arange(5)[None, :])
    bias = -slopes[:, None, None] * distance
    a = fwd(q, k, v, alibi_slopes=slopes, causal_alignment="bottom_right",
            **F64)
    e = fwd(q, k, v, bias=bias, causal_alignment="bottom_right", **F64)
    for x, y in zip(a, e):
        np.testing.assert_allclose(x, y, rtol=1e-14)


# ----------------------------------------------------------------- dropout
def test_dropout_direct_formula_and_grads():
    q, k, v, g = problem(20, b=2, h_q=2, h_kv=1, s_q=3, s_kv=4)
    rng = np.random.default_rng(21)
    mask = (rng.random((2, 2, 3, 4)) > 0.3).astype(np.float64)
    p_drop = 0.3
    s = np.where(np.tril(np.ones((3, 4), bool), 1),
                 (q @ k.swapaxes(-1, -2)) / math.sqrt(3), -np.inf)
    p = np.exp(s) / np.exp(s).sum(-1, keepdims=True)
    out, lse = fwd(q, k, v, dropout_mask=mask, dropout_p=p_drop,
                   window=(None, 1), **F64)
    np.testing.assert_allclose(out, (p * mask / (1 - p_drop)) @ v,
                               rtol=1e-12)
    _, undropped = fwd(q, k, v, window=(None, 1), **F64)
    np.testing.assert_array_equal(lse, undropped)
    check_forward(q, k, v, dropout_mask=mask, dropout_p=p_drop)
    check_grads(q, k, v, g, dropout_mask=mask, dropout_p=p_drop,
                window=(None, 1))
    check_grads(q, k, v, g, dropout_mask=mask.astype(bool), dropout_p=0.5,
                sinks=np.array([0.2, -0.4]))


# --------------------------------------------------------------- combined
COMBINED = {
    "window_causal_softcap_padding_gqa": dict(
        h_q=4, h_kv=2, s_q=5, s_kv=4,
        kw=dict(window=(2, None), causal=True, causal_alignment="bottom_right",
                softcap=1.2, seqlens_q=np.array([5, 3]),
                seqlens_kv=np.array([2, 4]))),
    "window_top_left_softcap_padding_mqa": dict(
        h_q=3, h_kv=1, s_q=4, s_kv=5,
        kw=dict(window=(1, 2), softcap=0.9, seqlens_kv=np.array([5, 3]),
                scale=0.8)),
    "everything": dict(
        h_q=4, h_kv=2, s_q=4, s_kv=4,
        kw=dict(window=(1, None), causal=True,
                causal_alignment="bottom_right", softcap=1.7,
                seqlens_q=np.array([4, 3]), seqlens_kv=np.array([3, 4]),
                sinks=np.array([0.1, -0.2, 0.3, 0.9]),
                bias=np.linspace(-1, 1, 8).reshape(2, 1, 1, 4),
                alibi_slopes=np.array([0.5, 0.25, 0.125, 0.0625]),
                dropout_mask=(np.arange(2 * 4 * 4 * 4) % 3 != 0).reshape(
                    2, 4, 4, 4), dropout_p=0.25)),
}


@pytest.mark.parametrize("name", list(COMBINED))
def test_combined_finite_differences(name):
    case = COMBINED[name]
    q, k, v, g = problem(22, b=2, h_q=case["h_q"], h_kv=case["h_kv"],
                         s_q=case["s_q"], s_kv=case["s_kv"])
    check_forward(q, k, v, **case["kw"])
    check_grads(q, k, v, g, **case["kw"])


def test_float32_agrees_with_float64_on_variants():
    q, k, v, g = problem(23, b=2, h_q=4, h_kv=2, s_q=6, s_kv=5)
    kw = COMBINED["everything"]["kw"] | dict(
        dropout_mask=np.ones((2, 4, 6, 5)), seqlens_q=np.array([6, 2]),
        bias=np.linspace(-1, 1, 10).reshape(2, 1, 1, 5))
    with np.errstate(divide="raise", invalid="raise"):
        o32, l32 = fwd(q, k, v, **kw)
        g32 = bwd(q, k, v, g, return_extra=True, **kw)
    o64, l64 = fwd(q, k, v, **kw, **F64)
    g64 = bwd(q, k, v, g, return_extra=True, **kw, **F64)
    assert o32.dtype == l32.dtype == np.float32
    np.testing.assert_allclose(o32, o64, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(l32, l64, rtol=1e-5, atol=1e-5)
    for a, b in zip(g32[:3] + tuple(g32[3].values()),
                    g64[:3] + tuple(g64[3].values())):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------ return convention
def test_return_convention():
    q, k, v, g = problem(24)
    sinks, bias = np.zeros(2), np.zeros((1, 1, 4, 5))
    assert len(bwd(q, k, v, g, sinks=sinks, bias=bias)) == 3
    *grads, extra = bwd(q, k, v, g, return_extra=True)
    assert len(grads) == 3 and extra == {}
    assert set(bwd(q, k, v, g, sinks=sinks, return_extra=True)[3]) == {
        "dsinks"}
    assert set(bwd(q, k, v, g, bias=bias, return_extra=True)[3]) == {"dbias"}
    _, _, _, extra = bwd(q, k, v, g, sinks=sinks, bias=bias,
                         return_extra=True)
    assert extra["dsinks"].shape == (2,) and extra["dbias"].shape == (
        1, 1, 4, 5)
    assert extra["dsinks"].dtype == np.float32


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize("kw,match", [
    (dict(window=(-1, 0)), r"window left must be non-negative"),
    (dict(window=(0, -2)), r"window right must be non-negative"),
    (dict(window=(1.5, 0)), r"window left must be a non-negative int"),
    (dict(window=(True, 0)), r"window left must be a non-negative int"),
    (dict(window=3), r"window must be None or a pair"),
    (dict(window=(1, 2, 3)), r"window must be None or a pair"),
    (dict(seqlens_q=np.array([1, 2, 3])), r"seqlens_q must be .*shape \(2,\)"),
    (dict(seqlens_q=np.array([1.0, 2.0])), r"seqlens_q must be an integer"),
    (dict(seqlens_q=np.array([1, 5])), r"seqlens_q must lie in \[0, 4\]"),
    (dict(seqlens_kv=np.array([-1, 5])), r"seqlens_kv must lie in \[0, 5\]"),
    (dict(softcap=0.0), r"softcap must be a positive"),
    (dict(softcap=-1.0), r"softcap must be a positive"),
    (dict(softcap=float("inf")), r"softcap must be a positive"),
    (dict(sinks=np.zeros(3)), r"sinks must have shape \(h_q,\)"),
    (dict(sinks=np.array([0.0, np.nan])), r"sinks must not be NaN"),
    (dict(bias=np.zeros((2, 3, 4, 5))), r"bias shape .* does not broadcast"),
    (dict(bias=np.zeros((1, 2, 2, 4, 5))), r"bias shape .* does not"),
    (dict(alibi_slopes=np.ones(3), causal=True),
     r"alibi_slopes must have shape"),
    (dict(dropout_p=0.1), r"dropout_p > 0 needs dropout_mask"),
    (dict(dropout_p=1.0, dropout_mask=np.ones((2, 2, 4, 5))),
     r"dropout_p must lie in \[0, 1\)"),
    (dict(dropout_mask=np.full((2, 2, 4, 5), 0.5)), r"only 0 and 1"),
    (dict(dropout_mask=np.ones((2, 2, 4, 4))), r"dropout_mask shape"),
])
def test_errors(kw, match):
    q, k, v, g = problem(25)
    with pytest.raises(ValueError, match=match):
        fwd(q, k, v, **kw)
    with pytest.raises(ValueError, match=match):
        bwd(q, k, v, g, **kw)


def test_visible_mask_errors():
    with pytest.raises(ValueError, match=r"seqlens_kv must be .*shape \(1,\)"):
        reference.visible_mask(3, 4, seqlens_kv=np.array([1, 2]))
    with pytest.raises(ValueError, match=r"causal_alignment must be"):
        reference.visible_mask(3, 4, causal_alignment="bottom-right")
