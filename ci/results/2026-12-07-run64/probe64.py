"""Probe (GPU run 64, stop 44): why cuDNN's one-query graphs are slow at small batch. Times, replayed
from CUDA graphs (GPU time only), the unsplit paged step and the dense decoding step with and
without the statistics output (lse) and with and without query lengths, against SDPA."""
import json, os, sys
import torch
import torch.nn.functional as F
import stridedfa
from stridedfa import _core

H_Q, H_KV, D, BLOCK = 32, 8, 128, 16
torch.manual_seed(0)


def graphed(fn, iters=20):
    side = torch.cuda.Stream(); side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    g.replay(); torch.cuda.synchronize()
    s.record()
    for _ in range(5):
        g.replay()
    e.record(); torch.cuda.synchronize()
    return round(s.elapsed_time(e) * 1000 / 5 / iters, 2)


def safe(fn):
    try:
        return graphed(fn)
    except Exception as error:
        return f"{type(error).__name__}: {error}"[:160]


rows = []
_core._split_kv(False)
for b, L in ((1, 1024), (1, 8192), (8, 8192), (32, 8192)):
    blocks = L // BLOCK
    cache = torch.randn(b * blocks, 2, BLOCK, H_KV, D, device="cuda", dtype=torch.bfloat16)
    kc, vc = cache[:, 0].transpose(1, 2), cache[:, 1].transpose(1, 2)
    table = torch.randperm(b * blocks, device="cuda").view(b, blocks).to(torch.int32)
    lens = torch.full((b,), L, device="cuda", dtype=torch.int32)
    ones = torch.ones((b,), device="cuda", dtype=torch.int32)
    q = torch.randn(b, H_Q, 1, D, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    lse = torch.empty(b, H_Q, 1, device="cuda")
    row = {"kind": "paged", "b": b, "L": L}
    row["plain"] = safe(lambda: stridedfa.sdpa_forward(q, kc, vc, out, block_table=table, seqlens_kv=lens))
    row["lse"] = safe(lambda: stridedfa.sdpa_forward(q, kc, vc, out, lse=lse, block_table=table, seqlens_kv=lens))
    row["seqlens_q"] = safe(lambda: stridedfa.sdpa_forward(q, kc, vc, out, block_table=table, seqlens_kv=lens, seqlens_q=ones))
    row["lse+seqlens_q"] = safe(lambda: stridedfa.sdpa_forward(q, kc, vc, out, lse=lse, block_table=table, seqlens_kv=lens, seqlens_q=ones))
    row["causal_br"] = safe(lambda: stridedfa.sdpa_forward(q, kc, vc, out, block_table=table, seqlens_kv=lens, causal=True, causal_alignment="bottom_right"))
    _core._split_kv(True)
    row["split_auto"] = safe(lambda: stridedfa.sdpa_forward(q, kc, vc, out, block_table=table, seqlens_kv=lens))
    _core._split_kv(False)
    print(row, flush=True); rows.append(row)
    del cache
for b, L in ((1, 1000), (1, 7000), (8, 1000), (8, 7000)):
    k = torch.randn(b, H_KV, L, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(b, H_Q, 1, D, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    lse = torch.empty(b, H_Q, 1, device="cuda")
    row = {"kind": "dense", "b": b, "L": L}
    for bucket in (False, True):
        _core._decode_graphs(bucket)
        name = "by_heads" if bucket else "exact"
        row[name] = safe(lambda: stridedfa.sdpa_forward(q, k, v, out, causal=True, causal_alignment="bottom_right"))
        row[name + "_lse"] = safe(lambda: stridedfa.sdpa_forward(q, k, v, out, lse=lse, causal=True, causal_alignment="bottom_right"))
        row[name + "_nomask"] = safe(lambda: stridedfa.sdpa_forward(q, k, v, out))
    row["sdpa"] = safe(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
        row["sdpa_cudnn"] = safe(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    print(row, flush=True); rows.append(row)
_core._decode_graphs(True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "probe64.json"), "w"), indent=1)
