"""Probe 2 (GPU run 64, stop 44): is cuDNN's fast one-query kernel picked only for a declared query
extent of 1 and no causal mask? Dense s_q 1 vs 2 unmasked; ragged (varlen) one query per sequence
declared max_seqlen_q 1 vs 8; CUDA-graph replayed µs."""
import json, os
import torch
from stridedfa import _core
import stridedfa
from stridedfa.flash_attn_interface import flash_attn_varlen_func

H_Q, H_KV, D = 32, 8, 128


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
for b, L in ((1, 1000), (1, 7000), (8, 7000)):
    k = torch.randn(b, H_KV, L, D, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
    row = {"b": b, "L": L}
    _core._decode_graphs(False)
    for s_q in (1, 2, 4):
        q = torch.randn(b, H_Q, s_q, D, device="cuda", dtype=torch.bfloat16); out = torch.empty_like(q)
        row[f"dense_sq{s_q}_nomask"] = safe(lambda: stridedfa.sdpa_forward(q, k, v, out))
        row[f"dense_sq{s_q}_causal_br"] = safe(lambda: stridedfa.sdpa_forward(q, k, v, out, causal=True, causal_alignment="bottom_right"))
    # varlen: token-major packed keys (b*L, h_kv, d), one query per sequence
    kt = torch.randn(b * L, H_KV, D, device="cuda", dtype=torch.bfloat16); vt = torch.randn_like(kt)
    qt = torch.randn(b, H_Q, D, device="cuda", dtype=torch.bfloat16)
    cu_q = torch.arange(b + 1, device="cuda", dtype=torch.int32)
    cu_k = torch.arange(b + 1, device="cuda", dtype=torch.int32) * L
    for mq in (1, 8):
        for causal in (False, True):
            row[f"varlen_maxq{mq}_{'causal' if causal else 'nomask'}"] = safe(
                lambda: flash_attn_varlen_func(qt, kt, vt, cu_q, cu_k, mq, L, causal=causal))
    _core._decode_graphs(True)
    q = torch.randn(b, H_Q, 1, D, device="cuda", dtype=torch.bfloat16); out = torch.empty_like(q)
    row["by_heads_nomask"] = safe(lambda: stridedfa.sdpa_forward(q, k, v, out))
    print(row, flush=True); rows.append(row)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "probe64b.json"), "w"), indent=1)
