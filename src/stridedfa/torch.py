"""The torch adapter: stridedfa attention as torch operators.

The entry points, differentiable (all but the paged one) and, all but the context-parallel one
(whose ring is torch.distributed's eager P2P), usable under ``torch.compile(fullgraph=True)`` and
CUDA graph capture:

- :func:`attention` takes q, k, v with any valid strides (e.g. views of one packed projection);
- :func:`packed_attention` takes the packed projection itself plus the axis along which q/k/v (or
  k/v) interleave, and writes the backward's dQ/dK/dV straight into one packed gradient buffer;
- :func:`varlen_attention` takes sequences packed along one token axis (THD) with cu_seqlens, and
  :func:`varlen_packed_attention` their fused (total, 3, h, d) projection;
- :func:`attention_with_kvcache` attends over a paged KV cache (forward only, for serving);
- :func:`context_parallel_attention` attends over a sequence sharded across the ranks of a
  torch.distributed group (ring attention; :func:`shard_sequence` / :func:`unshard_sequence`).

They are backed by registered operators (``torch.ops.stridedfa.*``, see ``torch.library``) whose
fake implementations give exactly the strides the real kernels produce (``stridedfa._layouts``).
Outputs, gradients and cuDNN's workspace come from torch's caching allocator, and the kernels run on
torch's current stream. Eager calls skip the dispatcher (torch.compile, fake tensors and
dispatch modes always see the operators): with autograd they run the same kernels through a plain
torch.autograd.Function; without it, reading q, k, v, allocating out and queueing the kernel is one
C call (DLPack C exchange API, torch >= 2.10).
"""

import torch

# The ring of context-parallel attention (torch.distributed, over this module's kernels).
from stridedfa._torch_context_parallel import context_parallel_attention, shard_sequence, unshard_sequence

# The operators behind attention, their fake and autograd kernels, and the helpers every operator
# shares, live in _torch_ops (importing it registers torch.ops.stridedfa); packed, paged-KV and
# variable-length attention have their own operators in _torch_packed, _torch_paged, _torch_varlen;
# their options are one record each (_torch_options).
from stridedfa._torch_ops import (
    _attention_forward,
    _attention_inference,
    _attention_inference_basic,
    _bounds,
    _causal,
    _check_backward,
    _draw_rng_state,
    _eager_attention,
    _forward_alloc,
    _is_grad_enabled,
    _plain_eager,
)
from stridedfa._torch_options import Options, new_record
from stridedfa._torch_packed import (
    _check_packed,
    _check_packed_backward,
    _eager_packed_attention,
    _packed_attention_forward,
    _packed_forward_impl,
)
from stridedfa._torch_paged import attention_with_kvcache
from stridedfa._torch_varlen import varlen_attention, varlen_packed_attention

