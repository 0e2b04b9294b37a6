"""Probe (GPU run 69), two questions for issue 33.

1. Host time of one decoding call as transformers makes it (item 4: generation's steady state is
   host-bound, 0.87-0.95x SDPA for some models): (b, h_q, h_kv, d) = (8, 8, 2, 128), one query, the
   dynamic cache's (b, h_kv, L, d) tensors; µs per call issued back to back (the GPU keeps up),
   alternating rounds, for transformers' SDPA function, SDPA itself, stridedfa's transformers
   function and stridedfa.torch.attention; bucketed (the paged view) and exact decode graphs.
2. The tail of a prefix + tail split for 5-16 queries (item 3; probe68: the prefix, the tokens
   folded into the query heads, reads the keys once at the fast kernel's speed, but a dense tail of
   s_q queries against s_q - 1 keys cost 300 µs): the prefix ends at a block boundary P = (L - s_q)
   // 16 * 16 and the tail is the paged call over the blocks from P (a shifted table, lengths L - P,
   causal bottom-right, cuDNN's general kernel on at most s_q + 15 keys), or a dense square tail
   (the last s_q keys gathered, s_q == s_kv). CUDA-graph replayed µs; the merged result against the
   general kernel's."""
import json, os, statistics, sys, time, types
from pathlib import Path
import torch
import torch.nn.functional as F
import stridedfa
import stridedfa.transformers as sfa_hf
from stridedfa import _core
from transformers.integrations.sdpa_attention import sdpa_attention_forward

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from decode_timing import graphed_us  # noqa: E402

report = {"device": torch.cuda.get_device_name(), "host": [], "tail": []}

