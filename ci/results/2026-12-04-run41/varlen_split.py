# Where the varlen forward's host time goes: the generic call, intake + validation alone, and the
# graph key (validation + plan + key), each timed behind a GPU spin; the backward likewise.
import sys, time, torch, stridedfa
from stridedfa import _core
sys.path.insert(0, sys.argv[1])
from bench_varlen import documents
h, d, total = 16, 128, 16384
lengths = documents(total, 64, 4096, seed=0)
s_max = max(lengths)
cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
q, k, v, out, dout, dq, dk, dv = (torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(8))
lse = torch.empty_strided((h, total), (1, h), dtype=torch.float32, device="cuda")
kw = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=s_max, max_seqlen_kv=s_max)
calls = {
  "fwd generic": lambda: stridedfa.sdpa_forward(q, k, v, out, lse=lse, causal=True, **kw),
  "fwd validate": lambda: _core._validate_forward(q, k, v, out, lse, causal=True, **kw),
  "fwd key": lambda: _core._forward_graph_key(q, k, v, out, lse, causal=True, **kw),
  "bwd generic": lambda: stridedfa.sdpa_backward(q, k, v, out, dout, lse, dq, dk, dv, causal=True, **kw),
  "bwd validate": lambda: _core._validate_backward(q, k, v, out, dout, lse, dq, dk, dv, causal=True, **kw),
  "bwd key": lambda: _core._backward_graph_key(q, k, v, out, dout, lse, dq, dk, dv, causal=True, **kw),
  "dense fwd generic": lambda: stridedfa.sdpa_forward(q[None].transpose(1, 2), k[None].transpose(1, 2), v[None].transpose(1, 2), out[None].transpose(1, 2), causal=True),
}
for name, fn in calls.items():
    for _ in range(3): fn()
    torch.cuda.synchronize(); torch.cuda._sleep(2_000_000_000)
    t0 = time.perf_counter()
    for _ in range(20): fn()
    print(f"{name}: {(time.perf_counter() - t0) / 20 * 1e6:.1f} us/call", flush=True)
    torch.cuda.synchronize()
print(stridedfa.cache_info())
