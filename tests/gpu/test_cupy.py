"""stridedfa.cupy: values against the NumPy reference, layouts and pool of what it allocates, the
stream it runs on, and sdpa_forward / sdpa_backward with CuPy arrays in every slot.

CuPy has no bfloat16 here, so everything is float16. Streams are created non-blocking, so nothing
orders them against the legacy default stream except what stridedfa itself does.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.cuda import require_cuda

torch = require_cuda()  # the GPU tests' common skip; also used for a GPU sleep on CuPy streams

import stridedfa  # noqa: E402
from stridedfa import _layouts, reference  # noqa: E402

pytestmark = pytest.mark.gpu

OUT_ATOL, OUT_RTOL, LSE_ATOL, GRAD_REL = 5e-3, 5e-3, 2e-3, 1e-2  # float16, as helpers.checks
SLEEP_CYCLES = 200_000_000  # ~0.1 s: far longer than a launch takes


# --- Helpers ------------------------------------------------------------------------------------

def _host(rng, shape):
    """Fresh float16 values (never zeros), as a float32 host copy of exactly those values."""
    return rng.standard_normal(shape, dtype=np.float32).astype(np.float16).astype(np.float32)


def _inputs(cp, rng, layout, b, h_q, h_kv, s_q, s_kv, d):
    """q, k, v as CuPy (b, h, s, d) views in `layout` ("bhsd", "bshd" or "packed": views into one
    (b, s, 3, h, d) buffer), and their float32 host values in logical order."""
    if layout == "packed":
        assert h_q == h_kv and s_q == s_kv
        qkv = cp.asarray(_host(rng, (b, s_q, 3, h_q, d)).astype(np.float16))
        views = [qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3)]
    else:
        shapes = [(b, h_q, s_q, d), (b, h_kv, s_kv, d), (b, h_kv, s_kv, d)]
        views = []
        for shape in shapes:
            if layout == "bhsd":
                views.append(cp.asarray(_host(rng, shape).astype(np.float16)))
            else:
                physical = (shape[0], shape[2], shape[1], shape[3])
                views.append(cp.asarray(_host(rng, physical).astype(np.float16)).transpose(0, 2, 1, 3))
    hosts = [cp.asnumpy(x).astype(np.float32) for x in views]
    return views, hosts


def _elements(x):
    return tuple(s // x.itemsize for s in x.strides)


def _check_close(got, want, atol, rtol, name):
    got = np.asarray(got, dtype=np.float32)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    assert not np.isnan(got).any(), f"{name}: {int(np.isnan(got).sum())} NaN elements"
    err = np.abs(got - want)
    bad = err > atol + rtol * np.abs(want)
    assert not bad.any(), (f"{name}: max abs err {err.max():.3e}, {int(bad.sum())} of {got.size} "
                           f"out of tolerance")


def _check_grad(got, want, name):
    got = np.asarray(got, dtype=np.float32)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    assert not np.isnan(got).any(), f"{name}: NaN elements"
    err, scale = np.abs(got - want).max(), np.abs(want).max()
    assert err <= GRAD_REL * scale, f"{name}: max abs err {err:.3e} > {GRAD_REL} * {scale:.3e}"


def _sleep_on(cp_stream):
    """Keeps `cp_stream` busy for a while (a GPU sleep queued through torch on the same stream)."""
    with torch.cuda.stream(torch.cuda.ExternalStream(cp_stream.ptr)):
        torch.cuda._sleep(SLEEP_CYCLES)


CASES = {  # name: (layout, b, h_q, h_kv, s_q, s_kv, d, options)
    "bhsd": ("bhsd", 2, 4, 4, 128, 128, 64, {}),
    "bshd_causal": ("bshd", 2, 4, 4, 256, 256, 64, {"causal": True}),
    "packed_causal": ("packed", 2, 4, 4, 128, 128, 64, {"causal": True}),
    "gqa_bshd": ("bshd", 1, 8, 2, 128, 256, 128, {"scale": 0.1}),
    "mqa_bottom_right": ("bhsd", 2, 2, 1, 128, 256, 64, {"causal": True,
                                                         "causal_alignment": "bottom_right"}),
}


# --- Values and layouts ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CASES))
def test_attention_forward_backward_match_reference(cupy, name, seed):
    cp = cupy
    layout, b, h_q, h_kv, s_q, s_kv, d, options = CASES[name]
    rng = np.random.default_rng(seed)
    (q, k, v), (hq, hk, hv) = _inputs(cp, rng, layout, b, h_q, h_kv, s_q, s_kv, d)

    out, lse = stridedfa.cupy.attention(q, k, v, return_lse=True, **options)
    assert isinstance(out, cp.ndarray) and isinstance(lse, cp.ndarray)
    assert out.shape == (b, h_q, s_q, d) and out.dtype == cp.float16
    assert lse.shape == (b, h_q, s_q) and lse.dtype == cp.float32
    assert _elements(out) == _layouts.output_strides(out.shape, _elements(q))
    assert _elements(lse) == (h_q * s_q, s_q, 1)

    want_out, want_lse = reference.sdpa_forward(hq, hk, hv, **options)
    _check_close(cp.asnumpy(out), want_out, OUT_ATOL, OUT_RTOL, "out")
    _check_close(cp.asnumpy(lse), want_lse, LSE_ATOL, 0.0, "lse")

    grad_out_host = _host(rng, out.shape)
    grad_out = cp.asarray(grad_out_host.astype(np.float16))
    grads = stridedfa.cupy.attention_backward(q, k, v, out, lse, grad_out, **options)
    want = reference.sdpa_backward(hq, hk, hv, grad_out_host, **options)
    for grad_name, grad, x, ref in zip(("grad_q", "grad_k", "grad_v"), grads, (q, k, v), want):
        assert isinstance(grad, cp.ndarray) and grad.shape == x.shape and grad.dtype == x.dtype
        assert _elements(grad) == _layouts.gradient_strides(x.shape, _elements(x)), grad_name
        _check_grad(cp.asnumpy(grad), ref, grad_name)

    plain = stridedfa.cupy.attention(q, k, v, **options)  # without lse (another graph)
    _check_close(cp.asnumpy(plain), want_out, OUT_ATOL, OUT_RTOL, "out without lse")


def test_broadcast_grad_out_is_read_through_a_copy(cupy, seed):
    """out.sum()'s gradient is a broadcast (stride 0) array, which cuDNN cannot read."""
    cp = cupy
    rng = np.random.default_rng(seed)
    (q, k, v), (hq, hk, hv) = _inputs(cp, rng, "bhsd", 1, 2, 2, 64, 64, 64)
    out, lse = stridedfa.cupy.attention(q, k, v, return_lse=True)
    grad_out = cp.broadcast_to(cp.ones((), dtype=cp.float16), out.shape)
    grads = stridedfa.cupy.attention_backward(q, k, v, out, lse, grad_out)
    want = reference.sdpa_backward(hq, hk, hv, np.ones(out.shape, np.float32))
    for grad_name, grad, ref in zip(("grad_q", "grad_k", "grad_v"), grads, want):
        _check_grad(cp.asnumpy(grad), ref, grad_name)


