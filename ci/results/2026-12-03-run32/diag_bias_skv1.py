"""GPU run 31's one real fuzz failure: s_kv = 1, a (1, h, s_q, 1) bias and window=(1, 0) (rows
2.. see no key and are cut off): lse wrong by 2.4. Which part is at fault -- the cut, the bias'
row stride of one element, or s_kv = 1 itself? Each variant against torch's fp32 attention."""
import torch

import stridedfa


def reference(q, k, v, bias, seen):
    s = (q.float() @ k.float().transpose(-1, -2)) / q.shape[-1] ** 0.5 + (0 if bias is None else bias.float())
    s = s.masked_fill(~seen, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return p @ v.float(), lse


def case(name, s_q, s_kv, bias_shape, window=None, causal=False, alignment="top_left", h=6):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, h, s_q, 128, generator=gen, device="cuda").bfloat16()
    k = torch.randn(2, h, s_kv, 128, generator=gen, device="cuda").bfloat16()
    v = torch.randn(2, h, s_kv, 128, generator=gen, device="cuda").bfloat16()
    bias = None if bias_shape is None else torch.randn(*bias_shape, generator=gen, device="cuda").bfloat16()
    i = torch.arange(s_q, device="cuda")[:, None]
    j = torch.arange(s_kv, device="cuda")[None, :]
    off = s_kv - s_q if alignment == "bottom_right" else 0
    left, right = window if window is not None else (None, None)
    if causal:
        right = 0
    seen = torch.ones(s_q, s_kv, device="cuda", dtype=torch.bool)
    if left is not None:
        seen &= j >= i + off - left
    if right is not None:
        seen &= j <= i + off + right
    out = torch.full_like(q, float("nan"))
    lse = torch.full((2, h, s_q), float("nan"), device="cuda")
    try:
        stridedfa.sdpa_forward(q, k, v, out, lse=lse, bias=bias, window=window, causal=causal,
                               causal_alignment=alignment)
    except stridedfa.StridedFAError as e:
        print(f"{name:40s} refused: {type(e).__name__}: {str(e)[:150]}")
        return
    ref_out, ref_lse = reference(q, k, v, bias, seen)
    rows = seen.any(-1)
    out_err = (out.float() - ref_out).abs()[:, :, rows].max().item()
    lse_err = (lse - ref_lse)[:, :, rows].abs().max().item()
    print(f"{name:40s} out err {out_err:.3e}  lse err {lse_err:.3e}  rows seen {int(rows.sum())}/{s_q}")


torch.cuda.init()
case("A fuzz: skv1 bias(1,h,33,1) window(1,0)", 33, 1, (1, 6, 33, 1), window=(1, 0))
case("B skv1 bias(1,h,33,1) no mask", 33, 1, (1, 6, 33, 1))
case("C skv1 no bias window(1,0)", 33, 1, None, window=(1, 0))
case("D skv1 bias(2,h,33,1) window(1,0)", 33, 1, (2, 6, 33, 1), window=(1, 0))
case("E skv1 bias(1,h,33,1) causal_br", 33, 1, (1, 6, 33, 1), causal=True, alignment="bottom_right")
case("F skv8 bias(1,h,33,8) window(1,0)", 33, 8, (1, 6, 33, 8), window=(1, 0))
case("G skv1 bias(1,h,33,1) sq33 h1", 33, 1, (1, 1, 33, 1), window=(1, 0), h=1)
case("H skv1 bias(1,h,2,1) no mask sq2", 2, 1, (1, 6, 2, 1))
case("I skv1 bias strided heads (cut view)", 2, 1, None)
gen = torch.Generator(device="cuda").manual_seed(0)
big = torch.randn(1, 6, 33, 1, generator=gen, device="cuda").bfloat16()
q = torch.randn(2, 6, 2, 128, generator=gen, device="cuda").bfloat16()
k = torch.randn(2, 6, 1, 128, generator=gen, device="cuda").bfloat16()
v = torch.randn(2, 6, 1, 128, generator=gen, device="cuda").bfloat16()
for name, b in (("J bias view (1,6,2,1) strides (198,33,1,1)", big[:, :, :2]),
                ("K same values, contiguous", big[:, :, :2].contiguous())):
    out = torch.full_like(q, float("nan"))
    lse = torch.full((2, 6, 2), float("nan"), device="cuda")
    stridedfa.sdpa_forward(q, k, v, out, lse=lse, bias=b)
    ref_out, ref_lse = reference(q, k, v, b, torch.ones(2, 1, device="cuda", dtype=torch.bool))
    print(f"{name:40s} out err {(out.float() - ref_out).abs().max().item():.3e}  "
          f"lse err {(lse - ref_lse).abs().max().item():.3e}")
