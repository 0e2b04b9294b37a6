"""Diagnostic run 13: which operand's huge stride breaks the backward; kernels of a training step."""
import json, os, time, statistics
import torch, stridedfa, stridedfa.torch as sft
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
OUT = os.environ["OUT"]
res = {}
b, h, s, d = 2, 2, 64, 64
def ref(q, k, v, dout):
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    o = F.scaled_dot_product_attention(*leaves)
    grads = torch.autograd.grad(o, leaves, dout.float())
    return o, grads
def huge_view(stride, fill):
    base = torch.randn(stride + h * s * d, device="cuda").to(torch.bfloat16) if fill == "randn" else torch.full((stride + h * s * d,), float("nan"), device="cuda", dtype=torch.bfloat16)
    return base.as_strided((b, h, s, d), (stride, s * d, d, 1)), base
for stride in (2**31 - 4096, 2**31 + 64):
    for name in ("q", "k", "v", "out", "dout", "dq", "dk", "dv"):
        t = {n: torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for n in ("q", "k", "v", "dout")}
        keep = []
        if name in t:
            x, base = huge_view(stride, "randn"); x.copy_(t[name]); t[name] = x; keep.append(base)
        outs = {}
        for n in ("out", "dq", "dk", "dv"):
            if n == name:
                x, base = huge_view(stride, "nan"); keep.append(base)
            else:
                x = torch.full((b, h, s, d), float("nan"), device="cuda", dtype=torch.bfloat16)
            outs[n] = x
        lse = torch.empty(b, h, s, device="cuda")
        stridedfa.sdpa_forward(t["q"], t["k"], t["v"], outs["out"], lse=lse)
        stridedfa.sdpa_backward(t["q"], t["k"], t["v"], outs["out"], t["dout"], lse, outs["dq"], outs["dk"], outs["dv"])
        torch.cuda.synchronize()
        o, grads = ref(t["q"], t["k"], t["v"], t["dout"])
        errs = {"out": (outs["out"].float() - o).abs().max().item()}
        for n, g in zip(("dq", "dk", "dv"), grads):
            errs[n] = (outs[n].float() - g).abs().max().item()
        res[f"{stride}/{name}"] = errs
        print(stride, name, errs, flush=True)
        del keep, t, outs
        torch.cuda.empty_cache()
# kernels of a training step
from torch.profiler import profile, ProfilerActivity
bb, ss, hh, dd = 8, 1024, 16, 64
for causal in (False, True):
    leaves = [torch.randn(bb, hh, ss, dd, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    def ours(): sft.attention(*leaves, causal=causal).sum().backward()
    def theirs():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(*leaves, is_causal=causal).sum().backward()
    for name, fn in (("stridedfa", ours), ("torch", theirs)):
        for _ in range(5): fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5): fn()
            torch.cuda.synchronize()
        rows = [(e.key, round(e.device_time_total / 5, 1), e.count // 5) for e in prof.key_averages() if e.device_time_total > 0]
        rows.sort(key=lambda r: -r[1])
        res[f"kernels/{name}/causal={causal}"] = rows[:12]
        print(name, causal, rows[:12], flush=True)
# intake micro timings
try:
    import cupy
    c = cupy.zeros((1, 4, 64, 64), dtype=cupy.float16)
    tq = torch.zeros(1, 4, 64, 64, device="cuda", dtype=torch.bfloat16)
    def timeit(fn, n=20000):
        for _ in range(1000): fn()
        t0 = time.perf_counter_ns()
        for _ in range(n): fn()
        return (time.perf_counter_ns() - t0) / n / 1e3
    can = stridedfa._core._can_read
    res["micro_us"] = {"can_read cupy": timeit(lambda: can(c)), "can_read torch": timeit(lambda: can(tq)),
                       "cupy current stream": timeit(lambda: cupy.cuda.get_current_stream().ptr),
                       "cupy attrs": timeit(lambda: (c.data.ptr, c.data.device_id, c.shape, c.strides, c.dtype)),
                       "cupy getDevice": timeit(lambda: cupy.cuda.runtime.getDevice()),
                       "cupy alloc 32KB": timeit(lambda: cupy.cuda.alloc(32768)),
                       "cupy ndarray ctor": timeit(lambda: cupy.ndarray((1, 4, 64, 64), c.dtype, c.data, c.strides))}
    print(res["micro_us"], flush=True)
except Exception as e:
    print("micro failed", e)
json.dump(res, open(os.path.join(OUT, "diag2.json"), "w"), indent=1)
