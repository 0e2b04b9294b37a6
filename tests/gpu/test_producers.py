"""Other DLPack producers through sdpa_forward: CuPy and JAX arrays.

Each call must give the same bits as the same call with torch tensors holding identical
values in identical layouts. JAX arrays are immutable, so they are only ever inputs.
"""

import numpy as np
import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import stridedfa  # noqa: E402
from helpers.cases import DEVICE, check_forward  # noqa: E402
from helpers.checks import assert_bitexact, assert_no_nan  # noqa: E402
from helpers.layouts import poisoned_lse  # noqa: E402

pytestmark = pytest.mark.gpu

B, H, S, D = 2, 4, 256, 64
OPTS = dict(causal=True)


def _torch_forward(q, k, v, out_layout_bshd: bool):
    """The torch baseline: out (bshd view or contiguous) and lse, synchronized."""
    b, h, s, _ = q.shape
    shape = (b, s, h, v.shape[-1]) if out_layout_bshd else (b, h, s, v.shape[-1])
    out = torch.full(shape, float("nan"), dtype=q.dtype, device=DEVICE)
    out = out.transpose(1, 2) if out_layout_bshd else out
    lse = poisoned_lse(b, h, s, DEVICE)
    stridedfa.sdpa_forward(q, k, v, out, lse=lse, **OPTS)
    torch.cuda.synchronize()
    return out, lse


@pytest.mark.parametrize("out_producer", ["cupy", "torch"])
def test_cupy_bshd_views_match_torch(cupy, out_producer, seed):
    """CuPy inputs as bshd transposed views; output a CuPy (or torch) bshd view. CuPy has no
    bfloat16, so float16."""
    cp = cupy
    rng = np.random.default_rng(seed)
    host = [rng.standard_normal((B, S, H, D), dtype=np.float32).astype(np.float16)
            for _ in range(3)]  # physical (b, s, h, d)
    q, k, v = (cp.asarray(x).transpose(0, 2, 1, 3) for x in host)
    tq, tk, tv = (torch.from_numpy(x).cuda().transpose(1, 2) for x in host)
    assert q.strides == tuple(2 * s for s in tq.stride()), "cupy and torch views differ"

    if out_producer == "cupy":
        out = cp.full((B, S, H, D), np.nan, dtype=cp.float16).transpose(0, 2, 1, 3)
        lse = cp.full((B, H, S), np.nan, dtype=cp.float32)
    else:
        out = torch.full((B, S, H, D), float("nan"), dtype=torch.float16, device=DEVICE)
        out = out.transpose(1, 2)
        lse = poisoned_lse(B, H, S, DEVICE)
    cp.cuda.runtime.deviceSynchronize()  # the copies into q, k, v are done
    stridedfa.sdpa_forward(q, k, v, out, lse=lse, **OPTS)
    torch.cuda.synchronize()  # whole device: the legacy default stream and torch's

    want_out, want_lse = _torch_forward(tq, tk, tv, out_layout_bshd=True)
    got_out = torch.from_numpy(cp.asnumpy(out)).cuda() if out_producer == "cupy" else out
    got_lse = torch.from_numpy(cp.asnumpy(lse)).cuda() if out_producer == "cupy" else lse
    assert_no_nan(got_out, "out")
    assert_bitexact(got_out, want_out, "out (cupy vs torch inputs)")
    assert_bitexact(got_lse, want_lse, "lse (cupy vs torch inputs)")
    check_forward(want_out, want_lse, tq, tk, tv, torch.float16, OPTS)


def _jax_to_torch(jnp, array, dtype):
    """A torch copy of a JAX array's exact values (through float32, which holds them all)."""
    return torch.from_numpy(np.array(array.astype(jnp.float32))).cuda().to(dtype)


@pytest.mark.parametrize("dtype,out_producer", [("float16", "torch"), ("bfloat16", "torch"),
                                                ("float16", "cupy")])
def test_jax_readonly_inputs_match_torch(jax_gpu, dtype, out_producer, seed, request):
    jax, gpu = jax_gpu
    jnp = jax.numpy
    rng = np.random.default_rng(seed)
    host = [rng.standard_normal((B, H, S, D), dtype=np.float32) for _ in range(3)]
    arrays = [jax.device_put(x, gpu).astype(getattr(jnp, dtype)) for x in host]
    for a in arrays:
        a.block_until_ready()  # JAX work must be finished before stridedfa reads the memory
    # torch copies of exactly the JAX values (float32 holds every fp16/bf16 value)
    tq, tk, tv = (_jax_to_torch(jnp, a, getattr(torch, dtype)) for a in arrays)
    before = [t.clone() for t in (tq, tk, tv)]

    if out_producer == "cupy":
        cp = request.getfixturevalue("cupy")
        out = cp.full((B, H, S, D), np.nan, dtype=cp.float16)
        lse = cp.full((B, H, S), np.nan, dtype=cp.float32)
    else:
        out = torch.full((B, H, S, D), float("nan"), dtype=tq.dtype, device=DEVICE)
        lse = poisoned_lse(B, H, S, DEVICE)
    stridedfa.sdpa_forward(*arrays, out, lse=lse, **OPTS)
    torch.cuda.synchronize()
    if out_producer == "cupy":
        out = torch.from_numpy(cp.asnumpy(out)).cuda()
        lse = torch.from_numpy(cp.asnumpy(lse)).cuda()

    want_out, want_lse = _torch_forward(tq, tk, tv, out_layout_bshd=False)
    assert_no_nan(out, "out")
    assert_bitexact(out, want_out, f"out (jax {dtype} vs torch inputs)")
    assert_bitexact(lse, want_lse, f"lse (jax {dtype} vs torch inputs)")
    # the JAX inputs were not written
    for name, a, t in zip("qkv", arrays, before):
        assert_bitexact(_jax_to_torch(jnp, a, t.dtype), t, f"jax input {name} after the call")


def test_jax_array_as_output_is_refused(jax_gpu, seed):
    """JAX arrays are immutable: passing one as ``out`` is a LayoutError and it stays unwritten."""
    jax, gpu = jax_gpu
    jnp = jax.numpy
    q, k, v = (torch.randn(B, H, S, D, device=DEVICE, dtype=torch.float16) for _ in range(3))
    out = jax.device_put(jnp.full((B, H, S, D), jnp.nan, dtype=jnp.float16), gpu)
    out.block_until_ready()
    torch.cuda.synchronize()
    with pytest.raises(stridedfa.LayoutError):
        stridedfa.sdpa_forward(q, k, v, out)
    torch.cuda.synchronize()
    assert bool(jnp.isnan(out).all()), "the JAX output array was written"
