"""NumPy reference for scaled-dot-product attention (the oracle for tests).

Computes the same function as cuDNN's fused SDPA, forward and backward, on
logical axes (batch, heads, seq, head_dim) like
``torch.nn.functional.scaled_dot_product_attention``::

    q: (b, h_q, s_q, d_qk)   k: (b, h_kv, s_kv, d_qk)   v: (b, h_kv, s_kv, d_v)
    S   = scale * q @ k^T                  scale defaults to 1 / sqrt(d_qk)
    S[i, j] = -inf where the causal mask forbids key j for query row i
    P   = softmax(S, over keys)            out = P @ v       (b, h_q, s_q, d_v)
    lse = log(sum_j exp(S[i, j]))          natural log        (b, h_q, s_q)

``lse`` is what cuDNN calls the softmax "stats". Grouped-query attention:
``h_q`` must be a multiple of ``h_kv`` and query head ``i`` uses kv head
``i // (h_q // h_kv)`` (MQA is ``h_kv == 1``).

Causal mask: with ``causal_alignment="top_left"`` row ``i`` sees key ``j`` iff
``j <= i``; with ``"bottom_right"`` iff ``j <= i + (s_kv - s_q)``. A row that
sees no key (bottom_right with ``s_q > s_kv``) is rejected with ValueError,
as cuDNN rejects it.

Inputs may be any array-likes with any strides; they are copied into the
compute ``dtype`` (float32 or float64) first, so results never depend on the
memory layout. Everything is materialised (scores are (b, h_q, s_q, s_kv)):
this is meant for small problems only.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["sdpa_forward", "sdpa_backward"]

_ALIGNMENTS = ("top_left", "bottom_right")
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _prepare(q: Any, k: Any, v: Any, scale: float | None, causal: bool,
             causal_alignment: str, dtype: Any):
    """Validate, copy to contiguous compute-dtype arrays, build mask/scale."""
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
    if scale is None:
        scale = 1.0 / math.sqrt(d_qk)
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    allowed = None
    if causal:
        offset = 0 if causal_alignment == "top_left" else s_kv - s_q
        allowed = (np.arange(s_kv)[None, :]
                   <= np.arange(s_q)[:, None] + offset)
        if not allowed.any(axis=1).all():
            raise ValueError(f"causal bottom_right mask with s_q={s_q} > "
                             f"s_kv={s_kv} leaves query rows with no key "
                             f"to attend to")
    # GQA view: query head (g_kv * group + r) -> (b, h_kv, group, s_q, d).
    qg = q.reshape(b, h_kv, h_q // h_kv, s_q, d_qk)
    return qg, k[:, :, None], v[:, :, None], dt.type(scale), allowed


def _probs(qg, k, scale, allowed):
    """Return P (b, h_kv, group, s_q, s_kv) and lse (b, h_kv, group, s_q)."""
    s = (qg @ k.swapaxes(-1, -2)) * scale
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)  # finite: each row has an allowed key
    e = np.exp(s - m)
    total = e.sum(axis=-1, keepdims=True)
    return e / total, (m + np.log(total))[..., 0]


def sdpa_forward(q: Any, k: Any, v: Any, *, scale: float | None = None,
                 causal: bool = False, causal_alignment: str = "top_left",
                 dtype: Any = np.float32) -> tuple[np.ndarray, np.ndarray]:
    """Attention forward: return ``(out, lse)``.

    ``out = softmax(scale * q @ k^T + mask) @ v`` with shape (b, h_q, s_q, d_v)
    and ``lse`` (b, h_q, s_q) the natural-log logsumexp of each scaled,
    masked score row. Both are contiguous arrays of the compute ``dtype``.

    >>> import numpy as np
    >>> q = np.ones((1, 2, 3, 4)); k = np.ones((1, 1, 5, 4))
    >>> v = np.arange(5.0).reshape(1, 1, 5, 1)  # MQA: both heads use kv head 0
    >>> out, lse = sdpa_forward(q, k, v, causal=True,
    ...                         causal_alignment="bottom_right")
    >>> out[0, 0, :, 0]                         # uniform over keys 0..i+2
    array([1. , 1.5, 2. ], dtype=float32)
    >>> bool(np.allclose(lse[0, 1], 2 + np.log([3, 4, 5])))  # S = 4/2 = 2
    True
    """
    qg, k4, v4, sc, allowed = _prepare(q, k, v, scale, causal,
                                       causal_alignment, dtype)
    b, h_kv, g, s_q, _ = qg.shape
    p, lse = _probs(qg, k4, sc, allowed)
    out = p @ v4
    return (np.ascontiguousarray(out.reshape(b, h_kv * g, s_q, -1)),
            np.ascontiguousarray(lse.reshape(b, h_kv * g, s_q)))


def sdpa_backward(q: Any, k: Any, v: Any, grad_out: Any, *,
                  scale: float | None = None, causal: bool = False,
                  causal_alignment: str = "top_left",
                  dtype: Any = np.float32
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Attention backward: return ``(dq, dk, dv)`` shaped like q, k, v.

    With P and O from the forward and dO = ``grad_out`` (b, h_q, s_q, d_v)::

        dP = dO @ v^T            dS = P * (dP - rowsum(dO * O))
        dq = scale * dS @ k      dk = scale * dS^T @ q      dv = P^T @ dO

    Under GQA, dk and dv are summed over the query heads sharing a kv head.

    >>> import numpy as np
    >>> q = np.zeros((1, 1, 2, 3)); k = np.zeros((1, 1, 2, 3))
    >>> v = np.ones((1, 1, 2, 3)); g = np.ones((1, 1, 2, 3))
    >>> dq, dk, dv = sdpa_backward(q, k, v, g)   # P == 1/2 everywhere
    >>> dv[0, 0]
    array([[1., 1., 1.],
           [1., 1., 1.]], dtype=float32)
    """
    qg, k4, v4, sc, allowed = _prepare(q, k, v, scale, causal,
                                       causal_alignment, dtype)
    b, h_kv, g, s_q, d_qk = qg.shape
    s_kv, d_v = v4.shape[-2:]
    do = np.ascontiguousarray(grad_out, dtype=qg.dtype)
    if do.shape != (b, h_kv * g, s_q, d_v):
        raise ValueError(f"grad_out shape {do.shape} must equal the output "
                         f"shape {(b, h_kv * g, s_q, d_v)}")
    do = do.reshape(b, h_kv, g, s_q, d_v)
    p, _ = _probs(qg, k4, sc, allowed)
    out = p @ v4
    dp = do @ v4.swapaxes(-1, -2)
    ds = p * (dp - (do * out).sum(axis=-1, keepdims=True))
    dq = (ds @ k4) * sc
    dk = (ds.swapaxes(-1, -2) @ qg).sum(axis=2) * sc
    dv = (p.swapaxes(-1, -2) @ do).sum(axis=2)
    return (np.ascontiguousarray(dq.reshape(b, h_kv * g, s_q, d_qk)),
            np.ascontiguousarray(dk), np.ascontiguousarray(dv))
