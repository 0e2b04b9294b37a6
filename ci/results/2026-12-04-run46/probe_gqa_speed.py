import torch, torch.nn.functional as F
import stridedfa.torch as st
from torch.profiler import profile, ProfilerActivity

def timed(fn, n=10):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(n):
        s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    return sorted(ts)[n // 2]

def make(b, s_, h, layout):
    if layout == "bhsd":
        return torch.randn(b, h, s_, 128, device="cuda", dtype=torch.bfloat16).requires_grad_()
    if layout == "fused":  # gpt2/neox: a view of one (b, s, 3, h, d) projection
        base = torch.randn(b, s_, 3, h, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        return base[:, :, 0].transpose(1, 2)
    return torch.randn(b, s_, h, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()

for b, s_, hq, hkv, lq, lv in ((8, 4096, 16, 4, "bshd", "bshd"), (8, 4096, 16, 16, "bshd", "bshd"), (2, 2048, 16, 4, "bshd", "bshd"),
                               (2, 2048, 16, 16, "bhsd", "fused"), (2, 2048, 16, 16, "fused", "fused")):
    q, k, v = make(b, s_, hq, lq), make(b, s_, hkv, lq), make(b, s_, hkv, lv)
    g = torch.randn(b, s_, hq, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    def ours(): st.attention(q, k, v, causal=True, causal_alignment="bottom_right").backward(g)
    def sdpa(): F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hq != hkv).backward(g)
    def sdpa_cudnn():
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hq != hkv).backward(g)
    row = {"shape": (b, s_, hq, hkv, lq, lv), "ours": timed(ours), "sdpa_default": timed(sdpa)}
    try: row["sdpa_cudnn"] = timed(sdpa_cudnn)
    except Exception as e: row["sdpa_cudnn"] = str(e)[:80]
    with profile(activities=[ProfilerActivity.CUDA]) as p: sdpa(); torch.cuda.synchronize()
    row["sdpa_kernels"] = sorted({e.name[:60] for e in p.events() if e.device_type.name == "CUDA" and ("attn" in e.name.lower() or "fmha" in e.name.lower() or "flash" in e.name.lower() or "cudnn" in e.name.lower())})[:4]
    with profile(activities=[ProfilerActivity.CUDA]) as p: ours(); torch.cuda.synchronize()
    row["our_kernels"] = sorted([(e.key[:50], round(e.device_time_total/1000, 2)) for e in p.key_averages() if e.device_time_total > 200], key=lambda x: -x[1])[:8]
    print(row, flush=True)
