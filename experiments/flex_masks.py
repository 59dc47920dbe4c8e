"""FlexAttention's named masks: how many blocks each leaves, and the HBM bytes flex moves over them, against N.

The forward pass of ``flex`` (FlexAttention's kernel: FlashAttention-2's loop over a block mask's full and partial
blocks) at d = 128, blocks of 128 × 128 (FlexAttention's default), M = an H100's shared memory per SM in float16
elements, for the masks of ``iosim.variants.flex``: causal, a sliding window of 1,024, StreamingLLM's 4 sink tokens
beside that window, a prefix-LM of N/4 and eight equal packed documents, beside the dense swapped loop. Every number
is an exact count (``iosim.count``, equal to the closed form); nothing here runs on a GPU.

Usage: python -m experiments.flex_masks [--figures docs/figures] [--json experiments/results/flex_masks.json]
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
from iosim.variants import flex  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DTYPE, D, BLOCK = "float16", 128, (128, 128)
M = GPUS["h100"].M(DTYPE)
NS = [1024, 2048, 4096, 8192]
MASKS = {  # label → (mask function of N, tensors it reads)
    "causal": (lambda n: flex.causal(n, n), ()),
    "window 1024": (lambda n: flex.window(n, n, 1024), ()),
    "sinks 4 + window 1024": (lambda n: flex.sinks_window(n, n, 4, 1024), ()),
    "prefix-LM N/4": (lambda n: flex.prefix_lm(n, n, n // 4), ()),
    "8 documents": (lambda n: flex.document(n, n, [n // 8] * 8), ("doc_ids",)),
}


def collect() -> dict:
    rows = []
    for n in NS:
        dense = iosim.count("flash-swapped", N=n, d=D, M=M, dtype=DTYPE, tiling=iosim.Tiling(*BLOCK))
        rows.append(dict(mask="none (dense flash-swapped)", N=n, bytes=dense.traffic.total_bytes, full=None,
                         partial=None, empty=None))
        for label, (make, reads) in MASKS.items():
            bm = iosim.block_mask(make(n), n, block=BLOCK, name=label, reads=reads)
            r = iosim.count("flex", N=n, d=D, M=M, dtype=DTYPE, block_mask=bm)
            if r.traffic != iosim.predict("flex", N=n, d=D, M=M, dtype=DTYPE, block_mask=bm).exact:
                raise RuntimeError(f"{label} N={n}: the count differs from its closed form")
            rows.append(dict(mask=label, N=n, bytes=r.traffic.total_bytes, **bm.counts()))
    return dict(dtype=DTYPE, d=D, M=M, block=list(BLOCK), rows=rows)


def plot(data: dict) -> Figure:
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label in ["none (dense flash-swapped)", *MASKS]:
        rows = [r for r in data["rows"] if r["mask"] == label]
        ax.plot([r["N"] for r in rows], [r["bytes"] / 1e6 for r in rows], "o-" if "dense" not in label else "k--",
                label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("N (queries = keys)")
    ax.set_ylabel("HBM MB, forward pass, one head")
    ax.set_title(f"flex over FlexAttention masks, d = {D}, blocks 128 × 128, M = {M:,} (H100, float16)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv: Sequence[str] | None = None) -> None:
    for r in run(__doc__, "flex_masks", collect, plot, argv, dpi=120)["rows"]:
        blocks = "" if r["full"] is None else f"  full {r['full']:>4} partial {r['partial']:>4} empty {r['empty']:>4}"
        print(f"{r['mask']:28} N {r['N']:>6,}  {r['bytes'] / 1e6:9.2f} MB{blocks}")


if __name__ == "__main__":
    main()
