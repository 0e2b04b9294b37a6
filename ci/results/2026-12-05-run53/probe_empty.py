"""Issue 30 probe (GPU run 53, before any fix): what cuDNN 9.19 writes through stridedfa's core for
sequences of length 0 (dense padding lengths, varlen, paged), and whether sinks with s_q = 1 are
served. Outputs poisoned with NaN before each call; prints one JSON line per case."""
import json
import math
import traceback

import numpy as np
import torch

import stridedfa
from stridedfa import reference

dev = "cuda"
torch.manual_seed(0)


def nan(shape, dtype=torch.bfloat16):
    return torch.full(shape, float("nan"), dtype=dtype, device=dev)


def summary(name, t, batch=None):
    x = t.float() if batch is None else t[batch].float()
    return {f"{name}_nan": int(torch.isnan(x).sum()), f"{name}_inf": int(torch.isinf(x).sum()),
            f"{name}_absmax": float(torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0).abs().max()) if x.numel() else 0.0}


def dense_case(label, seqlens_q, seqlens_kv, *, bias=False, sinks=False, alibi=False, softcap=None, window=None,
               dropout=0.0, deterministic=False, causal=False, alignment="top_left", b=2, hq=2, hkv=1, s=10, d=128):
    rec = {"case": label}
    try:
        q = torch.randn(b, hq, s, d, device=dev, dtype=torch.bfloat16)
        kv = torch.randn(b, s, 2, hkv, d, device=dev, dtype=torch.bfloat16)
        k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
        opts = dict(causal=causal, causal_alignment=alignment)
        if seqlens_q is not None:
            opts["seqlens_q"] = torch.tensor(seqlens_q, dtype=torch.int32, device=dev)
        if seqlens_kv is not None:
            opts["seqlens_kv"] = torch.tensor(seqlens_kv, dtype=torch.int32, device=dev)
        if bias:
            lk = seqlens_kv or [s] * b
            m = torch.zeros(b, 1, 1, s, device=dev, dtype=torch.bfloat16)
            for i, L in enumerate(lk):
                m[i, ..., L:] = float("-inf")
            opts["bias"] = m
        if sinks:
            opts["sinks"] = torch.randn(hq, device=dev, dtype=torch.float32)
        if alibi:
            opts["alibi_slopes"] = torch.rand(hq, device=dev, dtype=torch.float32)
        if softcap:
            opts["softcap"] = softcap
        if window:
            opts["window"] = window
        if dropout:
            opts["dropout_p"] = dropout
            opts["rng_state"] = torch.tensor([1234, 0], dtype=torch.int64, device=dev)
        out = nan((b, hq, s, d))
        lse = nan((b, hq, s), torch.float32)
        stridedfa.sdpa_forward(q, k, v, out, lse=lse, **opts)
        torch.cuda.synchronize()
        rec.update(summary("out0", out, 0)); rec.update(summary("out1", out, 1))
        rec["lse0"] = [round(float(x), 3) for x in lse[0, 0, :4].tolist()]
        rec["lse1"] = [round(float(x), 3) for x in lse[1, 0, :6].tolist()]
        if sinks:
            rec["sinks_h0"] = float(opts["sinks"][0])
        go = torch.randn_like(out)
        dq, dk, dv = nan(q.shape), nan(k.shape), nan(v.shape)
        extra = {}
        if sinks:
            extra["grad_sinks"] = torch.full((hq,), float("nan"), device=dev)
        bopts = dict(opts)
        try:
            stridedfa.sdpa_backward(q, k, v, torch.nan_to_num(out), go, lse, dq, dk, dv, deterministic=deterministic,
                                    **bopts, **extra)
            torch.cuda.synchronize()
            for n, t in (("dq", dq), ("dk", dk), ("dv", dv)):
                rec.update(summary(n + "0", t, 0)); rec.update(summary(n + "1", t, 1))
            lk = seqlens_kv or [s] * b
            rec["dkv_padded_absmax"] = max(float(torch.nan_to_num(t[i, :, L:].float(), nan=1e9).abs().max()) if L < s else 0.0
                                           for t in (dk, dv) for i, L in enumerate(lk))
            if sinks:
                rec["dsinks"] = [round(float(x), 4) for x in extra["grad_sinks"].tolist()]
        except Exception as e:  # noqa: BLE001
            rec["backward_error"] = f"{type(e).__name__}: {e}"[:300]
    except Exception as e:  # noqa: BLE001
        rec["error"] = f"{type(e).__name__}: {e}"[:300]
    print(json.dumps(rec), flush=True)


