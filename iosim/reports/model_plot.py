"""``iosim model --plot``: a model's bytes and FLOPs per algorithm, in bars stacked by kind of layer."""

from __future__ import annotations

from pathlib import Path

from iosim.models.cost import ModelReport


def plot(report: ModelReport, path: Path) -> None:
    """One row per phase counted: every layer's HBM bytes (a dot: the L2 model's DRAM bytes, where it covers every
    kind of layer) and matmul FLOPs, per algorithm, each bar stacked by kind of layer (its layers × one layer's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = [pc for pc in report.phases if pc.ran]
    kinds = [k.label for k in report.model.kinds()]
    fig, axes = plt.subplots(len(phases), 2, figsize=(11, 3.2 * len(phases)), squeeze=False)
    for row, pc in zip(axes, phases):
        names = [a.algorithm for a in pc.ran]
        for ax, what in zip(row, ("bytes", "FLOPs")):
            bottom = [0.0] * len(names)
            for k, label in enumerate(kinds):
                values = [sum((c.counts.total_bytes if what == "bytes" else c.flops.matmul) * c.kind.layers
                              for c in a.layers if c.kind.label == label) / 1e9 for a in pc.ran]
                ax.bar(names, values, bottom=bottom, color=f"C{k}", label=f"{label} layers")
                bottom = [b + v for b, v in zip(bottom, values)]
            if what == "bytes":
                dram = [(n, a.dram_bytes / 1e9) for n, a in zip(names, pc.ran) if a.dram_bytes is not None]
                if dram:
                    ax.plot(*zip(*dram), "k^", ms=6, label="DRAM bytes (L2 model)")
            ax.set_ylabel("GB" if what == "bytes" else "GFLOPs (matmul)")
            ax.set_title(f"{pc.phase.title}: {'HBM bytes' if what == 'bytes' else 'FLOPs'}", fontsize=8)
            ax.tick_params(axis="x", labelsize=7, rotation=20)
            ax.legend(fontsize=7)
    cfg = report.model
    fig.suptitle(f"{cfg.name}: attention only, batch {report.batch}, {report.gpu} preset, {report.dtype}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
