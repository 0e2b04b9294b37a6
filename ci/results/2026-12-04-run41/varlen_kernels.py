# Where a varlen training step's device time goes: torch.profiler's CUDA kernel table for the THD
# step (max_seqlen given) and the padded step with seqlens, same documents as bench_varlen.
import sys, torch
sys.path.insert(0, sys.argv[1])
from bench_varlen import documents
import stridedfa.torch as st
from torch.profiler import ProfilerActivity, profile
h, d, total = 16, 128, 16384
lengths = documents(total, 64, 4096, seed=0)
b, s_max = len(lengths), max(lengths)
dt, dev = torch.bfloat16, "cuda"
cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=dev)
seqlens = torch.tensor(lengths, dtype=torch.int32, device=dev)
q, k, v = (torch.randn(total, h, d, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
grad = torch.randn(total, h, d, device=dev, dtype=dt)
qp, kp, vp = (torch.randn(b, h, s_max, d, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
gradp = torch.randn(b, h, s_max, d, device=dev, dtype=dt)
# the padded batch in token-major (b, s, h, d) memory: THD's layout, without the ragged offsets
qs, ks, vs = (torch.randn(b, s_max, h, d, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
grads = torch.randn(b, s_max, h, d, device=dev, dtype=dt).transpose(1, 2)
steps = {
    "thd_max": lambda: st.varlen_attention(q, k, v, cu, cu, s_max, s_max, causal=True).backward(grad),
    "thd_fwd": lambda: st.varlen_attention(q.detach(), k.detach(), v.detach(), cu, cu, s_max, s_max, causal=True),
    "padded_bhsd": lambda: st.attention(qp, kp, vp, causal=True, seqlens_q=seqlens, seqlens_kv=seqlens).backward(gradp),
    "padded_bshd": lambda: st.attention(qs.transpose(1, 2), ks.transpose(1, 2), vs.transpose(1, 2), causal=True,
                                        seqlens_q=seqlens, seqlens_kv=seqlens).backward(grads),
    "padded_bhsd_fwd": lambda: st.attention(qp.detach(), kp.detach(), vp.detach(), causal=True, seqlens_q=seqlens, seqlens_kv=seqlens),
}
for name, fn in steps.items():
    for _ in range(3): fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5): fn()
        torch.cuda.synchronize()
    print(f"=== {name} (5 steps)")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=90))
