#!/usr/bin/env python3
"""Time to the first result in a fresh process: cold, and with persisted plans (issue 14 (b)).

Each measurement is a new Python process (the graph cache lives in a process) that imports torch
and stridedfa, makes its tensors, and times its first calls of one configuration with a
``torch.cuda.synchronize()`` after each:

- ``cold``: an empty plan directory (STRIDEDFA_CACHE_DIR): cuDNN is loaded and every graph built;
- ``persisted``: the directory the cold process filled: every graph loaded from its plan;
- ``torch_sdpa``: the same first call through ``F.scaled_dot_product_attention`` (cuDNN backend),
  which builds its graphs too and keeps nothing across processes -- the peer's cold start.

Per process it reports: import (torch + stridedfa), the first call (library loading, graph build or
plan load, launch), of which ``graph_seconds`` was building or loading graphs (cache_info's
build_seconds, so plan-load time apart from process start), the second call (the steady state),
and ``new_shape``: the first call of another sequence length in the same, warm process (a new
graph with cuDNN already loaded; for persisted processes the directory holds that shape too).
Medians over ``--repeats`` processes per row, alternating rows.

Usage: ``python benchmarks/bench_cold_start.py --out DIR [--repeats N]``; writes
``DIR/bench_cold_start.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CONFIGS = {
    # name: (b, h_q, h_kv, s, d, causal, training)
    "train_2x16x4096x128_causal": (2, 16, 16, 4096, 128, True, True),
    "infer_8x32x8_1024x128_causal": (8, 32, 8, 1024, 128, True, False),
}

# The child: argv = config name, mode ("stridedfa" or "torch_sdpa"). Prints one JSON line.
_CHILD = r"""
import json, sys, time
start = time.perf_counter()
import torch, stridedfa, stridedfa.torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
imported = time.perf_counter()
b, h_q, h_kv, s, d, causal, training = json.loads(sys.argv[1])
mode = sys.argv[2]

def tensors(s):
    make = lambda h: torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    kv_heads = h_q if mode == "torch_sdpa" else h_kv  # torch's cuDNN backend may refuse grouped heads
    q, k, v = make(h_q), make(kv_heads), make(kv_heads)
    return [t.requires_grad_(training) for t in (q, k, v)]

def call(q, k, v):
    if mode == "torch_sdpa":
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    else:
        out = stridedfa.torch.attention(q, k, v, causal=causal)
    if training:
        out.backward(torch.ones_like(out))
    torch.cuda.synchronize()

def timed(*args):
    t = time.perf_counter()
    call(*args)
    return time.perf_counter() - t

first_inputs = tensors(s)
torch.cuda.synchronize()
ready = time.perf_counter()
first = timed(*first_inputs)
second = timed(*first_inputs)
graph_seconds = stridedfa.cache_info()["build_seconds"]
new_shape = timed(*tensors(s // 2))
info = stridedfa.cache_info()
print(json.dumps({"import": imported - start, "setup": ready - imported, "first_call": first, "second_call": second,
                  "graph_seconds": graph_seconds, "new_shape": new_shape, "builds": info["builds"],
                  "plan_loads": info["persistent"]["loads"], "plan_saves": info["persistent"]["saves"]}))
"""


def child(config, mode: str, directory: str) -> dict:
    env = dict(os.environ, STRIDEDFA_CACHE_DIR=directory)
    env.pop("STRIDEDFA_PERSISTENT_CACHE", None)
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(config), mode], env=env, capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(repeats: int) -> dict:
    rows: dict = {}
    for name, config in CONFIGS.items():
        samples: dict[str, list[dict]] = {"cold": [], "persisted": [], "torch_sdpa": []}
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as directory:
                samples["cold"].append(child(config, "stridedfa", directory))
                samples["persisted"].append(child(config, "stridedfa", directory))
                samples["torch_sdpa"].append(child(config, "torch_sdpa", directory))
            print(name, {row: round(s[-1]["first_call"] * 1e3, 1) for row, s in samples.items()}, flush=True)
        rows[name] = {row: {field: statistics.median(s[field] for s in runs) for field in runs[0]}
                      for row, runs in samples.items()}
    return rows


def render(rows: dict) -> str:
    lines = ["| config | row | import s | first call ms | of which graphs ms | second call ms | new shape ms |",
             "|---|---|---|---|---|---|---|"]
    for name, by_row in rows.items():
        for row, m in by_row.items():
            graphs = f"{m['graph_seconds'] * 1e3:.1f}" if row != "torch_sdpa" else "-"
            lines.append(f"| {name} | {row} | {m['import']:.2f} | {m['first_call'] * 1e3:.1f} | {graphs} | "
                         f"{m['second_call'] * 1e3:.2f} | {m['new_shape'] * 1e3:.1f} |")
        cold, persisted = by_row["cold"]["first_call"], by_row["persisted"]["first_call"]
        lines.append(f"| {name} | persisted vs cold | | {cold / persisted:.1f}x faster | | | |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from provenance import provenance, save

    import stridedfa

    started = time.perf_counter()
    rows = measure(args.repeats)
    result = {"benchmark": "cold_start", **provenance(stridedfa), "repeats": args.repeats,
              "configs": {name: dict(zip(("b", "h_q", "h_kv", "s", "d", "causal", "training"), c))
                          for name, c in CONFIGS.items()},
              "rows": rows, "seconds": time.perf_counter() - started}
    save(args.out, "bench_cold_start", result, render(rows))


if __name__ == "__main__":
    main()
