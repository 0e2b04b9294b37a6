import torch
import stridedfa.torch as st
def timed(fn, n=10):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(n):
        s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    return sorted(ts)[n // 2]
for b, s_, hq, hkv in ((8, 4096, 16, 4), (2, 2048, 16, 16)):
    q = torch.randn(b, s_, hq, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
    k = torch.randn(b, s_, hkv, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
    v = torch.randn(b, s_, hkv, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
    g = torch.randn(b, s_, hq, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    row = {"shape": (b, s_, hq, hkv)}
    for al in ("top_left", "bottom_right"):
        row[al] = timed(lambda: st.attention(q, k, v, causal=True, causal_alignment=al).backward(g))
        row[al + "_fwd"] = timed(lambda: st.attention(q.detach(), k.detach(), v.detach(), causal=True, causal_alignment=al))
    print(row, flush=True)
