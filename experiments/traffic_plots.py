"""Figures of HBM traffic: against N at fixed M, and against M (down to M < d²) at fixed N.

Points are the simulator's count-only measurements; lines are the exact closed forms
and, dashed, the paper's asymptotic forms. Writes docs/figures/traffic_vs_N.png and
docs/figures/traffic_vs_M.png, and the data as experiments/results/traffic.json.

Usage: python -m experiments.traffic_plots [--figures docs/figures] [--json experiments/results/traffic.json]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

import iosim  # noqa: E402
from experiments.figure_cli import run  # noqa: E402
from iosim.core.problem import AttentionShape, Problem  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def smallest_M(N: int, d: int) -> int:
    """The least M at which every algorithm runs: the largest working set with 1 × 1 blocks."""
    pb = Problem(AttentionShape(1, 1, N, N, d), tau=1.0)
    return max(iosim.ALGORITHMS[a].working_set(pb, iosim.Tiling(1, 1), 0) for a in DENSE)


# The algorithms plotted: the block-sparse ones need a block mask and without one repeat flash.
DENSE = [name for name, a in iosim.ALGORITHMS.items() if a.listed_by_default(())]  # no block mask to use
# The experiments, declared as data.
VS_N = dict(M=100_000, ds=(64, 128), Ns=[2**e for e in range(8, 17)])
VS_M = dict(N=4096, d=64, Ms=[smallest_M(4096, 64) * 2**e for e in range(0, 10)] + [262_144])
COLORS = {name: f"C{i}" for i, name in enumerate(DENSE)}


def measure(algorithm: str, N: int, d: int, M: int) -> dict:
    c = iosim.count(algorithm, N=N, d=d, M=M)
    p = iosim.predict(algorithm, N=N, d=d, M=M)
    return dict(algorithm=algorithm, N=N, d=d, M=M, Br=c.tiling.Br, Bc=c.tiling.Bc, measured=c.traffic.total,
                predicted=p.exact.total, paper=p.paper)


def collect() -> dict:
    """Every point of both figures: against N for each d, then against M."""
    vs_N = [measure(algo, N, d, VS_N["M"]) for d in VS_N["ds"] for algo in DENSE for N in VS_N["Ns"]]
    vs_M = [measure(algo, VS_M["N"], VS_M["d"], M) for algo in DENSE for M in VS_M["Ms"]]
    return {"vs_N": vs_N, "vs_M": vs_M}


def plot_vs_N(rows: list[dict]) -> Figure:
    fig, axes = plt.subplots(1, len(VS_N["ds"]), figsize=(11, 4.2), sharey=True)
    for ax, d in zip(axes, VS_N["ds"]):
        for algo in DENSE:
            pts = [p for p in rows if p["d"] == d and p["algorithm"] == algo]
            Ns = [p["N"] for p in pts]
            ax.plot(Ns, [p["predicted"] for p in pts], "-", color=COLORS[algo], lw=1.2, label=f"{algo} exact")
            ax.plot(Ns, [p["measured"] for p in pts], "o", color=COLORS[algo], ms=4, label=f"{algo} measured")
            ax.plot(Ns, [p["paper"] for p in pts], "--", color=COLORS[algo], lw=0.8, alpha=0.7,
                    label=f"{algo} paper's form")
        ax.set(xscale="log", yscale="log", xlabel="N", title=f"d = {d}, M = {VS_N['M']:,} elements")
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_ylabel("HBM traffic (elements, one head)")
    axes[0].legend(fontsize=7, ncol=1)
    fig.tight_layout()
    return fig


def plot_vs_M(rows: list[dict]) -> Figure:
    N, d = VS_M["N"], VS_M["d"]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for algo in DENSE:
        pts = [p for p in rows if p["algorithm"] == algo]
        Ms = [p["M"] for p in pts]
        ax.plot(Ms, [p["measured"] for p in pts], "o-", color=COLORS[algo], ms=4, label=f"{algo} measured = exact")
        if not iosim.ALGORITHMS[algo].baseline:
            ax.plot(Ms, [p["paper"] for p in pts], "--", color=COLORS[algo], lw=0.8, label=f"{algo} paper's form")
    ax.axvline(d * d, color="gray", lw=0.8, ls=":")
    ax.text(d * d * 1.05, ax.get_ylim()[0] * 3, "M = d²", color="gray", fontsize=8)
    ax.set(xscale="log", yscale="log", xlabel="M (elements)", ylabel="HBM traffic (elements, one head)",
           title=f"N = {N}, d = {d}: traffic against SRAM size")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot(data: dict) -> dict[str, Figure]:
    return {"traffic_vs_N": plot_vs_N(data["vs_N"]), "traffic_vs_M": plot_vs_M(data["vs_M"])}


def main(argv: Sequence[str] | None = None) -> None:
    run(__doc__, "traffic", collect, plot, argv, dpi=120)


if __name__ == "__main__":
    main()
