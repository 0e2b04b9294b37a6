import sys, torch
sys.path.insert(0, sys.argv[1] + "/tests")
import stridedfa.torch as st
from helpers.torch_ref import torch_reference
torch.manual_seed(0)
for s in (96, 208, 512):
    for window in (None, (5, 0)):
        for sinks_on in (False, True):
            for b in (1, 3):
                d = 32
                q = torch.randn(b, s, 4, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
                k = torch.randn(b, s, 2, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
                v = torch.randn(b, s, 2, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
                sinks = torch.randn(4, device="cuda", dtype=torch.bfloat16).requires_grad_() if sinks_on else None
                out = st.attention(q, k, v, causal=True, causal_alignment="bottom_right", window=window,
                                   sinks=None if sinks is None else sinks.float())
                ref, _ = torch_reference(q, k, v, causal=True, alignment="bottom_right", window=window,
                                         sinks=None if sinks is None else sinks.float())
                err = (out.float() - ref).abs().max().item()
                where = ((out.float() - ref).abs() > 0.05).nonzero()[:3].tolist()
                print(f"b={b} s={s} window={window} sinks={sinks_on}: max err {err:.4f}", "BAD" if err > 0.05 else "", where)