# --- Memory: CuPy's pool, and every allocated element written --------------------------------------

def test_outputs_come_from_cupys_pool_and_are_fully_written(cupy, seed):
    """Blocks of the outputs' exact sizes are filled with NaN and handed back to the pool first;
    the call's allocations must reuse exactly them, so any element it left unwritten shows."""
    cp = cupy
    rng = np.random.default_rng(seed)
    (q, k, v), (hq, hk, hv) = _inputs(cp, rng, "bshd", 2, 4, 4, 256, 256, 64)
    stridedfa.cupy.attention(q, k, v, return_lse=True)  # builds the graph; warms the pool
    cp.cuda.get_current_stream().synchronize()
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()  # from here the only free blocks are the poisoned ones

    poison_out = cp.full(q.shape, np.nan, dtype=cp.float16)
    poison_lse = cp.full(q.shape[:3], np.nan, dtype=cp.float32)
    addresses = (poison_out.data.ptr, poison_lse.data.ptr)
    del poison_out, poison_lse
    used_before = pool.used_bytes()

    out, lse = stridedfa.cupy.attention(q, k, v, return_lse=True)
    assert (out.data.ptr, lse.data.ptr) == addresses, "the outputs did not come from CuPy's pool"
    assert pool.used_bytes() >= used_before + out.nbytes + lse.nbytes
    want_out, want_lse = reference.sdpa_forward(hq, hk, hv)
    _check_close(cp.asnumpy(out), want_out, OUT_ATOL, OUT_RTOL, "out")
    _check_close(cp.asnumpy(lse), want_lse, LSE_ATOL, 0.0, "lse")

    grad_out_host = _host(rng, out.shape)
    grad_out = cp.asarray(grad_out_host.astype(np.float16))
    cp.cuda.get_current_stream().synchronize()
    pool.free_all_blocks()
    poisoned = [cp.full(x.shape, np.nan, dtype=cp.float16) for x in (q, k, v)]
    addresses = {p.data.ptr for p in poisoned}
    del poisoned
    grads = stridedfa.cupy.attention_backward(q, k, v, out, lse, grad_out)
    assert {g.data.ptr for g in grads} == addresses, "the gradients did not come from CuPy's pool"
    want = reference.sdpa_backward(hq, hk, hv, grad_out_host)
    for grad_name, grad, ref in zip(("grad_q", "grad_k", "grad_v"), grads, want):
        _check_grad(cp.asnumpy(grad), ref, grad_name)