def varlen_case(label, cu_q, cu_kv, *, causal=False, sinks=False):
    rec = {"case": label}
    try:
        h, d = 2, 64
        tq, tk = cu_q[-1], cu_kv[-1]
        q = torch.randn(tq, h, d, device=dev, dtype=torch.bfloat16)
        k = torch.randn(tk, h, d, device=dev, dtype=torch.bfloat16)
        v = torch.randn(tk, h, d, device=dev, dtype=torch.bfloat16)
        cq = torch.tensor(cu_q, dtype=torch.int32, device=dev)
        ck = torch.tensor(cu_kv, dtype=torch.int32, device=dev)
        opts = {}
        if sinks:
            opts["sinks"] = torch.randn(h, device=dev)
        out = stridedfa.torch.varlen_attention(q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), cq, ck,
                                               causal=causal, return_lse=True, **opts)
        o, lse = out
        rec.update(summary("out", o))
        rec["lse"] = [round(float(x), 3) for x in lse[0].tolist()]
        o.float().sum().backward()
        for n, t in (("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
            rec.update(summary(n, t))
    except Exception as e:  # noqa: BLE001
        rec["error"] = f"{type(e).__name__}: {e}"[:300]
    print(json.dumps(rec), flush=True)


def paged_case(label, lengths, s_q=1, sinks=False):
    rec = {"case": label}
    try:
        b, h, d, bs, nb = len(lengths), 2, 128, 16, 8
        q = torch.randn(b, h, s_q, d, device=dev, dtype=torch.bfloat16)
        kc = torch.randn(nb, h, bs, d, device=dev, dtype=torch.bfloat16)
        vc = torch.randn(nb, h, bs, d, device=dev, dtype=torch.bfloat16)
        table = torch.arange(b * 2, dtype=torch.int32, device=dev).reshape(b, 2)
        out = nan((b, h, s_q, d))
        lse = nan((b, h, s_q), torch.float32)
        opts = dict(causal=True, causal_alignment="bottom_right")
        if sinks:
            opts["sinks"] = torch.randn(h, device=dev)
        stridedfa.sdpa_forward(q, kc, vc, out, lse=lse, block_table=table,
                               seqlens_kv=torch.tensor(lengths, dtype=torch.int32, device=dev), **opts)
        torch.cuda.synchronize()
        rec.update(summary("out0", out, 0)); rec.update(summary("out1", out, 1))
        rec["lse"] = lse[:, 0, 0].tolist()
    except Exception as e:  # noqa: BLE001
        rec["error"] = f"{type(e).__name__}: {e}"[:300]
    print(json.dumps(rec), flush=True)


def sinks_decode(label, expand_rows=None, causal=True, alignment="bottom_right", seqlens=False):
    """s_q = 1 with sinks: refused today? And does a (b, h, 2, d) query view with seq stride 0 work?"""
    rec = {"case": label}
    try:
        b, hq, hkv, skv, d = 2, 4, 2, 37, 64
        q1 = torch.randn(b, hq, 1, d, device=dev, dtype=torch.bfloat16)
        k = torch.randn(b, hkv, skv, d, device=dev, dtype=torch.bfloat16)
        v = torch.randn(b, hkv, skv, d, device=dev, dtype=torch.bfloat16)
        sinks = torch.randn(hq, device=dev)
        ro, rl = reference.sdpa_forward(q1.float().cpu().numpy(), k.float().cpu().numpy(), v.float().cpu().numpy(),
                                        causal=causal, causal_alignment=alignment, sinks=sinks.cpu().numpy())
        n = expand_rows or 1
        q = q1.expand(b, hq, n, d)
        out = nan((b, hq, n, d))
        lse = nan((b, hq, n), torch.float32)
        opts = {}
        if seqlens:
            opts["seqlens_q"] = torch.ones(b, dtype=torch.int32, device=dev)
            opts["seqlens_kv"] = torch.full((b,), skv, dtype=torch.int32, device=dev)
        stridedfa.sdpa_forward(q, k, v, out, lse=lse, causal=causal, causal_alignment=alignment, sinks=sinks, **opts)
        torch.cuda.synchronize()
        for row in range(n):
            rec[f"row{row}_err_out"] = float((out[:, :, row].float().cpu() - torch.from_numpy(ro[:, :, 0])).abs().max())
            rec[f"row{row}_err_lse"] = float((lse[:, :, row].cpu() - torch.from_numpy(rl[:, :, 0])).abs().max())
    except Exception as e:  # noqa: BLE001
        rec["error"] = f"{type(e).__name__}: {e}"[:300]
    print(json.dumps(rec), flush=True)


def sinks_decode_backward():
    rec = {"case": "sinks s_q=1 backward"}
    try:
        b, hq, s, d = 1, 2, 16, 64
        q = torch.randn(b, hq, 1, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, hq, s, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, hq, s, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        sinks = torch.randn(hq, device=dev, requires_grad=True)
        o = stridedfa.torch.attention(q, k, v, sinks=sinks)
        o.float().sum().backward()
        rec["ok"] = True
    except Exception as e:  # noqa: BLE001
        rec["error"] = f"{type(e).__name__}: {e}"[:300]
    print(json.dumps(rec), flush=True)


import os  # noqa: E402
ONLY_SDPA = os.environ.get("PROBE_ONLY") == "sdpa"
print(json.dumps({"cudnn": stridedfa.info().get("cudnn_runtime_version", None), "torch": torch.__version__,
                  "device": torch.cuda.get_device_name()}), flush=True)
def all_cases():
    V = dict
    for label, kw in [("plain", V()), ("bias", V(bias=True)), ("sinks", V(sinks=True)), ("alibi", V(alibi=True)),
                      ("softcap", V(softcap=5.0)), ("window", V(window=(3, 0), causal=True)),
                      ("dropout", V(dropout=0.2)), ("deterministic", V(deterministic=True)),
                      ("causal_br", V(causal=True, alignment="bottom_right")),
                      ("sinks+alibi+det causal", V(sinks=True, alibi=True, deterministic=True, causal=True))]:
        dense_case("kv0 " + label, [2, 3], [0, 5], **kw)
    dense_case("q0 plain", [0, 3], [4, 5])
    dense_case("q0 sinks", [0, 3], [4, 5], sinks=True)
    dense_case("allzero plain", [0, 0], [0, 0])
    dense_case("kv0 only (no seqlens_q)", None, [0, 5])
    dense_case("kv0 only sinks", None, [0, 5], sinks=True)
    dense_case("issue case 2", None, [0, 194, 201], sinks=True, alibi=True, deterministic=True, causal=True, b=3, hq=1,
               hkv=1, s=284, d=64)
    dense_case("no zero, sinks alibi det (control)", None, [150, 194, 201], sinks=True, alibi=True, deterministic=True,
               causal=True, b=3, hq=1, hkv=1, s=284, d=64)
    varlen_case("varlen empty middle", [0, 3, 3, 7], [0, 4, 4, 9])
    varlen_case("varlen empty kv", [0, 3, 5, 7], [0, 0, 5, 9])
    varlen_case("varlen empty kv causal", [0, 3, 5, 7], [0, 0, 5, 9], causal=True)
    varlen_case("varlen empty kv sinks", [0, 3, 5, 7], [0, 0, 5, 9], sinks=True)
    paged_case("paged len0", [0, 5])
    paged_case("paged len0 s_q=3", [0, 5], s_q=3)
    paged_case("paged sinks decode", [7, 5], sinks=True)
    sinks_decode("sinks s_q=1 br", None)
    sinks_decode("sinks s_q=1 nocausal", None, causal=False)
    sinks_decode("sinks q x2 stride0 br", 2)
    sinks_decode("sinks q x2 stride0 nocausal", 2, causal=False)
    sinks_decode("sinks q x2 stride0 tl", 2, alignment="top_left")
    sinks_decode_backward()


if not ONLY_SDPA:
    all_cases()


def sdpa_left_padding():
    """What transformers' SDPA path gives padded query rows of a left-padded causal batch (torch's
    SDPA with the boolean mask transformers builds): 0, the mean of values, or NaN?"""
    import torch.nn.functional as F
    from transformers import masking_utils as mu
    rec = {"case": "sdpa left padding"}
    b, h, s, d = 2, 4, 8, 64
    q, k, v = (torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16) for _ in range(3))
    pad = torch.ones(b, s, dtype=torch.bool, device=dev)
    pad[0, :3] = False
    mask = mu.sdpa_mask(batch_size=b, cache_position=torch.arange(s, device=dev), kv_length=s,
                        attention_mask=pad, allow_is_causal_skip=False) if "cache_position" in \
        mu.sdpa_mask.__code__.co_varnames else mu.sdpa_mask(batch_size=b, q_length=s, kv_length=s, device=dev,
                                                            attention_mask=pad, allow_is_causal_skip=False)
    rec["mask_row0"] = mask[0, 0, 0].int().tolist()
    rec["mask_dtype"] = str(mask.dtype)
    for name, backend in (("default", None), ("efficient", "EFFICIENT_ATTENTION"), ("cudnn", "CUDNN_ATTENTION"),
                          ("math", "MATH")):
        try:
            if backend is None:
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            else:
                from torch.nn.attention import SDPBackend, sdpa_kernel
                with sdpa_kernel(getattr(SDPBackend, backend)):
                    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            rows = o[0, :, :3].float()
            rec[name] = {"nan": int(torch.isnan(rows).sum()), "absmax": float(torch.nan_to_num(rows).abs().max()),
                         "err_vs_mean_v": float((rows - v[0].float().mean(1, keepdim=True)).abs().max()),
                         "err_vs_mean_padv": float((rows - v[0, :, :3].float().mean(1, keepdim=True)).abs().max())}
        except Exception as e:  # noqa: BLE001
            rec[name] = f"{type(e).__name__}: {e}"[:200]
    print(json.dumps(rec), flush=True)


def head_dim_59():
    rec = {"case": "kvcache head_dim 59"}
    try:
        from stridedfa.flash_attn_interface import flash_attn_with_kvcache
        q = torch.randn(2, 1, 4, 59, device=dev, dtype=torch.bfloat16)
        kc = torch.randn(2, 32, 4, 59, device=dev, dtype=torch.bfloat16)
        vc = torch.randn(2, 32, 4, 59, device=dev, dtype=torch.bfloat16)
        o = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=torch.tensor([5, 9], dtype=torch.int32, device=dev))
        rec["ok"] = list(o.shape)
    except Exception as e:  # noqa: BLE001
        rec["error"] = f"{type(e).__name__}: {e}"[:400]
    print(json.dumps(rec), flush=True)


for fn in (sdpa_left_padding, head_dim_59):
    try:
        fn()
    except Exception:  # noqa: BLE001
        traceback.print_exc()
