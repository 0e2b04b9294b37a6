#!/usr/bin/env python3
"""Side-by-side attention benchmark: stridedfa against torch SDPA (cuDNN and flash).

What is measured
----------------
For each configuration (bf16; ``b, h_q/h_kv, s, d, causal``, ``s_q == s_kv``) and
for each contender, in one process and one run:

* ``torch_cudnn``      ``F.scaled_dot_product_attention`` under
                       ``sdpa_kernel(SDPBackend.CUDNN_ATTENTION)``
* ``torch_flash``      the same under ``SDPBackend.FLASH_ATTENTION`` (may be "n/a",
                       e.g. for GQA; the reason is recorded)
* ``stridedfa``        ``stridedfa.torch.attention`` (autograd path: allocates
                       out/lse, and grads in backward); on ``packed_qkv`` rows
                       ``stridedfa.torch.packed_attention(qkv, 2)``, whose backward
                       writes one packed gradient buffer (no assembly copies)
* ``stridedfa_kernel`` ``stridedfa.sdpa_forward`` (and, for fwd+bwd,
                       ``stridedfa.sdpa_backward``) into preallocated out / lse /
                       grads -- no autograd, no output allocation: the generic DLPack path.

Two metrics, both in TFLOP/s (higher is better):

* ``fwd``      one forward call. Autograd contenders run under ``torch.no_grad()``
               (inference); the kernel contender also writes the float32 LSE
               (a training forward), which costs ``b*h_q*s*4`` bytes, i.e. nothing.
* ``fwd_bwd``  ``out = f(q, k, v); out.backward(grad_out)`` with the leaves
               requiring grad, timed together; leaves' ``.grad`` are set to
               ``None`` before each call so accumulation never adds work. For the
               kernel contender: ``sdpa_forward`` + ``sdpa_backward`` into
               preallocated gradient buffers.

FLOPs: ``fwd = 4 * b * h_q * s_q * s_kv * d`` (halved when causal);
``fwd_bwd = 3.5 * fwd``. The same nominal count is used for every contender, so
TFLOP/s ratios are exactly inverse time ratios.

Layouts. ``contiguous``: q, k, v are separate contiguous (b, h, s, d) tensors.
``packed_qkv`` (non-GQA configs only): q, k, v are the views
``qkv[:, :, i].transpose(1, 2)`` of one packed (b, s, 3, h, d) buffer. In fwd_bwd
the autograd leaf is the packed buffer, so autograd contenders pay the copies that
assemble the packed gradient from three per-view gradients (that is the point);
the kernel contender writes its gradients straight into the three views of one
preallocated packed (b, s, 3, h, d) gradient buffer. The kernel contender's ``out``
is a contiguous (b, h_q, s, d) tensor, on packed rows (b, s, h_q, d) in memory (q's
order, as the other contenders' outputs); on packed rows grad_out is laid out (b, s, h, d)
in memory too, as a fused-QKV model's output projection hands it back.

How it is timed
---------------
CUDA events on torch's current stream. Per config and metric, the contenders are
timed in two blocks: first torch flash alone, then torch cuDNN, stridedfa and the
stridedfa kernel together. In a block each contender first gets ``--warmup`` calls
(>= 3; the first ones also build stridedfa's and torch's cuDNN graphs) and a
two-call calibration that picks N so that N calls take about ``target_ms`` (50 ms;
10 ms with ``--quick``); then the block's first contender runs untimed for
``settle_ms`` (400 ms; 20 ms with ``--quick``); then come ``n_meas`` rounds (5; 3
with ``--quick``), round-robin over the block, the order reversed every other round;
in each, a contender runs an untimed pre-roll of the same calls (``preroll_ms``,
150 ms; 10 ms with ``--quick``) and, with no sync in between, N calls between two
events. The reported time is the median of the per-call times of the rounds; all
samples are in the JSON.

Why so: the H200's clocks follow its power draw with a lag. Seen there: cuDNN SDPA
ran ~12% faster for its first ~30 ms after an idle pause or after flash (which draws
less power), settling after ~100 ms, and then could run ~5-8% slower than its steady
state for a few hundred ms. Timed back-to-back without pre-roll, two contenders
running the very same kernels differed by 5-6% depending on which one followed
flash; with a 150 ms pre-roll but flash in the same rotation, still by up to 3%.
The pre-roll times each contender in its own steady state, the settle and the
separate flash block keep flash's after-effects out of the comparison that matters
(stridedfa vs torch cuDNN), and the interleaving spreads slow drift evenly.

Correctness gate. Before anything is timed, each config is checked once:
every contender's forward output is compared with torch cuDNN's (``max_abs_diff``)
and with a float64 reference computed on a slice (128 query rows spread over the
sequence, for (batch 0, head 0) and (batch b-1, head h_q-1), the latter exercising
the GQA head mapping); the kernel contender's LSE is compared with the float64
logsumexp on the same slice. Gradients (dq, dk, dv) of one fwd+bwd are compared
with torch cuDNN's as ``max|diff| / max|ref|``; torch flash's deviation from torch
cuDNN is recorded as a yardstick. A stridedfa contender that fails the forward
check is not timed at all ("skip"); one that fails the gradient check
is not timed for fwd_bwd (override with ``--ignore-mismatch``, results are then
flagged in the JSON). Torch contenders are checked but never gated.

Host overhead. On a tiny problem (b, h, s, d) = (1, 4, 64, 64) bf16, forward only,
under ``torch.no_grad()``: wall time (``time.perf_counter_ns``) of a loop that
enqueues M calls (2000; 300 with ``--quick``) with no synchronization inside,
divided by M = "enqueue us/call"; the same span plus the final
``torch.cuda.synchronize()`` = "total us/call". Median of 5 repetitions (3 with
``--quick``) after a warm-up. Separately, 50 calls under ``torch.profiler`` give the
device time of the kernels one call launches ("GPU kernels us/call", and the
number of kernels per call). Where "enqueue" is not well above "GPU kernels", the
GPU set the pace and the host cost per call is at most the enqueue figure.
Ratios are against torch SDPA cuDNN, measured in the same run (the host's CPU
timings vary between machines; compare ratios).

How to read the output
----------------------
``DIR/bench_attention.md`` (also printed) has these tables:

1. Forward TFLOP/s and 2. Forward+backward TFLOP/s: one row per config and
   layout, one column per contender, plus the torch cuDNN / flash anchor figures
   measured earlier on the H200 test host (contiguous rows only; a measured torch
   cuDNN figure far below its anchor means the GPU was not in its usual state).
   "n/a" = the contender raised (reason in the Errors section), "skip" = not timed
   because its correctness check failed.
3. Ratios: stridedfa / torch cuDNN throughput (> 1: stridedfa faster), for the
   autograd path and the kernel path; for packed rows also packed / contiguous
   throughput of the same config (< 1: the packed layout costs something), for
   stridedfa and for torch cuDNN. A geometric-mean row summarizes the configs.
4. Correctness: max |diff| of the forward outputs (vs torch cuDNN and vs the
   float64 slice), LSE error, worst gradient relative error, and the torch flash
   vs cuDNN yardstick.
5. Host overhead per call and ratios vs torch cuDNN.
6. Errors: every exception, per config / contender / metric.

``DIR/bench_attention.json`` holds everything (schema in benchmarks/README.md),
including the environment (GPU, driver, torch, cuDNN, stridedfa, git commit) and
``stridedfa.cache_info()`` at start and end. The JSON is rewritten after every
config, so a crash still leaves the results so far.

Usage::

    PYTHONUNBUFFERED=1 python3 -X faulthandler benchmarks/bench_attention.py --out DIR [--quick]
    python3 benchmarks/bench_attention.py --render DIR/bench_attention.json   # re-render markdown

torch is imported inside ``main`` so that ``--help`` and ``--render`` work without it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import faulthandler
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback

SCHEMA = "stridedfa.bench_attention/1"

# (b, h_q, h_kv, s, d, causal); s_q == s_kv. From shared/GPU_HOST.md.
CONFIGS = [
    (2, 16, 16, 4096, 128, False),
    (2, 16, 16, 4096, 128, True),
    (1, 32, 32, 8192, 128, True),
    (4, 32, 8, 2048, 128, True),
    (8, 16, 16, 1024, 64, False),
    (1, 16, 16, 16384, 128, True),
]

# Anchor figures measured on the H200 test host (GPU_HOST.md, 2026-12-02), TFLOP/s,
# contiguous layout: torch SDPA cuDNN fwd / fwd+bwd, torch SDPA flash fwd / fwd+bwd.
ANCHORS = {
    (2, 16, 16, 4096, 128, False): {"torch_cudnn": (566, 534), "torch_flash": (331, 286)},
    (2, 16, 16, 4096, 128, True): {"torch_cudnn": (471, 408), "torch_flash": (256, 232)},
    (1, 32, 32, 8192, 128, True): {"torch_cudnn": (578, 519), "torch_flash": (286, 281)},
    (4, 32, 8, 2048, 128, True): {"torch_cudnn": (462, 376), "torch_flash": (273, 212)},
    (8, 16, 16, 1024, 64, False): {"torch_cudnn": (314, 232), "torch_flash": (229, 189)},
    (1, 16, 16, 16384, 128, True): {"torch_cudnn": (615, 549), "torch_flash": (297, 305)},
}

CONTENDERS = ["torch_cudnn", "torch_flash", "stridedfa", "stridedfa_kernel"]
LABELS = {
    "torch_cudnn": "torch cuDNN",
    "torch_flash": "torch flash",
    "stridedfa": "stridedfa",
    "stridedfa_kernel": "stridedfa kernel",
}
GATED = ("stridedfa", "stridedfa_kernel")  # timed only if their results check out
METRICS = ("fwd", "fwd_bwd")

HOST_SHAPE = (1, 4, 64, 64)  # (b, h, s, d)
PREROLL_MS = 150.0           # untimed same-workload calls before each measurement (full run)
SETTLE_MS = 400.0            # untimed calls before a timing block's first round (full run)
# Contenders are timed interleaved within a block, blocks one after another. torch flash
# draws less power than the cuDNN kernels; on the H200 the cuDNN kernels ran ~5-8% slow
# for a few hundred ms after flash, so flash is kept out of the block whose ratios matter.
TIMING_BLOCKS = (("torch_flash",), ("torch_cudnn", "stridedfa", "stridedfa_kernel"))

# Correctness tolerances (bf16 outputs).
OUT_ATOL, OUT_RTOL = 2e-2, 2e-2   # |a - ref| <= atol + rtol * |ref|, elementwise
LSE_ATOL = 1e-2                    # float32 LSE vs float64 slice reference
GRAD_REL = 2e-2                    # max|diff| / max|ref| per gradient tensor
GRAD_YARDSTICK_FACTOR = 2.0        # ...or within this factor of flash-vs-cuDNN
CHECK_ROWS = 128                   # query rows of the float64 reference slice


class Abort(RuntimeError):
    """The CUDA context is unusable: stop timing, keep what we have."""


def log(*args):
    print(*args, flush=True)


def err_str(e: BaseException, limit: int = 600) -> str:
    s = f"{type(e).__name__}: {e}".strip()
    s = " ".join(s.split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def median(xs):
    return statistics.median(xs) if xs else None


def geomean(xs):
    xs = [x for x in xs if isinstance(x, (int, float)) and x > 0]
    if not xs:
        return None
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


# --------------------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------------------

def _run_cmd(cmd, cwd=None, timeout=10):
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except Exception as e:  # noqa: BLE001
        return None, err_str(e)
    if p.returncode != 0:
        return None, (p.stderr or p.stdout).strip()[:300] or f"exit {p.returncode}"
    return p.stdout.strip(), None


def git_info():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out, err = _run_cmd(["git", "-C", repo, "rev-parse", "HEAD"])
    info = {"repo_dir": repo, "commit": out, "commit_error": err}
    if out:
        st, _ = _run_cmd(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"])
        info["dirty"] = bool(st) if st is not None else None
    return info


def driver_version():
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else v
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001
        pass
    out, err = _run_cmd(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return out.splitlines()[0].strip() if out else f"unknown ({err})"


def collect_env(torch, sfa, sfa_error):
    env = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "argv": sys.argv,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_cudnn_version": torch.backends.cudnn.version(),
        "driver": driver_version(),
        "git": git_info(),
        "env_vars": {k: v for k, v in os.environ.items()
                     if k.startswith(("STRIDEDFA", "CUDNN", "CUDA_VISIBLE", "PYTORCH_CUDA",
                                      "TORCH_CUDNN"))},
    }
    try:
        env["cuda_driver_api_version"] = torch._C._cuda_getDriverVersion()
    except Exception:  # noqa: BLE001
        pass
    try:
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        env["device_name"] = p.name
        env["device_capability"] = f"{p.major}.{p.minor}"
        env["device_sm_count"] = p.multi_processor_count
        env["device_memory_gib"] = round(p.total_memory / 2**30, 1)
    except Exception as e:  # noqa: BLE001
        env["device_error"] = err_str(e)
    for name in ("cudnn_sdp_enabled", "flash_sdp_enabled"):
        fn = getattr(torch.backends.cuda, name, None)
        if fn is not None:
            try:
                env[f"torch_{name}"] = bool(fn())
            except Exception:  # noqa: BLE001
                pass
    if sfa is None:
        env["stridedfa_import_error"] = sfa_error
        return env
    env["stridedfa_file"] = getattr(sfa, "__file__", None)
    ver = getattr(sfa, "__version__", None)
    if ver is None:
        try:
            from importlib.metadata import version

            ver = version("stridedfa")
        except Exception:  # noqa: BLE001
            ver = None
    env["stridedfa_version"] = ver
    try:
        env["stridedfa_info"] = sfa.info()
    except Exception as e:  # noqa: BLE001
        env["stridedfa_info_error"] = err_str(e)
    return env


def safe_cache_info(sfa):
    if sfa is None:
        return None
    try:
        return sfa.cache_info()
    except Exception as e:  # noqa: BLE001
        return {"error": err_str(e)}


# --------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------

def cuda_alive(torch) -> bool:
    try:
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001
        return False


def calibrate(torch, fn, *, warmup, target_ms, max_reps=2000):
    """Warm up, then return (N, per-call ms): N back-to-back calls take about target_ms."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    fn()
    end.record()
    end.synchronize()
    per_call = max(start.elapsed_time(end) / 2.0, 1e-4)
    return int(min(max_reps, max(1, math.ceil(target_ms / per_call)))), per_call


