"""Where a transformers training step's time goes: attn_implementation="stridedfa" against "sdpa".

For each model (built as bench_transformers.py builds it, at --hidden), both implementations':
  - the step's device and host ms (median of --steps steps, synchronised after each);
  - the kernels one step launches, by name and count, and the GPU's busy share of the step (the
    summed kernel time over the step's wall time: well below 1 means the GPU waits for the host);
  - the synchronising CUDA calls one step makes (``torch.cuda.set_sync_debug_mode("warn")``), each
    with the Python frames that made it;
  - graph builds and cache misses during the profiled steps (``stridedfa.cache_info()``);
  - torch.profiler's operator tables (CPU and CUDA activities), sorted by self CPU time and by
    device time, as text, and one step's Chrome trace (gzip).
The difference between the two is written as kernels stridedfa launches that SDPA does not (and the
reverse), so an extra fill, copy or bias shows by name. A script, never a test.

With ``--decode`` a step is one greedy decoding step instead (no gradients): one new token per
sequence through transformers' dynamic cache after a prefill of --seq tokens, as ``generate`` runs
it (the all-ones mask grown by a column each step), so the cache grows by one each step.

    python benchmarks/profile_transformers_step.py --out prof-out --models bert,gpt_neox --hidden 1024 [--padding right]
    python benchmarks/profile_transformers_step.py --out prof-out --models qwen3,mistral --decode --batch 8 --seq 512
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import shutil
import statistics
import sys
import traceback
import warnings
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_transformers import BASELINE, batch, build, make_step, timed  # noqa: E402

import stridedfa  # noqa: E402
import stridedfa.transformers  # noqa: E402
from helpers import hf_models  # noqa: E402  (bench_transformers put tests/ on the path)


def _syncs(step) -> list[dict]:
    """The synchronising calls of one step, each with the innermost frames outside torch."""
    seen: list[dict] = []

    def record(message, category, filename, lineno, file=None, line=None):
        if "called a synchronizing" not in str(message):  # (not the mode's one-time "prototype" notice)
            return
        frames = [f for f in traceback.extract_stack()[:-2] if "/torch/" not in f.filename][-4:]
        seen.append({"message": str(message)[:160], "frames": [f"{Path(f.filename).name}:{f.lineno} {f.name}"
                                                               for f in frames]})

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return seen


def _kernels(prof, steps: int) -> tuple[Counter, Counter]:
    """Kernel launches and device microseconds per step, by kernel name."""
    counts, micros = Counter(), Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            name = event.name[:110]
            counts[name] += 1
            micros[name] += event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
    return (Counter({k: v / steps for k, v in counts.items()}), Counter({k: v / steps for k, v in micros.items()}))


def make_decode_step(model, ids, mask):
    """One greedy decoding step after a prefill of ``ids``: the next token of every sequence through
    the dynamic cache, with the mask ``generate`` hands over (all ones, a column longer each step)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    state = {"mask": torch.ones_like(ids) if mask is None else mask}
    with torch.no_grad():
        logits = model(ids, attention_mask=state["mask"], past_key_values=cache, use_cache=True).logits
    state["next"] = logits[:, -1:].argmax(-1)
    column = torch.ones_like(state["mask"][:, :1])

    def step():
        with torch.no_grad():
            state["mask"] = torch.cat([state["mask"], column], 1)
            logits = model(state["next"], attention_mask=state["mask"], past_key_values=cache, use_cache=True).logits
            state["next"] = logits[:, -1:].argmax(-1)

    return step


