"""High-precision attention reference in torch (runs on the tensors' device).

Computes in float64 by default (float32 or better, as the tests need, and never TF32),
with an explicit causal mask and explicit GQA head mapping: query head ``i`` reads
key/value head ``i // (h_q // h_kv)`` (``repeat_interleave`` on the head axis), the
mapping of torch's ``enable_gqa`` and of cuDNN. Results are returned as float32.

Masks: causal in either alignment, a window ``(left, right)`` and padding lengths, with the
rule of ``stridedfa.reference.visible_mask``. Rows that see no key give out = 0, lse = -inf and
zero gradients (stridedfa's documented values).
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


def visible(b, s_q, s_kv, causal, alignment, window=None, seqlens_q=None, seqlens_kv=None, device="cuda"):
    """Boolean (b, 1, s_q, s_kv) mask, True where query i sees key j: i + off - left <= j <=
    i + off + right (off = 0 top-left, s_kv - s_q bottom-right, per sequence with padding lengths),
    causal capping right at 0, keys and rows past the lengths excluded."""
    lq = torch.full((b,), s_q, device=device) if seqlens_q is None else seqlens_q.to(device).long()
    lkv = torch.full((b,), s_kv, device=device) if seqlens_kv is None else seqlens_kv.to(device).long()
    i = torch.arange(s_q, device=device)[None, :, None]
    j = torch.arange(s_kv, device=device)[None, None, :]
    off = (lkv - lq)[:, None, None] if alignment == "bottom_right" else torch.zeros((b, 1, 1), device=device)
    left, right = (None, None) if window is None else window
    if causal:
        right = 0 if right is None else min(right, 0)
    mask = (j < lkv[:, None, None]) & (i < lq[:, None, None])
    if right is not None:
        mask &= j <= i + off + right
    if left is not None:
        mask &= j >= i + off - left
    return mask[:, None]


def _attention(q, k, v, scale, causal, alignment, window=None, seqlens_q=None, seqlens_kv=None, softcap=None,
               sinks=None, bias=None, alibi_slopes=None):
    h_q, h_kv = q.shape[1], k.shape[1]
    if h_q % h_kv:
        raise ValueError(f"h_q={h_q} is not a multiple of h_kv={h_kv}")
    group = h_q // h_kv
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:  # after the cap, broadcast from its own shape
        scores = scores + bias
    if alibi_slopes is not None:
        scores = scores - alibi_slopes.to(scores.dtype)[None, :, None, None] * _alibi_distance(
            q.shape[0], q.shape[2], k.shape[2], alignment, seqlens_q, seqlens_kv, scores)
    if sinks is not None:
        return _with_sinks(scores, v, sinks, causal, alignment, window, seqlens_q, seqlens_kv)
    if not (causal or window is not None or seqlens_q is not None or seqlens_kv is not None):
        lse = torch.logsumexp(scores, dim=-1)
        return torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), v), lse
    mask = visible(q.shape[0], q.shape[2], k.shape[2], causal, alignment, window, seqlens_q, seqlens_kv,
                   q.device)
    # A row that sees no key: scores made finite (so no NaN reaches the gradients), then zeroed.
    empty = ~mask.any(dim=-1, keepdim=True)
    scores = scores.masked_fill(~mask, float("-inf")).masked_fill(empty, 0.0)
    probs = torch.softmax(scores, dim=-1) * (~empty)
    lse = torch.logsumexp(scores, dim=-1).masked_fill(empty[..., 0], float("-inf"))
    return torch.matmul(probs, v), lse


def _alibi_distance(b, s_q, s_kv, alignment, seqlens_q, seqlens_kv, like):
    """|i + off - j| as (b, 1, s_q, s_kv): off = 0 top-left, the per-sequence s_kv - s_q bottom-right."""
    off = torch.zeros(b, device=like.device, dtype=like.dtype)
    if alignment == "bottom_right":
        def length(given, full):
            return given.to(like) if given is not None else torch.full((b,), full, device=like.device, dtype=like.dtype)
        off = length(seqlens_kv, s_kv) - length(seqlens_q, s_q)
    i = torch.arange(s_q, device=like.device, dtype=like.dtype)[None, :, None]
    j = torch.arange(s_kv, device=like.device, dtype=like.dtype)[None, None, :]
    return (i + off[:, None, None] - j).abs()[:, None]


def _with_sinks(scores, v, sinks, causal, alignment, window, seqlens_q, seqlens_kv):
    """Attention sinks: one more logit per head in each row's softmax, attending to nothing. Rows
    of padding give out 0 and lse -inf (stridedfa's values); tests avoid other rows without keys."""
    b, h, s_q, s_kv = scores.shape
    mask = visible(b, s_q, s_kv, causal, alignment, window, seqlens_q, seqlens_kv, scores.device)
    scores = scores.masked_fill(~mask, float("-inf"))
    sink = sinks.to(scores.dtype)[None, :, None, None].expand(b, h, s_q, 1)
    extended = torch.cat([scores, sink], dim=-1)
    lse = torch.logsumexp(extended, dim=-1)
    probs = torch.exp(extended - lse.unsqueeze(-1))[..., :s_kv]
    padded = torch.zeros((b, 1, s_q), dtype=torch.bool, device=scores.device)
    if seqlens_q is not None:
        padded = torch.arange(s_q, device=scores.device)[None, None, :] >= seqlens_q.to(scores.device)[:, None, None]
    return torch.matmul(probs * ~padded[..., None], v), lse.masked_fill(padded, float("-inf"))


def torch_reference(q, k, v, scale=None, causal=False, alignment="top_left", window=None,
                    seqlens_q=None, seqlens_kv=None, softcap=None, sinks=None, bias=None, alibi_slopes=None, *,
                    compute_dtype=torch.float64):
    """Attention forward: ``(out, lse)`` as float32, lse shaped (b, h_q, s_q), natural log."""
    scale = default_scale(q.shape[-1]) if scale is None else scale
    with torch.no_grad():
        out, lse = _attention(*(t.detach().to(compute_dtype) for t in (q, k, v)),
                              scale, causal, alignment, window, seqlens_q, seqlens_kv, softcap,
                              None if sinks is None else sinks.detach().to(compute_dtype),
                              None if bias is None else bias.detach().to(compute_dtype),
                              None if alibi_slopes is None else alibi_slopes.detach().to(compute_dtype))
    return out.float(), lse.float()


def torch_reference_grads(q, k, v, grad_out, scale=None, causal=False, alignment="top_left",
                          window=None, seqlens_q=None, seqlens_kv=None, softcap=None, *, compute_dtype=torch.float64):
    """Attention backward through torch.autograd on high-precision copies:
    ``(grad_q, grad_k, grad_v)`` as float32 (GQA gradients summed over each group)."""
    scale = default_scale(q.shape[-1]) if scale is None else scale
    leaves = [t.detach().to(compute_dtype).requires_grad_() for t in (q, k, v)]
    with torch.enable_grad():
        out, _ = _attention(*leaves, scale, causal, alignment, window, seqlens_q, seqlens_kv, softcap)
        grads = torch.autograd.grad(out, leaves, grad_out.detach().to(compute_dtype))
    return tuple(g.float() for g in grads)


def torch_reference_all(q, k, v, grad_out, scale=None, causal=False, alignment="top_left", window=None,
                        seqlens_q=None, seqlens_kv=None, softcap=None, sinks=None, bias=None, alibi_slopes=None,
                        *, compute_dtype=torch.float64):
    """Forward and backward in one pass: ``(out, lse, (grad_q, grad_k, grad_v[, grad_sinks][,
    grad_bias]))`` as float32 (grad_sinks when sinks are given, grad_bias of bias' shape when a bias
    is)."""
    scale = default_scale(q.shape[-1]) if scale is None else scale
    leaves = [t.detach().to(compute_dtype).requires_grad_() for t in (q, k, v)]
    sink_leaf = bias_leaf = None
    if sinks is not None:
        sink_leaf = sinks.detach().to(compute_dtype).requires_grad_()
        leaves.append(sink_leaf)
    if bias is not None:
        bias_leaf = bias.detach().to(compute_dtype).requires_grad_()
        leaves.append(bias_leaf)
    with torch.enable_grad():
        out, lse = _attention(*leaves[:3], scale, causal, alignment, window, seqlens_q, seqlens_kv, softcap,
                              sink_leaf, bias_leaf,
                              None if alibi_slopes is None else alibi_slopes.detach().to(compute_dtype))
        grads = torch.autograd.grad(out, leaves, grad_out.detach().to(compute_dtype))
    return out.detach().float(), lse.detach().float(), tuple(g.float() for g in grads)
