"""Variable-length (THD) training step: stridedfa.torch.varlen_attention against the padded batch.

One causal fwd+bwd over a batch of documents (lengths uniform in [64, 4096], 16k tokens, about
half the padded batch is padding), side by side in one run:
  - stridedfa_thd: varlen_attention on the packed tokens (cu_seqlens, max_seqlen None);
  - stridedfa_thd_max: the same with max_seqlen given (the longest document);
  - stridedfa_padded: attention() on the padded (b, h, s_max, d) batch with seqlens_q/kv;
  - stridedfa_padded_full: the same without lengths, every padded position computed;
  - torch_sdpa_padded: torch SDPA (cuDNN backend, is_causal) on the padded batch, padding computed;
  - torch_varlen_attn: torch.nn.attention.varlen.varlen_attn, where the installed torch has it;
  - documents_alone_sum: each document alone, a dense causal step at its own length, summed.
Reports ms per step, the ratio to torch SDPA padded (target >= 1.6x faster) and to the
FLOP-proportional ideal (stridedfa_padded_full scaled by the documents' share of the padded causal
FLOPs; target within 10%), and THD against the documents alone (vs_documents_alone): the ideal that
allows for short documents running at lower TFLOP/s than long ones. A script, never a test.

    python benchmarks/bench_varlen.py --out bench-out [--quick]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch
import torch.nn.functional as F
from provenance import provenance

import stridedfa
import stridedfa.torch as st


def documents(total, low, high, seed):
    rng = random.Random(seed)
    lengths, left = [], total
    while left > 0:
        n = min(rng.randint(low, high), left)
        lengths.append(n)
        left -= n
    return lengths


def timed(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def plot(result, path):
    """ms per training step of each contender, with the FLOP-proportional ideal and the 1.6x target
    drawn in."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {name: t for name, t in result["ms_per_step"].items() if isinstance(t, float)}
    names = sorted(rows, key=rows.get)
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(names) + 1.8))
    ax.barh(names, [rows[n] for n in names],
            color=["tab:orange" if n.startswith("torch") else "tab:blue" for n in names])
    ideal = rows["stridedfa_padded_full"] * result["config"]["useful_flop_share"]
    ax.axvline(ideal, color="tab:green", linestyle="--", label="FLOP-proportional ideal")
    ax.axvline(rows["torch_sdpa_padded"] / 1.6, color="tab:red", linestyle=":", label="target: 1.6x torch SDPA padded")
    ax.set_xlabel("ms per causal fwd+bwd step (median)")
    config = result["config"]
    ax.set_title(f"Varlen training step: {config['tokens']} tokens, {config['documents']} documents, h "
                 f"{config['heads']}, d {config['dim']} -- {config['device']}", fontsize=9)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _dense_step(n, h, d):
    """One document of n tokens alone: a dense causal forward + backward at its own length."""
    q, k, v = (torch.randn(1, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad = torch.randn(1, h, n, d, device="cuda", dtype=torch.bfloat16)

    def step():
        st.attention(q, k, v, causal=True).backward(grad)
    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="bench-out")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--plot", metavar="JSON", help="only render the PNG next to an earlier varlen.json")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=16384)
    args = parser.parse_args()
    if args.plot:
        plot(json.loads(Path(args.plot).read_text()), Path(args.plot).with_suffix(".png"))
        return
    warmup, iters = (3, 10) if args.quick else (10, 50)
    h, d, total = args.heads, args.dim, args.tokens
    lengths = documents(total, 64, 4096, seed=0)
    b, s_max = len(lengths), max(lengths)
    dt, dev = torch.bfloat16, "cuda"
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=dev)
    q, k, v = (torch.randn(total, h, d, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
    grad = torch.randn(total, h, d, device=dev, dtype=dt)
    qp, kp, vp = (torch.randn(b, h, s_max, d, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
    gradp = torch.randn(b, h, s_max, d, device=dev, dtype=dt)

    def thd(max_seqlen=None):
        out = st.varlen_attention(q, k, v, cu, cu, max_seqlen, max_seqlen, causal=True)
        out.backward(grad)

    def padded():
        out = st.attention(qp, kp, vp, causal=True, seqlens_q=seqlens, seqlens_kv=seqlens)
        out.backward(gradp)

    def padded_full():  # every padded position computed: the FLOP-ideal's base
        out = st.attention(qp, kp, vp, causal=True)
        out.backward(gradp)

    def sdpa_padded():
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            out = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True)
        out.backward(gradp)

    rows = {"stridedfa_thd": timed(thd, warmup, iters),
            "stridedfa_thd_max": timed(lambda: thd(s_max), warmup, iters),
            "stridedfa_padded": timed(padded, warmup, iters),
            "stridedfa_padded_full": timed(padded_full, warmup, iters),
            "torch_sdpa_padded": timed(sdpa_padded, warmup, iters)}
    try:
        from torch.nn.attention.varlen import varlen_attn

        # torch 2.10 says causal with is_causal, later ones with window_size (-1, 0); the signature
        # is not always inspectable (wrapped), so the call itself decides
        causal = {"window_size": (-1, 0)}
        try:
            varlen_attn(q, k, v, cu, cu, s_max, s_max, **causal)
        except TypeError:
            causal = {"is_causal": True}

        def torch_varlen():
            out = varlen_attn(q, k, v, cu, cu, s_max, s_max, **causal)
            out.backward(grad)

        rows["torch_varlen_attn"] = timed(torch_varlen, warmup, iters)
    except Exception as error:  # not in this torch, or it refuses the call
        rows["torch_varlen_attn"] = f"unavailable: {type(error).__name__}: {error}"[:200]
    # causal FLOPs grow with L (L + 1) / 2 per document: the documents' share of the padded batch's;
    # the ideal is the fully computed padded batch's time scaled by that share
    useful = sum(n * (n + 1) / 2 for n in lengths) / (b * s_max * (s_max + 1) / 2)
    ideal = rows["stridedfa_padded_full"] * useful
    # That ideal assumes a short document runs at a long one's TFLOP/s. The length-aware ideal: each
    # document alone, dense at its own length (the same kernels, each sized to its document), summed.
    rows["documents_alone_sum"] = sum(timed(_dense_step(n, h, d), warmup, iters) for n in lengths)
    result = {"provenance": provenance(stridedfa),
              "config": {"heads": h, "dim": d, "tokens": total, "documents": b, "longest": s_max,
                         "padding_share": 1 - total / (b * s_max), "useful_flop_share": useful,
                         "dtype": "bfloat16", "causal": True, "device": torch.cuda.get_device_name()},
              "ms_per_step": rows,
              "speedup_vs_torch_sdpa_padded": {name: rows["torch_sdpa_padded"] / t for name, t in rows.items()
                                               if isinstance(t, float)},
              "vs_flop_ideal": {name: t / ideal for name, t in rows.items() if isinstance(t, float)},
              "vs_documents_alone": rows["stridedfa_thd"] / rows["documents_alone_sum"],
              "targets": {"thd >= 1.6x torch SDPA padded": rows["torch_sdpa_padded"] / rows["stridedfa_thd"] >= 1.6,
                          "thd within 10% of the FLOP ideal": rows["stridedfa_thd"] <= 1.1 * ideal}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "varlen.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    try:
        plot(result, out / "varlen.png")
    except ImportError:  # no matplotlib here: render later with --plot
        pass


if __name__ == "__main__":
    main()
