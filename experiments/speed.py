"""Every speed target of the simulator, measured on this machine; nothing is asserted.

Commands run as fresh processes, start-up included; numeric runs are timed against
plain numpy float64 attention on the same inputs. The targets, declared as data below:

- the default ``sweep --M 100k`` under 10 s, ``sweep --pass fwd+bwd`` under 2 s, and
  ``sweep --gpu h100`` with the L2 model's DRAM columns under 10 s;
- numeric ``simulate("flash")`` at batch·heads = 8, N = 4096, d = 64, M = 100k within 3×
  of numpy standard attention, and numeric ``gradients("flash-swapped")`` at
  batch·heads = 8, N = 2048 within 3× of numpy standard attention's backward;
- every count and prediction at N = 10⁹, causal or not, under 0.5 s;
- ``optimize`` for one (N, d, M) and every algorithm under 5 s, ``bound`` with 40 values
  of M under 30 s;
- a sweep of 3,200 rows with ``--json`` and ``--csv`` within 1.2× of the same sweep
  without them (records are written in time linear in the rows);
- the L2 model's DRAM bytes (``iosim.gpu.dram.pass_counts`` on call 1's kernels, the H100 preset) of any
  configuration of call 1, forward or backward, under 2 s (issue 17), in process;
- the same of every row of the next GPU call's short grids (issue 28, item 4: ``experiments/ncu_traffic.py``'s
  short-schedule, short-rest, call3-sdpa and call5-sdpa) under the lockstep schedule at the preset's effective L2,
  and under the timed schedule for the one-kernel forward rows of kernels with a measured rate, under 2 s each
  (``--only grid``; timed once each, the slowest bands taking several seconds). A timed row's prediction is its band:
  its counts at the blocks' spread of the preset and at the two ends (``iosim.gpu.dram.spreads_of``), made as
  ``iosim.dram`` and the sweep make them, from one grid with the three loops side by side;
- the tile visits a second that the DRAM level's budget (``iosim.gpu.budget``) takes for the simulation of a grid's
  every block, against what its slowest grid makes (``--only rates``): flash's one block per head over 32 heads
  grouped by 8, d = 128, decoding over 4Mi and 16Mi keys, causal or not, on the H100 preset.

Usage: python -m experiments.speed [--repeats 3] [--out experiments/results/speed.json] [--only l2|grid|rates]
[--smoke] (``--only l2`` measures the L2 cases alone, ``--only grid`` the short grids' rows, ``--only rates`` the
budget's rate, each into speed_<part>.json;
``--smoke`` runs every part once at tiny sizes, which CI does to keep the script working: its seconds say nothing
about the targets.)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

import iosim
from iosim.core.gpus import resolve_M
from iosim.core.problem import AttentionShape, Problem
from iosim.core.tiling import Tiling
from iosim.gpu import call1
from iosim.gpu.budget import SIMULATION_VISITS_PER_S, tile_visits
from iosim.gpu.dram import kernel_counts_at, pass_counts, spreads_of
from iosim.gpu.hardware import hardware
from iosim.gpu.kernel import Kernel, Launch
from iosim.gpu.kernels import get_kernel

# (name, iosim command line, target seconds): timed as fresh processes.
COMMANDS = [
    ("sweep --M 100k (the default)", ["sweep", "--M", "100k"], 10.0),
    ("sweep --pass fwd+bwd", ["sweep", "--pass", "fwd+bwd"], 2.0),
    ("sweep --gpu h100 (with the DRAM columns)", ["sweep", "--gpu", "h100"], 10.0),
    ("optimize N=4096 d=64 M=100k", ["optimize", "--N", "4096", "--d", "64", "--M", "100k"], 5.0),
    ("optimize N=4096 d=64 M=100k causal", ["optimize", "--N", "4096", "--d", "64", "--M", "100k", "--causal"], 5.0),
    ("optimize N=65536 d=128 M=192KiB", ["optimize", "--N", "65536", "--d", "128", "--M", "192KiB"], 5.0),
    ("bound N=4096 d=64, 40 M", ["bound", "--N", "4096", "--d", "64", "--points", "40"], 30.0),
    ("bound N=4096 d=64 causal, 40 M", ["bound", "--N", "4096", "--d", "64", "--points", "40", "--causal"], 30.0),
]
FORWARD_CASE = dict(batch=1, heads=8, N=4096, d=64, M="100k", algorithm="flash")
BACKWARD_CASE = dict(batch=1, heads=8, N=2048, d=64, M="100k", algorithm="flash-swapped")
RATIO_TARGET = 3.0  # simulator over numpy
HUGE_COUNT = dict(N=10**9, d=64, M="100k")  # every algorithm, causal and not, counted and predicted
HUGE_TARGET = 0.5
RECORDS_GRID = ["sweep", "--N", *map(str, range(256, 256 + 400 * 64, 64)), "--d", "64", "128",
                "--algo", "standard", "flash", "flash-swapped", "split-kv"]  # 400 N × 2 d × 4 algorithms
RECORDS_TARGET = 1.2  # with --json and --csv over without
# Call 1's forward configurations (float32, full attention) at the tiles its kernels ran, by (impl, d):
# experiments/results/gpu/call1/ncu/configs.json. batch·heads 1 at N up to 16384, 256 (16 × 16) up to 4096.
# Its backward configurations: the same shapes up to N = 4096, square tiles (32 × 32 at d = 64, 16 × 16 at 128).
L2_TILES = {("flash", "forward", 64): (32, 32), ("flash", "forward", 128): (16, 16),
            ("flash-swapped", "forward", 64): (64, 32), ("flash-swapped", "forward", 128): (32, 16),
            **{(impl, "backward", d): (B, B) for impl in ("flash", "flash-swapped") for d, B in ((64, 32), (128, 16))}}
L2_CASES = [(impl, direction, batch, heads, n, d) for impl in ("flash", "flash-swapped") for direction in
            ("forward", "backward") for d in (64, 128)
            for batch, heads, ns in ((1, 1, (1024, 4096, 16384)), (16, 16, (1024, 4096))) for n in ns
            if direction == "forward" or n <= 4096]
L2_TARGET = 2.0  # seconds per configuration
# --smoke: every part once, at tiny sizes
SMOKE_COMMANDS = [("sweep --N 256 --d 64", ["sweep", "--N", "256", "--d", "64"], 10.0)]
SMOKE_FORWARD = dict(FORWARD_CASE, heads=1, N=64)
SMOKE_BACKWARD = dict(BACKWARD_CASE, heads=1, N=64)
SMOKE_RECORDS = ["sweep", "--N", "256", "512", "--d", "64", "--algo", "flash"]
SMOKE_L2 = [("flash-swapped", "forward", 1, 1, 1024, 64), ("flash", "backward", 1, 1, 1024, 64)]
GRIDS = ("short-schedule", "short-rest", "call3-sdpa", "call5-sdpa")  # issue 28, item 4: the next call's rows
# the budget's simulation rate on its slowest grid: flash's decode over grouped heads (six accesses a step)
RATE_CASES = [dict(N=1, N_k=n_k, d=128, heads=32, kv_heads=8, causal=causal) for n_k in (2**22, 2**24)
              for causal in (False, True)]
SMOKE_RATES = [dict(N=1, N_k=2**16, d=128, heads=32, kv_heads=8, causal=True)]


def numpy_attention(q, k, v):
    """Plain float64 softmax(QKᵀ/√d)V with whole N × N matrices."""
    s = (q @ np.swapaxes(k, -1, -2)) / np.sqrt(q.shape[-1])
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return p @ v


def numpy_attention_backward(q, k, v, do):
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


def fresh_process(command: list[str]):
    return lambda: subprocess.run([sys.executable, "-m", "iosim", *command], check=True, capture_output=True)


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def numeric_ratios(repeats: int, forward: dict = FORWARD_CASE, backward: dict = BACKWARD_CASE) -> list[dict]:
    out, rng = [], np.random.default_rng(0)
    for case, pass_ in ((forward, "fwd"), (backward, "bwd")):
        q, k, v, do = (rng.standard_normal((case["batch"], case["heads"], case["N"], case["d"])) for _ in range(4))
        if pass_ == "fwd":
            numpy_s = best_of(repeats, lambda: numpy_attention(q, k, v))
            sim_s = best_of(repeats, lambda: iosim.simulate(case["algorithm"], q, k, v, M=case["M"]))
        else:
            numpy_s = best_of(repeats, lambda: numpy_attention_backward(q, k, v, do))
            sim_s = best_of(repeats, lambda: iosim.gradients(case["algorithm"], q, k, v, do, M=case["M"]))
        out.append(dict(case=case, pass_=pass_, simulator_seconds=sim_s, numpy_seconds=numpy_s,
                        ratio=sim_s / numpy_s, target_ratio=RATIO_TARGET))
        print(f"numeric {case['algorithm']} {pass_}: {sim_s:.2f} s vs numpy {numpy_s:.2f} s = {sim_s / numpy_s:.2f}x "
              f"(target <= {RATIO_TARGET:g}x)")
    return out


def records_overhead(repeats: int, grid: list[str] = RECORDS_GRID) -> dict:
    """The 3,200-row sweep (``grid``) with and without saving its records."""
    with tempfile.TemporaryDirectory() as tmp:
        saving = [*grid, "--json", f"{tmp}/rows.json", "--csv", f"{tmp}/rows.csv"]
        bare_s = best_of(repeats, fresh_process(grid))
        saving_s = best_of(repeats, fresh_process(saving))
    print(f"sweep of 3,200 rows: {bare_s:.2f} s, with --json and --csv {saving_s:.2f} s = {saving_s / bare_s:.2f}x "
          f"(target <= {RECORDS_TARGET:g}x)")
    command = ("python -m iosim " + " ".join(RECORDS_GRID[:3]) + " ... (400 N) --d 64 128 --algo standard flash "
               "flash-swapped split-kv") if grid is RECORDS_GRID else "python -m iosim " + " ".join(grid)
    return dict(command=command, rows=3200 if grid is RECORDS_GRID else None, seconds=bare_s,
                seconds_with_json_and_csv=saving_s, ratio=saving_s / bare_s, target_ratio=RECORDS_TARGET)


def l2_path(kernel: Kernel, launch: Launch) -> str:
    """Which of ``kernel_counts``'s paths each kernel of the pass takes."""
    grids = kernel.grids(launch)
    closed = kernel.closed_form(launch) if len(grids) == 1 else None
    paths = []
    for g in grids:
        config = hardware("h100").config(g)
        form = None if closed is None else closed(launch.problem, launch.tiling, config.capacity, config.concurrent)
        paths.append("closed form" if form is not None else "lockstep" if g.uniform else "simulation")
    return ", ".join(paths)


