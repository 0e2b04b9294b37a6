"""Attention variants side by side: stridedfa against the strongest peer for the same masked work.

For each anchor configuration (bf16, bshd memory order as models hold it) and variant:

- ``padding``: per-sequence lengths (a padded batch; half the batch at full length, half at 40%).
  stridedfa ``seqlens_q/kv`` vs torch SDPA with the equivalent boolean mask (b, 1, s, s) and
  FlexAttention (compiled, a mask_mod reading the lengths tensor);
- ``window``: causal with a sliding window of 1024 tokens (Mistral-style). stridedfa ``window``
  vs torch SDPA with an explicit (s, s) boolean mask and FlexAttention with a block mask;
- ``softcap``: Gemma 2's causal attention with logits capped at 50 and a 1024-token window.
  stridedfa ``softcap`` + ``window`` vs FlexAttention (score_mod tanh cap, block mask); torch SDPA
  has no softcap;
- ``bias``: a constant (1, h, s, s) additive bias (T5-style relative positions, or a float mask).
  stridedfa ``bias`` vs torch SDPA ``attn_mask`` (the same tensor) and FlexAttention (a score_mod
  reading it);
- ``alibi``: causal with ALiBi slopes 2^(-8 (h + 1) / H) (BLOOM). stridedfa ``alibi_slopes`` vs
  FlexAttention (score_mod -slope * (i - j), causal block mask) and torch SDPA with the ALiBi bias
  and causal mask materialised as one float (1, h, s, s) mask;
- ``deterministic``: causal, stridedfa's deterministic backward (the ratio is its cost against
  stridedfa's default causal backward, ``causal`` below);
- ``causal``: plain causal, stridedfa vs torch SDPA (cuDNN backend, is_causal=True);
- ``none``: no mask, stridedfa vs torch SDPA (cuDNN backend): the yardstick for the efficiency.

Times are CUDA-event medians of back-to-back calls (forward, and forward + backward of
``out.backward(grad)``) after warm-up; every contender runs in the same process on the same inputs,
and its output is compared with stridedfa's first (a mismatch is reported, not timed). Reported:
milliseconds, ratios peer / stridedfa (> 1: stridedfa faster), and the efficiency of each variant,
``t(none) * fraction / t(variant)`` where fraction is the share of the score matrix the mask keeps
(1.0: the variant costs exactly its share of the unmasked time).

    python benchmarks/bench_variants.py --out DIR [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback

CONFIGS = [  # (b, h, s, d)
    (2, 16, 4096, 128),
    (8, 16, 1024, 64),
]
WINDOW = 1024
VARIANTS = ("none", "causal", "padding", "window", "softcap", "bias", "alibi", "deterministic", "dropout")
SOFTCAP = 50.0
DROPOUT = 0.1


def log(*args):
    print(*args, flush=True)


def timed(torch, fn, reps):
    """Median ms of `reps` back-to-back calls, each bracketed by CUDA events."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def lengths_for(torch, b, s):
    return torch.tensor([s if i % 2 == 0 else int(s * 0.4) for i in range(b)], device="cuda", dtype=torch.int32)


def kept_fraction(variant, b, s, lengths):
    if variant in ("none", "bias"):
        return 1.0
    if variant in ("causal", "deterministic", "alibi", "dropout"):
        return (s + 1) / (2 * s)
    if variant == "padding":
        return sum((n / s) ** 2 for n in lengths.tolist()) / b
    window = min(WINDOW, s)  # causal with a window: each row keeps min(i + 1, window + 1) keys
    kept = sum(min(i + 1, window + 1) for i in range(s))
    return kept / (s * s)


def dense_mask(torch, variant, b, s, lengths):
    """The boolean mask torch SDPA takes (True: attend)."""
    idx = torch.arange(s, device="cuda")
    if variant == "padding":
        valid = idx[None, :] < lengths[:, None].long()  # (b, s)
        return (valid[:, None, :, None] & valid[:, None, None, :])
    i, j = idx[:, None], idx[None, :]
    return (j <= i) & (j >= i - WINDOW)