def test_workspace_comes_from_a_user_installed_allocator(cupy, seed):
    """Every allocation goes through cupy.cuda.alloc, so an allocator set with
    cupy.cuda.set_allocator sees outputs and workspace (when cuDNN asks for one)."""
    cp = cupy
    rng = np.random.default_rng(seed)
    (q, k, v), _ = _inputs(cp, rng, "bhsd", 2, 4, 4, 128, 128, 64)
    pool = cp.get_default_memory_pool()
    sizes = []

    def counting(nbytes):
        sizes.append(nbytes)
        return pool.malloc(nbytes)

    previous = cp.cuda.get_allocator()
    cp.cuda.set_allocator(counting)
    try:
        out, lse = stridedfa.cupy.attention(q, k, v, return_lse=True)
    finally:
        cp.cuda.set_allocator(previous)
    assert sizes[:2] == [out.nbytes, lse.nbytes]


# --- Streams ------------------------------------------------------------------------------------

def _poisoned_inputs_written_late(cp, stream, sources):
    """NaN copies of `sources`, overwritten with their values on `stream` after a GPU sleep: work
    on any stream not ordered after `stream` reads NaN."""
    targets = [cp.full(s.shape, np.nan, dtype=s.dtype) for s in sources]
    cp.cuda.Device().synchronize()
    with stream:
        _sleep_on(stream)
        for dst, src in zip(targets, sources):
            dst[...] = src
    return targets


def _busy_legacy_stream():
    """A long GPU sleep on the legacy default stream: work wrongly queued there finishes late."""
    with torch.cuda.stream(torch.cuda.default_stream()):
        torch.cuda._sleep(2 * SLEEP_CYCLES)


def _read_now(cp, *arrays):
    """Host copies made on a fresh non-blocking stream, ordered after nothing: they show what is
    in memory at this moment (call it after synchronising the stream the work should be on)."""
    reader = cp.cuda.Stream(non_blocking=True)
    with reader:
        copies = [cp.asnumpy(a, stream=reader) for a in arrays]
    reader.synchronize()
    return copies


@pytest.mark.parametrize("how", ["current_stream", "stream_object", "stream_handle",
                                 "cuda_stream_protocol"])