def l2_cases(repeats: int, cases: list[tuple] = L2_CASES) -> list[dict]:
    """``pass_counts`` of each of call 1's configurations on its kernels (``iosim.gpu.call1``) and the H100 preset, and
    which path each kernel took."""
    out = []
    kernels = {"flash": call1.FLASH, "flash-swapped": call1.FLASH_SWAPPED}
    for impl, direction, batch, heads, n, d in cases:
        pb = Problem(AttentionShape(batch, heads, n, n, d), tau=1.0, dtype="float32")
        tiling = Tiling(*L2_TILES[impl, direction, d])
        launch = Launch(pb, tiling, direction == "backward")
        seconds = best_of(repeats, lambda: pass_counts(kernels[impl], launch, hardware("h100"), budget_s=None))
        out.append(dict(impl=impl, direction=direction, batch_heads=batch * heads, N=n, d=d, Br=tiling.Br,
                        Bc=tiling.Bc, path=l2_path(kernels[impl], launch), seconds=seconds,
                        target_seconds=L2_TARGET))
    for direction in ("forward", "backward"):
        rows = [r for r in out if r["direction"] == direction]
        slowest = max(rows, key=lambda r: r["seconds"])
        print(f"L2 model, call 1's {len(rows)} {direction} configurations: slowest {slowest['seconds']:.3f} s "
              f"({slowest['impl']}, {slowest['batch_heads']} × {slowest['N']} × {slowest['d']}; "
              f"target < {L2_TARGET:g} s)")
    return out


