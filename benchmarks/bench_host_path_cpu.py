"""The C++ host work of a call between reading its operands and launching it, on any machine:
validation, the options' rules, the plan and the graph-cache key, for a call described by shapes
(the views the JAX handlers build; nothing is allocated, read or run). For comparing two builds of
stridedfa -- a change's before and after -- on a machine without a GPU: run it under each
(PYTHONPATH pointing at each install) in alternation and compare the µs per call.

Not a figure users see, and not against a peer: intake, allocation, cuDNN's graph-cache lookup and
the launch are missing (the GPU host's `bench_host_overhead.py` measures what users pay, beside
torch SDPA). What this isolates is the part of every call that the one-call-path redesign (issue 31)
rewrote in C++ (the operand table, validation, the plan).

    python benchmarks/bench_host_path_cpu.py --out DIR [--label before] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import stridedfa
from stridedfa import _core

B, S, H, HKV, D = 2, 1024, 16, 4, 64
BSHD, THD = 0, 2  # the layouts' codes


def _cases():
    q, kv = (B, S, H, D), (B, S, HKV, D)
    forward = (q, kv, kv, q, (B, H, S))
    backward = (q, kv, kv, q, (B, H, S), q, q, kv, kv)
    tokens = B * S
    tq, tkv = (tokens, H, D), (tokens, HKV, D)
    int32 = ((B,), "int32")
    return {
        "forward_causal": lambda: _core._validate_shapes(False, BSHD, forward, "bfloat16", causal=True),
        "forward_variants": lambda: _core._validate_shapes(
            False, BSHD, forward, "bfloat16", causal=True, lengths=(int32, int32), sinks=((H,), "float32"),
            bias=((1, H, S, S), "bfloat16")),
        "forward_varlen": lambda: _core._validate_shapes(
            False, THD, (tq, tkv, tkv, tq, (tokens, H)), "bfloat16", causal=True,
            cu_seqlens=(((B + 1,), "int32"), ((B + 1,), "int32"))),
        "backward_causal": lambda: _core._validate_shapes(True, BSHD, backward, "bfloat16", causal=True),
    }


def _time(fn, calls: int, rounds: int) -> float:
    """µs per call: the best of `rounds` rounds of `calls` calls (the least disturbed)."""
    for _ in range(50):
        fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--label", default="this build", help="what to call this build in the results")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    results = {name: round(_time(fn, args.calls, args.rounds), 3) for name, fn in _cases().items()}
    record = {"label": args.label, "stridedfa": getattr(stridedfa, "__version__", "?"),
              "module": str(Path(_core.__file__).parent), "python": platform.python_version(),
              "machine": platform.processor() or platform.machine(), "us_per_call": results}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"host_path_cpu_{args.label.replace(' ', '_')}.json").write_text(json.dumps(record, indent=1))
    print(json.dumps(record))


if __name__ == "__main__":
    main()
