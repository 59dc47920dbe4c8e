"""Predicted DRAM bytes of torch SDPA's flash backend, FlashAttention-3 and iosim's kernels against N, on the H100
preset.

The forward pass, float16, full attention, batch·heads 16 (every N here runs unsplit in torch), d = 64 and 128,
N = 1,024 … 262,144: the DRAM bytes each kernel's grid reads behind the H100 preset's effective L2 (37 MB) under the
lockstep schedule (``iosim.dram``: closed forms, else the simulation) at the tiles each kernel launches (SDPA's and
FlashAttention-3's own; iosim's as their host API picks them), over the compulsory bytes (Q, K and V read once). A
dotted line marks the N from which one head's K and V (2·N·d·2 bytes) no longer fit that L2. FlashAttention-3 splits
K/V once one head's K and V pass 50 MB (its ``num_splits_heuristic``), a launch its description refuses: its line
stops there. These are the L2 model's predictions, not measurements: ``predictions-96a5261`` holds SDPA's rows that
a GPU call profiled (call 4); no FlashAttention-3 row has been measured.

Usage: python -m experiments.sdpa_dram [--figures docs/figures] [--json experiments/results/sdpa_dram.json]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import iosim  # noqa: E402
from experiments.figure_cli import run  # noqa: E402
from experiments.ncu_traffic import LaunchConfig  # noqa: E402
from iosim.core.gpus import GPUS  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.figure import Figure

GPU, DTYPE, HEADS = "h100", "float16", 16
KERNELS = (("sdpa-flash", "flash-swapped"), ("fa3", "flash-swapped"), ("flash-swapped", "flash-swapped"),
           ("flash", "flash"))
OWN_TILES = ("sdpa-flash", "fa3")  # kernels that launch their own tiles
NS = [2**k for k in range(10, 19)]
DS = (64, 128)


def records() -> list[dict]:
    """One record per (kernel, d, N): the DRAM bytes read and written of its forward, and the compulsory reads; where
    the kernel's description refuses the launch (FlashAttention-3's split K/V), null bytes and the refusal."""
    M = GPUS[GPU].M(DTYPE)
    out = []
    for kernel, algorithm in KERNELS:
        for d in DS:
            for n in NS:
                tiling = None
                if kernel not in OWN_TILES:
                    own = LaunchConfig(kernel, "forward", 1, HEADS, n, n, d, DTYPE).tile()
                    tiling = iosim.Tiling(own["Br"], own["Bc"])
                row = dict(kernel=kernel, d=d, N=n, compulsory_read_bytes=3 * HEADS * n * d * 2)
                try:
                    r = iosim.dram(algorithm, N=n, d=d, M=M, heads=HEADS, dtype=DTYPE, gpu=GPU, kernel=kernel,
                                   tiling=tiling)
                except iosim.InputError as refused:
                    out.append(dict(row, Br=None, Bc=None, dram_read_bytes=None, dram_write_bytes=None,
                                    refused=str(refused)))
                    continue
                t = r.forward_tiling
                out.append(dict(row, Br=t.Br, Bc=t.Bc, dram_read_bytes=r.dram.reads, dram_write_bytes=r.dram.writes,
                                refused=None))
    return out


def collect() -> dict:
    gpu = GPUS[GPU]
    return dict(gpu=gpu.name, dtype=DTYPE, heads=HEADS, l2_effective=int(gpu.l2_effective.value),
                schedule="lockstep", rows=records())


def plot(data: dict) -> Figure:
    fig, axes = plt.subplots(1, len(DS), figsize=(10, 4), sharey=True)
    for ax, d in zip(axes, DS):
        for (kernel, _), style in zip(KERNELS, ("o-", "D-", "s--", "^:")):
            mine = [r for r in data["rows"] if r["kernel"] == kernel and r["d"] == d and r["refused"] is None]
            ax.plot([r["N"] for r in mine], [r["dram_read_bytes"] / r["compulsory_read_bytes"] for r in mine], style,
                    label=f"{kernel} ({mine[0]['Br']}×{mine[0]['Bc']})")
        reach = data["l2_effective"] / (2 * d * 2)
        ax.axvline(reach, color="grey", ls=":", lw=1)
        ax.text(reach, 1.05, " a head's K, V\n fill the L2", fontsize=7, color="grey", va="bottom")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("N (= N_k)")
        ax.set_title(f"d = {d}", fontsize=10)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("DRAM bytes read / Q, K, V read once")
    fig.suptitle(f"Predicted DRAM reads, forward, {data['gpu']} preset ({data['l2_effective'] / 1e6:.0f} MB of L2), "
                 f"{DTYPE}, batch·heads {data['heads']}, lockstep", fontsize=10)
    fig.tight_layout()
    return fig


def main(argv: Sequence[str] | None = None) -> None:
    for r in run(__doc__, "sdpa_dram", collect, plot, argv, dpi=130)["rows"]:
        if r["refused"] is not None:
            print(f"{r['kernel']:14} d={r['d']:<4} N={r['N']:>7,}  refused: {r['refused'][:70]}")
            continue
        print(f"{r['kernel']:14} d={r['d']:<4} N={r['N']:>7,}  {r['Br']}x{r['Bc']}  "
              f"{r['dram_read_bytes'] / r['compulsory_read_bytes']:8.2f}x the compulsory reads")


if __name__ == "__main__":
    main()
