"""Rendering for bench_attention.py: the ratios and geometric means computed from the cases'
TFLOP/s, the markdown tables (throughput, ratios, correctness, errors) and the writing of
bench_attention.json / bench_attention.md. Pure functions of the result data: no torch, no GPU,
so ``bench_attention.py --render JSON`` works anywhere.
"""

from __future__ import annotations

import json
import math
import os

from attention_timing import (
    CONTENDERS,
    GATED,
    GRAD_REL,
    GRAD_YARDSTICK_FACTOR,
    LSE_ATOL,
    METRICS,
    OUT_ATOL,
    OUT_RTOL,
    case_key,
)

LABELS = {
    "torch_cudnn": "torch cuDNN",
    "torch_flash": "torch flash",
    "stridedfa": "stridedfa",
    "stridedfa_kernel": "stridedfa kernel",
}


def geomean(xs):
    xs = [x for x in xs if isinstance(x, (int, float)) and x > 0]
    if not xs:
        return None
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


# --------------------------------------------------------------------------------------
# Ratios / summary
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


def render_markdown(data, anchors):
    """The markdown report of one run's result data; `anchors` maps config tuples
    (b, h_q, h_kv, s, d, causal) to the reference figures shown in the throughput tables."""
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
            anc = anchors.get(case_key(c)) if c["layout"] == "contiguous" else None
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

        def fwdv(n, key, nd=4, ch=ch):
            f = (ch.get(n) or {}).get("fwd")
            return "—" if not f or f.get(key) is None else f"{f[key]:.{nd}g}"

        def bwdv(n, ch=ch):
            g = (ch.get(n) or {}).get("bwd")
            if not g:
                return "—"
            w = g.get("worst_rel_to_max")
            return "error" if w is None else (f"{w:.3g}" if isinstance(w, float) else str(w))

        def okv(n, ch=ch):
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

    errs = []
    for c in cases:
        for e in c.get("errors", []):
            errs.append(f"- {c['label']} {c['layout']} / {e['contender']} / {e['metric']}: "
                        f"{e['error']}")
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


def write_outputs(data, out_dir, anchors):
    """Write DIR/bench_attention.json (strict JSON, atomically) and DIR/bench_attention.md;
    return the markdown."""
    os.makedirs(out_dir, exist_ok=True)
    jp = os.path.join(out_dir, "bench_attention.json")
    tmp = jp + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_json_safe(data), f, indent=2, default=str, allow_nan=False)
        f.write("\n")
    os.replace(tmp, jp)
    md = render_markdown(data, anchors)
    with open(os.path.join(out_dir, "bench_attention.md"), "w") as f:
        f.write(md)
    return md


