"""Context parallel attention on GPUs (NCCL): the sharded computation, gathered, against one
stridedfa call on the whole sequence and the fp32 reference -- world size 1 on one GPU, and every
world size up to the GPUs present."""

import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import torch.multiprocessing as mp  # noqa: E402

import stridedfa.torch  # noqa: E402
from helpers import ring_gpu_worker  # noqa: E402
from helpers.cases import check_forward, check_grads  # noqa: E402

pytestmark = pytest.mark.gpu

WORLDS = [w for w in (1, 2, 4, 8) if w <= torch.cuda.device_count()]


@pytest.mark.parametrize("world", WORLDS)
def test_gathered_results_equal_one_call_on_the_whole_sequence(tmp_path, world):
    mp.spawn(ring_gpu_worker.run, args=(world, str(tmp_path / "store"), str(tmp_path)), nprocs=world, join=True)
    results = torch.load(tmp_path / f"world{world}.pt")
    for case, (out, lse, dq, dk, dv) in zip(ring_gpu_worker.CASES, results):
        seqlens = ring_gpu_worker.lengths(case, "cuda")
        options = {"causal": case[0], "window": case[7], "seqlens_q": seqlens, "seqlens_kv": seqlens}
        q, k, v, dout = ring_gpu_worker.problem(case, "cuda")
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        want, want_lse = stridedfa.torch.attention(*leaves, **options, return_lse=True)
        want.backward(dout)
        # against the fp32 reference, with bf16 tolerances (the merge adds one bf16 rounding); lse
        # apart, as padded rows hold -inf
        check_forward(out.cuda(), None, q, k, v, torch.bfloat16, options)
        check_grads((dq.cuda(), dk.cuda(), dv.cuda()), q, k, v, dout, torch.bfloat16, options)
        # and the statistics of the single call: -inf on the same rows, else equal to float32 rounding
        got = lse[..., 0].cuda()
        assert torch.equal(torch.isinf(got), torch.isinf(want_lse)), (case, world)
        finite = torch.isfinite(want_lse)
        assert torch.allclose(got[finite], want_lse[finite], atol=1e-4, rtol=0), (case, world)
