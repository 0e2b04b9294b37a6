"""Streams: with torch inputs and stream=None the work runs on torch's current stream; an
explicit stream (torch.cuda.Stream or its int handle) is used as given.

The inputs are written on the side stream only after a long GPU sleep, so a launch on any
other stream would read the NaN poison still in them instead of the data.
"""

import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

from helpers.cases import Case, backward, build, check_fully_written, forward, run_case  # noqa: E402
from helpers.checks import assert_bitexact, assert_close_to_scale  # noqa: E402

pytestmark = pytest.mark.gpu

CASE = Case("bshd", "fp16", b=2, h_q=4, h_kv=4, s_q=256, s_kv=256, causal=True,
            out_layout="bshd", grad_layout="bshd")
SLEEP_CYCLES = 200_000_000  # ~0.1 s at 2 GHz; far longer than a launch takes


def _stream_kwargs(how, stream):
    if how == "current_stream":
        return {}
    return {"stream": stream if how == "stream_object" else stream.cuda_stream}


@pytest.mark.parametrize("how", ["current_stream", "stream_object", "stream_handle"])
def test_side_stream_matches_default_stream(how, seed):
    baseline = run_case(CASE, seed)  # default stream; also warms the graph cache

    poisoned_inputs = [torch.full_like(t, float("nan")) for t in baseline.inputs]
    run = build(CASE, seed, inputs=poisoned_inputs)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(SLEEP_CYCLES)
        for dst, src in zip(run.inputs, baseline.inputs):
            dst.copy_(src)
    kwargs = _stream_kwargs(how, side)
    if how == "current_stream":
        with torch.cuda.stream(side):
            forward(run, CASE.options)
            backward(run, CASE.options)
    else:  # the current stream is the default one; the argument must win
        forward(run, CASE.options, **kwargs)
        backward(run, CASE.options, **kwargs)
    torch.cuda.synchronize()

    check_fully_written(run)
    assert_bitexact(run.out, baseline.out, f"out ({how})")
    assert_bitexact(run.lse, baseline.lse, f"lse ({how})")
    for name, got, want in (("grad_q", run.dq, baseline.dq), ("grad_k", run.dk, baseline.dk),
                            ("grad_v", run.dv, baseline.dv)):
        assert_close_to_scale(got, want, rel=1e-3, name=f"{name} ({how})")

