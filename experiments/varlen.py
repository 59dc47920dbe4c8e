"""HBM traffic of packed documents against the spread of their lengths: docs/results.md, "Packed documents".

A training batch of T = 32,768 tokens split into 16 documents whose lengths go from all
equal (2,048 each) to very spread (the longest about 10,000 times the shortest): document i
of n has a length proportional to exp(σ·(2i/(n−1) − 1)), rounded so that the lengths add up
to T. For each σ, a training step (forward + backward) of flash and flash-swapped at
d = 128, causal, M = an H100's shared memory per SM in float16 elements: packed end to end
(``iosim.count(..., seqlens=...)``, the tiling chosen for the longest document, as
flash-attn's varlen kernels are picked by max_seqlen) against every document padded to the
longest (``.padded``). Every number is an exact count; nothing here runs on a GPU.

Usage: python -m experiments.varlen [--figures docs/figures] [--json experiments/results/varlen.json]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import iosim  # noqa: E402
from experiments.figure_cli import run  # noqa: E402
from iosim.core.gpus import GPUS  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DTYPE = "float16"
M = GPUS["h100"].M(DTYPE)  # one SM's shared memory in elements: 116,736
TOKENS = 32768
DOCUMENTS = 16
D = 128
ALGORITHMS = ["flash", "flash-swapped"]
SIGMAS = [0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.6]  # 4.6: longest / shortest ≈ 10⁴


def lengths(sigma: float, tokens: int = TOKENS, n: int = DOCUMENTS) -> list[int]:
    """n lengths ∝ exp(σ·z), z evenly spaced in [−1, 1], each ≥ 1, adding up to ``tokens`` (largest remainders)."""
    w = np.exp(sigma * np.linspace(-1.0, 1.0, n))
    share = (tokens - n) * w / w.sum()  # one token each first, so none is 0
    out = np.floor(share).astype(int) + 1
    for i in np.argsort(share - np.floor(share))[::-1][:tokens - out.sum()]:
        out[i] += 1
    return out.tolist()


def records() -> list[dict]:
    """One record per (algorithm, σ): the lengths, the packed and padded training-step traffic and their ratio."""
    out = []
    for algorithm in ALGORITHMS:
        for sigma in SIGMAS:
            seqlens = lengths(sigma)
            r = iosim.count(algorithm, seqlens=seqlens, d=D, M=M, dtype=DTYPE, causal=True, pass_="fwd+bwd")
            out.append(dict(algorithm=algorithm, sigma=sigma, seqlens=seqlens, d=D, M=M, tokens=sum(seqlens),
                            longest=max(seqlens), spread=max(seqlens) / min(seqlens),
                            cv=float(np.std(seqlens) / np.mean(seqlens)), forward_tiling=str(r.forward_tiling),
                            backward_tiling=str(r.backward_tiling), packed_bytes=r.traffic.total_bytes,
                            padded_bytes=r.padded.total_bytes, ratio=r.packing_ratio))
    return out


def collect() -> dict:
    return dict(gpu=GPUS["h100"].name, dtype=DTYPE, M=M, tokens=TOKENS, documents=DOCUMENTS, d=D, rows=records())


def plot(data: dict) -> Figure:
    rows = data["rows"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6.4, 6.0), sharex=True)
    for algorithm, color in zip(ALGORITHMS, ("C0", "C1")):
        mine = [r for r in rows if r["algorithm"] == algorithm]
        x = [r["cv"] for r in mine]
        top.plot(x, [r["packed_bytes"] / 1e9 for r in mine], "o-", color=color, label=f"{algorithm}, packed")
        top.plot(x, [r["padded_bytes"] / 1e9 for r in mine], "s--", color=color, label=f"{algorithm}, padded")
        bottom.plot(x, [r["ratio"] for r in mine], "o-", color=color, label=algorithm)
    top.set_yscale("log")
    top.set_ylabel("HBM GB, training step, one head")
    top.set_title(f"{TOKENS:,} tokens in {DOCUMENTS} documents, causal, d = {D}, M = {M:,} (H100, float16)",
                  fontsize=10)
    top.legend(fontsize=7)
    bottom.set_ylabel("packed ÷ padded")
    bottom.set_xlabel("spread of the document lengths (standard deviation ÷ mean)")
    bottom.set_ylim(0, 1.05)
    bottom.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv: Sequence[str] | None = None) -> None:
    for r in run(__doc__, "varlen", collect, plot, argv, dpi=130)["rows"]:
        print(f"{r['algorithm']:14} σ {r['sigma']:4.2f}  cv {r['cv']:5.2f}  longest {r['longest']:6}  "
              f"{r['forward_tiling']:>22} / {r['backward_tiling']:>22}  packed {r['packed_bytes'] / 1e9:7.2f} GB  "
              f"padded {r['padded_bytes'] / 1e9:8.2f} GB  ÷ {r['ratio']:.3f}")


if __name__ == "__main__":
    main()
