"""Probe (GPU run 74): could cuDNN's *general* kernel read a GQA group's keys once if the group and the
tokens were folded into its query rows, and keep the GPU busy if the keys were split into chunks
(flash-decoding's layout)? Issue 33 item 3: 4-16 queries per sequence at batch 8 reach only 32-57% of
the copy ceiling (run 73), because cuDNN's one-query kernel rereads the keys per folded head.

For (batch, keys, tokens): stridedfa's default plan (q token-major, causal bottom-right), then the
prefix as it would run folded -- q (batch x C, h_kv, group x tokens, d), unmasked, over C chunks of
the paged cache (each chunk a sequence with its slice of the table) -- paged and on dense gathered
chunks, for C = 1..16; µs replayed from a CUDA graph; GB/s of the cache read. Without the tail and
the log-sum-exp merge (~10-20 µs measured for the split's, run 71), and without the copy of q."""
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import bench_paged  # noqa: E402
from decode_timing import graphed_us  # noqa: E402

import stridedfa.torch as st  # noqa: E402

H_Q, H_KV, D, BLOCK = bench_paged.H_Q, bench_paged.H_KV, bench_paged.D, bench_paged.BLOCK
rows_out = []
for batch, length, tokens in ((8, 8192, 4), (8, 8192, 8), (8, 8192, 16), (32, 8192, 8), (32, 8192, 16),
                              (8, 2048, 8), (1, 8192, 16)):
    cache, k_cache, v_cache, table, lengths, q = bench_paged.paged_inputs(batch, length, tokens)
    gbytes = batch * length * H_KV * D * 2 * 2 / 1e9
    row = {"batch": batch, "keys": length, "tokens": tokens,
           "default_us": graphed_us(lambda: st.attention_with_kvcache(q, k_cache, v_cache, table, lengths), 3, 20)}
    folded_rows = H_Q // H_KV * tokens
    for chunks in (1, 2, 4, 8, 16):
        per = length // chunks
        t = table.view(batch, chunks, per // BLOCK).reshape(batch * chunks, per // BLOCK).contiguous()
        lens = torch.full((batch * chunks,), per, device="cuda", dtype=torch.int32)
        qf = torch.randn(batch * chunks, H_KV, folded_rows, D, device="cuda", dtype=torch.bfloat16)
        paged = graphed_us(lambda: st.attention_with_kvcache(qf, k_cache, v_cache, t, lens, causal=False), 3, 20)
        kd, vd = (torch.randn(batch * chunks, H_KV, per, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        dense = graphed_us(lambda: st.attention(qf, kd, vd), 3, 20)
        row[f"C{chunks}"] = {"paged_us": paged, "dense_us": dense,
                             "paged_GBps": gbytes / (paged * 1e-6) if isinstance(paged, float) else None}
        del kd, vd
    print(json.dumps(row), flush=True)
    rows_out.append(row)
    json.dump(rows_out, open(os.path.join(os.environ.get("OUT", "."), "probe74.json"), "w"), indent=1)
