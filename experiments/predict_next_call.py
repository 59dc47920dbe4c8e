"""The L2 model's DRAM bytes for every configuration the next GPU call profiles, committed before it runs.

    python -m experiments.predict_next_call [--grid call3] [--jobs 2]
                                            [--out experiments/results/gpu/predictions-<short commit>]

Issue 17, item 4: predictions first, measurements second. For each configuration of
``ncu_traffic.py``'s grid (call 3: the forward of flash-swapped, float32 and float16, and of
flash-swapped-tc, float16 and bfloat16; batch·heads 1 to 1024, N 1024 to 65536, d 64 and 128,
causal and not; then the backward of flash-swapped, float32 and float16, batch·heads 1 to 256,
N 1024 to 16384, and of flash-swapped-tc, float16 and bfloat16, at the same shapes), this writes
the tile the CURRENT kernel picks, its blocks per H100 SM (from the
sm_90 resource report, cited per row) and the predicted DRAM reads, writes during the kernel and
dirty bytes left at its end, at the effective L2 and at 0.5, 0.75 and 1.0 × the nominal 50 MiB,
beside the two-level count (``Algorithm.traffic``: every load and store is HBM traffic).

The grids. Each row's kernel is its description in ``iosim.gpu.kernels`` (``KERNELS[impl]``), its grids those
the description builds, counted through ``iosim.gpu.dram.pass_counts`` (a closed form where one holds, the
simulation otherwise) with the blocks per SM of the sm_90 resource report. flash-swapped's forward is
``iosim.gpu.grids.flash_swapped.forward`` (block bh·T_r + i, Q_i read, K_j and V_j per step, O_i in the input dtype
and lse_i float32 written once, a causal query block stopping at its last visible key block; ``sawtooth=True`` its
query-block-parity order), whose closed form is ``forward_dram``. flash-swapped-tc's 16-bit forward has the same
blocks, tiles and writes but fetches K_(j+1), V_(j+1) into registers during step j (kernels/flash_swapped_tc.py):
each block's K/V accesses come one step earlier (``iosim.gpu.grids.flash_swapped_tc.forward``, simulated); the
declared grid's closed form at the same tiles is recorded beside it where it applies (full attention).

The backward rows run the kernels the pass launches (``iosim.gpu.grids._device.around``: row_dot, fill, the main
kernel, and in float16 the cast of dQ), each from a cold L2 as ``ncu --cache-control all`` measures them, through
``iosim.gpu.dram.kernel_counts`` (their sum is the pass's), kept one by one in the JSON, as ncu reports them, each
at its own blocks per SM from the report (row_dot's 3 at 80 registers × 256 threads since 8eb2624, which made its
loads coalesced; fill's and cast's 5 at 48 and 42 registers). flash-swapped-tc's 16-bit backward launches the same
row_dot, fill and cast (kernels/_device.py's grid-stride kernels) around its own main kernel: flash-swapped's blocks
at its tile of 64 keys by queries_per_step(d) queries, each visiting first the query blocks that see its keys whole,
then the masked ones (``iosim.gpu.grids.flash_swapped_tc.backward``).

The split-kv rows (grid call3-split-kv, decoding) run ``iosim.gpu.grids.split_kv.split`` on the problem packed by
GQA group at the kernel's tile and the row's splits, then ``combine`` where S > 1, each from a cold L2, at the
blocks per SM of kernels/split_kv.py's two kernels from the report.

The records' ``grid`` and ``method`` fields keep the names the grids had when the committed predictions were made,
so that a record made again reads as the committed one.

Nothing here is fitted to a measurement. ``l2_call1.py``'s capacity and schedule are used
unchanged. Rows of equal bytes (float16 and bfloat16 of one kernel) are computed once.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from experiments import ncu_traffic  # noqa: E402
from experiments.ncu_traffic import GRIDS, LaunchConfig  # noqa: E402
from iosim.algorithms import flash_swapped, split_kv  # noqa: E402
from iosim.core.gpus import GPUS  # noqa: E402
from iosim.core.problem import AttentionShape, Problem  # noqa: E402
from iosim.core.tiling import Tiling  # noqa: E402
from iosim.gpu.dram import kernel_counts, pass_counts  # noqa: E402
from iosim.gpu.grids import sdpa_flash  # noqa: E402
from iosim.gpu.hardware import Hardware, hardware  # noqa: E402
from iosim.gpu.kernel import Launch  # noqa: E402
from iosim.gpu.kernels import KERNELS  # noqa: E402
from iosim.gpu.l2 import in_sequence  # noqa: E402

GPU = "h100"
FRACTIONS = (0.5, 0.75, 1.0)  # of the nominal L2, as l2_call1.py
REPORT = "experiments/results/kernels_resources_sm90.md"
# The blocks per SM of every kernel come from the committed resource report (iosim.gpu.occupancy, read by the kernel
# descriptions of iosim.gpu.kernels): the main kernel's build at the row's dtype, d and tile, its causal+dropout build
# for a causal row, the sawtooth build for a sawtooth row; the backward's row_dot, fill and cast their own builds.
# The report's commit for the rows recorded in each prediction's source (the kernels have changed registers since
# only where a later report says so: split-kv's rows are cd9c224's).
SPLIT_KV_REPORT_COMMIT = "cd9c224"
SPLIT_KV_KERNELS = ("split", "combine")  # the split-kv kernel's launches, in order
BACKWARD_KERNELS = ("row_dot", "fill", "main", "cast")  # flash-swapped's backward launches, in order
SDPA_BACKWARD_KERNELS = ("dot_do_o", "main", "convert_dq")  # SDPA's flash backward launches, in order
SDPA_SOURCE = "registers of torch 2.14.1's sm_90 binary (iosim/gpu/sdpa_resources_sm90.json) and shared memory " \
              "(iosim/gpu/grids/sdpa_flash.py)"


def launch(cfg: LaunchConfig) -> Launch:
    """The pass the row's kernel runs: the problem as it runs it (packed by GQA group for split-kv), its tile and
    splits, the direction and the sawtooth option."""
    tile = cfg.tile()
    sms = int(GPUS[GPU].sms.value)  # SDPA's forward: whether torch splits K/V
    if cfg.impl == "split-kv":
        return Launch(problem(cfg).packed_by_group(), Tiling(tile["Br"], tile["Bc"], cfg.splits), sms=sms)
    return Launch(problem(cfg), Tiling(tile["Br"], tile["Bc"]), cfg.direction == "backward", bool(cfg.sawtooth), sms)


def blocks_per_sm_source(cfg: LaunchConfig) -> str:
    """Where the row's blocks per SM come from: the resource report's build, or SDPA's description."""
    if cfg.impl == ncu_traffic.SDPA:
        return SDPA_SOURCE
    dtype = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[cfg.dtype]
    return (f"{REPORT} ({report_commit(cfg)}), {cfg.impl} {cfg.direction} d={cfg.d} {dtype}"
            f"{' causal+dropout' if cfg.causal else ''}")


