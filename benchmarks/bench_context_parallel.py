#!/usr/bin/env python3
"""Weak scaling of context parallel attention (issue 15): per-GPU TFLOP/s at world sizes 1, 2, 4, 8
with a fixed number of tokens per GPU, against one GPU running stridedfa on the whole sequence.

Causal, load-balanced shards (stridedfa.torch.shard_sequence), bf16, GQA 32/8, d = 128, batch 1.
Each world size is its own group of processes (NCCL, one GPU each, NCCL_NVLS_ENABLE=0 and
TORCH_SYMM_MEM_DISABLE_MULTICAST=1); forward and forward + backward are timed with CUDA events
after warm-up, medians over --repeats, the slowest rank's time per step. Per-GPU TFLOP/s counts
causal attention's work, 2 * 2 * b * h * S^2 * d / 2 for the forward (x 3.5 with the backward),
divided by the world size. Efficiency: per-GPU TFLOP/s at W over one GPU's on the whole sequence
of W's run (where it fits one GPU; memory grows linearly with S).

Usage: ``python benchmarks/bench_context_parallel.py --out DIR [--tokens-per-gpu N] [--repeats N]``;
writes ``DIR/bench_context_parallel.{json,md}``. Needs as many GPUs as the largest world size.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HEADS_Q, HEADS_KV, HEAD_DIM = 32, 8, 128


def flops(s: int, backward: bool) -> float:
    forward = 2 * 2 * HEADS_Q * s * s * HEAD_DIM / 2
    return forward * (3.5 if backward else 1.0)


def timed(fn, repeats: int) -> float:
    """Median seconds of `repeats` event-bracketed calls (bench_variants' timer)."""
    from bench_variants import timed as timed_ms

    return timed_ms(torch, fn, repeats) / 1e3


def worker(rank: int, world: int, store: str, tokens: int, repeats: int, out: str) -> None:
    import stridedfa.torch as st

    os.environ["NCCL_NVLS_ENABLE"] = "0"
    os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300), device_id=torch.device("cuda", rank))
    try:
        s = tokens * world
        make = lambda h: torch.randn(1, s // world, h, HEAD_DIM, device="cuda", dtype=torch.bfloat16)  # noqa: E731
        q, k, v = (make(h).transpose(1, 2).requires_grad_() for h in (HEADS_Q, HEADS_KV, HEADS_KV))
        dout = torch.randn_like(q)

        def forward():
            with torch.no_grad():
                st.context_parallel_attention(q, k, v, causal=True)

        def step():
            st.context_parallel_attention(q, k, v, causal=True).backward(dout)

        row = {}
        for name, fn in (("forward", forward), ("forward_backward", step)):
            seconds = torch.tensor([timed(fn, repeats)], device="cuda")
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
            row[name] = seconds.item()
        if rank == 0:
            with open(out, "w") as f:
                json.dump(row, f)
    finally:
        dist.destroy_process_group()


def single_gpu(s: int, repeats: int) -> dict:
    import stridedfa.torch as st

    make = lambda h: torch.randn(1, s, h, HEAD_DIM, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    q, k, v = (make(h).transpose(1, 2).requires_grad_() for h in (HEADS_Q, HEADS_KV, HEADS_KV))
    dout = torch.randn_like(q)

    def forward():
        with torch.no_grad():
            st.attention(q, k, v, causal=True)

    return {"forward": timed(forward, repeats),
            "forward_backward": timed(lambda: st.attention(q, k, v, causal=True).backward(dout), repeats)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokens-per-gpu", type=int, default=32768)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    sys.path.insert(0, os.path.dirname(__file__))
    from provenance import provenance, save

    import stridedfa

    worlds = [w for w in (1, 2, 4, 8) if w <= torch.cuda.device_count()]
    rows = []
    for world in worlds:
        s = args.tokens_per_gpu * world
        with tempfile.TemporaryDirectory() as scratch:
            result = os.path.join(scratch, "row.json")
            mp.spawn(worker, args=(world, os.path.join(scratch, "store"), args.tokens_per_gpu, args.repeats, result),
                     nprocs=world, join=True)
            with open(result) as f:
                ring = json.load(f)
        try:
            one = single_gpu(s, args.repeats)
        except torch.OutOfMemoryError:
            one = None
        torch.cuda.empty_cache()
        row = {"world": world, "sequence": s, "tokens_per_gpu": args.tokens_per_gpu, "ring_seconds": ring,
               "single_gpu_seconds": one}
        for name, backward in (("forward", False), ("forward_backward", True)):
            per_gpu = flops(s, backward) / world / ring[name] / 1e12
            row[f"{name}_tflops_per_gpu"] = per_gpu
            if one is not None:
                row[f"{name}_efficiency"] = per_gpu / (flops(s, backward) / one[name] / 1e12)
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"benchmark": "context_parallel", **provenance(stridedfa), "heads": [HEADS_Q, HEADS_KV],
              "head_dim": HEAD_DIM, "rows": rows}
    lines = ["| world | sequence | fwd TFLOP/s per GPU | fwd eff. | fwd+bwd TFLOP/s per GPU | fwd+bwd eff. |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        eff = {n: f"{r[n]:.2f}" if n in r else "-" for n in ("forward_efficiency", "forward_backward_efficiency")}
        lines.append(f"| {r['world']} | {r['sequence']} | {r['forward_tflops_per_gpu']:.0f} | "
                     f"{eff['forward_efficiency']} | {r['forward_backward_tflops_per_gpu']:.0f} | "
                     f"{eff['forward_backward_efficiency']} |")
    save(args.out, "bench_context_parallel", result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
