"""Call 3 on an H100 (2026-11-27), set against what was committed before it: DRAM bytes, schedule, L2, speed.

    python -m experiments.call3 [--figures docs/figures] [--json experiments/results/call3.json]

Reads the raw output in experiments/results/gpu/call3/ (README.md there: device, versions, commit, commands) and
prints, and writes as JSON:

- each ncu row's DRAM bytes read beside the two predictions committed before the run (lockstep and staggered;
  experiments/call3_short.py names the files), and the rows the run did not reach;
- what the block-timing probe shows of the schedule: per wave, the spread of its blocks' starts and their durations;
- the L2 capacity curve: the share of S bytes the second pass read from DRAM, against the h100 preset's 37 MB;
- the kernels' TFLOP/s against the targets of issue 29, with the static model's ceiling beside them;
- what the kernel tests and compute-sanitizer reached before their time limits.

docs/figures/call3.png draws the first three. Nothing here changes a prediction; docs/gpu-logs/2026-11-27-h100-call3.md
reads the numbers.
"""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

import numpy as np

from experiments import call3_short, ncu_traffic
from experiments.figure_cli import plt, run
from iosim.core.gpus import GPUS

REPO = Path(__file__).resolve().parents[1]
RAW = REPO / "experiments" / "results" / "gpu" / "call3"
TRACES = {"fp16-h1-n131072-d128": "first/trace", "fp16-h1-n131072-d128-sawtooth": "first/trace",
          "fp32-h16-n65536-d128": "third"}
STATIC_MODEL = REPO / "experiments" / "results" / "kernels_static_model_sm90.json"
WITHIN = 0.10  # a prediction "holds" within 10%, as the call-1 logs count it


def ncu_rows() -> dict:
    lockstep, staggered = call3_short.predictions(call3_short.LOCKSTEP), call3_short.predictions(call3_short.STAGGERED)
    measured, unreached = [], []
    for grid in ("short-schedule", "short-rest"):
        folder = RAW / "first" / f"ncu-{grid}"
        configs = json.loads((folder / "configs.json").read_text())
        done = {m["index"]: m for m in ncu_traffic.measured_rows(folder)}
        for index, cfg in enumerate(configs):
            k = ncu_traffic.join_key(cfg)
            row = {"grid": grid, "row": call3_short.describe(cfg), "config": cfg,
                   "lockstep_read": lockstep[k]["reads"], "staggered_read": staggered[k]["reads"]}
            m = done.get(index)
            if m is None:
                unreached.append(row)
                continue
            row.update(kernels=m["kernels"], read=int(m["read_bytes"]), write=int(m["write_bytes"]),
                       read_over_lockstep=m["read_bytes"] / row["lockstep_read"],
                       read_over_staggered=m["read_bytes"] / row["staggered_read"])
            measured.append(row)

    def holds(rows, field):
        return sum(abs(r[field] - 1) <= WITHIN for r in rows)

    plain = [r for r in measured if not r["config"]["sawtooth"] and not r["config"]["causal"]]
    return {"measured": measured, "unreached": unreached,
            "within_10pct": {"lockstep": holds(measured, "read_over_lockstep"),
                             "staggered": holds(measured, "read_over_staggered"), "of": len(measured)},
            "plain_order_within_10pct": {"lockstep": holds(plain, "read_over_lockstep"),
                                         "staggered": holds(plain, "read_over_staggered"), "of": len(plain)}}


