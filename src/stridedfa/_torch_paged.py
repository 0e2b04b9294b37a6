"""stridedfa.torch's paged-KV-cache attention (serving): its operator (torch.library.custom_op) with
its fake kernel, and attention_with_kvcache, which appends new keys and values into the cache at
each sequence's length and attends in the same call. Importing this module registers
torch.ops.stridedfa.paged_forward.

Axes are stridedfa's logical ones everywhere: q (b, h_q, s_q, d), caches (num_blocks, h_kv,
block_size, d) at any valid strides -- a FlashAttention/vLLM (num_blocks, block_size, h_kv, d)
cache is passed as ``cache.transpose(1, 2)``, no copy.
"""

from __future__ import annotations

import torch

from stridedfa import _core
from stridedfa._torch_ops import _bounds, _raw, _stream, _window, _workspace


def _out_like(q: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    # (b, h_q, s_q, d_v) over (b, s_q, h_q, d_v) memory: what a decode step's next projection reads
    b, h, s, _ = q.shape
    return torch.empty((b, s, h, v_cache.shape[3]), dtype=q.dtype, device=q.device).transpose(1, 2)


@torch.library.custom_op("stridedfa::paged_forward", mutates_args=())
def paged_forward(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                  seqlens_kv: torch.Tensor, scale: float | None, causal: bool, causal_alignment: str,
                  window_left: int, window_right: int, softcap: float | None) -> torch.Tensor:
    """out of attention from q over the paged caches (forward only)."""
    out = _out_like(q, v_cache)
    _core._forward(_raw(q), _raw(k_cache), _raw(v_cache), out, None, scale, causal, causal_alignment, _stream(q),
                   _workspace, _window(window_left, window_right), softcap, None, seqlens_kv,
                   block_table=block_table)
    return out


@paged_forward.register_fake
def _(q, k_cache, v_cache, block_table, seqlens_kv, scale, causal, causal_alignment, window_left, window_right,
      softcap):
    return _out_like(q, v_cache)


def _append(cache: torch.Tensor, new: torch.Tensor, block_table: torch.Tensor, cache_seqlens: torch.Tensor):
    """Writes new (b, h, s_new, d) into the cache at positions cache_seqlens[b] + i, in place, on the
    device. Positions beyond the table and ids beyond the cache are clamped into them (the
    caller's contract; nothing outside the cache is written, no device assert)."""
    s_new, block_size = new.shape[2], cache.shape[2]
    positions = cache_seqlens.long()[:, None] + torch.arange(s_new, device=new.device)
    columns = (positions // block_size).clamp(0, block_table.shape[1] - 1)
    blocks = block_table.long().gather(1, columns).clamp(0, cache.shape[0] - 1)
    cache[blocks, :, positions % block_size] = new.permute(0, 2, 1, 3).to(cache.dtype)


def attention_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_table: torch.Tensor, cache_seqlens: torch.Tensor, k: torch.Tensor | None = None,
                           v: torch.Tensor | None = None, *, scale: float | None = None, causal: bool = True,
                           causal_alignment: str = "bottom_right",
                           window: tuple[int | None, int | None] | None = None, softcap: float | None = None):
    """Attention over a paged KV cache, appending new keys and values first (FlashAttention's
    ``flash_attn_with_kvcache`` with a ``block_table``; forward only, for serving).

    Args:
        q: (b, h_q, s_q, d) queries (decode: s_q = 1; chunked prefill: more), any valid strides.
        k_cache, v_cache: (num_blocks, h_kv, block_size, d) caches at any valid strides, e.g.
            views of one (num_blocks, 2, block_size, h_kv, d) allocation
            (``cache[:, 0].transpose(1, 2)``); written in place when k and v are given.
        block_table: int32 (b, blocks per sequence): sequence b's i-th block is
            ``k_cache[block_table[b, i]]``. Read on the device; ids outside the cache are clamped
            into it (nothing outside is read or written).
        cache_seqlens: int32 (b,) tokens already cached per sequence (not updated here, as in
            FlashAttention: the caller advances it).
        k, v: optional (b, h_kv, s_new, d) new keys and values, written at positions
            cache_seqlens[b] .. + s_new before attending (no host synchronisation).
        scale, causal, causal_alignment, window, softcap: as in :func:`stridedfa.torch.attention`;
            the default causal bottom-right aligns each query block with the end of its cache.

    Returns:
        out (b, h_q, s_q, d) over (b, s_q, h_q, d) memory.
    """
    if (k is None) != (v is None):
        raise ValueError("attention_with_kvcache appends keys and values together: give both k and v, or neither")
    seqlens = cache_seqlens
    if k is not None and v is not None:
        _append(k_cache, k, block_table, cache_seqlens)
        _append(v_cache, v, block_table, cache_seqlens)
        seqlens = (cache_seqlens + k.shape[2]).to(torch.int32)
    left, right = _bounds(window) if window is not None else (-1, -1)
    return paged_forward(q, k_cache, v_cache, block_table, seqlens, scale, bool(causal), causal_alignment, left,
                         right, softcap)
