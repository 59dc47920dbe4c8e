"""Chunked prefill: the HBM traffic of prefilling a 32k prompt in chunks of C, against C (docs/results.md).

Each chunk of C query tokens attends causally to the K/V of every token before it and
to itself (``iosim.chunked_prefill``: the exact sum of one count per chunk, each with
the tiling the ``fit`` policy chooses for it). Nothing here runs on a GPU.

Usage: python -m experiments.chunked_prefill [--figures docs/figures]
                                             [--json experiments/results/chunked_prefill.json]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import iosim  # noqa: E402
from experiments.figure_cli import run  # noqa: E402
from iosim.core.gpus import GPUS  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.figure import Figure

GPU = GPUS["h100"]
DTYPE = "float16"
M = GPU.M(DTYPE)  # one SM's shared memory in elements: 116,736
N = 32768  # prompt length
D = 128
HEADS = 32  # query heads of a 7-8B model; the per-head algorithms read K/V per query head whatever kv_heads is
CHUNKS = [2**e for e in range(4, 16)]  # 16 ... 32768 = N: the last is the unchunked prefill
ALGORITHMS = ["flash", "flash-swapped"]


def record(algorithm: str, C: int) -> dict:
    r = iosim.chunked_prefill(algorithm, N=N, C=C, d=D, M=M, heads=HEADS, dtype=DTYPE)
    t = r.traffic
    tiling = iosim.predict(algorithm, N=C, N_k=N, d=D, M=M, heads=HEADS, causal=True, dtype=DTYPE).tiling
    return {**r.record(), "kv_read_bytes": t.tensor("K").read_bytes + t.tensor("V").read_bytes,
            "unchunked_bytes": r.unchunked.total_bytes, "Br": tiling.Br, "Bc": tiling.Bc}


def collect() -> dict:
    return dict(gpu=GPU.name, dtype=DTYPE, M=M, N=N, d=D, heads=HEADS,
                rows=[record(a, C) for a in ALGORITHMS for C in CHUNKS])


def plot(data: dict) -> Figure:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    styles = {"flash": "C0", "flash-swapped": "C2"}
    for a in ALGORITHMS:
        rows = [r for r in data["rows"] if r["algorithm"] == a]
        C = [r["chunk"] for r in rows]
        axes[0].loglog(C, [r["total_bytes"] / 1e9 for r in rows], "o-", color=styles[a], label=f"{a}: total")
        axes[0].loglog(C, [r["kv_read_bytes"] / 1e9 for r in rows], "s:", color=styles[a], label=f"{a}: K and V reads")
        axes[1].semilogx(C, [r["ratio"] for r in rows], "o-", color=styles[a], label=a)
    axes[0].set(title=f"prefill of N = {N:,} tokens in chunks of C: HBM GB", xlabel="chunk size C (tokens)",
                ylabel="HBM GB")
    axes[1].axhline(1.0, color="k", ls=":", lw=1)
    axes[1].set(title="over one unchunked causal prefill (C = N)", xlabel="chunk size C (tokens)",
                ylabel="traffic ÷ unchunked")
    for ax in axes:
        ax.legend(fontsize=8)
    fig.suptitle(f"Chunked prefill, {HEADS} heads, d = {D}, causal, {DTYPE}, {data['gpu']} preset's M = {M:,} "
                 f"elements, fit tiling per chunk; exact counts")
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    run(__doc__, "chunked_prefill", collect, plot)
