"""Call 4's SDPA rows that lockstep missed, under an L2 of call 3's measured capacity curve instead of one capacity.

    python -m experiments.l2_curve [--out experiments/results/l2_curve_call4.json]

An explanation tried after call 4 (docs/gpu-logs/2026-11-27-h100-call4.md), not a prediction. Call 3 measured the
H100's L2 with every SM reading S bytes twice (experiments/l2_capacity.py): the share of the second pass that missed
rises from 0 at 24 MB to 1 at 48 MB, where the model's LRU misses all at once past 37 MB. In that experiment every
re-read has stack distance S, so the curve is the chance that an access of stack distance S misses. For an LRU of
capacity C an access misses exactly when its stack distance exceeds C; so an L2 whose miss chance is the curve F
reads, in expectation, the mean of the LRU's reads over capacities C drawn with distribution F. This script takes
that mean with two capacities in each measured interval where F rises (at its quarter and three-quarter points, each
weighted by half the interval's rise), each one a lockstep run of the row's committed grid (iosim.gpu.dram's
pass_counts at the preset's other values), and sets it beside ncu's bytes and lockstep's at 37 MB.

Rows: the forward rows of call3-sdpa that lockstep missed by more than 10% (experiments/results/call4.json).
About 40 s on this project's 2-core container.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from experiments import call3, call3_short, ncu_traffic
from experiments.predict_next_call import GPU, launch
from iosim.gpu.dram import pass_counts
from iosim.gpu.hardware import hardware
from iosim.gpu.kernels import KERNELS

REPO = Path(__file__).resolve().parents[1]
CALL4 = REPO / "experiments" / "results" / "call4.json"
GRID = "call3-sdpa"


def quadrature() -> list[tuple[int, float]]:
    """(capacity in bytes, weight): two points in each interval of call 3's curve where the miss share rises."""
    rows = call3.l2_curve()["rows"]
    sizes = np.array([r["mb"] for r in rows]) * 1e6
    share = np.maximum.accumulate([r["miss_share"] for r in rows])  # a miss share that dips is noise: held level
    points = []
    for i in range(len(sizes) - 1):
        rise = share[i + 1] - share[i]
        if rise > 0:
            points += [(int(sizes[i] + q * (sizes[i + 1] - sizes[i])), rise / 2) for q in (0.25, 0.75)]
    return points


def rows_missed() -> list[int]:
    measured = json.loads(CALL4.read_text())["ncu"][GRID]["rows"]
    return [i for i, r in enumerate(measured) if r["config"]["direction"] == "forward"
            and abs(r["ratio"]["lockstep"] - 1) > call3.WITHIN]


def collect() -> dict:
    points = quadrature()
    measured = json.loads(CALL4.read_text())["ncu"][GRID]["rows"]
    hw = hardware(GPU)
    out = []
    for i in rows_missed():  # each row as it was launched (call4.json holds its configuration)
        cfg = ncu_traffic.LaunchConfig.from_record(measured[i]["config"])
        start = time.perf_counter()
        by_capacity = [pass_counts(KERNELS[cfg.impl], launch(cfg), hw.with_l2_bytes(c), budget_s=None).reads
                       for c, _ in points]
        curve = sum(w * r for (_, w), r in zip(points, by_capacity)) / sum(w for _, w in points)
        m = measured[i]
        out.append({"row": call3_short.describe(vars(cfg)), "index": i, "measured": m["read"],
                    "lockstep_37mb": m["predicted"]["lockstep"], "curve": curve,
                    "measured_over_curve": m["read"] / curve,
                    "measured_over_lockstep": m["ratio"]["lockstep"],
                    "by_capacity": [{"bytes": c, "weight": w, "reads": r} for (c, w), r in zip(points, by_capacity)],
                    "seconds": time.perf_counter() - start})
    return {"kind": "explanation after call 4", "quadrature": [{"bytes": c, "weight": w} for c, w in points],
            "rows": out}


def text(data: dict) -> str:
    lines = ["| row | measured MB | lockstep at 37 MB | meas/lockstep | capacity curve MB | meas/curve |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in data["rows"]:
        lines.append(f"| {r['row']} | {r['measured'] / 1e6:,.1f} | {r['lockstep_37mb'] / 1e6:,.1f} "
                     f"| {r['measured_over_lockstep']:.3f} | {r['curve'] / 1e6:,.1f} "
                     f"| {r['measured_over_curve']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "results" / "l2_curve_call4.json")
    args = parser.parse_args(argv)
    data = collect()
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(text(data), end="")
    return data


if __name__ == "__main__":
    main()
