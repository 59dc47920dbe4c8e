"""Plot the JSON files written by experiments.gpu_bench: TFLOP/s and peak memory against N.

    python -m experiments.plot_gpu_bench experiments/results/kernels_bench [--out figure.png]

One line per (impl, dtype, causal); panels for forward, backward, forward+backward
TFLOP/s and for peak memory (log-log, so linear growth in N has slope 1 and quadratic
slope 2). A configuration that recorded an error keeps the modes it measured before the
error (a forward that ran before the backward ran out of memory, say); the failures are
listed under the panels.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MODES = ("forward", "backward", "forward_backward")


def load(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def series(records: list[dict]) -> dict[str, list[dict]]:
    """Records grouped by line label and sorted by N (a failed one keeps its measured modes)."""
    lines = defaultdict(list)
    for r in records:
        p = r["parameters"]
        label = (
            f"{p['impl']} {p['dtype']}{' causal' if p['causal'] else ''} "
            f"b={p['batch_size']} h={p['num_heads']} d={p['head_dim']}"
        )
        lines[label].append(r)
    return {k: sorted(v, key=lambda r: r["parameters"]["seq_len"]) for k, v in sorted(lines.items())}


def plot(records: list[dict], out: Path) -> Path:
    lines = series(records)
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.5))
    for label, rs in lines.items():
        n = [r["parameters"]["seq_len"] for r in rs]
        for ax, mode in zip(axes, MODES):
            points = [(x, r[mode]["FLOPS(TFLOPs/s)"]) for x, r in zip(n, rs) if r[mode]["FLOPS(TFLOPs/s)"] is not None]
            if points:
                ax.plot(*zip(*points), marker="o", label=label)
        mem = [(x, r["peak_memory_usage(MB)"]) for x, r in zip(n, rs) if r["peak_memory_usage(MB)"] is not None]
        if mem:
            axes[3].plot(*zip(*mem), marker="o", label=label)
    for ax, mode in zip(axes, MODES):
        ax.set(xscale="log", xlabel="sequence length N", ylabel="TFLOP/s", title=mode.replace("_", "+"))
    axes[3].set(xscale="log", yscale="log", xlabel="sequence length N", ylabel="MB", title="peak memory (fwd+bwd)")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    errors = [r for r in records if "error" in r]
    if errors:
        fig.text(0.01, 0.01, "failed: " + "; ".join(
            f"{r['parameters']['impl']} {r['parameters']['dtype']} N={r['parameters']['seq_len']} "
            f"d={r['parameters']['head_dim']}: {r['error'][:40]}" for r in errors[:6]
        ) + (f"; and {len(errors) - 6} more" if len(errors) > 6 else ""), fontsize=7)
    fig.tight_layout(rect=(0, 0.05 if errors else 0, 1, 1))
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="default: FOLDER/gpu_bench.png")
    args = parser.parse_args()
    print(plot(load(args.folder), args.out or args.folder / "gpu_bench.png"))


if __name__ == "__main__":
    main()