def measure(torch, fn, reps, preroll):
    """Per-call milliseconds of `reps` back-to-back calls between two CUDA events,
    right after `preroll` untimed calls of the same function (no sync in between),
    so the GPU's clocks have settled to this workload, not to the one before it."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    for _ in range(preroll):
        fn()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def summarize(samples, reps):
    return {
        "ms": median(samples),
        "min_ms": min(samples),
        "max_ms": max(samples),
        "reps": reps,
        "samples_ms": [round(x, 6) for x in samples],
    }


# --------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------

def case_list(config_indices, packed):
    cases = []
    for i in config_indices:
        b, hq, hkv, s, d, causal = CONFIGS[i]
        layouts = ["contiguous"]
        if packed and hq == hkv:
            layouts.append("packed_qkv")
        for layout in layouts:
            cases.append({"config_index": i, "b": b, "h_q": hq, "h_kv": hkv, "s_q": s,
                          "s_kv": s, "d": d, "causal": causal, "layout": layout})
    return cases


def case_key(c):
    return (c["b"], c["h_q"], c["h_kv"], c["s_q"], c["d"], c["causal"])


def case_label(c):
    return (f"b{c['b']} h{c['h_q']}/{c['h_kv']} s{c['s_q']} d{c['d']} "
            f"{'causal' if c['causal'] else 'full'}")


def case_name(c):
    return (f"b{c['b']}_hq{c['h_q']}_hkv{c['h_kv']}_s{c['s_q']}_d{c['d']}_"
            f"{'causal' if c['causal'] else 'full'}_{c['layout']}")


def flops_fwd(c):
    f = 4.0 * c["b"] * c["h_q"] * c["s_q"] * c["s_kv"] * c["d"]
    return f / 2.0 if c["causal"] else f


class Inputs:
    """Leaves (what autograd differentiates) and the q/k/v views derived from them."""

    def __init__(self, torch, c, seed):
        b, hq, hkv, s, d = c["b"], c["h_q"], c["h_kv"], c["s_q"], c["d"]
        dev, dt = "cuda", torch.bfloat16
        gen = torch.Generator(device=dev)
        gen.manual_seed(seed)
        self.packed = c["layout"] == "packed_qkv"
        if self.packed:
            assert hq == hkv
            self.leaves = [torch.randn(b, s, 3, hq, d, device=dev, dtype=dt, generator=gen)]
        else:
            self.leaves = [torch.randn(b, hq, s, d, device=dev, dtype=dt, generator=gen),
                           torch.randn(b, hkv, s, d, device=dev, dtype=dt, generator=gen),
                           torch.randn(b, hkv, s, d, device=dev, dtype=dt, generator=gen)]
        if self.packed:
            # A fused-QKV model's attention output is (b, s, h, d) in memory (q's axis order) and
            # its gradient arrives in that layout from the output projection; give every
            # contender the gradient laid out so (a layout mismatch between O and dO slows
            # cuDNN's backward at d=64 for everyone alike).
            self.grad_out = torch.randn(b, s, hq, d, device=dev, dtype=dt,
                                        generator=gen).transpose(1, 2)
        else:
            self.grad_out = torch.randn(b, hq, s, d, device=dev, dtype=dt, generator=gen)

    def views(self, leaves):
        if self.packed:
            (qkv,) = leaves
            return tuple(qkv[:, :, i].transpose(1, 2) for i in range(3))
        return tuple(leaves)

    def detached_views(self):
        return self.views([t.detach() for t in self.leaves])

    def leaf_grad_views(self):
        grads = [t.grad for t in self.leaves]
        if any(g is None for g in grads):
            raise RuntimeError("a leaf got no gradient")
        return self.views(grads)


def reference_slice(torch, q, k, v, c, rows, pairs):
    """float64 out and lse for the given query rows of the given (batch, head) pairs."""
    group = c["h_q"] // c["h_kv"]
    scale = 1.0 / math.sqrt(c["d"])
    cols = torch.arange(c["s_kv"], device=q.device)
    ref = {}
    for bi, hi in pairs:
        qs = q[bi, hi, rows].double()
        ks = k[bi, hi // group].double()
        vs = v[bi, hi // group].double()
        sc = (qs @ ks.T) * scale
        if c["causal"]:  # top_left alignment: row i sees keys j <= i
            sc = sc.masked_fill(cols[None, :] > rows[:, None], float("-inf"))
        ref[(bi, hi)] = (torch.softmax(sc, dim=-1) @ vs, torch.logsumexp(sc, dim=-1))
    return ref


def out_errors(torch, out, ref_full, ref_slice, rows):
    """Max abs diffs and tolerance excess of a (b,h,s,d) output."""
    res = {}
    if ref_full is not None:
        diff = (out.float() - ref_full.float()).abs()
        res["max_abs_diff_vs_torch_cudnn"] = float(diff.max())
        excess = diff - (OUT_ATOL + OUT_RTOL * ref_full.float().abs())
        res["tol_excess_vs_torch_cudnn"] = float(excess.max())
        del diff, excess
    worst, worst_excess = 0.0, -math.inf
    for (bi, hi), (o_ref, _) in ref_slice.items():
        o = out[bi, hi, rows].double()
        d = (o - o_ref).abs()
        worst = max(worst, float(d.max()))
        worst_excess = max(worst_excess, float((d - (OUT_ATOL + OUT_RTOL * o_ref.abs())).max()))
    res["max_abs_diff_vs_fp64_slice"] = worst
    res["tol_excess_vs_fp64_slice"] = worst_excess
    finite = bool(torch.isfinite(out).all())
    res["finite"] = finite
    res["ok"] = (finite and worst_excess <= 0
                 and res.get("tol_excess_vs_torch_cudnn", -1.0) <= 0)
    return res


def grad_errors(grads, ref_grads):
    res = {}
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
        rf = r.float()
        diff = float((g.float() - rf).abs().max())
        scale = float(rf.abs().max())
        res[name] = {"max_abs_diff": diff, "rel_to_max": diff / scale if scale > 0 else diff}
    res["worst_rel_to_max"] = max(res[n]["rel_to_max"] for n in ("dq", "dk", "dv"))
    return res


# --------------------------------------------------------------------------------------
# One case
# --------------------------------------------------------------------------------------

def new_case_result(c):
    fl = flops_fwd(c)
    res = dict(c)
    res.update({"name": case_name(c), "label": case_label(c), "flops_fwd": fl,
                "flops_fwd_bwd": 3.5 * fl, "check": {}, "results": {}, "errors": []})
    return res


def run_case(torch, sfa, c, args, tp, res):
    """Check and time one case, filling `res` (so partial results survive an abort)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, hq, s, d = c["b"], c["h_q"], c["s_q"], c["d"]
    causal = c["causal"]
    gqa = c["h_q"] != c["h_kv"]
    fl = res["flops_fwd"]
    t_case = time.perf_counter()

    def note_error(who, metric, e):
        msg = err_str(e)
        res["errors"].append({"contender": who, "metric": metric, "error": msg,
                              "traceback": traceback.format_exc(limit=6)[-2000:]})
        log(f"    {who:17s} {metric:8s} ERROR {msg}")
        if not cuda_alive(torch):
            raise Abort(f"CUDA context unusable after {who}/{metric}: {msg}")
        torch.cuda.empty_cache()
        return msg

    inp = Inputs(torch, c, seed=1000 + c["config_index"])
    q, k, v = inp.detached_views()
    out_buf = (torch.empty(b, s, hq, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
               if inp.packed else torch.empty(b, hq, s, d, device="cuda", dtype=torch.bfloat16))
    lse_buf = torch.empty(b, hq, s, device="cuda", dtype=torch.float32)

    def torch_fwd(q, k, v):
        if gqa:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def sfa_fwd(q, k, v):
        if inp.packed:
            # The packed entry point on the (b, s, 3, h, d) buffer the views come from: forward
            # on zero-copy views, gradients written straight into one packed buffer.
            return sfa.torch.packed_attention(q._base, 2, causal=causal).transpose(1, 2)
        return sfa.torch.attention(q, k, v, causal=causal)

    def kernel_fwd(q, k, v):
        sfa.sdpa_forward(q, k, v, out_buf, lse=lse_buf, causal=causal)
        return out_buf

    contexts = {
        "torch_cudnn": lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION),
        "torch_flash": lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION),
        "stridedfa": contextlib.nullcontext,
        "stridedfa_kernel": contextlib.nullcontext,
    }
    forwards = {"torch_cudnn": torch_fwd, "torch_flash": torch_fwd,
                "stridedfa": sfa_fwd, "stridedfa_kernel": kernel_fwd}
    active = [n for n in CONTENDERS if sfa is not None or n not in GATED]
    for n in CONTENDERS:
        res["results"][n] = {}
        if n not in active:
            for m in METRICS:
                res["results"][n][m] = {"error": "stridedfa not importable"}

    # ---- forward check ---------------------------------------------------------------
    rows = torch.linspace(0, s - 1, CHECK_ROWS, device="cuda").round().long().unique()
    pairs = sorted({(0, 0), (b - 1, hq - 1)})
    ref_sl = reference_slice(torch, q, k, v, c, rows, pairs)
    out_buf.fill_(float("nan"))  # poison: an unwritten element fails the finite check
    lse_buf.fill_(float("nan"))
    outs = {}
    for n in active:
        try:
            with torch.no_grad(), contexts[n]():
                outs[n] = forwards[n](q, k, v).clone()
            torch.cuda.synchronize()
        except Abort:
            raise
        except Exception as e:  # noqa: BLE001
            res["check"].setdefault(n, {})["fwd_error"] = note_error(n, "check", e)
    ref_full = outs.get("torch_cudnn")
    if ref_full is None:
        res["check_reference"] = "torch_flash" if "torch_flash" in outs else None
        ref_full = outs.get("torch_flash")
    else:
        res["check_reference"] = "torch_cudnn"
    for n, o in outs.items():
        chk = res["check"].setdefault(n, {})
        try:
            chk["fwd"] = out_errors(torch, o, None if n == res["check_reference"] else ref_full,
                                    ref_sl, rows)
        except Abort:
            raise
        except Exception as e:  # noqa: BLE001  (e.g. wrong output shape)
            chk["fwd"] = {"ok": False, "error": note_error(n, "check", e)}
    fc = res["check"].get("stridedfa_kernel", {}).get("fwd")
    if fc and "error" not in fc:
        worst = 0.0
        for (bi, hi), (_, lse_ref) in ref_sl.items():
            dl = (lse_buf[bi, hi, rows].double() - lse_ref).abs().max()
            worst = max(worst, float(dl)) if bool(torch.isfinite(dl)) else math.inf
        fc["lse_max_abs_diff_vs_fp64_slice"] = worst
        fc["ok"] = fc["ok"] and worst <= LSE_ATOL
    del outs, ref_full

    def fwd_ok(n):
        chk = res["check"].get(n, {}).get("fwd")
        return bool(chk and chk["ok"])

    def gate(n, metric):
        """None if n may be timed for metric, else the reason it may not."""
        if n not in GATED or args.ignore_mismatch:
            return None
        if not fwd_ok(n):
            return "skip: forward check failed"
        if metric == "fwd_bwd":
            g = res["check"].get(n, {}).get("bwd")
            if not (g and g.get("ok")):
                return "skip: gradient check failed"
        return None

    def time_metric(metric, fns):
        """Time `metric` for the contenders in `fns` ({name: step}), block by block."""
        for block in TIMING_BLOCKS:
            members = {n: fns[n] for n in block if n in fns}
            if members:
                time_block(metric, members)

    def time_block(metric, fns):
        """Time `metric` for a block of contenders, interleaved.

        Each contender is warmed up and calibrated first; then the block's first
        contender runs untimed for settle_ms (the clocks' response to the previous
        block's power draw fades); then the measurements go round-robin over the
        contenders (order reversed every other round), each one preceded by an
        untimed pre-roll of the same calls, so all of them see the same slow drift
        and each is timed in its own steady state.
        """
        flops = fl if metric == "fwd" else 3.5 * fl
        prepared = {}
        for n, fn in fns.items():
            prior = res["check"].get(n, {}).get("fwd_error")
            if prior is not None:  # same call already raised in the check: don't repeat it
                res["results"][n][metric] = {"error": prior, "same_as_check": True}
                log(f"    {n:17s} {metric:8s} n/a (forward raised in the check)")
                continue
            reason = gate(n, metric)
            if reason is not None:
                res["results"][n][metric] = {"skipped": reason}
                log(f"    {n:17s} {metric:8s} {reason}")
                continue
            try:
                with contexts[n]():
                    reps, per_call = calibrate(torch, fn, warmup=tp["warmup"],
                                               target_ms=tp["target_ms"])
                preroll = int(min(4000, math.ceil(tp["preroll_ms"] / per_call)))
                settle = int(min(10000, math.ceil(tp["settle_ms"] / per_call)))
                prepared[n] = (fn, reps, preroll, [], settle)
            except Abort:
                raise
            except Exception as e:  # noqa: BLE001
                res["results"][n][metric] = {"error": note_error(n, metric, e)}
        if prepared:
            n = next(iter(prepared))
            fn, settle = prepared[n][0], prepared[n][4]
            try:
                with contexts[n]():
                    for _ in range(settle):
                        fn()
            except Abort:
                raise
            except Exception as e:  # noqa: BLE001
                res["results"][n][metric] = {"error": note_error(n, metric, e)}
                del prepared[n]
        for rnd in range(tp["n_meas"]):
            order = list(prepared)
            if rnd % 2:  # alternate the order, so no contender always follows the same one
                order.reverse()
            for n in order:
                if n not in prepared:
                    continue
                fn, reps, preroll, samples, _ = prepared[n]
                try:
                    with contexts[n]():
                        samples.append(measure(torch, fn, reps, preroll))
                except Abort:
                    raise
                except Exception as e:  # noqa: BLE001
                    res["results"][n][metric] = {"error": note_error(n, metric, e)}
                    del prepared[n]
        for n, (fn, reps, preroll, samples, _) in prepared.items():
            r = summarize(samples, reps)
            r["preroll"] = preroll
            r["tflops"] = flops / (r["ms"] * 1e-3) / 1e12
            if n in GATED and args.ignore_mismatch and (
                    not fwd_ok(n) or (metric == "fwd_bwd"
                                      and not res["check"].get(n, {}).get("bwd", {}).get("ok"))):
                r["check_failed"] = True
            res["results"][n][metric] = r
            log(f"    {n:17s} {metric:8s} {r['tflops']:8.1f} TFLOP/s  "
                f"{r['ms']:.4f} ms  (x{r['reps']}, spread "
                f"{(r['max_ms'] - r['min_ms']) / r['ms'] * 100:.1f}%)")

    # ---- forward timing --------------------------------------------------------------
    def make_fwd_step(fwd):
        def fwd_step():
            with torch.no_grad():
                fwd(q, k, v)
        return fwd_step

    time_metric("fwd", {n: make_fwd_step(forwards[n]) for n in active})

    # ---- fwd+bwd: build steps, check gradients, time --------------------------------
    for t in inp.leaves:
        t.requires_grad_(True)
    g_out = inp.grad_out
    grad_bufs = [torch.empty_like(t, requires_grad=False) for t in inp.leaves]
    gq, gk, gv = inp.views(grad_bufs)

    def make_autograd_step(fwd):
        def step():
            for t in inp.leaves:
                t.grad = None
            qq, kk, vv = inp.views(inp.leaves)
            fwd(qq, kk, vv).backward(g_out)
        return step

    def kernel_step():
        sfa.sdpa_forward(q, k, v, out_buf, lse=lse_buf, causal=causal)
        sfa.sdpa_backward(q, k, v, out_buf, g_out, lse_buf, gq, gk, gv, causal=causal)

    steps = {n: (kernel_step if n == "stridedfa_kernel" else make_autograd_step(forwards[n]))
             for n in active}

    for gb in grad_bufs:
        gb.fill_(float("nan"))  # poison: an unwritten gradient element fails the finite check
    grads = {}
    for n in active:
        if "fwd_error" in res["check"].get(n, {}):
            continue  # forward already failed; the timing attempt will record its error
        try:
            with contexts[n]():
                steps[n]()
            torch.cuda.synchronize()
            if n == "stridedfa_kernel":
                grads[n] = tuple(x.clone() for x in (gq, gk, gv))
            else:
                grads[n] = tuple(x.clone() for x in inp.leaf_grad_views())
        except Abort:
            raise
        except Exception as e:  # noqa: BLE001
            res["check"].setdefault(n, {})["bwd_error"] = note_error(n, "check_bwd", e)
    for t in inp.leaves:
        t.grad = None
    gref_name = "torch_cudnn" if "torch_cudnn" in grads else (
        "torch_flash" if "torch_flash" in grads else None)
    res["check_reference_bwd"] = gref_name
    yard = None
    if gref_name == "torch_cudnn" and "torch_flash" in grads:
        try:
            yard = grad_errors(grads["torch_flash"], grads["torch_cudnn"])
            res["check"].setdefault("torch_flash", {})["bwd"] = yard
        except Exception as e:  # noqa: BLE001
            note_error("torch_flash", "check_bwd", e)
    for n in grads:
        if gref_name is None or n == gref_name or n == "torch_flash":
            continue
        try:
            ge = grad_errors(grads[n], grads[gref_name])
        except Abort:
            raise
        except Exception as e:  # noqa: BLE001  (e.g. wrong gradient shape)
            res["check"].setdefault(n, {})["bwd"] = {"ok": False,
                                                      "error": note_error(n, "check_bwd", e)}
            continue
        finite = all(bool(torch.isfinite(x).all()) for x in grads[n])
        limits = {}
        for gname in ("dq", "dk", "dv"):
            lim = GRAD_REL
            if yard is not None:
                lim = max(lim, GRAD_YARDSTICK_FACTOR * yard[gname]["rel_to_max"])
            limits[gname] = lim
        ge["finite"] = finite
        ge["limits"] = limits
        ge["ok"] = finite and all(ge[g]["rel_to_max"] <= limits[g] for g in limits)
        res["check"].setdefault(n, {})["bwd"] = ge
    del grads

    time_metric("fwd_bwd", {n: steps[n] for n in active})

    res["wall_s"] = round(time.perf_counter() - t_case, 2)


