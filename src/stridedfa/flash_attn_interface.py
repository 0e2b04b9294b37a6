"""FlashAttention 2's Python interface on stridedfa's cuDNN kernels (torch).

A drop-in for code that calls FlashAttention::

    from stridedfa.flash_attn_interface import flash_attn_func, flash_attn_varlen_func
    out = flash_attn_func(q, k, v, causal=True)        # q, k, v (batch, seqlen, nheads, headdim)

Every function keeps FlashAttention 2's signature, argument meanings and return conventions:
bshd tensors (THD for the varlen functions), ``softmax_scale`` (default ``headdim ** -0.5``),
``causal`` aligned bottom-right (query i sees keys j <= i + seqlen_k - seqlen_q),
``window_size=(left, right)`` with -1 unbounded, ``softcap`` 0.0 for none, ``alibi_slopes`` (nheads,)
or (batch, nheads) float32 (any values; per-sequence slopes run one call per sequence),
``dropout_p``, ``deterministic`` (the backward), and ``return_attn_probs`` /
``return_softmax_lse`` returning the float32 log-sum-exp ((batch, nheads, seqlen_q), or (nheads,
total_q) for varlen). They run on :mod:`stridedfa.torch`: inputs are read
in place at their strides, the packed functions' gradients land in one buffer of the packed input's
shape, and head dims that are not a multiple of 8 are zero-padded as FlashAttention's wrapper does.

Where stridedfa differs, it says so by name rather than guessing: ``S_dmask`` (FlashAttention's
dropout pattern for its own tests) is returned as None; ALiBi with ``cache_leftpad`` and
``cache_leftpad`` with ``block_table`` raise :class:`stridedfa.UnsupportedError`. ALiBi in the
varlen functions runs on padded copies of the sequences (the variable-length kernels take no
ALiBi); ALiBi aligned per sequence runs each sequence back to front (the core takes ALiBi with
padding lengths only top-left). With a ``block_table``, ALiBi and the LSE in
``flash_attn_with_kvcache``, and every ``flash_attn_varlen_func`` call, run on a dense copy of
each sequence's pages. ``num_splits`` is a scheduling hint that cuDNN's kernels do not take and
is ignored. The LSE is the log-sum-exp of the scores as defined (-inf for a row that sees no key,
where FlashAttention returns +inf); with causal ALiBi FlashAttention's kernel adds slope * j
instead of subtracting slope * |i + L_k - L_q - j| (the same softmax), so its LSE is ours plus
slope * (i + L_k - L_q).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import stridedfa.torch as _st
from stridedfa._errors import BoundsError, LayoutError, UnsupportedError
from stridedfa._torch_paged import append_slots, append_tokens
from stridedfa._torch_varlen import cut_rows

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
]


# --- Argument mapping -----------------------------------------------------------------------------

def _window(window_size) -> tuple[int | None, int | None] | None:
    """FlashAttention's (left, right), -1 unbounded, as stridedfa's window (None unbounded)."""
    left, right = window_size
    if left < 0 and right < 0:
        return None
    return (None if left < 0 else int(left), None if right < 0 else int(right))


def _options(head_dim: int, dropout_p, softmax_scale, causal, window_size, softcap, deterministic) -> dict:
    """The options every function shares, as stridedfa.torch's keyword arguments. The scale is
    taken from the head dim before any padding (FlashAttention's wrapper does the same)."""
    return {"scale": head_dim ** -0.5 if softmax_scale is None else float(softmax_scale), "causal": bool(causal),
            "causal_alignment": "bottom_right", "window": _window(window_size),
            "softcap": float(softcap) if softcap else None, "dropout_p": float(dropout_p),
            "deterministic": bool(deterministic)}


def _alibi(alibi_slopes, batch: int | None = None):
    """FlashAttention's slopes: (nheads,) for the batch, or (batch, nheads) one set per sequence."""
    if alibi_slopes is None or alibi_slopes.dim() == 1:
        return alibi_slopes
    if alibi_slopes.dim() != 2 or (batch is not None and alibi_slopes.shape[0] != batch):
        raise UnsupportedError(f"alibi_slopes: FlashAttention's slopes are (nheads,) or (batch, nheads) with "
                               f"batch = {batch}; got shape {tuple(alibi_slopes.shape)}")
    return alibi_slopes


def _attend(q, k, v, alibi_slopes, return_lse: bool, **options):
    """stridedfa.torch.attention on (batch, nheads, seqlen, headdim) views with FlashAttention's
    slopes. The kernels take one set of slopes per call: per-sequence slopes (batch, nheads) run
    one call per sequence (padding lengths cut to it), concatenated in bshd memory."""
    slopes = _alibi(alibi_slopes, q.shape[0])
    if slopes is None or slopes.dim() == 1:
        return _st.attention(q, k, v, alibi_slopes=slopes, return_lse=return_lse, **options)
    lengths = ("seqlens_q", "seqlens_kv")
    rows = [_st.attention(q[i:i + 1], k[i:i + 1], v[i:i + 1], alibi_slopes=slopes[i], return_lse=True,
                          **{name: value[i:i + 1] if name in lengths and value is not None else value
                             for name, value in options.items()})
            for i in range(q.shape[0])]
    out = torch.cat([row[0].transpose(1, 2) for row in rows]).transpose(1, 2)
    return (out, torch.cat([row[1] for row in rows])) if return_lse else out


def _check_index(name: str, t: torch.Tensor, length: int, like: torch.Tensor) -> None:
    """An int32 (length,) tensor on like's device, as FlashAttention takes its per-sequence
    indices: those read here by torch ops, never by the core's validation, are checked here."""
    if t.dtype != torch.int32 or t.dim() != 1 or t.shape[0] != length or t.device != like.device:
        raise LayoutError(f"{name} must be an int32 ({length},) tensor on {like.device}; got {t.dtype} "
                          f"{tuple(t.shape)} on {t.device}")


def _pad_head_dim(t: torch.Tensor) -> torch.Tensor:
    """Zero-pads the last axis to a multiple of 8 (cuDNN needs 16-byte rows), as FlashAttention's
    wrapper does; a copy only where the head dim needs it."""
    rem = t.shape[-1] % 8
    return t if rem == 0 else F.pad(t, [0, 8 - rem])


def _unpad(out: torch.Tensor, head_dim: int) -> torch.Tensor:
    return out if out.shape[-1] == head_dim else out[..., :head_dim]


def _cut(result, head_dim: int):
    """A KV-cache call's out (or (out, lse)) with the head dim's padding cut off."""
    return (_unpad(result[0], head_dim), *result[1:]) if isinstance(result, tuple) else _unpad(result, head_dim)


def _returned(result, head_dim: int, return_lse: bool, transpose: bool = False):
    """FlashAttention's return: out (bshd for the dense call: `transpose` from stridedfa's bhsd
    axes) with its padding cut off, or (out, softmax_lse, None) when the LSE was asked for."""
    out, lse = result if return_lse else (result, None)
    out = _unpad(out.transpose(1, 2) if transpose else out, head_dim)
    return (out, lse, None) if return_lse else out


# --- Dense (batch, seqlen, nheads, headdim) -------------------------------------------------------

def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """out = attention(q, k, v): q (batch, seqlen_q, nheads, headdim), k and v (batch, seqlen_k,
    nheads_k, headdim) with nheads a multiple of nheads_k (GQA/MQA). Returns out (batch, seqlen_q,
    nheads, headdim), or (out, softmax_lse (batch, nheads, seqlen_q), None) with return_attn_probs."""
    head_dim = v.shape[-1]
    opts = _options(q.shape[-1], dropout_p, softmax_scale, causal, window_size, softcap, deterministic)
    q, k, v = (_pad_head_dim(t).transpose(1, 2) for t in (q, k, v))
    result = _attend(q, k, v, alibi_slopes, return_attn_probs, **opts)
    return _returned(result, head_dim, return_attn_probs, transpose=True)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_func on qkv (batch, seqlen, 3, nheads, headdim), read in place; its gradient is one
    tensor of qkv's shape."""
    if alibi_slopes is not None and alibi_slopes.dim() == 2:  # per sequence: no packed gradient buffer to keep
        return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale, causal,
                               window_size, softcap, alibi_slopes, deterministic, return_attn_probs)
    head_dim = qkv.shape[-1]
    opts = _options(head_dim, dropout_p, softmax_scale, causal, window_size, softcap, deterministic)
    result = _st.packed_attention(_pad_head_dim(qkv), 2, layout="bshd", alibi_slopes=_alibi(alibi_slopes),
                                  return_lse=return_attn_probs, **opts)
    return _returned(result, head_dim, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_func on q (batch, seqlen_q, nheads, headdim) and kv (batch, seqlen_k, 2, nheads_k,
    headdim), read in place; kv's gradient is one tensor of its shape."""
    if alibi_slopes is not None and alibi_slopes.dim() == 2:  # per sequence: no packed gradient buffer to keep
        return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal, window_size, softcap,
                               alibi_slopes, deterministic, return_attn_probs)
    head_dim = kv.shape[-1]
    opts = _options(q.shape[-1], dropout_p, softmax_scale, causal, window_size, softcap, deterministic)
    result = _st.packed_attention(_pad_head_dim(kv), 2, layout="bshd", q=_pad_head_dim(q),
                                  alibi_slopes=_alibi(alibi_slopes), return_lse=return_attn_probs, **opts)
    return _returned(result, head_dim, return_attn_probs)


