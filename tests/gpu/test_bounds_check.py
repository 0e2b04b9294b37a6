"""The opt-in bounds check (STRIDEDFA_CHECK_BOUNDS=1, issue 30) and FlashAttention's paged bounds:
out-of-contract lengths, cu_seqlens and block ids raise BoundsError naming the entry, before
anything is written; without the switch they are clamped on the device (nothing outside the
tensors is touched). The switch is read once per process: each case runs in a fresh one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

pytestmark = pytest.mark.gpu

CASES = {
    "padding": """
        q = torch.randn(2, 2, 8, 64, device="cuda", dtype=torch.bfloat16); k = v = q.clone()
        out = torch.full_like(q, float("nan"))
        stridedfa.sdpa_forward(q, k, v, out, seqlens_kv=torch.tensor([3, 9], device="cuda", dtype=torch.int32))
    """,
    "varlen": """
        q = torch.randn(10, 2, 64, device="cuda", dtype=torch.bfloat16); k = v = q.clone()
        out = torch.full_like(q, float("nan"))
        cu = torch.tensor([0, 6, 4, 10], device="cuda", dtype=torch.int32)
        stridedfa.sdpa_forward(q, k, v, out, cu_seqlens_q=cu, cu_seqlens_kv=cu)
    """,
    "paged_id": """
        q = torch.randn(2, 2, 1, 64, device="cuda", dtype=torch.bfloat16)
        cache = torch.randn(4, 2, 16, 64, device="cuda", dtype=torch.bfloat16)
        out = torch.full_like(q, float("nan"))
        table = torch.tensor([[0, 1], [2, 7]], device="cuda", dtype=torch.int32)
        stridedfa.sdpa_forward(q, cache, cache, out, block_table=table,
                               seqlens_kv=torch.tensor([5, 20], device="cuda", dtype=torch.int32))
    """,
}
EXPECTED = {"padding": "seqlens_kv[1] = 9", "varlen": "cu_seqlens_q[2] = 4", "paged_id": "block_table[1, 1] = 7"}


def _run(body: str, check: bool) -> subprocess.CompletedProcess:
    code = "import torch, stridedfa\n" + textwrap.dedent(body) + textwrap.dedent("""
        torch.cuda.synchronize()
        assert not torch.isnan(out).any(), "out: written wholly without the check"
        print("CLAMPED")
    """)
    env = {**os.environ, "STRIDEDFA_CHECK_BOUNDS": "1" if check else "0"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("case", sorted(CASES))
def test_out_of_contract_values_raise_only_with_the_switch(case):
    checked = _run(CASES[case], True)
    assert "stridedfa.BoundsError" in checked.stderr or "BoundsError" in checked.stderr, checked.stderr[-2000:]
    assert EXPECTED[case] in checked.stderr, checked.stderr[-2000:]
    clamped = _run(CASES[case], False)
    assert clamped.returncode == 0 and "CLAMPED" in clamped.stdout, clamped.stderr[-2000:]


def test_flash_attn_with_kvcache_raises_on_lengths_past_the_block_table():
    from stridedfa.flash_attn_interface import flash_attn_with_kvcache

    q = torch.randn(2, 1, 4, 64, device="cuda", dtype=torch.bfloat16)
    pages = torch.zeros(8, 16, 2, 64, device="cuda", dtype=torch.bfloat16)
    table = torch.tensor([[0, 1], [2, 3]], device="cuda", dtype=torch.int32)
    new = torch.ones(2, 2, 2, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="block_table"):
        flash_attn_with_kvcache(q, pages, pages.clone(), new, new, block_table=table,
                                cache_seqlens=torch.tensor([3, 31], device="cuda", dtype=torch.int32))
    assert not pages.any(), "nothing appended before the error"


def test_flash_attn_with_kvcache_reads_a_head_dim_of_59_in_place():
    import numpy as np

    from stridedfa import reference
    from stridedfa.flash_attn_interface import flash_attn_with_kvcache

    gen = torch.Generator(device="cuda").manual_seed(3)
    k_cache = torch.zeros(2, 32, 4, 64, device="cuda", dtype=torch.bfloat16)[..., :59]
    v_cache = torch.zeros(2, 32, 4, 64, device="cuda", dtype=torch.bfloat16)[..., :59]
    k_cache.copy_(torch.randn(2, 32, 4, 59, generator=gen, device="cuda"))
    v_cache.copy_(torch.randn(2, 32, 4, 59, generator=gen, device="cuda"))
    q = torch.randn(2, 1, 4, 59, generator=gen, device="cuda").bfloat16()
    lengths = [5, 9]
    out = flash_attn_with_kvcache(q, k_cache, v_cache, causal=True,
                                  cache_seqlens=torch.tensor(lengths, device="cuda", dtype=torch.int32))
    for i, n in enumerate(lengths):
        args = [t[i:i + 1, :m].transpose(1, 2).float().cpu().numpy().astype(np.float64)
                for t, m in ((q, 1), (k_cache, n), (v_cache, n))]
        want, _ = reference.sdpa_forward(*args, dtype=np.float64)
        err = (out[i:i + 1].transpose(1, 2).float().cpu().numpy() - want).__abs__().max()
        assert err <= 2e-2 * np.abs(want).max() + 5e-3, (i, err)
