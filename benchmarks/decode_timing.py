"""Timing for the decoding benchmarks (bench_paged.py, bench_decode_lengths.py): a step timed back to
back (an eager decoding loop: where the host's time per call exceeds the GPU's, the host's shows)
and replayed from one CUDA graph of many calls (how serving engines run decoding: GPU time alone)."""

from __future__ import annotations


def timed_us(fn, warmup, iters):
    """µs per call, `iters` calls back to back between two CUDA events."""
    import torch

    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / iters


def graphed_us(fn, warmup, iters):
    """µs per call replayed from one CUDA graph of `iters` calls (host time excluded), or why the
    call could not be captured."""
    import torch

    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(iters):
                fn()
        return timed_us(graph.replay, 2, 5) / iters
    except Exception as error:
        return f"not captured: {type(error).__name__}: {error}"[:200]