def trace_rows() -> dict:
    out = {}
    for name, folder in TRACES.items():
        summary = json.loads((RAW / folder / "summary.json").read_text())["traces"][name]
        z = np.load(RAW / folder / f"{name}.npz")
        start, end = z["start"], z["end"]
        at_once = summary["stamps"]["most_blocks_at_once"]
        order = np.argsort(start, kind="stable")  # a wave: the next `at_once` blocks to start
        waves = []
        for first in range(0, len(start), at_once):
            s, e = start[order[first:first + at_once]], end[order[first:first + at_once]]
            waves.append({"start_spread_us": float(s.max() - s.min()) / 1e3,
                          "duration_ms": [float(np.percentile(e - s, p)) / 1e6 for p in (10, 50, 90)]})
        out[name] = {
            "shape": summary["shape"], "blocks": summary["blocks"], "blocks_at_once": at_once,
            "blocks_at_once_per_sm": summary["stamps"]["most_blocks_at_once_on_one_sm"],
            "waves": len(waves), "largest_start_spread_us": max(w["start_spread_us"] for w in waves),
            "longest_block_ms": max(w["duration_ms"][2] for w in waves),
            "median_block_ms": float(np.median([w["duration_ms"][1] for w in waves])),
            "largest_start_spread_of_block": max(w["start_spread_us"] / 1e3 / w["duration_ms"][1] for w in waves),
            "kernel_s": {"untraced": summary["runs"][-1]["untraced_s"], "traced": summary["runs"][-1]["traced_s"]},
            "kernel_s_note": "the last run (the first compiles); fp32-h16 ran once, its time includes compilation",
            "waves_detail": waves,
        }
    return out


def l2_curve() -> dict:
    report = json.loads((RAW / "second" / "l2" / "l2_capacity_profiled.json").read_text())
    lines = [line for line in (RAW / "second" / "l2" / "ncu.csv").read_text().splitlines() if line.startswith('"')]
    reads = [float(r["Metric Value"].replace(",", "")) for r in csv.DictReader(lines)
             if r["Metric Name"] == "dram__bytes_read.sum"]
    repeats = len(reads) // len(report["rows"])
    rows = []
    for i, r in enumerate(report["rows"]):
        miss = [x / r["bytes"] for x in reads[i * repeats:(i + 1) * repeats]]
        rows.append({"mb": r["mb"], "miss_share": float(np.median(miss)), "miss_shares": miss})
    sizes, share = [r["mb"] for r in rows], [r["miss_share"] for r in rows]
    half = float(np.interp(0.5, share, sizes))  # the miss share rises with S: where half the bytes miss
    h100 = GPUS["h100"]
    return {"rows": rows, "half_missed_mb": half,
            "all_hit_up_to_mb": max(s for s, m in zip(sizes, share) if m < 0.01),
            "all_missed_from_mb": min(s for s, m in zip(sizes, share) if m > 0.99),
            "preset_effective_mb": h100.l2_effective.value / 1e6, "preset_nominal_mb": h100.l2.value / 1e6}


