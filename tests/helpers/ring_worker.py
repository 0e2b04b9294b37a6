"""One rank of a CPU context-parallel run (gloo): shards a full problem, runs
stridedfa.torch.context_parallel_attention forward and backward, gathers the results and writes
them for the test to compare with the full-sequence reference. Spawned by
tests/test_context_parallel.py. Each block runs stridedfa.reference's float64 NumPy kernels on
CPU tensors in place of cuDNN's (use_reference_kernels): the ring itself is what is tested."""

from __future__ import annotations

import datetime
import os
import zlib

import torch
import torch.distributed as dist


def _numpy(t: torch.Tensor):
    return t.detach().to(torch.float64).numpy()


def _lengths_numpy(lengths):
    return [None if t is None else t.numpy() for t in lengths]


def _reference_forward(q, k, v, causal, window, lengths, scale):
    from stridedfa import reference

    seqlens_q, seqlens_kv = _lengths_numpy(lengths)
    out, lse = reference.sdpa_forward(_numpy(q), _numpy(k), _numpy(v), scale=scale, causal=causal, window=window,
                                      seqlens_q=seqlens_q, seqlens_kv=seqlens_kv, dtype="float64")
    return torch.from_numpy(out).to(q.dtype), torch.from_numpy(lse).to(torch.promote_types(q.dtype, torch.float32))


def _reference_backward(q, k, v, out, lse, grad_out, causal, window, lengths, scale):
    from stridedfa import reference

    seqlens_q, seqlens_kv = _lengths_numpy(lengths)
    grads = reference.sdpa_backward_from_stats(_numpy(q), _numpy(k), _numpy(v), _numpy(out), _numpy(grad_out),
                                               _numpy(lse), scale=scale, causal=causal, window=window,
                                               seqlens_q=seqlens_q, seqlens_kv=seqlens_kv, dtype="float64")
    return tuple(torch.from_numpy(g).to(t.dtype) for g, t in zip(grads, (q, k, v)))


def reference_kernels(q):
    """The NumPy reference in place of the cuDNN operators (stands for _torch_context_parallel._kernels)."""
    return _reference_forward, _reference_backward


def use_reference_kernels() -> None:
    """Every block of this process's rings runs the NumPy reference (CPU tensors, float64)."""
    from stridedfa import _torch_context_parallel

    _torch_context_parallel._kernels = reference_kernels


CASES = [  # (causal, load_balanced, h_q, h_kv, s per rank, d, window)
    (False, True, 4, 2, 24, 8, None),
    (True, True, 4, 4, 24, 8, None),
    (True, True, 6, 2, 48, 16, None),
    (True, False, 4, 1, 24, 8, None),
    (False, False, 2, 2, 12, 8, None),
    (True, True, 4, 2, 24, 8, (5, 0)),      # a window shorter than a chunk
    (True, True, 2, 2, 16, 8, (19, None)),  # longer than a chunk; causal caps the right side
    (False, True, 2, 1, 16, 8, (7, 3)),
    (False, False, 2, 2, 12, 8, (None, 4)),
    (True, False, 2, 2, 12, 8, (13, 0)),
]
PADDED = [  # (causal, load_balanced, h_q, h_kv, s per rank, d, window, which lengths)
    (True, True, 4, 2, 24, 8, None, "both"),
    (False, True, 2, 2, 16, 8, None, "kv"),
    (True, False, 2, 1, 12, 8, (7, 0), "both"),
    (False, True, 2, 2, 16, 8, (5, 9), "q"),
]


def lengths(case, world):
    """Each sequence's length in the whole padded sequence: one mid-sequence, one inside the first
    chunk, as the case's lengths (seqlens_q, seqlens_kv)."""
    s = case[4] * world
    t = torch.tensor([max(1, s - 5), min(s, 3)], dtype=torch.int32)
    return (t if case[7] in ("both", "q") else None), (t if case[7] in ("both", "kv") else None)


def problem(case, world):
    """The full q, k, v and grad_out of a case (the same on every rank: seeded)."""
    causal, balanced, h_q, h_kv, s, d = case[:6]
    s = s * world  # the whole sequence: each rank holds s, whole chunks at every world size
    g = torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))  # hash(None) differs between processes
    q = torch.randn(2, h_q, s, d, generator=g, dtype=torch.float64)
    k = torch.randn(2, h_kv, s, d, generator=g, dtype=torch.float64)
    v = torch.randn(2, h_kv, s, d + 4, generator=g, dtype=torch.float64)
    dout = torch.randn(2, h_q, s, d + 4, generator=g, dtype=torch.float64)
    return q, k, v, dout


