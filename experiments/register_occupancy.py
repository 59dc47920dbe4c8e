"""Registers per sub-partition or per SM: how many 2-warp blocks an H100 SM holds, predicted before a GPU measures it.

    python -m experiments.register_occupancy --predict [--out FILE.json]   # the prediction (a record, committed)
    python -m experiments.register_occupancy --compare DIR [--predictions FILE.json]   # against call3.sh's ncu CSV

iosim bounds a kernel's blocks per SM by its registers as NVIDIA's occupancy calculator allocates them, each warp's
within one of the SM's 4 sub-partitions of 16,384 (``iosim.gpu.l2.occupancy_limits``). Until 2026-12-02 it divided
the whole register file instead; the two part only for blocks of 1 to 3 warps, and that change put call 1's
flash-swapped backward within 1.1 % of ncu, after the run (docs/gpu-logs/2026-12-02-registers-per-sub-partition.md).
This script
makes the test for a later call: ``experiments/ncu_traffic.py``'s grid call5-occupancy launches flash's backward at
d = 64 (64 threads, 196 registers in the sm_90 report: 4 blocks by the calculator, 5 by the whole file) over 8,192
blocks, 12 to 16 waves, so that ncu's achieved occupancy over the kernel shows which: at most 12.5 % of the SM's warps
if 4 blocks fit, near 15 % if 5 do. ``call3.sh call5b`` profiles it with ncu's LaunchStats and Occupancy sections.

The prediction is a function of the registers the GPU's build takes, which its compiler may change: ``--compare`` reads
the registers ncu reports and applies both rules to them, beside what ncu's own calculator ("Block Limit Registers")
and the hardware ("Achieved Occupancy") say.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

from experiments.ncu_traffic import GRIDS, MARKER, LaunchConfig, csv_rows, ncu_files
from iosim.core.gpus import GPUS
from iosim.gpu.l2 import REGISTERS_PER_SM, WARP, occupancy_limits, warp_registers, warps
from iosim.gpu.occupancy import report, sm90_bound

REPO = Path(__file__).resolve().parents[1]
GRID = "call5-occupancy"
H100 = GPUS["h100"]
GPU_DIR = REPO / "experiments" / "results" / "gpu"


def whole_file_blocks(threads: int, registers: int) -> int:
    """The rule iosim used before: the SM's whole register file over a block's (each warp's rounded to 256)."""
    return REGISTERS_PER_SM // (warp_registers(registers) * warps(threads))


def blocks(threads: int, registers: int, shared_bytes: int, rule: str) -> int:
    """Blocks per H100 SM of a build by ``rule`` ("sub-partition", today's, or "whole file"), every other limit as
    ``occupancy_limits`` has it. ``shared_bytes`` is a block's own, without the driver's reserve."""
    limits = occupancy_limits(H100, shared_bytes, threads, registers)
    if rule == "whole file":
        limits["registers"] = whole_file_blocks(threads, registers)
    return min(limits.values())


def row_of(cfg: LaunchConfig):
    """The resource report's build that a configuration launches (its kernel, part, dtype, d and plain build)."""
    found = report().lookup(cfg.impl, cfg.direction, cfg.dtype, cfg.d)
    if found is None:
        raise LookupError(f"{cfg}: no build in {report().path.name}")
    return found


def predict() -> dict:
    rows = []
    for cfg in GRIDS[GRID]():
        r = row_of(cfg)
        own = r.bound().block_bytes
        block_warps = warps(r.threads)
        n_blocks = cfg.batch * cfg.heads  # flash's backward: one block per batch·head

        def by(rule: str) -> dict:
            per_sm = blocks(r.threads, r.registers, own, rule)
            return {"blocks_per_sm": per_sm, "theoretical_occupancy": per_sm * block_warps / (H100.sm.threads // WARP),
                    "waves": n_blocks / (per_sm * int(H100.sms.value))}

        rows.append({**vars(cfg), "build": r.label, "threads": r.threads, "registers": r.registers,
                     "shared_bytes": r.shared_bytes, "blocks": n_blocks,
                     "predicted": by("sub-partition"), "whole_file": by("whole file")})
    return {"command": "python -m experiments.register_occupancy --predict", "git_commit": _commit(),
            "grid": GRID, "gpu": "h100",
            "claim": "ncu's achieved occupancy of each launch stays at or under the sub-partition rule's theoretical "
                     "occupancy (12.5 % at 4 blocks of 2 warps); above it, the whole-file rule holds",
            "rows": rows}


def _commit() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()


def markdown(record: dict) -> str:
    lines = [f"# Predicted blocks per H100 SM of 2-warp builds (grid {record['grid']})", "",
             f"- command: `{record['command']}`", f"- git commit: `{record['git_commit']}`",
             f"- claim: {record['claim']}", "",
             "| build | threads | registers | blocks | sub-partition: blocks/SM, occupancy, waves | "
             "whole file: blocks/SM, occupancy, waves |", "| --- | ---: | ---: | ---: | --- | --- |"]
    for r in record["rows"]:
        p, w = r["predicted"], r["whole_file"]
        lines.append(f"| {r['build']} | {r['threads']} | {r['registers']} | {r['blocks']:,} | "
                     f"{p['blocks_per_sm']}, {p['theoretical_occupancy']:.1%}, {p['waves']:.1f} | "
                     f"{w['blocks_per_sm']}, {w['theoretical_occupancy']:.1%}, {w['waves']:.1f} |")
    return "\n".join(lines) + "\n"


# the names of ncu's LaunchStats and Occupancy sections' rows that the comparison reads
NCU_NAMES = {"Registers Per Thread": "registers", "Block Size": "threads", "Block Limit Registers": "ncu_blocks",
             "Theoretical Occupancy": "ncu_theoretical_pct", "Achieved Occupancy": "achieved_pct"}


def measured(folder: Path) -> list[dict]:
    """Each profiled kernel of ncu's CSV in ``folder`` (the marker kernels left out), with the rows NCU_NAMES reads."""
    kernels: dict[str, dict] = {}
    for path in ncu_files(folder):
        for row in csv_rows(path):
            if MARKER in row["Kernel Name"] or row["Metric Name"] not in NCU_NAMES:
                continue
            block = [int(x) for x in row["Block Size"].strip("()").split(",")]  # "(64, 1, 1)"
            entry = kernels.setdefault(f"{path.name}:{row['ID']}", {"kernel": row["Kernel Name"].split("(")[0],
                                                                    "threads": float(block[0] * block[1] * block[2])})
            try:
                entry[NCU_NAMES[row["Metric Name"]]] = float(row["Metric Value"].replace(",", ""))
            except ValueError:  # "n/a": left out
                continue
    return list(kernels.values())


def compare(folder: Path, record: dict) -> list[dict]:
    """Each measured kernel beside both rules applied to the registers and threads ncu reports for it."""
    (row,) = record["rows"]  # one launch: flash's backward
    out = []
    for m in measured(folder):
        threads, registers = int(m["threads"]), int(m["registers"])
        own = sm90_bound(row["shared_bytes"], threads, registers).block_bytes
        sub, whole = (blocks(threads, registers, own, rule) for rule in ("sub-partition", "whole file"))
        warps_pct = 100 * warps(threads) / (H100.sm.threads // WARP)
        out.append({**m, "sub_partition_blocks": sub, "whole_file_blocks": whole,
                    "sub_partition_pct": sub * warps_pct, "whole_file_pct": whole * warps_pct,
                    "rules_part": sub != whole,
                    "verdict": ("the rules agree at these registers" if sub == whole else
                                "whole file" if m["achieved_pct"] > sub * warps_pct else "sub-partition")})
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--predict", action="store_true", help="write the prediction record")
    mode.add_argument("--compare", type=Path, metavar="DIR", help="a folder of ncu CSV from call3.sh call5b")
    parser.add_argument("--out", type=Path, default=None, help="the record's JSON (--predict; default: "
                                                               "experiments/results/gpu/predictions-<commit>-occupancy.json)")
    parser.add_argument("--predictions", type=Path, default=None, help="the record to compare with (--compare)")
    args = parser.parse_args(argv)
    if args.predict:
        record = predict()
        out = args.out or GPU_DIR / f"predictions-{record['git_commit'][:7]}-occupancy.json"
        out.write_text(json.dumps(record, indent=2) + "\n")
        out.with_suffix(".md").write_text(markdown(record))
        print(markdown(record), end="")
        return
    if args.predictions is None:
        parser.error("--compare needs --predictions FILE.json, the record committed before the run")
    for r in compare(args.compare, json.loads(args.predictions.read_text())):
        print(f"{r['kernel']}: {r['registers']:.0f} registers x {r['threads']:.0f} threads; ncu's calculator "
              f"{r['ncu_blocks']:.0f} blocks ({r['ncu_theoretical_pct']:.1f} %), achieved {r['achieved_pct']:.1f} %; "
              f"sub-partition rule {r['sub_partition_blocks']} ({r['sub_partition_pct']:.1f} %), whole file "
              f"{r['whole_file_blocks']} ({r['whole_file_pct']:.1f} %): {r['verdict']}")


if __name__ == "__main__":
    main()