def report_commit(cfg: LaunchConfig) -> str:
    """The commit of the resource report that gave the row's blocks per SM."""
    return SPLIT_KV_REPORT_COMMIT if cfg.impl == "split-kv" else "ecb846a"


def blocks_per_sm(cfg: LaunchConfig) -> int:
    """The row's main kernel's blocks per SM (the split kernel's for split-kv), as the resource report gives it (for
    SDPA, as its description derives it)."""
    main = 0 if cfg.direction == "forward" else 1 if cfg.impl == ncu_traffic.SDPA else 2
    return KERNELS[cfg.impl].grids(launch(cfg))[main].per_sm(GPUS[GPU])


def problem(cfg: LaunchConfig) -> Problem:
    return Problem(AttentionShape(cfg.batch, cfg.heads, cfg.n_q, cfg.n_k, cfg.d, kv_heads=cfg.kv_heads), tau=1.0,
                   dtype=cfg.dtype, causal=cfg.causal, dropout_p=cfg.dropout_p)


def _counts(dram) -> dict:
    return {"reads": dram.reads, "writes": dram.writes, "dirty_at_end": dram.dirty_at_end,
            "capacity": dram.capacity, "concurrent": dram.concurrent,
            "by_tensor": [asdict(t) for t in dram.tensors]}


def capacities() -> list[tuple[str, Hardware]]:
    """The L2 each prediction is made at: the preset's effective, then fractions of the nominal (lockstep: the timed
    schedule's predictions are experiments/timed_call3.py's)."""
    hw = hardware(GPU)
    nominal = int(GPUS[GPU].l2.value)
    return [("effective", hw)] + [(f"{f:g}x", hw.with_l2_bytes(int(f * nominal))) for f in FRACTIONS]


