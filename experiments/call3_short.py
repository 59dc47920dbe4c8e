"""Call 3's short script, dry run: what each half of experiments/results/gpu/call3.sh runs, and how long it may take.

    python -m experiments.call3_short [--json FILE]

Call 3 as first prepared (388 ncu rows in seven parts) is over an hour of profiling; a GPU is lent for 15 minutes,
machine start included. The short script runs in two halves of at most 5 minutes (issue 28, item 5; issue 29):

- first: ncu DRAM bytes of the short grid's first part (experiments/ncu_traffic.py, short-schedule: the rows where
  the committed lockstep and staggered predictions part most), the block-timing probe (experiments/block_trace.py),
  then the short grid's second part (short-rest) in the time left;
- second: the timings (experiments/gpu_bench.py), the kernel tests on the GPU beside compute-sanitizer on one
  launch of each kernel, and the L2 capacity curve (experiments/l2_capacity.py).

For each ncu row this prints the DRAM bytes read that the predictions committed before the run give under the lockstep
schedule (predictions-80f2354, -6d16ff6, -bda8144, -69c24cc, -159b338, ...), and under the staggered schedule where
one was committed before its retirement (-92a2cc8-staggered, ...; ``iosim.gpu.hardware.RETIRED_SCHEDULES``), their
ratio, and an estimated time. The estimate is a stated guess, not a measurement: the
compile time per kernel specialisation call 3 measured on the H100 machine's host (10.7 to 13.4 s), the host's
random inputs at 150 million values a second, the kernels at ESTIMATED_TFLOPS, and one second of ncu overhead per
launch. Call 3's short-schedule part, estimated at 136 s, took 128 s.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from experiments import ncu_traffic

REPO = Path(__file__).resolve().parents[1]
PREDICTIONS = REPO / "experiments" / "results" / "gpu"
LOCKSTEP = ("predictions-80f2354", "predictions-6d16ff6", "predictions-bda8144", "predictions-69c24cc",
            "predictions-159b338", "predictions-96a5261", "predictions-5217ccf", "predictions-d3b558b",
            "predictions-54643ce")
STAGGERED = ("predictions-92a2cc8-staggered", "predictions-159b338-staggered", "predictions-96a5261-staggered",
             "predictions-5217ccf-staggered", "predictions-d3b558b-staggered")
COMPILE_S = 12.0  # a specialisation compiled in 10.7 to 13.4 s on the H100 machine's host in call 3 (call3/README.md)
HOST_VALUES_PER_S = 1.5e8  # numpy's standard_normal on one core, about
# SDPA's flash kernels ran at 243 (forward) and 213 TFLOP/s (backward) in call 3 (d = 64, 256 × 4096); 150 is taken
ESTIMATED_TFLOPS = {"flash-swapped": 10.0, "flash-swapped-tc": 100.0, "split-kv": 1.0, "sdpa-flash": 150.0}
TORCH_IMPORT_S = 10.0  # SDPA's rows compile nothing: one import of torch per profiled process, a guess
NCU_OVERHEAD_S = 1.0
SCRIPT = PREDICTIONS / "call3.sh"
STEP = re.compile(r"^\s*(?:step|ncu_grid) (\S+) (\d+)\b", re.M)


HALF = re.compile(r"^  ([a-z0-9-]+)\)(?:  #[^\n]*)?\n(.*?);;", re.M | re.S)


def halves(script: Path = SCRIPT) -> dict[str, dict[str, int]]:
    """Each half's steps and their time limits in seconds, read from call3.sh's branches (first and second, which
    call 3 ran; rest-first and rest-second, what it left for the next call)."""
    return {half: {name: int(limit) for name, limit in STEP.findall(body)}
            for half, body in HALF.findall(script.read_text())}


def predictions(files: tuple[str, ...]) -> dict[tuple, dict]:
    rows = {}
    for name in files:
        for row in json.loads((PREDICTIONS / f"{name}.json").read_text())["rows"]:
            rows[ncu_traffic.join_key(row)] = {"reads": _reads(row["predicted"]), "file": name}
    return rows


def _reads(predicted: dict) -> int:
    """DRAM bytes read at the effective L2, summed over the kernels of a pass where a row has several."""
    if "effective" in predicted:
        return predicted["effective"]["reads"]
    return sum(_reads(v) for v in predicted.values() if isinstance(v, dict))


def flops(cfg: ncu_traffic.LaunchConfig) -> float:
    forward = 4 * cfg.batch * cfg.heads * cfg.n_q * cfg.n_k * cfg.d / (2 if cfg.causal else 1)
    return forward * (2.5 if cfg.direction == "backward" else 1.0)


def estimate_s(cfg: ncu_traffic.LaunchConfig) -> float:
    values = cfg.batch * (2 * cfg.heads * cfg.n_q + 2 * cfg.kv * cfg.n_k) * cfg.d
    return values / HOST_VALUES_PER_S + flops(cfg) / (ESTIMATED_TFLOPS[cfg.impl] * 1e12) + NCU_OVERHEAD_S


def plan() -> dict:
    lockstep, staggered = predictions(LOCKSTEP), predictions(STAGGERED)
    parts = {}
    for grid in ("short-schedule", "short-rest", "call3-sdpa", "call5-sdpa", "call5-split", "call5-code"):
        rows, compiled = [], set()
        for cfg in ncu_traffic.GRIDS[grid]():
            k = ncu_traffic.join_key(vars(cfg))
            lock, stag = lockstep.get(k), staggered.get(k)
            if lock is None:
                raise LookupError(f"{grid}: {cfg} has no committed lockstep prediction")
            setup = TORCH_IMPORT_S if cfg.impl == ncu_traffic.SDPA else COMPILE_S
            seconds = estimate_s(cfg) + (0.0 if ncu_traffic.build(cfg) in compiled else setup)
            compiled.add(ncu_traffic.build(cfg))
            rows.append({"config": vars(cfg), "lockstep_reads": lock["reads"], "lockstep_file": lock["file"],
                         "staggered_reads": stag and stag["reads"], "staggered_file": stag and stag["file"],
                         "parting": stag and max(lock["reads"], stag["reads"]) / max(1, min(lock["reads"],
                                                                                              stag["reads"])),
                         "estimated_s": seconds})
        parts[grid] = {"rows": rows, "estimated_s": sum(r["estimated_s"] for r in rows)}
    steps = halves()
    return {"halves": steps, "halves_s": {h: _sequential_s(s) for h, s in steps.items()}, "ncu": parts}


def _sequential_s(steps: dict[str, int]) -> int:
    """The longest the steps of a half can take: memcheck and racecheck run beside each other, and beside pytest
    where the half runs it (call3.sh)."""
    parallel = [limit for name, limit in steps.items() if name in ("memcheck", "racecheck")]
    return sum(limit for name, limit in steps.items() if name not in ("memcheck", "racecheck")) + (
        max(parallel) if parallel and "pytest" not in steps else 0)


def describe(cfg: dict) -> str:
    heads = f"{cfg['batch']}×{cfg['heads']}" + (f"/{cfg['kv_heads']}" if cfg["kv_heads"] else "")
    flags = [f for f, on in (("causal", cfg["causal"]), ("sawtooth", cfg["sawtooth"])) if on]
    flags += [f"splits {cfg['splits']}"] if cfg["splits"] else []
    return (f"{cfg['impl']} {cfg['direction']} {cfg['dtype']} {heads} N={cfg['n_k']} d={cfg['d']}"
            + (f" ({', '.join(flags)})" if flags else ""))


def text(report: dict) -> str:
    lines = []
    for half, steps in report["halves"].items():
        lines.append(f"{half} half: {report['halves_s'][half]} s of time limits: "
                     + ", ".join(f"{step} {s} s" for step, s in steps.items()))
    limits = {step: limit for steps in report["halves"].values() for step, limit in steps.items()}
    for grid, part in report["ncu"].items():
        over = part["estimated_s"] > limits.get(grid, float("inf"))
        lines.append(f"\nncu {grid}: {len(part['rows'])} rows, estimated {part['estimated_s']:.0f} s"
                     + (f", over its step's limit of {limits[grid]} s: the rows at its end may be cut" if over else ""))
        lines.append(f"  {'row':<62} {'lockstep MB':>12} {'staggered MB':>13} {'part':>7} {'est s':>6}")
        for r in part["rows"]:
            stag, part = ((f"{r['staggered_reads'] / 1e6:,.1f}", f"{r['parting']:.2f}×") if r["staggered_reads"]
                          is not None else ("—", "—"))
            lines.append(f"  {describe(r['config']):<62} {r['lockstep_reads'] / 1e6:>12,.1f} {stag:>13} {part:>7} "
                         f"{r['estimated_s']:>6.1f}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=None, help="also write the plan as JSON")
    args = parser.parse_args(argv)
    report = plan()
    print(text(report), end="")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
