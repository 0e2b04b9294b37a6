"""NumPy reference for scaled-dot-product attention (the oracle for tests).

Computes the same function as cuDNN's fused SDPA, forward and backward, on
logical axes (batch, heads, seq, head_dim) like
``torch.nn.functional.scaled_dot_product_attention``::

    q: (b, h_q, s_q, d_qk)   k: (b, h_kv, s_kv, d_qk)   v: (b, h_kv, s_kv, d_v)
    S0  = scale * q @ k^T                  scale defaults to 1 / sqrt(d_qk)
    S1  = c * tanh(S0 / c)                 softcap=c (Gemma 2); else S1 = S0
    S   = S1 + bias + alibi                each only when given
    S[i, j] = -inf where row i does not see key j (visible_mask, below)
    P   = softmax(S, over keys)            out = P @ v       (b, h_q, s_q, d_v)
    lse = log(sum_j exp(S[i, j]))          natural log        (b, h_q, s_q)

``lse`` is what cuDNN calls the softmax "stats". Grouped-query attention:
``h_q`` must be a multiple of ``h_kv`` and query head ``i`` uses kv head
``i // (h_q // h_kv)`` (MQA is ``h_kv == 1``).

Visibility (:func:`visible_mask`). Alignment offset ``off = 0`` for
``causal_alignment="top_left"`` and ``off = s_kv - s_q`` for
``"bottom_right"``; ``window=(left, right)`` (FlashAttention's window_size,
``None`` on a side = unbounded) lets row ``i`` see key ``j`` iff::

    i + off - left <= j <= i + off + right

``causal=True`` sets ``right = 0`` (``left`` still from ``window``). The
alignment applies to windows also without ``causal``. Padding: with
``seqlens_q`` / ``seqlens_kv`` ((b,) integers, each in [0, s]; the one not
given defaults to the full extent), query rows ``i >= seqlens_q[b]`` and keys
``j >= seqlens_kv[b]`` are padding. Padded keys are never seen, and the
bottom_right offset is per batch: ``off_b = seqlens_kv[b] - seqlens_q[b]``.

Empty rows: a row that sees no key (bottom_right causal with ``s_q > s_kv``:
its first ``s_q - s_kv`` rows; any row a window or padding empties) has
``P = 0``, ``out = 0``, ``lse = -inf``, gets ``dq = 0`` and adds nothing to
dk/dv; computed without NaNs. Padded query rows are such rows, always.

Sinks (gpt-oss): ``sinks`` (h_q,) adds a per-query-head logit to the softmax
denominator only (not scaled, not softcapped, no value row)::

    P[i, j] = exp(S[i, j]) / (exp(sink_h) + sum_j exp(S[i, j]))
    lse     = log(exp(sink_h) + sum_j exp(S[i, j]))     P_sink = exp(sink_h - lse)

so a row that sees no key has ``out = 0``, ``lse = sink_h``; padded query
rows stay ``lse = -inf`` (no sink there).

Bias: ``bias`` broadcastable to (b, h_q, s_q, s_kv), added after softcap.
ALiBi (FlashAttention's definition with ``"bottom_right"``; any slopes, with
or without ``causal``), ``off`` the alignment's offset (per batch with
padding lengths)::

    alibi[b, h, i, j] = -alibi_slopes[h] * |i + off_b - j|

Dropout: the reference draws no random numbers; it applies a given 0/1
``dropout_mask`` (broadcastable to (b, h_q, s_q, s_kv))::

    keep = dropout_mask / (1 - dropout_p)      out = (P * keep) @ v

and ``lse`` is that of the undropped softmax.

Backward, with dO = ``grad_out`` and O the (dropped) output; ``keep = 1``
without dropout::

    dP = (dO @ v^T) * keep          D = rowsum(dO * O)
    dS = P * (dP - D)               dbias = dS summed to bias's shape
    dS0 = dS * (1 - tanh(S0 / c)^2)         (dS0 = dS without softcap)
    dq = scale * dS0 @ k    dk = scale * dS0^T @ q    dv = (P * keep)^T @ dO
    dsinks[h] = -sum_{b, i} P_sink[b, h, i] * D[b, h, i]

Under GQA, dk and dv are summed over the query heads sharing a kv head.

Inputs may be any array-likes with any strides; they are copied into the
compute ``dtype`` (float32 or float64) first, so results never depend on the
memory layout. Everything is materialised (scores are (b, h_q, s_q, s_kv)):
this is meant for small problems only.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["sdpa_forward", "sdpa_backward", "sdpa_backward_from_stats", "visible_mask"]

_ALIGNMENTS = ("top_left", "bottom_right")
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _window_bounds(window: Any, causal: bool):
    """(left, right) from ``window`` and ``causal``; None means unbounded."""
    left = right = None
    if window is not None:
        try:
            left, right = window
        except (TypeError, ValueError):
            raise ValueError(f"window must be None or a pair (left, right), "
                             f"got {window!r}") from None
        left, right = (_bound(x, name) for x, name in ((left, "left"),
                                                       (right, "right")))
    if causal:
        right = 0
    return left, right


def _bound(x: Any, name: str) -> int | None:
    if x is None:
        return None
    try:
        if isinstance(x, (bool, np.bool_)):
            raise TypeError
        n = operator.index(x)
    except TypeError:
        raise ValueError(f"window {name} must be a non-negative int or None, "
                         f"got {x!r}") from None
    if n < 0:
        raise ValueError(f"window {name} must be non-negative, got {n}")
    return n


def _lengths(lengths: Any, s: int, b: int, name: str) -> np.ndarray:
    """Validated (b,) int64 padding lengths; the full extent if None."""
    if lengths is None:
        return np.full(b, s, dtype=np.int64)
    a = np.asarray(lengths)
    if a.shape != (b,) or not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{name} must be an integer array of shape ({b},), "
                         f"got {a.dtype} shape {a.shape}")
    if (a < 0).any() or (a > s).any():
        raise ValueError(f"{name} must lie in [0, {s}], got {a.tolist()}")
    return a.astype(np.int64)


def visible_mask(s_q: int, s_kv: int, *, causal: bool = False,
                 causal_alignment: str = "top_left", window: Any = None,
                 seqlens_q: Any = None, seqlens_kv: Any = None,
                 b: int = 1) -> np.ndarray:
    """Boolean (b, 1, s_q, s_kv): True where query row i sees key j.

    By the definition in the module docstring, evaluated for every (i, j).
    ``seqlens_q`` / ``seqlens_kv``, when given, must have shape (b,).

    >>> visible_mask(3, 5, window=(1, 0), causal_alignment="bottom_right")[0, 0]
    array([[False,  True,  True, False, False],
           [False, False,  True,  True, False],
           [False, False, False,  True,  True]])
    """
    if causal_alignment not in _ALIGNMENTS:
        raise ValueError(f"causal_alignment must be one of {_ALIGNMENTS}, "
                         f"got {causal_alignment!r}")
    left, right = _window_bounds(window, causal)
    len_q = _lengths(seqlens_q, s_q, b, "seqlens_q")[:, None, None]
    len_kv = _lengths(seqlens_kv, s_kv, b, "seqlens_kv")[:, None, None]
    off = (len_kv - len_q if causal_alignment == "bottom_right"
           else np.zeros_like(len_q))
    i = np.arange(s_q)[None, :, None]
    j = np.arange(s_kv)[None, None, :]
    seen = (i < len_q) & (j < len_kv)
    if left is not None:
        seen &= i + off - left <= j
    if right is not None:
        seen &= j <= i + off + right
    return seen[:, None]


@dataclass
class _Problem:
    """Operands in the GQA view: query head (g_kv * group + r) becomes
    (b, h_kv, group, ...); k and v get a group axis of 1."""

    q: np.ndarray                  # (b, h_kv, g, s_q, d_qk)
    k: np.ndarray                  # (b, h_kv, 1, s_kv, d_qk)
    v: np.ndarray                  # (b, h_kv, 1, s_kv, d_v)
    scale: Any
    seen: np.ndarray | None        # (b, 1, 1, s_q, s_kv), None: all seen
    rows: np.ndarray               # (b, 1, 1, s_q, 1): row is not padding
    softcap: Any = None
    sinks: np.ndarray | None = None    # (1, h_kv, g, 1, 1)
    bias: np.ndarray | None = None     # bias + alibi, GQA view
    keep: np.ndarray | None = None     # dropout_mask / (1 - p), GQA view


def _per_head(x: Any, h_q: int, dt: np.dtype, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=dt)
    if a.shape != (h_q,):
        raise ValueError(f"{name} must have shape (h_q,) = ({h_q},), "
                         f"got {a.shape}")
    return a


def _full(x: Any, shape: tuple, dt: np.dtype, name: str) -> np.ndarray:
    """``x`` broadcast to the (b, h_q, s_q, s_kv) ``shape``."""
    a = np.asarray(x, dtype=dt)
    try:
        if np.broadcast_shapes(a.shape, shape) != shape:
            raise ValueError
    except ValueError:
        raise ValueError(f"{name} shape {a.shape} does not broadcast to "
                         f"(b, h_q, s_q, s_kv) = {shape}") from None
    return np.broadcast_to(a, shape)


def _prepare(q: Any, k: Any, v: Any, *, scale: float | None, causal: bool,
             causal_alignment: str, dtype: Any, window: Any, seqlens_q: Any,
             seqlens_kv: Any, softcap: float | None, sinks: Any, bias: Any,
             alibi_slopes: Any, dropout_mask: Any,
             dropout_p: float) -> _Problem:
    """Validate, copy to contiguous compute-dtype arrays, build the masks."""
    dt = np.dtype(dtype)
    if dt not in _DTYPES:
        raise ValueError(f"compute dtype must be float32 or float64, got {dt}")
    if causal_alignment not in _ALIGNMENTS:
        raise ValueError(f"causal_alignment must be one of {_ALIGNMENTS}, "
                         f"got {causal_alignment!r}")
    q, k, v = (np.ascontiguousarray(x, dtype=dt) for x in (q, k, v))
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, seq, "
                             f"head_dim), got shape {x.shape}")
        if 0 in x.shape:
            raise ValueError(f"{name} has an empty dimension: shape {x.shape}")
    b, h_q, s_q, d_qk = q.shape
    if k.shape[0] != b or v.shape[0] != b:
        raise ValueError(f"batch size mismatch: q {q.shape}, k {k.shape}, "
                         f"v {v.shape}")
    if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must have the same heads and seq length "
                         f"(s_kv): k {k.shape}, v {v.shape}")
    if k.shape[3] != d_qk:
        raise ValueError(f"head_dim d_qk of q and k must match: q {q.shape}, "
                         f"k {k.shape}")
    h_kv, s_kv = k.shape[1], k.shape[2]
    if h_q % h_kv:
        raise ValueError(f"query heads h_q={h_q} must be a multiple of kv "
                         f"heads h_kv={h_kv} (GQA)")
    g = h_q // h_kv
    if scale is None:
        scale = 1.0 / math.sqrt(d_qk)
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    full = (b, h_q, s_q, s_kv)

    def gqa(x):  # (b, h_q, s_q, s_kv) -> (b, h_kv, g, s_q, s_kv)
        return x.reshape(b, h_kv, g, s_q, s_kv)

    masked = (causal or window is not None or seqlens_q is not None
              or seqlens_kv is not None)
    seen = visible_mask(s_q, s_kv, causal=causal,
                        causal_alignment=causal_alignment, window=window,
                        seqlens_q=seqlens_q, seqlens_kv=seqlens_kv, b=b)
    rows = (np.arange(s_q)[None, :]
            < _lengths(seqlens_q, s_q, b, "seqlens_q")[:, None])
    pb = _Problem(q.reshape(b, h_kv, g, s_q, d_qk), k[:, :, None],
                  v[:, :, None], dt.type(scale),
                  seen[:, None] if masked else None,
                  rows[:, None, None, :, None])
    if softcap is not None:
        softcap = float(softcap)
        if not (softcap > 0 and math.isfinite(softcap)):
            raise ValueError(f"softcap must be a positive finite float, "
                             f"got {softcap}")
        pb.softcap = dt.type(softcap)
    if sinks is not None:
        sinks = _per_head(sinks, h_q, dt, "sinks")
        if np.isnan(sinks).any() or (sinks == np.inf).any():
            raise ValueError(f"sinks must not be NaN or +inf, got {sinks}")
        pb.sinks = sinks.reshape(1, h_kv, g, 1, 1)
    if bias is not None:
        pb.bias = gqa(_full(bias, full, dt, "bias"))
    if alibi_slopes is not None:
        slopes = _per_head(alibi_slopes, h_q, dt, "alibi_slopes")
        off = np.zeros(b, dtype=np.int64)
        if causal_alignment == "bottom_right":
            off = (_lengths(seqlens_kv, s_kv, b, "seqlens_kv")
                   - _lengths(seqlens_q, s_q, b, "seqlens_q"))
        dist = np.abs(np.arange(s_q)[None, :, None] + off[:, None, None]
                      - np.arange(s_kv)[None, None, :]).astype(dt)
        alibi = -slopes.reshape(1, h_kv, g, 1, 1) * dist[:, None, None]
        pb.bias = alibi if pb.bias is None else pb.bias + alibi
    dropout_p = float(dropout_p)
    if not 0 <= dropout_p < 1:
        raise ValueError(f"dropout_p must lie in [0, 1), got {dropout_p}")
    if dropout_mask is not None:
        mask = _full(dropout_mask, full, dt, "dropout_mask")
        if not ((mask == 0) | (mask == 1)).all():
            raise ValueError("dropout_mask must hold only 0 and 1")
        pb.keep = gqa(mask / dt.type(1 - dropout_p))
    elif dropout_p:
        raise ValueError("dropout_p > 0 needs dropout_mask: the reference "
                         "applies a given keep-mask, it draws none")
    return pb


def _probs(pb: _Problem):
    """Return P, P_sink (or None), lse and tanh(S0 / c) (or None).

    Shapes (b, h_kv, g, s_q, s_kv), (b, h_kv, g, s_q, 1), (b, h_kv, g, s_q).
    Rows with nothing to normalise (no seen key, no sink) get P = 0 and
    lse = -inf with no 0/0 and no exp(-inf - (-inf)) on the way.
    """
    s = (pb.q @ pb.k.swapaxes(-1, -2)) * pb.scale
    tanh = None
    if pb.softcap is not None:
        tanh = np.tanh(s / pb.softcap)
        s = pb.softcap * tanh
    if pb.bias is not None:
        s = s + pb.bias
    if pb.seen is not None:
        s = np.where(pb.seen, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    if pb.sinks is not None:
        m = np.where(pb.rows, np.maximum(m, pb.sinks), m)
    m = np.where(m == -np.inf, 0, m)  # empty row: any finite shift will do
    e = np.exp(s - m)
    total = e.sum(axis=-1, keepdims=True)
    e_sink = None
    if pb.sinks is not None:
        e_sink = np.where(pb.rows, np.exp(pb.sinks - m), 0)
        total = total + e_sink
    nonzero = total > 0
    total = np.where(nonzero, total, 1)
    lse = np.where(nonzero, m + np.log(total), -np.inf)[..., 0]
    p_sink = None if e_sink is None else e_sink / total
    return e / total, p_sink, lse, tanh


def _out(pb: _Problem, p: np.ndarray):
    """(P * keep, out) in the GQA view."""
    pd = p if pb.keep is None else p * pb.keep
    return pd, pd @ pb.v


def _sum_to(x: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum ``x`` over the axes along which ``shape`` was broadcast to it."""
    x = x.sum(axis=tuple(range(x.ndim - len(shape))))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    return x.sum(axis=axes, keepdims=True).reshape(shape)


