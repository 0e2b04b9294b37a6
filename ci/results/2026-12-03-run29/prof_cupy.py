# Host time of the CuPy path, piece by piece (issue 9): where CuPy's call spends more than torch's.
import statistics, time
import cupy, torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import stridedfa, stridedfa.cupy as sc, stridedfa.torch as st
from stridedfa import _core

def t(label, f, n=3000):
    for _ in range(300): f()
    torch.cuda.synchronize(); cupy.cuda.Device().synchronize()
    runs = []
    for _ in range(7):
        t0 = time.perf_counter_ns()
        for _ in range(n): f()
        runs.append((time.perf_counter_ns() - t0) / n / 1000)
        torch.cuda.synchronize(); cupy.cuda.Device().synchronize()
    print(f"{label:48s} min {min(runs):7.2f} us  median {statistics.median(runs):7.2f} us", flush=True)

shape = (1, 2, 64, 64)
q, k, v = (torch.randn(shape, device="cuda", dtype=torch.float16) for _ in range(3))
qc, kc, vc = (cupy.asarray(x) for x in (q, k, v))
# torch.cuda and cupy share the legacy default stream here
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    t("torch SDPA cuDNN", lambda: F.scaled_dot_product_attention(q, k, v))
t("stridedfa.torch.attention", lambda: st.attention(q, k, v))
t("stridedfa.cupy.attention", lambda: sc.attention(qc, kc, vc))
t("stridedfa.attention (dispatch, cupy)", lambda: stridedfa.attention(qc, kc, vc))
t("_core._cupy_forward direct", lambda: _core._cupy_forward(qc, kc, vc, None, False, "top_left", False, None, None, sc._HOOKS, None, None, None, None, None))
t("sc._call(None, 0)", lambda: sc._call(None, 0))
t("_can_read(cupy) x1", lambda: _core._can_read(qc))
t("_can_read(torch) x1", lambda: _core._can_read(q))
t("cupy.cuda.alloc(16384)", lambda: cupy.cuda.alloc(16384))
m = cupy.cuda.alloc(16384)
t("cupy.ndarray(shape, f16, memptr, strides)", lambda: cupy.ndarray(shape, cupy.float16, m, (16384, 8192, 128, 2)))
t("cupy.empty(shape, f16)", lambda: cupy.empty(shape, cupy.float16))
t("torch.empty(shape) cuda", lambda: torch.empty(shape, device="cuda", dtype=torch.float16))
t("cupy.cuda.get_current_stream().ptr", lambda: cupy.cuda.get_current_stream().ptr)
t("cupy.cuda.runtime.getDevice()", lambda: cupy.cuda.runtime.getDevice())
t("qc.data.mem", lambda: qc.data.mem)
t("qc.dtype", lambda: qc.dtype)
t("qc.shape + qc.strides", lambda: (qc.shape, qc.strides))
d = {qc.dtype: 1}
t("dict[numpy dtype]", lambda: d.get(qc.dtype))
t("qc.__dlpack__()", lambda: qc.__dlpack__())
t("torch.from_dlpack(qc) x1", lambda: torch.from_dlpack(qc))
