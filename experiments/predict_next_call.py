"""The L2 model's DRAM bytes for every configuration the next GPU call profiles, committed before it runs.

    python experiments/predict_next_call.py [--grid call3] [--jobs 2]
                                            [--out experiments/results/gpu/predictions-<short commit>]

Issue 17, item 4: predictions first, measurements second. For each configuration of
``ncu_traffic.py``'s grid (call 3: the forward of flash-swapped, float32 and float16, and of
flash-swapped-tc, float16 and bfloat16; batch·heads 1 to 1024, N 1024 to 65536, d 64 and 128,
causal and not; then the backward of flash-swapped, float32 and float16, batch·heads 1 to 256,
N 1024 to 16384, and of flash-swapped-tc, float16 and bfloat16, at the same shapes), this writes the tile the CURRENT kernel picks, its blocks per H100 SM (from the
sm_90 resource report, cited per row) and the predicted DRAM reads, writes during the kernel and
dirty bytes left at its end, at the effective L2 and at 0.5, 0.75 and 1.0 × the nominal 50 MiB,
beside the two-level count (``Algorithm.traffic``: every load and store is HBM traffic).

The grids. flash-swapped's kernel is the grid ``iosim.algorithms.flash_swapped.grid`` declares
(block bh·T_r + i, Q_i read, K_j and V_j per step, O_i in the input dtype and lse_i float32 written
once, a causal query block stopping at its last visible key block), so its rows go through
``iosim.gpu.lockstep.dram_counts`` (the closed form for full attention, the simulation for causal)
with the blocks per SM given explicitly: the grid's own default is call 1's kernels' occupancy.
flash-swapped-tc's 16-bit forward has the same blocks, tiles and writes but fetches K_(j+1),
V_(j+1) into registers during step j (kernels/flash_swapped_tc.py): each block's K/V accesses come
one step earlier, so its rows are simulated on ``tc_forward_grid`` below; the declared grid's
closed form at the same tiles is recorded beside it where it applies (full attention).

The backward rows run ``ALGORITHMS["flash-swapped"].backward``'s kernels
(``flash_swapped_backward.launches``: row_dot, fill, the main kernel, and in float16 the cast of dQ),
each from a cold L2 as ``ncu --cache-control all`` measures them, through
``iosim.gpu.lockstep.dram_counts_by_kernel`` (their sum is ``dram_counts``; every kernel here is
simulated). ``dram_counts``'s ``blocks_per_sm`` would set all four kernels at once, so the report's
counts replace the grids' own (call 1's kernels' 5) in ``backward_algorithm``: the main kernel's, and
row_dot's 3 (80 registers × 256 threads since 8eb2624, which made its loads coalesced); fill and cast
keep their grids' 5, which the current report also gives them (48 and 42 registers × 256 threads).
The kernels are kept one by one in the JSON, as ncu reports them.
flash-swapped-tc's 16-bit backward launches the same row_dot, fill and cast (kernels/_device.py's
grid-stride kernels) around its own main kernel: flash-swapped's blocks at its tile of 64 keys by
queries_per_step(d) queries, each visiting first the query blocks that see its keys whole, then
the masked ones (``tc_backward_grid``).

The split-kv rows (grid call3-split-kv, decoding) run ``iosim.algorithms.split_kv.launches`` on the problem packed
by GQA group at the kernel's tile and the row's splits: the split kernel, then the combine where S > 1, each from
a cold L2, with the blocks per SM of kernels/split_kv.py's two kernels from the report (``split_kv_algorithm``).

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
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

from iosim.algorithms.algorithm import Algorithm  # noqa: E402
from iosim.algorithms import flash_swapped, flash_swapped_backward, split_kv  # noqa: E402
from iosim.core.gpus import GPUS  # noqa: E402
from iosim.gpu.l2 import SCHEDULES, Grid, SharedSteps, Tiles, in_sequence, l2_config  # noqa: E402
from iosim.gpu.schedule import simulate  # noqa: E402
from iosim.gpu.lockstep import dram_counts, dram_counts_by_kernel  # noqa: E402
from iosim.core.problem import AttentionShape, Problem  # noqa: E402
from iosim.core.tiling import Tiling  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ncu_traffic import GRIDS, LaunchConfig  # noqa: E402

GPU = "h100"
FRACTIONS = (0.5, 0.75, 1.0)  # of the nominal L2, as l2_call1.py
REPORT = "experiments/results/kernels_resources_sm90.md"
# Resident blocks per H100 SM of the current kernels, by (impl, direction, dtype, d): the report above
# (commit ecb846a; the kernel commits since are refactors: 2abe7c7, 25c39d7, a42bc67, 9b56a74, 30f4a3b),
# column "blocks/SM (limit)", all limited by registers. Causal rows use the "causal+dropout" row of the
# same kernel (no causal-only variant is compiled there); it gives the same count in every case. For the
# backward it is the main kernel's; row_dot runs ROW_DOT_BLOCKS_PER_SM, fill and cast their grids' own (see the
# docstring).
BLOCKS_PER_SM = {
    ("flash-swapped", "forward", "float32", 64): 2,  # 255 registers × 128 threads, 64×32
    ("flash-swapped", "forward", "float32", 128): 4,  # 245 (255 causal) registers × 64 threads, 32×16
    ("flash-swapped", "forward", "float16", 64): 2,  # 255 × 128, 64×32
    ("flash-swapped", "forward", "float16", 128): 4,  # 245 (255 causal) × 64, 32×16
    ("flash-swapped-tc", "forward", "float16", 64): 2,  # 203 (255 causal) × 128, 64×64
    ("flash-swapped-tc", "forward", "bfloat16", 64): 2,
    ("flash-swapped-tc", "forward", "float16", 128): 2,  # 230 (255 causal) × 128, 64×32
    ("flash-swapped-tc", "forward", "bfloat16", 128): 2,
    ("flash-swapped", "backward", "float32", 64): 4,  # 255 × 64 (causal: 12 B spilled), 32×32
    ("flash-swapped", "backward", "float32", 128): 4,  # 244 (254 causal) × 64, 16×16
    ("flash-swapped", "backward", "float16", 64): 4,  # 255 × 64 (causal: 12 B spilled), 32×32
    ("flash-swapped", "backward", "float16", 128): 4,  # 244 (254 causal) × 64, 16×16
    ("flash-swapped-tc", "backward", "float16", 64): 2,  # 250 (255 causal) × 128, 64 keys × 64 queries
    ("flash-swapped-tc", "backward", "bfloat16", 64): 2,
    ("flash-swapped-tc", "backward", "float16", 128): 2,  # 255 × 128, 64 keys × 16 queries
    ("flash-swapped-tc", "backward", "bfloat16", 128): 2,
    # split-kv's split kernel (flash-swapped's forward compiled packed, with S splits; the same count at every S of
    # call3-split-kv, report rows "split-kv split", commit SPLIT_KV_REPORT_COMMIT); its combine: SPLIT_KV_COMBINE_BLOCKS
    ("split-kv", "forward", "float16", 64): 2,  # 220 registers × 128 threads, 64×32
    ("split-kv", "forward", "float16", 128): 4,  # 241 × 64, 32×16
}
# split-kv's combine kernel (kernels/split_kv.combine_kernel): 48 registers × 128 threads at d = 64 and 128
SPLIT_KV_COMBINE_BLOCKS = 10
SPLIT_KV_REPORT_COMMIT = "cd9c224"  # the report's commit for split-kv's rows (its kernels are those of 5961c3a)
SPLIT_KV_KERNELS = ("split", "combine")  # split_kv.launches, in launch order
BACKWARD = flash_swapped_backward.ALGORITHM
BACKWARD_KERNELS = ("row_dot", "fill", "main", "cast")  # flash_swapped_backward.launches, in launch order
# row_dot since 8eb2624 (kernels/_device.py, coalesced): 80 registers × 256 threads, the report at e43361e
ROW_DOT_BLOCKS_PER_SM = 3


def tc_forward_grid(pb: Problem, tiling: Tiling, blocks_per_sm: int) -> Grid:
    """flash-swapped-tc's 16-bit forward: block bh·T_r + i as flash_swapped.grid, K/V one step early.

    Step 0 reads Q_i, K_0, V_0 (the fetch before the loop) and K_1, V_1 (fetched during step 0); step r
    reads K_(r+1), V_(r+1) while there is one (``keys_end`` stops the fetch at the last key block the
    query block sees); the last step writes O_i (input dtype) and lse_i (float32). A query block that
    sees no key reads Q_i and writes O_i, lse_i.
    """
    tiles = Tiles(flash_swapped.GRID_TENSORS)
    accesses = flash_swapped.block_accesses(tiles, pb, tiling)

    def steps(b: int):
        q, kv, run, out = accesses(b)
        j0, n = run.start, len(run)
        if n <= 1:
            return iter((q + (kv[j0] if n else ()) + out,))
        # step r fetches K_(r+1), V_(r+1), the head's shared steps; the last computes on K_(n−1), V_(n−1), fetched
        # the step before, and writes O_i, lse_i
        return SharedSteps((q + kv[j0] + kv[j0 + 1],), kv, j0 + 2, j0 + n, (out,))

    return Grid(pb.shape.bh * -(-pb.shape.n_q // tiling.Br), steps, tiles, blocks_per_sm)


def tc_backward_order(pb: Problem, tiling: Tiling):
    """The query blocks flash-swapped-tc's 16-bit backward visits for key block j, in its order: those whose
    every query sees every key of the block whole (``plain_step``, from whole_from to whole_to), then the
    masked ones (the causal edge from i_start, then the ragged last query block), as its kernel loops."""
    n_q, n_k, BQ, BKB = pb.shape.n_q, pb.shape.n_k, tiling.Br, tiling.Bc
    Tr, full_rows, shift = -(-n_q // BQ), n_q // BQ, n_k - n_q

    def order(j: int):
        col0 = j * BKB
        i_start = max(0, col0 - shift) // BQ if pb.causal else 0
        whole_from = i_start
        if pb.causal:  # the block's last key is seen from query col0 + BKB − 1 − (N_k − N_q) on
            whole_from = max(i_start, -(-max(0, col0 + BKB - 1 - shift) // BQ))
        whole_from = min(whole_from, Tr)
        whole_to = max(whole_from, full_rows) if col0 + BKB <= n_k else whole_from
        if whole_from == i_start:  # nothing masked before the whole ones: one ascending run
            return range(i_start, Tr)
        return [*range(whole_from, whole_to), *range(i_start, whole_from), *range(whole_to, Tr)]

    return order


def tc_backward_grid(pb: Problem, tiling: Tiling, blocks_per_sm: int) -> Grid:
    """flash-swapped-tc's 16-bit main backward kernel: flash-swapped's blocks (bh·T_c + j, key block fastest) at
    its tile, 64 keys by queries_per_step(d) queries, each visiting its query blocks in ``tc_backward_order``."""
    return flash_swapped_backward.key_block_grid(pb, tiling, tc_backward_order(pb, tiling), blocks_per_sm)


def backward_algorithm(main_blocks_per_sm: int, tc: bool = False) -> Algorithm:
    """flash-swapped's backward with its main kernel at ``main_blocks_per_sm`` per SM (flash-swapped-tc's main
    kernel where ``tc``) and row_dot at ROW_DOT_BLOCKS_PER_SM; fill and cast keep their grids' own (the tc
    kernels' are the same grid-stride kernels, kernels/_device.py)."""
    def launches(pb: Problem, tiling: Tiling) -> tuple[Grid, ...]:
        row_dot = replace(flash_swapped_backward.row_dot_grid(pb), blocks_per_sm=ROW_DOT_BLOCKS_PER_SM)
        if tc:  # 16-bit only: its float32 runs flash-swapped's kernels
            return (row_dot, flash_swapped_backward.fill_grid(pb), tc_backward_grid(pb, tiling, main_blocks_per_sm),
                    flash_swapped_backward.cast_grid(pb))
        _, fill, main, *cast = flash_swapped_backward.launches(pb, tiling)
        return (row_dot, fill, replace(main, blocks_per_sm=main_blocks_per_sm), *cast)

    return replace(BACKWARD, launches=launches)


