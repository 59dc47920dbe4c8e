"""Two sawtooth orders against the plain one, on the H100 and the GB10 presets: the L2 model's K/V DRAM reads.

The sawtooth order of arXiv 2601.16032 (FlashAttention on GB10) belongs to a persistent kernel: each CTA takes tile
after tile and alternates the direction of its K/V scan from one tile to the next, so a whole wave scans one way and
the next wave the other (``iosim.gpu.grids.persistent``). kernels/flash_swapped.py's ``sawtooth`` reverses the odd
query blocks of each head instead, in a dispatched grid (``iosim.gpu.grids.flash_swapped.forward``). This script
runs both, and the plain order, through the lockstep schedule at one head, float16, d = 128, tiles of 64 × 64 (as
experiments/sawtooth.py), 2 CTAs per SM (the occupancy of FlashAttention-2's forward, iosim/gpu/grids/sdpa_flash.py),
N from 16,384 to 262,144, and
reports each order's K and V DRAM reads over K and V read once. The persistent order runs in its lockstep form
(``persistent.in_waves``: its waves as a dispatched grid, held equal to its CTAs' chained tiles by
tests/test_persistent.py). A dotted line marks the N from which one head's K
and V (4·N·d bytes) pass the preset's effective L2. Predictions of the model, not measurements.

Usage: python -m experiments.sawtooth_orders [--figures docs/figures] [--json experiments/results/sawtooth_orders.json]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from experiments.figure_cli import plt, run
from iosim.core.gpus import GPUS
from iosim.core.problem import AttentionShape, Problem
from iosim.core.tiling import Tiling
from iosim.gpu.grids import flash_swapped, persistent
from iosim.gpu.l2 import L2Config
from iosim.gpu.schedule import simulate

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PRESETS = ("h100", "gb10")
D, TILING, PER_SM = 128, Tiling(64, 64), 2
NS = [2**k for k in range(14, 19)]
ORDERS = ("plain", "odd query blocks reversed (kernels/)", "odd waves reversed (arXiv 2601.16032)")


def grids(pb: Problem, ctas: int):
    """The three orders' grids, in ORDERS' order."""
    return (flash_swapped.forward(pb, TILING, PER_SM), flash_swapped.forward(pb, TILING, PER_SM, sawtooth=True),
            persistent.in_waves(pb, TILING, PER_SM, ctas, sawtooth=True))


def collect() -> dict:
    rows = []
    for name in PRESETS:
        gpu = GPUS[name]
        ctas = int(gpu.sms.value) * PER_SM
        config = L2Config(int(gpu.l2_effective.value), ctas)
        for n in NS:
            pb = Problem(AttentionShape(1, 1, n, n, D), tau=1.0, dtype="float16")
            once = 2 * n * D * 2
            for order, grid in zip(ORDERS, grids(pb, ctas)):
                counts = simulate(grid, config)
                kv = counts.tensor("K").reads + counts.tensor("V").reads
                rows.append(dict(gpu=gpu.name, N=n, order=order, kv_read_bytes=kv, kv_over_once=kv / once,
                                 dram_read_bytes=counts.reads, ctas=ctas, l2_bytes=config.capacity))
    return dict(d=D, Br=TILING.Br, Bc=TILING.Bc, per_sm=PER_SM, schedule="lockstep", rows=rows)


def plot(data: dict) -> Figure:
    fig, axes = plt.subplots(1, len(PRESETS), figsize=(10, 4), sharey=True)
    for ax, name in zip(axes, PRESETS):
        gpu = GPUS[name]
        for order, style in zip(ORDERS, ("o-", "s--", "^:")):
            mine = [r for r in data["rows"] if r["gpu"] == gpu.name and r["order"] == order]
            ax.plot([r["N"] for r in mine], [r["kv_over_once"] for r in mine], style, label=order)
        reach = gpu.l2_effective.value / (4 * data["d"])
        ax.axvline(reach, color="grey", ls=":", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("N (one head)")
        ax.set_title(f"{gpu.name}: {gpu.sms.value:.0f} SMs × {data['per_sm']} CTAs, "
                     f"{gpu.l2_effective.value / 1e6:.0f} MB of L2", fontsize=9)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("K, V DRAM reads / K, V read once")
    fig.suptitle(f"Predicted K/V reads of three scan orders, forward, float16, d = {data['d']}, "
                 f"{data['Br']}×{data['Bc']} tiles, lockstep", fontsize=10)
    fig.tight_layout()
    return fig


def main(argv: Sequence[str] | None = None) -> None:
    for r in run(__doc__, "sawtooth_orders", collect, plot, argv, dpi=130)["rows"]:
        print(f"{r['gpu']:5} N={r['N']:>7,}  {r['order']:<40} K/V read {r['kv_over_once']:7.2f}x once")


if __name__ == "__main__":
    main()
