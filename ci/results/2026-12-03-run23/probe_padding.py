# What cuDNN writes at padded rows / keys (poisoned with NaN first), printed for the record.
import torch, stridedfa
b, h, s, d = 2, 2, 128, 64
q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
sq = torch.tensor([128, 50], device="cuda", dtype=torch.int32)
out = torch.full_like(q, float("nan")); lse = torch.full((b, h, s), float("nan"), device="cuda")
stridedfa.sdpa_forward(q, k, v, out, lse=lse, seqlens_q=sq, seqlens_kv=sq)
go = torch.randn_like(out)
g = [torch.full_like(t, float("nan")) for t in (q, k, v)]
stridedfa.sdpa_backward(q, k, v, out, go, lse, *g, seqlens_q=sq, seqlens_kv=sq)
torch.cuda.synchronize()
for name, t in (("out", out), ("lse", lse), ("dq", g[0]), ("dk", g[1]), ("dv", g[2])):
    pad = t[1, :, 50:]
    print(f"PROBE {name}: padded rows nan={int(torch.isnan(pad).sum())}/{pad.numel()} zero={int((pad == 0).sum())} "
          f"neginf={int(torch.isneginf(pad).sum())} sample={pad.flatten()[:3].tolist()}; valid nan={int(torch.isnan(t[1, :, :50]).sum())}")
