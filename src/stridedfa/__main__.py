"""``python -m stridedfa``: the environment report, then attention on packed-QKV views.

With a CUDA GPU (and torch to allocate device memory) it runs cuDNN through stridedfa on q/k/v
views of one packed [b, s, 3, h, d] buffer, checks the result against the NumPy reference, checks
that the packed views and contiguous copies give bit-identical output, and times the call. Without
a GPU it runs the same check through the NumPy reference on a small problem and says what is
missing for the GPU path. Exit status 0 means every check passed.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

import stridedfa
from stridedfa import reference


def report_environment() -> dict:
    report = stridedfa.info()
    print("stridedfa environment")
    print(json.dumps(report, indent=2))
    return report


def gpu_unavailable(report: dict) -> str | None:
    devices = report["devices"]
    if isinstance(devices, dict):
        return devices["error"]
    return None if devices else "no CUDA device is visible"


def run_numpy(reason: str) -> int:
    print(f"\nNo GPU path: {reason}")
    print("The cuDNN path needs an NVIDIA GPU (compute capability 8.0+), its driver, and torch with "
          "CUDA for device memory. Running the NumPy reference on packed-QKV views instead.")
    rng = np.random.default_rng(0)
    b, s, h, d = 2, 64, 4, 32
    qkv = rng.standard_normal((b, s, 3, h, d)).astype(np.float32)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))  # views, no copies
    start = time.perf_counter()
    out, lse = reference.sdpa_forward(q, k, v, causal=True)
    elapsed = time.perf_counter() - start
    copies = [np.ascontiguousarray(x) for x in (q, k, v)]
    out_copy, lse_copy = reference.sdpa_forward(*copies, causal=True)
    same = np.array_equal(out, out_copy) and np.array_equal(lse, lse_copy)
    print(f"packed [b={b}, s={s}, 3, h={h}, d={d}] float32, causal: out {out.shape}, "
          f"{elapsed * 1e3:.1f} ms; packed views vs contiguous copies bit-exact: {same}")
    return 0 if same else 1


def run_gpu() -> int:
    try:
        import torch
    except ImportError:
        torch = None  # type: ignore[assignment]
    if torch is None or not torch.cuda.is_available():
        print("\ntorch with CUDA is not installed: the GPU demo allocates device memory with torch.")
        return run_numpy("torch with CUDA is not installed")

    b, s, h, d = 4, 2048, 16, 128
    dtype = torch.bfloat16
    torch.manual_seed(0)
    qkv = torch.randn(b, s, 3, h, d, device="cuda", dtype=dtype)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # views into the packed buffer
    out = torch.full((b, s, h, d), float("nan"), device="cuda", dtype=dtype).transpose(1, 2)
    lse = torch.full((b, h, s), float("nan"), device="cuda", dtype=torch.float32)

    stridedfa.sdpa_forward(q, k, v, out, lse=lse, causal=True)  # builds the cuDNN graph
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = 20
    start.record()
    for _ in range(reps):
        stridedfa.sdpa_forward(q, k, v, out, lse=lse, causal=True)
    stop.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(stop) / reps
    tflops = 4 * b * h * s * s * d / 2 / (ms * 1e-3) / 1e12

    # Bit-exact against contiguous copies of the same numbers.
    qc, kc, vc = (x.contiguous() for x in (q, k, v))
    out_c = torch.empty_like(qc)
    lse_c = torch.empty_like(lse)
    stridedfa.sdpa_forward(qc, kc, vc, out_c, lse=lse_c, causal=True)
    torch.cuda.synchronize()
    bit_exact = torch.equal(out, out_c) and torch.equal(lse, lse_c)

    # Against the NumPy reference (fp32) on the first batch and two heads.
    sub = (slice(0, 1), slice(0, 2))
    ref_out, ref_lse = reference.sdpa_forward(*(x[sub].float().cpu().numpy() for x in (q, k, v)), causal=True)
    err_out = float(np.abs(out[sub].float().cpu().numpy() - ref_out).max())
    err_lse = float(np.abs(lse[sub].cpu().numpy() - ref_lse).max())
    written = not bool(torch.isnan(out).any() or torch.isnan(lse).any())
    ok = bit_exact and written and err_out < 2e-2 and err_lse < 1e-3

    print(f"\ncuDNN through stridedfa on {torch.cuda.get_device_name()}: packed [b={b}, s={s}, 3, h={h}, "
          f"d={d}] bfloat16 q/k/v views, causal, out written into a bshd view")
    print(f"  forward: {ms:.3f} ms/call, {tflops:.0f} TFLOP/s")
    print(f"  every output element written: {written}")
    print(f"  packed views vs contiguous copies bit-exact (out and lse): {bit_exact}")
    print(f"  max |error| vs the fp32 NumPy reference: out {err_out:.2e}, lse {err_lse:.2e}")
    print(f"  graph cache: {stridedfa.cache_info()}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def main() -> int:
    report = report_environment()
    reason = gpu_unavailable(report)
    return run_numpy(reason) if reason else run_gpu()


if __name__ == "__main__":
    sys.exit(main())
