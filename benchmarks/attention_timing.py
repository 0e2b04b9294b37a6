"""Timing machinery for bench_attention.py: the contenders (torch SDPA cuDNN and flash,
stridedfa's autograd path and its preallocating kernel path), the nominal FLOP counts, the
inputs and the correctness check against torch cuDNN and a float64 slice, and the CUDA-event
timing (warm-up, calibration, settle, interleaved pre-rolled rounds) of one case.
bench_attention.py's docstring describes the method and why it is so.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
import traceback

CONTENDERS = ["torch_cudnn", "torch_flash", "stridedfa", "stridedfa_kernel"]
GATED = ("stridedfa", "stridedfa_kernel")  # timed only if their results check out
METRICS = ("fwd", "fwd_bwd")

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


def run_case(torch, sfa, c, tp, res, *, ignore_mismatch=False):
    """Check and time one case, filling `res` (so partial results survive an abort).

    `tp` holds the timing parameters (warmup, target_ms, n_meas, preroll_ms, settle_ms);
    with `ignore_mismatch` the gated contenders are timed even where their check failed
    (the results are flagged `check_failed`)."""
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
        if n not in GATED or ignore_mismatch:
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
        for n, (_fn, reps, preroll, samples, _) in prepared.items():
            r = summarize(samples, reps)
            r["preroll"] = preroll
            r["tflops"] = flops / (r["ms"] * 1e-3) / 1e12
            if n in GATED and ignore_mismatch and (
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

