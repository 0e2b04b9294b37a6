"""What a new cache length costs a decoding step (issue 33 item 1): stridedfa's decoding by heads
(STRIDEDFA_DECODE_GRAPHS=bucketed: one graph per doubling of the cache) against its exact plan
(STRIDEDFA_DECODE_GRAPHS=exact: a graph per length; bucketed is the default) and torch's SDPA, in one run.

Per batch size and cache length L (GQA 32/8, head dim 128, bf16, one query, causal bottom-right,
transformers' head-major dynamic cache: a fresh (b, 8, L, 128) tensor per step):
  - first call at a length never seen (ms, graphs built): what the first step of a new length
    costs, build included;
  - steady state (µs per call, back to back, synchronised once at the end), against SDPA, and
    replayed from a CUDA graph (GPU time alone: decode_timing.py);
  - a decoding loop of 1,000 steps of growing length from 500 (the exact plan: 100 steps, a build
    each): graphs built and seconds.
The exact plan runs in a child process (the switch is read once per process). A script, never a test.

    python benchmarks/bench_decode_lengths.py --out bench-out [--quick] [--ragged]

The bucketed rows go by heads as the library does by default (one query over a head-major cache
through a paged view of it); --ragged: in the ragged form instead (STRIDEDFA_DECODE_GRAPHS=ragged).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

H_Q, H_KV, D = 32, 8, 128


def measure(batches, lengths, loop_steps, iters):
    import torch
    import torch.nn.functional as F
    from decode_timing import graphed_us

    import stridedfa
    import stridedfa.torch as st

    def builds():
        return stridedfa.cache_info()["builds"]

    def steady(fn, *args, **kwargs):
        for _ in range(3):
            fn(*args, **kwargs)
        torch.cuda.synchronize()
        began = time.perf_counter()
        for _ in range(iters):
            fn(*args, **kwargs)
        torch.cuda.synchronize()
        return (time.perf_counter() - began) / iters * 1e6

    dev, dt = "cuda", torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for b in batches:
        q = torch.randn(b, H_Q, 1, D, generator=gen, device=dev, dtype=dt)
        for length in lengths:
            k, v = (torch.randn(b, H_KV, length, D, generator=gen, device=dev, dtype=dt) for _ in range(2))
            options = dict(causal=True, causal_alignment="bottom_right")
            before = builds()
            torch.cuda.synchronize()
            began = time.perf_counter()
            out = st.attention(q, k, v, **options)
            torch.cuda.synchronize()
            first_ms = (time.perf_counter() - began) * 1e3
            built = builds() - before
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)

            def mine(q=q, k=k, v=v, options=options):
                return st.attention(q, k, v, **options)

            def sdpa(q=q, k=k, v=v):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            rows.append({"b": b, "L": length, "first_call_ms": first_ms, "first_call_builds": built,
                         "steady_us": steady(mine), "sdpa_steady_us": steady(sdpa),
                         "graphed_us": graphed_us(mine, 3, 20), "sdpa_graphed_us": graphed_us(sdpa, 3, 20),
                         "max_error": (out.float() - ref).abs().max().item()})
            print(json.dumps(rows[-1]), flush=True)
    q = torch.randn(1, H_Q, 1, D, generator=gen, device=dev, dtype=dt)
    k_all, v_all = (torch.randn(1, H_KV, 500 + loop_steps, D, generator=gen, device=dev, dtype=dt) for _ in range(2))
    before = builds()
    torch.cuda.synchronize()
    began = time.perf_counter()
    for length in range(500, 500 + loop_steps):
        st.attention(q, k_all[:, :, :length].contiguous(), v_all[:, :, :length].contiguous(), causal=True,
                     causal_alignment="bottom_right")
    torch.cuda.synchronize()
    loop = {"steps": loop_steps, "from": 500, "builds": builds() - before, "seconds": time.perf_counter() - began}
    return {"rows": rows, "loop": loop, "device": torch.cuda.get_device_name(),
            "cudnn": torch.backends.cudnn.version(), "torch": torch.__version__}


def table(by_heads, exact):
    def us(row, name):
        value = row.get(name)
        return f"{value:.1f}" if isinstance(value, float) else "-"

    lines = ["| b | L | first call ms (builds): by heads | exact | steady µs: by heads | exact | SDPA "
             "| by heads / SDPA | CUDA graph µs: by heads | exact | SDPA |", "|---" * 11 + "|"]
    for h, e in zip(by_heads["rows"], exact["rows"]):
        lines.append(f"| {h['b']} | {h['L']} | {h['first_call_ms']:.1f} ({h['first_call_builds']}) | "
                     f"{e['first_call_ms']:.1f} ({e['first_call_builds']}) | {h['steady_us']:.1f} | "
                     f"{e['steady_us']:.1f} | {h['sdpa_steady_us']:.1f} | {h['steady_us'] / h['sdpa_steady_us']:.2f} | "
                     f"{us(h, 'graphed_us')} | {us(e, 'graphed_us')} | {us(h, 'sdpa_graphed_us')} |")
    for name, run in (("by heads", by_heads), ("exact", exact)):
        loop = run["loop"]
        lines.append(f"\n{name}: {loop['steps']} decoding steps of growing length from {loop['from']}: "
                     f"{loop['builds']} graphs built, {loop['seconds']:.2f} s")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--ragged", action="store_true", help="by heads in the ragged form, not the paged view")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    batches, lengths = ([1, 8], [100, 1000, 3000, 7000]) if args.quick else ([1, 8, 32], [100, 1000, 3000, 7000, 15000])
    loop_steps, iters = (1000, 50) if args.quick else (1000, 200)
    if args.child:  # the exact plan builds a graph per step (~0.1 s each): its loop is 100 steps
        Path(args.child).write_text(json.dumps(measure(batches, lengths, 100, iters)))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    exact_file = args.out / "exact.json"
    env = dict(os.environ, STRIDEDFA_DECODE_GRAPHS="exact")
    subprocess.run([sys.executable, __file__, "--out", str(args.out), "--child", str(exact_file)]
                   + (["--quick"] if args.quick else []), env=env, check=True)
    exact = json.loads(exact_file.read_text())
    from stridedfa import _core

    _core._decode_graphs(True)
    _core._decode_heads_paged(not args.ragged)
    by_heads = measure(batches, lengths, loop_steps, iters)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from provenance import provenance

    import stridedfa

    result = {"by_heads": by_heads, "exact": exact, "heads_paged": not args.ragged,
              "provenance": provenance(stridedfa)}
    (args.out / "decode_lengths.json").write_text(json.dumps(result, indent=1))
    (args.out / "decode_lengths.md").write_text(table(by_heads, exact))
    exact_file.unlink()
    print(table(by_heads, exact))


if __name__ == "__main__":
    main()
