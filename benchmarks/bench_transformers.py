"""transformers training steps and generation: attn_implementation="stridedfa" against "sdpa".

Each family's model at a size where attention matters (4 layers, hidden 2048, 16 heads of 128,
GQA where the family has it; random weights, bfloat16), in one run:
  - a training step (forward, cross-entropy over real tokens, backward) at batch 2 x seq 2048
    unpadded, and at batch 8 x 4096 for llama and qwen2: ms per step, ratio stridedfa / SDPA
    (issue 13's target: <= 1.00 on every model, <= 0.95 geomean);
  - the same step on a right- and on a left-padded batch (lengths uniform in [s/4, s], one full
    row) against SDPA with the mask transformers builds (issue 32's target: >= 1.3x faster);
  - with --compile: every model torch.compile'd (default mode), both implementations;
  - with --generate: greedy generation of every causal model with transformers' dynamic and static
    caches (the static one compiled by transformers), batch 8, 512-token prompts, 128 new tokens:
    tokens per second of the first request (stridedfa's graph builds counted) and of the steady
    state, and the share of tokens equal to the baseline's (issue 33 item 4).
Gemma 2 and gpt-oss run SDPA where they allow it (transformers' SDPA refuses softcap and has no
sinks: they are compared with eager attention and marked so). Each step is timed with CUDA events,
synchronised after each (the pattern of a training loop that logs its loss), the two
implementations' models side by side with their steps in alternation (drift falls on both); the
table gives the ratio of the medians and the median and range of the per-round ratios. Padding is
left out of the loss by label -100 (no host synchronisation inside the step). Beside each step time, the
host time spent issuing it: close to the step time means the step is host-bound. A script, never
a test.

    python benchmarks/bench_transformers.py --out bench-out [--quick] [--generate] [--hidden 1024]
        [--compile] [--padding-check on] [--no-training] [--caches dynamic,static]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from provenance import provenance  # noqa: E402

import stridedfa  # noqa: E402
import stridedfa.transformers  # noqa: E402,F401  (registers "stridedfa")
from helpers import hf_models  # noqa: E402


def fields(name, hidden=2048):
    """The family's config fields at ``hidden`` (1024 or 2048): 4 layers, heads of 128, GQA 4:1
    where the family has it, the MLP 2.6875x wide (Llama's 5504 / 2048)."""
    heads, mlp = hidden // 128, int(hidden * 2.6875)
    size = dict(hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=4, num_attention_heads=heads,
                num_key_value_heads=max(1, heads // 4), head_dim=128, max_position_embeddings=8192, vocab_size=32000)
    plain = dict(vocab_size=32000, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=4,
                 num_attention_heads=heads, max_position_embeddings=8192)
    return {
        "llama": size, "qwen2": size, "qwen3": size,
        "mistral": {**size, "sliding_window": 1024},
        "gemma2": {**size, "sliding_window": 1024, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
                   "query_pre_attn_scalar": 128, "layer_types": ["sliding_attention", "full_attention"] * 2},
        "gpt2": dict(vocab_size=32000, n_embd=hidden, n_layer=4, n_head=heads, n_positions=8192),
        "gpt_neox": plain,
        "gpt_oss": {**size, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 1024,
                    "layer_types": ["sliding_attention", "full_attention"] * 2},
        "bert": plain,
        "modernbert": {**plain, "global_attn_every_n_layers": 2, "local_attention": 256, "pad_token_id": 0},
    }[name]


BASELINE = {"gemma2": "eager", "gpt_oss": "eager"}


def build(name, implementation, hidden=2048):
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    config = hf_models._config(name, **fields(name, hidden))
    torch.manual_seed(0)
    auto = AutoModelForCausalLM if hf_models.FAMILIES[name][1] == "causal" else AutoModelForMaskedLM
    with torch.device("cuda"):  # initialised on the GPU: on the CPU a build takes longer than its timing
        return auto.from_config(config, attn_implementation=implementation, dtype=torch.bfloat16).train()


def make_step(model, ids, mask, causal):
    """One training step: forward, cross-entropy, backward. Padding is left out of the loss by label
    -100, as transformers' Trainer does: indexing the logits with a boolean mask instead would make
    every step wait for the device (a sync)."""
    labels = ids.roll(-1, 1) if mask is None else ids.roll(-1, 1).masked_fill(mask == 0, -100)
    extra = {"use_cache": False} if causal else {}

    def step():
        model.zero_grad(set_to_none=True)
        logits = model(ids, attention_mask=mask, **extra).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        loss.backward()

    return step


def timed(step):
    """(device ms, host ms) of one step, synchronised after it: the host time is the time spent
    issuing the step (close to the device time = host-bound)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    began = time.perf_counter()
    step()
    host = (time.perf_counter() - began) * 1e3
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end), host


def interleaved(steps, warmup, iters):
    """Each implementation's step timed in alternation (A B, B A, A B, ...), so that clock, thermal
    and allocator drift fall on both alike. Returns per implementation the median device and host
    ms, and the median, min and max of the per-round ratios first / second."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    torch.cuda.synchronize()
    names = list(steps)
    times = {name: [] for name in names}
    for i in range(iters):
        for name in (names if i % 2 == 0 else names[::-1]):
            times[name].append(timed(steps[name]))
    pairs = [a[0] / b[0] for a, b in zip(times[names[0]], times[names[1]])]
    result = {name: (statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts))
              for name, ts in times.items()}
    return result, (statistics.median(pairs), min(pairs), max(pairs))


def batch(b, s, padding, seed=0):
    """(ids, attention mask or None) with ``padding`` "none", "right", "left" or "ones" (no padding,
    but the all-ones mask a tokenizer hands over)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 32000, (b, s), generator=gen)
    if padding in ("none", "ones"):
        return ids.cuda(), None if padding == "none" else torch.ones_like(ids).cuda()
    lengths = torch.randint(s // 4, s + 1, (b,), generator=gen)
    lengths[0] = s
    positions = torch.arange(s)[None] if padding == "right" else torch.arange(s - 1, -1, -1)[None]
    mask = (positions < lengths[:, None]).long()
    return ids.masked_fill(mask == 0, 0).cuda(), mask.cuda()


def train_rows(names, quick, hidden=2048, compiled=False, paddings=("none", "right", "left")):
    """Both implementations' models are built side by side (same weights: seed 0) and their steps
    timed in alternation on every batch (compiled: each model torch.compile'd, default mode)."""
    rows = []
    shapes = [(2, 2048)] if quick else [(2, 2048), (8, 4096)]
    warmup, iters = (2, 6) if quick else (3, 20)
    for name in names:
        causal = hf_models.FAMILIES[name][1] == "causal"
        cases = [(b, s, padding) for b, s in shapes for padding in paddings
                 if (b, s) != (8, 4096) or name in ("llama", "qwen2")]
        baseline = BASELINE.get(name, "sdpa")
        models = {implementation: build(name, implementation, hidden) for implementation in ("stridedfa", baseline)}
        if compiled:
            models = {implementation: torch.compile(model) for implementation, model in models.items()}
        for b, s, padding in cases:
            ids, mask = batch(b, s, padding)
            steps = {implementation: make_step(model, ids, mask, causal) for implementation, model in models.items()}
            medians, (pair, low, high) = interleaved(steps, warmup, iters)
            (ours_ms, ours_host), (base_ms, base_host) = medians["stridedfa"], medians[baseline]
            row = {"model": name, "hidden": hidden, "batch": b, "seq": s, "padded": padding in ("right", "left"),
                   "padding": padding, "compiled": compiled, "baseline": baseline,
                   "stridedfa_ms": ours_ms, "baseline_ms": base_ms,
                   "stridedfa_host_ms": ours_host, "baseline_host_ms": base_host,
                   "ratio": ours_ms / base_ms, "pair_ratio_median": pair, "pair_ratio_min": low,
                   "pair_ratio_max": high, "rounds": iters}
            rows.append(row)
            print(json.dumps(row), flush=True)
        del models, steps
        torch.cuda.empty_cache()
    return rows


def float32_tokens(name, hidden, ids, mask, prompt, new_tokens):
    """The greedy tokens of the same model (the same bfloat16 weights) computed in float32 with
    transformers' eager attention: what "the baseline agrees with the float32 model" is measured
    against (random weights leave near-ties that bfloat16 rounding flips)."""
    model = build(name, "eager", hidden).eval().float()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=0)
    del model
    torch.cuda.empty_cache()
    return out[:, prompt:]


def same_where_baseline_agrees(ours, baseline, reference):
    """Issue 33 item 4's token check: in each sequence, the tokens before the baseline first leaves
    the float32 model's, the share of them stridedfa matches (nan where there are none), and how
    many tokens that is."""
    agreed = (baseline == reference).int().cumprod(dim=1).bool()
    compared = int(agreed.sum())
    if compared == 0:
        return float("nan"), 0
    return float(((ours == baseline) & agreed).sum()) / compared, compared


def request(model, ids, mask, settings, prompt):
    """Tokens per second of one greedy request (synchronised before and after), and its new tokens."""
    torch.cuda.synchronize()
    began = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, **settings)
    torch.cuda.synchronize()
    return ids.shape[0] * settings["max_new_tokens"] / (time.perf_counter() - began), out[:, prompt:]


def generation_rows(names, caches=("dynamic", "static"), hidden=1024, batch_size=8, prompt=512, new_tokens=128,
                    rounds=5):
    """Greedy generation (issue 33 item 4) with each cache: the first request of a fresh model
    (its graph builds included: stridedfa's counted), then the steady state (the same request
    again) in ``rounds`` alternating rounds of both models, so that host noise hits both: tokens
    per second each (the steady state's median, with the per-round ratios), and whether
    stridedfa's tokens equal the baseline's. The static cache is compiled by transformers itself
    (its default for a static cache)."""
    rows = []
    ids, mask = batch(batch_size, prompt, "none")
    for name in names:
        baseline = BASELINE.get(name, "sdpa")
        reference = float32_tokens(name, hidden, ids, mask, prompt, new_tokens)
        for cache in caches:
            row = {"model": name, "hidden": hidden, "cache": cache, "baseline": baseline, "batch": batch_size,
                   "prompt": prompt, "new_tokens": new_tokens, "rounds": rounds}
            settings = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                            cache_implementation=cache)
            models, tokens = {}, {}
            for implementation in ("stridedfa", baseline):  # first requests: each model fresh
                models[implementation] = build(name, implementation, hidden).eval()
                builds = stridedfa.cache_info()["builds"]
                row[f"{implementation}_first_tokens_per_s"], tokens[implementation] = request(
                    models[implementation], ids, mask, settings, prompt)
                if implementation == "stridedfa":
                    row["stridedfa_first_graph_builds"] = stridedfa.cache_info()["builds"] - builds
            builds = stridedfa.cache_info()["builds"]
            steady = {implementation: [] for implementation in models}
            for _ in range(rounds):
                for implementation in models:
                    steady[implementation].append(request(models[implementation], ids, mask, settings, prompt)[0])
            row["stridedfa_steady_graph_builds"] = stridedfa.cache_info()["builds"] - builds
            for implementation, speeds in steady.items():
                row[f"{implementation}_steady_tokens_per_s"] = statistics.median(speeds)
            ratios = [ours / theirs for ours, theirs in zip(steady["stridedfa"], steady[baseline])]
            row["steady_round_ratios"] = [round(r, 3) for r in ratios]
            row["first_speedup"] = row["stridedfa_first_tokens_per_s"] / row[f"{baseline}_first_tokens_per_s"]
            row["steady_speedup"] = statistics.median(ratios)
            row["same_tokens"] = float((tokens["stridedfa"] == tokens[baseline]).float().mean())
            share, compared = same_where_baseline_agrees(tokens["stridedfa"], tokens[baseline], reference)
            row["same_tokens_where_baseline_agrees_with_float32"] = share
            row["tokens_where_baseline_agrees_with_float32"] = compared
            del models
            torch.cuda.empty_cache()
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def table(rows, generation):
    lines = ["| model | hidden | batch x seq | padding | stridedfa ms (host) | baseline ms (host) | ratio "
             "| per-round ratios |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']}{' (compiled)' if r.get('compiled') else ''} | {r['hidden']} | "
                     f"{r['batch']} x {r['seq']} | {r['padding']} | "
                     f"{r['stridedfa_ms']:.2f} ({r['stridedfa_host_ms']:.1f}) | {r['baseline_ms']:.2f} "
                     f"({r['baseline_host_ms']:.1f}, {r['baseline']}) | {r['ratio']:.3f} | "
                     f"{r['pair_ratio_median']:.3f} [{r['pair_ratio_min']:.3f}, {r['pair_ratio_max']:.3f}] |")
    unpadded = [r["ratio"] for r in rows if not r["padded"] and r["baseline"] == "sdpa"]
    padded = [1 / r["ratio"] for r in rows if r["padded"] and r["baseline"] == "sdpa"]
    if unpadded:
        lines.append(f"\nUnpadded vs SDPA: geomean ratio {math.exp(sum(map(math.log, unpadded)) / len(unpadded)):.3f}, "
                     f"worst {max(unpadded):.3f} (targets <= 0.95, <= 1.00)")
    if padded:
        lines.append(f"Padded vs SDPA with mask: speedup min {min(padded):.2f}x, "
                     f"geomean {math.exp(sum(map(math.log, padded)) / len(padded)):.2f}x (target >= 1.3x)")
    if generation:
        lines += ["", "| model | cache | first request tokens/s (graphs built) | baseline | steady tokens/s | baseline "
                  "| first, steady speedup [steady rounds' range] | same tokens "
                  "| same where the baseline agrees with float32 (tokens) |",
                  "|---|---|---|---|---|---|---|---|---|"]
    for g in generation:
        base = g["baseline"]
        lines.append(f"| {g['model']} | {g['cache']} | {g['stridedfa_first_tokens_per_s']:.0f} "
                     f"({g['stridedfa_first_graph_builds']}) | {g[base + '_first_tokens_per_s']:.0f} ({base}) | "
                     f"{g['stridedfa_steady_tokens_per_s']:.0f} ({g['stridedfa_steady_graph_builds']}) | "
                     f"{g[base + '_steady_tokens_per_s']:.0f} | "
                     f"{g['first_speedup']:.2f}x, {g['steady_speedup']:.2f}x "
                     f"[{min(g.get('steady_round_ratios', [g['steady_speedup']])):.2f}, "
                     f"{max(g.get('steady_round_ratios', [g['steady_speedup']])):.2f}] | "
                     f"{g['same_tokens']:.3f} | "
                     f"{g.get('same_tokens_where_baseline_agrees_with_float32', float('nan')):.3f} "
                     f"({g.get('tokens_where_baseline_agrees_with_float32', 0)}) |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--generate", action="store_true")
    parser.add_argument("--caches", default="dynamic,static", help="with --generate: dynamic, static")
    parser.add_argument("--no-training", action="store_true", help="only the generation rows")
    parser.add_argument("--models", default=",".join(hf_models.available()))
    parser.add_argument("--hidden", type=int, default=2048, help="the models' hidden size (heads of 128)")
    parser.add_argument("--compile", action="store_true", help="torch.compile every model (default mode)")
    parser.add_argument("--paddings", default="none,right,left",
                        help="batches: none, right, left, ones (an all-ones mask)")
    parser.add_argument("--padding-check", choices=("on", "off"), default="off",
                        help="stridedfa.transformers.set_padding_check: read padding masks on the host (on) or not")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import transformers

    names = [n for n in args.models.split(",") if n in hf_models.available()]
    stridedfa.transformers.set_padding_check(args.padding_check == "on")
    paddings = args.paddings.split(",")
    rows = [] if args.no_training else train_rows(names, args.quick, args.hidden, args.compile, paddings)
    generation = (generation_rows([n for n in names if hf_models.FAMILIES[n][1] == "causal"],
                                  args.caches.split(","), args.hidden) if args.generate else [])
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "transformers": transformers.__version__, "hidden": args.hidden, "compiled": args.compile,
              "padding_check": args.padding_check, "provenance": provenance(stridedfa), "training": rows,
              "generation": generation}
    (args.out / "transformers.json").write_text(json.dumps(result, indent=1))
    (args.out / "transformers.md").write_text(table(rows, generation))
    print(table(rows, generation))


if __name__ == "__main__":
    main()