def by_kernel(cfg: LaunchConfig, names: tuple[str, ...], grid: str) -> dict:
    """The DRAM bytes of a pass of several kernels, each from a cold L2: their sum, and each of them."""
    out: dict = {"grid": grid, "method": "simulation, kernel by kernel"}
    for label, hw in capacities():
        start = time.perf_counter()
        parts = kernel_counts(KERNELS[cfg.impl], launch(cfg), hw, budget_s=None)
        out[label] = {**_counts(in_sequence(parts)), "seconds": time.perf_counter() - start,
                      "kernels": [{"kernel": name, **{k: v for k, v in _counts(part).items() if k != "by_tensor"}}
                                  for name, part in zip(names, parts)]}
    return out


def predict(cfg: LaunchConfig) -> dict:
    """The L2 model's DRAM bytes of one configuration, at the effective and the swept capacities."""
    tc = cfg.impl == "flash-swapped-tc" and cfg.dtype != "float32"
    if cfg.impl == ncu_traffic.SDPA and cfg.direction == "backward":
        return by_kernel(cfg, SDPA_BACKWARD_KERNELS, "iosim.gpu.grids.sdpa_flash's dot_do_o, backward_main, "
                         "convert_dq, each from a cold L2")
    if cfg.impl == ncu_traffic.SDPA and sdpa_flash.forward_splits(problem(cfg).shape, launch(cfg).sms) > 1:
        return by_kernel(cfg, ("split", "combine"), "iosim.gpu.grids.sdpa_flash's split_forward and combine, each from "
                         "a cold L2")
    if cfg.impl == ncu_traffic.SDPA:
        grid = "iosim.gpu.grids.sdpa_flash.forward"
        whole = cfg.n_k % cfg.tile()["Bc"] == 0 or cfg.n_k <= cfg.tile()["Bc"]
        method = "closed form (sdpa_flash.forward_dram)" if not cfg.causal and whole and not cfg.kv_heads \
            else "simulation"
    elif cfg.direction == "backward":
        main = "predict_next_call.tc_backward_grid" if tc else "main"
        return by_kernel(cfg, BACKWARD_KERNELS, f"iosim.algorithms.flash_swapped_backward's row_dot, fill, {main}"
                         f"{', cast' if cfg.dtype != 'float32' else ''}, each from a cold L2")
    elif cfg.impl == "split-kv":
        return by_kernel(cfg, SPLIT_KV_KERNELS, "iosim.algorithms.split_kv.launches (split, then combine where S > 1), "
                         "each from a cold L2")
    elif cfg.sawtooth:
        grid, method = "iosim.algorithms.flash_swapped.sawtooth_grid", "simulation"
    else:
        grid = "tc_forward_grid (K/V fetched one step early)" if tc else "iosim.algorithms.flash_swapped.grid"
        method = "simulation" if tc or cfg.causal or cfg.kv_heads else "closed form (flash_swapped.dram)"
    out: dict = {"grid": grid, "method": method}
    for label, hw in capacities():
        start = time.perf_counter()
        dram = pass_counts(KERNELS[cfg.impl], launch(cfg), hw, budget_s=None)
        out[label] = {**_counts(dram), "seconds": time.perf_counter() - start}
    if tc and not cfg.causal:  # the declared grid at the same tiles: what the one-step-early fetch changes
        # (flash-swapped's grid, whatever the dtype: it has no bfloat16 build, but the grid is what is compared)
        grid_alone = replace(KERNELS["flash-swapped"], dtypes=None)
        declared = pass_counts(grid_alone, launch(cfg), hardware(GPU, blocks_per_sm=blocks_per_sm(cfg)), budget_s=None)
        out["declared_grid_effective"] = {k: v for k, v in _counts(declared).items() if k != "by_tensor"}
    return out


