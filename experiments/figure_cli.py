"""The command line that the figure scripts share: count, save the numbers as JSON, draw and save the figure.

    python experiments/NAME.py [--out docs/figures/NAME.png] [--json experiments/results/NAME.json]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def run(doc: str, name: str, collect: Callable[[], dict], plot: Callable[[dict], Figure]) -> None:
    """Parse --out and --json, then ``collect()`` the numbers, write them, ``plot`` them and save the figure."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", default=f"docs/figures/{name}.png")
    parser.add_argument("--json", default=f"experiments/results/{name}.json")
    args = parser.parse_args()
    data = collect()
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
    fig = plot(data)
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out} and {args.json}")
