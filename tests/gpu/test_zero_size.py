"""Zero-size problems return without error and launch nothing (no graph is looked up)."""

import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import stridedfa  # noqa: E402
import stridedfa.torch  # noqa: E402,F401
from helpers.cases import DEVICE, Case, backward, build, cache_counters, forward  # noqa: E402

pytestmark = pytest.mark.gpu

@pytest.mark.parametrize("case,backward_too", [
    pytest.param(Case("bshd", "bf16", b=0, out_layout="bshd", grad_layout="bshd"), True,
                 id="b0-fwd-bwd"),
    pytest.param(Case("bs3hd", "fp16", b=0, grad_layout="bs3hd"), True, id="b0-packed-fwd-bwd"),
    pytest.param(Case("bhsd", "bf16", s_q=0, s_kv=128), False, id="sq0-fwd"),
])
def test_zero_size_is_a_noop(case, backward_too, seed):
    run = build(case, seed)
    before = cache_counters()
    forward(run, case.options)
    if backward_too:
        backward(run, case.options)
    torch.cuda.synchronize()
    assert cache_counters() == before, "a zero-size call looked up or built a graph"
    assert run.out.numel() == 0 and run.lse.numel() == 0


def test_torch_attention_zero_batch(seed):
    q = torch.randn(0, 4, 128, 64, device=DEVICE, dtype=torch.float16, requires_grad=True)
    k = torch.randn(0, 2, 96, 64, device=DEVICE, dtype=torch.float16, requires_grad=True)
    v = torch.randn(0, 2, 96, 32, device=DEVICE, dtype=torch.float16, requires_grad=True)
    out = stridedfa.torch.attention(q, k, v, causal=True)
    assert out.shape == (0, 4, 128, 32) and out.dtype == torch.float16
    out.sum().backward()
    for name, t in (("q", q), ("k", k), ("v", v)):
        assert t.grad is not None and t.grad.shape == t.shape, f"grad of {name}: {t.grad}"
