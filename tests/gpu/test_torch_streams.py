"""Streams through the torch adapter: work runs on torch's current stream (read through the DLPack
exchange API, not torch.cuda.current_stream()); two non-default streams at once, and a stream
other than the one that produced the inputs, give the single-stream results."""

import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import stridedfa.torch as sfa_torch  # noqa: E402
from helpers.checks import bitexact_mismatch  # noqa: E402

pytestmark = pytest.mark.gpu

SLEEP_CYCLES = 100_000_000  # tens of ms: a launch on the wrong stream would overtake it


def _packed(seed, n=2):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(2, 256, 3, 4, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(n)]


def _run(packed):
    """Forward through both entry points and a backward; returns everything it produced."""
    q, k, v = (packed[:, :, i].transpose(1, 2) for i in range(3))
    out = sfa_torch.attention(q, k, v, causal=True)
    leaf = packed.detach().requires_grad_()
    out_p = sfa_torch.packed_attention(leaf, 2, causal=True)
    (grad,) = torch.autograd.grad(out_p, leaf, torch.ones_like(out_p))
    return {"out": out, "out_packed": out_p.detach(), "grad_packed": grad}


def _assert_same(got, want, what):
    failures = [f"{k}: {m}" for k in want if (m := bitexact_mismatch(got[k], want[k]))]
    assert not failures, f"{what}: " + "; ".join(failures)


def test_two_streams_concurrently_match_single_stream(seed):
    inputs = _packed(seed)
    want = [_run(p) for p in inputs]
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream() for _ in inputs]
    got = [None, None]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    for i, (s, p) in enumerate(zip(streams, inputs)):
        with torch.cuda.stream(s):
            torch.cuda._sleep(SLEEP_CYCLES // 4)
            got[i] = _run(p)
    for s in streams:
        torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    for i in range(2):
        _assert_same(got[i], want[i], f"stream {i}")


def test_inputs_produced_on_another_stream(seed):
    (source,) = _packed(seed, 1)
    want = _run(source)
    torch.cuda.synchronize()
    producer, consumer = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(producer):
        torch.cuda._sleep(SLEEP_CYCLES)  # the copy lands late: reading early would see NaN
        packed = torch.full_like(source, float("nan"))
        packed.copy_(source)
    consumer.wait_stream(producer)  # the caller orders the streams, as torch requires
    with torch.cuda.stream(consumer):
        got = _run(packed)
    torch.cuda.current_stream().wait_stream(consumer)
    torch.cuda.synchronize()
    _assert_same(got, want, "consumer stream")


def test_work_is_queued_on_the_current_stream(seed):
    """The current stream is held back by a GPU sleep: a snapshot of out taken on the default stream
    meanwhile still shows the NaN poison of the reused block, so the kernel was queued behind the
    sleep on the current stream, not on the default one."""
    (packed,) = _packed(seed, 1)
    q, k, v = (packed[:, :, i].transpose(1, 2) for i in range(3))
    want = sfa_torch.attention(q, k, v, causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        poison = torch.full((want.numel(),), float("nan"), device="cuda", dtype=want.dtype)
        address = poison.data_ptr()
        del poison  # back to the side stream's pool, still NaN
        torch.cuda._sleep(SLEEP_CYCLES)
        out = sfa_torch.attention(q, k, v, causal=True)
        done = torch.cuda.Event()
        done.record()
    snapshot = out.clone()  # on the default stream, not ordered after the side stream
    torch.cuda.current_stream().synchronize()
    assert not done.query(), "the side stream finished its sleep before the snapshot (sleep too short)"
    assert out.data_ptr() == address, "the poisoned block was not reused"
    assert torch.isnan(snapshot).all(), "out was written before the current stream reached the kernel"
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert torch.equal(out, want)
