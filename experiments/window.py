"""HBM traffic of sliding-window attention against the window size: docs/results.md, "Sliding windows".

The forward passes of flash and flash-swapped at N = 16k, d = 128, M = an H100's shared
memory per SM in float16 elements, for windows (W, 0) of W = 128 … N keys back, beside
full and causal attention. Every number is an exact count (``iosim.count``, count-only,
equal to the closed form); nothing here runs on a GPU.

Usage: python -m experiments.window [--figures docs/figures] [--json experiments/results/window.json]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import iosim  # noqa: E402
from experiments.figure_cli import run  # noqa: E402
from iosim.core.gpus import GPUS  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DTYPE = "float16"
M = GPUS["h100"].M(DTYPE)  # one SM's shared memory in elements: 116,736
N = 16384
D = 128
ALGORITHMS = ["flash", "flash-swapped"]
WINDOWS = [2**k for k in range(7, 15)]  # 128 … 16384 = N keys back


def records() -> list[dict]:
    """One record per (algorithm, window): full attention and causal as windows None and "causal"."""
    out = []
    for algorithm in ALGORITHMS:
        for window in [*WINDOWS, "causal", None]:
            options = dict(causal=True) if window == "causal" else dict(window=None if window is None else (window, 0))
            r = iosim.count(algorithm, N=N, d=D, M=M, dtype=DTYPE, **options)
            out.append(dict(algorithm=algorithm, N=N, d=D, M=M, window=window, Br=r.tiling.Br, Bc=r.tiling.Bc,
                            hbm_elements=r.traffic.total, hbm_bytes=r.traffic.total_bytes,
                            kv_reads=r.traffic.tensor("K").reads + r.traffic.tensor("V").reads))
    return out


def collect() -> dict:
    return dict(gpu=GPUS["h100"].name, dtype=DTYPE, M=M, N=N, d=D, rows=records())


def plot(data: dict) -> Figure:
    rows = data["rows"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for algorithm, color in zip(ALGORITHMS, ("C0", "C1")):
        mine = [r for r in rows if r["algorithm"] == algorithm]
        windowed = [r for r in mine if isinstance(r["window"], int)]
        ax.plot([r["window"] for r in windowed], [r["hbm_bytes"] / 1e6 for r in windowed], "o-", color=color,
                label=f"{algorithm}, window (W, 0)")
        for r in mine:
            if not isinstance(r["window"], int):
                ax.axhline(r["hbm_bytes"] / 1e6, color=color, ls="--" if r["window"] is None else ":", lw=1,
                           label=f"{algorithm}, {'full' if r['window'] is None else 'causal'}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("window W (keys back from the diagonal)")
    ax.set_ylabel("HBM MB, forward pass, one head")
    ax.set_title(f"Sliding-window attention, N = {N:,}, d = {D}, M = {M:,} (H100, float16)", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv: Sequence[str] | None = None) -> None:
    for r in run(__doc__, "window", collect, plot, argv, dpi=130)["rows"]:
        print(f"{r['algorithm']:14} window {r['window']!s:>7}  {r['Br']}x{r['Bc']}  {r['hbm_bytes'] / 1e6:9.1f} MB")


if __name__ == "__main__":
    main()
