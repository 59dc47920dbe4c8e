"""Speed targets of the simulator, measured on this machine; nothing is asserted.

1. The default ``python -m iosim sweep --M 100k`` (count-only) in under 10 s:
   timed as a fresh process, start-up included.
2. Numeric simulation of the default algorithm (``flash``) at batch·heads = 8, N = 4096,
   d = 64, M = 100k within 3× of plain numpy float64 standard attention on the same inputs.
3. Every count and prediction at N = 10⁹, causal or not, in under 0.5 s.

Usage: python experiments/speed.py [--repeats 3] [--out experiments/results/speed.json]
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

import numpy as np

import iosim
from iosim.registry import DEFAULT

# The benchmarks, declared as data.
SWEEP_COMMAND = [sys.executable, "-m", "iosim", "sweep", "--M", "100k"]
NUMERIC_CASE = dict(batch=1, heads=8, N=4096, d=64, M="100k", algorithm=DEFAULT)
HUGE_COUNT = dict(N=10**9, d=64, M="100k")  # every algorithm, causal and not, counted and predicted


def numpy_standard_attention(q, k, v):
    """Plain float64 softmax(QKᵀ/√d)V with whole N × N matrices."""
    s = (q @ np.swapaxes(k, -1, -2)) / np.sqrt(q.shape[-1])
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return p @ v


def best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="experiments/results/speed.json")
    args = parser.parse_args()

    sweep_s = best_of(args.repeats, lambda: subprocess.run(SWEEP_COMMAND, check=True, capture_output=True))

    c = NUMERIC_CASE
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((c["batch"], c["heads"], c["N"], c["d"])) for _ in range(3))
    numpy_s = best_of(args.repeats, lambda: numpy_standard_attention(q, k, v))
    numeric_s = best_of(args.repeats, lambda: iosim.simulate(c["algorithm"], q, k, v, M=c["M"]))

    huge = {
        f"{algorithm}{' causal' if causal else ''}": best_of(args.repeats, lambda: (
            iosim.count(algorithm, causal=causal, **HUGE_COUNT), iosim.predict(algorithm, causal=causal, **HUGE_COUNT)))
        for algorithm in iosim.ALGORITHMS for causal in (False, True)
    }

    result = {
        "sweep_default_seconds": sweep_s,
        "sweep_target_seconds": 10.0,
        "numeric_case": c,
        "numpy_standard_seconds": numpy_s,
        "numeric_seconds": numeric_s,
        "numeric_over_numpy": numeric_s / numpy_s,
        "numeric_over_numpy_target": 3.0,
        "huge_count_case": HUGE_COUNT,
        "huge_count_seconds": huge,
        "huge_count_target_seconds": 0.5,
        "machine": {"platform": platform.platform(), "processor": platform.machine(), "cpus": os.cpu_count(),
                    "python": platform.python_version(), "numpy": np.__version__},
        "commit": git_commit(),
        "command": "python experiments/speed.py " + " ".join(sys.argv[1:]),
        "repeats": args.repeats,
        "statistic": "best of repeats, wall-clock seconds",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"default sweep: {sweep_s:.2f} s (target < 10 s)")
    print(f"numeric {c['algorithm']} {numeric_s:.2f} s vs numpy standard {numpy_s:.2f} s: "
          f"{numeric_s / numpy_s:.2f}x (target <= 3x)")
    print(f"count + predict at N = 10^9: slowest {max(huge.values()):.4f} s (target < 0.5 s)")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