def two_level(cfg: LaunchConfig) -> dict:
    """The two-level count at the kernel's tiles: ``Algorithm.traffic`` with M the peak those tiles need."""
    run = launch(cfg)
    algorithm = flash_swapped.ALGORITHM.backward if cfg.direction == "backward" else flash_swapped.ALGORITHM
    if cfg.impl == "split-kv":
        algorithm = split_kv.ALGORITHM
    counts = algorithm.traffic(run.problem, run.tiling, 2**50)
    return {"read_bytes": counts.read_bytes, "write_bytes": counts.write_bytes, "peak_sram": counts.peak_sram,
            "by_tensor": {t.name: {"read_bytes": t.read_bytes, "write_bytes": t.write_bytes} for t in counts.tensors}}


def _key(cfg: LaunchConfig) -> tuple:
    """Configurations with equal bytes: float16 and bfloat16 of one kernel are the same grid."""
    width = "16-bit" if cfg.dtype in ("float16", "bfloat16") else cfg.dtype
    return (cfg.impl, cfg.direction, cfg.n_q, cfg.n_k, cfg.d, cfg.batch, cfg.heads, cfg.kv_heads, cfg.causal, width,
            cfg.splits, cfg.sawtooth)


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO).stdout.strip()


def _mb(x: float) -> str:
    """MB with one decimal, three below 1 MB (decoding's partials and queries)."""
    return f"{x / 1e6:,.1f}" if x >= 1e6 or x == 0 else f"{x / 1e6:.3f}"


