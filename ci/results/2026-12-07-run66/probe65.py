"""Probe (GPU run 65, stop 44): can a growing head-major dense cache (b, h_kv, L, d) -- transformers'
dynamic cache, whose strides grow with L -- be handed to cuDNN's fast one-query paged kernel with
graph keys that do not grow? Each (batch entry, kv head) one sequence of a paged problem over the
cache's own memory: (a) blocks of 1 token (a valid container: (N, 1, 1, d)), (b) blocks of 16 tokens
that start every token (container block stride d < 16 d: overlapping blocks), the table made on the
device. Accuracy against the fp32 reference; CUDA-graph replayed µs beside the exact plan and SDPA."""
import json, os, sys
from pathlib import Path
import torch
import torch.nn.functional as F
import stridedfa
from stridedfa import _core

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from decode_timing import graphed_us  # noqa: E402

H_Q, H_KV, D = 32, 8, 128
G = H_Q // H_KV


def safe(fn):
    """µs per call replayed from a CUDA graph (decode_timing.py), or why it could not run."""
    us = graphed_us(fn, 3, 20)
    return round(us, 2) if isinstance(us, float) else us


rows = []
_core._split_kv(False)
for b, L in ((1, 1000), (1, 7000), (8, 1000), (8, 7000)):
    k = torch.randn(b, H_KV, L, D, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
    q = torch.randn(b, H_Q, 1, D, device="cuda", dtype=torch.bfloat16)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
    row = {"b": b, "L": L}
    _core._decode_graphs(False)
    out = torch.empty_like(q)
    row["exact_unmasked"] = safe(lambda: stridedfa.sdpa_forward(q, k, v, out, causal=True, causal_alignment="bottom_right"))
    row["exact_err"] = (out.float() - ref).abs().max().item()
    row["sdpa"] = safe(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    n = b * H_KV
    q_seq = q.view(b, H_KV, G, 1, D).reshape(n, G, 1, D)  # each (entry, kv head): its group's heads
    out_seq = torch.empty_like(q_seq)
    lengths = torch.full((n,), L, device="cuda", dtype=torch.int32)
    starts = torch.arange(n, device="cuda", dtype=torch.int32) * L  # each sequence's first token
    for block in (1, 16):
        width = -(-L // block)
        table = (starts[:, None] + torch.arange(width, device="cuda", dtype=torch.int32)[None, :] * block).contiguous()
        tokens = n * L
        # block id i starts at token i (stride d): blocks overlap when block > 1
        kc = k.as_strided((tokens - block + 1 if block > 1 else tokens, 1, block, D), (D, D, D, 1))
        vc = v.as_strided(kc.shape, kc.stride())
        if block > 1:  # the last sequence's last block would run past the cache: not probed here
            table = table.clamp(max=kc.shape[0] - 1)
        name = f"paged_block{block}"
        out_seq.fill_(float("nan"))
        row[name] = safe(lambda: stridedfa.sdpa_forward(q_seq, kc, vc, out_seq, block_table=table, seqlens_kv=lengths))
        got = out_seq.view(b, H_KV, G, 1, D).reshape(b, H_Q, 1, D).float()
        row[name + "_err"] = (got - ref).abs().max().item() if not isinstance(row[name], str) else None
        row[name + "_err_first_seqs"] = (got - ref)[:, : H_Q - G].abs().max().item() if not isinstance(row[name], str) and b * H_KV > 1 else None
    print(row, flush=True); rows.append(row)
_core._decode_graphs(True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "probe65.json"), "w"), indent=1)
