"""Context parallelism: attention over a sequence sharded across the ranks of a torch.distributed
process group (ring attention), built on stridedfa's forward and backward with their softmax
statistics.

Each rank holds its shard of q, k and v along the sequence axis. The k/v shards travel once around
the ring (batched isend/irecv to the next rank, overlapped with the block the rank computes
meanwhile); each rank attends its queries to every k/v shard in turn and merges the partial
outputs by their log-sum-exp:

    lse = logaddexp(lse_a, lse_b)        out = out_a * exp(lse_a - lse) + out_b * exp(lse_b - lse)

The backward runs the same ring: each block's gradients come from the kernel's backward given the
*merged* out and lse (exact: a block's share of the full problem's gradients), dq accumulates on
the rank, dk and dv accumulate in buffers that travel with their k/v shard and come home after the
last step.

Causal attention is load-balanced: the sequence is cut into 2W chunks and rank r holds chunks r and
2W-1-r (``shard_sequence``), so that each step's work is half a local block on every rank: at step
0 the local block is causal; the k/v shard of a lower rank is seen whole by the local queries'
first half of keys only (its head chunk); that of a higher rank by the local tail queries only.

Each block runs stridedfa's registered operators (torch.ops.stridedfa.attention_forward and
attention_backward) on CUDA tensors; the ranks talk through any torch.distributed backend (NCCL
for CUDA tensors). Under torch.compile the
ring's P2P calls are graph breaks (dynamo compiles P2P only with TORCHDYNAMO_ENABLE_P2P_COMPILATION=1),
so fullgraph=True is not supported.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.distributed as dist

import stridedfa._torch_ops  # noqa: F401 -- registers torch.ops.stridedfa, the kernels each block runs
from stridedfa import _core
from stridedfa._errors import LayoutError

__all__ = ["context_parallel_attention", "shard_sequence", "unshard_sequence"]


# --- Sharding -------------------------------------------------------------------------------------

def shard_sequence(x: torch.Tensor, group=None, *, dim: int = 2, load_balanced: bool = True) -> torch.Tensor:
    """This rank's shard of a full-sequence tensor, along axis ``dim`` (2: the seq axis of a
    (b, h, s, d) tensor). With ``load_balanced`` (what causal attention needs for even work) the
    sequence is cut into 2W equal chunks and rank r gets chunks r and 2W-1-r, concatenated; else
    chunk r of W. The sequence length must divide into those chunks."""
    world, rank = _world(group)
    chunks = 2 * world if load_balanced else world
    if x.shape[dim] % chunks:
        raise LayoutError(f"shard_sequence: the sequence ({x.shape[dim]} along dim {dim}) must divide into {chunks} "
                          f"equal chunks for {world} ranks{' (load-balanced: two per rank)' if load_balanced else ''}")
    parts = x.chunk(chunks, dim)
    if not load_balanced:
        return parts[rank]
    return torch.cat([parts[rank], parts[chunks - 1 - rank]], dim)


def unshard_sequence(x: torch.Tensor, group=None, *, dim: int = 2, load_balanced: bool = True) -> torch.Tensor:
    """The full-sequence tensor from every rank's shard (``shard_sequence``'s inverse): an
    all-gather, then the chunks put back in sequence order."""
    world, _ = _world(group)
    gathered = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(gathered, x.contiguous(), group=group)
    if not load_balanced:
        return torch.cat(gathered, dim)
    heads = [shard.chunk(2, dim)[0] for shard in gathered]
    tails = [shard.chunk(2, dim)[1] for shard in gathered]
    return torch.cat(heads + tails[::-1], dim)


# --- The kernels a block runs on -------------------------------------------------------------------

# stridedfa's registered operators (README: torch.ops.stridedfa), with the options of one block by
# name: the forward with its statistics, and the backward from given out and lse.

def _block_options(causal, window, lengths, scale) -> dict:
    left, right = _core._window_bounds(window)  # the one parse of a window
    return dict(scale=scale, causal=causal, causal_alignment="top_left", window_left=left, window_right=right,
                softcap=None, seqlens_q=lengths[0], seqlens_kv=lengths[1], sinks=None, deterministic=False,
                bias=None, alibi_slopes=None, dropout_p=0.0, rng_state=None)


def _cudnn_forward(q, k, v, causal, window, lengths, scale):
    with torch.no_grad():
        return torch.ops.stridedfa.attention_forward(q, k, v, **_block_options(causal, window, lengths, scale),
                                                     with_lse=True)


def _cudnn_backward(q, k, v, out, lse, grad_out, causal, window, lengths, scale):
    dq, dk, dv, _, _ = torch.ops.stridedfa.attention_backward(
        q, k, v, out, lse.contiguous(), grad_out, **_block_options(causal, window, lengths, scale),
        with_grad_bias=False)
    return dq, dk, dv


def _accumulator(q: torch.Tensor) -> torch.dtype:
    """What partial results are merged in: float32 for half-precision inputs (float64 stays)."""
    return torch.promote_types(q.dtype, torch.float32)


def _kernels(q: torch.Tensor):
    """The forward and backward each block runs (the CPU tests put a float64 reference here)."""
    if not q.is_cuda:
        raise LayoutError(f"context_parallel_attention runs stridedfa's cuDNN kernels: q, k and v must be CUDA "
                          f"tensors (with an NCCL process group), got q on {q.device}")
    return _cudnn_forward, _cudnn_backward


# --- The ring ---------------------------------------------------------------------------------------

def _world(group) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("context parallel attention needs an initialised torch.distributed process group "
                           "(torch.distributed.init_process_group)")
    return dist.get_world_size(group), dist.get_rank(group)


class _Ring:
    """Sends tensors to the next rank and receives the same shapes from the previous one, batched
    and asynchronous: start() returns at once, wait() gives what arrived."""

    def __init__(self, group):
        self.group = group
        world, rank = _world(group)
        self.next = dist.get_global_rank(group, (rank + 1) % world) if group is not None else (rank + 1) % world
        self.prev = dist.get_global_rank(group, (rank - 1) % world) if group is not None else (rank - 1) % world
        self.pending: list = []
        self.received: list[torch.Tensor] = []

    def start(self, tensors: list[torch.Tensor]) -> None:
        self.received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group) for t in self.received]
        self.pending = dist.batch_isend_irecv(ops)

    def wait(self) -> list[torch.Tensor]:
        for request in self.pending:
            request.wait()
        self.pending = []
        return self.received


def _chunks(rank: int, world: int, load_balanced: bool) -> list[int]:
    """The indices, in sequence order of chunks, of the chunks a rank's shard holds."""
    return [rank, 2 * world - 1 - rank] if load_balanced else [rank]


