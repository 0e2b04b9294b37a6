"""GPU run 35c diagnostic: which THD operand layouts cuDNN 9.19 addresses right. Each operand in
turn gets a non-default token stride (a slice of a (T, 3, h, d) buffer) or a head-major layout,
the others stay contiguous; out, lse and the gradients are compared with the all-contiguous call."""
import torch

import stridedfa

torch.manual_seed(0)
cu_list = [0, 1, 38, 138, 138, 202, 292]
cu = torch.tensor(cu_list, dtype=torch.int32, device="cuda")
T = cu_list[-1]


def layout(x, kind):
    t, h, d = x.shape
    if kind == "tok3":
        buf = torch.zeros(t, 3, h, d, dtype=x.dtype, device="cuda")
        buf[:, 1] = x
        return buf[:, 1]
    if kind == "head_major":
        return x.transpose(0, 1).contiguous().transpose(0, 1)
    return x


def run(ops, h_kv_ratio):
    q, k, v, go = ops["q"], ops["k"], ops["v"], ops["grad_out"]
    out = layout(torch.full_like(ops["q"].contiguous(), float("nan")), ops["_out"])
    lse = torch.full((T, q.shape[1]), float("nan"), device="cuda").t()
    stridedfa.sdpa_forward(q, k, v, out, lse=lse, cu_seqlens_q=cu, cu_seqlens_kv=cu, causal=True)
    grads = [layout(torch.full_like(t.contiguous(), float("nan")), ops["_" + n]) for n, t in
             (("grad_q", q), ("grad_k", k), ("grad_v", v))]
    stridedfa.sdpa_backward(q, k, v, out, go, lse, *grads, cu_seqlens_q=cu, cu_seqlens_kv=cu, causal=True)
    return [out, lse] + grads


def diff(a, b):
    a, b = a.float(), b.float()
    bad = ~((a == b) | (torch.isnan(a) & torch.isnan(b)))
    return f"{int(bad.sum())}/{a.numel()} max {((a - b).abs().nan_to_num(99)).max().item():.3g}"


for h_q, h_kv, d in ((4, 4, 64), (8, 8, 64), (8, 2, 64), (8, 8, 128)):
    base = {"q": torch.randn(T, h_q, d), "k": torch.randn(T, h_kv, d), "v": torch.randn(T, h_kv, d),
            "grad_out": torch.randn(T, h_q, d)}
    base = {n: t.to("cuda", torch.bfloat16) for n, t in base.items()}
    plain = dict(base, _out="thd", _grad_q="thd", _grad_k="thd", _grad_v="thd")
    try:
        ref = run(plain, h_q // h_kv)
    except Exception as e:
        print(h_q, h_kv, d, "contiguous failed:", type(e).__name__, str(e)[:150])
        continue
    for name in ("q", "k", "v", "grad_out", "_out", "_grad_q", "_grad_k", "_grad_v"):
        for kind in ("tok3", "head_major"):
            ops = dict(plain)
            if name.startswith("_"):
                ops[name] = kind
            else:
                ops[name] = layout(base[name], kind)
            try:
                got = run(ops, h_q // h_kv)
                report = " ".join(f"{n}={diff(a, b)}" for n, a, b in
                                  zip(("out", "lse", "dq", "dk", "dv"), got, ref) if diff(a, b)[0] != "0")
                print(f"h {h_q}/{h_kv} d {d} {name:9s} {kind:10s}: {report or 'all bit-exact'}")
            except Exception as e:
                print(f"h {h_q}/{h_kv} d {d} {name:9s} {kind:10s}: {type(e).__name__}: {str(e)[:120]}")
