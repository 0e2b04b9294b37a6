"""Where the eager backward's host time goes (issue 9; run 48 found fwd+bwd 559 us of host time per
transformers attention call against SDPA's 335, the forward alone 40 vs 58.5 us).

Host time per call, back to back on a tiny shape (the GPU never the bottleneck), of:
  1. stridedfa's backward C call alone (_core._backward_alloc), no autograd;
  2. torch's cuDNN SDPA backward op alone (aten._scaled_dot_product_cudnn_attention_backward);
  3. the forward C call alone (_core._forward_alloc) and torch's cuDNN forward op;
  4. fwd + bwd through autograd for both, with .grad set to None each time (no accumulation).
Run: PYTHONPATH=<installed wheel> python3 ci/results/next/probe_backward_host.py
"""
import time

import torch
import torch.nn.functional as F

import stridedfa.torch as st
from stridedfa import _core
from stridedfa._torch_ops import _contiguous

b, s, hq, hkv, d = 1, 128, 16, 16, 128
scale = d ** -0.5
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
           for h in (hq, hkv, hkv))
g = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16)


def host_us(fn, n=500):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / n * 1e6


out, lse = _core._forward_alloc(q, k, v, scale, True, "top_left", True, True, None, None, None, None, None, None,
                                None, 0.0, None)
print("ours forward C call:", round(host_us(lambda: _core._forward_alloc(
    q, k, v, scale, True, "top_left", True, True, None, None, None, None, None, None, None, 0.0, None)), 1), "us")
print("ours backward C call:", round(host_us(lambda: _core._backward_alloc(
    q, k, v, out, lse, g, scale, True, "top_left", _contiguous, True, None, None, None, None, None, False, None,
    False, None, 0.0, None)), 1), "us")

res = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True, False, scale=scale)
t_out, t_lse = res[0], res[1]
philox_seed, philox_offset = res[6], res[7]
print("torch cuDNN forward op:", round(host_us(lambda: torch.ops.aten._scaled_dot_product_cudnn_attention(
    q, k, v, None, True, 0.0, True, False, scale=scale)), 1), "us")
print("torch cuDNN backward op:", round(host_us(lambda: torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
    g, q, k, v, t_out, t_lse, philox_seed, philox_offset, None, None, None, s, s, 0.0, True, scale=scale)), 1),
      "us")

leaves = [t.detach().requires_grad_() for t in (q, k, v)]


def ours_step():
    for leaf in leaves:
        leaf.grad = None
    st.attention(*leaves, causal=True, scale=scale).backward(g)


def torch_step():
    for leaf in leaves:
        leaf.grad = None
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
        F.scaled_dot_product_attention(*leaves, is_causal=True, scale=scale).backward(g)


print("ours fwd+bwd autograd:", round(host_us(ours_step), 1), "us")
print("torch cuDNN fwd+bwd autograd:", round(host_us(torch_step), 1), "us")