# --- Variable length (total_tokens, nheads, headdim) + cu_seqlens ------------------------------------

def _slots(cu_seqlens, total: int, max_seqlen: int, batch: int):
    """Each token's (sequence, position) in a padded (batch + 1, max_seqlen) layout, each sequence
    stored back to front (see _reversed_alibi): tokens in no sequence, or past max_seqlen (a
    broken promise), go to the spare row ``batch``."""
    tokens = torch.arange(total, device=cu_seqlens.device)
    cu = cu_seqlens.long()
    sequence = torch.searchsorted(cu[1:], tokens, right=True)
    at = sequence.clamp(max=batch - 1)
    position = tokens - cu[at]
    spare = (sequence >= batch) | (position >= max_seqlen) | (position < 0)
    length = (cu[at + 1] - cu[at]).clamp(max=max_seqlen)
    return sequence.masked_fill(spare, batch), (length - 1 - position).masked_fill(spare, 0)


def _reversed_alibi(opts: dict) -> dict:
    """The options for sequences stored back to front. FlashAttention aligns ALiBi's distance
    (i + L_k - L_q - j) and its masks bottom-right, per sequence; the core takes ALiBi with padding
    lengths only top-left. Reversing each sequence's queries (i' = L_q - 1 - i) and keys
    (j' = L_k - 1 - j) makes that distance j' - i', top-left, and the window (left, right) --
    causal: right = 0 -- becomes (right, left)."""
    left, right = opts["window"] or (None, None)
    if opts["causal"]:
        right = 0
    flipped = (right, left)
    return dict(opts, causal=False, causal_alignment="top_left", window=None if flipped == (None, None) else flipped)