def test_runs_on_cupys_current_stream_or_the_given_one(cupy, how, seed):
    cp = cupy
    rng = np.random.default_rng(seed)
    # bhsd, as the poisoned copies below: the same layouts give the same graphs and bits
    (q, k, v), _ = _inputs(cp, rng, "bhsd", 2, 4, 4, 256, 256, 64)
    want_out, want_lse = stridedfa.cupy.attention(q, k, v, causal=True, return_lse=True)
    want_grads = stridedfa.cupy.attention_backward(q, k, v, want_out, want_lse, want_out,
                                                   causal=True)
    cp.cuda.Device().synchronize()

    side = cp.cuda.Stream(non_blocking=True)
    inputs = _poisoned_inputs_written_late(cp, side, (q, k, v))
    _busy_legacy_stream()
    if how == "current_stream":
        with side:
            out, lse = stridedfa.cupy.attention(*inputs, causal=True, return_lse=True)
            grads = stridedfa.cupy.attention_backward(*inputs, out, lse, out, causal=True)
    else:
        class Wrapped:  # any object with __cuda_stream__
            def __cuda_stream__(self):
                return (0, side.ptr)

        stream = {"stream_object": side, "stream_handle": side.ptr,
                  "cuda_stream_protocol": Wrapped()}[how]
        # the current stream is the null stream; the argument must win
        out, lse = stridedfa.cupy.attention(*inputs, causal=True, return_lse=True, stream=stream)
        grads = stridedfa.cupy.attention_backward(*inputs, out, lse, out, causal=True,
                                                  stream=stream)
    side.synchronize()  # only the side stream: the results must be complete now
    got_out, got_lse, *got_grads = _read_now(cp, out, lse, *grads)
    assert np.array_equal(got_out, cp.asnumpy(want_out)), f"out ({how})"
    assert np.array_equal(got_lse, cp.asnumpy(want_lse)), f"lse ({how})"
    for name, got, want in zip(("grad_q", "grad_k", "grad_v"), got_grads, want_grads):
        want = cp.asnumpy(want).astype(np.float32)
        assert not np.isnan(got).any(), f"{name} ({how}) has NaN"
        err = np.abs(got.astype(np.float32) - want).max()
        assert err <= 1e-3 * np.abs(want).max(), f"{name} ({how}): max abs err {err:.3e}"


def test_two_streams_concurrently_match_single_stream_runs(cupy, seed):
    cp = cupy
    rng = np.random.default_rng(seed)
    problems = [_inputs(cp, rng, layout, 2, 4, 4, 256, 256, 64)[0] for layout in ("bshd", "packed")]
    baselines = [stridedfa.cupy.attention(*p, causal=True, return_lse=True) for p in problems]
    cp.cuda.Device().synchronize()

    streams = [cp.cuda.Stream(non_blocking=True) for _ in problems]
    results = []
    for _ in range(3):  # interleave the launches so the two streams overlap
        for stream, p in zip(streams, problems):
            with stream:
                results.append((stream, stridedfa.cupy.attention(*p, causal=True, return_lse=True)))
    for stream in streams:
        stream.synchronize()
    for i, (_stream, (out, lse)) in enumerate(results):
        want_out, want_lse = baselines[i % 2]
        assert cp.array_equal(out, want_out), f"out of launch {i}"
        assert cp.array_equal(lse, want_lse), f"lse of launch {i}"


def test_inputs_produced_on_another_stream_are_waited_for(cupy, seed):
    """Inputs written on stream A (CuPy's current); the call runs on stream B given explicitly.
    CuPy's __dlpack__(stream=B) makes B wait for A, so B reads the data and not the poison."""
    cp = cupy
    rng = np.random.default_rng(seed)
    (q, k, v), _ = _inputs(cp, rng, "bhsd", 2, 4, 4, 256, 256, 64)
    want = stridedfa.cupy.attention(q, k, v)
    cp.cuda.Device().synchronize()

    producer, consumer = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    inputs = _poisoned_inputs_written_late(cp, producer, (q, k, v))
    with producer:
        out = stridedfa.cupy.attention(*inputs, stream=consumer)
    consumer.synchronize()
    assert cp.array_equal(out, want)


# --- The core's entry points with CuPy arrays everywhere ---------------------------------------------

