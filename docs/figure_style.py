"""What every documentation figure shares: where files are, the colours, how a figure is saved."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "latest"  # the latest result of each benchmark
OUT = Path(__file__).resolve().parent / "pages" / "img"

SEEN, UNSEEN, PAD = "#2b6cb0", "#edf2f7", "#cbd5e0"
QKV_COLORS = {"q": ("#3182ce", "#90cdf4"), "k": ("#dd6b20", "#fbd38d"), "v": ("#38a169", "#9ae6b4")}
PALETTE = ["#3182ce", "#dd6b20", "#38a169", "#805ad5", "#d53f8c", "#718096"]


def save(fig, name: str, out: Path) -> None:
    fig.savefig(out / name, dpi=110, bbox_inches="tight")
    plt.close(fig)
    print(f"wrote {out / name}")
