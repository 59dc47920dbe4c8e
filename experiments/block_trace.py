"""Each thread block's SM, start and end on the GPU: the block schedule iosim.gpu models, measured (issue 28, item 5).

iosim.gpu's two schedules agree on which blocks are resident and part on their phase: lockstep has every resident
block on the same K/V step, staggered starts the first wave spread out. Which one a GPU follows decides the DRAM bytes
of flash-swapped's many-wave rows by up to 400×. Here flash-swapped's forward runs traced (kernels/_trace.py): thread 0
of each block stamps its SM (%smid) and the global timer (%globaltimer, ns) at its start and after its last store.

    python -m experiments.block_trace --out DIR [--shape NAME ...] [--repeats 2]

writes, per shape, DIR/NAME.npz (arrays sm, start, end per block index, times in ns from the first start, of the last
repeat) and DIR/summary.json: the launch (blocks, threads, tiling, registers of the traced and the untraced kernel),
each repeat's kernel time by CUDA events for the traced and the untraced kernel, and what the stamps show: SMs used,
the most blocks an SM held at once, the first wave's start spread, block durations (10%, 50%, 90%), and how far the
start order strays from the block index order. The shapes are rows of call 3's predictions where the schedules part
(experiments/ncu_traffic.py, short-schedule). --smoke runs a tiny shape, also under Numba's CUDA simulator, where the
SM is 0 and the times the host's.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from experiments.gpu_bench import git_commit

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class TraceShape:
    dtype: str
    heads: int
    n: int
    d: int
    sawtooth: bool = False
    tiles: tuple[int, int, int, int] | None = None  # (B_r, B_c, TM, TN); None: the kernel's default tiling


SHAPES = {  # few waves (one head, 15 of 264 blocks at once) and many (16 heads, 124 waves)
    "fp16-h1-n131072-d128": TraceShape("float16", 1, 131072, 128),
    "fp16-h1-n131072-d128-sawtooth": TraceShape("float16", 1, 131072, 128, sawtooth=True),
    "fp32-h16-n65536-d128": TraceShape("float32", 16, 65536, 128),
}
SMOKE = {"smoke": TraceShape("float32", 2, 40, 16, tiles=(16, 16, 2, 4))}  # 32 threads a block: the simulator's


def summarize(sm: np.ndarray, start: np.ndarray, end: np.ndarray) -> dict:
    """What the stamps say about the schedule: times in ns from the first start."""
    blocks = len(sm)
    events = sorted([(t, 1) for t in start.tolist()] + [(t, -1) for t in end.tolist()], key=lambda e: (e[0], e[1]))
    live = most = 0
    for _, change in events:
        live += change
        most = max(most, live)
    per_sm_most = 0
    for s in np.unique(sm):
        on = sm == s
        ev = sorted([(t, 1) for t in start[on].tolist()] + [(t, -1) for t in end[on].tolist()],
                    key=lambda e: (e[0], e[1]))
        live_sm = 0
        for _, change in ev:
            live_sm += change
            per_sm_most = max(per_sm_most, live_sm)
    first_wave = start[: min(blocks, most)]
    duration = end - start
    order = np.argsort(start, kind="stable")
    return {
        "blocks": blocks,
        "sms_used": int(len(np.unique(sm))),
        "most_blocks_at_once": int(most),
        "most_blocks_at_once_on_one_sm": int(per_sm_most),
        "first_wave_blocks": int(len(first_wave)),
        "first_wave_start_spread_ns": int(first_wave.max() - first_wave.min()) if len(first_wave) else 0,
        "block_ns": {q: int(np.percentile(duration, p)) for q, p in (("p10", 10), ("p50", 50), ("p90", 90))},
        "span_ns": int(end.max() - start.min()),
        "start_order_mean_displacement": float(np.mean(np.abs(order - np.arange(blocks)))),
    }


def registers(kernel) -> list[int] | None:
    """Registers per thread of each compiled specialisation of a numba kernel (None under the simulator)."""
    if not hasattr(kernel, "get_regs_per_thread"):
        return None
    regs = kernel.get_regs_per_thread()
    return sorted(int(r) for r in regs.values()) if isinstance(regs, dict) else [int(regs)]


def trace(name: str, shape: TraceShape, repeats: int, out: Path) -> dict:
    from numba import cuda

    from iosim.kernels import flash_swapped, resolve_config
    from iosim.kernels._trace import STAMPS_PER_BLOCK
    from iosim.kernels.config import Dropout, TileConfig

    rng = np.random.default_rng(0)
    dims = (shape.heads, shape.n, shape.d)
    q, k, v = (cuda.to_device(rng.standard_normal(dims, dtype=np.float32).astype(shape.dtype)) for _ in range(3))
    config = resolve_config("flash-swapped", shape.d, False, None if shape.tiles is None else TileConfig(*shape.tiles))
    blocks = flash_swapped.blocks(shape.heads, shape.n, config)
    stamps = cuda.device_array(STAMPS_PER_BLOCK * blocks, dtype=np.uint64)
    options = dict(tau=1.0 / math.sqrt(shape.d), causal=False, dropout=Dropout.checked(0.0, 0), config=config,
                   sawtooth=shape.sawtooth)

    def timed(**extra) -> float:
        begin, finish = cuda.event(), cuda.event()
        begin.record()
        flash_swapped.forward(q, k, v, **options, **extra)
        finish.record()
        finish.synchronize()
        return begin.elapsed_time(finish) / 1e3

    runs = []
    for _ in range(repeats):  # the first of each also compiles; its time is kept, and labelled
        runs.append({"untraced_s": timed(), "traced_s": timed(stamps=stamps)})
    words = stamps.copy_to_host().reshape(blocks, STAMPS_PER_BLOCK)
    sm, start, end = words[:, 0].astype(np.int64), words[:, 1].astype(np.int64), words[:, 2].astype(np.int64)
    origin = start.min()
    np.savez_compressed(out / f"{name}.npz", sm=sm.astype(np.int32), start=start - origin, end=end - origin)
    # as forward() asks for them, every argument spelled alike: functools.cache keys on the spelling
    kernel = flash_swapped.forward_kernel(shape.d, config, False, False, sawtooth=shape.sawtooth, trace=False)
    traced = flash_swapped.forward_kernel(shape.d, config, False, False, sawtooth=shape.sawtooth, trace=True)
    return {
        "shape": asdict(shape), "blocks": blocks, "threads": config.threads(), "tiling": asdict(config),
        "registers": {"untraced": registers(kernel), "traced": registers(traced)},
        "runs": runs, "runs_note": "seconds by CUDA events; the first run of each kernel includes its compilation",
        "stamps": summarize(sm, start - origin, end - origin),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for NAME.npz and summary.json")
    parser.add_argument("--shape", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="one tiny shape; runs under the simulator")
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    if args.repeats < 1:
        raise SystemExit(f"--repeats {args.repeats}: needs at least 1")
    from experiments.results.gpu.versions import versions
    from iosim.kernels._device import simulator_enabled

    args.out.mkdir(parents=True, exist_ok=True)
    shapes = SMOKE if args.smoke else {name: SHAPES[name] for name in args.shape}
    summary = {"versions": {"simulator": True} if simulator_enabled() else versions(), "commit": git_commit(),
               "traces": {}}
    for name, shape in shapes.items():  # summary.json is rewritten after each shape: a cut run keeps the finished
        summary["traces"][name] = trace(name, shape, args.repeats, args.out)
        (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(f"{name}: {json.dumps(summary['traces'][name]['stamps'])}", flush=True)
    return summary


if __name__ == "__main__":
    main()