__all__ = ["attention", "attention_with_kvcache", "context_parallel_attention", "packed_attention", "shard_sequence",
           "unshard_sequence", "varlen_attention", "varlen_packed_attention"]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
              causal: bool = False, is_causal: bool | None = None,
              causal_alignment: str = "top_left", window: tuple[int | None, int | None] | None = None,
              softcap: float | None = None, seqlens_q: torch.Tensor | None = None,
              seqlens_kv: torch.Tensor | None = None, sinks: torch.Tensor | None = None,
              bias: torch.Tensor | None = None, alibi_slopes: torch.Tensor | None = None,
              dropout_p: float = 0.0, deterministic: bool = False, return_lse: bool = False):
    """Scaled-dot-product attention with cuDNN's fused kernels, differentiable.

    ``softmax(scale * q @ k^T + mask) @ v`` with the axes of
    ``torch.nn.functional.scaled_dot_product_attention``:

    Args:
        q: (batch, h_q, s_q, d_qk) CUDA tensor, float16 or bfloat16, any valid strides — e.g. a
            bshd tensor passed as ``x.transpose(1, 2)``, or a view into a packed qkv buffer.
        k: (batch, h_kv, s_kv, d_qk); h_q must be a multiple of h_kv (GQA and MQA need no repeat).
        v: (batch, h_kv, s_kv, d_v).
        scale: defaults to ``1 / sqrt(d_qk)``.
        causal: mask future keys. ``is_causal`` is accepted as torch's name for it.
        causal_alignment: ``"top_left"`` (query i sees keys j <= i) or ``"bottom_right"``
            (query i sees keys j <= i + s_kv - s_q; with s_q > s_kv the first rows see no key and
            get out = 0, lse = -inf, zero gradients, as in FlashAttention). With s_q == s_kv (and
            no padding lengths, or one tensor as both) the two are one mask, run as top-left,
            whose backward cuDNN runs faster.
        window: ``(left, right)`` sliding window in tokens, None on a side for unbounded: query i
            sees key j iff ``i + off - left <= j <= i + off + right`` (off = 0 top-left, s_kv - s_q
            bottom-right); ``causal`` caps right at 0. FlashAttention's ``window_size=(w, 0)`` is
            ``window=(w, 0)``; its -1 is None. See :func:`stridedfa.sdpa_forward` for the picture.
        softcap: cap the scores smoothly, ``softcap * tanh(scores / softcap)`` before the mask
            (Gemma 2's ``attn_logit_softcapping``; FlashAttention's ``softcap``). None: no cap.
        seqlens_q, seqlens_kv: int32 (batch,) CUDA tensors with each sequence's length in a padded
            batch (one may be omitted: full length on that side). Keys past a length do not
            count (their values must be finite); read on the device only (CUDA graphs,
            torch.compile). Padded query rows get out = 0, lse = -inf, zero gradients.
        sinks: float32 (h_q,) CUDA tensor of attention-sink logits (gpt-oss): an extra term per
            query head in each row's softmax denominator that attends to nothing; differentiable.
        bias: additive score bias in q's dtype, broadcastable to (batch, h_q, s_q, s_kv) (torch's
            float ``attn_mask``; T5 relative positions; a boolean mask ``m`` as
            ``torch.zeros_like(m, dtype=q.dtype).masked_fill(~m, float("-inf"))``): scores are
            ``softcap(scale * q @ k^T) + bias`` before the masks. Extent-1 (or stride-0, expanded)
            axes are shared without a copy; the key axis must be contiguous. Differentiable: its
            gradient is computed only when the bias requires grad, and only where cuDNN computes
            it (a row per query, no softcap or ALiBi: see :func:`stridedfa.sdpa_backward`).
        alibi_slopes: float32 (h_q,) CUDA tensor of ALiBi slopes (BLOOM, MPT; FlashAttention's
            ``alibi_slopes``): ``scores -= alibi_slopes[h] * |i + off - j|``, off the diagonal
            offset of ``causal_alignment`` (FlashAttention's definition with ``"bottom_right"``);
            any slopes, with or without causal; not differentiable.
        dropout_p: attention dropout, as torch SDPA's ``dropout_p`` (applied whenever > 0: pass
            ``dropout_p if module.training else 0.0``, as torch's modules do): each softmax weight
            is zeroed with probability dropout_p and the kept ones scaled by 1 / (1 - dropout_p).
            The Philox seed and offset are drawn on the device from torch's CUDA generator, as any
            random op draws (torch.manual_seed decides them; each CUDA-graph replay draws anew);
            the backward regenerates the forward's mask from them. lse is that of the undropped
            softmax. Not with sinks that require grad (cuDNN 9.19 gets their gradient wrong under
            dropout: refused before the forward); see :func:`stridedfa.sdpa_backward` for the rest.
        deterministic: the backward uses cuDNN's deterministic algorithm (bitwise-identical
            gradients run to run, slower: see benchmarks/).
        return_lse: also return the float32 (batch, h_q, s_q) log-sum-exp of each row's scaled,
            masked scores (natural log; -inf for rows that see no key), not differentiable.

    Returns:
        out, or (out, lse) with ``return_lse``: out is a (batch, h_q, s_q, d_v) tensor laid out in
        q's axis order (a bshd-ordered q gives a bshd-ordered result). Gradients of q, k, v come
        back with the inputs' strides when those are dense, and in the inputs' axis order
        otherwise (views of a packed buffer); to get them in one packed buffer, use
        :func:`packed_attention`.

    Raises:
        stridedfa.LayoutError, UnsupportedError, BackendError: see :func:`stridedfa.sdpa_forward`.

    Example::

        qkv = torch.randn(2, 1024, 3, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        out = stridedfa.torch.attention(q, k, v, causal=True)   # (2, 16, 1024, 128), bshd in memory
        out.sum().backward()
    """
    if is_causal is not None:
        causal = _causal(causal, is_causal)
    # Grad mode first: under no_grad (inference) the three attribute reads are skipped.
    needs_grad = _is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                         or (sinks is not None and sinks.requires_grad)
                                         or (bias is not None and bias.requires_grad))
    rng_state = _draw_rng_state(q, dropout_p) if dropout_p else None
    if not needs_grad and _plain_eager(q, k, v):  # one C call; the core parses window itself
        out, lse = _forward_alloc(q, k, v, scale, causal, causal_alignment, return_lse, False, window, softcap,
                                  seqlens_q, seqlens_kv, sinks, bias, alibi_slopes, dropout_p, rng_state)
        return (out, lse) if return_lse else out
    left, right = _bounds(window)
    opts = new_record(Options, (scale, causal, causal_alignment, left, right, softcap, seqlens_q, seqlens_kv, sinks,
                                 deterministic, bias, alibi_slopes, float(dropout_p), rng_state))
    if needs_grad and _plain_eager(q, k, v):
        _check_backward(q, k, v, opts)  # the operator's Autograd kernel checks the other paths
        return _eager_attention(q, k, v, sinks, bias, opts, return_lse)
    if needs_grad or return_lse:
        out, lse = _attention_forward(q, k, v, *opts, True)
        return (out, lse) if return_lse else out
    if (window is None and softcap is None and seqlens_q is None and seqlens_kv is None and sinks is None
            and bias is None and alibi_slopes is None and rng_state is None):
        return _attention_inference_basic(q, k, v, scale, causal, causal_alignment)
    return _attention_inference(q, k, v, *opts)