def split_kv_algorithm(split_blocks_per_sm: int) -> Algorithm:
    """split-kv with its split kernel at ``split_blocks_per_sm`` per SM and its combine at SPLIT_KV_COMBINE_BLOCKS,
    as the resource report measures the kernels of kernels/split_kv.py (the package's default is the shared
    memory bound)."""
    def launches(pb: Problem, tiling: Tiling) -> tuple[Grid, ...]:
        per_sm = (split_blocks_per_sm, SPLIT_KV_COMBINE_BLOCKS)
        return tuple(replace(g, blocks_per_sm=n) for g, n in zip(split_kv.launches(pb, tiling), per_sm))

    return replace(split_kv.ALGORITHM, launches=launches)


def split_kv_run(cfg: LaunchConfig) -> tuple[Problem, Tiling]:
    """The problem split-kv's kernels run (packed by GQA group) and its tiling with the row's splits."""
    tile = cfg.tile()
    return problem(cfg).packed_by_group(), Tiling(tile["Br"], tile["Bc"], cfg.splits)


def predict_split_kv(cfg: LaunchConfig, schedule: str = "lockstep") -> dict:
    """The L2 model's DRAM bytes of split-kv's two kernels, each from a cold L2, and their sum."""
    pb, tiling = split_kv_run(cfg)
    algorithm = split_kv_algorithm(blocks_per_sm(cfg))
    out: dict = {"grid": "iosim.algorithms.split_kv.launches (split, then combine where S > 1), each from a cold L2",
                 "method": "simulation, kernel by kernel"}
    for label, capacity in capacities(schedule):
        start = time.perf_counter()
        parts = dram_counts_by_kernel(algorithm, pb, tiling, GPU, capacity, schedule=schedule)
        out[label] = {**_counts(in_sequence(parts)), "seconds": time.perf_counter() - start,
                      "kernels": [{"kernel": name, **{k: v for k, v in _counts(part).items() if k != "by_tensor"}}
                                  for name, part in zip(SPLIT_KV_KERNELS, parts)]}
    return out


