"""Context parallel attention on CPUs: several gloo processes, each holding a shard of the
sequence, with the NumPy reference standing in for the kernel (ring_worker.use_reference_kernels);
the gathered output, lse and every gradient equal the full-sequence reference (float64: to
rounding). The GPU tests run the same code on cuDNN (tests/gpu/test_context_parallel.py)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

import torch.multiprocessing as mp  # noqa: E402

from helpers import ring_worker  # noqa: E402
from stridedfa import reference  # noqa: E402


def _reference(case, world):
    make = ring_worker.packed_problem if case is ring_worker.PACKED else lambda w: ring_worker.problem(case, w)
    q, k, v, dout = (t.numpy() for t in make(world))
    options = {"causal": case[0], "window": case[6], "dtype": np.float64}
    if len(case) > 7:
        options.update(zip(("seqlens_q", "seqlens_kv"), (None if t is None else t.numpy()
                                                          for t in ring_worker.lengths(case, world))))
    out, lse = reference.sdpa_forward(q, k, v, **options)
    grads = reference.sdpa_backward(q, k, v, dout, **options)
    return out, lse, grads


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_gathered_results_equal_the_full_sequence(tmp_path, world):
    mp.spawn(ring_worker.run, args=(world, str(tmp_path / "store"), str(tmp_path)), nprocs=world, join=True)
    results = torch.load(tmp_path / f"world{world}.pt")
    if world == 2:  # torch.compile gives eager's numbers
        out_diff, grad_diff = results.pop()
        assert out_diff < 1e-12 and grad_diff < 1e-12, (out_diff, grad_diff)
    out, lse, grad_packed = results.pop()
    ref_out, ref_lse, ref_grads = _reference(ring_worker.PACKED, world)
    np.testing.assert_allclose(out.numpy(), ref_out, atol=1e-10)
    np.testing.assert_allclose(lse[..., 0].numpy(), ref_lse, atol=1e-10)
    np.testing.assert_allclose(grad_packed.numpy(), np.stack([g.transpose(0, 2, 1, 3) for g in ref_grads], 2),
                               atol=1e-10, err_msg="the packed projection's gradient")
    assert len(results) == len(ring_worker.CASES) + len(ring_worker.PADDED)
    for case, (out, lse, dq, dk, dv) in zip(ring_worker.CASES + ring_worker.PADDED, results):
        ref_out, ref_lse, (ref_dq, ref_dk, ref_dv) = _reference(case, world)
        for name, got, want in (("out", out, ref_out), ("lse", lse[..., 0], ref_lse), ("dq", dq, ref_dq),
                                ("dk", dk, ref_dk), ("dv", dv, ref_dv)):
            got = got.numpy()
            with np.errstate(invalid="ignore"):  # padded rows: lse -inf in both
                err = np.where(got == want, 0.0, np.abs(got - want)).max()
            assert err < 1e-10, f"world {world}, case {case}: {name} off by {err}"


def test_shards_are_the_load_balanced_chunks(tmp_path):
    """Rank r of W holds chunks r and 2W-1-r of 2W: checked through unshard's inverse on one rank."""
    from stridedfa.torch import shard_sequence

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        x = torch.arange(8.0).reshape(1, 1, 8, 1)
        assert shard_sequence(x).flatten().tolist() == list(range(8))  # W = 1: chunks 0 and 1
        with pytest.raises(stridedfa_layout_error(), match="2 equal chunks"):
            shard_sequence(torch.zeros(1, 1, 7, 1))
    finally:
        dist.destroy_process_group()


def stridedfa_layout_error():
    import stridedfa
    return stridedfa.LayoutError


def test_a_call_without_a_process_group_says_so():
    from stridedfa.torch import context_parallel_attention

    q = torch.zeros(1, 2, 8, 8, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="init_process_group"):
        context_parallel_attention(q, q, q)


def test_the_cudnn_block_calls_are_well_formed_operator_calls():
    """What a GPU rank calls per block, on meta tensors (the operators' fake kernels): a windowed,
    padded forward with statistics and a causal backward from given out and lse."""
    from stridedfa import _torch_context_parallel as ring

    q = torch.empty(2, 8, 64, 32, device="meta", dtype=torch.bfloat16)
    kv = torch.empty(2, 2, 48, 32, device="meta", dtype=torch.bfloat16)
    lengths = torch.empty(2, device="meta", dtype=torch.int32)
    out, lse = ring._cudnn_forward(q, kv, kv, False, (5, None), (lengths, lengths), 0.1)
    assert out.shape == q.shape and lse.shape == q.shape[:3] and lse.dtype == torch.float32
    grads = ring._cudnn_backward(q, kv, kv, out, lse, out, True, None, (None, None), 0.1)
    assert [g.shape for g in grads] == [q.shape, kv.shape, kv.shape]


def test_cpu_tensors_are_refused_by_the_cudnn_ring(tmp_path):
    import stridedfa
    from stridedfa.torch import context_parallel_attention

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        q = torch.zeros(1, 2, 8, 8, dtype=torch.bfloat16)
        with pytest.raises(stridedfa.LayoutError, match="must be CUDA tensors"):
            context_parallel_attention(q, q, q)
    finally:
        dist.destroy_process_group()


def test_an_odd_load_balanced_shard_is_refused(tmp_path, monkeypatch):
    """A load-balanced shard is two equal chunks whatever the mask: an odd one would lose a row."""
    import stridedfa
    from stridedfa import _torch_context_parallel
    from stridedfa.torch import context_parallel_attention

    monkeypatch.setattr(_torch_context_parallel, "_kernels", ring_worker.reference_kernels)

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        q = torch.zeros(1, 2, 5, 8, dtype=torch.float64)
        for options in ({"window": (1, 1)}, {"causal": True}, {}):
            with pytest.raises(stridedfa.LayoutError, match="must be even"):
                context_parallel_attention(q, q, q, **options)
        assert context_parallel_attention(q, q, q, window=(1, 1), load_balanced=False).shape == q.shape
    finally:
        dist.destroy_process_group()