def rate_cases(repeats: int, cases: list[dict] = RATE_CASES) -> list[dict]:
    """``iosim.dram`` of flash on the H100 preset at each case, as the budget lets it run, and its tile visits a
    second beside the rate the budget takes (``SIMULATION_VISITS_PER_S``)."""
    out = []
    M = resolve_M(None, "h100", "float16")
    for case in cases:
        found = []
        seconds = best_of(repeats, lambda: found.append(iosim.dram("flash", **case, M=M, gpu="h100", budget_s=None)))
        launch = Launch(found[-1].problem, found[-1].forward_tiling, False)
        visits = tile_visits(launch) * launch.problem.shape.bh  # the simulation's work, as the budget counts it
        out.append(dict(case, algorithm="flash", gpu="h100", M=M, Br=launch.tiling.Br, Bc=launch.tiling.Bc,
                        path=l2_path(get_kernel("flash"), launch), tile_visits=visits, seconds=seconds,
                        visits_per_s=visits / seconds, budget_visits_per_s=SIMULATION_VISITS_PER_S))
    slowest = min(out, key=lambda r: r["visits_per_s"])
    print(f"simulation of flash's decode over grouped heads: {slowest['visits_per_s']:.3g} tile visits/s at the "
          f"slowest (N_k = {slowest['N_k']:,}{', causal' if slowest['causal'] else ''}); the budget takes "
          f"{SIMULATION_VISITS_PER_S:.3g}")
    return out


