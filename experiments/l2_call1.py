"""The L2-aware prediction (iosim.gpu.l2) beside every row of call 1's ncu measurement, forward and backward.

    python -m experiments.l2_call1 [--folder experiments/results/gpu/call1/ncu]
                                   [--out experiments/results/gpu/l2_call1] [--jobs 2]

For each configuration that call 1 profiled (flash and flash-swapped, float32, full
attention: 20 forward and 16 backward rows), simulates the grid of every kernel the pass
launched at the tiles it ran (configs.json) against the H100 preset's L2: its effective
capacity (``GPUS["h100"].l2_effective``), 132 SMs × the kernel's blocks per SM (from the
sm_90 resource report, in the algorithm's module). A pass of several kernels
(``Kernel.grids``: flash-swapped's backward runs row_dot, fill, then its main
kernel) is simulated kernel by kernel, each from a cold L2, since ncu's
``--cache-control all`` flushes the caches before every kernel it profiles, and summed as
ncu_traffic.py sums the kernels of a row. Nothing here is fitted to the measurements. It
writes OUT.json and OUT.md: the predicted DRAM reads, DRAM writes during the kernel(s) and
dirty bytes left at the end, their ratio to ncu's ``dram__bytes_read.sum`` and
``dram__bytes_write.sum`` (per kernel too, in the JSON), the same predictions at 0.5, 0.75
and 1.0 × the nominal 50 MiB (the sensitivity to the capacity), flash-swapped's closed form
where it applies, and the time each simulation took.

The lockstep schedule is the one run here. ``l2_call1-staggered`` holds the same grids under the staggered
schedule, added after call 1 to explain its largest forward miss and retired after calls 3 and 4 measured waves that
start together (``iosim.gpu.hardware.RETIRED_SCHEDULES``): written at 68a1764, reproduced through 6e0683d, kept as
committed, not rerun.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from experiments.ncu_traffic import parse_ncu_csv  # noqa: E402
from iosim.core.gpus import GPUS  # noqa: E402
from iosim.core.problem import AttentionShape, Problem  # noqa: E402
from iosim.core.tiling import Tiling  # noqa: E402
from iosim.gpu import call1  # noqa: E402
from iosim.gpu.hardware import Hardware, hardware  # noqa: E402
from iosim.gpu.kernel import Kernel, Launch  # noqa: E402
from iosim.gpu.schedule import simulate  # noqa: E402

GPU = "h100"
FRACTIONS = (0.5, 0.75, 1.0)  # of the nominal L2: the sensitivity of each row to the capacity
MISS = 0.10  # a row whose prediction is off by more than this is a miss, explained in docs/gpu.md


KERNELS = {"flash": call1.FLASH, "flash-swapped": call1.FLASH_SWAPPED}  # the run's kernels, by implementation


def simulate_pass(kernel: Kernel, launch: Launch, hw: Hardware) -> list:
    """DRAM bytes of each kernel the pass launches, in order, each from a cold L2."""
    return [simulate(g, hw.config(g)) for g in kernel.grids(launch)]


def predict(row: dict) -> dict:
    """The L2 model's DRAM bytes for one configuration, at the effective and the swept capacities, on the run's
    kernels (``iosim.gpu.call1``)."""
    kernel = KERNELS[row["impl"]]
    pb = Problem(AttentionShape(row["batch"], row["heads"], row["n_q"], row["n_k"], row["d"]), tau=1.0,
                 dtype=row["dtype"], causal=row["causal"], dropout_p=row["dropout_p"])
    tiling = Tiling(row["tiling"]["Br"], row["tiling"]["Bc"])
    launch = Launch(pb, tiling, row["direction"] == "backward")
    nominal = int(GPUS[GPU].l2.value)
    hw = hardware(GPU)
    out = {}
    sweep = [(f"{f:g}x", hw.with_l2_bytes(int(f * nominal))) for f in FRACTIONS]
    for label, at in [("effective", hw)] + sweep:
        start = time.perf_counter()
        kernels = simulate_pass(kernel, launch, at)
        by_tensor: dict[str, dict] = {}
        for dram in kernels:
            for t in dram.tensors:
                acc = by_tensor.setdefault(t.name, {"name": t.name, "reads": 0, "writes": 0, "dirty_at_end": 0})
                for key in ("reads", "writes", "dirty_at_end"):
                    acc[key] += getattr(t, key)
        out[label] = {"capacity": kernels[-1].capacity, "concurrent": kernels[-1].concurrent,
                      "seconds": time.perf_counter() - start,
                      "reads": sum(k.reads for k in kernels), "writes": sum(k.writes for k in kernels),
                      "dirty_at_end": sum(k.dirty_at_end for k in kernels),
                      "per_kernel": [{"reads": k.reads, "writes": k.writes, "dirty_at_end": k.dirty_at_end,
                                      "concurrent": k.concurrent} for k in kernels],
                      "by_tensor": list(by_tensor.values())}
    form = kernel.closed_form(launch)
    if form is not None:
        config = hw.config(kernel.grids(launch)[0])
        form = form(pb, tiling, config.capacity, config.concurrent)
        out["closed_form"] = None if form is None else {"reads": sum(form.reads.values()),
                                                        "written": sum(form.written.values())}
    return out


def compare(folder: Path, jobs: int) -> list[dict]:
    configs = json.loads((folder / "configs.json").read_text())
    rows = []
    for measured in parse_ncu_csv(folder / "ncu.csv"):
        cfg = configs[measured["index"]]
        rows.append({**cfg, "measured": {"read_bytes": measured["read_bytes"], "write_bytes": measured["write_bytes"],
                                         "kernels": measured["kernels"], "per_kernel": measured.get("per_kernel", [])}})
    with ProcessPoolExecutor(jobs) as pool:
        for row, pred in zip(rows, pool.map(predict, rows)):
            row["predicted"] = pred
            eff = pred["effective"]
            row["dram_read_pred_bytes"], row["dram_write_pred_bytes"] = eff["reads"], eff["writes"]
            row["read_ratio"] = row["measured"]["read_bytes"] / eff["reads"]
            row["write_ratio"] = row["measured"]["write_bytes"] / eff["writes"] if eff["writes"] else None
    return rows


def _mb(x: float) -> str:
    return f"{x / 1e6:,.1f}"


def _ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:#.3g}"


def _span(row: dict, way: str) -> str:
    """Predicted bytes over the swept capacities, MB: min–max (one value when they agree to 0.1 MB); – unswept."""
    if f"{FRACTIONS[0]:g}x" not in row["predicted"]:
        return "–"
    values = [row["predicted"][f"{f:g}x"][way] for f in FRACTIONS]
    lo, hi = _mb(min(values)), _mb(max(values))
    return lo if lo == hi else f"{lo}–{hi}"


def markdown(rows: list[dict]) -> str:
    head = ("| impl | batch·heads | N | d | B_r×B_c | W | read MB meas | read MB pred | meas/pred | read pred 0.5–1.0× "
            "| write MB meas | write MB pred | meas/pred | dirty at end MB | write pred 0.5–1.0× | sim s |\n"
            "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
            "| ---: |\n")
    text = ""
    for direction in ("forward", "backward"):
        lines = []
        for r in (r for r in rows if r["direction"] == direction):
            eff = r["predicted"]["effective"]
            cells = [r["impl"], str(r["batch"] * r["heads"]), str(r["n_q"]), str(r["d"]),
                     f"{r['tiling']['Br']}×{r['tiling']['Bc']}", str(eff["concurrent"]),
                     _mb(r["measured"]["read_bytes"]), _mb(eff["reads"]), _ratio(r["read_ratio"]), _span(r, "reads"),
                     _mb(r["measured"]["write_bytes"]), _mb(eff["writes"]), _ratio(r["write_ratio"]),
                     _mb(eff["dirty_at_end"]), _span(r, "writes"), f"{eff['seconds']:.2f}"]
            lines.append("| " + " | ".join(cells) + " |")
        text += f"\n## {direction.capitalize()} rows (W: the last kernel's)\n\n" + head + "\n".join(lines) + "\n"
    text += ("\n## Kernel by kernel, where a pass launches several\n\n| impl | dir | batch·heads | N | d | kernel "
             "| read MB meas | read MB pred | meas/pred | write MB meas | write MB pred | meas/pred |\n"
             "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
    for r in (r for r in rows if len(r["measured"]["per_kernel"]) > 1):
        pred = r["predicted"]["effective"]["per_kernel"]
        for name, meas, p in zip(r["measured"]["kernels"], r["measured"]["per_kernel"], pred):
            cells = [r["impl"], r["direction"], str(r["batch"] * r["heads"]), str(r["n_q"]), str(r["d"]),
                     name.split("[")[0], _mb(meas["read_bytes"]), _mb(p["reads"]),
                     _ratio(meas["read_bytes"] / p["reads"] if p["reads"] else None), _mb(meas["write_bytes"]),
                     _mb(p["writes"]), _ratio(meas["write_bytes"] / p["writes"] if p["writes"] else None)]
            text += "| " + " | ".join(cells) + " |\n"
    return text


def summary(rows: list[dict]) -> dict:
    def within(way, direction):
        ratios = [r[f"{way}_ratio"] for r in rows if r["direction"] == direction]
        return sum(1 for x in ratios if x is not None and abs(x - 1) <= MISS)
    return {direction: {"rows": sum(r["direction"] == direction for r in rows),
                        "reads_within_10pct": within("read", direction),
                        "writes_within_10pct": within("write", direction)} for direction in ("forward", "backward")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", type=Path, default=REPO / "experiments/results/gpu/call1/ncu")
    parser.add_argument("--out", type=Path, default=REPO / "experiments/results/gpu/l2_call1",
                        help="write OUT.json and OUT.md (default experiments/results/gpu/l2_call1)")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    start = time.perf_counter()
    rows = compare(args.folder, args.jobs)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    record = {
        "command": "python -m experiments.l2_call1 " + " ".join(sys.argv[1:]),
        "commit": commit,
        "machine": {"node": platform.node(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version(), "jobs": args.jobs},
        "schedule": "lockstep", "gpu": GPU, "l2_nominal": int(GPUS[GPU].l2.value),
        "l2_effective": int(GPUS[GPU].l2_effective.value),
        "l2_effective_source": GPUS[GPU].l2_effective.source,
        "summary": summary(rows), "seconds": time.perf_counter() - start, "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_name(args.out.name + ".json").write_text(json.dumps(record, indent=2) + "\n")
    text = (f"# Call 1's rows against the L2 model\n\n- command: `{record['command']}`\n"
            f"- git commit: `{commit}`\n- machine: {record['machine']}\n"
            f"- L2: {GPU} preset, effective {record['l2_effective'] / 1e6:.1f} MB ({record['l2_effective_source']}); "
            f"nominal {record['l2_nominal'] / 2**20:.0f} MiB; sensitivity at {', '.join(f'{f:g}' for f in FRACTIONS)}× "
            f"nominal\n- measured: {args.folder.relative_to(REPO) if args.folder.is_relative_to(REPO) else args.folder}"
            f" (ncu dram__bytes_read.sum, dram__bytes_write.sum); MB = 10⁶ B; W = blocks at once; write pred = "
            f"DRAM writes during the kernel (dirty at end excluded, as ncu excludes it)\n"
            f"- summary: {record['summary']}; total {record['seconds']:.0f} s\n\n")
    args.out.with_name(args.out.name + ".md").write_text(text + markdown(rows))
    print(text + markdown(rows), end="")


if __name__ == "__main__":
    main()
