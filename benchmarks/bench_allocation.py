"""Host time of the device memory stridedfa owns (DeviceBuffer outputs, cuDNN workspace) against
cuda-python's cuda.core memory resource, in one run, on one stream.

stridedfa allocates outputs for producers without an adapter (stridedfa.attention on a DLPack
producer) and cuDNN's workspace from its own stream-ordered pool (cpp/src/runtime.cpp). cuda.core
offers the same service (DeviceMemoryResource over the device's stream-ordered pool, Buffer, and a
typed StridedMemoryView over it). This benchmark times both for the sizes a call needs:

- ``alloc_free/<size>``: one allocation and its stream-ordered free, per iteration;
- ``attention_call``: a whole tiny attention call whose q, k, v are cuda.core views (no adapter),
  with its output allocated by stridedfa (``stridedfa.attention``) or by cuda.core
  (``sdpa_forward`` into a StridedMemoryView over ``DeviceMemoryResource.allocate``).

Each row is timed back to back (the stream synchronised once per round) and reported as the
median over rounds of host microseconds per iteration; ratios are cuda.core over stridedfa.

    python benchmarks/bench_allocation.py --out benchmarks/results/latest/<run>/allocation.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import numpy as np

SHAPE = (1, 4, 64, 64)  # b, h, s, d: host-bound, as in bench_host_overhead.py
SIZES = {"32KiB": 32 << 10, "1MiB": 1 << 20, "64MiB": 64 << 20}


def timed(fn, calls, rounds, sync):
    for _ in range(max(calls // 10, 10)):
        fn()
    sync()
    per_call = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - start) / calls * 1e6)
        sync()
    return {"median_us": statistics.median(per_call), "min_us": min(per_call),
            "rounds_us": per_call}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the JSON here")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    from cuda.core import Device
    from cuda.core import __version__ as cuda_core_version
    from cuda.core.utils import StridedMemoryView

    import stridedfa

    device = Device()
    device.set_current()
    stream = device.create_stream()
    handle = int(stream.handle)
    mr = device.memory_resource
    sync = stream.sync

    rows = {}
    for label, nbytes in SIZES.items():
        def ours(nbytes=nbytes):
            stridedfa._core._device_buffer((nbytes // 2,), (1,), "float16", device.device_id, handle)

        def theirs(nbytes=nbytes):
            mr.allocate(nbytes, stream=stream).close(stream=stream)

        rows[f"alloc_free/{label}"] = {"stridedfa_pool": timed(ours, args.calls, args.rounds, sync),
                                       "cuda_core": timed(theirs, args.calls, args.rounds, sync)}

    b, h, s, d = SHAPE
    strides = (h * s * d, s * d, d, 1)
    nbytes = b * h * s * d * 2
    views = []
    for _ in range(3):  # q, k, v: cuda.core views, a producer stridedfa has no adapter for
        memory = mr.allocate(nbytes, stream=stream)
        memory.fill(np.array(0.5, np.float16).tobytes(), stream=stream)  # host time ignores values
        view = StridedMemoryView.from_buffer(memory, SHAPE, strides, dtype=np.dtype(np.float16))
        views.append(view)
    q, k, v = views

    def stridedfa_output():
        stridedfa.attention(q, k, v, stream=stream)

    def cuda_core_output():
        out = StridedMemoryView.from_buffer(mr.allocate(nbytes, stream=stream), SHAPE, strides,
                                            dtype=np.dtype(np.float16))
        stridedfa.sdpa_forward(q, k, v, out, stream=stream)

    rows["attention_call"] = {"stridedfa_pool": timed(stridedfa_output, args.calls, args.rounds, sync),
                              "cuda_core": timed(cuda_core_output, args.calls, args.rounds, sync)}

    for row in rows.values():
        row["cuda_core_over_stridedfa"] = row["cuda_core"]["median_us"] / row["stridedfa_pool"]["median_us"]
    result = {"schema": "stridedfa.bench_allocation/1",
              "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "host": platform.node(), "gpu": device.name, "cuda_core": cuda_core_version,
              "stridedfa": stridedfa.__version__, "build": stridedfa.info().get("build"),
              "shape": SHAPE, "calls": args.calls, "rounds": args.rounds, "rows": rows}
    for name, row in rows.items():
        print(f"{name:22s} stridedfa {row['stridedfa_pool']['median_us']:7.2f} us   cuda.core "
              f"{row['cuda_core']['median_us']:7.2f} us   ratio {row['cuda_core_over_stridedfa']:.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
