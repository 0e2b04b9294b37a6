import torch, stridedfa.torch as st
b, hq, hkv, s, d = 2, 8, 2, 2048, 128
def t(h): return torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
q, k, v = t(hq), t(hkv), t(hkv)
g = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2).contiguous().transpose(1, 2)
full = torch.full((b,), s, dtype=torch.int32, device="cuda")
right = torch.tensor([s, s * 5 // 8], dtype=torch.int32, device="cuda")
zeros = torch.zeros(b, 1, 1, s, dtype=torch.bfloat16, device="cuda")
cases = {"plain": {}, "seqlens_full": dict(seqlens_kv=full), "bias": dict(bias=zeros),
         "bias+seqlens_full": dict(bias=zeros, seqlens_kv=full), "seqlens_right": dict(seqlens_kv=right),
         "bias+seqlens_right": dict(bias=zeros, seqlens_kv=right)}
def run(kw):
    out = st.attention(q, k, v, causal=True, **kw); out.backward(g)
for name, kw in cases.items():
    for _ in range(3): run(kw)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    e0.record()
    for _ in range(20): run(kw)
    e1.record(); torch.cuda.synchronize()
    print(f"{name:20s} fwd+bwd {e0.elapsed_time(e1) / 20 * 1000:8.1f} us")