class _Block(NamedTuple):
    """One kernel call of a step: local query rows and held key rows (slices of the shards), its
    options (top-left), and where those rows start in the whole sequence (for padding lengths;
    None where the rows span both chunks of a load-balanced shard, which happens only without)."""

    rows: slice
    keys: slice
    causal: bool
    window: tuple | None
    q_start: int | None = None
    kv_start: int | None = None


def _blocks(step: int, rank: int, world: int, causal: bool, window, padded: bool, load_balanced: bool,
            s: int) -> list[_Block]:
    """What the local queries compute with the k/v shard held at `step` (that of rank
    (rank - step) mod world): the kernel calls, none when no local query sees any of its keys."""
    source = (rank - step) % world
    every = slice(0, s)
    if window is None and not padded:  # whole chunks seen or not: at most one call per step
        if not causal:
            return [_Block(every, every, False, None)]
        if source == rank:
            return [_Block(every, every, True, None)]
        if not load_balanced:
            return [_Block(every, every, False, None)] if source < rank else []
        half, tail = slice(0, s // 2), slice(s // 2, s)
        return [_Block(every, half, False, None)] if source < rank else [_Block(tail, every, False, None)]
    return _chunk_pair_blocks(_chunks(rank, world, load_balanced), _chunks(source, world, load_balanced),
                              s // (2 if load_balanced else 1), causal, window or (None, None))


def _chunk_pair_blocks(q_chunks, kv_chunks, size: int, causal: bool, window) -> list[_Block]:
    """The calls of a step with a window or padding lengths, one per pair of a local query chunk
    and a held key chunk whose band meets: query i sees key j (positions in the whole sequence)
    iff i - left <= j <= i + right (right capped at 0 when causal). Each pair's band is a top-left
    window on a slice of the pair: the rows from b0 and the keys from a0, chosen so both bounds are
    >= 0 (stridedfa's windows are)."""
    left, right = window
    if causal:
        right = 0 if right is None else min(right, 0)
    blocks = []
    for qi, qc in enumerate(q_chunks):
        for ki, kc in enumerate(kv_chunks):
            shift = (qc - kc) * size  # key j of the chunk is position j + kc * size; query i likewise
            a0 = max(0, shift - left) if shift >= 0 and left is not None else 0
            b0 = max(0, -shift - right) if shift < 0 and right is not None else 0
            if a0 >= size or b0 >= size:
                continue  # the band misses this pair
            e = b0 - a0 + shift
            band = (None if left is None else left - e, None if right is None else right + e)
            blocks.append(_Block(slice(qi * size + b0, (qi + 1) * size), slice(ki * size + a0, (ki + 1) * size),
                                 False, band, qc * size + b0, kc * size + a0))
    return blocks


def _block_lengths(block: _Block, seqlens_q, seqlens_kv):
    """A block's own padding lengths: each sequence's valid rows and keys within it (device ops,
    no host synchronisation)."""
    def within(lengths, start, rows):
        if lengths is None:
            return None
        return (lengths - start).clamp(0, rows.stop - rows.start).to(torch.int32)
    return within(seqlens_q, block.q_start, block.rows), within(seqlens_kv, block.kv_start, block.keys)


def _merge(out: torch.Tensor, lse: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> None:
    """out, lse (the accumulators) <- the log-sum-exp merge with a block's (out_b, lse_b)."""
    new = torch.logaddexp(lse, lse_b)
    finite = torch.isfinite(new)
    safe = torch.where(finite, new, torch.zeros_like(new))
    keep = torch.where(finite, torch.exp(lse - safe), torch.zeros_like(new)).unsqueeze(-1)
    take = torch.where(finite, torch.exp(lse_b - safe), torch.zeros_like(new)).unsqueeze(-1)
    out.mul_(keep).add_(out_b.to(out.dtype) * take)
    lse.copy_(new)


def _ring_forward(q, k, v, group, causal, window, seqlens, scale, load_balanced):
    world, rank = _world(group)
    forward, _ = _kernels(q)
    b, h_q, s, _ = q.shape
    out = torch.zeros((b, h_q, s, v.shape[3]), dtype=_accumulator(q), device=q.device)
    lse = torch.full((b, h_q, s), -math.inf, dtype=_accumulator(q), device=q.device)
    ring = _Ring(group)
    shard = [k, v]
    for step in range(world):
        if step < world - 1:
            ring.start([t.contiguous() for t in shard])
        for block in _blocks(step, rank, world, causal, window, seqlens != (None, None), load_balanced, s):
            rows, keys = block.rows, block.keys
            out_b, lse_b = forward(q[:, :, rows], shard[0][:, :, keys], shard[1][:, :, keys], block.causal,
                                   block.window, _block_lengths(block, *seqlens), scale)
            _merge(out[:, :, rows], lse[:, :, rows], out_b, lse_b)
        if step < world - 1:
            shard = ring.wait()
    return out.to(q.dtype), lse


def _ring_backward(q, k, v, out, lse, grad_out, group, causal, window, seqlens, scale, load_balanced):
    world, rank = _world(group)
    _, backward = _kernels(q)
    s = q.shape[2]
    grad_q = torch.zeros(q.shape, dtype=_accumulator(q), device=q.device)
    # The gradients of the k/v shard held at each step travel with it and arrive home at the end.
    grad_kv = [torch.zeros(t.shape, dtype=_accumulator(q), device=t.device) for t in (k, v)]
    shards, gradients = _Ring(group), _Ring(group)
    shard = [k, v]
    for step in range(world):
        if step < world - 1:
            shards.start([t.contiguous() for t in shard])
        blocks = [(b.rows, b.keys, backward(q[:, :, b.rows], shard[0][:, :, b.keys], shard[1][:, :, b.keys],
                                            out[:, :, b.rows], lse[:, :, b.rows], grad_out[:, :, b.rows], b.causal,
                                            b.window, _block_lengths(b, *seqlens), scale))
                  for b in _blocks(step, rank, world, causal, window, seqlens != (None, None), load_balanced, s)]
        if step > 0:
            grad_kv = gradients.wait()  # this shard's gradients from the ranks it visited before
        for rows, keys, (dq, dk, dv) in blocks:
            grad_q[:, :, rows] += dq
            grad_kv[0][:, :, keys] += dk
            grad_kv[1][:, :, keys] += dv
        if world > 1:
            gradients.start(grad_kv)
        if step < world - 1:
            shard = shards.wait()
    if world > 1:
        grad_kv = gradients.wait()  # the local shard's own gradients, home after the last step
    return grad_q.to(q.dtype), grad_kv[0].to(k.dtype), grad_kv[1].to(v.dtype)


class _ContextParallelAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, causal, window, seqlens_q, seqlens_kv, scale, load_balanced):
        seqlens = (seqlens_q, seqlens_kv)
        out, lse = _ring_forward(q, k, v, group, causal, window, seqlens, scale, load_balanced)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (group, causal, window, seqlens, scale, load_balanced)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, _grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        grads = _ring_backward(q, k, v, out, lse, grad_out.contiguous(), *ctx.options)
        return (*grads, None, None, None, None, None, None, None)


def context_parallel_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, group=None,
                               causal: bool = False, window: tuple[int | None, int | None] | None = None,
                               seqlens_q: torch.Tensor | None = None, seqlens_kv: torch.Tensor | None = None,
                               scale: float | None = None, load_balanced: bool = True, return_lse: bool = False):
    """Attention over a sequence sharded across the ranks of ``group`` (default: the world),
    differentiable: ``softmax(scale * q @ k^T + mask) @ v`` over the whole sequence, each rank
    holding and receiving its own shard of the result.

    Args:
        q: (batch, h_q, s_local, d_qk), this rank's shard of the queries (``shard_sequence``);
            any valid strides, as for :func:`stridedfa.torch.attention`.
        k, v: (batch, h_kv, s_local, d), the shards of the keys and values at the same positions
            (h_q a multiple of h_kv: GQA and MQA).
        group: the torch.distributed process group (NCCL).
        causal: causal attention over the whole sequence (query i sees keys j <= i).
        window: ``(left, right)`` sliding window over the whole sequence, as in
            :func:`stridedfa.torch.attention` (top-left: query i sees keys i - left .. i + right;
            None on a side: unbounded; ``causal`` caps right at 0). Steps whose shards lie wholly
            outside every local query's window compute nothing.
        seqlens_q, seqlens_kv: int32 (batch,) tensors on q's device with each sequence's length in
            the whole (right-padded) sequence, as in :func:`stridedfa.torch.attention` (one may be
            omitted: full length); read on the device only. Padded rows get out = 0, lse = -inf,
            zero gradients; keys past a length are not attended.
        scale: defaults to ``1 / sqrt(d_qk)``.
        load_balanced: the shards are ``shard_sequence(..., load_balanced=True)``'s (chunks r and
            2W-1-r of 2W): causal work is then even across ranks. False: rank r holds chunk r of W.
        return_lse: also return this rank's float32 (batch, h_q, s_local) log-sum-exp.

    Returns:
        out (batch, h_q, s_local, d_v) in q's dtype, or (out, lse).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise LayoutError(f"{name}: expected (batch, heads, seq, head_dim), got shape {tuple(t.shape)}")
    if not q.shape[2] == k.shape[2] == v.shape[2]:
        raise LayoutError(f"q, k and v must be shards of one sequence at the same positions: seq extents "
                          f"{q.shape[2]}, {k.shape[2]}, {v.shape[2]}")
    if load_balanced and q.shape[2] % 2:
        raise LayoutError(f"a load-balanced shard holds two equal chunks: its seq extent {q.shape[2]} must be even "
                          f"(shard_sequence cuts it so); pass load_balanced=False for shards of one chunk")
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else float(scale)
    left, right = _core._window_bounds(window)  # the one parse of a window
    window = None if left < 0 and right < 0 else (None if left < 0 else left, None if right < 0 else right)
    for name, lengths in (("seqlens_q", seqlens_q), ("seqlens_kv", seqlens_kv)):
        if lengths is not None and (lengths.dim() != 1 or lengths.shape[0] != q.shape[0]
                                    or lengths.is_floating_point()):
            raise LayoutError(f"{name}: expected an integer (batch,) tensor of lengths, got {lengths.dtype} of shape "
                              f"{tuple(lengths.shape)}")
    out, lse = _ContextParallelAttention.apply(q, k, v, group, bool(causal), window, seqlens_q, seqlens_kv, scale,
                                               bool(load_balanced))
    return (out, lse) if return_lse else out