def _reverse(t: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Each sequence's first lengths[b] entries along axis 2 of (b, h, s[, d]) back to front (a
    differentiable gather; its own inverse); the entries after them stay."""
    position = torch.arange(t.shape[2], device=t.device)
    length = lengths.long().clamp(0, t.shape[2])[:, None]
    index = torch.where(position < length, length - 1 - position, position)
    index = index[:, None, :, None] if t.dim() == 4 else index[:, None, :]
    return t.gather(2, index.expand(t.shape))


def _varlen_with_alibi(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, return_lse,
                       opts, padded_kv=None):
    """Variable-length attention with ALiBi (which the variable-length kernels do not take): the
    sequences are copied back to front into padded (batch, max_seqlen, nheads, headdim) tensors,
    attended with padding lengths and the slopes (aligned per sequence, as FlashAttention's, by
    the reversal: _reversed_alibi), and the result gathered back. Costs the copies of q, k, v and
    out at the padded size; differentiable. A sequence longer than max_seqlen (a broken promise) is
    cut to it and aligned to that cut. ``padded_kv``: keys and values already padded
    (batch, max_seqlen_k, nheads_k, headdim), in order (gathered pages), instead of k and v."""
    batch = cu_seqlens_q.shape[0] - 1
    _check_index("cu_seqlens_q", cu_seqlens_q, batch + 1, q)
    _check_index("cu_seqlens_k", cu_seqlens_k, batch + 1, q)
    max_q, max_k = int(max_seqlen_q), int(max_seqlen_k)
    at_q = _slots(cu_seqlens_q, q.shape[0], max_q, batch)

    def padded(t, at, length):
        return t.new_zeros(batch + 1, length, *t.shape[1:]).index_put(at, t)[:batch].transpose(1, 2)

    def lengths(cu, length):
        return (cu[1:] - cu[:-1]).clamp(0, length).to(torch.int32)

    lengths_k = lengths(cu_seqlens_k, max_k)
    if padded_kv is None:
        at_k = _slots(cu_seqlens_k, k.shape[0], max_k, batch)
        keys, values = padded(k, at_k, max_k), padded(v, at_k, max_k)
    else:
        keys, values = (_reverse(t.transpose(1, 2), lengths_k) for t in padded_kv)
    out, lse = _attend(padded(q, at_q, max_q), keys, values, alibi_slopes, True,
                       seqlens_q=lengths(cu_seqlens_q, max_q), seqlens_kv=lengths_k, **_reversed_alibi(opts))
    out = torch.cat([out.transpose(1, 2), out.new_zeros(1, max_q, *out.shape[1:2], out.shape[3])])[at_q]
    if not return_lse:
        return out
    lse = torch.cat([lse.transpose(1, 2), lse.new_full((1, max_q, lse.shape[1]), float("-inf"))])[at_q]
    return out, lse.t()


def _varlen_paged(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table,
                  alibi_slopes, return_lse, opts):
    """flash_attn_varlen_func over a paged cache (FlashAttention's block_table): sequence b's keys
    are the first cu_seqlens_k[b + 1] - cu_seqlens_k[b] tokens of its pages. The pages that can
    hold max_seqlen_k keys are gathered into a (batch, blocks * page_block_size) copy (head dim
    padded there, not in the whole pool), each row cut into its keys and the unused tail
    (_torch_varlen.cut_rows), and attended on the variable-length path with the packed queries,
    each row's queries aligned to the end of its keys. Costs that copy of the sequences' pages."""
    batch = cu_seqlens_q.shape[0] - 1
    if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != batch:
        raise LayoutError(f"block_table must be an int32 (batch = {batch}, blocks per sequence) tensor; got "
                          f"{block_table.dtype} {tuple(block_table.shape)}")
    page = k_cache.shape[1]
    blocks = block_table.shape[1]
    if max_seqlen_k is not None and int(max_seqlen_k) > 0:  # tables sized for the longest context
        blocks = min(blocks, -(-int(max_seqlen_k) // page))
    capacity = blocks * page
    keys, values = (_pad_head_dim(t) for t in _gathered_pages(k_cache, v_cache, block_table[:, :blocks]))
    if alibi_slopes is not None:  # (it checks the cu_seqlens)
        return _varlen_with_alibi(q, None, None, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, capacity, alibi_slopes,
                                  return_lse, opts, padded_kv=(keys, values))
    _check_index("cu_seqlens_q", cu_seqlens_q, batch + 1, q)
    _check_index("cu_seqlens_k", cu_seqlens_k, batch + 1, q)
    cu_k = cu_seqlens_k.long()
    cu_kv_rows = cut_rows(torch.zeros_like(cu_k[1:]), (cu_k[1:] - cu_k[:-1]).clamp(0, capacity), capacity)
    cu_q = cu_seqlens_q.long()
    cu_q_rows = torch.cat([cu_q[:1], torch.stack([cu_q[:-1], cu_q[1:], cu_q[1:]], dim=1).reshape(-1)])
    tokens = [t.reshape(batch * capacity, *t.shape[2:]) for t in (keys, values)]
    return _st.varlen_attention(q, *tokens, cu_q_rows.to(torch.int32), cu_kv_rows, int(max_seqlen_q), capacity,
                                return_lse=return_lse, **opts)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """Attention over sequences packed along the token axis: q (total_q, nheads, headdim), k and v
    (total_k, nheads_k, headdim), int32 cu_seqlens (batch + 1,) on the device (read there only: no
    host synchronisation), max_seqlen_* Python ints. With ``block_table`` (int32 (batch, blocks per
    sequence)) k and v are paged caches (num_blocks, page_block_size, nheads_k, headdim) and sequence
    b's keys are the first cu_seqlens_k[b + 1] - cu_seqlens_k[b] tokens of its pages (gathered into
    a copy per call: _varlen_paged). Returns out (total_q, nheads, headdim), or (out, softmax_lse
    (nheads, total_q), None)."""
    head_dim = v.shape[-1]
    opts = _options(q.shape[-1], dropout_p, softmax_scale, causal, window_size, softcap, deterministic)
    if block_table is not None:  # k and v are paged caches (num_blocks, page_block_size, nheads_k, headdim)
        result = _varlen_paged(_pad_head_dim(q), k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               block_table, alibi_slopes, return_attn_probs, opts)
        return _returned(result, head_dim, return_attn_probs)
    if alibi_slopes is not None:
        result = _varlen_with_alibi(_pad_head_dim(q), _pad_head_dim(k), _pad_head_dim(v), cu_seqlens_q, cu_seqlens_k,
                                    max_seqlen_q, max_seqlen_k, alibi_slopes, return_attn_probs, opts)
        return _returned(result, head_dim, return_attn_probs)
    result = _st.varlen_attention(_pad_head_dim(q), _pad_head_dim(k), _pad_head_dim(v), cu_seqlens_q, cu_seqlens_k,
                                  int(max_seqlen_q), int(max_seqlen_k), return_lse=return_attn_probs, **opts)
    return _returned(result, head_dim, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """flash_attn_varlen_func on qkv (total, 3, nheads, headdim), read in place; its gradient is one
    tensor of qkv's shape."""
    if alibi_slopes is not None:  # the padded copies: no packed gradient buffer to keep
        return flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                      dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                      deterministic, return_attn_probs)
    head_dim = qkv.shape[-1]
    opts = _options(head_dim, dropout_p, softmax_scale, causal, window_size, softcap, deterministic)
    result = _st.varlen_packed_attention(_pad_head_dim(qkv), 1, cu_seqlens, None, int(max_seqlen),
                                         return_lse=return_attn_probs, **opts)
    return _returned(result, head_dim, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_varlen_func on q (total_q, nheads, headdim) and kv (total_k, 2, nheads_k, headdim),
    read in place; kv's gradient is one tensor of its shape."""
    if alibi_slopes is not None:  # the padded copies: no packed gradient buffer to keep
        return flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                      dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                      deterministic, return_attn_probs)
    head_dim = kv.shape[-1]
    opts = _options(q.shape[-1], dropout_p, softmax_scale, causal, window_size, softcap, deterministic)
    result = _st.varlen_packed_attention(_pad_head_dim(kv), 1, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                                         int(max_seqlen_k), q=_pad_head_dim(q), return_lse=return_attn_probs, **opts)
    return _returned(result, head_dim, return_attn_probs)