def markdown(record: dict) -> str:
    schedule = record.get("schedule", "lockstep")
    text = (f"# Predicted DRAM bytes for {record['grid']}, {schedule} schedule (before the GPU run)\n\n"
            f"- command: `{record['command']}`\n- git commit: `{record['commit']}`; kernels as of "
            f"`{record['kernels_commit']}`\n- machine: {record['machine']}\n"
            f"- L2: {GPU} preset, effective {record['l2_effective'] / 1e6:.1f} MB; nominal "
            f"{record['l2_nominal'] / 2**20:.0f} MiB; blocks per SM from `{REPORT}` (commit ecb846a; split-kv's "
            f"{SPLIT_KV_REPORT_COMMIT}; sdpa-flash's from {SDPA_SOURCE})\n"
            f"- measure with: `{record['measure_with']}`; join on impl, dtype, batch, heads, kv_heads, N, d, causal, "
            f"splits\n"
            f"- MB = 10⁶ B; read/write = DRAM bytes during the kernel (what ncu counts); dirty = written but still "
            f"in the L2 at the end; 0.5–1.0× = reads at those fractions of the nominal L2; 2-level = every "
            f"load and store\n- {len(record['rows'])} rows, total {record['seconds']:.0f} s\n\n"
            "| # | impl | dir | dtype | b·h | N | d | causal | B_r×B_c | blk/SM | read MB | write MB | dirty MB "
            "| read 0.5 / 0.75 / 1.0× MB | 2-level read MB | 2-level write MB | method |\n"
            "| ---: | --- | --- | --- | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: "
            "| --- |\n")
    for r in record["rows"]:
        p, eff = r["predicted"], r["predicted"]["effective"]
        sweep = " / ".join(_mb(p[f"{f:g}x"]["reads"]) if f"{f:g}x" in p else "–" for f in FRACTIONS)
        bh = str(r["batch"] * r["heads"]) + (f" / {r['batch'] * r['kv_heads']} kv" if r.get("kv_heads") else "")
        cells = [str(r["index"]), r["impl"], r["direction"], r["dtype"], bh, str(r["n_q"]), str(r["d"]),
                 "yes" if r["causal"] else "no",
                 f"{r['tiling']['Br']}×{r['tiling']['Bc']}" + (f", S={r['splits']}" if r.get("splits") else "")
                 + (", sawtooth" if r.get("sawtooth") else ""),
                 str(r["blocks_per_sm"]),
                 _mb(eff["reads"]), _mb(eff["writes"]), _mb(eff["dirty_at_end"]), sweep,
                 _mb(r["two_level"]["read_bytes"]), _mb(r["two_level"]["write_bytes"]), p["method"]]
        text += "| " + " | ".join(cells) + " |\n"
    backward = [r for r in record["rows"] if r["direction"] == "backward"]
    sdpa = any(r["impl"] == ncu_traffic.SDPA for r in backward)
    names = SDPA_BACKWARD_KERNELS if sdpa else BACKWARD_KERNELS
    if backward:
        others = "dot_do_o runs 5, convert_dq 8" if sdpa else "row_dot runs 3, fill and cast 5"
        text += ("\nThe backward rows kernel by kernel at the effective L2 (each from a cold L2; blk/SM above is the "
                 f"main kernel's, {others}), read / write / dirty MB:\n\n"
                 "| # | dtype | b·h | N | d | causal | " + " | ".join(names) + " |\n"
                 "| ---: | --- | ---: | ---: | ---: | --- |" + " --- |" * len(names) + "\n")
        for r in backward:
            parts = {k["kernel"]: k for k in r["predicted"]["effective"]["kernels"]}
            cells = [str(r["index"]), r["dtype"], str(r["batch"] * r["heads"]), str(r["n_q"]), str(r["d"]),
                     "yes" if r["causal"] else "no"]
            cells += [" / ".join(_mb(parts[k][x]) for x in ("reads", "writes", "dirty_at_end")) if k in parts else "–"
                      for k in names]
            text += "| " + " | ".join(cells) + " |\n"
    split = [r for r in record["rows"] if r["impl"] == "split-kv"]
    if split:
        text += ("\nThe split-kv rows kernel by kernel at the effective L2 (each from a cold L2; blk/SM above is the "
                 "split kernel's, the combine runs 10), read / write / dirty MB:\n\n"
                 "| # | b·h / kv | N_k | d | S | " + " | ".join(SPLIT_KV_KERNELS) + " |\n"
                 "| ---: | --- | ---: | ---: | ---: |" + " --- |" * len(SPLIT_KV_KERNELS) + "\n")
        for r in split:
            parts = {k["kernel"]: k for k in r["predicted"]["effective"]["kernels"]}
            cells = [str(r["index"]), f"{r['batch'] * r['heads']} / {r['batch'] * r['kv_heads']}", str(r["n_k"]),
                     str(r["d"]), str(r["splits"])]
            cells += [" / ".join(_mb(parts[k][x]) for x in ("reads", "writes", "dirty_at_end")) if k in parts else "–"
                      for k in SPLIT_KV_KERNELS]
            text += "| " + " | ".join(cells) + " |\n"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", default="call3", choices=sorted(g for g in GRIDS if g.startswith("call")))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None,
                        help="write OUT.json and OUT.md (default experiments/results/gpu/predictions-<short commit>)")
    args = parser.parse_args()
    start = time.perf_counter()
    configs = GRIDS[args.grid]()
    unique = list({_key(c): c for c in configs}.values())
    unique.sort(key=lambda c: -c.batch * c.heads * c.n_q * c.n_k)  # the longest first, for the pool
    with ProcessPoolExecutor(args.jobs) as pool:
        predicted = dict(zip((_key(c) for c in unique), pool.map(predict, unique)))
    rows = [{"index": index, **asdict(cfg), "tiling": cfg.tile(), "blocks_per_sm": blocks_per_sm(cfg),
             "blocks_per_sm_source": blocks_per_sm_source(cfg),
             "predicted": predicted[_key(cfg)], "two_level": two_level(cfg)} for index, cfg in enumerate(configs)]
    commit = _git("rev-parse", "HEAD")
    record = {
        "command": "python -m experiments.predict_next_call " + " ".join(sys.argv[1:]),
        "commit": commit, "kernels_commit": _git("log", "-1", "--format=%H", "--", "kernels/"),
        "machine": {"node": platform.node(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version(), "jobs": args.jobs},
        "grid": args.grid, "schedule": "lockstep",
        "measure_with": f"NCU=ncu python -m experiments.ncu_traffic profile --grid {args.grid} --out DIR "
                        f"(experiments/results/gpu/call3.sh)",
        "gpu": GPU, "l2_nominal": int(GPUS[GPU].l2.value), "l2_effective": int(GPUS[GPU].l2_effective.value),
        "l2_effective_source": GPUS[GPU].l2_effective.source, "fractions_of_nominal": list(FRACTIONS),
        "seconds": time.perf_counter() - start, "rows": rows,
    }
    out = args.out or REPO / f"experiments/results/gpu/predictions-{commit[:7]}"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_name(out.name + ".json").write_text(json.dumps(record, indent=2) + "\n")
    out.with_name(out.name + ".md").write_text(markdown(record))
    print(markdown(record), end="")


if __name__ == "__main__":
    main()