def window_mask(b_, h_, i, j):
    """FlexAttention's mask_mod of causal attention with the sliding window."""
    return (j <= i) & (j >= i - WINDOW)


def add_flex(torch, fns, s, mask_mod, *, score_mod=None, mask_batch=None):
    """fns["flex_attention"]: compiled FlexAttention with a block mask from `mask_mod` (None: no mask,
    `mask_batch`: a mask per batch) and `score_mod`; where FlexAttention is missing, said and left out."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        block = None if mask_mod is None else create_block_mask(mask_mod, mask_batch, None, s, s, device="cuda")
        # Every variant's score_mod / block mask and each grad mode is a recompile of the same
        # function: past dynamo's default limit of 8 it silently runs FlexAttention unfused (GPU
        # run 31: ALiBi at 32 ms instead of ~0.5 ms), which would flatter stridedfa.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 512)
        flex = torch.compile(flex_attention, dynamic=False)
        fns["flex_attention"] = lambda q, k, v: flex(q, k, v, block_mask=block, score_mod=score_mod)
    except Exception as error:  # noqa: BLE001 (reported, the run goes on)
        log(f"  flex_attention unavailable: {type(error).__name__}: {error}")


def contenders(torch, sfa_torch, variant, q, k, v, lengths):
    """{name: fn(q, k, v) -> out (b, h, s, d)} for the variant."""
    import torch.nn.functional as F

    b, h, s, d = q.shape
    fns = {}
    cudnn = torch.nn.attention.SDPBackend.CUDNN_ATTENTION
    if variant in ("none", "causal"):
        causal = variant == "causal"
        fns["stridedfa"] = lambda q, k, v: sfa_torch.attention(q, k, v, causal=causal)

        def sdpa(q, k, v):
            with torch.nn.attention.sdpa_kernel(cudnn):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        fns["torch_sdpa_cudnn"] = sdpa
        return fns
    if variant == "dropout":  # causal with dropout_p: each draws its own mask (outputs not compared)
        fns["stridedfa"] = lambda q, k, v: sfa_torch.attention(q, k, v, causal=True, dropout_p=DROPOUT)

        def sdpa_dropout(q, k, v):
            with torch.nn.attention.sdpa_kernel(cudnn):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=DROPOUT)
        fns["torch_sdpa_cudnn"] = sdpa_dropout
        return fns
    if variant == "deterministic":
        fns["stridedfa"] = lambda q, k, v: sfa_torch.attention(q, k, v, causal=True, deterministic=True)
        fns["stridedfa_default"] = lambda q, k, v: sfa_torch.attention(q, k, v, causal=True)
        return fns
    if variant in ("bias", "alibi"):
        return bias_contenders(torch, sfa_torch, variant, h, s)
    if variant == "softcap":
        fns["stridedfa"] = lambda q, k, v: sfa_torch.attention(q, k, v, causal=True, window=(WINDOW, 0),
                                                               softcap=SOFTCAP)
        def score_mod(score, b_, h_, i, j):
            return SOFTCAP * torch.tanh(score / SOFTCAP)
        add_flex(torch, fns, s, window_mask, score_mod=score_mod)
        return fns
    if variant == "padding":
        fns["stridedfa"] = lambda q, k, v: sfa_torch.attention(q, k, v, seqlens_q=lengths, seqlens_kv=lengths)
    else:
        fns["stridedfa"] = lambda q, k, v: sfa_torch.attention(q, k, v, causal=True, window=(WINDOW, 0))
    mask = dense_mask(torch, variant, b, s, lengths)
    fns["torch_sdpa_mask"] = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if variant == "padding":
        def padding_mask(b_, h_, i, j):
            return (i < lengths[b_]) & (j < lengths[b_])
        add_flex(torch, fns, s, padding_mask, mask_batch=b)
    else:
        add_flex(torch, fns, s, window_mask)
    return fns


def bias_contenders(torch, sfa_torch, variant, h, s):
    """bias: a constant (1, h, s, s) bias; alibi: causal ALiBi. The same scores for every contender."""
    import torch.nn.functional as F

    fns = {}
    idx = torch.arange(s, device="cuda")
    if variant == "bias":
        gen = torch.Generator(device="cuda").manual_seed(1)
        bias = torch.randn(1, h, s, s, device="cuda", generator=gen).to(torch.bfloat16)
        fns["stridedfa"] = lambda q, k, v: sfa_torch.attention(q, k, v, bias=bias)
        fns["torch_sdpa_mask"] = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

        def score_mod(score, b_, h_, i, j):
            return score + bias[0, h_, i, j]
        add_flex(torch, fns, s, None, score_mod=score_mod)
    else:
        slopes = 2.0 ** (-8.0 * torch.arange(1, h + 1, device="cuda") / h)
        fns["stridedfa"] = lambda q, k, v: sfa_torch.attention(q, k, v, causal=True, alibi_slopes=slopes)
        distance = (idx[:, None] - idx[None, :]).float()  # i - j >= 0 where seen
        dense = (-slopes[:, None, None] * distance).masked_fill(idx[None, :] > idx[:, None], float("-inf"))
        dense = dense[None].to(torch.bfloat16)
        fns["torch_sdpa_mask"] = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=dense)

        def score_mod(score, b_, h_, i, j):
            return score - slopes[h_] * (i - j)

        def causal_mask(b_, h_, i, j):
            return j <= i
        add_flex(torch, fns, s, causal_mask, score_mod=score_mod)
    return fns


def output_of(torch, fn, base):
    with torch.no_grad():
        return fn(*(x.transpose(1, 2) for x in base))


def time_contender(torch, fn, base, grad, reps):
    """fwd and fwd+bwd ms of fn on bshd leaves passed as (b, h, s, d) views."""
    leaves = [x.clone().requires_grad_() for x in base]
    q, k, v = (x.transpose(1, 2) for x in leaves)

    def train():
        for x in leaves:
            x.grad = None
        fn(q, k, v).backward(grad)
    return {"fwd": timed(torch, lambda: fn(q, k, v), reps), "fwd_bwd": timed(torch, train, reps)}


def run_config(torch, sfa_torch, config, reps):
    b, h, s, d = config
    gen = torch.Generator(device="cuda").manual_seed(0)
    base = [torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3)]
    grad = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    lengths = lengths_for(torch, b, s)
    result = {"config": {"b": b, "h": h, "s": s, "d": d}, "variants": {}}
    for variant in VARIANTS:
        entry = {"fraction": kept_fraction(variant, b, s, lengths), "ms": {}, "errors": {}}
        fns = contenders(torch, sfa_torch, variant, *[x.transpose(1, 2) for x in base], lengths)
        reference = None
        for name, fn in fns.items():
            try:
                out = output_of(torch, fn, base)
                if variant == "padding":  # padded query rows are defined only by stridedfa (zeros)
                    keep = (torch.arange(s, device="cuda")[None, :] < lengths[:, None])[:, None, :, None]
                    out = out * keep
                if reference is None:
                    reference = out.float()
                elif variant != "dropout":  # random masks differ between implementations
                    err = (out.float() - reference).abs().max().item()
                    entry["errors"][name] = err
                    if not err <= 5e-2:
                        log(f"  {variant} {name}: max |diff| vs stridedfa {err:.3e}: not timed")
                        continue
                entry["ms"][name] = time_contender(torch, fn, base, grad, reps)
                times = entry["ms"][name]
                log(f"  {config} {variant:8s} {name:16s} fwd {times['fwd']:8.3f} ms  "
                    f"fwd+bwd {times['fwd_bwd']:8.3f} ms")
            except Exception as error:  # noqa: BLE001
                entry["errors"][name] = f"{type(error).__name__}: {error}"[:400]
                log(f"  {variant} {name}: {entry['errors'][name]}")
                traceback.print_exc()
        result["variants"][variant] = entry
    none = result["variants"]["none"]["ms"].get("stridedfa")
    for entry in result["variants"].values():
        mine = entry["ms"].get("stridedfa")
        if not mine:
            continue
        entry["ratios"] = {peer: {m: times[m] / mine[m] for m in ("fwd", "fwd_bwd")}
                           for peer, times in entry["ms"].items() if peer != "stridedfa"}
        if none:
            entry["efficiency"] = {m: none[m] * entry["fraction"] / mine[m] for m in ("fwd", "fwd_bwd")}
    return result


def markdown(data):
    lines = ["# Attention variants: stridedfa vs peers", "",
             f"{data['device']}, torch {data['torch']}, cuDNN {data['cudnn']}, stridedfa {data['stridedfa_commit']}",
             "", "ratio = peer time / stridedfa time (> 1: stridedfa faster); efficiency = t(none) * kept "
             "fraction / t(variant)", "",
             "| config | variant | kept | stridedfa fwd / fwd+bwd ms | torch SDPA (+ mask) | FlexAttention | "
             "stridedfa default | efficiency fwd / fwd+bwd |", "|---|---|---|---|---|---|---|---|"]

    def pair(r):
        return f"{r['fwd']:.2f}x / {r['fwd_bwd']:.2f}x" if r else "-"
    for result in data["results"]:
        c = result["config"]
        for variant, e in result["variants"].items():
            mine = e["ms"].get("stridedfa")
            if not mine:
                continue
            ratios = e.get("ratios", {})
            eff = e.get("efficiency")
            efficiency = f"{eff['fwd']:.2f} / {eff['fwd_bwd']:.2f}" if eff else "-"
            sdpa = ratios.get("torch_sdpa_mask") or ratios.get("torch_sdpa_cudnn")
            lines.append(f"| b{c['b']} h{c['h']} s{c['s']} d{c['d']} | {variant} | {e['fraction']:.2f} | "
                         f"{mine['fwd']:.3f} / {mine['fwd_bwd']:.3f} | {pair(sdpa)} | "
                         f"{pair(ratios.get('flex_attention'))} | {pair(ratios.get('stridedfa_default'))} | "
                         f"{efficiency} |")
    return "\n".join(lines) + "\n"


def plot(data, path):
    """Bars of peer time / stridedfa time per variant and metric (> 1: stridedfa faster)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, series = [], {}
    for result in data["results"]:
        c = result["config"]
        for variant, e in result["variants"].items():
            for peer, ratio in e.get("ratios", {}).items():
                for metric in ("fwd", "fwd_bwd"):
                    series.setdefault(f"{peer} {metric}", {})[f"{variant}\ns{c['s']} d{c['d']}"] = ratio[metric]
            labels.append(f"{variant}\ns{c['s']} d{c['d']}")
    labels = list(dict.fromkeys(labels))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(labels)), 4))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        ax.bar([x + i * width for x in range(len(labels))], [values.get(label, 0) for label in labels], width,
               label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(labels))], labels, fontsize=7)
    ax.set_ylabel("peer time / stridedfa time")
    ax.set_title(f"stridedfa variants vs peers ({data['device']})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, the first configuration only")
    args = parser.parse_args()
    import torch

    import stridedfa
    import stridedfa.torch as sfa_torch

    os.makedirs(args.out, exist_ok=True)
    reps = 10 if args.quick else 30
    info = stridedfa.info()
    build = info.get("build", {})
    data = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cudnn": info.get("cudnn", {}).get("version"),
            "stridedfa_commit": f"{build.get('commit', '?')[:12]}{' (dirty)' if build.get('dirty') == 'true' else ''}",
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "window": WINDOW, "results": []}
    for config in CONFIGS[:1] if args.quick else CONFIGS:
        log(f"config {config}")
        data["results"].append(run_config(torch, sfa_torch, config, reps))
    with open(os.path.join(args.out, "variants.json"), "w") as f:
        json.dump(data, f, indent=1)
    with open(os.path.join(args.out, "variants.md"), "w") as f:
        f.write(markdown(data))
    log(markdown(data))
    try:
        plot(data, os.path.join(args.out, "variants.png"))
    except ImportError:
        log("matplotlib is not installed: no PNG (render later from variants.json with plot())")


if __name__ == "__main__":
    sys.exit(main())