def report_commit(cfg: LaunchConfig) -> str:
    """The commit of the resource report that gave the row's blocks per SM."""
    return SPLIT_KV_REPORT_COMMIT if cfg.impl == "split-kv" else "ecb846a"


def blocks_per_sm(cfg: LaunchConfig) -> int:
    return BLOCKS_PER_SM[(cfg.impl, cfg.direction, cfg.dtype, cfg.d)]


def problem(cfg: LaunchConfig) -> Problem:
    return Problem(AttentionShape(cfg.batch, cfg.heads, cfg.n_q, cfg.n_k, cfg.d, kv_heads=cfg.kv_heads), tau=1.0,
                   dtype=cfg.dtype, causal=cfg.causal, dropout_p=cfg.dropout_p)


def _counts(dram) -> dict:
    return {"reads": dram.reads, "writes": dram.writes, "dirty_at_end": dram.dirty_at_end,
            "capacity": dram.capacity, "concurrent": dram.concurrent,
            "by_tensor": [asdict(t) for t in dram.tensors]}


def capacities(schedule: str = "lockstep") -> list[tuple[str, int | None]]:
    """The L2 bytes each prediction is made at: the preset's effective (None), then fractions of the nominal; the
    effective alone for the staggered schedule, which is always simulated."""
    if schedule != "lockstep":
        return [("effective", None)]
    nominal = int(GPUS[GPU].l2.value)
    return [("effective", None)] + [(f"{f:g}x", int(f * nominal)) for f in FRACTIONS]


