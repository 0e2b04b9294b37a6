"""CPU tests of stridedfa.reference against independent float64 formulas."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stridedfa import reference

fwd = reference.sdpa_forward
bwd = reference.sdpa_backward


# ----------------------------------------------------------------- oracles
def naive_forward(q, k, v, scale=None, causal=False, align="top_left"):
    """Row-by-row float64 attention with plain Python loops."""
    q, k, v = (np.array(x, dtype=np.float64) for x in (q, k, v))
    b, h_q, s_q, d_qk = q.shape
    h_kv, s_kv, d_v = k.shape[1], k.shape[2], v.shape[3]
    scale = 1.0 / math.sqrt(d_qk) if scale is None else scale
    out = np.zeros((b, h_q, s_q, d_v))
    lse = np.zeros((b, h_q, s_q))
    for bi in range(b):
        for h in range(h_q):
            kh = h // (h_q // h_kv)
            for i in range(s_q):
                limit = i + (s_kv - s_q if align == "bottom_right" else 0)
                keys = [j for j in range(s_kv) if not causal or j <= limit]
                assert keys, "test bug: row without keys"
                s = [scale * float(np.dot(q[bi, h, i], k[bi, kh, j]))
                     for j in keys]
                m = max(s)
                w = [math.exp(x - m) for x in s]
                tot = math.fsum(w)
                lse[bi, h, i] = m + math.log(tot)
                for wj, j in zip(w, keys):
                    out[bi, h, i] += (wj / tot) * v[bi, kh, j]
    return out, lse


def rand(rng, *shape):
    return rng.standard_normal(shape)


def make_qkv(seed, b=2, h_q=2, h_kv=2, s_q=5, s_kv=7, d_qk=8, d_v=8):
    rng = np.random.default_rng(seed)
    return (rand(rng, b, h_q, s_q, d_qk), rand(rng, b, h_kv, s_kv, d_qk),
            rand(rng, b, h_kv, s_kv, d_v))


# ----------------------------------------------------------------- forward
FWD_CASES = {
    "plain": dict(),
    "causal_tl_sq_lt_skv": dict(causal=True, align="top_left"),
    "causal_br_sq_lt_skv": dict(causal=True, align="bottom_right"),
    "causal_tl_sq_eq_skv": dict(causal=True, align="top_left", s_q=6, s_kv=6),
    "causal_br_sq_eq_skv": dict(causal=True, align="bottom_right", s_q=6,
                                s_kv=6),
    "causal_tl_sq_gt_skv": dict(causal=True, align="top_left", s_q=9,
                                s_kv=4),
    "gqa": dict(h_q=4, h_kv=2),
    "gqa_causal_br": dict(h_q=6, h_kv=2, causal=True, align="bottom_right"),
    "mqa": dict(h_q=3, h_kv=1, causal=True),
    "dqk_ne_dv": dict(d_qk=6, d_v=3),
    "custom_scale": dict(scale=0.37),
    "negative_scale": dict(scale=-1.3, causal=True, align="bottom_right"),
}


@pytest.mark.parametrize("name", list(FWD_CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_forward_matches_naive(name, dtype):
    c = dict(FWD_CASES[name])
    scale, causal = c.pop("scale", None), c.pop("causal", False)
    align = c.pop("align", "top_left")
    q, k, v = make_qkv(list(FWD_CASES).index(name), **c)
    out, lse = fwd(q, k, v, scale=scale, causal=causal,
                   causal_alignment=align, dtype=dtype)
    ref_out, ref_lse = naive_forward(q, k, v, scale, causal, align)
    assert out.dtype == dtype and lse.dtype == dtype
    assert out.shape == ref_out.shape and lse.shape == ref_lse.shape
    assert out.flags.c_contiguous and lse.flags.c_contiguous
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == np.float64 else \
        dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out, ref_out, **tol)
    np.testing.assert_allclose(lse, ref_lse, **tol)


def test_causal_masks_are_what_they_claim():
    # Make v one-hot per key, so out[..., j] == P[i, j]; check zeros exactly.
    rng = np.random.default_rng(11)
    s_q, s_kv = 3, 5
    q, k = rand(rng, 1, 1, s_q, 4), rand(rng, 1, 1, s_kv, 4)
    v = np.eye(s_kv)[None, None]
    i, j = np.arange(s_q)[:, None], np.arange(s_kv)[None, :]
    for align, allowed in (("top_left", j <= i),
                           ("bottom_right", j <= i + s_kv - s_q)):
        p, _ = fwd(q, k, v, causal=True, causal_alignment=align,
                   dtype=np.float64)
        assert np.all(p[0, 0][~allowed] == 0)
        assert np.all(p[0, 0][allowed] > 0)
        np.testing.assert_allclose(p.sum(-1), 1, rtol=1e-14)


def test_bottom_right_equal_lengths_equals_top_left():
    q, k, v = make_qkv(12, s_q=6, s_kv=6)
    a = fwd(q, k, v, causal=True, causal_alignment="top_left")
    b = fwd(q, k, v, causal=True, causal_alignment="bottom_right")
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_float32_default_agrees_with_float64():
    q, k, v = make_qkv(13, h_q=4, h_kv=2, s_q=16, s_kv=24, d_qk=32, d_v=16)
    g = np.random.default_rng(14).standard_normal((2, 4, 16, 16))
    o32, l32 = fwd(q, k, v, causal=True)
    o64, l64 = fwd(q, k, v, causal=True, dtype=np.float64)
    assert o32.dtype == np.float32 and o64.dtype == np.float64
    np.testing.assert_allclose(o32, o64, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(l32, l64, rtol=1e-5, atol=1e-5)
    for a, b in zip(bwd(q, k, v, g, causal=True),
                    bwd(q, k, v, g, causal=True, dtype=np.float64)):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- backward
def finite_diff_grads(q, k, v, g, eps=1e-6, **kw):
    """Central differences of L = sum(out * g), out from the naive forward."""
    def loss(q_, k_, v_):
        return float(np.sum(naive_forward(q_, k_, v_, **kw)[0] * g))

    args = [q.copy(), k.copy(), v.copy()]
    grads = []
    for a in args:
        d = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            x0 = a[idx]
            a[idx] = x0 + eps
            up = loss(*args)
            a[idx] = x0 - eps
            down = loss(*args)
            a[idx] = x0
            d[idx] = (up - down) / (2 * eps)
        grads.append(d)
    return grads


@pytest.mark.parametrize("causal,align,scale,h_q,h_kv,s_q,s_kv", [
    (False, "top_left", None, 2, 1, 3, 4),      # MQA-style GQA, s_q < s_kv
    (True, "top_left", None, 2, 1, 3, 4),
    (True, "bottom_right", None, 2, 1, 3, 4),
    (True, "bottom_right", 0.8, 4, 2, 3, 4),    # GQA group 2, custom scale
    (False, "top_left", 1.7, 2, 2, 4, 3),       # s_q > s_kv
    (True, "top_left", None, 2, 2, 4, 3),
    (True, "top_left", None, 3, 1, 3, 3),
    (True, "bottom_right", None, 3, 1, 3, 3),
])
def test_backward_matches_finite_differences(causal, align, scale,
                                             h_q, h_kv, s_q, s_kv):
    rng = np.random.default_rng(100 + 7 * h_q + s_q + int(causal))
    q = rand(rng, 1, h_q, s_q, 4)
    k = rand(rng, 1, h_kv, s_kv, 4)
    v = rand(rng, 1, h_kv, s_kv, 3)
    g = rand(rng, 1, h_q, s_q, 3)
    kw = dict(scale=scale, causal=causal, align=align)
    expected = finite_diff_grads(q, k, v, g, **kw)
    got = bwd(q, k, v, g, scale=scale, causal=causal, causal_alignment=align,
              dtype=np.float64)
    for name, a, e, x in zip("qkv", got, expected, (q, k, v)):
        assert a.shape == x.shape and a.dtype == np.float64, name
        assert a.flags.c_contiguous, name
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-7,
                                   err_msg=f"d{name}")


# ----------------------------------------------------------------- strides
def test_strided_views_give_identical_results():
    rng = np.random.default_rng(21)
    b, s, h, d = 2, 6, 3, 8
    packed = rng.standard_normal((b, s, 3, h, d)).astype(np.float32)
    q, k, v = (packed[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    assert not q.flags.c_contiguous
    g = rng.standard_normal((b, h, s, d)).astype(np.float32)
    g_bshd = np.ascontiguousarray(g.transpose(0, 2, 1, 3))
    g_view = g_bshd.transpose(0, 2, 1, 3)                 # (b,s,h,d) view
    # Negative strides: a reversed copy, viewed reversed, holds q's values.
    q_rev = np.ascontiguousarray(q[:, ::-1, ::-1, ::-1])[:, ::-1, ::-1, ::-1]
    assert any(st_ < 0 for st_ in q_rev.strides)
    cq, ck, cv = (np.ascontiguousarray(x) for x in (q, k, v))
    for causal in (False, True):
        ref_f = fwd(cq, ck, cv, causal=causal)
        ref_b = bwd(cq, ck, cv, g, causal=causal)
        for qq in (q, q_rev):
            for got, exp in zip(fwd(qq, k, v, causal=causal), ref_f):
                np.testing.assert_array_equal(got, exp)
            for got, exp in zip(bwd(qq, k, v, g_view, causal=causal), ref_b):
                np.testing.assert_array_equal(got, exp)
                assert got.flags.c_contiguous


def test_broadcast_stride0_float16_and_lists():
    rng = np.random.default_rng(22)
    q = rng.standard_normal((1, 2, 4, 8)).astype(np.float16)
    k_row = rng.standard_normal((1, 1, 1, 8)).astype(np.float16)
    k = np.broadcast_to(k_row, (1, 1, 5, 8))              # stride 0 on seq
    v = rng.standard_normal((1, 1, 5, 4)).astype(np.float16)
    assert k.strides[2] == 0
    ref = fwd(q.astype(np.float32), np.ascontiguousarray(k, np.float32),
              v.astype(np.float32))
    for got, exp in zip(fwd(q, k, v), ref):
        np.testing.assert_array_equal(got, exp)
    for got, exp in zip(fwd(q.tolist(), k.tolist(), v.tolist()), ref):
        np.testing.assert_array_equal(got, exp)
    # Every key identical => uniform attention => out = mean of v rows.
    np.testing.assert_allclose(ref[0][0, 0],
                               np.broadcast_to(v[0, 0].astype(np.float32)
                                               .mean(0), (4, 4)), rtol=1e-5)


def test_inputs_not_modified():
    q, k, v = make_qkv(23)
    g = np.random.default_rng(24).standard_normal((2, 2, 5, 8))
    copies = [x.copy() for x in (q, k, v, g)]
    fwd(q, k, v, causal=True, dtype=np.float64)
    bwd(q, k, v, g, causal=True, dtype=np.float64)
    for x, c in zip((q, k, v, g), copies):
        np.testing.assert_array_equal(x, c)


# ------------------------------------------------------------------ errors
def _err_case(**shapes):
    base = dict(q=(1, 4, 3, 8), k=(1, 2, 5, 8), v=(1, 2, 5, 6))
    base.update(shapes)
    rng = np.random.default_rng(31)
    return [rng.standard_normal(base[n]) for n in "qkv"]


@pytest.mark.parametrize("shapes,kw,match", [
    (dict(q=(4, 3, 8)), {}, r"q must be 4-D"),
    (dict(k=(1, 1, 2, 5, 8)), {}, r"k must be 4-D"),
    (dict(v=(2, 5, 6)), {}, r"v must be 4-D"),
    (dict(k=(2, 2, 5, 8), v=(2, 2, 5, 6)), {}, r"batch size mismatch"),
    (dict(k=(1, 3, 5, 8), v=(1, 3, 5, 6)), {}, r"multiple of kv heads"),
    (dict(k=(1, 2, 5, 7)), {}, r"d_qk of q and k must match"),
    (dict(v=(1, 2, 6, 6)), {}, r"k and v must have the same .*s_kv"),
    (dict(v=(1, 1, 5, 6)), {}, r"k and v must have the same heads"),
    (dict(q=(1, 4, 0, 8)), {}, r"empty dimension"),
    ({}, dict(causal_alignment="bottom-right"), r"causal_alignment must be"),
    ({}, dict(causal_alignment="bottom-right", causal=False),
     r"causal_alignment must be"),
    ({}, dict(scale=float("inf")), r"scale must be finite"),
    ({}, dict(scale=float("nan")), r"scale must be finite"),
    ({}, dict(dtype=np.float16), r"compute dtype must be float32 or float64"),
])
def test_errors(shapes, kw, match):
    q, k, v = _err_case(**shapes)
    with pytest.raises(ValueError, match=match):
        fwd(q, k, v, **kw)
    g = np.ones((1, 4, 3, 6))
    with pytest.raises(ValueError, match=match):
        bwd(q, k, v, g, **kw)


def test_grad_out_shape_error():
    q, k, v = _err_case()
    with pytest.raises(ValueError, match=r"grad_out shape .* must equal"):
        bwd(q, k, v, np.ones((1, 4, 3, 8)))


def test_top_left_long_query_is_accepted():
    q, k, v = _err_case(q=(1, 4, 6, 8))
    out, lse = fwd(q, k, v, causal=True, causal_alignment="top_left")
    assert out.shape == (1, 4, 6, 6) and lse.shape == (1, 4, 6)


def test_docstring_examples():
    result = doctest.testmod(reference, verbose=False)
    assert result.attempted > 0 and result.failed == 0


# ---------------------------------------------------------------- property
@settings(max_examples=30, deadline=None)
@given(b=st.integers(1, 2), h_kv=st.integers(1, 3), group=st.integers(1, 3),
       s_q=st.integers(1, 6), s_kv=st.integers(1, 6), d_qk=st.integers(1, 5),
       d_v=st.integers(1, 5), causal=st.booleans(),
       align=st.sampled_from(["top_left", "bottom_right"]),
       seed=st.integers(0, 2**32 - 1))
def test_property_matches_naive(b, h_kv, group, s_q, s_kv, d_qk, d_v, causal,
                                align, seed):
    rng = np.random.default_rng(seed)
    h_q = h_kv * group
    q = rand(rng, b, h_q, s_q, d_qk)
    k = rand(rng, b, h_kv, s_kv, d_qk)
    v = rand(rng, b, h_kv, s_kv, d_v)
    kw = dict(causal=causal, causal_alignment=align, dtype=np.float64)
    out, lse = fwd(q, k, v, **kw)
    ones, _ = fwd(q, k, np.ones_like(v), **kw)
    # bottom_right with s_q > s_kv: the first s_q - s_kv rows see no key
    # (out 0, lse -inf); the rest are the equal-length problem on the tail.
    empty = s_q - s_kv if causal and align == "bottom_right" else 0
    empty = max(empty, 0)
    assert np.all(out[:, :, :empty] == 0) and np.all(ones[:, :, :empty] == 0)
    assert np.all(lse[:, :, :empty] == -np.inf)
    ref_out, ref_lse = naive_forward(q[:, :, empty:], k, v, None, causal,
                                     align)
    np.testing.assert_allclose(out[:, :, empty:], ref_out, rtol=1e-10,
                               atol=1e-12)
    np.testing.assert_allclose(lse[:, :, empty:], ref_lse, rtol=1e-10,
                               atol=1e-12)
    # Rows of P sum to one: with v == 1 the output is exactly ones.
    np.testing.assert_allclose(ones[:, :, empty:], 1.0, rtol=1e-13)


@pytest.mark.parametrize("causal, alignment, window", [(False, "top_left", None), (True, "top_left", None),
                                                        (True, "bottom_right", None), (False, "top_left", (3, 2))])
def test_backward_from_stats_is_the_backward_given_the_forwards_out_and_lse(causal, alignment, window):
    r = np.random.default_rng(7)
    q, k, v = r.standard_normal((2, 4, 7, 8)), r.standard_normal((2, 2, 9, 8)), r.standard_normal((2, 2, 9, 5))
    dout = r.standard_normal((2, 4, 7, 5))
    options = {"causal": causal, "causal_alignment": alignment, "window": window, "dtype": np.float64}
    out, lse = reference.sdpa_forward(q, k, v, **options)
    want = reference.sdpa_backward(q, k, v, dout, **options)
    got = reference.sdpa_backward_from_stats(q, k, v, out, dout, lse, **options)
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        np.testing.assert_allclose(a, b, atol=1e-12, err_msg=name)


def test_backward_from_stats_splits_over_blocks_of_keys():
    """Given the whole problem's out and lse, each block of keys gives its share: dq sums over the
    blocks, dk and dv are the blocks' rows (what attention over a sharded sequence relies on)."""
    r = np.random.default_rng(8)
    q, k, v = r.standard_normal((1, 2, 6, 8)), r.standard_normal((1, 2, 10, 8)), r.standard_normal((1, 2, 10, 8))
    dout = r.standard_normal((1, 2, 6, 8))
    out, lse = reference.sdpa_forward(q, k, v, dtype=np.float64)
    dq, dk, dv = reference.sdpa_backward(q, k, v, dout, dtype=np.float64)
    parts = [reference.sdpa_backward_from_stats(q, k[:, :, cut], v[:, :, cut], out, dout, lse, dtype=np.float64)
             for cut in (slice(0, 3), slice(3, 10))]
    np.testing.assert_allclose(parts[0][0] + parts[1][0], dq, atol=1e-12)
    np.testing.assert_allclose(np.concatenate([p[1] for p in parts], 2), dk, atol=1e-12)
    np.testing.assert_allclose(np.concatenate([p[2] for p in parts], 2), dv, atol=1e-12)
    with pytest.raises(ValueError, match="lse shape"):
        reference.sdpa_backward_from_stats(q, k, v, out, dout, lse[:, :1], dtype=np.float64)
