"""Probe (GPU run 73): where a one-query paged decoding step at small batch spends the ~5 µs it
trails SDPA on the gathered cache by (issue 33 item 2: b1 x 8k 16.5 against 11.8 µs replayed in run
70). torch.profiler's CUDA kernels with their mean durations, for stridedfa's default paged step,
stridedfa dense on the gathered cache (cuDNN's dense one-query kernel), and SDPA on it (its backend
named), at b1 x 1k, b1 x 8k and b32 x 1k; and the replayed µs of each beside."""
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import bench_paged  # noqa: E402
from decode_timing import graphed_us  # noqa: E402

import stridedfa.torch as st  # noqa: E402

out_rows = []


def kernels(fn, calls=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    totals, counts = defaultdict(float), defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            totals[e.name[:90]] += e.device_time
            counts[e.name[:90]] += 1
    return {name: {"per_call": counts[name] / calls, "mean_us": totals[name] / counts[name]} for name in totals}


for batch, length in ((1, 1024), (1, 8192), (32, 1024)):
    cache, k_cache, v_cache, table, lengths, q = bench_paged.paged_inputs(batch, length, 1)
    k_full, v_full = bench_paged.gathered_cache(batch, length, k_cache, v_cache, table)
    steps = {
        "stridedfa_paged": lambda: st.attention_with_kvcache(q, k_cache, v_cache, table, lengths),
        "stridedfa_dense_gathered": lambda: st.attention(q, k_full, v_full),
        "sdpa_gathered": lambda: F.scaled_dot_product_attention(q, k_full, v_full, enable_gqa=True),
    }
    row = {"batch": batch, "cache_length": length}
    for name, fn in steps.items():
        row[name] = {"replayed_us": graphed_us(fn, 3, 20), "kernels": kernels(fn)}
        print(batch, length, name, round(row[name]["replayed_us"], 2) if isinstance(row[name]["replayed_us"], float)
              else row[name]["replayed_us"], {k[:60]: (v["per_call"], round(v["mean_us"], 2))
                                              for k, v in row[name]["kernels"].items()}, flush=True)
    out_rows.append(row)
    json.dump(out_rows, open(os.path.join(os.environ.get("OUT", "."), "probe73.json"), "w"), indent=1)
