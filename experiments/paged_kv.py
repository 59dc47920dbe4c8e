"""Paged KV cache: decode traffic against the page size (docs/results.md).

One decoding step (N_q = 1) against a cache of N_k keys held in pages of p tokens, read
by rows through a block table of int32 entries (``iosim.variants.paging``); exact counts of the
algorithms that read pages, each with the fit tiling aligned to the pages. Nothing here
runs on a GPU.

Usage: python -m experiments.paged_kv [--figures docs/figures] [--json experiments/results/paged_kv.json]
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
D = 128
HEADS, KV_HEADS = 32, 8  # Llama-3-8B's grouped-query attention
N_K = [4097, 32769]  # a cache one token into a new page at every power-of-two page size
PAGES = [2**e for e in range(0, 11)]  # 1 ... 1024 tokens a page (vLLM's default is 16)
ALGORITHMS = [name for name, a in iosim.ALGORITHMS.items() if a.accepts("page_size")]


def record(algorithm: str, n_k: int, page: int | None) -> dict:
    r = iosim.count(algorithm, N=1, N_k=n_k, d=D, M=M, heads=HEADS, kv_heads=KV_HEADS, causal=True, dtype=DTYPE,
                    page_size=page)
    t = r.traffic
    table = t.tensor("block_table").read_bytes if page else 0
    kv = t.tensor("K").read_bytes + t.tensor("V").read_bytes
    # what a kernel that reads a part-filled last page whole would add per K/V load (not iosim's model: iosim reads
    # by rows): the empty rows of the last page, K and V, once per K/V head of the run per query block
    run_pb = iosim.ALGORITHMS[algorithm].run_problem(r.problem)
    loads = run_pb.shape.bh * -(-run_pb.shape.n_q // r.tiling.Br)
    empty = 0 if page is None else -(-n_k // page) * page - n_k
    whole_page_extra = loads * 2 * empty * D * r.problem.itemsize()
    return dict(algorithm=algorithm, N_k=n_k, page_size=page, Br=r.tiling.Br, Bc=r.tiling.Bc,
                splits=r.tiling.splits, total_bytes=t.total_bytes, kv_read_bytes=kv, block_table_bytes=table,
                whole_last_page_extra_bytes=whole_page_extra)


def collect() -> dict:
    rows = [record(a, n, p) for a in ALGORITHMS for n in N_K for p in [None, *PAGES]]
    return dict(gpu=GPU.name, dtype=DTYPE, M=M, d=D, heads=HEADS, kv_heads=KV_HEADS, rows=rows)


def plot(data: dict) -> Figure:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    styles = {"flash-swapped": "C2", "split-kv": "C1"}
    markers = {N_K[0]: "o", N_K[1]: "s"}
    for a in ALGORITHMS:
        for n_k in N_K:
            rows = [r for r in data["rows"] if r["algorithm"] == a and r["N_k"] == n_k]
            plain = next(r for r in rows if r["page_size"] is None)
            paged = [r for r in rows if r["page_size"] is not None]
            pages = [r["page_size"] for r in paged]
            label = f"{a}, N_k = {n_k:,}"
            axes[0].loglog(pages, [r["block_table_bytes"] for r in paged], markers[n_k] + "-", color=styles[a],
                           label=label)
            axes[1].semilogx(pages, [r["total_bytes"] / plain["total_bytes"] for r in paged], markers[n_k] + "-",
                             color=styles[a], label=f"{label} (by rows)")
            axes[1].semilogx(pages, [(r["total_bytes"] + r["whole_last_page_extra_bytes"]) / plain["total_bytes"]
                                     for r in paged], markers[n_k] + ":", color=styles[a], alpha=0.6,
                             label=f"{label}, last page whole (not modeled)")
    axes[0].set(title="block-table bytes read (int32 entries)", xlabel="page size (tokens)", ylabel="bytes")
    axes[1].axhline(1.0, color="k", ls=":", lw=1)
    axes[1].set(title="HBM bytes over the unpaged cache", xlabel="page size (tokens)", ylabel="paged ÷ unpaged")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.suptitle(f"One decoding step from a paged KV cache: {HEADS} query heads, {KV_HEADS} K/V heads, d = {D}, "
                 f"{DTYPE}, {data['gpu']} preset's M = {M:,}; exact counts")
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    run(__doc__, "paged_kv", collect, plot)