def test_sdpa_forward_backward_with_cupy_arrays_in_every_slot(cupy, seed):
    cp = cupy
    rng = np.random.default_rng(seed)
    (q, k, v), (hq, hk, hv) = _inputs(cp, rng, "packed", 2, 4, 4, 128, 128, 64)
    b, h, s, d = q.shape
    out_buffer = cp.full((b, s, h, d), np.nan, dtype=cp.float16)
    out = out_buffer.transpose(0, 2, 1, 3)  # a bshd view
    lse = cp.full((b, h, s), np.nan, dtype=cp.float32)
    stridedfa.sdpa_forward(q, k, v, out, lse=lse, causal=True)
    want_out, want_lse = reference.sdpa_forward(hq, hk, hv, causal=True)
    _check_close(cp.asnumpy(out), want_out, OUT_ATOL, OUT_RTOL, "out")
    _check_close(cp.asnumpy(lse), want_lse, LSE_ATOL, 0.0, "lse")

    grad_out_host = _host(rng, (b, h, s, d))
    grad_out = cp.asarray(grad_out_host.transpose(0, 2, 1, 3).astype(np.float16)).transpose(0, 2, 1, 3)
    grad_qkv = cp.full((b, s, 3, h, d), np.nan, dtype=cp.float16)  # one packed gradient buffer
    grad_q, grad_k, grad_v = (grad_qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    stridedfa.sdpa_backward(q, k, v, out, grad_out, lse, grad_q, grad_k, grad_v, causal=True)
    want = reference.sdpa_backward(hq, hk, hv, grad_out_host, causal=True)
    assert not cp.isnan(grad_qkv).any(), "the packed gradient buffer was not fully written"
    for grad_name, grad, ref in zip(("grad_q", "grad_k", "grad_v"), (grad_q, grad_k, grad_v), want):
        _check_grad(cp.asnumpy(grad), ref, grad_name)


def test_stridedfa_attention_dispatches_cupy_arrays(cupy, seed):
    cp = cupy
    rng = np.random.default_rng(seed)
    (q, k, v), _ = _inputs(cp, rng, "bshd", 1, 2, 2, 64, 64, 64)
    out, lse = stridedfa.attention(q, k, v, causal=True, return_lse=True)
    assert isinstance(out, cp.ndarray) and isinstance(lse, cp.ndarray)
    want, want_lse = stridedfa.cupy.attention(q, k, v, causal=True, return_lse=True)
    assert cp.array_equal(out, want) and cp.array_equal(lse, want_lse)


def test_sdpa_forward_with_cupy_arrays_runs_on_cupys_current_stream(cupy, seed):
    """No stream argument: a CuPy q puts the call on CuPy's current stream. The legacy default
    stream is kept busy meanwhile, so results read right after syncing only the CuPy stream are
    NaN poison if the call ran there."""
    cp = cupy
    rng = np.random.default_rng(seed)
    (q, k, v), (hq, hk, hv) = _inputs(cp, rng, "bhsd", 2, 4, 4, 256, 256, 64)
    # build the graph first: nothing during the timed part may synchronise the device
    stridedfa.sdpa_forward(q, k, v, cp.empty_like(q), lse=cp.empty(q.shape[:3], cp.float32),
                           causal=True)
    side = cp.cuda.Stream(non_blocking=True)
    inputs = _poisoned_inputs_written_late(cp, side, (q, k, v))
    _busy_legacy_stream()  # the stream the call ran on before CuPy's current stream was used
    with side:
        out = cp.full(q.shape, np.nan, dtype=cp.float16)
        lse = cp.full(q.shape[:3], np.nan, dtype=cp.float32)
        stridedfa.sdpa_forward(*inputs, out, lse=lse, causal=True)
    side.synchronize()
    got_out, got_lse = _read_now(cp, out, lse)
    want_out, want_lse = reference.sdpa_forward(hq, hk, hv, causal=True)
    _check_close(got_out, want_out, OUT_ATOL, OUT_RTOL, "out")
    _check_close(got_lse, want_lse, LSE_ATOL, 0.0, "lse")