def bench_rows(raw: Path = RAW) -> list[dict]:
    """The gpu_bench records under raw/*/bench/, one row each: TFLOP/s and ms of each mode."""
    rows = []
    for path in sorted(raw.glob("*/bench/*.json")):
        record = json.loads(path.read_text())
        p = record["parameters"]
        row = {"file": str(path.relative_to(raw)), "impl": p["impl"], "dtype": p["dtype"], "bh": p["batch_size"]
               * p["num_heads"], "N": p["seq_len"], "d": p["emb_dim"] // p["num_heads"], "causal": p["causal"]}
        for mode in ("forward", "backward", "forward_backward"):
            row[mode] = record.get(mode, {}).get("FLOPS(TFLOPs/s)")
            row[f"{mode}_ms"] = (None if record.get(mode, {}).get("time(s)") is None
                                 else record[mode]["time(s)"] * 1e3)
        row["error"] = record.get("error")
        rows.append(row)
    return rows


def best(rows, **match):
    """The latest record matching `match` (a later call measured the same configuration again)."""
    found = [r for r in rows if all(r[k] == v for k, v in match.items())]
    return found[-1] if found else None


def targets(rows: list[dict]) -> list[dict]:
    static = {r["kernel"]: r for r in json.loads(STATIC_MODEL.read_text())["kernels"]}
    fs = best(rows, impl="flash-swapped", dtype="float32", bh=256, N=4096, d=64)
    tc = best(rows, impl="flash-swapped-tc", dtype="float16", bh=256, N=4096, d=64)
    sdpa = best(rows, impl="torch-sdpa", dtype="float16", bh=256, N=4096, d=64)
    fs_ceiling = next(v["ceiling_tflops"] for k, v in static.items()
                      if k.startswith("flash-swapped forward d=64 fp32 ") and "causal" not in k)
    out = [{"target": "flash-swapped float32 forward ≥ 25 TFLOP/s (256 × 4096, d 64)", "measured": fs["forward"],
            "met": fs["forward"] >= 25, "static_ceiling": fs_ceiling}]
    for n in (2048, 4096, 8192):
        mine, eager = best(rows, impl="flash-swapped", bh=32, N=n), best(rows, impl="torch", bh=32, N=n)
        for mode in ("forward", "backward", "forward_backward"):
            out.append({"target": f"flash-swapped float32 faster than torch eager, {mode}, N = {n} (32 heads, d 64)",
                        "measured": mine[f"{mode}_ms"], "torch_eager": eager[f"{mode}_ms"],
                        "met": mine[f"{mode}_ms"] < eager[f"{mode}_ms"]})
    for mode, factor in (("forward", 2), ("backward", 3)):
        out.append({"target": f"flash-swapped-tc float16 {mode} within {factor}× of SDPA's flash backend "
                              f"(256 × 4096, d 64)", "measured": tc[mode], "sdpa": sdpa[mode],
                    "ratio": sdpa[mode] / tc[mode], "met": sdpa[mode] / tc[mode] <= factor})
    return out


def logs() -> dict:
    second = RAW / "second"
    out = {}
    for tool in ("memcheck", "racecheck"):
        text = (second / f"{tool}.log").read_text()
        out[tool] = {"launched": len(re.findall(r"^launched \d+", text, re.M)),
                     "of": len(ncu_traffic.sanitize_grid()),
                     "reports": len(re.findall(r"^========= (?!COMPUTE-SANITIZER$)", text, re.M))}
    progress = "".join(line for line in (second / "pytest.log").read_text().splitlines()
                       if re.fullmatch(r"[.FsEx]+( *\[ *\d+%\])?", line.strip()) or line.startswith("...")
                       and "warn" not in line)
    marks = re.sub(r"\[ *\d+%\]|[^.FsEx]", "", progress)
    out["pytest"] = {"passed": marks.count("."), "failed": marks.count("F"), "skipped": marks.count("s"),
                     "errors": marks.count("E"), "collected": 145}
    steps = {}
    for half in ("first", "second"):
        for line in (RAW / half / "steps.txt").read_text().splitlines():
            name, rc, seconds = re.fullmatch(r"(\S+) rc=(\d+) seconds=(\d+)", line).groups()
            steps[f"{half}/{name}"] = {"rc": int(rc), "seconds": int(seconds), "cut": rc == "124"}
    out["steps"] = steps
    return out


def collect() -> dict:
    return {"ncu": ncu_rows(), "traces": trace_rows(), "l2": l2_curve(), "bench": bench_rows(),
            "targets": targets(bench_rows()), "logs": logs()}


def plot(data: dict):
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 5))
    rows = data["ncu"]["measured"]
    x = np.arange(len(rows))
    a.scatter(x, [r["read"] / 1e6 for r in rows], marker="o", s=60, color="black", label="measured (ncu)", zorder=3)
    a.scatter(x, [r["lockstep_read"] / 1e6 for r in rows], marker="_", s=300, color="tab:blue", label="lockstep")
    a.scatter(x, [r["staggered_read"] / 1e6 for r in rows], marker="x", color="tab:red", label="staggered")
    a.set_yscale("log")
    a.set_xticks(x, [r["row"].replace("flash-swapped", "fs").replace(" forward", "") for r in rows], rotation=75,
                 fontsize=7)
    a.set_ylabel("DRAM bytes read (MB)")
    a.set_title("DRAM read: measured vs predicted before the run")
    a.legend(fontsize=8)
    l2 = data["l2"]
    b.plot([r["mb"] for r in l2["rows"]], [r["miss_share"] for r in l2["rows"]], "o-", color="black")
    b.axvline(l2["preset_effective_mb"], color="tab:blue", ls="--",
              label=f"h100 preset, {l2['preset_effective_mb']:.0f} MB")
    b.axvline(l2["preset_nominal_mb"], color="gray", ls=":", label=f"nominal {l2['preset_nominal_mb']:.1f} MB")
    b.set_xlabel("S, bytes read twice (MB)")
    b.set_ylabel("share of the second pass read from DRAM")
    b.set_title("L2 capacity (ncu, all 132 SMs)")
    b.legend(fontsize=8)
    for name, t in data["traces"].items():
        spreads = [w["start_spread_us"] for w in t["waves_detail"]]
        c.plot(range(len(spreads)), spreads, ".-", label=f"{name} ({t['waves']} waves)")
    c.set_yscale("symlog", linthresh=1)
    c.set_xlabel("wave")
    c.set_ylabel("spread of the wave's block starts (µs)")
    c.set_title("Block schedule: waves start together")
    c.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _mb(x: float) -> str:
    return f"{x / 1e6:,.1f}"


