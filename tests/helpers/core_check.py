"""The core's own verdict on a call, on the CPU: the torch tensors of a CPU test described to the
core's graph-key computation (intake, validation, plan and graph spec -- everything but cuDNN) as
the CUDA tensors they stand for, so that a fake kernel refuses exactly what the core refuses on a
GPU. Attention operands and biases become bfloat16 (the tests compute in float32/64 on the CPU),
statistics, sinks and slopes float32, indices int32; every view keeps its shape, its element
strides and its offset inside its storage (each storage at its own aligned address)."""

from __future__ import annotations

import torch

from helpers.fake_dlpack import FakeTensor
from stridedfa import _core

CUDNN_VERSION = 91900  # the GPU host's cuDNN (ci/results/gpu-tests.md)
_ITEMSIZE = {"bfloat16": 2, "float32": 4, "int32": 4, "int64": 8}


class _Addresses:
    def __init__(self):
        self.bases: dict[int, int] = {}

    def fake(self, t: torch.Tensor | None, dtype: str) -> FakeTensor | None:
        if t is None:
            return None
        if dtype == "int" and t.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"an index tensor of {t.dtype}")
        if dtype == "int":
            dtype = "int32" if t.dtype == torch.int32 else "int64"
        storage = t.untyped_storage().data_ptr()
        base = self.bases.setdefault(storage, 0x100000000000 + (len(self.bases) + 1) * (1 << 36))
        return FakeTensor(tuple(t.shape), tuple(t.stride()), dtype, data=base + t.storage_offset() * _ITEMSIZE[dtype])


def check_forward(q, k, v, *, scale=None, causal=False, causal_alignment="top_left", window=None, softcap=None,
                  seqlens_q=None, seqlens_kv=None, sinks=None, bias=None, alibi_slopes=None, dropout_p=0.0,
                  cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None, max_seqlen_kv=None) -> None:
    """Raises what the core raises for this forward (stridedfa.LayoutError / UnsupportedError), or
    returns. q, k, v (b, h, s, d) views, or (tokens, h, d) with cu_seqlens; out is a fresh tensor
    in q's layout, as the adapters allocate it. Nothing while torch.compile traces (fake tensors
    have no storage to place)."""
    if torch.compiler.is_compiling():
        return
    at = _Addresses()
    attention = [at.fake(t, "bfloat16") for t in (q, k, v)]
    out_shape = (*q.shape[:-1], v.shape[-1])
    out = FakeTensor(out_shape, None, "bfloat16", data=0x7F0000000000)
    rng_state = FakeTensor((2,), None, "int64", data=0x7E0000000000) if dropout_p else None
    _core._forward_graph_key(
        *attention, out, None, scale=scale, causal=causal, causal_alignment=causal_alignment, window=window,
        softcap=softcap, seqlens_q=at.fake(seqlens_q, "int"), seqlens_kv=at.fake(seqlens_kv, "int"),
        sinks=at.fake(sinks, "float32"), bias=at.fake(bias, "bfloat16"), alibi_slopes=at.fake(alibi_slopes, "float32"),
        dropout_p=dropout_p, rng_state=rng_state, cudnn_version=CUDNN_VERSION,
        cu_seqlens_q=at.fake(cu_seqlens_q, "int"), cu_seqlens_kv=at.fake(cu_seqlens_kv, "int"),
        max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv)
