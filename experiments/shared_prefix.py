"""Shared-prefix decoding: cascade attention against each request reading its whole cache (docs/results.md).

One decoding step (N_q = 1) for a batch of B requests that share a prompt prefix of P
tokens in a paged cache and each hold U = 256 tokens of their own (``iosim.serving.cascade``):
exact counts of cascade attention (the batch's queries against the shared pages once,
each request against its own, then the merge) and of the same algorithm decoding each
request on its own. The floor is every byte touched once: the shared prefix's K and V,
each request's own, Q and O. Nothing here runs on a GPU.

Usage: python -m experiments.shared_prefix [--figures docs/figures]
                                           [--json experiments/results/shared_prefix.json]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import iosim  # noqa: E402
from experiments.figure_cli import run  # noqa: E402
from iosim.core.gpus import GPUS  # noqa: E402
from iosim.serving.cascade import kv_reads  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.figure import Figure

GPU = GPUS["h100"]
DTYPE = "float16"
M = GPU.M(DTYPE)  # one SM's shared memory in elements: 116,736
D = 128
HEADS, KV_HEADS = 32, 8  # Llama-3-8B's grouped-query attention
PAGE = 16  # vLLM's default page size
SUFFIX = 256
PREFIXES = [4096, 32768]
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
ALGORITHMS = [name for name, a in iosim.ALGORITHMS.items() if a.accepts("page_size")]


def record(algorithm: str, prefix: int, batch: int) -> dict:
    r = iosim.cascade(algorithm, batch=batch, prefix=prefix, suffix=SUFFIX, d=D, M=M, heads=HEADS, kv_heads=KV_HEADS,
                      dtype=DTYPE, page_size=PAGE, gpu="h100")
    item = r.problem.itemsize()
    floor = (2 * KV_HEADS * (prefix + batch * SUFFIX) * D + 2 * batch * HEADS * D) * item
    return dict(algorithm=algorithm, prefix=prefix, batch=batch, cascade_bytes=r.traffic.total_bytes,
                separate_bytes=r.separate.traffic.total_bytes, cascade_kv_bytes=kv_reads(r.traffic) * item,
                separate_kv_bytes=kv_reads(r.separate.traffic) * item, floor_bytes=floor, ratio=r.ratio,
                tilings={lv.name: [lv.result.tiling.Br, lv.result.tiling.Bc, lv.result.tiling.splits]
                         for lv in r.levels})


def collect() -> dict:
    rows = [record(a, p, b) for a in ALGORITHMS for p in PREFIXES for b in BATCHES]
    return dict(gpu=GPU.name, dtype=DTYPE, M=M, d=D, heads=HEADS, kv_heads=KV_HEADS, page_size=PAGE, suffix=SUFFIX,
                rows=rows)


def plot(data: dict) -> Figure:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    colors = {"flash-swapped": "C2", "split-kv": "C1"}
    markers = {PREFIXES[0]: "o", PREFIXES[1]: "s"}
    for p in PREFIXES:
        for a in ALGORITHMS:
            rows = [r for r in data["rows"] if r["algorithm"] == a and r["prefix"] == p]
            b = [r["batch"] for r in rows]
            label = f"{a}, P = {p:,}"
            axes[0].loglog(b, [r["separate_bytes"] for r in rows], markers[p] + ":", color=colors[a], alpha=0.7,
                           label=f"{label}, separate")
            axes[0].loglog(b, [r["cascade_bytes"] for r in rows], markers[p] + "-", color=colors[a],
                           label=f"{label}, cascade")
            axes[1].loglog(b, [r["ratio"] for r in rows], markers[p] + "-", color=colors[a], label=label)
        floor = [r for r in data["rows"] if r["algorithm"] == ALGORITHMS[0] and r["prefix"] == p]
        axes[0].loglog([r["batch"] for r in floor], [r["floor_bytes"] for r in floor], "k--", lw=1,
                       label=f"P = {p:,}: every byte once")
    axes[0].set(title="HBM bytes of one decoding step", xlabel="requests sharing the prefix (B)", ylabel="bytes")
    axes[1].axhline(1.0, color="k", ls=":", lw=1)
    axes[1].set(title="cascade ÷ separate, with 1/B", xlabel="requests sharing the prefix (B)", ylabel="ratio")
    axes[1].loglog(BATCHES, [1 / b for b in BATCHES], "k--", lw=1, label="1/B")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.suptitle(f"Decoding over a shared prefix of P tokens, {SUFFIX} own tokens a request; exact counts\n"
                 f"{HEADS} query heads, {KV_HEADS} K/V heads, d = {D}, {DTYPE}, pages of {PAGE}, {data['gpu']} "
                 f"preset's M = {M:,}")
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    run(__doc__, "shared_prefix", collect, plot)