# --- 1. host time per decoding call ---
b, h_q, h_kv, d, L = 8, 8, 2, 128, 600
module = types.SimpleNamespace(is_causal=True, training=False, num_key_value_groups=h_q // h_kv)
q = torch.randn(b, 1, h_q, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
k = torch.randn(b, h_kv, L, d, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
calls = {
    "hf_sdpa": lambda: sdpa_attention_forward(module, q, k, v, None, scaling=d ** -0.5),
    "torch_sdpa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
    "hf_stridedfa": lambda: sfa_hf.attention_forward(module, q, k, v, None, scaling=d ** -0.5),
    "stridedfa_torch": lambda: stridedfa.torch.attention(q, k, v, causal=True, causal_alignment="bottom_right"),
}


def host_us(fn, n=300):
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(n):
        fn()
    spent = time.perf_counter() - began
    torch.cuda.synchronize()
    return spent / n * 1e6


with torch.no_grad():
    for mode in ("bucketed", "exact"):
        _core._decode_graphs(mode == "bucketed")
        for fn in calls.values():
            for _ in range(20):
                fn()
        rounds = {name: [] for name in calls}
        for _ in range(9):
            for name, fn in calls.items():
                rounds[name].append(host_us(fn))
        row = {"mode": mode, **{name: round(statistics.median(r), 2) for name, r in rounds.items()}}
        row["hf_ratio"] = round(row["hf_stridedfa"] / row["hf_sdpa"], 3)
        print(row, flush=True)
        report["host"].append(row)
    _core._decode_graphs(True)

# --- 2. the tail of a prefix + tail split ---
H_Q, H_KV, D, BLOCK = 32, 8, 128, 16
_core._split_kv(False)
for b, L, s_q in ((1, 8192, 8), (8, 8192, 8), (32, 8192, 8), (8, 8192, 16), (32, 8192, 16), (8, 1024, 8),
                  (32, 1024, 16), (8, 8192, 5)):
    blocks = L // BLOCK
    cache = torch.randn(b * blocks, 2, BLOCK, H_KV, D, device="cuda", dtype=torch.bfloat16)
    kc, vc = cache[:, 0].transpose(1, 2), cache[:, 1].transpose(1, 2)
    table = torch.randperm(b * blocks, device="cuda").view(b, blocks).to(torch.int32)
    lens = torch.full((b,), L, device="cuda", dtype=torch.int32)
    q = torch.randn(b, H_Q, s_q, D, device="cuda", dtype=torch.bfloat16)
    row = {"b": b, "L": L, "s_q": s_q}
    general = torch.empty_like(q)
    _core._decode_by_tokens(False)
    row["general_kernel"] = graphed_us(lambda: stridedfa.sdpa_forward(
        q, kc, vc, general, block_table=table, seqlens_kv=lens, causal=True, causal_alignment="bottom_right"), 3, 20)
    _core._decode_by_tokens(True)
    first = (lens - s_q) // BLOCK  # the tail's first block
    prefix_lens = first * BLOCK
    q_fold = q.reshape(b, H_Q * s_q, 1, D)
    pre_out, pre_lse = torch.empty_like(q_fold), torch.empty(b, H_Q * s_q, 1, device="cuda")
    width = (s_q + BLOCK - 1 + BLOCK - 1) // BLOCK + 1
    columns = (first[:, None] + torch.arange(width, device="cuda")[None]).clamp(max=blocks - 1).long()
    tail_table = table.long().gather(1, columns).to(torch.int32)
    tail_lens = (lens - prefix_lens).to(torch.int32)
    tail_out, tail_lse = torch.empty_like(q), torch.empty(b, H_Q, s_q, device="cuda")
    positions = (lens[:, None] - s_q + torch.arange(s_q, device="cuda")[None, :]).long()
    block_ids = table.long().gather(1, positions // BLOCK)
    k_sq = kc[block_ids, :, positions % BLOCK].permute(0, 2, 1, 3).contiguous()
    v_sq = vc[block_ids, :, positions % BLOCK].permute(0, 2, 1, 3).contiguous()
    sq_out, sq_lse = torch.empty_like(q), torch.empty(b, H_Q, s_q, device="cuda")
    pre2_out, pre2_lse = torch.empty_like(q_fold), torch.empty(b, H_Q * s_q, 1, device="cuda")

    def prefix():
        stridedfa.sdpa_forward(q_fold, kc, vc, pre_out, lse=pre_lse, block_table=table, seqlens_kv=prefix_lens)

    def paged_tail():
        stridedfa.sdpa_forward(q, kc, vc, tail_out, lse=tail_lse, block_table=tail_table, seqlens_kv=tail_lens,
                               causal=True, causal_alignment="bottom_right")

    def prefix_before_last():  # the dense square tail's prefix: L - s_q keys
        stridedfa.sdpa_forward(q_fold, kc, vc, pre2_out, lse=pre2_lse, block_table=table, seqlens_kv=lens - s_q)

    def square_tail():
        stridedfa.sdpa_forward(q, k_sq, v_sq, sq_out, lse=sq_lse, causal=True)

    def merge(o1, l1, o2, l2):
        l1, l2 = l1.view(b, H_Q, s_q, 1), l2.view(b, H_Q, s_q, 1)
        m = torch.maximum(l1, l2)
        w1, w2 = torch.exp(l1 - m), torch.exp(l2 - m)
        return (o1.view(b, H_Q, s_q, D).float() * w1 + o2.float() * w2) / (w1 + w2)

    row["prefix_to_block"] = graphed_us(prefix, 3, 20)
    row["paged_tail"] = graphed_us(paged_tail, 3, 20)
    row["prefix_before_last"] = graphed_us(prefix_before_last, 3, 20)
    row["square_tail"] = graphed_us(square_tail, 3, 20)
    row["merge_in_torch"] = graphed_us(lambda: merge(pre_out, pre_lse, tail_out, tail_lse), 3, 20)
    for name, (p, t, args) in {"paged": (prefix, paged_tail, (pre_out, pre_lse, tail_out, tail_lse)),
                               "square": (prefix_before_last, square_tail, (pre2_out, pre2_lse, sq_out, sq_lse))}.items():
        try:
            p(), t()
            row[f"{name}_max_diff_from_general"] = (merge(*args) - general.float()).abs().max().item()
        except Exception as error:
            row[f"{name}_max_diff_from_general"] = f"{type(error).__name__}: {error}"[:200]
    row = {key: round(value, 2) if isinstance(value, float) else value for key, value in row.items()}
    print(row, flush=True)
    report["tail"].append(row)
    del cache
    torch.cuda.empty_cache()
json.dump(report, open(os.path.join(os.environ.get("OUT", "."), "probe69.json"), "w"), indent=1)