# --- KV cache (serving) ---------------------------------------------------------------------------

def _rotate(x, cos, sin, positions, interleaved: bool):
    """FlashAttention's rotary embedding of x (batch, seqlen, nheads, headdim) at positions (batch,
    seqlen): the first 2 * cos.shape[1] channels rotated (pairs (0, 1), (2, 3), ... when
    interleaved, GPT-J; the two halves otherwise, GPT-NeoX), the rest unchanged; in float32."""
    half = cos.shape[1]
    c, s = cos[positions][:, :, None].float(), sin[positions][:, :, None].float()  # (b, seqlen, 1, half)
    rot = x[..., :2 * half].float()
    if interleaved:
        x0, x1 = rot[..., 0::2], rot[..., 1::2]
        rotated = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)
    else:
        x0, x1 = rot[..., :half], rot[..., half:]
        rotated = torch.cat((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., 2 * half:]), dim=-1)


def _positions(start, length: int, seqlen_ro: int):
    return (start.long()[:, None] + torch.arange(length, device=start.device)).clamp(max=seqlen_ro - 1)


def _check_paged_bounds(block_table, cache_seqlens, appended: int, page_block_size: int) -> None:
    """FlashAttention's contract on a paged cache: the cached plus appended tokens of every sequence
    fit in its row of block_table, else a RuntimeError naming block_table (stridedfa.BoundsError is
    one). Reading the lengths costs one device-to-host copy (a synchronisation) per call; inside a
    CUDA-graph capture or torch.compile nothing can be read, and the core clamps there instead."""
    if torch.compiler.is_compiling() or cache_seqlens.device.type == "meta" or (
            cache_seqlens.is_cuda and torch.cuda.is_current_stream_capturing()):
        return
    capacity = block_table.shape[1] * page_block_size
    longest = int(cache_seqlens.max()) + appended if cache_seqlens.numel() else 0
    if longest > capacity:
        raise BoundsError(f"block_table: cache_seqlens plus the {appended} new tokens reach {longest} tokens, more "
                          f"than the {capacity} a row of block_table holds ({block_table.shape[1]} blocks of "
                          f"{page_block_size}); give each sequence enough blocks before appending")