PACKED = (True, True, 4, 4, 16, 8, None)  # a causal case whose q, k, v are views of one (b, s, 3, h, d) projection


def packed_problem(world):
    """PACKED's q, k, v and grad_out, with one head_dim for all three (they share a projection)."""
    q, k, v, dout = problem(PACKED, world)
    d = q.shape[-1]
    return q, k, v[..., :d], dout[..., :d]


def packed_case(world):
    """q, k, v as views of one packed projection sharded along its seq axis: the gradient reaches
    the packed shard through the views. Returns out, lse and the packed gradient, gathered."""
    from stridedfa.torch import context_parallel_attention, shard_sequence, unshard_sequence

    q, k, v, dout = packed_problem(world)
    packed = torch.stack([t.transpose(1, 2) for t in (q, k, v)], 2)  # (b, s, 3, h, d)
    shard = shard_sequence(packed, dim=1).requires_grad_()
    views = [shard[:, :, i].transpose(1, 2) for i in range(3)]
    out, lse = context_parallel_attention(*views, causal=True, return_lse=True)
    out.backward(shard_sequence(dout, load_balanced=True))
    return [unshard_sequence(out.detach()), unshard_sequence(lse.unsqueeze(-1)), unshard_sequence(shard.grad, dim=1)]


def compiled_case():
    """The ring under torch.compile (default mode: dynamo breaks the graph at the ring's P2P calls,
    which it compiles only with TORCHDYNAMO_ENABLE_P2P_COMPILATION=1) against eager: the largest
    differences in out and in q's gradient."""
    from stridedfa.torch import context_parallel_attention, shard_sequence

    case = CASES[2]
    q, k, v, dout = (shard_sequence(t) for t in problem(case, 2))

    def step(attend):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = attend(*leaves, causal=True)
        out.backward(dout)
        return out.detach(), leaves[0].grad

    eager = step(context_parallel_attention)
    compiled = step(torch.compile(context_parallel_attention))
    return [(a - b).abs().max() for a, b in zip(eager, compiled)]


def run(rank: int, world: int, store: str, out_dir: str) -> None:
    from stridedfa.torch import context_parallel_attention, shard_sequence, unshard_sequence

    use_reference_kernels()
    # A ring that sends without a matching receive must fail the test, not hang it.
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        results = []
        for case in CASES:
            causal, balanced, window = case[0], case[1], case[6]
            q, k, v, dout = problem(case, world)
            shard = [shard_sequence(t, load_balanced=balanced).requires_grad_() for t in (q, k, v)]
            # the queries as a non-contiguous view, as a model's (b, s, h, d) projection gives them
            q_view = shard[0].detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
            out, lse = context_parallel_attention(q_view, shard[1], shard[2], causal=causal, window=window,
                                                  load_balanced=balanced, return_lse=True)
            out.backward(shard_sequence(dout, load_balanced=balanced))
            gathered = [unshard_sequence(t, load_balanced=balanced) for t in (out, lse.unsqueeze(-1), q_view.grad,
                                                                              shard[1].grad, shard[2].grad)]
            results.append([t.detach() for t in gathered])
        for case in PADDED:
            q, k, v, dout = problem(case, world)
            seqlens_q, seqlens_kv = lengths(case, world)
            shard = [shard_sequence(t, load_balanced=case[1]).requires_grad_() for t in (q, k, v)]
            out, lse = context_parallel_attention(*shard, causal=case[0], window=case[6], seqlens_q=seqlens_q,
                                                  seqlens_kv=seqlens_kv, load_balanced=case[1], return_lse=True)
            out.backward(shard_sequence(dout, load_balanced=case[1]))
            results.append([unshard_sequence(t, load_balanced=case[1]) for t in (out.detach(), lse.unsqueeze(-1),
                                                                                 *(x.grad for x in shard))])
        results.append(packed_case(world))
        if world == 2:
            results.append(compiled_case())
        if rank == 0:
            torch.save(results, os.path.join(out_dir, f"world{world}.pt"))
    finally:
        dist.destroy_process_group()
