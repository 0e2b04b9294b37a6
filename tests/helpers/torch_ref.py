"""High-precision attention reference in torch (runs on the tensors' device).

Computes in float64 by default (float32 or better, as the tests need, and never TF32),
with an explicit causal mask and explicit GQA head mapping: query head ``i`` reads
key/value head ``i // (h_q // h_kv)`` (``repeat_interleave`` on the head axis), the
mapping of torch's ``enable_gqa`` and of cuDNN. Results are returned as float32.

Rows with no visible key (bottom-right causal with ``s_q > s_kv``) have no defined
output; tests do not use such shapes.
"""

from __future__ import annotations

import math

import torch

ALIGNMENTS = ("top_left", "bottom_right")


def default_scale(d_qk: int) -> float:
    return 1.0 / math.sqrt(d_qk)


def causal_mask(s_q: int, s_kv: int, alignment: str, device) -> torch.Tensor:
    """Boolean (s_q, s_kv) mask, True where query ``i`` may attend key ``j``.

    ``top_left``: ``j <= i``; ``bottom_right``: ``j <= i + s_kv - s_q`` (the last query
    sees every key)."""
    i = torch.arange(s_q, device=device)[:, None]
    j = torch.arange(s_kv, device=device)[None, :]
    if alignment == "top_left":
        return j <= i
    if alignment == "bottom_right":
        return j <= i + (s_kv - s_q)
    raise ValueError(f"unknown causal alignment {alignment!r}")


def _attention(q, k, v, scale, causal, alignment):
    h_q, h_kv = q.shape[1], k.shape[1]
    if h_q % h_kv:
        raise ValueError(f"h_q={h_q} is not a multiple of h_kv={h_kv}")
    group = h_q // h_kv
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        mask = causal_mask(q.shape[2], k.shape[2], alignment, q.device)
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1))
    return torch.matmul(probs, v), lse


def torch_reference(q, k, v, scale=None, causal=False, alignment="top_left", *,
                    compute_dtype=torch.float64):
    """Attention forward: ``(out, lse)`` as float32, lse shaped (b, h_q, s_q), natural log."""
    scale = default_scale(q.shape[-1]) if scale is None else scale
    with torch.no_grad():
        out, lse = _attention(*(t.detach().to(compute_dtype) for t in (q, k, v)),
                              scale, causal, alignment)
    return out.float(), lse.float()


def torch_reference_grads(q, k, v, grad_out, scale=None, causal=False, alignment="top_left",
                          *, compute_dtype=torch.float64):
    """Attention backward through torch.autograd on high-precision copies:
    ``(grad_q, grad_k, grad_v)`` as float32 (GQA gradients summed over each group)."""
    scale = default_scale(q.shape[-1]) if scale is None else scale
    leaves = [t.detach().to(compute_dtype).requires_grad_() for t in (q, k, v)]
    with torch.enable_grad():
        out, _ = _attention(*leaves, scale, causal, alignment)
        grads = torch.autograd.grad(out, leaves, grad_out.detach().to(compute_dtype))
    return tuple(g.float() for g in grads)


def torch_reference_all(q, k, v, grad_out, scale=None, causal=False, alignment="top_left", *,
                        compute_dtype=torch.float64):
    """Forward and backward in one pass: ``(out, lse, (grad_q, grad_k, grad_v))`` as float32."""
    scale = default_scale(q.shape[-1]) if scale is None else scale
    leaves = [t.detach().to(compute_dtype).requires_grad_() for t in (q, k, v)]
    with torch.enable_grad():
        out, lse = _attention(*leaves, scale, causal, alignment)
        grads = torch.autograd.grad(out, leaves, grad_out.detach().to(compute_dtype))
    return out.detach().float(), lse.detach().float(), tuple(g.float() for g in grads)
