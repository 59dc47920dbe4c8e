"""The command line that every figure script shares: count, save the numbers as JSON, draw and save the figures.

    python -m experiments.NAME [--figures docs/figures] [--json experiments/results/NAME.json]

A script declares ``collect() -> dict`` (the numbers, JSON-serialisable) and ``plot(data) -> Figure`` (saved as
FIGURES/NAME.png) or ``plot(data) -> {stem: Figure}`` (several figures, each saved as FIGURES/stem.png), and its
``main`` calls ``run``. ``python -m experiments.regenerate --check`` compares the JSON, not the pixels.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FIGURES = Path("docs/figures")
RESULTS = Path("experiments/results")


def run(doc: str, name: str, collect: Callable[[], dict], plot: Callable[[dict], Figure | dict[str, Figure]],
        argv: Sequence[str] | None = None, *, dpi: int = 110) -> dict:
    """Parse --figures and --json, ``collect()`` the numbers, write them, ``plot`` them and save each figure.

    Returns the numbers, for a script that also prints a table of them.
    """
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--figures", type=Path, default=FIGURES, help="the folder of the figures (default %(default)s)")
    parser.add_argument("--json", type=Path, default=RESULTS / f"{name}.json",
                        help="the numbers (default %(default)s)")
    args = parser.parse_args(argv)
    data = collect()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(data, indent=1) + "\n")
    drawn = plot(data)
    figures = drawn if isinstance(drawn, dict) else {name: drawn}
    args.figures.mkdir(parents=True, exist_ok=True)
    for stem, fig in figures.items():
        fig.savefig(args.figures / f"{stem}.png", dpi=dpi)
        plt.close(fig)
    print(f"wrote {', '.join(str(args.figures / f'{stem}.png') for stem in figures)} and {args.json}")
    return data
