"""Call 4 on an H100 (2026-11-27), set against what was committed before it: DRAM bytes, kernel tests, speed.

    python -m experiments.call4 [--figures docs/figures] [--json experiments/results/call4.json]

Reads the raw output in experiments/results/gpu/call4/ (README.md there: device, versions, commit, commands) and
prints, and writes as JSON:

- each ncu row's DRAM bytes read beside the predictions committed before the run: lockstep and staggered
  (experiments/call3_short.py names the files) and, for the one-kernel forward rows it could run, the timed
  schedule at both ends of its block spread (predictions-3f14d76-timed-<grid>); how many rows each holds within 10%;
- what pytest on the GPU reached and which tests failed, and what compute-sanitizer reported;
- flash-swapped-tc's TFLOP/s against SDPA's flash backend at d 128, in bfloat16 and causal (issue 29's targets:
  within 2× forward, 3× backward), beside call 3's float16 d 64 pair.

docs/figures/call4.png draws the first. Nothing here changes a prediction; docs/gpu-logs/2026-11-27-h100-call4.md
reads the numbers.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np

from experiments import call3, call3_short, ncu_traffic
from experiments.figure_cli import plt, run

REPO = Path(__file__).resolve().parents[1]
RAW = REPO / "experiments" / "results" / "gpu" / "call4"
PREDICTIONS = REPO / "experiments" / "results" / "gpu"
# grid: (the folder whose configs.json lists its rows, every folder with ncu CSVs of them, the timed predictions)
GRIDS = {
    "short-rest": ("rest-first/ncu-short-rest", ("rest-first/ncu-short-rest", "rest-tail"),
                   "predictions-3f14d76-timed-short-rest"),
    "call3-sdpa": ("rest-second/ncu-call3-sdpa", ("rest-second/ncu-call3-sdpa",),
                   "predictions-3f14d76-timed-call3-sdpa"),
}
# the prediction files committed before call 4 ran (call3_short's lists also hold later ones, for the next call)
LOCKSTEP = ("predictions-80f2354", "predictions-6d16ff6", "predictions-bda8144", "predictions-69c24cc",
            "predictions-159b338", "predictions-96a5261")
STAGGERED = ("predictions-92a2cc8-staggered", "predictions-159b338-staggered", "predictions-96a5261-staggered")
SCHEDULES = ("lockstep", "staggered", "timed, spread 0", "timed, spread 1%")
TARGETS = ({"dtype": "float16", "d": 64, "causal": False}, {"dtype": "float16", "d": 128, "causal": False},
           {"dtype": "bfloat16", "d": 64, "causal": False}, {"dtype": "float16", "d": 64, "causal": True})
FACTORS = {"forward": 2, "backward": 3}  # issue 29: flash-swapped-tc within 2× of SDPA forward, 3× backward


def timed(name: str) -> dict[tuple, list[int]]:
    """The timed schedule's DRAM bytes read per row, at each block spread it was committed at."""
    document = json.loads((PREDICTIONS / f"{name}.json").read_text())
    return {ncu_traffic.join_key(r): [t["read"] for t in r["timed"]] for r in document["rows"]}


def ncu_rows() -> dict:
    lockstep, staggered = call3_short.predictions(LOCKSTEP), call3_short.predictions(STAGGERED)
    out = {}
    for grid, (listing, folders, timed_name) in GRIDS.items():
        configs = json.loads((RAW / listing / "configs.json").read_text())
        done = {m["index"]: m for folder in folders for m in ncu_traffic.measured_rows(RAW / folder)}
        timed_reads = timed(timed_name)
        rows = []
        for index, cfg in enumerate(configs):
            k, m = ncu_traffic.join_key(cfg), done[index]
            predicted = dict(zip(SCHEDULES, [lockstep[k]["reads"], staggered[k]["reads"], *timed_reads.get(k, [])]))
            rows.append({"row": call3_short.describe(cfg), "config": cfg, "kernels": m["kernels"],
                         "read": int(m["read_bytes"]), "write": int(m["write_bytes"]), "predicted": predicted,
                         "ratio": {s: m["read_bytes"] / v for s, v in predicted.items()}})
        timed_rows = [r for r in rows if SCHEDULES[2] in r["ratio"]]
        out[grid] = {"rows": rows, "within_10pct": {
            s: {"rows": sum(abs(r["ratio"][s] - 1) <= call3.WITHIN for r in rows if s in r["ratio"]),
                "of": sum(s in r["ratio"] for r in rows)} for s in SCHEDULES},
            "timed_rows_within_10pct_under_lockstep": sum(abs(r["ratio"]["lockstep"] - 1) <= call3.WITHIN
                                                          for r in timed_rows)}
    return out


def pytest_log() -> dict:
    """Each test pytest -v started, and how each that ended ended (the step was cut at its time limit)."""
    text = (RAW / "rest-first" / "pytest.log").read_text()
    started = set(re.findall(r"^(tests/\S+::.+?) ?$", text, re.M))  # a test's id may hold spaces
    ended = {name: outcome for outcome, name in re.findall(r"\] (PASSED|FAILED|SKIPPED|ERROR) (tests/.+?) ?$", text,
                                                           re.M)}
    collected = int(re.search(r"\[(\d+) items\]", text).group(1))
    counts = {o: sum(v == o for v in ended.values()) for o in ("PASSED", "FAILED", "SKIPPED", "ERROR")}
    return {"collected": collected, **{o.lower(): n for o, n in counts.items()},
            "failed_tests": sorted(n for n, o in ended.items() if o == "FAILED"),
            "not_finished": sorted(started - set(ended)), "not_started": collected - len(started | set(ended))}