def text(data: dict) -> str:
    n = data["ncu"]
    lines = ["| row | measured MB | lockstep MB | meas/lockstep | staggered MB | meas/staggered | kernel |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in n["measured"]:
        lines.append(f"| {r['row']} | {_mb(r['read'])} | {_mb(r['lockstep_read'])} | {r['read_over_lockstep']:.3f} "
                     f"| {_mb(r['staggered_read'])} | {r['read_over_staggered']:.3g} | {r['kernels'][0][:40]} |")
    w, p = n["within_10pct"], n["plain_order_within_10pct"]
    lines += ["", f"Within 10% of the measured DRAM read: lockstep {w['lockstep']} of {w['of']} rows, staggered "
              f"{w['staggered']}; in the plain K/V order without the causal mask, lockstep {p['lockstep']} of "
              f"{p['of']}, staggered {p['staggered']}. Not reached (the step was cut): {len(n['unreached'])} rows.", ""]
    lines += ["| trace | blocks | at once (per SM) | waves | largest start spread in a wave (µs) "
              "| as a share of a block | median block (ms) | kernel s (untraced / traced) |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name, t in data["traces"].items():
        lines.append(f"| {name} | {t['blocks']} | {t['blocks_at_once']} ({t['blocks_at_once_per_sm']}) | {t['waves']} "
                     f"| {t['largest_start_spread_us']:.1f} | {100 * t['largest_start_spread_of_block']:.1f}% "
                     f"| {t['median_block_ms']:.2f} "
                     f"| {t['kernel_s']['untraced']:.3f} / {t['kernel_s']['traced']:.3f} |")
    l2 = data["l2"]
    lines += ["", "| S (MB) | " + " | ".join(f"{r['mb']:g}" for r in l2["rows"]) + " |",
              "| --- |" + " ---: |" * len(l2["rows"]),
              "| read from DRAM | " + " | ".join(f"{r['miss_share']:.3f}" for r in l2["rows"]) + " |", "",
              f"Every byte hits up to {l2['all_hit_up_to_mb']:g} MB, half miss at {l2['half_missed_mb']:.1f} MB, "
              f"all miss from {l2['all_missed_from_mb']:g} MB (h100 preset: {l2['preset_effective_mb']:.0f} MB "
              f"effective of {l2['preset_nominal_mb']:.1f} MB).", ""]
    lines += ["| target | measured | against | met |", "| --- | ---: | ---: | --- |"]
    for t in data["targets"]:
        against = t.get("torch_eager", t.get("sdpa", t.get("static_ceiling")))
        lines.append(f"| {t['target']} | {t['measured']:.2f} | {against:.2f} | {'yes' if t['met'] else 'no'} |")
    lg = data["logs"]
    lines += ["", f"compute-sanitizer: memcheck launched {lg['memcheck']['launched']} of {lg['memcheck']['of']} "
              f"configurations and reported {lg['memcheck']['reports']} errors; racecheck "
              f"{lg['racecheck']['launched']} of {lg['racecheck']['of']}, {lg['racecheck']['reports']} reports. "
              f"pytest on the GPU, cut at 130 s: {lg['pytest']['passed']} passed, {lg['pytest']['failed']} failed, "
              f"{lg['pytest']['skipped']} skipped of {lg['pytest']['collected']} (which ones failed is in no log: "
              f"pytest names them in its summary, which the cut removed)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    data = run(__doc__, "call3", collect, plot, argv)
    sys.stdout.write(text(data))
    return data


if __name__ == "__main__":
    main()