def sdpa_forward(q: Any, k: Any, v: Any, *, scale: float | None = None,
                 causal: bool = False, causal_alignment: str = "top_left",
                 dtype: Any = np.float32, window: Any = None,
                 seqlens_q: Any = None, seqlens_kv: Any = None,
                 softcap: float | None = None, sinks: Any = None,
                 bias: Any = None, alibi_slopes: Any = None,
                 dropout_mask: Any = None, dropout_p: float = 0.0
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Attention forward: return ``(out, lse)``.

    ``out = softmax(scale * q @ k^T + mask) @ v`` with shape (b, h_q, s_q, d_v)
    and ``lse`` (b, h_q, s_q) the natural-log logsumexp of each scaled,
    masked score row. Both are contiguous arrays of the compute ``dtype``.
    The variants (window, padding, softcap, sinks, bias, ALiBi, dropout) are
    as in the module docstring.

    >>> import numpy as np
    >>> q = np.ones((1, 2, 3, 4)); k = np.ones((1, 1, 5, 4))
    >>> v = np.arange(5.0).reshape(1, 1, 5, 1)  # MQA: both heads use kv head 0
    >>> out, lse = sdpa_forward(q, k, v, causal=True,
    ...                         causal_alignment="bottom_right")
    >>> out[0, 0, :, 0]                         # uniform over keys 0..i+2
    array([1. , 1.5, 2. ], dtype=float32)
    >>> bool(np.allclose(lse[0, 1], 2 + np.log([3, 4, 5])))  # S = 4/2 = 2
    True
    >>> out, lse = sdpa_forward(k, k[:, :, :3], v[:, :, :3], causal=True,
    ...                         causal_alignment="bottom_right")  # 5 > 3
    >>> out[0, 0, :, 0], lse[0, 0, :2]          # rows 0 and 1 see no key
    (array([0. , 0. , 0. , 0.5, 1. ], dtype=float32), array([-inf, -inf], dtype=float32))
    """
    pb = _prepare(q, k, v, scale=scale, causal=causal,
                  causal_alignment=causal_alignment, dtype=dtype,
                  window=window, seqlens_q=seqlens_q, seqlens_kv=seqlens_kv,
                  softcap=softcap, sinks=sinks, bias=bias,
                  alibi_slopes=alibi_slopes, dropout_mask=dropout_mask,
                  dropout_p=dropout_p)
    b, h_kv, g, s_q, _ = pb.q.shape
    p, _, lse, _ = _probs(pb)
    _, out = _out(pb, p)
    return (np.ascontiguousarray(out.reshape(b, h_kv * g, s_q, -1)),
            np.ascontiguousarray(lse.reshape(b, h_kv * g, s_q)))


def sdpa_backward(q: Any, k: Any, v: Any, grad_out: Any, *,
                  scale: float | None = None, causal: bool = False,
                  causal_alignment: str = "top_left",
                  dtype: Any = np.float32, window: Any = None,
                  seqlens_q: Any = None, seqlens_kv: Any = None,
                  softcap: float | None = None, sinks: Any = None,
                  bias: Any = None, alibi_slopes: Any = None,
                  dropout_mask: Any = None, dropout_p: float = 0.0,
                  return_extra: bool = False) -> tuple:
    """Attention backward: return ``(dq, dk, dv)`` shaped like q, k, v.

    With P and O from the forward and dO = ``grad_out`` (b, h_q, s_q, d_v)::

        dP = dO @ v^T            dS = P * (dP - rowsum(dO * O))
        dq = scale * dS @ k      dk = scale * dS^T @ q      dv = P^T @ dO

    Under GQA, dk and dv are summed over the query heads sharing a kv head.
    The variants' terms (softcap, dropout, sinks, bias) are in the module
    docstring. With ``return_extra=True`` the result is
    ``(dq, dk, dv, extra)``: ``extra`` is a dict holding ``"dsinks"`` (shape
    (h_q,)) when ``sinks`` is given and ``"dbias"`` (bias's own shape, summed
    over its broadcast axes) when ``bias`` is given, nothing else (so ``{}``
    when neither is).

    >>> import numpy as np
    >>> q = np.zeros((1, 1, 2, 3)); k = np.zeros((1, 1, 2, 3))
    >>> v = np.ones((1, 1, 2, 3)); g = np.ones((1, 1, 2, 3))
    >>> dq, dk, dv = sdpa_backward(q, k, v, g)   # P == 1/2 everywhere
    >>> dv[0, 0]
    array([[1., 1., 1.],
           [1., 1., 1.]], dtype=float32)
    """
    pb = _prepare(q, k, v, scale=scale, causal=causal,
                  causal_alignment=causal_alignment, dtype=dtype,
                  window=window, seqlens_q=seqlens_q, seqlens_kv=seqlens_kv,
                  softcap=softcap, sinks=sinks, bias=bias,
                  alibi_slopes=alibi_slopes, dropout_mask=dropout_mask,
                  dropout_p=dropout_p)
    b, h_kv, g, s_q, d_qk = pb.q.shape
    s_kv, d_v = pb.v.shape[-2:]
    do = np.ascontiguousarray(grad_out, dtype=pb.q.dtype)
    if do.shape != (b, h_kv * g, s_q, d_v):
        raise ValueError(f"grad_out shape {do.shape} must equal the output "
                         f"shape {(b, h_kv * g, s_q, d_v)}")
    do = do.reshape(b, h_kv, g, s_q, d_v)
    p, p_sink, _, tanh = _probs(pb)
    pd, out = _out(pb, p)
    dp = do @ pb.v.swapaxes(-1, -2)
    if pb.keep is not None:
        dp = dp * pb.keep
    rowsum = (do * out).sum(axis=-1, keepdims=True)
    ds = p * (dp - rowsum)
    ds0 = ds if tanh is None else ds * (1 - tanh * tanh)
    dq = (ds0 @ pb.k) * pb.scale
    dk = (ds0.swapaxes(-1, -2) @ pb.q).sum(axis=2) * pb.scale
    dv = (pd.swapaxes(-1, -2) @ do).sum(axis=2)
    grads = (np.ascontiguousarray(dq.reshape(b, h_kv * g, s_q, d_qk)),
             np.ascontiguousarray(dk), np.ascontiguousarray(dv))
    if not return_extra:
        return grads
    extra = {}
    if p_sink is not None:
        extra["dsinks"] = -(p_sink * rowsum).sum(axis=(0, 3, 4)).reshape(-1)
    if bias is not None:
        full = ds.reshape(b, h_kv * g, s_q, s_kv)
        extra["dbias"] = np.ascontiguousarray(_sum_to(full, np.shape(bias)))
    return (*grads, extra)


def sdpa_backward_from_stats(q: Any, k: Any, v: Any, out: Any, grad_out: Any,
                             lse: Any, *, scale: float | None = None,
                             causal: bool = False,
                             causal_alignment: str = "top_left",
                             window: Any = None, seqlens_q: Any = None,
                             seqlens_kv: Any = None,
                             dtype: Any = np.float32) -> tuple:
    """The backward a fused kernel computes: ``(dq, dk, dv)`` from the
    forward's ``out`` (b, h_q, s_q, d_v) and ``lse`` (b, h_q, s_q) as given,
    not recomputed::

        P = exp(scale * q @ k^T + mask - lse)    D = rowsum(grad_out * out)
        dS = P * (grad_out @ v^T - D)            dv = P^T @ grad_out
        dq = scale * dS @ k                      dk = scale * dS^T @ q

    With this block's own out and lse it equals :func:`sdpa_backward`; with
    the out and lse of a larger problem whose keys this block is one part of
    (attention over a sequence split across devices) it gives this block's
    share of that problem's gradients -- dq summed over the blocks, dk and dv
    per block. Rows with lse = -inf see no key here and get P = 0. Plain,
    causal and windowed masks with padding lengths (no softcap, sinks, bias,
    ALiBi or dropout).
    """
    pb = _prepare(q, k, v, scale=scale, causal=causal,
                  causal_alignment=causal_alignment, dtype=dtype,
                  window=window, seqlens_q=seqlens_q, seqlens_kv=seqlens_kv,
                  softcap=None, sinks=None, bias=None, alibi_slopes=None,
                  dropout_mask=None, dropout_p=0.0)
    b, h_kv, g, s_q, d_qk = pb.q.shape
    d_v = pb.v.shape[-1]
    dt = pb.q.dtype
    shapes = {"out": (b, h_kv * g, s_q, d_v), "grad_out": (b, h_kv * g, s_q, d_v), "lse": (b, h_kv * g, s_q)}
    given = {"out": out, "grad_out": grad_out, "lse": lse}
    o, do, m = (np.ascontiguousarray(given[n], dtype=dt) for n in ("out", "grad_out", "lse"))
    for name, x in zip(("out", "grad_out", "lse"), (o, do, m)):
        if x.shape != shapes[name]:
            raise ValueError(f"{name} shape {x.shape} must be {shapes[name]}")
    o, do = o.reshape(b, h_kv, g, s_q, d_v), do.reshape(b, h_kv, g, s_q, d_v)
    m = m.reshape(b, h_kv, g, s_q, 1)
    s = (pb.q @ pb.k.swapaxes(-1, -2)) * pb.scale
    if pb.seen is not None:
        s = np.where(pb.seen, s, -np.inf)
    with np.errstate(invalid="ignore"):  # -inf - (-inf) in rows that see no key anywhere
        p = np.where(np.isneginf(m) | np.isneginf(s), 0, np.exp(s - np.where(np.isneginf(m), 0, m)))
    ds = p * (do @ pb.v.swapaxes(-1, -2) - (do * o).sum(axis=-1, keepdims=True))
    dq = (ds @ pb.k) * pb.scale
    dk = (ds.swapaxes(-1, -2) @ pb.q).sum(axis=2) * pb.scale
    dv = (p.swapaxes(-1, -2) @ do).sum(axis=2)
    return (np.ascontiguousarray(dq.reshape(b, h_kv * g, s_q, d_qk)),
            np.ascontiguousarray(dk), np.ascontiguousarray(dv))
