"""Decoding against prefill, with exact counts and the GPU presets' roofline: docs/decode.md.

Decoding is N_q = 1 query (or a few speculative tokens) against a KV cache of N_k keys;
prefill is N_q = N_k. Every number comes from ``iosim.count`` (count-only, exact, equal
to the closed forms) and ``iosim.core.gpus.roofline``; nothing here runs on a GPU.

The parallelism model for split-KV is an assumption stated in docs/decode.md: a kernel
with u work units (thread blocks) on a GPU of SM streaming multiprocessors keeps
min(u, SM) of them busy, and each busy SM draws an equal 1/SM share of the HBM bandwidth.

Usage: python -m experiments.decode [--figures docs/figures] [--json experiments/results/decode.json]
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import iosim  # noqa: E402
from experiments.figure_cli import run  # noqa: E402
from iosim.core.gpus import GPUS, roofline  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.figure import Figure

GPU = GPUS["h100"]
DTYPE = "float16"
M = GPU.M(DTYPE)  # one SM's shared memory in elements: 116,736
D = 128  # head dimension of Llama-2/3 and most served models
HEADS = 32  # query heads of a 7-8B model
N_K = [1024, 4096, 16384, 65536, 131072]  # KV-cache lengths
SPECULATIVE = 4  # query tokens of a speculative-decoding step
ALGORITHMS = ["standard", "flash", "flash-swapped", "split-kv"]
KV_HEADS = [32, 8, 1]  # multi-head, GQA with groups of 4 (Llama-3 8B), MQA


def record(algorithm: str, n_q: int, n_k: int, *, batch=1, kv_heads=HEADS, causal=True, splits=None) -> dict:
    """One exact count and its roofline on the preset."""
    r = iosim.count(algorithm, N=n_q, N_k=n_k, d=D, M=M, batch=batch, heads=HEADS, kv_heads=kv_heads,
                    causal=causal, dtype=DTYPE, splits=splits)
    rl = roofline(GPU, DTYPE, r.traffic.total_bytes, r.flops)
    item = r.problem.itemsize()
    cache = 2 * batch * kv_heads * n_k * D  # K and V in HBM, elements
    bound = cache + 2 * batch * HEADS * n_q * D  # the cache read once, Q read once, O written once
    # thread blocks of a kernel that runs one per (head, query block, split), as flash-swapped and split-kv do;
    # split-kv's heads are K/V heads with their group's queries packed (Algorithm.run_problem)
    run_pb = iosim.ALGORITHMS[algorithm].run_problem(r.problem)
    units = run_pb.shape.bh * math.ceil(run_pb.shape.n_q / r.tiling.Br) * r.tiling.splits
    busy = min(1.0, units / GPU.sms.value)
    return dict(algorithm=algorithm, N_q=n_q, N_k=n_k, batch=batch, heads=HEADS, kv_heads=kv_heads, d=D,
                causal=causal, M=M, Br=r.tiling.Br, Bc=r.tiling.Bc, splits=r.tiling.splits,
                hbm_elements=r.traffic.total, hbm_bytes=r.traffic.total_bytes, kv_reads=r.traffic.tensor("K").reads
                + r.traffic.tensor("V").reads, lower_bound_elements=bound, lower_bound_bytes=bound * item,
                over_bound=r.traffic.total / bound, matmul_flops=r.flops.matmul, intensity=rl.intensity,
                roofline_s=rl.seconds, bound=rl.bound, work_units=units, busy_sms=busy,
                occupancy_s=r.traffic.total_bytes / (GPU.hbm_bandwidth.value * busy))


def collect() -> dict:
    decode = [record(a, 1, n) for a in ALGORITHMS for n in N_K]
    speculative = [record(a, SPECULATIVE, n) for a in ALGORITHMS for n in N_K]
    prefill = [record(a, n, n) for a in ALGORITHMS for n in N_K[:4]]
    grouped = [record(a, 1, 32768, kv_heads=kv, splits=s) for kv in KV_HEADS
               for a, s in (("flash-swapped", None), ("split-kv", 1), ("split-kv", None))]
    batches = [record("split-kv", 1, 32768, batch=b, kv_heads=8, splits=s) for b in (1, 4, 16, 64)
               for s in (1, None)]
    return dict(gpu=GPU.name, dtype=DTYPE, M=M, d=D, heads=HEADS, sms=GPU.sms.value,
                bandwidth=GPU.hbm_bandwidth.value, peak_flops=GPU.peak(DTYPE),
                ridge=GPU.peak(DTYPE) / GPU.hbm_bandwidth.value, decode=decode, speculative=speculative,
                prefill=prefill, grouped=grouped, batches=batches)


def plot(data: dict) -> Figure:
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    styles = {"standard": "C3", "flash": "C0", "flash-swapped": "C2", "split-kv": "C1"}
    for ax, key, title in ((axes[0, 0], "decode", "decode, N_q = 1"), (axes[0, 1], "prefill", "prefill, N_q = N_k")):
        rows = data[key]
        for a in ALGORITHMS:
            pts = [r for r in rows if r["algorithm"] == a]
            ax.loglog([r["N_k"] for r in pts], [r["hbm_bytes"] for r in pts], "o-", color=styles[a], label=a)
        pts = [r for r in rows if r["algorithm"] == "flash"]
        ax.loglog([r["N_k"] for r in pts], [r["lower_bound_bytes"] for r in pts], "k--",
                  label="read Q, K, V once, write O once")
        ax.set(title=f"{title}: HBM bytes ({HEADS} heads, d = {D}, causal)", xlabel="N_k", ylabel="HBM bytes")
        ax.legend(fontsize=8)
    ax = axes[1, 0]
    for key, label, style in (("decode", "decode (N_q = 1)", "o-"), ("speculative", f"N_q = {SPECULATIVE}", "s-"),
                              ("prefill", "prefill (N_q = N_k)", "^-")):
        pts = [r for r in data[key] if r["algorithm"] == "flash-swapped"]
        ax.loglog([r["N_k"] for r in pts], [r["intensity"] for r in pts], style, label=label)
    ax.axhline(data["ridge"], color="k", ls=":", label=f"{data['gpu']} ridge {data['ridge']:.0f} FLOP/B")
    ax.set(title="arithmetic intensity, flash-swapped (matmul FLOP per HBM byte)", xlabel="N_k",
           ylabel="FLOP / byte")
    ax.legend(fontsize=8)
    ax = axes[1, 1]
    labels, values, colors = [], [], []
    for r in data["grouped"]:
        tag = r["algorithm"] + (f", S = {r['splits']}" if r["algorithm"] == "split-kv" else "")
        labels.append(f"kv_heads = {r['kv_heads']}: {tag}")
        values.append(r["occupancy_s"] * 1e6)
        colors.append("C4" if r["algorithm"] == "split-kv" and r["splits"] == 1 else styles[r["algorithm"]])
    ax.barh(range(len(values)), values, color=colors)
    ax.set_yticks(range(len(values)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set(title="decode, N_k = 32768, batch 1: HBM time with idle SMs",
           xlabel="µs (model: each busy SM draws 1/SM of the bandwidth)")
    fig.suptitle(f"Decoding against prefill on the {data['gpu']} preset (M = {M:,} elements of {DTYPE}); exact counts")
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    run(__doc__, "decode", collect, plot)
