"""Probe (GPU run 67; probe66 at 6 and 8 tokens, where the crossover was estimated): multi-token decoding by tokens (docs/design/multi-token-decode.md). A paged
step of s_q queries per sequence, causal bottom-right (the general kernel), against the same step
as b x s_q one-query sequences (table rows repeated, key lengths L - s_q + 1 + t: cuDNN's fast
one-query kernel): the second's largest difference from the first's outputs; CUDA-graph replayed µs."""
import json, os, sys
from pathlib import Path
import torch
import torch.nn.functional as F
import stridedfa
from stridedfa import _core

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from decode_timing import graphed_us  # noqa: E402

H_Q, H_KV, D, BLOCK = 32, 8, 128, 16


def safe(fn):
    """µs per call replayed from a CUDA graph (decode_timing.py), or why it could not run."""
    us = graphed_us(fn, 3, 20)
    return round(us, 2) if isinstance(us, float) else us


rows = []
_core._split_kv(False)
_core._decode_by_tokens(False)  # the multi-query call on the general kernel, as before by tokens existed
for b, L, s_q in ((1, 8192, 6), (8, 8192, 6), (32, 8192, 6), (1, 8192, 8), (8, 8192, 8), (32, 8192, 8), (8, 1024, 6), (32, 1024, 8)):
    blocks = L // BLOCK
    cache = torch.randn(b * blocks, 2, BLOCK, H_KV, D, device="cuda", dtype=torch.bfloat16)
    kc, vc = cache[:, 0].transpose(1, 2), cache[:, 1].transpose(1, 2)
    table = torch.randperm(b * blocks, device="cuda").view(b, blocks).to(torch.int32)
    lens = torch.full((b,), L, device="cuda", dtype=torch.int32)
    q_bshd = torch.randn(b, s_q, H_Q, D, device="cuda", dtype=torch.bfloat16)
    q = q_bshd.transpose(1, 2)  # (b, h, s_q, d) over (b, s, h, d) memory
    out = torch.empty_like(q_bshd).transpose(1, 2)
    row = {"b": b, "L": L, "s_q": s_q}
    row["causal_multi_query"] = safe(lambda: stridedfa.sdpa_forward(q, kc, vc, out, block_table=table, seqlens_kv=lens,
                                                                     causal=True, causal_alignment="bottom_right"))
    ref = out.float().clone()
    # by tokens: (b * s_q) one-query sequences
    q_tok = q_bshd.reshape(b * s_q, 1, H_Q, D).transpose(1, 2)
    out_tok = torch.full_like(q_bshd, float("nan")).reshape(b * s_q, 1, H_Q, D).transpose(1, 2)
    table_tok = table.repeat_interleave(s_q, dim=0).contiguous()
    lens_tok = (lens[:, None] - s_q + 1 + torch.arange(s_q, device="cuda", dtype=torch.int32)[None, :]).reshape(-1).to(torch.int32)
    row["by_tokens"] = safe(lambda: stridedfa.sdpa_forward(q_tok, kc, vc, out_tok, block_table=table_tok, seqlens_kv=lens_tok,
                                                            causal=True, causal_alignment="bottom_right"))
    got = out_tok.transpose(1, 2).reshape(b, s_q, H_Q, D).transpose(1, 2).float()
    row["by_tokens_max_diff"] = (got - ref).abs().max().item()
    kf = kc[table.long()].permute(0, 2, 1, 3, 4).reshape(b, H_KV, blocks * BLOCK, D)
    vf = vc[table.long()].permute(0, 2, 1, 3, 4).reshape(b, H_KV, blocks * BLOCK, D)
    mask = torch.ones(s_q, L, device="cuda", dtype=torch.bool).tril(L - s_q)
    row["sdpa_gathered"] = safe(lambda: F.scaled_dot_product_attention(q, kf, vf, attn_mask=mask, enable_gqa=True))
    print(row, flush=True); rows.append(row)
    del cache, kf, vf
    torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "probe67.json"), "w"), indent=1)
