"""stridedfa.jax's paged-KV-cache attention (serving): queries against k and v caches split in
blocks, read through a block table on the device, through the forward XLA FFI target with its
`block_table` operand (cpp/include/stridedfa/jax_ffi.hpp); and attention_with_kvcache, which
first writes new keys and values into the caches at each sequence's length.

JAX arrays are immutable, so the caches come back updated (under ``jax.jit`` with the caches
donated, ``donate_argnums``, XLA writes them in place). Forward only: a paged cache serves.
"""

from __future__ import annotations

from stridedfa import _core
from stridedfa._errors import LayoutError
from stridedfa._jax_runtime import (
    _FORWARD_INFERENCE,
    _LAYOUTS,
    _WITH_BLOCK_TABLE,
    _WITH_LENGTHS,
    _check_devices,
    _ensure_runtime,
    _options,
    jax,
    jnp,
)


def _cache_axes(layout: str) -> str:
    if layout == "bshd":
        return "(num_blocks, block_size, heads, head_dim)"
    return "(num_blocks, heads, block_size, head_dim)"


def paged_attention(q, k_cache, v_cache, block_table, cache_seqlens, *, layout: str = "bshd",
                    scale: float | None = None, causal: bool = True, causal_alignment: str = "bottom_right",
                    window=None, softcap: float | None = None):
    """Attention of q over a paged KV cache (vLLM's and FlashAttention's block tables), forward only.

    Args:
        q: (b, s_q, h_q, d_qk) for ``layout="bshd"`` or (b, h_q, s_q, d_qk) for ``"bhsd"``,
            float16/bfloat16 (decode: s_q = 1; chunked prefill: more).
        k_cache, v_cache: (num_blocks, block_size, h_kv, d) caches for ``"bshd"`` (FlashAttention's
            and vLLM's order), (num_blocks, h_kv, block_size, d) for ``"bhsd"``; h_q a multiple of
            h_kv (GQA).
        block_table: int32 (b, blocks per sequence): sequence b's i-th block is
            ``k_cache[block_table[b, i]]``. Read on the device; ids outside the cache are clamped
            into it (nothing outside the caches is read).
        cache_seqlens: int32 (b,) tokens cached per sequence (traced values are fine: read on the
            device), at most blocks per sequence * block_size.
        layout, scale, window, softcap: as in :func:`stridedfa.jax.attention`.
        causal, causal_alignment: by default causal bottom-right, each query block aligned with the
            end of its sequence's cache, as decoding and chunked prefill need.

    Returns:
        out, q's shape with d_v, in ``layout``. Under ``jax.vmap`` the mapped calls run one after
        another.
    """
    options = _options(layout, scale, causal, causal_alignment, window, softcap=softcap)
    q, k_cache, v_cache = (jnp.asarray(x) for x in (q, k_cache, v_cache))
    block_table, cache_seqlens = jnp.asarray(block_table), jnp.asarray(cache_seqlens)
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if x.ndim != 4:
            axes = ("(batch, seq, heads, head_dim)" if layout == "bshd" else "(batch, heads, seq, head_dim)") \
                if name == "q" else _cache_axes(layout)
            raise LayoutError(f"{name}: expected 4 axes {axes} for layout {layout!r}, got shape {tuple(x.shape)}")
    b = q.shape[0]
    s_q = q.shape[1] if layout == "bshd" else q.shape[2]
    seqlens_q = jnp.full((b,), s_q, jnp.int32)  # every query row is real; a constant XLA folds
    out_shape = (*q.shape[:3], v_cache.shape[3])
    _core._validate_shapes(False, _LAYOUTS[layout], (tuple(q.shape), tuple(k_cache.shape), tuple(v_cache.shape),
                                                  out_shape, None),
                        (str(q.dtype), str(k_cache.dtype), str(v_cache.dtype), str(q.dtype), "float32"),
                        lengths=(((b,), "int32"), (tuple(cache_seqlens.shape), str(cache_seqlens.dtype))),
                        block_table=(tuple(block_table.shape), str(block_table.dtype)), **options.core_options())
    _check_devices(q, k_cache, v_cache)
    _ensure_runtime()
    call = jax.ffi.ffi_call(_FORWARD_INFERENCE, jax.ShapeDtypeStruct(out_shape, q.dtype), vmap_method="sequential")
    return call(q, k_cache, v_cache, seqlens_q, cache_seqlens, block_table,
                **options.attributes(_WITH_LENGTHS | _WITH_BLOCK_TABLE))


