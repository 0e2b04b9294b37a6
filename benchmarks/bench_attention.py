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

Host time per call is not measured here: ``benchmarks/bench_host_overhead.py`` owns it.

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
5. Errors: every exception, per config / contender / metric.

``DIR/bench_attention.json`` holds everything (schema in benchmarks/README.md),
including the environment (GPU, driver, torch, cuDNN, stridedfa, git commit) and
``stridedfa.cache_info()`` at start and end. The JSON is rewritten after every
config, so a crash still leaves the results so far.

Usage::

    PYTHONUNBUFFERED=1 python3 -X faulthandler benchmarks/bench_attention.py --out DIR [--quick]
    python3 benchmarks/bench_attention.py --render DIR/bench_attention.json   # re-render markdown

torch is imported inside ``main`` so that ``--help`` and ``--render`` work without it.
This file is the script (command line, configurations, environment record, the run);
the timing machinery is in ``attention_timing.py``, the rendering in ``attention_report.py``.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import gc
import json
import os
import platform
import subprocess
import sys
import time
import traceback

from attention_report import compute_ratios, render_markdown, write_outputs
from attention_timing import (
    CHECK_ROWS,
    GRAD_REL,
    GRAD_YARDSTICK_FACTOR,
    LSE_ATOL,
    OUT_ATOL,
    OUT_RTOL,
    PREROLL_MS,
    SETTLE_MS,
    Abort,
    case_label,
    case_name,
    cuda_alive,
    err_str,
    log,
    new_case_result,
    run_case,
)
from provenance import measured_build

SCHEMA = "stridedfa.bench_attention/1"

# (b, h_q, h_kv, s, d, causal); s_q == s_kv: the team's anchor configurations on the H200 host
# (ci/gpu_host.md says how that host builds and runs).
CONFIGS = [
    (2, 16, 16, 4096, 128, False),
    (2, 16, 16, 4096, 128, True),
    (1, 32, 32, 8192, 128, True),
    (4, 32, 8, 2048, 128, True),
    (8, 16, 16, 1024, 64, False),
    (1, 16, 16, 16384, 128, True),
]

# Anchor figures measured on the H200 test host (team notes, 2026-12-02), TFLOP/s,
# contiguous layout: torch SDPA cuDNN fwd / fwd+bwd, torch SDPA flash fwd / fwd+bwd.
ANCHORS = {
    (2, 16, 16, 4096, 128, False): {"torch_cudnn": (566, 534), "torch_flash": (331, 286)},
    (2, 16, 16, 4096, 128, True): {"torch_cudnn": (471, 408), "torch_flash": (256, 232)},
    (1, 32, 32, 8192, 128, True): {"torch_cudnn": (578, 519), "torch_flash": (286, 281)},
    (4, 32, 8, 2048, 128, True): {"torch_cudnn": (462, 376), "torch_flash": (273, 212)},
    (8, 16, 16, 1024, 64, False): {"torch_cudnn": (314, 232), "torch_flash": (229, 189)},
    (1, 16, 16, 16384, 128, True): {"torch_cudnn": (615, 549), "torch_flash": (297, 305)},
}



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
        "git": git_info(),  # the checkout it was launched from; the measured wheel's own: measured_build
        "measured_build": measured_build(sfa) if sfa is not None else None,
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


# --------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="Benchmark stridedfa against torch SDPA (cuDNN, flash): forward and "
                    "forward+backward TFLOP/s, packed-QKV layouts. "
                    "Writes DIR/bench_attention.json and DIR/bench_attention.md.")
    p.add_argument("--out", metavar="DIR", help="output directory (created if missing)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: ~10 ms per measurement, 3 measurements")
    p.add_argument("--configs", metavar="I,J,...",
                   help="comma-separated indices into the config list (default: all): "
                        + "; ".join(f"{i}={c}" for i, c in enumerate(CONFIGS)))
    p.add_argument("--no-packed", action="store_true", help="skip the packed-QKV variants")
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
        md = render_markdown(data, ANCHORS)
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
        return write_outputs(data, args.out, ANCHORS)

    try:
        for c in case_list(args.config_indices, not args.no_packed):
            log(f"{case_label(c)} [{c['layout']}]")
            res = new_case_result(c)
            data["cases"].append(res)
            try:
                run_case(torch, sfa, c, tp, res, ignore_mismatch=args.ignore_mismatch)
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