def profile_one(name: str, implementation: str, model, ids, mask, causal: bool, steps: int, out: Path,
                decode: bool = False) -> dict:
    step = make_decode_step(model.eval(), ids, mask) if decode else make_step(model, ids, mask, causal)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    times = [timed(step) for _ in range(steps)]
    syncs = _syncs(step)
    before = stridedfa.cache_info()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    after = stridedfa.cache_info()
    counts, micros = _kernels(prof, steps)
    device_ms = statistics.median(t[0] for t in times)
    stem = out / f"{name}-{implementation}"
    averages = prof.key_averages()
    sort_device = "device_time_total" if hasattr(averages[0], "device_time_total") else "cuda_time_total"
    stem.with_suffix(".ops.txt").write_text(
        "## by self CPU time\n" + averages.table(sort_by="self_cpu_time_total", row_limit=45, max_name_column_width=70)
        + "\n## by device time\n" + averages.table(sort_by=sort_device, row_limit=45, max_name_column_width=70))
    trace = stem.with_suffix(".trace.json")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as one:
        step()
        torch.cuda.synchronize()
    one.export_chrome_trace(str(trace))
    with open(trace, "rb") as raw, gzip.open(f"{trace}.gz", "wb") as packed:
        shutil.copyfileobj(raw, packed)
    trace.unlink()
    return {"model": name, "implementation": implementation, "device_ms": device_ms,
            "host_ms": statistics.median(t[1] for t in times),
            "kernels_per_step": sum(counts.values()), "kernel_ms_per_step": sum(micros.values()) / 1e3,
            "gpu_busy_share": sum(micros.values()) / 1e3 / device_ms,
            "syncs_per_step": len(syncs), "sync_sites": syncs[:12],
            "graph_builds": after["builds"] - before["builds"], "cache_misses": after["misses"] - before["misses"],
            "kernels": dict(counts.most_common()), "kernel_us": {k: round(v, 1) for k, v in micros.most_common()}}


def difference(ours: dict, theirs: dict) -> dict:
    """Kernels by name whose count per step differs, with the device µs each side spends on them."""
    names = set(ours["kernels"]) | set(theirs["kernels"])
    rows = []
    for kernel in names:
        a, b = ours["kernels"].get(kernel, 0), theirs["kernels"].get(kernel, 0)
        if a != b:
            rows.append({"kernel": kernel, "stridedfa": a, "baseline": b,
                         "stridedfa_us": ours["kernel_us"].get(kernel, 0),
                         "baseline_us": theirs["kernel_us"].get(kernel, 0)})
    return {"kernels": sorted(rows, key=lambda r: -abs(r["stridedfa_us"] - r["baseline_us"]))}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default="bert,gpt_neox")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--padding", choices=("none", "right", "left", "ones"), default="none")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--decode", action="store_true", help="profile greedy decoding steps, not training steps")
    parser.add_argument("--padding-check", choices=("on", "off"), default="off",
                        help="stridedfa.transformers.set_padding_check: read padding masks on the host (on) or not")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import transformers

    stridedfa.transformers.set_padding_check(args.padding_check == "on")
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "transformers": transformers.__version__, "stridedfa": stridedfa.__version__,
              "hidden": args.hidden, "batch": args.batch, "seq": args.seq, "padding": args.padding,
              "padding_check": args.padding_check, "decode": args.decode, "models": []}
    for name in args.models.split(","):
        causal = hf_models.FAMILIES[name][1] == "causal"
        ids, mask = batch(args.batch, args.seq, args.padding)
        sides = {}
        for implementation in ("stridedfa", BASELINE.get(name, "sdpa")):
            model = build(name, implementation, args.hidden)
            ours = implementation == "stridedfa"  # which must really run on stridedfa
            with stridedfa.transformers.fallback("raise") if ours else contextlib.nullcontext():
                sides[implementation] = profile_one(name, implementation, model, ids, mask, causal, args.steps,
                                                    args.out, args.decode)
            del model
            torch.cuda.empty_cache()
        ours, theirs = sides.values()
        entry = {"model": name, "sides": sides, "ratio": ours["device_ms"] / theirs["device_ms"],
                 "difference": difference(ours, theirs)}
        report["models"].append(entry)
        print(json.dumps({k: entry[k] for k in ("model", "ratio")}
                         | {f"{s['implementation']}": {k: s[k] for k in ("device_ms", "host_ms", "kernels_per_step",
                                                                          "gpu_busy_share", "syncs_per_step",
                                                                          "graph_builds")}
                            for s in sides.values()}), flush=True)
        for row in entry["difference"]["kernels"][:12]:
            print("   ", json.dumps(row), flush=True)
    (args.out / "profile.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