# --------------------------------------------------------------------------------------
# Host overhead
# --------------------------------------------------------------------------------------

def gpu_kernel_time(torch, fn, ctx, calls=50):
    """GPU time per call of the kernels (and memsets/copies) `fn` launches (CUPTI)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), ctx():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
    total_us, count = 0.0, 0
    for e in prof.events():
        if "CUDA" in str(getattr(e, "device_type", "")):
            total_us += e.time_range.end - e.time_range.start
            count += 1
    if count == 0:
        raise RuntimeError("the profiler recorded no GPU activity")
    return {"gpu_kernel_us": total_us / calls, "kernels_per_call": count / calls}


def host_plan(torch, sfa):
    """[(contender, call, context factory)] on the tiny host-overhead problem."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h, s, d = HOST_SHAPE
    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
               for _ in range(3))
    out = torch.empty_like(q)
    sdpa = F.scaled_dot_product_attention

    def call_torch():
        sdpa(q, k, v)

    def call_sfa():
        sfa.torch.attention(q, k, v)

    def call_kernel():
        sfa.sdpa_forward(q, k, v, out)

    plan = [
        ("torch_cudnn", call_torch, lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)),
        ("torch_flash", call_torch, lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)),
        ("stridedfa", call_sfa, contextlib.nullcontext),
        ("stridedfa_kernel", call_kernel, contextlib.nullcontext),
    ]
    return [p for p in plan if sfa is not None or p[0] not in GATED]


