"""Diagnostic run 15: where a training step's host time goes, stridedfa vs torch SDPA (cuDNN)."""
import gc, json, os, statistics, time
import torch, stridedfa, stridedfa.torch as sft
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import profile, ProfilerActivity
OUT = os.environ["OUT"]
res = {"torch": torch.__version__, "stridedfa": stridedfa.__version__}
def cycles_for(ms):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); torch.cuda._sleep(10_000_000); b.record(); b.synchronize()
    return int(10_000_000 * ms / a.elapsed_time(b))
SPIN = cycles_for(60)
b, h, s, d = 8, 16, 1024, 64
timers = {}
def timed(name, fn):
    def wrapper(*a, **k):
        t0 = time.perf_counter_ns(); r = fn(*a, **k); timers.setdefault(name, []).append(time.perf_counter_ns() - t0); return r
    return wrapper
orig_bwd = sft._EagerAttention.backward
orig_fwd = sft._EagerAttention.forward
orig_balloc = stridedfa._core._backward_alloc
for layout in ("bhsd", "bshd"):
    for causal in (False, True):
        shape = (b, h, s, d) if layout == "bhsd" else (b, s, h, d)
        leaves = [torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
        views = (lambda: leaves) if layout == "bhsd" else (lambda: [x.transpose(1, 2) for x in leaves])
        def ours(): sft.attention(*views(), causal=causal).sum().backward()
        def theirs():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(*views(), is_causal=causal).sum().backward()
        def ours_fwd(): return sft.attention(*views(), causal=causal)
        def theirs_fwd():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(*views(), is_causal=causal)
        key = f"{layout}/causal={causal}"
        row = {}
        fns = {"ours": ours, "torch": theirs, "ours_fwd": ours_fwd, "torch_fwd": theirs_fwd}
        for fn in fns.values():
            for _ in range(5): fn()
        torch.cuda.synchronize()
        for gcmode in ("gc_on", "gc_off"):
            samples = {n: [] for n in fns}
            for rep in range(9):
                for n, fn in (fns.items() if rep % 2 == 0 else reversed(list(fns.items()))):
                    if gcmode == "gc_off": gc.disable()
                    torch.cuda.synchronize(); torch.cuda._sleep(SPIN)
                    keep = []
                    t0 = time.perf_counter()
                    for _ in range(40):
                        r = fn()
                        if r is not None: keep.append(r)
                    samples[n].append((time.perf_counter() - t0) / 40 * 1e6)
                    gc.enable(); del keep
            row[gcmode] = {n: round(statistics.median(v), 1) for n, v in samples.items()}
            row[gcmode + "_min"] = {n: round(min(v), 1) for n, v in samples.items()}
        # device-bound step: the host gets a 60 ms head start
        dev = {"ours": [], "torch": []}
        for rep in range(7):
            for n in ("ours", "torch") if rep % 2 == 0 else ("torch", "ours"):
                torch.cuda.synchronize(); torch.cuda._sleep(SPIN)
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(40): fns[n]()
                e1.record(); e1.synchronize()
                dev[n].append(e0.elapsed_time(e1) / 40 * 1e3)
        row["device_bound_step_us"] = {n: round(statistics.median(v), 1) for n, v in dev.items()}
        # inside the autograd Function: forward, backward, and the core's backward call
        timers.clear()
        sft._EagerAttention.forward = staticmethod(timed("Function.forward", orig_fwd))
        sft._EagerAttention.backward = staticmethod(timed("Function.backward", orig_bwd))
        stridedfa._core._backward_alloc = timed("_core._backward_alloc", orig_balloc)
        bw = timed("tensor.backward (main thread)", torch.Tensor.backward)
        torch.cuda.synchronize(); torch.cuda._sleep(SPIN)
        for _ in range(40):
            o = timed("attention()", sft.attention)(*views(), causal=causal)
            ssum = timed("sum", torch.Tensor.sum)(o)
            bw(ssum)
        sft._EagerAttention.forward = orig_fwd; sft._EagerAttention.backward = orig_bwd
        stridedfa._core._backward_alloc = orig_balloc
        row["inside_us"] = {n: round(statistics.median(v) / 1e3, 2) for n, v in timers.items()}
        # torch.profiler CPU view
        for n in ("ours", "torch"):
            torch.cuda.synchronize(); torch.cuda._sleep(SPIN)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(20): fns[n]()
            torch.cuda.synchronize()
            ev = sorted(prof.key_averages(), key=lambda e: -e.cpu_time_total)
            row[f"profile_{n}"] = [(e.key[:90], e.count // 20, round(e.cpu_time_total / 20, 1), round(e.self_cpu_time_total / 20, 1)) for e in ev[:28]]
        res[key] = row
        print(key, json.dumps({k: v for k, v in row.items() if not k.startswith("profile")}), flush=True)
json.dump(res, open(os.path.join(OUT, "diag3.json"), "w"), indent=1)
