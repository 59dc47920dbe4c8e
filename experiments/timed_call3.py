"""Call 3's measured DRAM rows under the timed schedule (iosim/gpu/timed.py): an explanation, made after the run.

    python -m experiments.timed_call3 [--out experiments/results/timed_call3.json] [--max-steps 12000000]
    python -m experiments.timed_call3 --predict GRID [--out FILE]   # the next call's rows, before it runs

Call 3 (docs/gpu-logs/2026-11-27-h100-call3.md) found the H100 within 4 % of the lockstep schedule on its plain rows,
and two misses: the causal row read 26× less than predicted, the sawtooth rows up to 4.6× more. This script runs
each measured forward row of call 3's short grid whose grid has at most ``--max-steps`` steps through the timed
schedule and sets it beside the measurement and the two predictions committed before the run. Its parameters come
from specifications and from call 3's other measurements, never from these rows' DRAM bytes:

- the miss penalty: a block's step takes 1 unit of arithmetic, 4·B_r·B_c·d FLOPs at the kernel's share of its
  measured rate R, and its missed bytes m take m / B more, B = DRAM bandwidth × step FLOPs / R, the bytes the block's
  share of the bandwidth (the preset's, 3,352 GB/s, over the blocks at once) delivers in that time. R is call 3's
  measured forward rate of the kernel at batch·heads 256, N 4,096, d 64 (``Kernel.rate``, from
  experiments/results/call3.json): 20.6 TFLOP/s for flash-swapped's CUDA-core kernel, taken for its float16 build
  too (it computes in float32), 168 for flash-swapped-tc, 243 for SDPA's flash forward
  (``iosim.gpu.dram.timing_of``);
- the spread of speeds: call 3's block trace of flash-swapped float32 (16 heads, N 65,536, d 128) gives the SMs'
  median block times within 10⁻⁵ of each other and the blocks' own within 1 % (sd); both are run, 0 and 0.01.

It is an explanation, not a prediction: these rows were measured before it was written, and its test is the next
call's rows. ``--predict GRID`` is that test's first half: the timed schedule's DRAM reads of the one-kernel forward
rows of an ncu grid (``experiments/ncu_traffic.py``) within ``--max-steps``, at both spreads, written to
experiments/results/gpu/predictions-<commit>-timed-<grid>.json before the call that measures them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from experiments import ncu_traffic, predict_next_call
from experiments.call3 import RAW, ncu_rows
from iosim.gpu.budget import tile_visits
from iosim.gpu.dram import timing_of
from iosim.gpu.hardware import BLOCK_SPREADS, hardware
from iosim.gpu.kernels import KERNELS
from iosim.gpu.timed import simulate_timed

REPO = Path(__file__).resolve().parents[1]
GPU = "h100"
MAX_STEPS = 12_000_000  # about a minute of the timed schedule


def timed(cfg: ncu_traffic.LaunchConfig, max_steps: int) -> dict | None:
    """A forward row's DRAM reads under the timed schedule at each spread, or None where it is a backward row, a pass
    of more than one kernel (split-kv's split and combine) or a grid of more than ``max_steps`` steps."""
    launch = predict_next_call.launch(cfg)
    steps = tile_visits(launch) * launch.problem.shape.bh
    kernel = KERNELS[cfg.impl]
    grids = kernel.grids(launch)
    if cfg.direction != "forward" or len(grids) != 1 or steps > max_steps:
        return None
    (grid,) = grids
    hw = hardware(GPU, schedule="timed")
    config = hw.config(grid)
    out = {"steps": steps, "concurrent": config.concurrent, "timed": []}
    for spread in BLOCK_SPREADS:
        start = time.perf_counter()
        timing = timing_of(kernel, kernel.own(launch), replace(hw, block_spread=spread), 1)
        counts = simulate_timed(grid, config, timing, hw.sms)
        out["miss_bytes_per_step"] = timing.miss_bytes_per_step
        out["timed"].append({"block_spread": spread, "read": counts.reads, "seconds": time.perf_counter() - start})
    return out


def explain(row: dict, max_steps: int) -> dict | None:
    """One measured row under the timed schedule, or None where ``timed`` has none."""
    cfg = ncu_traffic.LaunchConfig.from_record(row["config"])
    found = timed(cfg, max_steps)
    if found is None:
        return None
    for x in found["timed"]:
        x["read_over_measured"] = x["read"] / row["read"]
    return {"row": row["row"], "measured_read": row["read"], "lockstep_read": row["lockstep_read"],
            "staggered_read": row["staggered_read"], **found}


def predict(grid: str, max_steps: int) -> list[dict]:
    """The timed schedule's reads of a grid's forward rows within ``max_steps``, keyed as the ncu rows are."""
    rows = []
    for index, cfg in enumerate(ncu_traffic.GRIDS[grid]()):
        found = timed(cfg, max_steps)
        if found is not None:
            rows.append({"index": index, **asdict(cfg), "tiling": cfg.tile(), **found})
            print(f"{index:>3} {cfg.impl} {cfg.dtype} {cfg.batch}×{cfg.heads} N={cfg.n_q} d={cfg.d}"
                  f"{' causal' if cfg.causal else ''}: " + " / ".join(f"{x['read'] / 1e6:,.1f}"
                                                                       for x in found["timed"]) + " MB", flush=True)
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None,
                        help="default experiments/results/timed_call3.json, or with --predict experiments/results/gpu/"
                             "predictions-<commit>-timed-<grid>.json")
    parser.add_argument("--max-steps", type=int, default=MAX_STEPS)
    parser.add_argument("--predict", choices=sorted(ncu_traffic.GRIDS), default=None,
                        help="predict the forward rows of this ncu grid instead of explaining call 3's")
    args = parser.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    command = "python -m experiments.timed_call3 " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.predict is not None:
        name = f"predictions-{commit[:7]}-timed-{args.predict}.json"
        out = args.out or REPO / "experiments" / "results" / "gpu" / name
        result = {"command": command, "commit": commit, "gpu": GPU, "grid": args.predict, "schedule": "timed",
                  "kind": "prediction before the GPU run", "block_spreads": list(BLOCK_SPREADS),
                  "rows": predict(args.predict, args.max_steps)}
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out}")
        return result
    rows = []
    for row in ncu_rows()["measured"]:
        found = explain(row, args.max_steps)
        if found is None:
            continue
        rows.append(found)
        timed = " / ".join(f"{x['read'] / 1e6:,.1f}" for x in found["timed"])
        print(f"{found['row']:<58} measured {found['measured_read'] / 1e6:>9,.1f} MB  lockstep "
              f"{found['lockstep_read'] / 1e6:>10,.1f}  staggered {found['staggered_read'] / 1e6:>12,.1f}  timed "
              f"(block spread {' / '.join(map(str, BLOCK_SPREADS))}) {timed}", flush=True)
    result = {"command": command, "commit": commit, "gpu": GPU, "measurements": str(RAW.relative_to(REPO)),
              "kind": "explanation after the measurement", "rows": rows}
    out = args.out or REPO / "experiments" / "results" / "timed_call3.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
