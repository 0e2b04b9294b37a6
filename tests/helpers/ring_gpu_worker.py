"""One rank of a GPU context-parallel run (NCCL, one GPU per rank): the same problem on every rank
(seeded), sharded; context_parallel_attention forward and backward; the gathered results written by
rank 0 for tests/gpu/test_context_parallel.py to compare with one stridedfa call on the whole
sequence."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

CASES = [  # (causal, load_balanced, b, h_q, h_kv, s_total, d, window)
    (True, True, 2, 8, 2, 2048, 128, None),
    (False, True, 1, 4, 4, 1024, 64, None),
    (True, False, 2, 4, 1, 1024, 64, None),
    (True, True, 1, 8, 2, 2048, 64, (100, 0)),
    (False, True, 1, 4, 4, 1024, 64, (300, 50)),
    (True, True, 2, 4, 2, 1024, 64, None, "padded"),  # seqlens_q = seqlens_kv = lengths(case)
    # non-causal: blocks whose keys are all padding while their queries are not (seqlens_kv = 0)
    (False, True, 2, 4, 2, 1024, 64, (200, 100), "padded"),
]


def lengths(case, device):
    """A padded case's per-sequence lengths in the whole sequence (one inside the first chunk)."""
    if len(case) < 9:
        return None
    return torch.tensor([case[5] - 100, 37], dtype=torch.int32, device=device)


def problem(case, device):
    causal, balanced, b, h_q, h_kv, s, d = case[:7]
    g = torch.Generator(device="cpu").manual_seed(1000 + CASES.index(case))
    make = lambda h: torch.randn(b, s, h, d, generator=g).to(device, torch.bfloat16).transpose(1, 2)  # noqa: E731
    return make(h_q), make(h_kv), make(h_kv), make(h_q)


def run(rank: int, world: int, store: str, out_dir: str) -> None:
    from stridedfa.torch import context_parallel_attention, shard_sequence, unshard_sequence

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120), device_id=torch.device("cuda", rank))
    try:
        results = []
        for case in CASES:
            causal, balanced, window = case[0], case[1], case[7]
            q, k, v, dout = problem(case, f"cuda:{rank}")
            shards = [shard_sequence(t, load_balanced=balanced).detach().requires_grad_() for t in (q, k, v)]
            seqlens = lengths(case, f"cuda:{rank}")
            out, lse = context_parallel_attention(*shards, causal=causal, window=window, seqlens_q=seqlens,
                                                  seqlens_kv=seqlens, load_balanced=balanced, return_lse=True)
            out.backward(shard_sequence(dout, load_balanced=balanced))
            gathered = [unshard_sequence(t, load_balanced=balanced).cpu()
                        for t in (out.detach(), lse.unsqueeze(-1), *(s.grad for s in shards))]
            results.append(gathered)
        if rank == 0:
            torch.save(results, os.path.join(out_dir, f"world{world}.pt"))
    finally:
        dist.destroy_process_group()