def sanitizer() -> dict:
    out = {}
    for tool in ("memcheck", "racecheck"):
        text = (RAW / "rest-second" / f"{tool}.log").read_text()
        out[tool] = {"launched": [int(i) for i in re.findall(r"^launched (\d+)", text, re.M)],
                     "summary": re.findall(r"^========= (\w+ SUMMARY: .*)$", text, re.M)}
    return out


def targets() -> list[dict]:
    rows = call3.bench_rows() + call3.bench_rows(RAW)  # call 3's d 64 float16 pair, then this call's
    out = []
    for match in TARGETS:
        tc = call3.best(rows, impl="flash-swapped-tc", bh=256, N=4096, **match)
        sdpa = call3.best(rows, impl="torch-sdpa", bh=256, N=4096, **match)
        for mode, factor in FACTORS.items():
            out.append({**match, "mode": mode, "flash_swapped_tc": tc[mode], "sdpa": sdpa[mode],
                        "ratio": sdpa[mode] / tc[mode], "within": factor, "met": sdpa[mode] / tc[mode] <= factor,
                        "files": [tc["file"], sdpa["file"]]})
    return out


def collect() -> dict:
    return {"ncu": ncu_rows(), "pytest": pytest_log(), "sanitizer": sanitizer(), "targets": targets()}


def plot(data: dict):
    fig, axes = plt.subplots(1, 2, figsize=(16, 5.5), gridspec_kw={"width_ratios": [14, 22]})
    styles = {"lockstep": ("_", "tab:blue", 300), "staggered": ("x", "tab:red", 40),
              "timed, spread 0": ("v", "tab:green", 40), "timed, spread 1%": ("^", "tab:green", 40)}
    for ax, (grid, part) in zip(axes, data["ncu"].items()):
        rows = part["rows"]
        x = np.arange(len(rows))
        ax.axhspan(1 - call3.WITHIN, 1 + call3.WITHIN, color="0.9", label="within 10%")
        for schedule, (marker, color, size) in styles.items():
            shown = [(i, r["ratio"][schedule]) for i, r in enumerate(rows) if schedule in r["ratio"]]
            ax.scatter([i for i, _ in shown], [v for _, v in shown], marker=marker, color=color, s=size,
                       label=schedule, zorder=3)
        ax.axhline(1, color="black", lw=0.8)
        ax.set_yscale("log")
        ax.set_xticks(x, [r["row"].replace("flash-swapped", "fs").replace("sdpa-flash ", "").replace(" forward", "")
                          .replace("float", "f").replace("bf16", "bf16") for r in rows], rotation=80, fontsize=7)
        ax.set_ylabel("measured / predicted DRAM read")
        ax.set_title(f"{grid}: {len(rows)} rows, predictions committed before the run")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _mb(x: float) -> str:
    return f"{x / 1e6:,.1f}"


def text(data: dict) -> str:
    lines = []
    for grid, part in data["ncu"].items():
        lines += [f"### {grid}", "", "| row | measured MB | lockstep MB | meas/lock | staggered MB | meas/stag "
                  "| timed MB (spread 0, 1%) | meas/timed |", "| --- |" + " ---: |" * 7]
        for r in part["rows"]:
            p, q = r["predicted"], r["ratio"]
            t = SCHEDULES[2] in p
            lines.append(f"| {r['row']} | {_mb(r['read'])} | {_mb(p['lockstep'])} | {q['lockstep']:.3f} "
                         f"| {_mb(p['staggered'])} | {q['staggered']:.3g} "
                         f"| {_mb(p[SCHEDULES[2]]) + ', ' + _mb(p[SCHEDULES[3]]) if t else ''} "
                         f"| {f'{q[SCHEDULES[2]]:.3g}, {q[SCHEDULES[3]]:.3g}' if t else ''} |")
        w = part["within_10pct"]
        lines += ["", "Within 10% of the measured DRAM read: " + "; ".join(
            f"{s} {w[s]['rows']} of {w[s]['of']}" for s in SCHEDULES)
            + f" (lockstep on the rows the timed schedule predicted: {part['timed_rows_within_10pct_under_lockstep']}"
            f" of {w[SCHEDULES[2]]['of']}).", ""]
    t = data["pytest"]
    lines += [f"pytest on the GPU (cut at its 110 s limit): {t['collected']} collected, {t['passed']} passed, "
              f"{t['failed']} failed, {t['skipped']} skipped, {len(t['not_finished'])} started and not finished, "
              f"{t['not_started']} not started. Failed:", *(f"- {n}" for n in t["failed_tests"]),
              "Not finished:", *(f"- {n}" for n in t["not_finished"]), ""]
    for tool, s in data["sanitizer"].items():
        lines.append(f"compute-sanitizer {tool}: launches {s['launched']} of the sanitize grid; "
                     f"{'; '.join(s['summary'])}")
    lines += ["", "| flash-swapped-tc vs SDPA (256 × 4096) | mode | flash-swapped-tc TFLOP/s | SDPA TFLOP/s "
              "| SDPA / tc | target | met |", "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in data["targets"]:
        shape = f"{r['dtype']}, d {r['d']}{', causal' if r['causal'] else ''}"
        lines.append(f"| {shape} | {r['mode']} | {r['flash_swapped_tc']:.1f} | {r['sdpa']:.1f} | {r['ratio']:.2f}× "
                     f"| ≤ {r['within']}× | {'yes' if r['met'] else 'no'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    data = run(__doc__, "call4", collect, plot, argv)
    sys.stdout.write(text(data))
    return data


if __name__ == "__main__":
    main()