def packed_attention(packed: torch.Tensor, dim: int, *, layout: str = "bshd",
                     q: torch.Tensor | None = None, scale: float | None = None, causal: bool = False,
                     is_causal: bool | None = None, causal_alignment: str = "top_left",
                     window: tuple[int | None, int | None] | None = None, softcap: float | None = None,
                     seqlens_q: torch.Tensor | None = None, seqlens_kv: torch.Tensor | None = None,
                     sinks: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                     alibi_slopes: torch.Tensor | None = None, dropout_p: float = 0.0,
                     deterministic: bool = False, return_lse: bool = False):
    """Attention on a packed projection, read in place and differentiated into one packed gradient.

    ``packed`` holds q, k and v interleaved along axis ``dim`` (extent 3), or k and v (extent 2)
    with ``q`` given separately. The other four axes are named by ``layout``, a permutation of
    ``"bshd"`` (batch, sequence, heads, head_dim): a fused projection ``x @ w_qkv`` viewed as
    (b, s, 3, h, d) is ``packed_attention(qkv, 2, layout="bshd")``; (s, b, 3, h, d) is
    ``dim=2, layout="sbhd"``; (b, s, h, 3, d) is ``dim=3, layout="bshd"``.

    The forward reads q/k/v as zero-copy views. The backward allocates one gradient buffer with
    ``packed``'s strides (dense in its axis order if ``packed`` is not dense) and cuDNN writes
    dQ/dK/dV straight into its slices: no per-tensor gradients, no concatenation.

    Args:
        packed: 5-D CUDA tensor, float16 or bfloat16.
        dim: the axis of ``packed`` along which q/k/v (or k/v) interleave.
        layout: the order of the remaining four axes, e.g. ``"bshd"`` or ``"bhsd"``.
        q: with an extent-2 ``packed`` (k/v only): the queries, 4-D in the same ``layout``.
        scale, causal, is_causal, causal_alignment, window, softcap, seqlens_q, seqlens_kv, sinks,
        alibi_slopes, dropout_p, deterministic, return_lse: as in :func:`attention`.
        bias: as in :func:`attention`, in the logical (batch, h_q, s_q, s_kv) axes whatever the
            layout.

    Returns:
        out, or (out, lse) with ``return_lse``: the output with the axes of ``layout`` (e.g.
        (b, s, h, d_v) for ``"bshd"``), dense in the memory order of q; lse is (b, h, s). Its
        gradient flows into ``packed`` (and ``q``).

    Example::

        qkv = (x @ w_qkv).view(b, s, 3, h, d)                      # fused projection, no split
        out = stridedfa.torch.packed_attention(qkv, 2, causal=True)  # (b, s, h, d)
        y = out.reshape(b, s, h * d) @ w_o
    """
    causal = _causal(causal, is_causal)
    dim = _check_packed(packed, dim, layout, q)
    left, right = _bounds(window)
    rng_state = _draw_rng_state(packed, dropout_p) if dropout_p else None
    opts = new_record(Options, (scale, causal, causal_alignment, left, right, softcap, seqlens_q, seqlens_kv, sinks,
                                deterministic, bias, alibi_slopes, float(dropout_p), rng_state))  # fields' order
    needs_grad = torch.is_grad_enabled() and (packed.requires_grad or (q is not None and q.requires_grad)
                                              or (sinks is not None and sinks.requires_grad)
                                              or (bias is not None and bias.requires_grad))
    if _plain_eager(packed, packed, packed if q is None else q):
        if needs_grad:
            _check_packed_backward(packed, dim, layout, q, opts)
            out, lse = _eager_packed_attention(True, packed, dim, layout, q, *opts, True)
        else:
            out, lse = _packed_forward_impl(packed, dim, layout, q, *opts, return_lse)
    else:
        out, lse = _packed_attention_forward(packed, dim, layout, q, *opts, needs_grad or return_lse)
    return (out, lse) if return_lse else out