def backward_counts(cfg: LaunchConfig, capacity: int | None, schedule: str = "lockstep") -> list:
    """The DRAM counts of a backward configuration's kernels, in launch order, each from a cold L2."""
    tile = cfg.tile()
    tc = cfg.impl == "flash-swapped-tc" and cfg.dtype != "float32"
    return dram_counts_by_kernel(backward_algorithm(blocks_per_sm(cfg), tc), problem(cfg),
                                 Tiling(tile["Br"], tile["Bc"]), GPU, capacity, schedule=schedule)


def predict_backward(cfg: LaunchConfig, schedule: str = "lockstep") -> dict:
    """The L2 model's DRAM bytes of a backward configuration: the sum of its kernels, and each of them."""
    tc = cfg.impl == "flash-swapped-tc" and cfg.dtype != "float32"
    main = "predict_next_call.tc_backward_grid" if tc else "main"
    out: dict = {"grid": f"iosim.algorithms.flash_swapped_backward's row_dot, fill, {main}"
                         f"{', cast' if cfg.dtype != 'float32' else ''}, each from a cold L2",
                 "method": "simulation, kernel by kernel"}
    for label, capacity in capacities(schedule):
        start = time.perf_counter()
        parts = backward_counts(cfg, capacity, schedule)
        out[label] = {**_counts(in_sequence(parts)), "seconds": time.perf_counter() - start,
                      "kernels": [{"kernel": name, **{k: v for k, v in _counts(part).items() if k != "by_tensor"}}
                                  for name, part in zip(BACKWARD_KERNELS, parts)]}
    return out


