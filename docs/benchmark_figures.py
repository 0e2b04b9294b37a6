"""The documentation's benchmark plots, each read from committed JSON under benchmarks/results/latest/
(each plot names its run and file). Called by make_figures.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from figure_style import PALETTE, RESULTS, ROOT, save
from matplotlib.patches import Patch

# --- Benchmarks, from the committed JSON ------------------------------------------------------------

def run_number(path: Path) -> int:
    return int(path.parent.name.rsplit("run", 1)[1]) if "-run" in path.parent.name else -1


def newest(pattern: str) -> Path:
    paths = [p for p in RESULTS.glob(pattern) if run_number(p) >= 0]
    if not paths:
        raise FileNotFoundError(f"no {pattern} under {RESULTS}")
    return max(paths, key=run_number)


def source(path: Path) -> str:
    return f"GPU run {run_number(path)}: {path.relative_to(ROOT)}"


def fig_throughput(out):
    path = newest("*/full.json")  # bench_attention.py at full settings
    data = json.loads(path.read_text())
    contenders = [("torch_flash", "torch SDPA (flash)"), ("torch_cudnn", "torch SDPA (cuDNN)"),
                  ("stridedfa", "stridedfa.torch"), ("stridedfa_kernel", "sdpa_forward / sdpa_backward")]
    cases = data["cases"]
    fig, axes = plt.subplots(2, 1, figsize=(13, 8.4), sharex=True)
    x = np.arange(len(cases))
    width = 0.2
    for ax, metric, label in ((axes[0], "fwd", "forward"), (axes[1], "fwd_bwd", "forward + backward")):
        for n, (key, name) in enumerate(contenders):
            values = [c["results"].get(key, {}).get(metric, {}).get("tflops", float("nan")) for c in cases]
            ax.bar(x + (n - 1.5) * width, values, width, label=name, color=PALETTE[[5, 1, 0, 3][n]])
        ax.set_ylabel(f"{label} TFLOP/s")
        ax.grid(axis="y", alpha=0.3)
        for i, c in enumerate(cases):
            ratio = c.get("ratios", {}).get(f"stridedfa_vs_torch_cudnn_{metric}")
            top = max(c["results"].get(k, {}).get(metric, {}).get("tflops", 0) or 0 for k, _ in contenders)
            if ratio:
                ax.text(i, top * 1.02, f"{ratio:.2f}x", ha="center", fontsize=7)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.1)
    axes[0].legend(fontsize=8, ncol=4, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    labels = [c["label"] + ("\npacked QKV" if c["layout"] == "packed_qkv" else "\ncontiguous") for c in cases]
    axes[1].set_xticks(x)
    axes[1].set_xticklabels(labels, rotation=35, ha="right", fontsize=7)
    fig.suptitle(f"bf16 throughput per config; labels: stridedfa.torch / torch SDPA (cuDNN)\n{source(path)}",
                 fontsize=10)
    fig.tight_layout()
    save(fig, "bench_throughput.png", out)


def fig_variants(out):
    path = newest("*/variants.json")
    data = json.loads(path.read_text())
    result = data["results"][0]
    cfg = result["config"]
    names = {"stridedfa": "stridedfa", "torch_sdpa_cudnn": "torch SDPA (cuDNN)",
             "torch_sdpa_mask": "torch SDPA with the mask", "flex_attention": "FlexAttention (compiled)",
             "stridedfa_default": "stridedfa, default backward"}
    colors = {"stridedfa": PALETTE[0], "torch_sdpa_cudnn": PALETTE[1], "torch_sdpa_mask": PALETTE[5],
              "flex_attention": PALETTE[3], "stridedfa_default": "#90cdf4"}
    variants = list(result["variants"].items())
    first = {}  # the first variant each peer appears in: where its legend entry is made
    for i, (_, v) in enumerate(variants):
        for peer in v["ms"]:
            first.setdefault(peer, i)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for ax, metric, label in ((axes[0], "fwd", "forward"), (axes[1], "fwd_bwd", "forward + backward")):
        for i, (_, v) in enumerate(variants):
            peers = list(v["ms"])
            width = 0.8 / len(peers)
            for n, peer in enumerate(peers):
                ms = v["ms"][peer][metric]
                ax.bar(i - 0.4 + (n + 0.5) * width, ms, width, color=colors[peer],
                       label=names[peer] if i == first[peer] else None)
            for n, peer in enumerate(peers):
                ratio = v.get("ratios", {}).get(peer, {}).get(metric)
                if ratio and peer != "stridedfa":
                    ax.text(i - 0.4 + (n + 0.5) * width, v["ms"][peer][metric] * 1.02, f"{ratio:.2f}x",
                            ha="center", fontsize=6.5, rotation=90, va="bottom")
        ax.set_xticks(range(len(variants)))
        ax.set_xticklabels([name for name, _ in variants], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(f"{label}, ms per call")
        ax.grid(axis="y", alpha=0.3)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.12)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=5, fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, -0.06))
    fig.suptitle(f"Variants at b={cfg['b']}, h={cfg['h']}, s={cfg['s']}, d={cfg['d']} (bf16, window {data['window']})"
                 f" against the strongest peer for the same masked work; labels: peer time / stridedfa time\n"
                 f"{source(path)}", fontsize=10)
    fig.tight_layout()
    save(fig, "bench_variants.png", out)


def fig_bench_varlen(out):
    path = newest("*/varlen.json")
    data = json.loads(path.read_text())
    cfg = data["config"]
    names = {"stridedfa_thd": "stridedfa varlen (THD)", "stridedfa_thd_max": "stridedfa varlen, max_seqlen given",
             "stridedfa_padded": "stridedfa padded + seqlens", "stridedfa_padded_full": "stridedfa padded, full",
             "torch_sdpa_padded": "torch SDPA (cuDNN) padded", "torch_varlen_attn": "torch varlen_attn"}
    keys = [k for k in names if k in data["ms_per_step"]]
    ms = [data["ms_per_step"][k] for k in keys]
    speed = [data["speedup_vs_torch_sdpa_padded"][k] for k in keys]
    fig, ax = plt.subplots(figsize=(9, 4.2))
    colors = [PALETTE[0] if k.startswith("stridedfa") else PALETTE[5] for k in keys]
    ax.barh(range(len(keys)), ms, color=colors)
    for i, (m, sp) in enumerate(zip(ms, speed)):
        ax.text(m * 1.01, i, f"{m:.2f} ms  (speed-up over torch SDPA padded: {sp:.2f}x)", va="center", fontsize=8)
    ax.set_yticks(range(len(keys)))
    ax.set_yticklabels([names[k] for k in keys], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(ms) * 1.75)
    ax.set_xlabel("ms per causal fwd+bwd step")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(f"Variable-length training step: {cfg['tokens']} tokens in {cfg['documents']} documents "
                 f"(longest {cfg['longest']}), h={cfg['heads']}, d={cfg['dim']}, {cfg['dtype']}\n{source(path)}",
                 fontsize=9)
    fig.tight_layout()
    save(fig, "bench_varlen.png", out)


def fig_paged_bench(out):
    path = newest("*/paged.json")
    data = json.loads(path.read_text())
    cfg, rows = data["config"], data["rows"]
    labels = [f"b={r['batch']}, {r['cache_length']}\n{r.get('queries', 1)} "
              f"quer{'y' if r.get('queries', 1) == 1 else 'ies'}" for r in rows]
    best_us = [min(r["stridedfa_paged_us"], r.get("stridedfa_split_us", math.inf)) for r in rows]
    best_share = [max(r["share_of_ceiling"], r.get("split_share_of_ceiling", 0.0)) for r in rows]
    x = np.arange(len(rows))
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.6))
    axes[0].bar(x - 0.2, [r["copy_ceiling_GBps"] * s for r, s in zip(rows, best_share)], 0.4, color=PALETTE[0],
                label="stridedfa paged decode (split-KV where it splits)")
    axes[0].bar(x + 0.2, [r["copy_ceiling_GBps"] for r in rows], 0.4, color=PALETTE[5], alpha=0.6,
                label="device-to-device copy ceiling")
    for i, (r, share) in enumerate(zip(rows, best_share)):
        axes[0].text(i - 0.2, r["copy_ceiling_GBps"] * share * 1.02, f"{share:.0%}", ha="center", fontsize=8)
    axes[0].set_ylabel("effective HBM bandwidth, GB/s")
    axes[0].set_title("bandwidth of one decode step (label: share of the copy ceiling)", fontsize=9)
    axes[1].bar(x - 0.27, [r["stridedfa_paged_us"] for r in rows], 0.27, color=PALETTE[0],
                label="stridedfa.torch.attention_with_kvcache, unsplit")
    if any("stridedfa_split_us" in r for r in rows):
        axes[1].bar(x, [r.get("stridedfa_split_us", np.nan) for r in rows], 0.27, color=PALETTE[2],
                    label="the same, split-KV (STRIDEDFA_SPLIT_KV=auto)")
    axes[1].bar(x + 0.27, [r["torch_sdpa_gathered_us"] for r in rows], 0.27, color=PALETTE[1],
                label="torch SDPA on the cache gathered contiguous (gather untimed)")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("µs per decode step (log)")
    axes[1].set_title("time per step (label: torch time / stridedfa's best time)", fontsize=9)
    for i, (r, us) in enumerate(zip(rows, best_us)):
        axes[1].text(i, max(r["stridedfa_paged_us"], r["torch_sdpa_gathered_us"]) * 1.08,
                     f"{r['torch_sdpa_gathered_us'] / us:.2f}x", ha="center", fontsize=8)
    for ax in axes:
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=7)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"Decode over a paged KV cache: GQA {cfg['h_q']}/{cfg['h_kv']}, d={cfg['d']}, block "
                 f"{cfg['block_size']}, {cfg['dtype']}\n{source(path)}", fontsize=10)
    fig.tight_layout()
    save(fig, "bench_paged.png", out)


HOST_NAMES = {
    "core_execute_floor": "core's bare C++ execute (floor)",
    "torch_sdpa_cudnn": "torch SDPA (cuDNN)",
    "stridedfa_torch": "stridedfa.torch.attention",
    "stridedfa_generic": "stridedfa.sdpa_forward (torch tensors)",
    "stridedfa_dispatch_torch": "stridedfa.attention (torch)",
    "stridedfa_torch_op": "torch.ops.stridedfa (dispatcher)",
    "stridedfa_cupy": "stridedfa.cupy.attention",
    "stridedfa_generic_cupy": "stridedfa.sdpa_forward (CuPy arrays)",
    "stridedfa_dispatch_cupy": "stridedfa.attention (CuPy)",
    "stridedfa_dispatch_other_producer": "stridedfa.attention (other producer)",
    "torch_sdpa_cudnn_autograd": "torch SDPA (cuDNN), grad recorded",
    "stridedfa_torch_autograd": "stridedfa.torch.attention, grad recorded",
    "torch_compile_sdpa_cudnn": "torch.compile'd F.sdpa",
    "torch_compile_stridedfa": "torch.compile'd stridedfa.torch.attention",
}


def fig_host(out):
    path = newest("*/bench_host_overhead.json")
    data = json.loads(path.read_text())
    rows = [(k, data["results"][k]) for k in HOST_NAMES if k in data["results"]]
    fig, ax = plt.subplots(figsize=(10, 6))
    us = [r["us_per_call"] for _, r in rows]
    lo = [r["us_per_call"] - r["p10_us"] for _, r in rows]
    hi = [r["p90_us"] - r["us_per_call"] for _, r in rows]
    torch_rows = ("torch_sdpa_cudnn", "torch_sdpa_cudnn_autograd", "torch_compile_sdpa_cudnn")
    colors = [PALETTE[1] if k in torch_rows else PALETTE[5] if k == "core_execute_floor" else PALETTE[0]
              for k, _ in rows]
    ax.barh(range(len(rows)), us, xerr=[lo, hi], color=colors, capsize=2, error_kw={"elinewidth": 0.8})
    for i, (_, r) in enumerate(rows):
        ax.text(r["p90_us"] + 1, i, f"{r['us_per_call']:.1f} µs ({r['vs_torch_sdpa']:.2f}x SDPA)", va="center",
                fontsize=8)
    torch_us = data["results"]["torch_sdpa_cudnn"]["us_per_call"]
    ax.axvline(torch_us, color=PALETTE[1], linestyle=":", linewidth=1)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([HOST_NAMES[k] for k, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(r["p90_us"] for _, r in rows) * 1.35)
    ax.set_xlabel("host µs per call (median of rounds; whiskers p10-p90)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(f"Host time per entry point, forward on {tuple(data['shape_bhsd'])} (b, h, s, d) {data['dtype']}\n"
                 f"{source(path)}", fontsize=9)
    fig.tight_layout()
    save(fig, "bench_host.png", out)


def fig_transformers(out):
    path = newest("*/transformers.json")
    data = json.loads(path.read_text())
    rows = data["training"]
    colors = {"none": PALETTE[0], "ones": PALETTE[1], "right": PALETTE[3], "left": PALETTE[2]}

    def padding(r):
        return r.get("padding", "right" if r["padded"] else "none")  # runs before 61 padded on the right only

    panels = sorted({(r.get("hidden", 2048), r["batch"], r["seq"]) for r in rows})
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 3.2 * len(panels)), squeeze=False)
    for ax, (hidden, b, seq) in zip(axes[:, 0], panels):
        group = [r for r in rows if (r.get("hidden", 2048), r["batch"], r["seq"]) == (hidden, b, seq)]
        models = list(dict.fromkeys(r["model"] for r in group))
        kinds = [k for k in colors if any(padding(r) == k for r in group)]
        width = 0.8 / len(kinds)
        for r in group:
            x = models.index(r["model"]) + (kinds.index(padding(r)) - (len(kinds) - 1) / 2) * width
            ax.bar(x, r["ratio"], width, color=colors[padding(r)], edgecolor="white",
                   hatch="//" if r["baseline"] != "sdpa" else None)
            ax.text(x, r["ratio"] + 0.01, f"{r['ratio']:.2f}", ha="center", fontsize=6)
        ax.axhline(1.0, color="#1a202c", linewidth=0.8)
        ax.set_xticks(range(len(models)))
        ax.set_xticklabels(models, fontsize=8)
        ax.set_ylim(0, max(r["ratio"] for r in group) * 1.25)
        ax.grid(axis="y", alpha=0.3)
        unpadded = [r["ratio"] for r in group if padding(r) == "none" and r["baseline"] == "sdpa"]
        geo = math.exp(sum(math.log(x) for x in unpadded) / len(unpadded)) if unpadded else float("nan")
        ax.set_title(f"hidden {hidden}, batch {b} x {seq}: unpadded geomean vs SDPA {geo:.3f}", fontsize=9)
        ax.set_ylabel("stridedfa ms /\nbaseline ms", fontsize=8)
        ax.legend(handles=[Patch(color=colors[k], label=f"padding: {k}") for k in kinds] + [
            Patch(facecolor="#a0aec0", hatch="//", edgecolor="white",
                  label="baseline eager (no softcap / sinks in SDPA)")],
            fontsize=7, loc="upper center", ncol=len(kinds) + 1)
    fig.suptitle(f"transformers {data['transformers']} training steps (forward, loss, backward), stridedfa vs the "
                 f"model's SDPA or eager attention (< 1: stridedfa faster)\n{source(path)}", fontsize=9)
    fig.tight_layout()
    save(fig, "bench_transformers.png", out)


FIGURES = [fig_throughput, fig_variants, fig_bench_varlen, fig_paged_bench, fig_host, fig_transformers]
