"""Probe68 again (GPU run 70), unchanged but for its output name: stop 46 merged fills and copies into one
2-D driver call per region (memops.cpp, blocks_of), which should cut the dense tail's 300-1,400 µs
(run 68: 256 per-(b, h) copies of the staged lse at batch 8) to a few µs.

The probe (first for GPU run 68): multi-token decoding at 8-16 queries by a prefix and a tail (issue 33 item 3,
ci/next-gpu-session.md). Under a bottom-right causal mask every query of a sequence of L keys sees
its first L - s_q + 1 keys (the prefix); query t also sees the t keys after them (the tail). So:
- the prefix: one query per (sequence, query head, token), the tokens folded into the query-head
  axis (q's (b, h, s, d) memory read as (b, h x s, 1, d): each kv head's group of g query heads x s
  tokens), unmasked against the paged cache with lengths L - s_q + 1 -- cuDNN's fast one-query
  kernel reads the keys once for all tokens;
- the tail: s_q queries against the s_q - 1 keys after the prefix, gathered dense, causal
  bottom-right (query 0 sees none);
- merged by their log-sum-exp (here in torch; a real path would use split_kv's merge kernel).
Against the causal multi-query call on cuDNN's general kernel (by tokens off) and by tokens: the
largest difference of the merged output from the general kernel's, CUDA-graph replayed µs of each
part and of the whole."""
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
    us = graphed_us(fn, 3, 20)
    return round(us, 2) if isinstance(us, float) else us


rows = []
_core._split_kv(False)
for b, L, s_q in ((1, 8192, 8), (8, 8192, 8), (32, 8192, 8), (8, 8192, 16), (32, 8192, 16), (8, 1024, 8),
                  (32, 1024, 16), (8, 8192, 4)):
    blocks = L // BLOCK
    cache = torch.randn(b * blocks, 2, BLOCK, H_KV, D, device="cuda", dtype=torch.bfloat16)
    kc, vc = cache[:, 0].transpose(1, 2), cache[:, 1].transpose(1, 2)
    table = torch.randperm(b * blocks, device="cuda").view(b, blocks).to(torch.int32)
    lens = torch.full((b,), L, device="cuda", dtype=torch.int32)
    q = torch.randn(b, H_Q, s_q, D, device="cuda", dtype=torch.bfloat16)  # (b, h, s, d) memory
    row = {"b": b, "L": L, "s_q": s_q}
    general = torch.empty_like(q)
    _core._decode_by_tokens(False)
    row["general_kernel"] = safe(lambda: stridedfa.sdpa_forward(q, kc, vc, general, block_table=table, seqlens_kv=lens,
                                                                causal=True, causal_alignment="bottom_right"))
    _core._decode_by_tokens(True)
    q_tok = q.transpose(1, 2).contiguous().transpose(1, 2)  # token-major, as by tokens needs
    tok_out = torch.empty_like(q_tok)
    row["by_tokens_or_general"] = safe(lambda: stridedfa.sdpa_forward(
        q_tok, kc, vc, tok_out, block_table=table, seqlens_kv=lens, causal=True, causal_alignment="bottom_right"))

    # the prefix: tokens folded into the heads, one query, unmasked, L - s_q + 1 keys
    q_fold = q.reshape(b, H_Q * s_q, 1, D)
    pre_out = torch.empty_like(q_fold)
    pre_lse = torch.empty(b, H_Q * s_q, 1, device="cuda")
    pre_lens = lens - s_q + 1
    # the tail: the s_q - 1 keys after the prefix, gathered dense (b, h_kv, s_q - 1, d)
    positions = (lens[:, None] - s_q + 1 + torch.arange(s_q - 1, device="cuda")[None, :]).long()  # (b, s_q - 1)
    block_ids = table.long().gather(1, positions // BLOCK)
    k_tail = kc[block_ids, :, positions % BLOCK].permute(0, 2, 1, 3).contiguous()
    v_tail = vc[block_ids, :, positions % BLOCK].permute(0, 2, 1, 3).contiguous()
    tail_out = torch.empty_like(q)
    tail_lse = torch.empty(b, H_Q, s_q, device="cuda")

    def prefix():
        stridedfa.sdpa_forward(q_fold, kc, vc, pre_out, lse=pre_lse, block_table=table, seqlens_kv=pre_lens)

    def tail():
        stridedfa.sdpa_forward(q, k_tail, v_tail, tail_out, lse=tail_lse, causal=True, causal_alignment="bottom_right")

    def merged():
        prefix()
        tail()
        lse1, lse2 = pre_lse.view(b, H_Q, s_q, 1), tail_lse.view(b, H_Q, s_q, 1)
        m = torch.maximum(lse1, lse2)
        w1, w2 = torch.exp(lse1 - m), torch.exp(lse2 - m)
        return (pre_out.view(b, H_Q, s_q, D).float() * w1 + tail_out.float() * w2) / (w1 + w2)

    row["prefix"] = safe(prefix)
    row["tail"] = safe(tail)
    row["prefix_tail_merged_in_torch"] = safe(merged)
    try:
        row["max_diff_from_general"] = (merged() - general.float()).abs().max().item()
    except Exception as error:  # the prefix or tail refused
        row["max_diff_from_general"] = f"{type(error).__name__}: {error}"[:200]
    kf = kc[table.long()].permute(0, 2, 1, 3, 4).reshape(b, H_KV, blocks * BLOCK, D)
    vf = vc[table.long()].permute(0, 2, 1, 3, 4).reshape(b, H_KV, blocks * BLOCK, D)
    mask = torch.ones(s_q, L, device="cuda", dtype=torch.bool).tril(L - s_q)
    row["sdpa_gathered"] = safe(lambda: F.scaled_dot_product_attention(q, kf, vf, attn_mask=mask, enable_gqa=True))
    print(row, flush=True)
    rows.append(row)
    del cache, kf, vf
    torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "probe70.json"), "w"), indent=1)