def predict(cfg: LaunchConfig, schedule: str = "lockstep") -> dict:
    """The L2 model's DRAM bytes of one configuration, at the effective and the swept capacities."""
    if cfg.direction == "backward":
        return predict_backward(cfg, schedule)
    if cfg.impl == "split-kv":
        return predict_split_kv(cfg, schedule)
    pb, tile = problem(cfg), cfg.tile()
    tiling = Tiling(tile["Br"], tile["Bc"])
    per_sm = blocks_per_sm(cfg)
    tc = cfg.impl == "flash-swapped-tc" and cfg.dtype != "float32"
    if cfg.sawtooth:
        return predict_sawtooth(cfg, pb, tiling, per_sm, schedule)
    out: dict = {"grid": "tc_forward_grid (K/V fetched one step early)" if tc else "iosim.algorithms.flash_swapped.grid",
                 "method": "simulation" if tc or cfg.causal or cfg.kv_heads or schedule != "lockstep"
                 else "closed form (flash_swapped.dram)"}
    for label, capacity in capacities(schedule):
        start = time.perf_counter()
        if tc:
            g = tc_forward_grid(pb, tiling, per_sm)
            dram = simulate(g, l2_config(g, GPU, capacity, schedule=schedule))
        else:
            dram = dram_counts(flash_swapped.ALGORITHM, pb, tiling, GPU, capacity, blocks_per_sm=per_sm,
                               schedule=schedule)
        out[label] = {**_counts(dram), "seconds": time.perf_counter() - start}
    if tc and not cfg.causal:  # the declared grid at the same tiles: what the one-step-early fetch changes
        declared = dram_counts(flash_swapped.ALGORITHM, pb, tiling, GPU, blocks_per_sm=per_sm)
        out["declared_grid_effective"] = {k: v for k, v in _counts(declared).items() if k != "by_tensor"}
    return out


def predict_sawtooth(cfg: LaunchConfig, pb: Problem, tiling: Tiling, per_sm: int, schedule: str) -> dict:
    """flash-swapped's forward in the sawtooth order: ``flash_swapped.sawtooth_grid`` at the kernel's blocks per SM
    (the sawtooth build's, which the report gives as the plain one's), simulated."""
    out: dict = {"grid": "iosim.algorithms.flash_swapped.sawtooth_grid", "method": "simulation"}
    for label, capacity in capacities(schedule):
        start = time.perf_counter()
        g = replace(flash_swapped.sawtooth_grid(pb, tiling), blocks_per_sm=per_sm)
        dram = simulate(g, l2_config(g, GPU, capacity, schedule=schedule))
        out[label] = {**_counts(dram), "seconds": time.perf_counter() - start}
    return out


