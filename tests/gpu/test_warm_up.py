"""stridedfa.warm_up on the GPU: after it, the calls it described build nothing."""

import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import stridedfa  # noqa: E402
import stridedfa.torch  # noqa: E402

pytestmark = pytest.mark.gpu


def _builds() -> int:
    return stridedfa.cache_info()["builds"]


def _bshd(b, s, h, d, requires_grad=False):
    x = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    return x.requires_grad_() if requires_grad else x


def test_a_warmed_up_training_step_builds_nothing():
    b, s, h_q, h_kv, d = 2, 352, 8, 2, 64  # a shape no other test uses
    report = stridedfa.warm_up([dict(q=(b, s, h_q, d), k=(b, s, h_kv, d), causal=True, window=(100, 0))])
    assert report["configurations"] == 1 and report["graphs"] == 2, report
    before = _builds()
    q, k, v = _bshd(b, s, h_q, d, True), _bshd(b, s, h_kv, d, True), _bshd(b, s, h_kv, d, True)
    out = stridedfa.torch.attention(q, k, v, causal=True, window=(100, 0))
    out.backward(torch.randn_like(out))  # a gradient in out's (bshd) memory order, as a model's would be
    torch.cuda.synchronize()
    assert _builds() == before, "the warmed-up step built a graph"
    assert torch.isfinite(q.grad).all()


def test_a_warmed_up_decoding_call_builds_nothing():
    b, cache, h_q, h_kv, d = 3, 1184, 8, 2, 128
    stridedfa.warm_up([dict(q=(b, 1, h_q, d), k=(b, cache, h_kv, d), causal=True, causal_alignment="bottom_right",
                            backward=False)])
    before = _builds()
    with torch.no_grad():
        stridedfa.torch.attention(_bshd(b, 1, h_q, d), _bshd(b, cache, h_kv, d), _bshd(b, cache, h_kv, d),
                                  causal=True, causal_alignment="bottom_right")
    torch.cuda.synchronize()
    assert _builds() == before


def test_every_bucket_of_a_varlen_run_warmed_up_builds_nothing():
    tokens, h_q, h_kv, d, most = 2000, 8, 2, 64, 24
    stridedfa.warm_up([dict(q=(tokens, h_q, d), k=(tokens, h_kv, d), layout="thd", sequences=n, causal=True)
                       for n in stridedfa.length_buckets(most)])
    before = _builds()
    generator = torch.Generator().manual_seed(3)
    for _ in range(20):  # documents of random lengths, `tokens` a batch
        n = int(torch.randint(1, most + 1, (1,), generator=generator))
        cuts = torch.randperm(tokens - 1, generator=generator)[: n - 1].sort().values + 1
        cu = torch.cat([torch.tensor([0]), cuts, torch.tensor([tokens])]).to(torch.int32).cuda()
        q = torch.randn(tokens, h_q, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(tokens, h_kv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in "kv")
        out = stridedfa.torch.varlen_attention(q, k, v, cu, cu, causal=True)
        out.backward(torch.randn_like(out))
    torch.cuda.synchronize()
    assert _builds() == before, "a varlen step met a bucket the warm-up did not prepare"
