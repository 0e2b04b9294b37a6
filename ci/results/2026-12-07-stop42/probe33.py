"""Issue 33 probe on the host's cuDNN: what a new decode length costs, and whether a capacity view
with device lengths (tier B) or the ragged path (tier C) serves every length from one graph at the
exact graph's speed and bits."""
import json, sys, time
import torch, torch.nn.functional as F
import stridedfa.torch as st
from stridedfa import _core

dev, dt = "cuda", torch.bfloat16
hq, hk, d, C = 32, 8, 128, 8192
rows = []

def timeit(fn, n=100):
    for _ in range(5): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize(); return (time.perf_counter() - t) / n * 1e6

def first(fn):
    b0 = _core.cache_info()["builds"]; torch.cuda.synchronize(); t = time.perf_counter(); out = fn()
    torch.cuda.synchronize(); return out, (time.perf_counter() - t) * 1e3, _core.cache_info()["builds"] - b0

print("cudnn", torch.backends.cudnn.version(), _core.cache_info().get("cudnn", ""), flush=True)
for b in (1, 8):
    q = torch.randn(b, hq, 1, d, device=dev, dtype=dt)
    kc, vc = (torch.randn(b, hk, C, d, device=dev, dtype=dt) for _ in range(2))
    for L in (100, 1000, 3000, 7000):
        P = max(128, 1 << (L - 1).bit_length())
        k, v = kc[:, :, :L].contiguous(), vc[:, :, :L].contiguous()   # a dynamic cache's tensors: exactly L
        lq, lk = torch.ones(b, dtype=torch.int32, device=dev), torch.full((b,), L, dtype=torch.int32, device=dev)
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
        r = dict(b=b, L=L, P=P)
        o, r["exact_first_ms"], r["exact_builds"] = first(lambda: st.attention(q, k, v))
        r["exact_us"] = timeit(lambda: st.attention(q, k, v)); r["exact_err"] = (o.float() - ref).abs().max().item()
        for name, ext in (("cap_pow2", P), ("cap_full", C)):
            kv_ = kc[:, :, :ext], vc[:, :, :ext]
            oc, r[name + "_first_ms"], r[name + "_builds"] = first(
                lambda: st.attention(q, *kv_, seqlens_q=lq, seqlens_kv=lk))
            r[name + "_us"] = timeit(lambda: st.attention(q, *kv_, seqlens_q=lq, seqlens_kv=lk))
            r[name + "_bitexact"] = bool(torch.equal(oc, o)); r[name + "_maxdiff"] = (oc.float() - o.float()).abs().max().item()
        # tier C: the ragged path over a bshd cache (b sequences of L tokens, one query each)
        kb, vb = (t.transpose(1, 2).contiguous().view(b * L, hk, d) for t in (k, v))
        qv = q.transpose(1, 2).reshape(b, hq, d)
        cq = torch.arange(b + 1, dtype=torch.int32, device=dev); ck = cq * L
        try:
            ov, r["varlen_first_ms"], r["varlen_builds"] = first(lambda: st.varlen_attention(qv, kb, vb, cq, ck, 1, P))
            r["varlen_us"] = timeit(lambda: st.varlen_attention(qv, kb, vb, cq, ck, 1, P))
            r["varlen_maxdiff"] = (ov.view(b, 1, hq, d).transpose(1, 2).float() - o.float()).abs().max().item()
        except Exception as e:
            r["varlen_error"] = repr(e)[:200]
        # tier C without a copy: every (batch, kv head) one sequence of L keys (token stride d, fixed),
        # its group of query heads as that sequence's heads; declared kv extent P, then 8192
        kh, vh = k.view(b * hk * L, 1, d), v.view(b * hk * L, 1, d)
        qh = q.view(b * hk, hq // hk, d)
        c1 = torch.arange(b * hk + 1, dtype=torch.int32, device=dev)
        c2 = torch.arange(0, (b * hk + 1) * L, L, dtype=torch.int32, device=dev)
        for name, ext in (("heads_pow2", P), ("heads_full", C)):
            try:
                oh, r[name + "_first_ms"], r[name + "_builds"] = first(lambda: st.varlen_attention(qh, kh, vh, c1, c2, 1, ext))
                r[name + "_us"] = timeit(lambda: st.varlen_attention(qh, kh, vh, c1, c2, 1, ext))
                r[name + "_maxdiff"] = (oh.view(b, hq, 1, d).float() - o.float()).abs().max().item()
                r[name + "_bitexact"] = bool(torch.equal(oh.view(b, hq, 1, d), o))
            except Exception as e:
                r[name + "_error"] = repr(e)[:200]
        r["sdpa_us"] = timeit(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
        rows.append(r); print(json.dumps(r), flush=True)
# a decode loop of 1,000 growing lengths through the capacity view at power-of-two extents
b = 1; q = torch.randn(b, hq, 1, d, device=dev, dtype=dt)
kc, vc = (torch.randn(b, hk, C, d, device=dev, dtype=dt) for _ in range(2))
lq = torch.ones(b, dtype=torch.int32, device=dev)
b0 = _core.cache_info()["builds"]; torch.cuda.synchronize(); t = time.perf_counter()
for L in range(500, 1500):
    P = max(128, 1 << (L - 1).bit_length())
    st.attention(q, kc[:, :, :P], vc[:, :, :P], seqlens_q=lq, seqlens_kv=torch.full((b,), L, dtype=torch.int32, device=dev))
torch.cuda.synchronize()
loop = dict(steps=1000, builds=_core.cache_info()["builds"] - b0, seconds=time.perf_counter() - t)
b0 = _core.cache_info()["builds"]; t = time.perf_counter()
for L in range(500, 560):
    st.attention(q, kc[:, :, :L].contiguous(), vc[:, :, :L].contiguous())
torch.cuda.synchronize()
loop["exact_60_steps"] = dict(builds=_core.cache_info()["builds"] - b0, seconds=time.perf_counter() - t)
print(json.dumps(loop))
json.dump(dict(rows=rows, loop=loop, device=torch.cuda.get_device_name(), cudnn=torch.backends.cudnn.version()),
          open(sys.argv[1], "w"), indent=1)
