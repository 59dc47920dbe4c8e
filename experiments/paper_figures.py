"""The paper's Figure 2 (middle and right) and Theorem 5 on the simulator.

- Figure 2, middle: forward HBM traffic and roofline time of ``flash`` against the key
  block B_c ∈ {64, 128, 256, 512} (fixed blocks, B_r = 64), GPT-2 medium's shape.
- Figure 2, right: forward + backward traffic and roofline time of ``block-sparse`` and
  ``block-sparse-skip`` against the fraction s of nonzero tiles at N = 4096, beside
  dense ``flash``.
- Theorem 5: backward traffic of ``standard`` and ``flash`` across M, against
  Θ(Nd + N²) and Θ(N²d²/M).

All counts are count-only and equal their closed forms (checked). Times use the A100
preset and are lower bounds (``iosim/core/gpus.py``). Writes three PNGs and their numbers as
experiments/results/paper_figures.json.

Usage: python -m experiments.paper_figures [--figures docs/figures] [--json experiments/results/paper_figures.json]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

import iosim  # noqa: E402
from experiments.figure_cli import run  # noqa: E402
from iosim.core.flops import Flops  # noqa: E402
from iosim.core.gpus import GPUS, roofline  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# The experiments, declared as data.
GPU = GPUS["a100"]
GPT2 = dict(d=64, heads=16, batch=64, dtype="float16")
BLOCKS = dict(N=1024, Br=64, Bcs=(64, 128, 256, 512), M=10**6)  # M large enough for every fixed tiling
SPARSE = dict(N=4096, M=GPU.M("float16"), sparsities=(0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0), pattern="random",
              seed=0)
THEOREM5 = dict(N=4096, d=64, Ms=[2**e for e in range(12, 21)])


def measured(algorithm: str, pass_: str = "fwd", **shape) -> tuple[iosim.Counts, Flops]:
    """Count-only traffic and FLOPs, checked against the closed form."""
    c, p = iosim.count(algorithm, pass_=pass_, **shape), iosim.predict(algorithm, pass_=pass_, **shape)
    if c.traffic != p.exact or c.flops != p.flops:
        raise RuntimeError(f"{algorithm} {pass_} {shape}: measured != predicted")
    return c.traffic, c.flops


def block_size() -> list[dict]:
    rows = []
    for Bc in BLOCKS["Bcs"]:
        counts, flops = measured("flash", N=BLOCKS["N"], M=BLOCKS["M"], tiling=iosim.Tiling(BLOCKS["Br"], Bc), **GPT2)
        r = roofline(GPU, GPT2["dtype"], counts.total_bytes, flops)
        rows.append(dict(Bc=Bc, GB=counts.total_bytes / 1e9, ms=r.seconds * 1e3, bound=r.bound))
    return rows


def sparsity() -> list[dict]:
    rows = []
    dense, dense_flops = measured("flash", N=SPARSE["N"], M=SPARSE["M"], **GPT2)
    dense_bwd, dense_bwd_flops = measured("flash", "bwd", N=SPARSE["N"], M=SPARSE["M"], **GPT2)
    for s in SPARSE["sparsities"]:
        spec = iosim.BlockSparsity(s, SPARSE["pattern"], SPARSE["seed"])
        for algorithm in ("block-sparse", "block-sparse-skip"):
            tiling = iosim.predict(algorithm, pass_="bwd", N=SPARSE["N"], M=SPARSE["M"], block_sparsity=spec,
                                   **GPT2).tiling  # one tiling for both passes: the mask is defined on it
            shape = dict(N=SPARSE["N"], M=SPARSE["M"], block_sparsity=spec, tiling=tiling, **GPT2)
            fwd, fwd_flops = measured(algorithm, **shape)
            bwd, bwd_flops = measured(algorithm, "bwd", **shape)
            total = fwd.total_bytes + bwd.total_bytes
            r = roofline(GPU, GPT2["dtype"], total, fwd_flops + bwd_flops)
            paper = (iosim.predict(algorithm, **shape).paper + iosim.predict(algorithm, pass_="bwd", **shape).paper)
            rows.append(dict(algorithm=algorithm, sparsity=s, GB=total / 1e9, ms=r.seconds * 1e3, bound=r.bound,
                             paper_GB=paper * 2 / 1e9))
    flash_total = dense.total_bytes + dense_bwd.total_bytes
    r = roofline(GPU, GPT2["dtype"], flash_total, dense_flops + dense_bwd_flops)
    rows.append(dict(algorithm="flash", sparsity=1.0, GB=flash_total / 1e9, ms=r.seconds * 1e3, bound=r.bound))
    return rows


def theorem5() -> list[dict]:
    rows = []
    N, d = THEOREM5["N"], THEOREM5["d"]
    for M in THEOREM5["Ms"]:
        for algorithm in ("standard", "flash"):
            try:
                counts, _ = measured(algorithm, "bwd", N=N, d=d, M=M)
            except iosim.BlockSizeError:
                continue
            rows.append(dict(algorithm=algorithm, M=M, elements=counts.total))
    return rows


def collect() -> dict:
    return dict(gpu=GPU.name, shape=GPT2, block_size=block_size(), block_sparse=sparsity(), theorem5=theorem5())


def plot(data: dict) -> dict[str, Figure]:
    blocks, sparse, thm = data["block_size"], data["block_sparse"], data["theorem5"]
    figures = {}
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.bar([str(r["Bc"]) for r in blocks], [r["GB"] for r in blocks], color="C0", label="HBM GB")
    ax.set_xlabel("key block B_c (B_r = 64)")
    ax.set_ylabel("HBM reads + writes (GB)")
    twin = ax.twinx()
    twin.plot([str(r["Bc"]) for r in blocks], [r["ms"] for r in blocks], "o-", color="C3", label="roofline ms")
    twin.set_ylabel("roofline time (ms), A100")
    twin.set_ylim(0, max(r["ms"] for r in blocks) * 1.2)
    ax.set_title("flash forward, N = 1024, d = 64, 16 heads, batch 64", fontsize=9)
    fig.legend(loc="upper right", bbox_to_anchor=(0.85, 0.88), fontsize=8)
    fig.tight_layout()
    figures["fig2_block_size"] = fig

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    flash = next(r for r in sparse if r["algorithm"] == "flash")
    for algorithm, style in (("block-sparse", "o-"), ("block-sparse-skip", "s--")):
        pts = [r for r in sparse if r["algorithm"] == algorithm]
        axes[0].plot([r["sparsity"] for r in pts], [r["GB"] for r in pts], style, label=algorithm)
        axes[1].plot([r["sparsity"] for r in pts], [r["ms"] for r in pts], style, label=algorithm)
    pts = [r for r in sparse if r["algorithm"] == "block-sparse"]
    axes[0].plot([r["sparsity"] for r in pts], [r["paper_GB"] for r in pts], ":", color="gray",
                 label="s(12N²d²/M + 16N²d/M) + 3Nd, fwd + bwd analogue")
    for ax, key, label in ((axes[0], "GB", "HBM reads + writes (GB)"), (axes[1], "ms", "roofline time (ms), A100")):
        ax.axhline(flash[key], color="k", lw=0.8, label="dense flash")
        ax.set_xlabel("fraction of nonzero tiles s")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    fig.suptitle("block-sparse FlashAttention, forward + backward, N = 4096, d = 64, 16 heads, batch 64, random mask",
                 fontsize=9)
    fig.tight_layout()
    figures["fig2_block_sparse"] = fig

    fig, ax = plt.subplots(figsize=(6, 4.2))
    N, d = THEOREM5["N"], THEOREM5["d"]
    for algorithm, color in (("standard", "C0"), ("flash", "C1")):
        pts = [r for r in thm if r["algorithm"] == algorithm]
        ax.loglog([r["M"] for r in pts], [r["elements"] for r in pts], "o-", color=color,
                  label=f"{algorithm} backward, measured = exact")
    Ms = [r["M"] for r in thm if r["algorithm"] == "flash"]
    ax.loglog(Ms, [N * d + N * N for _ in Ms], ":", color="C0", label="N·d + N²")
    ax.loglog(Ms, [N * N * d * d / M for M in Ms], ":", color="C1", label="N²d²/M")
    ax.set_xlabel("SRAM M (elements)")
    ax.set_ylabel("backward HBM traffic (elements)")
    ax.set_title(f"Theorem 5: backward traffic, N = {N}, d = {d}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    figures["theorem5_backward"] = fig
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    data = run(__doc__, "paper_figures", collect, plot, argv, dpi=120)
    for r in data["block_size"]:
        print(f"B_c = {r['Bc']:4d}: {r['GB']:.2f} GB, {r['ms']:.2f} ms ({r['bound']})")
    for r in data["block_sparse"]:
        print(f"{r['algorithm']:18s} s = {r['sparsity']:.2f}: {r['GB']:.2f} GB, {r['ms']:.2f} ms ({r['bound']})")


if __name__ == "__main__":
    main()
