"""The constant c = traffic·M/(N²d²) under the `fit` policy and under `optimal` blocks, across M.

Algorithm 1 with the paper's blocks has c → 12 and the seed's swapped loop c → 8;
with free block shapes the FlashAttention loops reach about 6 and 4. Writes
docs/figures/optimal_constants.png and the numbers as experiments/results/optimal_constants.json, and prints the
table that docs/optimizer.md shows.

Usage: python -m experiments.optimal_constants [--figures docs/figures]
                                               [--json experiments/results/optimal_constants.json]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

import iosim  # noqa: E402
from experiments.figure_cli import run  # noqa: E402
from iosim.tilings.search import constant  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# The experiment, declared as data: the audit shape, M from the FlashAttention
# loops' smallest working set (4d + 7) to N·d.
CASE = dict(N=4096, d=64)
MS = [263, 527, 1000, 2048, 4096, 8192, 16_384, 32_768, 65_536, 100_000, 131_072, 262_144]
ALGOS = ("flash", "flash-swapped", "standard")
POLICIES = ("fit", "optimal")


def measure() -> list[dict]:
    rows = []
    for M in MS:
        row = dict(M=M)
        for algo in ALGOS:
            for policy in POLICIES:
                r = iosim.count(algo, **CASE, M=M, block_policy=policy)
                row[f"{algo} {policy}"] = dict(Br=r.tiling.Br, Bc=r.tiling.Bc, traffic=r.traffic.total,
                                               c=constant(r.problem, M, r.traffic.total))
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    head = "| M | flash `fit` | flash `optimal` | swapped `fit` | swapped `optimal` | standard `optimal` |"
    lines = [head, "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        cells = []
        for key in ("flash fit", "flash optimal", "flash-swapped fit", "flash-swapped optimal", "standard optimal"):
            x = row[key]
            cells.append(f"{x['Br']}×{x['Bc']}, {x['c']:.2f}")
        lines.append(f"| {row['M']:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def collect() -> dict:
    return dict(case=CASE, rows=measure())


def plot(data: dict) -> Figure:
    rows = data["rows"]
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    Ms = [r["M"] for r in rows]
    for i, algo in enumerate(ALGOS[:2]):
        for policy, style in zip(POLICIES, ("--o", "-o")):
            ax.plot(Ms, [r[f"{algo} {policy}"]["c"] for r in rows], style, color=f"C{i}", ms=3,
                    label=f"{algo}, {policy}")
    for level, text in ((12, "Alg. 1's 12"), (8, "swapped loop's 8"), (6, "6"), (4, "4")):
        ax.axhline(level, color="grey", lw=0.6, ls=":")
        ax.text(1.01, level, text, transform=ax.get_yaxis_transform(), fontsize=7, va="center", color="grey")
    d = CASE["d"]
    ax.axvline(d * d, color="k", lw=0.6)
    ax.annotate("M = d²", (d * d, 1), fontsize=8, ha="left")
    ax.set(xscale="log", ylim=(0, 18), xlabel="M (elements)", ylabel="c = traffic·M / (N²d²)",
           title=f"N = {CASE['N']}, d = {d}: the constant in front of N²d²/M")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def main(argv: Sequence[str] | None = None) -> None:
    print(table(run(__doc__, "optimal_constants", collect, plot, argv, dpi=120)["rows"]))


if __name__ == "__main__":
    main()
