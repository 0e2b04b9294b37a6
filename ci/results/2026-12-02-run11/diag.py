"""Diagnostic run A: facts needed before the hardening changes (not committed)."""
import json, os, sys, time, traceback, statistics
import torch, stridedfa, stridedfa.torch as sft
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
OUT = os.environ["OUT"]
res = {}
def section(name):
    print(f"\n=== {name}", flush=True)
def guard(fn):
    try:
        return fn()
    except Exception as e:
        traceback.print_exc()
        return f"{type(e).__name__}: {e}"

print(stridedfa.info(), flush=True)
# 1. CuPy reversed view export
section("cupy reversed")
def cupy_rev():
    import cupy
    c = cupy.zeros((2, 4, 128, 64), dtype=cupy.float16)
    r = c[:, :, ::-1]
    info = stridedfa._core._inspect_dlpack(r)
    print("byte strides", r.strides, "inspect", info["strides"], "cupy", cupy.__version__)
    t = c[:, :, :, ::-1]
    print("rev last", t.strides, stridedfa._core._inspect_dlpack(t)["strides"])
    f32 = cupy.zeros((4, 8), dtype=cupy.float32)[::-1]
    print("f32", f32.strides, stridedfa._core._inspect_dlpack(f32)["strides"])
    return info["strides"]
res["cupy_reversed"] = str(guard(cupy_rev))
# 2. h_q = 1 / s_q = 1 backward
section("stats extent-1")
def stats1():
    out = {}
    for (b, h, s) in [(2, 1, 128), (2, 4, 1), (1, 1, 1), (2, 4, 128)]:
        q = torch.randn(b, h, s, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, h, 128, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, h, 128, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        try:
            sft.attention(q, k, v).sum().backward(); torch.cuda.synchronize()
            out[str((b, h, s))] = "ok"
        except Exception as e:
            out[str((b, h, s))] = f"{type(e).__name__}: {e}"
    print(out)
    return out
res["stats_extent1"] = guard(stats1)
# 3. huge strides
section("huge strides")
def huge():
    out = {}
    for stride in [2**31 + 64, 2**32 + 64, 2**33]:
        b, h, s, d = 2, 2, 64, 64
        base = torch.randn(stride + h * s * d, device="cuda", dtype=torch.bfloat16)
        q = base.as_strided((b, h, s, d), (stride, s * d, d, 1))
        k = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
        o_base = torch.full((stride + h * s * d,), float("nan"), device="cuda", dtype=torch.bfloat16)
        o = o_base.as_strided((b, h, s, d), (stride, s * d, d, 1))
        try:
            stridedfa.sdpa_forward(q, k, v, o); torch.cuda.synchronize()
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
            err = (o.float() - ref).abs().max().item()
            out[stride] = f"max err {err:.3e}, nan {torch.isnan(o).sum().item()}"
        except Exception as e:
            out[stride] = f"{type(e).__name__}: {e}"
        del base, o_base, q, o
        torch.cuda.empty_cache()
    print(out)
    return out
res["huge_strides"] = guard(huge)
# 4. sync after every call
section("sync per call")
def sync_pattern():
    out = {}
    b, h, s, d = 2, 16, 4096, 128
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    flops = 4 * b * h * s * s * d
    def gen(): stridedfa.sdpa_forward(q, k, v, o)
    def tad(): sft.attention(q, k, v)
    def tsd():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(q, k, v)
    for name, fn in [("generic", gen), ("torch_adapter", tad), ("torch_sdpa", tsd)]:
        for mode in ("back_to_back", "sync_each"):
            for _ in range(5): fn()
            torch.cuda.synchronize()
            n = 50
            t = time.perf_counter()
            for _ in range(n):
                fn()
                if mode == "sync_each": torch.cuda.synchronize()
            torch.cuda.synchronize()
            dt = (time.perf_counter() - t) / n
            out[f"{name}/{mode}"] = round(flops / dt / 1e12, 1)
    print(out)
    return out
res["sync_pattern_tflops"] = guard(sync_pattern)
# 5. training step profile
section("training step")
def train():
    out = {}
    b, s, h, d = 8, 1024, 16, 64
    spin = None
    for layout in ("bshd", "bhsd"):
        for causal in (False, True):
            shape = (b, s, h, d) if layout == "bshd" else (b, h, s, d)
            leaves = [torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
            def views(): return [x.transpose(1, 2) for x in leaves] if layout == "bshd" else leaves
            def ours():
                q, k, v = views()
                sft.attention(q, k, v, causal=causal).sum().backward()
            def theirs():
                q, k, v = views()
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    F.scaled_dot_product_attention(q, k, v, is_causal=causal).sum().backward()
            for name, fn in (("stridedfa", ours), ("torch", theirs)):
                for _ in range(10): fn()
                torch.cuda.synchronize()
                # host time: behind a GPU spin
                n = 20
                torch.cuda._sleep(200_000_000)
                t = time.perf_counter()
                for _ in range(n): fn()
                host = (time.perf_counter() - t) / n * 1e6
                torch.cuda.synchronize()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(n): fn()
                e1.record(); torch.cuda.synchronize()
                dev = e0.elapsed_time(e1) / n * 1e3
                out[f"{layout}/{'causal' if causal else 'full'}/{name}"] = {"host_us": round(host, 1), "step_us": round(dev, 1)}
            print(out, flush=True)
            q, k, v = views()
            for _ in range(5): sft.attention(q, k, v, causal=causal)
            torch.cuda.synchronize(); torch.cuda._sleep(100_000_000)
            t = time.perf_counter()
            outs = [sft.attention(q, k, v, causal=causal) for _ in range(20)]
            fwd_host = (time.perf_counter() - t) / 20 * 1e6
            torch.cuda.synchronize()
            gs = [torch.ones_like(o) for o in outs]
            torch.cuda._sleep(100_000_000)
            t = time.perf_counter()
            for o, g in zip(outs, gs): o.backward(g)
            bwd_host = (time.perf_counter() - t) / 20 * 1e6
            torch.cuda.synchronize()
            out[f"{layout}/{'causal' if causal else 'full'}/stridedfa_phases"] = {"fwd_host_us": round(fwd_host, 1), "bwd_host_us": round(bwd_host, 1)}
            if causal and layout == "bshd":
                from torch.profiler import profile, ProfilerActivity
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    for _ in range(10): ours()
                    torch.cuda.synchronize()
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    for _ in range(10): theirs()
                    torch.cuda.synchronize()
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    return out
res["train"] = guard(train)
section("cache")
print(stridedfa.cache_info())
json.dump(res, open(os.path.join(OUT, "diag.json"), "w"), indent=1, default=str)
