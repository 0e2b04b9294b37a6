"""``python -m stridedfa``: the environment report, then attention on packed-QKV views.

With a CUDA GPU it runs cuDNN through stridedfa on q/k/v views of one packed [b, s, 3, h, d]
buffer (device memory from torch, else CuPy, else cuda-python's cuda.core: no framework needed),
checks the result against the NumPy reference, checks that the packed views and contiguous copies
give bit-identical output, and times the call. Without a GPU it runs the same check through the
NumPy reference on a small problem and says what is missing for the GPU path. Exit status 0 means every check passed.
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
    print("The cuDNN path needs an NVIDIA GPU (compute capability 8.0+), its driver, and one of torch "
          "with CUDA, CuPy or cuda-core for device memory. Running the NumPy reference on packed-QKV "
          "views instead.")
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
    from stridedfa import _demo_gpu
    be, reason = _demo_gpu.backend()
    if be is None:
        return run_numpy(f"no way to allocate device memory is installed ({reason})")
    return _demo_gpu.run(be)


def main() -> int:
    report = report_environment()
    reason = gpu_unavailable(report)
    return run_numpy(reason) if reason else run_gpu()


if __name__ == "__main__":
    sys.exit(main())
