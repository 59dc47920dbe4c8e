"""The paper's GPT-2 medium table on the simulator: HBM bytes, FLOPs and roofline time of a training step.

Dao et al. (2022), Figure 2 left, the table beside it: attention
of GPT-2 medium, forward + backward, on an A100. Every algorithm is counted
count-only at that shape with the A100 preset (M = 164 KiB of shared memory per SM in
float16 elements, HBM bandwidth and peak FLOP/s from the datasheet), in four settings:
GPT-2 as trained (causal, dropout 0.1) and with the mask and the dropout left out.
Writes the numbers as JSON and a bar chart beside the paper's.

Usage: python -m experiments.gpt2_table [--figures docs/figures] [--json experiments/results/gpt2_table.json]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from experiments.figure_cli import run  # noqa: E402
from iosim.core.gpus import GPUS, resolve_M  # noqa: E402
from iosim.reports.sweep import sweep_row  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# The experiment, declared as data: the shape and the hardware of the paper's table.
SHAPE = dict(N=1024, d=64, heads=16, batch=64, dtype="float16")
GPU = "a100"
ALGORITHMS = ("standard", "standard-eager", "flash", "flash-swapped")
SETTINGS = {  # name → (causal, dropout_p)
    "GPT-2 training (causal, dropout 0.1)": (True, 0.1),
    "causal, no dropout": (True, 0.0),
    "no mask, dropout 0.1": (False, 0.1),
    "no mask, no dropout": (False, 0.0),
}
PAPER = {  # Dao et al. (2022), Figure 2 left: standard and FlashAttention
    "standard": dict(GB=40.3, GFLOPs=66.6, ms=41.7),
    "flash": dict(GB=4.4, GFLOPs=75.2, ms=7.3),
}


def measure() -> list[dict]:
    M = resolve_M(None, GPU, SHAPE["dtype"])
    rows = []
    for setting, (causal, dropout_p) in SETTINGS.items():
        for algorithm in ALGORITHMS:
            r = sweep_row(algorithm, SHAPE["N"], SHAPE["d"], M, batch=SHAPE["batch"], heads=SHAPE["heads"],
                          causal=causal, dropout_p=dropout_p, dtype=SHAPE["dtype"], pass_="fwd+bwd", gpu=GPU)
            if r.total != r.predicted:
                raise RuntimeError(f"{algorithm} {setting}: measured {r.total} != predicted {r.predicted}")
            rows.append(dict(setting=setting, algorithm=algorithm, causal=causal, dropout_p=dropout_p, M=M,
                             fwd_tiling=[r.forward_tiling.Br, r.forward_tiling.Bc], bwd_tiling=[r.backward_tiling.Br,
                                                                                r.backward_tiling.Bc],
                             GB=r.total_bytes / 1e9, GFLOPs=r.flops.matmul / 1e9, Gexp=r.flops.exp / 1e9,
                             ms=r.roofline.seconds * 1e3, bound=r.roofline.bound,
                             tensors={t.name: t.read_bytes + t.write_bytes for t in r.counts.tensors}))
    return rows


def collect() -> dict:
    return dict(shape=SHAPE, gpu=GPUS[GPU].name, paper=PAPER, rows=measure())


def plot(data: dict) -> Figure:
    main = [r for r in data["rows"] if r["setting"] == next(iter(SETTINGS))]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    for ax, key, label in zip(axes, ("GB", "GFLOPs", "ms"),
                              ("HBM reads + writes (GB)", "matmul GFLOPs", "runtime (ms): roofline bound vs paper")):
        xs = range(len(main))
        ax.bar([x - 0.2 for x in xs], [r[key] for r in main], 0.4, label="iosim (A100 preset)", color="C0")
        paper = [PAPER.get(r["algorithm"], {}).get(key) for r in main]
        ax.bar([x + 0.2 for x, p in zip(xs, paper) if p is not None], [p for p in paper if p is not None], 0.4,
               label="paper (measured on A100)", color="C1")
        for x, r in zip(xs, main):
            ax.annotate(f"{r[key]:.3g}", (x - 0.2, r[key]), ha="center", va="bottom", fontsize=8)
        for x, p in zip(xs, paper):
            if p is not None:
                ax.annotate(f"{p:.3g}", (x + 0.2, p), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(xs), [r["algorithm"] for r in main], rotation=15)
        ax.set_title(label, fontsize=10)
    axes[0].legend(fontsize=8)
    fig.suptitle("GPT-2 medium attention, forward + backward (N = 1024, d = 64, 16 heads, batch 64, fp16), "
                 "causal, dropout 0.1", fontsize=10)
    fig.tight_layout()
    return fig


def main(argv: Sequence[str] | None = None) -> None:
    for r in run(__doc__, "gpt2_table", collect, plot, argv, dpi=120)["rows"]:
        print(f"{r['setting']:40s} {r['algorithm']:15s} {r['GB']:7.2f} GB {r['GFLOPs']:7.1f} GFLOPs "
              f"{r['ms']:6.2f} ms ({r['bound']})")


if __name__ == "__main__":
    main()
