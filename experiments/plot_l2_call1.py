"""Call 1's forward DRAM reads against N: two-level count, L2-aware prediction, ncu measurement.

Usage: python -m experiments.plot_l2_call1 [--figures docs/figures] [--json experiments/results/l2_call1.json]

Issue 17, item 2's figure, for docs/gpu.md ("The L2 model: call 1's forward rows"). It runs
nothing: it reads the measured ncu ``dram__bytes_read.sum`` and the L2 model's prediction
(at the preset's effective capacity) from experiments/results/gpu/l2_call1.json, which
experiments/l2_call1.py wrote, and the two-level count (``iosim.count`` at the kernel's
tiles, ``simulated.read_bytes``) from experiments/results/gpu/ncu_traffic_call1.json, which
``ncu_traffic.py compare`` wrote; l2_call1.json does not carry the two-level count. Rows are
joined on (impl, direction, batch, heads, N_q, N_k, d), and the two files' measured bytes must
agree. One panel per (batch·heads, d), both loop orders in each: `flash` (one thread block
per batch·head) and `flash-swapped` (FlashAttention-2's order). Nothing in the prediction is
fitted to the measurements. The joined rows it plots are written to experiments/results/l2_call1.json.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from experiments.figure_cli import run  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.figure import Figure

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "experiments" / "results" / "gpu"
L2_JSON = RESULTS / "l2_call1.json"  # measured and L2-predicted bytes (experiments/l2_call1.py)
COUNT_JSON = RESULTS / "ncu_traffic_call1.json"  # the two-level count (ncu_traffic.py compare)
DEVICE = "H100 80GB HBM3 (SXM5, 132 SMs), call 1, float32, full attention"
MB = 1e6  # bytes; MB = 10⁶ B as in docs/gpu.md

IMPLS = {"flash": "tab:blue", "flash-swapped": "tab:orange"}  # the two loop orders
LOOP_ORDER = {"flash": "K/V outer, one thread block per batch·head",
              "flash-swapped": "Q outer, FlashAttention-2's order"}
# What each series is: the measurement as markers only, the two predictions as lines.
SERIES = {
    "count": dict(label="two-level count (iosim.count)", linestyle="--", marker="s", markersize=5,
                  markerfacecolor="none", linewidth=1.2),
    "pred": dict(label="L2-aware prediction (iosim.dram, not fitted)", linestyle="-", marker=".",
                 markersize=6, linewidth=2.0),
    "meas": dict(label="ncu measurement (dram__bytes_read.sum)", linestyle="none", marker="o",
                 markersize=10, markerfacecolor="none", markeredgewidth=1.8),
}


def key(row: dict) -> tuple:
    return (row["impl"], row["direction"], row["batch"], row["heads"], row["n_q"], row["n_k"], row["d"])


def collect() -> dict:
    """Call 1's forward rows (impl, batch·heads, N, d, the three read-byte numbers) and the L2 capacity used."""
    l2 = json.loads(L2_JSON.read_text())
    l2_rows = l2["rows"]
    counts = {key(r): r for r in json.loads(COUNT_JSON.read_text()) if r["direction"] == "forward"}
    rows = []
    for r in l2_rows:
        if r["direction"] != "forward":
            continue
        c = counts.get(key(r))
        if c is None:
            raise ValueError(f"{L2_JSON.name} row {key(r)} has no two-level count in {COUNT_JSON.name}")
        if c["measured"]["read_bytes"] != r["measured"]["read_bytes"]:
            raise ValueError(f"row {key(r)}: measured reads differ between {L2_JSON.name} "
                             f"({r['measured']['read_bytes']}) and {COUNT_JSON.name} ({c['measured']['read_bytes']})")
        rows.append({"impl": r["impl"], "bh": r["batch"] * r["heads"], "N": r["n_q"], "d": r["d"],
                     "count": c["simulated"]["read_bytes"], "pred": r["predicted"]["effective"]["reads"],
                     "meas": r["measured"]["read_bytes"]})
    return {"l2_effective": l2["l2_effective"], "rows": rows}


def plot(data: dict) -> Figure:
    rows, l2_effective = data["rows"], data["l2_effective"]
    bhs = sorted({r["bh"] for r in rows})
    ds = sorted({r["d"] for r in rows})
    fig, axes = plt.subplots(len(bhs), len(ds), figsize=(11, 8.6), squeeze=False)
    for i, bh in enumerate(bhs):
        for j, d in enumerate(ds):
            ax = axes[i][j]
            for impl, colour in IMPLS.items():
                pts = sorted((r for r in rows if r["impl"] == impl and r["bh"] == bh and r["d"] == d),
                             key=lambda r: r["N"])
                Ns = [r["N"] for r in pts]
                for name, style in SERIES.items():
                    kw = {k: v for k, v in style.items() if k != "label"}
                    if name == "pred" and impl == "flash":
                        # drawn wider, under flash-swapped's, so both show where they coincide
                        kw.update(linewidth=5.0, alpha=0.45)
                    ax.plot(Ns, [r[name] / MB for r in pts], color=colour, **kw)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            Ns = sorted({r["N"] for r in rows if r["bh"] == bh})
            ax.set_xticks(Ns, [f"{n:,}" for n in Ns])
            ax.set_xlim(Ns[0] / 1.4, Ns[-1] * 1.4)
            ax.grid(True, which="major", alpha=0.3)
            ax.set_title(f"batch·heads = {bh}, d = {d}", fontsize=11)
            ax.set_xlabel("sequence length N (tokens)")
            ax.set_ylabel("DRAM read bytes (MB)")
    series = [Line2D([], [], color="grey", **{k: v for k, v in s.items() if k != "label"}, label=s["label"])
              for s in SERIES.values()]
    fig.legend(handles=series, loc="lower center", ncol=3, fontsize=9.5, frameon=False,
               bbox_to_anchor=(0.5, 0.03))
    orders = [Line2D([], [], color=c, linewidth=6, label=f"{impl}: {LOOP_ORDER[impl]}") for impl, c in IMPLS.items()]
    fig.legend(handles=orders, loc="lower center", ncol=2, fontsize=9.5, frameon=False,
               bbox_to_anchor=(0.5, 0.0))
    fig.suptitle(f"Forward DRAM reads on {DEVICE}\n"
                 f"L2-aware prediction at the preset's effective {l2_effective / MB:g} MB L2, "
                 "not fitted to the measurements",
                 fontsize=11.5)
    fig.tight_layout(rect=(0, 0.085, 1, 0.95))
    return fig


def main(argv: Sequence[str] | None = None) -> None:
    run(__doc__, "l2_call1", collect, plot, argv)


if __name__ == "__main__":
    main()
