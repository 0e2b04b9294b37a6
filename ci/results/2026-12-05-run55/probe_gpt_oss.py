"""Run 55: why gpt-oss generation differs (run 54: three generation cases failed without a
traceback). For each attention call of a left-padded greedy generation (dynamic and static cache),
stridedfa's output against a float64 reference of gpt-oss's eager attention (mask, window, sinks)
on the same inputs, with the path taken; then where the tokens first differ, the reference logits'
margin between its top two tokens (a tie-level margin is bf16 noise, a wide one a wrong result)."""
import sys
import traceback

import torch

sys.path.insert(0, "tests")
from helpers import hf_models  # noqa: E402

import stridedfa.transformers as sft  # noqa: E402
from stridedfa._hf_masks import StridedMask  # noqa: E402
from transformers import AttentionInterface  # noqa: E402

original = sft.attention_forward
records = []


def reference(module, query, key, value, mask, scaling, s_aux):
    groups = query.shape[1] // key.shape[1]
    q, k, v = (t.double() for t in (query, key, value))
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = q @ k.transpose(2, 3) * scaling
    if mask is not None:
        dense = mask.dense() if isinstance(mask, StridedMask) else mask
        dense = dense[..., : k.shape[2]]
        keep = dense if dense.dtype == torch.bool else dense > torch.finfo(dense.dtype).min / 2
        scores = scores.masked_fill(~keep, float("-inf"))
    if s_aux is not None:
        sink = s_aux.double().reshape(1, -1, 1, 1).expand(q.shape[0], -1, q.shape[2], 1)
        both = torch.cat([scores, sink], -1).softmax(-1)[..., :-1]
    else:
        both = scores.softmax(-1).nan_to_num(0.0)
    return (both @ v).transpose(1, 2)


def checked(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
            sliding_window=None, softcap=None, s_aux=None, **kwargs):
    before = dict(sft.stats()["served"]) if isinstance(sft.stats().get("served"), dict) else None
    out, _ = original(module, query, key, value, attention_mask, dropout, scaling, is_causal, sliding_window,
                      softcap, s_aux, **kwargs)
    ref = reference(module, query, key, value, attention_mask, scaling if scaling is not None else query.shape[-1] ** -0.5,
                    s_aux)
    err = (out.double() - ref).abs().max().item()
    kind = attention_mask.kind if isinstance(attention_mask, StridedMask) else type(attention_mask).__name__
    records.append(dict(layer=getattr(module, "layer_idx", None), q=tuple(query.shape), k=tuple(key.shape),
                        kstride=tuple(key.stride()), mask=kind, window=sliding_window,
                        mwin=getattr(attention_mask, "window", None), causal=getattr(attention_mask, "causal", None),
                        err=err, nan=bool(out.isnan().any()), served=sft.stats()))
    return out, None


def generate(model, ids, mask, cache, **extra):
    return model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0,
                          cache_implementation=cache, return_dict_in_generate=True, output_logits=True, **extra)


ids, mask = hf_models.batch("causal", "left", b=3, s=40, device="cuda")
print("mask rows:", mask.sum(-1).tolist())
for cache in ("dynamic", "static"):
    print(f"===== {cache}")
    ours = hf_models.build("gpt_oss", "stridedfa", dtype=torch.bfloat16, device="cuda")
    sft.reset_stats()
    try:
        with sft.fallback("raise"):
            got = generate(ours, ids, mask, cache)
        print("raise mode: generated; stats", sft.stats())
    except Exception:
        traceback.print_exc()
        print("stats", sft.stats())
    AttentionInterface.register("stridedfa", checked)
    records.clear()
    try:
        got = generate(ours, ids, mask, cache, disable_compile=True)
    except Exception:
        traceback.print_exc()
        got = None
    AttentionInterface.register("stridedfa", original)
    for r in records:
        flag = "  <-- BAD" if (r["err"] > 0.05 or r["nan"]) else ""
        print({k: v for k, v in r.items() if k != "served"}, flag)
    print("stats", sft.stats())
    ref32 = hf_models.build("gpt_oss", "eager", dtype=torch.float32, device="cuda")
    want = generate(ref32, ids, mask, cache, disable_compile=True)
    eager16 = generate(hf_models.build("gpt_oss", "eager", dtype=torch.bfloat16, device="cuda"), ids, mask, cache,
                       disable_compile=True)
    for label, other in (("stridedfa bf16", got), ("eager bf16", eager16)):
        if other is None:
            continue
        new = other.sequences[:, -8:]
        print(label, new.tolist(), "vs fp32", want.sequences[:, -8:].tolist())
        diff = (new != want.sequences[:, -8:]).nonzero()
        if len(diff):
            row, step = diff[0].tolist()
            logits = want.logits[step][row].float()
            top = logits.topk(2)
            print(f"  first difference row {row} step {step}: fp32 top2 {top.indices.tolist()} margin "
                  f"{(top.values[0] - top.values[1]).item():.4f}; {label} logits max diff "
                  f"{(other.logits[step][row].float() - logits).abs().max().item():.4f}")
