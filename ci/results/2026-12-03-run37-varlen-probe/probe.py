"""Which THD operand layouts cuDNN 9.19's variable-length kernels get right (GPU run 37 probe).

Each case runs in a child process (a crash there loses only that child's CUDA context): one operand
-- an input (q, k, v, grad_out) or an output the caller lays out (out, grad_q, grad_k, grad_v) --
in a non-default layout, every other one contiguous; the same call on contiguous copies must give
the same bits. Prints one JSON line per case.

    python probe.py            # every case, 4 children at a time
    python probe.py CASE H_Q H_KV   # one case (the child)
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

PORTS = ["q", "k", "v", "grad_out", "out", "grad_q", "grad_k", "grad_v"]
LAYOUTS = ["head_major", "padded_rows", "wide_rows"]  # wide: a (tokens, 3 h, d) row, as a qkv view


def child(case: str, h_q: int, h_kv: int) -> None:
    import torch

    import stridedfa

    gen = torch.Generator(device="cuda").manual_seed(5)
    lengths = torch.randint(0, 151, (6,), generator=torch.Generator().manual_seed(2)).tolist()
    lengths[0], lengths[-1] = 1, 0
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    total, d = int(cu[-1]) + 5, 64
    port, _, layout = case.partition(":")

    def make(tokens, heads, name):
        kind = layout if name == port else "thd"
        if kind == "head_major":
            t = torch.empty(heads, tokens, d, device="cuda", dtype=torch.bfloat16).transpose(0, 1)
        elif kind == "padded_rows":
            t = torch.empty(tokens, heads + 1, d, device="cuda", dtype=torch.bfloat16)[:, :heads]
        elif kind == "wide_rows":
            t = torch.empty(tokens, 3 * heads, d, device="cuda", dtype=torch.bfloat16)[:, :heads]
        else:
            t = torch.empty(tokens, heads, d, device="cuda", dtype=torch.bfloat16)
        return t

    def fill(t):
        t.copy_(torch.randn(t.shape, generator=gen, device="cuda"))
        return t

    if port == "interleaved":  # q, k, v (and with :grads their gradients) views of one buffer
        qkv = fill(torch.empty(total, 3, h_q, d, device="cuda", dtype=torch.bfloat16))
        q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
        grad_out = fill(make(total, h_q, "grad_out"))
    else:
        q, k, v = (fill(make(total, h, name)) for name, h in (("q", h_q), ("k", h_kv), ("v", h_kv)))
        grad_out = fill(make(total, h_q, "grad_out"))

    def run(q, k, v, grad_out, laid_out):
        out = (make if laid_out else lambda t, h, n: torch.empty(t, h, d, device="cuda", dtype=torch.bfloat16))(
            total, h_q, "out").fill_(float("nan"))
        lse = torch.full((total, h_q), float("nan"), device="cuda").t()
        common = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu, causal=True)
        stridedfa.sdpa_forward(q, k, v, out, lse=lse, **common)
        if port == "interleaved" and layout == "grads" and laid_out:
            g = torch.full((total, 3, h_q, d), float("nan"), device="cuda", dtype=torch.bfloat16)
            grads = [g[:, 0], g[:, 1], g[:, 2]]
        else:
            grads = [(make if laid_out else lambda t, h, n: torch.empty(t, h, d, device="cuda",
                                                                          dtype=torch.bfloat16))(
                total, h, name).fill_(float("nan")) for name, h in (("grad_q", h_q), ("grad_k", h_kv),
                                                                     ("grad_v", h_kv))]
        stridedfa.sdpa_backward(q, k, v, out, grad_out, lse, *grads, **common)
        torch.cuda.synchronize()
        return [out, lse, *grads]

    try:
        viewed = run(q, k, v, grad_out, True)
    except stridedfa.StridedFAError as error:
        print(json.dumps({"case": case, "heads": [h_q, h_kv], "refused": f"{type(error).__name__}: {error}"[:160]}))
        return
    copied = run(q.contiguous(), k.contiguous(), v.contiguous(), grad_out.contiguous(), False)
    result = {"case": case, "heads": [h_q, h_kv]}
    for name, a, b in zip(["out", "lse", "grad_q", "grad_k", "grad_v"], viewed, copied):
        a, b = a.float(), b.float()
        same = torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
        result[name] = "same" if same else f"differs max {float((a - b).abs().nan_to_num(1e9).max()):.3g}"
    print(json.dumps(result))


def main() -> None:
    cases = [f"{p}:{lay}" for p in PORTS for lay in LAYOUTS] + ["interleaved:inputs", "interleaved:grads"]
    jobs = [(c, hq, hkv) for hq, hkv in ((4, 4), (8, 2)) for c in cases if not (c.startswith("interleaved")
                                                                               and hq != hkv)]

    def one(job):
        c, hq, hkv = job
        p = subprocess.run([sys.executable, __file__, c, str(hq), str(hkv)], capture_output=True, text=True,
                           timeout=120)
        if p.returncode != 0:
            tail = (p.stderr.strip().splitlines() or ["?"])[-1][:200]
            return json.dumps({"case": c, "heads": [hq, hkv], "crashed": p.returncode, "stderr": tail})
        return p.stdout.strip().splitlines()[-1]

    with ThreadPoolExecutor(4) as pool:
        for line in pool.map(one, jobs):
            print(line, flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 4:
        child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
    else:
        main()
