"""Write every PNG of the documentation into docs/pages/img/ (a generated folder, not committed).

    python docs/make_figures.py [--out DIR]

Three kinds of pictures, none drawn by hand:

- masks and attention weights, computed by stridedfa's own NumPy reference (``stridedfa.reference``:
  ``visible_mask`` for which keys a query row sees, ``sdpa_forward`` for the weights of ALiBi and
  sinks), so they show the semantics the tests check cuDNN against;
- memory layouts, from NumPy views of ``arange`` buffers: every cell is labelled with the offset the
  view really reads, and the strides printed are those of the view;
- benchmark plots, read from the committed JSON under benchmarks/results/latest/ (each plot names
  its run and file).

Needs numpy, matplotlib and stridedfa's light import only: no GPU, no torch / CuPy / JAX, no network.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import benchmark_figures
import matplotlib.pyplot as plt
import numpy as np
from figure_style import OUT, PAD, PALETTE, QKV_COLORS, SEEN, UNSEEN, save
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch, Rectangle

from stridedfa import reference

# --- Masks, from the reference ---------------------------------------------------------------------

def draw_mask(ax, seen: np.ndarray, title: str, *, pad_rows=(), pad_cols=()) -> None:
    """A query-rows x key-columns grid: dark where the row sees the key."""
    s_q, s_kv = seen.shape
    img = np.where(seen, 2, 0)
    for i in pad_rows:
        img[i, :] = np.where(seen[i], 2, 1)
    for j in pad_cols:
        img[:, j] = np.where(seen[:, j], 2, 1)
    ax.imshow(img, cmap=ListedColormap([UNSEEN, PAD, SEEN]), vmin=0, vmax=2, interpolation="nearest")
    ax.set_xticks(np.arange(-0.5, s_kv, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, s_q, 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=1)
    ax.tick_params(which="minor", length=0)
    ax.set_xticks(range(s_kv))
    ax.set_yticks(range(s_q))
    ax.tick_params(labelsize=7)
    ax.set_xlabel("key j", fontsize=8)
    ax.set_ylabel("query i", fontsize=8)
    ax.set_title(title, fontsize=9)
    for i in range(s_q):
        if not seen[i].any():
            ax.text(s_kv - 0.5, i, "  no key", va="center", ha="left", fontsize=7, color="#c53030")


def mask(s_q, s_kv, **kw) -> np.ndarray:
    return reference.visible_mask(s_q, s_kv, **kw)[0, 0]


def legend(fig, extra=()):
    handles = [Patch(color=SEEN, label="seen"), Patch(color=UNSEEN, label="not seen"), *extra]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, -0.04))


def fig_causal(out):
    fig, axes = plt.subplots(2, 2, figsize=(8, 6.6))
    for row, (s_q, s_kv) in enumerate([(4, 8), (7, 4)]):
        for col, alignment in enumerate(["top_left", "bottom_right"]):
            draw_mask(axes[row, col], mask(s_q, s_kv, causal=True, causal_alignment=alignment),
                      f'causal=True, causal_alignment="{alignment}"\ns_q = {s_q}, s_kv = {s_kv}')
    fig.suptitle("Causal masks (stridedfa.reference.visible_mask)", fontsize=10)
    legend(fig)
    fig.tight_layout()
    save(fig, "mask_causal.png", out)


def fig_window(out):
    cases = [
        ("window=(2, 0)", dict(window=(2, 0))),
        ("causal=True, window=(2, None)", dict(causal=True, window=(2, None))),
        ("window=(1, 2)", dict(window=(1, 2))),
        ('window=(1, 1), "bottom_right"\ns_q = 5, s_kv = 8', dict(window=(1, 1), causal_alignment="bottom_right")),
    ]
    fig, axes = plt.subplots(1, 4, figsize=(13, 3.6))
    for ax, (title, kw) in zip(axes, cases):
        s_q, s_kv = (5, 8) if kw.get("causal_alignment") == "bottom_right" else (8, 8)
        draw_mask(ax, mask(s_q, s_kv, **kw), title)
    fig.suptitle("Sliding windows: row i sees key j iff i + off - left <= j <= i + off + right", fontsize=10)
    legend(fig)
    fig.tight_layout()
    save(fig, "mask_window.png", out)


def fig_padding(out):
    lengths_q, lengths_kv = np.array([6, 3]), np.array([6, 5])
    fig, axes = plt.subplots(2, 2, figsize=(8, 7))
    for col, alignment in enumerate(["top_left", "bottom_right"]):
        seen = reference.visible_mask(6, 6, causal=True, causal_alignment=alignment, seqlens_q=lengths_q,
                                      seqlens_kv=lengths_kv, b=2)
        for row in range(2):
            lq, lkv = int(lengths_q[row]), int(lengths_kv[row])
            draw_mask(axes[row, col], seen[row, 0],
                      f'batch {row}: seqlens_q = {lq}, seqlens_kv = {lkv}\ncausal, "{alignment}"',
                      pad_rows=range(lq, 6), pad_cols=range(lkv, 6))
    fig.suptitle("A padded batch (seqlens_q = [6, 3], seqlens_kv = [6, 5]); grey: padding", fontsize=10)
    legend(fig, [Patch(color=PAD, label="padding (never read; padded rows: out 0)")])
    fig.tight_layout()
    save(fig, "mask_padding.png", out)


def fig_mask_varlen(out):
    cu = [0, 3, 4, 9, 12]  # three documents packed along one token axis, then 2 tokens in no sequence
    total = 14
    seen = np.zeros((total, total), bool)
    for start, end in zip(cu[:-1], cu[1:]):
        seen[start:end, start:end] = mask(end - start, end - start, causal=True)
    fig, ax = plt.subplots(figsize=(5.4, 5.2))
    draw_mask(ax, seen, f"varlen (THD): cu_seqlens_q = cu_seqlens_kv = {cu}, causal=True\n"
                        f"{total} tokens; tokens {cu[-1]}..{total - 1} are in no sequence",
              pad_rows=range(cu[-1], total), pad_cols=range(cu[-1], total))
    for edge in cu[1:-1]:
        ax.axhline(edge - 0.5, color="#1a202c", linewidth=1.2)
        ax.axvline(edge - 0.5, color="#1a202c", linewidth=1.2)
    ax.set_xlabel("key token", fontsize=8)
    ax.set_ylabel("query token", fontsize=8)
    legend(fig, [Patch(color=PAD, label="in no sequence: out 0, lse -inf")])
    fig.tight_layout()
    save(fig, "mask_varlen.png", out)


def fig_paged(out):
    block, lengths, s_q = 4, [10, 6], 2
    table = [[5, 2, 7], [0, 3, 6]]
    num_blocks = 8
    fig = plt.figure(figsize=(11, 4.2))
    ax = fig.add_axes([0.03, 0.12, 0.42, 0.74])
    ax.set_xlim(-1.6, block + 3.2)
    ax.set_ylim(num_blocks - 0.5, -1.2)
    ax.axis("off")
    owner = {}
    for seq, ids in enumerate(table):
        for n, bid in enumerate(ids):
            owner[bid] = (seq, n)
    for bid in range(num_blocks):
        ax.text(-0.6, bid, f"block {bid}", ha="right", va="center", fontsize=8)
        seq, n = owner.get(bid, (None, None))
        for slot in range(block):
            pos = None if seq is None else n * block + slot
            used = seq is not None and pos < lengths[seq]
            color = PALETTE[seq] if used else (UNSEEN if seq is None else PAD)
            ax.add_patch(Rectangle((slot - 0.45, bid - 0.4), 0.9, 0.8, color=color))
            if used:
                ax.text(slot, bid, str(pos), ha="center", va="center", fontsize=7, color="white")
    ax.text(block / 2 - 0.5, -0.9, "k_cache (num_blocks, h_kv, block_size, d): token slots of each block",
            ha="center", fontsize=8)
    ax.text(block + 0.2, 3.5, "block_table =\n" + "\n".join(f"  seq {i}: {row}" for i, row in enumerate(table))
            + f"\nseqlens_kv = {lengths}", fontsize=8, va="center", family="monospace")
    for seq in range(2):
        ax2 = fig.add_axes([0.52 + seq * 0.25, 0.18, 0.2, 0.6])
        s_kv = len(table[seq]) * block
        seen = reference.visible_mask(s_q, s_kv, causal=True, causal_alignment="bottom_right",
                                      seqlens_kv=np.array([lengths[seq]]))[0, 0]
        draw_mask(ax2, seen, f"seq {seq}: {s_q} new queries,\ncache length {lengths[seq]}",
                  pad_cols=range(lengths[seq], s_kv))
        ax2.set_xticks(range(0, s_kv, 2))
        ax2.set_xlabel("logical key position", fontsize=8)
    fig.suptitle("A paged KV cache: block ids from block_table, causal bottom-right over each cached length",
                 fontsize=10)
    fig.legend(handles=[Patch(color=PALETTE[0], label="seq 0's tokens"),
                        Patch(color=PALETTE[1], label="seq 1's tokens"),
                        Patch(color=PAD, label="slot past the cached length (never read)"),
                        Patch(color=UNSEEN, label="block in no table row"), Patch(color=SEEN, label="seen")],
               loc="lower center", ncol=5, fontsize=8, frameon=False, bbox_to_anchor=(0.5, -0.02))
    save(fig, "mask_paged.png", out)


def weights(s_q, s_kv, h=1, **kw) -> np.ndarray:
    """Attention weights P of the reference with q = k = 0 (all scores 0) and v = identity: out = P."""
    q = np.zeros((1, h, s_q, 8))
    k = np.zeros((1, h, s_kv, 8))
    v = np.broadcast_to(np.eye(s_kv), (1, h, s_kv, s_kv))
    out, _ = reference.sdpa_forward(q, k, v, dtype=np.float64, **kw)
    return out[0]


def draw_weights(ax, p, title, vmax=None):
    im = ax.imshow(p, cmap="Blues", vmin=0, vmax=vmax or p.max(), interpolation="nearest")
    ax.set_xticks(range(p.shape[1]))
    ax.set_yticks(range(p.shape[0]))
    ax.tick_params(labelsize=7)
    ax.set_xlabel("key j", fontsize=8)
    ax.set_ylabel("query i", fontsize=8)
    ax.set_title(title, fontsize=9)
    for i in range(p.shape[0]):
        for j in range(p.shape[1]):
            if p[i, j] > 0.005:
                ax.text(j, i, f"{p[i, j]:.2f}", ha="center", va="center", fontsize=6,
                        color="white" if p[i, j] > 0.5 * (vmax or p.max()) else "#1a202c")
    return im


def fig_alibi(out):
    slopes = np.array([1.0, 0.25])
    p = weights(8, 8, h=2, causal=True, alibi_slopes=slopes)
    fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.9))
    for head, ax in enumerate(axes):
        im = draw_weights(ax, p[head], f"head {head}: alibi_slopes[{head}] = {slopes[head]}, causal=True", vmax=1)
    fig.colorbar(im, ax=axes, shrink=0.8, label="weight P[i, j]")
    fig.suptitle("ALiBi: scores -= slope * |i + off - j|; weights of the reference with equal raw scores", fontsize=10)
    save(fig, "weights_alibi.png", out)


def fig_sinks(out):
    sinks = np.array([-np.inf, 0.0, 2.0])
    p = weights(6, 6, h=3, causal=True, sinks=sinks)
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.9), gridspec_kw={"wspace": 0.55})
    for head, ax in enumerate(axes):
        share = 1 - p[head].sum(axis=1)
        im = draw_weights(ax, p[head], f"sinks[{head}] = {sinks[head]}", vmax=1)
        for i, x in enumerate(share):
            ax.text(p.shape[2] - 0.4, i, f" sink {x:.2f}", va="center", ha="left", fontsize=7, color="#c53030")
    fig.colorbar(im, ax=axes, shrink=0.8, label="weight P[i, j]")
    fig.suptitle("Sinks: exp(sink) joins each row's softmax denominator and attends to nothing "
                 "(causal, equal scores);\nred: the sink's share of each row, 1 - sum_j P[i, j]", fontsize=10)
    save(fig, "weights_sinks.png", out)


def fig_bias(out):
    s_q, s_kv = 6, 8
    key_mask = np.zeros((1, 1, 1, s_kv))
    key_mask[..., 5:] = -np.inf  # a key-padding mask as a bias: (b, 1, 1, s_kv), shared by heads and rows
    i, j = np.arange(s_q)[:, None], np.arange(s_kv)[None, :]
    relative = (-0.5 * np.abs(i - j))[None, None]  # a relative-position bias: (1, 1, s_q, s_kv)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    im = draw_weights(axes[0], weights(s_q, s_kv, bias=key_mask)[0],
                      "bias (1, 1, 1, 8): 0, or -inf for keys 5..7", vmax=1)
    draw_weights(axes[1], weights(s_q, s_kv, bias=relative)[0], "bias (1, 1, 6, 8): -0.5 * |i - j|", vmax=1)
    fig.colorbar(im, ax=axes, shrink=0.8, label="weight P[i, j]")
    fig.suptitle("An additive bias, broadcast to (b, h, s_q, s_kv); weights of the reference with equal raw scores",
                 fontsize=10)
    save(fig, "weights_bias.png", out)


def fig_softcap(out):
    x = np.linspace(-120, 120, 481)
    fig, ax = plt.subplots(figsize=(5.6, 3.4))
    ax.plot(x, x, color="#a0aec0", linestyle="--", label="no softcap")
    for cap, color in ((50.0, PALETTE[0]), (30.0, PALETTE[1])):
        ax.plot(x, cap * np.tanh(x / cap), color=color, label=f"softcap = {cap:g}")
    ax.set_xlabel("scale * q . k")
    ax.set_ylabel("score before bias and mask")
    ax.set_title("softcap: c * tanh(s / c), applied before bias, ALiBi and the mask", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save(fig, "softcap.png", out)


# --- Memory layouts, from NumPy views --------------------------------------------------------------

def elem_strides(view: np.ndarray) -> tuple[int, ...]:
    return tuple(s // view.itemsize for s in view.strides)


def fig_packed_qkv(out):
    b, s, h, d = 1, 3, 2, 4
    mem = np.arange(b * s * 3 * h * d).reshape(b, s, 3, h, d)  # the value of each element is its offset
    views = {name: mem[:, :, i].transpose(0, 2, 1, 3) for i, name in enumerate("qkv")}  # (b, h, s, d)
    row = 3 * h * d
    fig = plt.figure(figsize=(12, 6.4))
    ax = fig.add_axes([0.04, 0.5, 0.92, 0.38])
    ax.set_xlim(-0.6, row)
    ax.set_ylim(s - 0.4, -0.9)
    ax.axis("off")
    for name, view in views.items():
        for hh in range(h):
            for ss in range(s):
                for dd in range(d):
                    off = int(view[0, hh, ss, dd])
                    r, c = divmod(off, row)
                    ax.add_patch(Rectangle((c, r - 0.3), 0.92, 0.6, color=QKV_COLORS[name][hh]))
                    ax.text(c + 0.46, r, str(off), ha="center", va="center", fontsize=6.5)
                ax.text(int(view[0, hh, ss, 0]) % row + d / 2, ss - 0.33, f"{name} h{hh}", ha="center",
                        va="bottom", fontsize=7)
    for ss in range(s):
        ax.text(-0.2, ss, f"s={ss}", ha="right", va="center", fontsize=8)
    ax.set_title(f"One packed projection buffer [b, s, 3, h, d] = {list(mem.shape)}, strides "
                 f"{elem_strides(mem)} (elements); one row per token, cells labelled with their offset",
                 fontsize=9)
    for n, (name, view) in enumerate(views.items()):
        axv = fig.add_axes([0.05 + n * 0.32, 0.04, 0.27, 0.36])
        flat = view[0].reshape(h * s, d)
        axv.set_xlim(-0.5, d - 0.5)
        axv.set_ylim(h * s - 0.5, -0.5)
        axv.set_xticks(range(d))
        axv.set_yticks(range(h * s))
        axv.set_yticklabels([f"h{i // s} s{i % s}" for i in range(h * s)], fontsize=7)
        axv.tick_params(labelsize=7)
        for r in range(h * s):
            for c in range(d):
                axv.add_patch(Rectangle((c - 0.46, r - 0.42), 0.92, 0.84, color=QKV_COLORS[name][r // s]))
                axv.text(c, r, str(int(flat[r, c])), ha="center", va="center", fontsize=7)
        axv.set_xlabel("head_dim", fontsize=8)
        offset = int(view[0, 0, 0, 0])
        axv.set_title(f"{name} = qkv[:, :, {n}].transpose(1, 2)\nlogical (b, h, s, d) {tuple(view.shape)}, "
                      f"strides {elem_strides(view)}, offset {offset}", fontsize=8)
    save(fig, "layout_packed_qkv.png", out)


def fig_orders(out):
    b, h, s, d = 2, 2, 3, 2
    cases = {
        "bhsd: torch.empty(b, h, s, d)": np.arange(b * h * s * d).reshape(b, h, s, d),
        "bshd: torch.empty(b, s, h, d).transpose(1, 2)":
            np.arange(b * s * h * d).reshape(b, s, h, d).transpose(0, 2, 1, 3),
        "sbhd: torch.empty(s, b, h, d).permute(1, 2, 0, 3)":
            np.arange(s * b * h * d).reshape(s, b, h, d).transpose(1, 2, 0, 3),
    }
    n = b * h * s * d
    fig, axes = plt.subplots(len(cases), 1, figsize=(12, 4.6))
    for ax, (title, view) in zip(axes, cases.items()):
        ax.set_xlim(-0.5, n)
        ax.set_ylim(1.1, -0.6)
        ax.axis("off")
        for bb in range(b):
            for hh in range(h):
                for ss in range(s):
                    for dd in range(d):
                        off = int(view[bb, hh, ss, dd])
                        color = PALETTE[bb * h + hh]
                        ax.add_patch(Rectangle((off, -0.4), 0.92, 0.8, color=color, alpha=0.35 + 0.65 * (dd == 0)))
                        if dd == 0:
                            ax.text(off + 0.46, 0, f"s{ss}", ha="center", va="center", fontsize=7)
        ax.set_title(f"{title}: logical (b, h, s, d) {tuple(view.shape)}, strides {elem_strides(view)}",
                     fontsize=9, loc="left")
    handles = [Patch(color=PALETTE[bb * h + hh], label=f"b{bb} h{hh}") for bb in range(b) for hh in range(h)]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle("One logical tensor, three memory orders: only the strides differ "
                 "(memory offsets left to right; each token's head_dim row of 2)", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    save(fig, "layout_orders.png", out)


def fig_thd(out):
    cu = [0, 3, 4, 7]
    total, h, d = 7, 2, 2
    mem = np.arange(total * 3 * h * d).reshape(total, 3, h, d)
    q = mem[:, 0]
    row = 3 * h * d
    fig, ax = plt.subplots(figsize=(9, 4.2))
    ax.set_xlim(-2.2, row)
    ax.set_ylim(total - 0.4, -1.2)
    ax.axis("off")
    for t in range(total):
        doc = int(np.searchsorted(cu, t, side="right")) - 1
        ax.text(-0.3, t, f"token {t} (doc {doc})", ha="right", va="center", fontsize=8, color=PALETTE[doc])
        for i, name in enumerate("qkv"):
            for hh in range(h):
                for dd in range(d):
                    off = int(mem[t, i, hh, dd])
                    ax.add_patch(Rectangle((off % row, t - 0.4), 0.92, 0.8, color=QKV_COLORS[name][hh]))
                    ax.text(off % row + 0.46, t, f"{name}{hh}", ha="center", va="center", fontsize=6)
    for edge in cu[1:-1]:
        ax.axhline(edge - 0.5, color="#1a202c", linewidth=1.2)
    ax.set_title(f"THD: documents packed along one token axis, cu_seqlens = {cu}\n"
                 f"projection (total, 3, h, d) = {mem.shape}, strides {elem_strides(mem)}; "
                 f"q = proj[:, 0]: (total, h, d), strides {elem_strides(q)}", fontsize=9)
    fig.tight_layout()
    save(fig, "layout_thd.png", out)


FIGURES = [fig_causal, fig_window, fig_padding, fig_mask_varlen, fig_paged, fig_alibi, fig_sinks, fig_bias, fig_softcap,
           fig_packed_qkv, fig_orders, fig_thd, *benchmark_figures.FIGURES]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"output folder (default {OUT})")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for figure in FIGURES:
        figure(args.out)


if __name__ == "__main__":
    main()
