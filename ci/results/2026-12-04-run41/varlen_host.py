# Host time of a varlen training step: per step behind a GPU spin (host alone), then cProfile's
# top functions and torch.profiler's CPU table, next to the padded step (same documents).
import cProfile, io, pstats, sys, time, torch
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
steps = {"thd_max": lambda: st.varlen_attention(q, k, v, cu, cu, s_max, s_max, causal=True).backward(grad),
         "padded": lambda: st.attention(qp, kp, vp, causal=True, seqlens_q=seqlens, seqlens_kv=seqlens).backward(gradp)}
mode = sys.argv[2] if len(sys.argv) > 2 else "all"
for name, fn in steps.items():
    for _ in range(3): fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)
    t0 = time.perf_counter()
    for _ in range(20): fn()
    host = (time.perf_counter() - t0) / 20 * 1e6
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(20): fn()
    e1.record(); e1.synchronize()
    print(f"{name}: host {host:.0f} us/step behind a spin, back to back {e0.elapsed_time(e1) / 20 * 1e3:.0f} us/step")
for name, fn in steps.items():
    torch.cuda.synchronize()
    pr = cProfile.Profile(); pr.enable()
    for _ in range(10): fn()
    torch.cuda.synchronize()
    pr.disable()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18)
    print(f"=== cProfile {name} (10 steps)"); print(s.getvalue()[-4000:])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5): fn()
        torch.cuda.synchronize()
    print(f"=== torch.profiler CPU {name} (5 steps)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=70))