def _widened_cache(cache: torch.Tensor) -> torch.Tensor | None:
    """A (..., d) cache whose d is not a multiple of 8 as a (..., next multiple of 8) view of the same
    memory, when its rows are that far apart and 16-byte aligned (e.g. allocated (..., 64) and sliced
    to 59): cuDNN then reads whole rows, whose extra columns meet q's zero padding (keys) or are cut
    off the output (values), so they must hold finite numbers. None where the memory has no room."""
    d = cache.shape[-1]
    width = -(-d // 8) * 8
    if cache.stride(-1) != 1 or cache.storage_offset() % 8:
        return None
    outer = [stride for n, stride in zip(cache.shape[:-1], cache.stride()[:-1]) if n > 1]
    if any(stride < width or stride % 8 for stride in outer):
        return None
    last = cache.storage_offset() + sum((n - 1) * st for n, st in zip(cache.shape, cache.stride())) + width - d
    if last >= cache.untyped_storage().nbytes() // cache.element_size():
        return None
    return cache.as_strided((*cache.shape[:-1], width), cache.stride())


def _readable_caches(k_cache, v_cache, head_dim: int):
    """The caches cuDNN reads for a head dim that is not a multiple of 8: widened views, or a
    LayoutError saying how to allocate a cache that needs no copy."""
    widened = (_widened_cache(k_cache), _widened_cache(v_cache))
    if widened[0] is None or widened[1] is None:
        width = -(-head_dim // 8) * 8
        raise LayoutError(f"k_cache / v_cache: head_dim {head_dim} rows cannot be read with 16-byte loads, and copying "
                          f"the whole cache on every call would defeat it. Allocate the cache with rows of {width} "
                          f"elements and pass its first {head_dim} columns, e.g. torch.zeros(..., {width})"
                          f"[..., :{head_dim}]: stridedfa then reads the padded rows in place (keep the extra "
                          "columns finite, e.g. zeros).")
    return widened


def _gathered_pages(k_cache, v_cache, block_table):
    """Each sequence's pages of (num_blocks, page_block_size, nheads_k, headdim) caches as dense
    (batch, blocks * page_block_size, nheads_k, headdim) copies; ids outside the caches clamped into
    them (the caller's contract; nothing outside is read)."""
    table = block_table.long().clamp(0, min(k_cache.shape[0], v_cache.shape[0]) - 1)
    return tuple(cache[table].flatten(1, 2) for cache in (k_cache, v_cache))


def _paged_gathered(q, k_cache, v_cache, k, v, block_table, cache_seqlens, alibi_slopes, return_lse, opts):
    """A paged cache with what the paged kernels do not take (ALiBi, the LSE): the new keys and
    values appended into their pages as the paged path appends them, then each sequence's pages
    gathered into a dense (batch, blocks * page_block_size, nheads_k, headdim) copy and attended
    with padding lengths. Costs that copy of the sequences' pages per call."""
    capacity = block_table.shape[1] * k_cache.shape[1]
    lengths = cache_seqlens
    if k is not None:
        slots = append_slots(block_table, cache_seqlens, k.shape[1], k_cache.shape[1],
                              min(k_cache.shape[0], v_cache.shape[0]))
        append_tokens(k_cache.transpose(1, 2), k.transpose(1, 2), slots)
        append_tokens(v_cache.transpose(1, 2), v.transpose(1, 2), slots)
        lengths = cache_seqlens + k.shape[1]
    keys, values = _gathered_pages(k_cache, v_cache, block_table)
    return _cache_attend(q, keys, values, lengths.clamp(max=capacity).to(torch.int32), alibi_slopes, return_lse,
                         opts)


def _cache_attend(q, keys, values, lengths, alibi_slopes, return_lse, opts):
    """q (b, s_q, h, d) over the first lengths[b] keys of (b, s_k, h_k, d) caches (all of them when
    lengths is None), FlashAttention's return. With ALiBi and lengths, whose distance is aligned to
    each sequence's end, the queries and each sequence's keys are attended back to front
    (_reversed_alibi): a copy of the keys and values."""
    q, keys, values = q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
    if alibi_slopes is None or lengths is None:
        result = _attend(q, keys, values, alibi_slopes, return_lse, seqlens_kv=lengths, **opts)
    else:
        result = _attend(q.flip(2), _reverse(keys, lengths), _reverse(values, lengths), alibi_slopes, return_lse,
                         seqlens_kv=lengths, **_reversed_alibi(opts))
        result = tuple(t.flip(2) for t in result) if return_lse else result.flip(2)
    if return_lse:
        return result[0].transpose(1, 2), result[1]
    return result.transpose(1, 2)


def _left_padded(q, keys, values, leftpad, lengths, return_lse, opts):
    """Attention over caches whose keys start at ``leftpad`` (FlashAttention's cache_leftpad):
    each row's keys [leftpad, lengths) with its queries aligned to their end, as in FlashAttention
    (positions, causality, windows and rotary stay absolute). Run on the variable-length path,
    each cache row cut into three sequences -- the padding, the keys, the unused tail -- paired
    with no queries, the row's queries and none."""
    batch, seqlen_q, heads, _ = q.shape
    capacity = keys.shape[1]
    start = leftpad.long().clamp(0, capacity)
    cu_kv = cut_rows(start, torch.maximum(lengths.long(), start) - start, capacity)
    cu_q = cut_rows(torch.zeros_like(start), torch.full_like(start, seqlen_q), seqlen_q)
    tokens = [t.reshape(t.shape[0] * t.shape[1], *t.shape[2:]) for t in (q, keys, values)]
    out, lse = _st.varlen_attention(*tokens, cu_q, cu_kv, seqlen_q, capacity, return_lse=True, **opts)
    out = out.view(batch, seqlen_q, heads, -1)
    if return_lse:  # (h, b * s_q) -> FlashAttention's (b, h, s_q)
        return out, lse.view(heads, batch, seqlen_q).transpose(0, 1)
    return out


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """Attention of q (batch, seqlen_q, nheads, headdim) over a KV cache, after appending new keys
    and values in place (FlashAttention's decode and chunked-prefill call).

    The cache is (batch_cache, seqlen_cache, nheads_k, headdim), or with ``block_table`` (batch,
    blocks per sequence, int32) a paged (num_blocks, page_block_size, nheads_k, headdim) cache.
    ``cache_seqlens`` (int or int32 (batch,)) says how many tokens each sequence has cached (None:
    all seqlen_cache); new ``k``/``v`` (batch, seqlen_new, nheads_k, headdim) are written there and
    attended to (cache_seqlens itself is not advanced, as in FlashAttention). ``cache_leftpad``
    (int32 (batch,)): where each row's keys begin; the keys before it are not attended to (not
    with block_table or alibi_slopes). ``rotary_cos`` /
    ``rotary_sin`` (seqlen_ro, rotary_dim / 2) rotate the new k at its positions and q at its
    positions (causal or windowed) or at cache_seqlens (otherwise), interleaved (GPT-J) or not
    (GPT-NeoX). ``cache_batch_idx`` (batch,) picks the cache rows (a gather of those rows is
    attended to; not with block_table). Returns out (batch, seqlen_q, nheads, headdim), or
    (out, softmax_lse (batch, nheads, seqlen_q)) with return_softmax_lse.

    As in FlashAttention, cached plus appended tokens beyond a sequence's row of ``block_table``
    raise a RuntimeError naming block_table (:class:`stridedfa.BoundsError`) before anything is
    appended: one device-to-host read of cache_seqlens per paged call. Inside a CUDA-graph capture
    or torch.compile nothing can be read; the core then clamps (``STRIDEDFA_CHECK_BOUNDS=1`` checks
    lengths and block ids in the core too, outside captures). A head dim that is not a multiple of
    8 is read in place from caches allocated with rows of the next multiple of 8 (e.g.
    ``torch.zeros(..., 64)[..., :59]``; the extra columns must stay finite), else refused with how
    to allocate one: copying the whole cache per call is not done.
    """
    del num_splits  # a split-KV scheduling hint: cuDNN's kernels choose their own grid
    if cache_leftpad is not None and block_table is not None:
        raise UnsupportedError("cache_leftpad: not supported with a paged KV cache (block_table), as in "
                               "FlashAttention; leave the left padding out of the pages instead.")
    if cache_leftpad is not None and alibi_slopes is not None:
        raise UnsupportedError("alibi_slopes: not supported together with cache_leftpad (stridedfa runs a "
                               "left-padded cache on its variable-length path, which has no ALiBi yet).")
    if (k is None) != (v is None):
        raise ValueError("flash_attn_with_kvcache appends keys and values together: give both k and v, or neither")
    if block_table is not None and cache_batch_idx is not None:
        raise UnsupportedError("cache_batch_idx: with a block_table, the table already says which blocks each "
                               "sequence reads; pass one or the other.")
    batch, seqlen_q = q.shape[0], q.shape[1]
    if cache_leftpad is not None:  # before anything is appended
        _check_index("cache_leftpad", cache_leftpad, batch, q)
    paged = block_table is not None
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    whole_cache = cache_seqlens is None and k is None  # every row all keys: no lengths to pass
    if cache_seqlens is None:
        cache_seqlens = torch.full((batch,), capacity, dtype=torch.int32, device=q.device)
    elif isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    if rotary_cos is not None:
        seqlen_ro = rotary_cos.shape[0]
        if k is not None:
            k = _rotate(k, rotary_cos, rotary_sin, _positions(cache_seqlens, k.shape[1], seqlen_ro),
                        rotary_interleaved)
        at_each = causal or _window(window_size) is not None
        q = _rotate(q, rotary_cos, rotary_sin, _positions(cache_seqlens, seqlen_q if at_each else 1, seqlen_ro)
                    .expand(batch, seqlen_q), rotary_interleaved)
    if paged:  # before anything is appended
        _check_paged_bounds(block_table, cache_seqlens, 0 if k is None else k.shape[1], k_cache.shape[1])
    opts = _options(q.shape[-1], 0.0, softmax_scale, causal, window_size, softcap, False)
    del opts["dropout_p"], opts["deterministic"]
    head_dim = q.shape[-1]
    if head_dim % 8:  # cuDNN reads 16-byte rows: q and new keys padded (copies), the caches widened in place
        k_cache, v_cache = _readable_caches(k_cache, v_cache, head_dim)
        q = _pad_head_dim(q)
        if k is not None:
            k, v = _pad_head_dim(k), _pad_head_dim(v)
    if paged and (alibi_slopes is not None or return_softmax_lse):
        return _cut(_paged_gathered(q, k_cache, v_cache, k, v, block_table, cache_seqlens, alibi_slopes,
                                    return_softmax_lse, opts), head_dim)
    if paged:
        out = _st.attention_with_kvcache(q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2),
                                         block_table, cache_seqlens, None if k is None else k.transpose(1, 2),
                                         None if v is None else v.transpose(1, 2), **opts)
        return _unpad(out.transpose(1, 2), head_dim)
    rows = (torch.arange(batch, device=q.device) if cache_batch_idx is None else cache_batch_idx.long())
    lengths = None if whole_cache else cache_seqlens.clamp(max=capacity).to(torch.int32)
    if k is not None:
        positions = (cache_seqlens.long()[:, None] + torch.arange(k.shape[1], device=q.device)).clamp(max=capacity - 1)
        k_cache[rows[:, None], positions] = k.to(k_cache.dtype)
        v_cache[rows[:, None], positions] = v.to(v_cache.dtype)
        lengths = (cache_seqlens + k.shape[1]).clamp(max=capacity).to(torch.int32)
    if cache_batch_idx is None:  # the first batch rows of the cache, as views
        keys, values = k_cache[:batch], v_cache[:batch]
    else:
        keys, values = k_cache[rows], v_cache[rows]
    if cache_leftpad is not None:
        return _cut(_left_padded(q, keys, values, cache_leftpad, cache_seqlens if lengths is None else lengths,
                                 return_softmax_lse, opts), head_dim)
    return _cut(_cache_attend(q, keys, values, lengths, alibi_slopes, return_softmax_lse, opts), head_dim)