def grid_cases(names: tuple[str, ...] = GRIDS, smoke: bool = False) -> list[dict]:
    """``kernel_counts_at`` of every row of the short grids (the first row of the first alone with ``smoke``) at the
    kernel and tile each row's prediction takes (``predict_next_call.launch``), the H100 preset, lockstep; and of its
    one-kernel forward rows of a kernel with a measured rate, the timed schedule's band (at ``spreads_of``); timed
    once."""
    from experiments import ncu_traffic, predict_next_call
    from iosim.gpu.kernels import KERNELS

    out = []
    for name in names[:1] if smoke else names:
        configs = ncu_traffic.GRIDS[name]()
        for i, cfg in enumerate(configs[:1] if smoke else configs):
            launch, kernel = predict_next_call.launch(cfg), KERNELS[cfg.impl]
            timed = cfg.direction == "forward" and kernel.rate is not None and len(kernel.grids(launch)) == 1
            for schedule in ("lockstep", "timed") if timed else ("lockstep",):
                start = time.perf_counter()
                hw = hardware("h100", schedule=schedule)
                kernel_counts_at(kernel, launch, hw, spreads_of(hw), budget_s=None)
                out.append(dict(grid=name, index=i, impl=cfg.impl, direction=cfg.direction, dtype=cfg.dtype,
                                batch_heads=cfg.batch * cfg.heads, N=cfg.n_q, d=cfg.d, causal=cfg.causal,
                                sawtooth=bool(cfg.sawtooth), kv_heads=cfg.kv_heads, schedule=schedule,
                                block_spreads=list(spreads_of(hw)),
                                seconds=time.perf_counter() - start, target_seconds=L2_TARGET))
    for schedule in ("lockstep", "timed"):
        rows = [r for r in out if r["schedule"] == schedule]
        slow = [r for r in rows if r["seconds"] > L2_TARGET]
        print(f"L2 model, {schedule}, the short grids' {len(rows)} rows: {len(rows) - len(slow)} under {L2_TARGET:g} s;"
              f" over it: " + (", ".join(
                  f"{r['grid']} #{r['index']} ({r['impl']}{' causal' if r['causal'] else ''}"
                  f"{' sawtooth' if r['sawtooth'] else ''}, {r['batch_heads']} × {r['N']:,} × {r['d']}) "
                  f"{r['seconds']:.1f} s" for r in slow) or "none"))
    return out


def timed_floor(rows: list[dict], repeats: int, every: bool = False) -> list[dict]:
    """For each timed row of ``grid_cases`` over the target (``every``: each timed row, as ``--smoke`` does to keep
    this working): its compiled event loop alone, best of ``repeats``, as the
    row runs it, at zero spread (every block at one speed: they step in slot order) and with every step's accesses
    taken out (the events in their order, no L2 work; the rare miss penalties with them). Where the last is over the
    target, no faster L2 brings the row under it: the events' order is the bound."""
    from experiments import ncu_traffic, predict_next_call
    from iosim.gpu import timed_engine
    from iosim.gpu.dram import timing_of
    from iosim.gpu.kernels import KERNELS
    from iosim.gpu.timed import draws

    out = []
    for row in rows:
        if row["schedule"] != "timed" or (row["seconds"] <= row["target_seconds"] and not every):
            continue
        cfg = ncu_traffic.GRIDS[row["grid"]]()[row["index"]]
        kernel = KERNELS[cfg.impl]
        launch = kernel.own(predict_next_call.launch(cfg))
        hw = hardware("h100", schedule="timed")
        (grid,) = kernel.grids(launch)
        config = hw.config(grid)
        sm_speed, block_speed, penalty = draws(grid.blocks, timing_of(kernel, launch, hw, 1), hw.sms)
        flat = timed_engine.flatten(grid)
        none = np.zeros(0, dtype=np.int64)
        empty = replace(flat, step_offsets=np.zeros_like(flat.step_offsets), keys=none, nbytes=none, modes=none,
                        partner_bytes=none)
        n = len(grid.tiles.tensors)

        def loop(f, block):
            return best_of(repeats, lambda: timed_engine.run(f, n, config.capacity, config.concurrent, sm_speed,
                                                             block, penalty))

        steps = int(timed_engine.step_counts(flat)[2].sum())
        found = dict(grid=row["grid"], index=row["index"], steps=steps, loop_seconds=loop(flat, block_speed),
                     zero_spread_seconds=loop(flat, np.ones_like(block_speed)),
                     without_l2_seconds=loop(empty, block_speed))
        out.append(found)
        print(f"{row['grid']} #{row['index']}: {steps:,} steps, the loop {found['loop_seconds']:.2f} s, at zero "
              f"spread {found['zero_spread_seconds']:.2f} s, without its L2 work {found['without_l2_seconds']:.2f} s")
    return out


