"""Speed targets of issue 9, measured on this machine as fresh processes (start-up included); nothing is asserted.

1. ``iosim optimize`` for one (N, d, M) and every algorithm in under 5 s.
2. ``iosim bound`` with 40 values of M in under 30 s.

Usage: python experiments/optimize_speed.py [--repeats 3] [--out experiments/results/optimize_speed.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

# The benchmarks, declared as data: (name, command, target seconds).
BENCHMARKS = [
    ("optimize N=4096 d=64 M=100k", ["optimize", "--N", "4096", "--d", "64", "--M", "100k"], 5.0),
    ("optimize N=4096 d=64 M=100k causal", ["optimize", "--N", "4096", "--d", "64", "--M", "100k", "--causal"], 5.0),
    ("optimize N=65536 d=128 M=192KiB", ["optimize", "--N", "65536", "--d", "128", "--M", "192KiB"], 5.0),
    ("bound N=4096 d=64, 40 M", ["bound", "--N", "4096", "--d", "64", "--points", "40"], 30.0),
    ("bound N=4096 d=64 causal, 40 M", ["bound", "--N", "4096", "--d", "64", "--points", "40", "--causal"], 30.0),
]


def best_of(repeats: int, command: list[str]) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "iosim", *command], check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="experiments/results/optimize_speed.json")
    args = parser.parse_args()
    results = []
    for name, command, target in BENCHMARKS:
        seconds = best_of(args.repeats, command)
        results.append(dict(name=name, command="python -m iosim " + " ".join(command), seconds=seconds,
                            target_seconds=target))
        print(f"{name}: {seconds:.2f} s (target < {target:g} s)")
    machine = {"platform": platform.platform(), "processor": platform.machine(), "cpus": os.cpu_count(),
               "python": platform.python_version(), "load_average": os.getloadavg()}
    Path(args.out).write_text(json.dumps(dict(results=results, repeats=args.repeats, machine=machine), indent=1) + "\n")


if __name__ == "__main__":
    main()
