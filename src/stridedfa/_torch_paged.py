"""stridedfa.torch's paged-KV-cache attention (serving): its operator (torch.library, with a fake
kernel) and attention_with_kvcache, which appends new keys and values into the cache at each
sequence's length and attends in the same call. Importing this module registers
torch.ops.stridedfa.paged_forward.

Axes are stridedfa's logical ones everywhere: q (b, h_q, s_q, d), caches (num_blocks, h_kv,
block_size, d) at any valid strides -- a FlashAttention/vLLM (num_blocks, block_size, h_kv, d)
cache is passed as ``cache.transpose(1, 2)``, no copy.

A decode step is host-bound at small batches, so an eager call skips the dispatcher, as
attention() does: one C call reads the tensors, allocates out through torch and launches (GPU run
40: the operator through torch.library.custom_op cost 55-64 µs of host time per step against
15-17 µs for attention() on a dense cache).

append_slots / append_tokens are this module's entry points for the FlashAttention interface
(flash_attn_with_kvcache appends the same way over a (num_blocks, block_size, h, d) cache).
"""

from __future__ import annotations

import torch

from stridedfa import _core, _layouts
from stridedfa._torch_ops import (
    _HAS_EXCHANGE_API,
    _bounds,
    _define,
    _forward_alloc,
    _plain_eager,
    _raw,
    _stream,
    _window,
    _workspace,
)


def _out_like(q: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    # dense in q's axis order, as attention()'s out: a decode step's q cut from a (b, s, h, d)
    # projection gives out over (b, s, h, d) memory, what the next projection reads
    shape = (q.shape[0], q.shape[1], q.shape[2], v_cache.shape[3])
    return q.new_empty_strided(shape, _layouts.output_strides(shape, q.stride()))


def _paged_forward_impl(q, k_cache, v_cache, block_table, seqlens_kv, scale, causal, causal_alignment, window_left,
                        window_right, softcap):
    """out of attention from q over the paged caches (forward only)."""
    window = _window(window_left, window_right)
    if _HAS_EXCHANGE_API:  # reading, allocating out and launching in one C call
        return _forward_alloc(q, k_cache, v_cache, scale, causal, causal_alignment, False, False, window, softcap,
                              None, seqlens_kv, block_table=block_table)[0]
    out = _out_like(q, v_cache)
    _core._forward(_raw(q), _raw(k_cache), _raw(v_cache), out, None, scale, causal, causal_alignment, _stream(q),
                   _workspace, window, softcap, None, seqlens_kv, block_table=block_table)
    return out


def _paged_forward_fake(q, k_cache, v_cache, block_table, seqlens_kv, scale, causal, causal_alignment, window_left,
                        window_right, softcap):
    return _out_like(q, v_cache)


paged_forward = _define(
    "paged_forward", "(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, Tensor seqlens_kv, "
    "float? scale, bool causal, str causal_alignment, int window_left, int window_right, float? softcap) -> Tensor",
    _paged_forward_impl, _paged_forward_fake)


def append_slots(block_table: torch.Tensor, cache_seqlens: torch.Tensor, s_new: int, block_size: int,
                  num_blocks: int):
    """(block ids, offsets in the block), each (b, s_new): where the new tokens cache_seqlens[b] + i
    go, computed on the device. Positions beyond the table and ids beyond the cache are clamped
    into them (the caller's contract; nothing outside the cache is written, no device assert)."""
    positions = cache_seqlens.long()[:, None] + torch.arange(s_new, device=cache_seqlens.device)
    columns = (positions // block_size).clamp(0, block_table.shape[1] - 1)
    blocks = block_table.long().gather(1, columns).clamp(0, num_blocks - 1)
    return blocks, positions % block_size


def append_tokens(cache: torch.Tensor, new: torch.Tensor, slots) -> None:
    """Writes new (b, h, s_new, d) into the cache at `slots` (append_slots), in place."""
    blocks, offsets = slots
    cache[blocks, :, offsets] = new.permute(0, 2, 1, 3).to(cache.dtype)


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
        out (b, h_q, s_q, d), dense in q's axis order (as :func:`stridedfa.torch.attention`): a q
        cut from a (b, s, h, d) projection gives out over (b, s, h, d) memory.
    """
    if (k is None) != (v is None):
        raise ValueError("attention_with_kvcache appends keys and values together: give both k and v, or neither")
    seqlens = cache_seqlens
    if k is not None and v is not None:
        slots = append_slots(block_table, cache_seqlens, k.shape[2], k_cache.shape[2],
                              min(k_cache.shape[0], v_cache.shape[0]))
        append_tokens(k_cache, k, slots)
        append_tokens(v_cache, v, slots)
        seqlens = (cache_seqlens + k.shape[2]).to(torch.int32)
    if _plain_eager(q, k_cache, v_cache):  # one C call, the core parses the window itself
        return _forward_alloc(q, k_cache, v_cache, scale, bool(causal), causal_alignment, False, False, window, softcap,
                              None, seqlens, block_table=block_table)[0]
    left, right = _bounds(window)
    return paged_forward(q, k_cache, v_cache, block_table, seqlens, scale, bool(causal), causal_alignment, left,
                         right, softcap)