def machine(load_before) -> dict:
    return {"platform": platform.platform(), "processor": platform.machine(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "numpy": np.__version__, "load_average_before": load_before,
            "load_average_after": os.getloadavg()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="default experiments/results/speed.json (with --only, "
                                                     "speed_<part>.json); --smoke needs its own")
    parser.add_argument("--only", choices=("l2", "grid", "rates"), help="measure only these cases")
    parser.add_argument("--smoke", action="store_true", help="every part once at tiny sizes (CI): no timing")
    args = parser.parse_args(argv)
    if args.smoke and args.out is None:
        parser.error("--smoke measures nothing worth keeping: give --out PATH (not the committed speed.json)")
    args.out = args.out or f"experiments/results/speed{'_' + args.only if args.only else ''}.json"
    load_before = os.getloadavg()
    smoke = args.smoke
    if smoke:
        args.repeats = 1
    l2 = SMOKE_L2 if smoke else L2_CASES
    if args.only is not None:
        part = (l2_cases(args.repeats, l2) if args.only == "l2" else grid_cases(smoke=smoke) if args.only == "grid"
                else rate_cases(args.repeats, SMOKE_RATES if smoke else RATE_CASES))
        result = {args.only: part}
        if args.only == "grid":
            result["timed_floor"] = timed_floor(part, args.repeats, smoke)
        result |= {"machine": machine(load_before), "commit": git_commit(),
                  "command": "python -m experiments.speed " + " ".join(sys.argv[1:]), "repeats": args.repeats,
                  "statistic": "best of repeats, wall-clock seconds"}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(f"written to {args.out}")
        return

    commands = []
    for name, command, target in SMOKE_COMMANDS if smoke else COMMANDS:
        seconds = best_of(args.repeats, fresh_process(command))
        commands.append(dict(name=name, command="python -m iosim " + " ".join(command), seconds=seconds,
                             target_seconds=target))
        print(f"{name}: {seconds:.2f} s (target < {target:g} s)")

    huge = {f"{a}{' causal' if causal else ''}": best_of(args.repeats, lambda: (
        iosim.count(a, causal=causal, **HUGE_COUNT), iosim.predict(a, causal=causal, **HUGE_COUNT)))
        for a in (["flash"] if smoke else [n for n, x in iosim.ALGORITHMS.items() if not x.accepts("block_mask")])
        for causal in (False, True)}
    print(f"count + predict at N = 10^9: slowest {max(huge.values()):.4f} s (target < {HUGE_TARGET:g} s)")

    result = {
        "commands": commands,
        "numeric": numeric_ratios(args.repeats, *((SMOKE_FORWARD, SMOKE_BACKWARD) if smoke else ())),
        "records": records_overhead(args.repeats, SMOKE_RECORDS if smoke else RECORDS_GRID),
        "l2": l2_cases(args.repeats, l2),
        "huge_count_case": HUGE_COUNT, "huge_count_seconds": huge, "huge_count_target_seconds": HUGE_TARGET,
        "machine": machine(load_before),
        "commit": git_commit(),
        "command": "python -m experiments.speed " + " ".join(sys.argv[1:] if argv is None else argv),
        "repeats": args.repeats,
        "statistic": "best of repeats, wall-clock seconds",
        "smoke": smoke,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