def run_host_overhead(torch, sfa, args):
    calls = args.host_calls
    reps = args.host_reps
    plan = host_plan(torch, sfa)
    res = {"shape_bhsd": list(HOST_SHAPE), "dtype": "bfloat16", "calls": calls, "reps": reps,
           "results": {}}
    perf = time.perf_counter_ns
    if sfa is None:
        for name in GATED:
            res["results"][name] = {"error": "stridedfa not importable"}
    for name, fn, ctx in plan:
        try:
            with torch.no_grad(), ctx():
                for _ in range(max(20, calls // 10)):
                    fn()
                torch.cuda.synchronize()
                ev0 = torch.cuda.Event(enable_timing=True)
                ev1 = torch.cuda.Event(enable_timing=True)
                enq, tot, gpu = [], [], []
                rng = range(calls)
                for _ in range(reps):
                    torch.cuda.synchronize()
                    ev0.record()
                    t0 = perf()
                    for _ in rng:
                        fn()
                    t1 = perf()
                    ev1.record()
                    torch.cuda.synchronize()
                    t2 = perf()
                    enq.append((t1 - t0) / calls / 1e3)
                    tot.append((t2 - t0) / calls / 1e3)
                    gpu.append(ev0.elapsed_time(ev1) * 1e3 / calls)
            r = {"enqueue_us": median(enq), "total_us": median(tot), "gpu_span_us": median(gpu),
                 "enqueue_samples_us": [round(x, 3) for x in enq],
                 "total_samples_us": [round(x, 3) for x in tot]}
            res["results"][name] = r
            log(f"  host {name:17s} enqueue {r['enqueue_us']:7.2f} us/call   "
                f"total {r['total_us']:7.2f}")
        except Exception as e:  # noqa: BLE001
            msg = err_str(e)
            res["results"][name] = {"error": msg}
            log(f"  host {name:17s} ERROR {msg}")
            if not cuda_alive(torch):
                raise Abort(f"CUDA context unusable after host/{name}: {msg}")
    res["ratios_vs_torch_cudnn"] = host_ratios(res)
    return res


def add_host_kernel_times(torch, sfa, res):
    """Profile the tiny problem's kernels. Done once, at the very end of the run:
    an active (or past) profiler session slows later kernel launches, which would
    distort the host timings."""
    import warnings

    for name, fn, ctx in host_plan(torch, sfa):
        r = res["results"].get(name)
        if not r or "error" in r:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                r.update(gpu_kernel_time(torch, fn, ctx))
            log(f"  host {name:17s} GPU kernels {r['gpu_kernel_us']:6.2f} us/call "
                f"({r['kernels_per_call']:.2f} kernels/call)")
        except Exception as e:  # noqa: BLE001  (profiler trouble must not cost the row)
            r["gpu_kernel_error"] = err_str(e)
            log(f"  host {name:17s} GPU kernels: ERROR {err_str(e)}")
            if not cuda_alive(torch):
                raise Abort(f"CUDA context unusable after profiling {name}") from None


def host_ratios(res):
    base = res["results"].get("torch_cudnn", {})
    ratios = {}
    for name, r in res["results"].items():
        if "enqueue_us" in r and "enqueue_us" in base:
            ratios[name] = {"enqueue": r["enqueue_us"] / base["enqueue_us"],
                            "total": r["total_us"] / base["total_us"]}
    return ratios


# --------------------------------------------------------------------------------------
# Ratios / summary (pure; also used by --render)
# --------------------------------------------------------------------------------------

def tflops_of(case, n, m):
    r = case.get("results", {}).get(n, {}).get(m, {})
    return r.get("tflops")


def ratio(a, b):
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def compute_ratios(cases):
    by_key = {(case_key(c), c["layout"]): c for c in cases}
    for c in cases:
        r = {}
        for n in GATED:
            for m in METRICS:
                r[f"{n}_vs_torch_cudnn_{m}"] = ratio(tflops_of(c, n, m), tflops_of(c, "torch_cudnn", m))
        c["ratios"] = r
        if c["layout"] == "packed_qkv":
            base = by_key.get((case_key(c), "contiguous"))
            pv = {}
            for n in CONTENDERS:
                for m in METRICS:
                    pv[f"{n}_{m}"] = (ratio(tflops_of(c, n, m), tflops_of(base, n, m))
                                      if base else None)
            c["packed_vs_contiguous"] = pv
    summary = {}
    for layout in ("contiguous", "packed_qkv"):
        sel = [c for c in cases if c["layout"] == layout]
        for key in (sel[0]["ratios"] if sel else {}):
            summary[f"geomean_{key}_{layout}"] = geomean([c["ratios"].get(key) for c in sel])
    return summary


# --------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------

def _f(x, nd=1):
    return "—" if x is None else f"{x:.{nd}f}"


def _cell(case, n, m):
    r = case.get("results", {}).get(n, {}).get(m)
    if not r:
        return "—"
    if "tflops" in r:
        return f"{r['tflops']:.1f}" + (" (!)" if r.get("check_failed") else "")
    if "skipped" in r:
        return "skip"
    return "n/a"


def _table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(data):
    env = data.get("env", {})
    st = data.get("settings", {})
    cases = data.get("cases", [])
    out = ["# stridedfa attention benchmark", ""]
    sfa_info = env.get("stridedfa_info") or {}
    out.append(
        f"{env.get('device_name', '?')} (driver {env.get('driver', '?')}), "
        f"torch {env.get('torch', '?')} (CUDA {env.get('torch_cuda', '?')}, "
        f"cuDNN {env.get('torch_cudnn_version', '?')}), "
        f"stridedfa {env.get('stridedfa_version', '?')}"
        + (f" (info: {json.dumps(sfa_info, default=str)})" if sfa_info else "")
        + f", git {(env.get('git') or {}).get('commit') or 'n/a'}"
        + (" (dirty)" if (env.get("git") or {}).get("dirty") else "")
        + f", {env.get('date_utc', '?')}.")
    out.append("")
    out.append(
        f"bf16, s_q = s_kv. Median of {st.get('n_meas')} CUDA-event measurements of N calls "
        f"(~{st.get('target_ms')} ms each), each right after a {st.get('preroll_ms')} ms "
        f"untimed pre-roll of the same calls; torch flash timed first, then torch cuDNN and "
        f"the stridedfa contenders interleaved round-robin after a {st.get('settle_ms')} ms "
        f"settle; "
        f"{st.get('warmup')} warm-up calls first"
        + (" (--quick)" if st.get("quick") else "")
        + ". FLOPs: fwd = 4·b·h_q·s²·d (/2 causal), fwd+bwd = 3.5·fwd. "
          "n/a = raised (see Errors), skip = failed its correctness check, "
          "(!) = timed despite a failed check (--ignore-mismatch).")
    if data.get("aborted"):
        out += ["", f"**Run aborted:** {data['aborted']}"]
    out.append("")

    for m, title, ai in (("fwd", "Forward TFLOP/s", 0), ("fwd_bwd", "Forward+backward TFLOP/s", 1)):
        rows = []
        for c in cases:
            anc = ANCHORS.get(case_key(c)) if c["layout"] == "contiguous" else None
            anc_s = (f"{anc['torch_cudnn'][ai]} / {anc['torch_flash'][ai]}" if anc else "")
            rows.append([c["label"], c["layout"]] + [_cell(c, n, m) for n in CONTENDERS] + [anc_s])
        out += [f"## {title}", "",
                _table(["config", "layout"] + [LABELS[n] for n in CONTENDERS]
                       + ["anchor cuDNN / flash"], rows), ""]

    rows = []
    for c in cases:
        r = c.get("ratios", {})
        pv = c.get("packed_vs_contiguous") or {}
        rows.append([c["label"], c["layout"],
                     _f(r.get("stridedfa_vs_torch_cudnn_fwd"), 3),
                     _f(r.get("stridedfa_vs_torch_cudnn_fwd_bwd"), 3),
                     _f(r.get("stridedfa_kernel_vs_torch_cudnn_fwd"), 3),
                     _f(r.get("stridedfa_kernel_vs_torch_cudnn_fwd_bwd"), 3),
                     _f(pv.get("stridedfa_fwd"), 3), _f(pv.get("stridedfa_fwd_bwd"), 3),
                     _f(pv.get("stridedfa_kernel_fwd_bwd"), 3),
                     _f(pv.get("torch_cudnn_fwd"), 3), _f(pv.get("torch_cudnn_fwd_bwd"), 3)])
    summ = data.get("summary", {})
    for layout in ("contiguous", "packed_qkv"):
        if any(c["layout"] == layout for c in cases):
            rows.append(["**geomean**", layout] + [
                _f(summ.get(f"geomean_{n}_vs_torch_cudnn_{m}_{layout}"), 3)
                for n in GATED for m in METRICS] + [""] * 5)
    out += ["## Ratios", "",
            "stridedfa / torch cuDNN throughput (> 1: stridedfa faster); packed / contiguous "
            "throughput of the same config (< 1: the packed layout costs).", "",
            _table(["config", "layout", "sfa/cuDNN fwd", "sfa/cuDNN fwd+bwd",
                    "kernel/cuDNN fwd", "kernel/cuDNN fwd+bwd",
                    "packed/contig sfa fwd", "packed/contig sfa fwd+bwd",
                    "packed/contig kernel fwd+bwd",
                    "packed/contig cuDNN fwd", "packed/contig cuDNN fwd+bwd"], rows), ""]

    rows = []
    for c in cases:
        ch = c.get("check", {})

        def fwdv(n, key, nd=4):
            f = (ch.get(n) or {}).get("fwd")
            return "—" if not f or f.get(key) is None else f"{f[key]:.{nd}g}"

        def bwdv(n):
            g = (ch.get(n) or {}).get("bwd")
            if not g:
                return "—"
            w = g.get("worst_rel_to_max")
            return "error" if w is None else (f"{w:.3g}" if isinstance(w, float) else str(w))

        def okv(n):
            e = ch.get(n) or {}
            if "fwd_error" in e:
                return "error"
            f = "ok" if (e.get("fwd") or {}).get("ok") else "FAIL"
            g = e.get("bwd")
            b_ = "—" if g is None else ("ok" if g.get("ok") else "FAIL")
            return f"{f} / {b_}"

        rows.append([c["label"], c["layout"],
                     fwdv("stridedfa", "max_abs_diff_vs_torch_cudnn"),
                     fwdv("stridedfa_kernel", "max_abs_diff_vs_torch_cudnn"),
                     fwdv("torch_flash", "max_abs_diff_vs_torch_cudnn"),
                     fwdv("stridedfa", "max_abs_diff_vs_fp64_slice"),
                     fwdv("torch_cudnn", "max_abs_diff_vs_fp64_slice"),
                     fwdv("stridedfa_kernel", "lse_max_abs_diff_vs_fp64_slice"),
                     bwdv("stridedfa"), bwdv("stridedfa_kernel"), bwdv("torch_flash"),
                     okv("stridedfa"), okv("stridedfa_kernel")])
    out += ["## Correctness", "",
            "Forward: max |out − ref|. Gradients: worst over dq, dk, dv of max|diff| / max|ref| "
            f"vs torch cuDNN. Forward passes if |diff| ≤ {OUT_ATOL} + {OUT_RTOL}·|ref| everywhere "
            f"(and LSE within {LSE_ATOL}); gradients pass if ≤ {GRAD_REL} or ≤ "
            f"{GRAD_YARDSTICK_FACTOR}× the flash-vs-cuDNN figure.", "",
            _table(["config", "layout", "sfa vs cuDNN", "kernel vs cuDNN", "flash vs cuDNN",
                    "sfa vs fp64", "cuDNN vs fp64", "kernel LSE vs fp64",
                    "sfa grad rel", "kernel grad rel", "flash grad rel",
                    "sfa ok fwd / bwd", "kernel ok fwd / bwd"], rows), ""]

    ho = data.get("host_overhead")
    if ho:
        rows = []
        for n in CONTENDERS:
            r = ho.get("results", {}).get(n)
            if r is None:
                continue
            rr = ho.get("ratios_vs_torch_cudnn", {}).get(n, {})
            if "error" in r:
                rows.append([LABELS[n], "n/a", "n/a", "n/a", "—", "—"])
            else:
                kt = r.get("gpu_kernel_us")
                kcell = "n/a" if kt is None else f"{kt:.2f} ({r['kernels_per_call']:.3g})"
                rows.append([LABELS[n], _f(r["enqueue_us"], 2), _f(r["total_us"], 2), kcell,
                             _f(rr.get("enqueue"), 3), _f(rr.get("total"), 3)])
        b, h, s, d = ho.get("shape_bhsd", HOST_SHAPE)
        out += ["## Host overhead", "",
                f"(b, h, s, d) = ({b}, {h}, {s}, {d}) bf16, forward, torch.no_grad(); "
                f"{ho.get('calls')} calls enqueued back to back, median of {ho.get('reps')}. "
                "enqueue = wall time of the loop only; total = loop + final sync; GPU kernels = "
                "device time of the kernels one call launches (profiler; kernels per call in "
                "parentheses). Where enqueue is not well above GPU kernels, the GPU set the pace "
                "and the host cost per call is at most the enqueue figure. Ratios vs torch cuDNN.",
                "",
                _table(["contender", "enqueue µs/call", "total µs/call", "GPU kernels µs/call",
                        "enqueue ratio", "total ratio"], rows), ""]

    errs = []
    for c in cases:
        for e in c.get("errors", []):
            errs.append(f"- {c['label']} {c['layout']} / {e['contender']} / {e['metric']}: "
                        f"{e['error']}")
    for n, r in ((ho or {}).get("results") or {}).items():
        if "error" in r:
            errs.append(f"- host overhead / {n}: {r['error']}")
    for e in data.get("errors", []):
        errs.append(f"- {e}")
    if errs:
        out += ["## Errors", ""] + errs + [""]
    if data.get("wall_s") is not None:
        out += [f"Total wall time {data['wall_s']:.1f} s."]
    return "\n".join(out).rstrip() + "\n"


def _json_safe(x):
    """Strict JSON: non-finite floats become the strings "nan", "inf", "-inf"."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if x != x else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def write_outputs(data, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    jp = os.path.join(out_dir, "bench_attention.json")
    tmp = jp + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_json_safe(data), f, indent=2, default=str, allow_nan=False)
        f.write("\n")
    os.replace(tmp, jp)
    md = render_markdown(data)
    with open(os.path.join(out_dir, "bench_attention.md"), "w") as f:
        f.write(md)
    return md


# --------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="Benchmark stridedfa against torch SDPA (cuDNN, flash): forward and "
                    "forward+backward TFLOP/s, packed-QKV layouts, host overhead per call. "
                    "Writes DIR/bench_attention.json and DIR/bench_attention.md.")
    p.add_argument("--out", metavar="DIR", help="output directory (created if missing)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: ~10 ms per measurement, 3 measurements, fewer host calls")
    p.add_argument("--configs", metavar="I,J,...",
                   help="comma-separated indices into the config list (default: all): "
                        + "; ".join(f"{i}={c}" for i, c in enumerate(CONFIGS)))
    p.add_argument("--no-packed", action="store_true", help="skip the packed-QKV variants")
    p.add_argument("--no-host", action="store_true", help="skip the host-overhead measurement")
    p.add_argument("--no-host-profile", action="store_true",
                   help="skip profiling the host-overhead problem's GPU kernels (torch.profiler)")
    p.add_argument("--ignore-mismatch", action="store_true",
                   help="time stridedfa even where its correctness check failed (flagged)")
    p.add_argument("--target-ms", type=float, help="override ms per measurement")
    p.add_argument("--settle-ms", type=float,
                   help="override the untimed ms run before each timing block's first round")
    p.add_argument("--preroll-ms", type=float,
                   help="override the untimed ms of the same calls run right before each "
                        "measurement (lets the clocks settle to this workload)")
    p.add_argument("--n-meas", type=int, help="override number of measurements")
    p.add_argument("--warmup", type=int, help="override warm-up calls (min 3)")
    p.add_argument("--host-calls", type=int, help="override calls per host-overhead repetition")
    p.add_argument("--host-reps", type=int, help="override host-overhead repetitions")
    p.add_argument("--render", metavar="JSON",
                   help="only re-render markdown from an existing bench_attention.json "
                        "(written next to it, or into --out) and print it; needs no torch/GPU")
    a = p.parse_args(argv)
    if not a.out and not a.render:
        p.error("--out DIR is required (or --render JSON)")
    a.target_ms = a.target_ms or (10.0 if a.quick else 50.0)
    if a.preroll_ms is None:
        a.preroll_ms = 10.0 if a.quick else PREROLL_MS
    if a.settle_ms is None:
        a.settle_ms = 20.0 if a.quick else SETTLE_MS
    a.n_meas = a.n_meas or (3 if a.quick else 5)
    a.warmup = max(3, a.warmup or 3)
    a.host_calls = a.host_calls or (300 if a.quick else 2000)
    a.host_reps = a.host_reps or (3 if a.quick else 5)
    if a.configs:
        try:
            a.config_indices = [int(x) for x in a.configs.split(",") if x.strip()]
            for i in a.config_indices:
                if not 0 <= i < len(CONFIGS):
                    raise ValueError(i)
        except ValueError:
            p.error(f"--configs takes indices 0..{len(CONFIGS) - 1}")
    else:
        a.config_indices = list(range(len(CONFIGS)))
    return a


def main(argv=None):
    args = parse_args(argv)
    if args.render:
        with open(args.render) as f:
            data = json.load(f)
        out_dir = args.out or os.path.dirname(os.path.abspath(args.render))
        md = render_markdown(data)
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "bench_attention.md"), "w") as f:
            f.write(md)
        print(md, flush=True)
        return 0

    faulthandler.enable()
    t_start = time.perf_counter()
    import torch  # lazily: --help and --render work without torch

    if not torch.cuda.is_available():
        log("CUDA is not available: nothing to benchmark.")
        return 2
    try:
        import stridedfa as sfa
        import stridedfa.torch  # noqa: F401  (make sure the torch submodule is loaded)
        sfa_error = None
    except Exception as e:  # noqa: BLE001
        sfa, sfa_error = None, err_str(e)
        log(f"WARNING: stridedfa not importable ({sfa_error}); timing torch only")

    tp = {"warmup": args.warmup, "target_ms": args.target_ms, "n_meas": args.n_meas,
          "preroll_ms": args.preroll_ms, "settle_ms": args.settle_ms}
    data = {
        "schema": SCHEMA,
        "env": collect_env(torch, sfa, sfa_error),
        "settings": {"quick": args.quick, "dtype": "bfloat16", **tp,
                     "host_calls": args.host_calls, "host_reps": args.host_reps,
                     "configs": [list(CONFIGS[i]) for i in args.config_indices],
                     "packed": not args.no_packed, "ignore_mismatch": args.ignore_mismatch,
                     "tolerances": {"out_atol": OUT_ATOL, "out_rtol": OUT_RTOL,
                                    "lse_atol": LSE_ATOL, "grad_rel_to_max": GRAD_REL,
                                    "grad_yardstick_factor": GRAD_YARDSTICK_FACTOR,
                                    "check_rows": CHECK_ROWS}},
        "anchors_gpu_host": {case_name(dict(zip(("b", "h_q", "h_kv", "s_q", "d", "causal"), k),
                                                s_kv=k[3], layout="contiguous")): v
                             for k, v in ANCHORS.items()},
        "cache_info_start": safe_cache_info(sfa),
        "host_overhead": None,
        "cases": [],
        "summary": {},
        "errors": [],
        "aborted": None,
    }
    env = data["env"]
    log(f"device {env.get('device_name')} | driver {env.get('driver')} | torch {env.get('torch')} "
        f"| cuDNN {env.get('torch_cudnn_version')} | stridedfa {env.get('stridedfa_version')} "
        f"| git {env['git'].get('commit')}")
    if env.get("stridedfa_info") is not None:
        log(f"stridedfa.info(): {env['stridedfa_info']}")

    def checkpoint():
        data["summary"] = compute_ratios(data["cases"])
        data["wall_s"] = round(time.perf_counter() - t_start, 2)
        return write_outputs(data, args.out)

    try:
        if not args.no_host:
            log("host overhead:")
            try:
                data["host_overhead"] = run_host_overhead(torch, sfa, args)
            except Abort:
                raise
            except Exception as e:  # noqa: BLE001
                data["errors"].append(f"host overhead: {err_str(e)}")
                log(f"  host overhead ERROR {err_str(e)}")
            checkpoint()
        for c in case_list(args.config_indices, not args.no_packed):
            log(f"{case_label(c)} [{c['layout']}]")
            res = new_case_result(c)
            data["cases"].append(res)
            try:
                run_case(torch, sfa, c, args, tp, res)
            except Abort:
                raise
            except Exception as e:  # noqa: BLE001
                res["errors"].append({"contender": "-", "metric": "case", "error": err_str(e),
                                      "traceback": traceback.format_exc(limit=6)[-2000:]})
                log(f"  case ERROR {err_str(e)}")
            gc.collect()
            torch.cuda.empty_cache()
            if not cuda_alive(torch):
                raise Abort("CUDA context unusable after " + case_name(c))
            checkpoint()
        if data["host_overhead"] and not args.no_host_profile:
            log("host overhead, GPU kernel time per call (profiler):")
            add_host_kernel_times(torch, sfa, data["host_overhead"])
    except Abort as e:
        data["aborted"] = str(e)
        log(f"ABORTED: {e}")
    except KeyboardInterrupt:
        data["aborted"] = "KeyboardInterrupt"
        log("interrupted")
    finally:
        data["cache_info_end"] = safe_cache_info(sfa)
        md = checkpoint()
    print("", flush=True)
    print(md, flush=True)
    log(f"wrote {os.path.join(args.out, 'bench_attention.json')} and bench_attention.md "
        f"({data['wall_s']:.1f} s)")
    return 1 if data["aborted"] else 0


if __name__ == "__main__":
    sys.exit(main())