def two_level(cfg: LaunchConfig) -> dict:
    """The two-level count at the kernel's tiles: ``Algorithm.traffic`` with M the peak those tiles need."""
    pb, tile = problem(cfg), cfg.tile()
    algorithm = BACKWARD if cfg.direction == "backward" else flash_swapped.ALGORITHM
    if cfg.impl == "split-kv":
        counts = split_kv.ALGORITHM.traffic(*split_kv_run(cfg), 2**50)
    else:
        counts = algorithm.traffic(pb, Tiling(tile["Br"], tile["Bc"]), 2**50)
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
            f"{SPLIT_KV_REPORT_COMMIT})\n"
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
    if backward:
        text += ("\nThe backward rows kernel by kernel at the effective L2 (each from a cold L2; blk/SM above is the "
                 f"main kernel's, row_dot runs {ROW_DOT_BLOCKS_PER_SM}, fill and cast 5), read / write / dirty MB:\n\n"
                 "| # | dtype | b·h | N | d | causal | " + " | ".join(BACKWARD_KERNELS) + " |\n"
                 "| ---: | --- | ---: | ---: | ---: | --- |" + " --- |" * len(BACKWARD_KERNELS) + "\n")
        for r in backward:
            parts = {k["kernel"]: k for k in r["predicted"]["effective"]["kernels"]}
            cells = [str(r["index"]), r["dtype"], str(r["batch"] * r["heads"]), str(r["n_q"]), str(r["d"]),
                     "yes" if r["causal"] else "no"]
            cells += [" / ".join(_mb(parts[k][x]) for x in ("reads", "writes", "dirty_at_end")) if k in parts else "–"
                      for k in BACKWARD_KERNELS]
            text += "| " + " | ".join(cells) + " |\n"
    split = [r for r in record["rows"] if r["impl"] == "split-kv"]
    if split:
        text += (f"\nThe split-kv rows kernel by kernel at the effective L2 (each from a cold L2; blk/SM above is the "
                 f"split kernel's, the combine runs {SPLIT_KV_COMBINE_BLOCKS}), read / write / dirty MB:\n\n"
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
    parser.add_argument("--schedule", default="lockstep", choices=SCHEDULES,
                        help="how the first blocks start (iosim.gpu.l2.SCHEDULES); staggered writes OUT-staggered, at the "
                             "effective L2 only")
    parser.add_argument("--out", type=Path, default=None,
                        help="write OUT.json and OUT.md (default experiments/results/gpu/predictions-<short commit>)")
    args = parser.parse_args()
    start = time.perf_counter()
    configs = GRIDS[args.grid]()
    unique = list({_key(c): c for c in configs}.values())
    unique.sort(key=lambda c: -c.batch * c.heads * c.n_q * c.n_k)  # the longest first, for the pool
    with ProcessPoolExecutor(args.jobs) as pool:
        predicted = dict(zip((_key(c) for c in unique), pool.map(partial(predict, schedule=args.schedule), unique)))
    rows = [{"index": index, **asdict(cfg), "tiling": cfg.tile(), "blocks_per_sm": blocks_per_sm(cfg),
             "blocks_per_sm_source": f"{REPORT} ({report_commit(cfg)}), {cfg.impl} {cfg.direction} d={cfg.d} "
                                     f"{ {'float32': 'fp32', 'float16': 'fp16', 'bfloat16': 'bf16'}[cfg.dtype]}"
                                     f"{' causal+dropout' if cfg.causal else ''}",
             "predicted": predicted[_key(cfg)], "two_level": two_level(cfg)} for index, cfg in enumerate(configs)]
    commit = _git("rev-parse", "HEAD")
    record = {
        "command": "python experiments/predict_next_call.py " + " ".join(sys.argv[1:]),
        "commit": commit, "kernels_commit": _git("log", "-1", "--format=%H", "--", "kernels/"),
        "machine": {"node": platform.node(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version(), "jobs": args.jobs},
        "grid": args.grid, "schedule": args.schedule,
        "measure_with": f"NCU=ncu python experiments/ncu_traffic.py profile --grid {args.grid} --out DIR "
                        f"(experiments/results/gpu/call3.sh)",
        "gpu": GPU, "l2_nominal": int(GPUS[GPU].l2.value), "l2_effective": int(GPUS[GPU].l2_effective.value),
        "l2_effective_source": GPUS[GPU].l2_effective.source, "fractions_of_nominal": list(FRACTIONS),
        "seconds": time.perf_counter() - start, "rows": rows,
    }
    suffix = "" if args.schedule == "lockstep" else f"-{args.schedule}"
    out = args.out or REPO / f"experiments/results/gpu/predictions-{commit[:7]}{suffix}"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_name(out.name + ".json").write_text(json.dumps(record, indent=2) + "\n")
    out.with_name(out.name + ".md").write_text(markdown(record))
    print(markdown(record), end="")


if __name__ == "__main__":
    main()
