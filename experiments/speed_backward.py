"""Speed targets of the backward passes (issue 8), measured on this machine; nothing is asserted.

1. The default sweep with ``--pass fwd+bwd`` (count-only) in under 2 s: timed as a
   fresh process, start-up included.
2. Numeric ``iosim.gradients("flash-swapped", ...)`` at batch·heads = 8, N = 2048, d = 64
   (forward and backward pass, M = 100k) within 3× of plain numpy float64 standard
   attention backward on the same inputs (P from Q and K, then dV, dP, dS, dQ, dK).

Usage: python experiments/speed_backward.py [--repeats 3] [--out experiments/results/speed_backward.json]
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

# The benchmarks, declared as data.
SWEEP_COMMAND = [sys.executable, "-m", "iosim", "sweep", "--pass", "fwd+bwd"]
NUMERIC_CASE = dict(batch=1, heads=8, N=2048, d=64, M="100k", algorithm="flash-swapped")


def numpy_standard_backward(q, k, v, do):
    """Plain float64 gradients of softmax(QKᵀ/√d)V with whole N × N matrices."""
    tau = 1.0 / np.sqrt(q.shape[-1])
    s = tau * (q @ np.swapaxes(k, -1, -2))
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    return tau * (ds @ k), tau * (np.swapaxes(ds, -1, -2) @ q), dv


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
    parser.add_argument("--out", default="experiments/results/speed_backward.json")
    args = parser.parse_args()

    sweep_s = best_of(args.repeats, lambda: subprocess.run(SWEEP_COMMAND, check=True, capture_output=True))

    c = NUMERIC_CASE
    rng = np.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((c["batch"], c["heads"], c["N"], c["d"])) for _ in range(4))
    numpy_s = best_of(args.repeats, lambda: numpy_standard_backward(q, k, v, do))
    numeric_s = best_of(args.repeats, lambda: iosim.gradients(c["algorithm"], q, k, v, do, M=c["M"]))

    result = {
        "sweep_fwd_bwd_seconds": sweep_s,
        "sweep_target_seconds": 2.0,
        "numeric_case": c,
        "numpy_standard_backward_seconds": numpy_s,
        "gradients_seconds": numeric_s,
        "gradients_over_numpy": numeric_s / numpy_s,
        "gradients_over_numpy_target": 3.0,
        "machine": {"platform": platform.platform(), "processor": platform.machine(), "cpus": os.cpu_count(),
                    "python": platform.python_version(), "numpy": np.__version__},
        "commit": git_commit(),
        "command": "python experiments/speed_backward.py " + " ".join(sys.argv[1:]),
        "repeats": args.repeats,
        "statistic": "best of repeats, wall-clock seconds",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"sweep --pass fwd+bwd: {sweep_s:.2f} s (target < 2 s)")
    print(f"gradients {c['algorithm']} {numeric_s:.2f} s vs numpy standard backward {numpy_s:.2f} s: "
          f"{numeric_s / numpy_s:.2f}x (target <= 3x)")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