def _append(cache, new, block_table, cache_seqlens, layout: str):
    """The cache with new (b, s_new, h, d) tokens (bshd order) written at positions
    cache_seqlens[b] + i. Positions beyond the table and ids beyond the cache are clamped into them
    (the caller's contract; nothing outside the cache is written)."""
    s_new = new.shape[1]
    block_size = cache.shape[1] if layout == "bshd" else cache.shape[2]
    positions = cache_seqlens.astype(jnp.int32)[:, None] + jnp.arange(s_new, dtype=jnp.int32)
    columns = jnp.clip(positions // block_size, 0, block_table.shape[1] - 1)
    blocks = jnp.clip(jnp.take_along_axis(block_table, columns, axis=1), 0, cache.shape[0] - 1)
    offsets = positions % block_size
    # Both index arrays are (b, s_new): the indexed axes come first either way, so the update is
    # (b, s_new, h, d) for a (blocks, block_size, h, d) and a (blocks, h, block_size, d) cache alike.
    index = (blocks, offsets) if layout == "bshd" else (blocks, slice(None), offsets)
    return cache.at[index].set(new.astype(cache.dtype))


def attention_with_kvcache(q, k_cache, v_cache, block_table, cache_seqlens, k=None, v=None, *,
                           layout: str = "bshd", scale: float | None = None, causal: bool = True,
                           causal_alignment: str = "bottom_right", window=None, softcap: float | None = None):
    """:func:`paged_attention` after writing new keys and values into the caches (FlashAttention's
    ``flash_attn_with_kvcache`` with a ``block_table``), for serving.

    k, v: optional (b, s_new, h_kv, d) (``"bshd"``) or (b, h_kv, s_new, d) (``"bhsd"``) new tokens,
    written at positions cache_seqlens[b] .. + s_new (on the device) before attending over
    cache_seqlens + s_new tokens. cache_seqlens itself is the caller's to advance.

    Returns:
        (out, k_cache, v_cache): the caches with the new tokens. Donate the caches to ``jax.jit``
        (``donate_argnums``) so that XLA updates them in place instead of copying.
    """
    if (k is None) != (v is None):
        raise ValueError("attention_with_kvcache appends keys and values together: give both k and v, or neither")
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be 'bshd' or 'bhsd', got {layout!r}")
    k_cache, v_cache, block_table = jnp.asarray(k_cache), jnp.asarray(v_cache), jnp.asarray(block_table)
    seqlens = jnp.asarray(cache_seqlens)
    if k is not None and v is not None:
        k, v = jnp.asarray(k), jnp.asarray(v)
        for name, x in (("k", k), ("v", v)):
            if x.ndim != 4:
                raise LayoutError(f"{name}: expected 4 axes in layout {layout!r}, got shape {tuple(x.shape)}")
        if layout == "bhsd":
            k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
        k_cache = _append(k_cache, k, block_table, seqlens, layout)
        v_cache = _append(v_cache, v, block_table, seqlens, layout)
        seqlens = (seqlens + k.shape[1]).astype(jnp.int32)
    out = paged_attention(q, k_cache, v_cache, block_table, seqlens, layout=layout, scale=scale, causal=causal,
                          causal_alignment=causal_alignment, window=window, softcap=softcap)
    return out, k_cache, v_cache
