"""The command line that the figure scripts share: count, save the numbers as JSON, draw the figure.

    python experiments/NAME.py [--out docs/figures/NAME.png] [--json experiments/results/NAME.json]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path


def run(doc: str, name: str, collect: Callable[[], dict], plot: Callable[[dict, Path], None]) -> None:
    """Parse --out and --json, then ``collect()`` the numbers, write them, and ``plot`` them."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", default=f"docs/figures/{name}.png")
    parser.add_argument("--json", default=f"experiments/results/{name}.json")
    args = parser.parse_args()
    data = collect()
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
    plot(data, Path(args.out))
    print(f"wrote {args.out} and {args.json}")
