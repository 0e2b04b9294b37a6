"""Host cost per call of the CuPy paths (GPU needed): how long a Python thread spends enqueueing one
forward call, on a problem small enough that the GPU keeps up.

    python benchmarks/bench_cupy_host.py [--out DIR] [--calls 2000]

Rows: stridedfa.cupy.attention (allocates out, and lse), stridedfa.attention on CuPy arrays (the
dispatcher on top), stridedfa.sdpa_forward into preallocated CuPy arrays (no allocation), and
stridedfa.attention on a plain DLPack producer (DeviceBuffer outputs). Medians of 5 rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


class Producer:
    """A DLPack producer stridedfa has no adapter for."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def per_call_us(fn, calls, sync):
    fn()
    sync()
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
        sync()
    return statistics.median(rounds)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()

    import cupy as cp

    import stridedfa
    import stridedfa.cupy

    b, h, s, d = 1, 2, 128, 64
    rng = cp.random.default_rng(0)
    q, k, v = (rng.standard_normal((b, s, h, d), dtype=cp.float32).astype(cp.float16)
               .transpose(0, 2, 1, 3) for _ in range(3))
    out = cp.empty((b, s, h, d), dtype=cp.float16).transpose(0, 2, 1, 3)
    lse = cp.empty((b, h, s), dtype=cp.float32)
    wrapped = [Producer(x) for x in (q, k, v)]
    sync = cp.cuda.Device().synchronize

    rows = {
        "stridedfa.cupy.attention": lambda: stridedfa.cupy.attention(q, k, v, causal=True),
        "stridedfa.cupy.attention(return_lse=True)":
            lambda: stridedfa.cupy.attention(q, k, v, causal=True, return_lse=True),
        "stridedfa.attention(cupy)": lambda: stridedfa.attention(q, k, v, causal=True),
        "stridedfa.sdpa_forward(cupy, preallocated out+lse)":
            lambda: stridedfa.sdpa_forward(q, k, v, out, lse=lse, causal=True),
        "stridedfa.attention(plain DLPack producer)":
            lambda: stridedfa.attention(*wrapped, causal=True),
    }
    results = {name: per_call_us(fn, args.calls, sync) for name, fn in rows.items()}
    for name, us in results.items():
        print(f"{us:8.2f} us/call  {name}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        report = {"problem": {"b": b, "h": h, "s": s, "d": d, "dtype": "float16", "causal": True},
                  "host_us_per_call": results, "cupy": cp.__version__,
                  "stridedfa": stridedfa.__version__}
        (args.out / "cupy_host.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
