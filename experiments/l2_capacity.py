"""The L2's capacity as a kernel sees it: every SM reads S bytes twice, and the second pass is timed (issue 28, item 5).

iosim's h100 preset takes 37 MB of the 50 MiB L2 as effective, from a published curve measured on an H100 PCIe
(iosim.core.gpus); this measures the curve on the GPU at hand. For each S, a buffer of S bytes is read once (the warm
pass) and again (the measured pass) by a grid-stride kernel over every SM, after a 512 MiB read that evicts it. While S
fits the L2 the measured pass runs at L2 bandwidth; past the effective capacity it falls to DRAM bandwidth.

    python -m experiments.l2_capacity --out DIR [--mb 8 16 ... 96] [--repeats 3] [--profile]

writes DIR/l2_capacity.json: per S, the measured pass's median time and bandwidth by CUDA events. --profile brackets
each measured pass with cudaProfilerStart/Stop, so that

    ncu --metrics dram__bytes_read.sum --cache-control none --profile-from-start off --csv \\
        python -m experiments.l2_capacity --out DIR --profile

reads the DRAM bytes of the measured passes alone (each S launches --repeats of them, in the order of --mb): the
bytes the L2 did not hold. --smoke runs tiny sizes, also under Numba's CUDA simulator.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np
from numba import cuda, float32

from experiments.gpu_bench import git_commit
from iosim.kernels._device import simulator_enabled

MB = 10**6
DEFAULT_MB = (8, 16, 24, 28, 32, 36, 40, 44, 48, 52, 56, 64, 80, 96)
EVICT_BYTES = 512 * 2**20
THREADS = 256  # a block's; each SM is given as many blocks as its resident threads allow (8 on an H100)


@cuda.jit
def read_all(x, sink):
    """Sum x with a grid stride (so that every SM reads its share), one partial per thread into sink."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    acc = float32(0.0)
    while i < x.size:
        acc += x[i]
        i += stride
    sink[cuda.grid(1)] = acc


def blocks_per_sm() -> int:
    """Blocks of THREADS that fill one SM of the GPU at hand: its resident threads (2,048 at compute capability 8.0 to
    10.0, 1,536 at 12.x, 1,024 at 7.5) over THREADS; 1 under the simulator."""
    if simulator_enabled():
        return 1
    return max(1, cuda.get_current_device().MAX_THREADS_PER_MULTIPROCESSOR // THREADS)


def measure(sizes: list[int], repeats: int, profile: bool) -> list[dict]:
    """The measured pass over each size in bytes, by a grid that fills every SM; under the simulator one warp on one
    small buffer."""
    simulated = simulator_enabled()
    sms = 1 if simulated else cuda.get_current_device().MULTIPROCESSOR_COUNT
    blocks, threads = (1, 32) if simulated else (sms * blocks_per_sm(), THREADS)
    sink = cuda.device_array(blocks * threads, dtype=np.float32)
    evict = cuda.to_device(np.ones((4096 if simulated else EVICT_BYTES) // 4, dtype=np.float32))
    rows = []
    for size in sizes:
        x = cuda.to_device(np.ones(size // 4, dtype=np.float32))
        read_all[blocks, threads](x, sink)  # compile once before any timing
        times = []
        for _ in range(repeats):
            read_all[blocks, threads](evict, sink)
            read_all[blocks, threads](x, sink)  # the warm pass
            begin, end = cuda.event(), cuda.event()
            cuda.synchronize()
            if profile:
                cuda.profile_start()
            begin.record()
            read_all[blocks, threads](x, sink)  # the measured pass
            end.record()
            end.synchronize()
            if profile:
                cuda.profile_stop()
            times.append(begin.elapsed_time(end) / 1e3)
        seconds = statistics.median(times)
        rows.append({"mb": size / MB, "bytes": x.size * 4, "seconds": seconds, "times": times,
                     "gb_per_s": x.size * 4 / seconds / 1e9 if seconds > 0 else None})
        print(f"S = {size / MB} MB: {rows[-1]['gb_per_s']} GB/s", flush=True)
    return rows


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--mb", type=int, nargs="+", default=list(DEFAULT_MB), help="buffer sizes, 10⁶ bytes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="bracket the measured passes for ncu")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes; runs under the simulator")
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    if args.repeats < 1 or min(args.mb) < 1:
        raise SystemExit(f"--repeats {args.repeats}, --mb {args.mb}: each needs at least 1")
    sizes = [4096] if args.smoke else [mb * MB for mb in args.mb]
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"commit": git_commit(), "threads": THREADS, "blocks_per_sm": blocks_per_sm(), "profiled": args.profile,
              "evict_bytes": EVICT_BYTES,
              "rows": measure(sizes, 1 if args.smoke else args.repeats, args.profile)}
    name = "l2_capacity_profiled.json" if args.profile else "l2_capacity.json"
    (args.out / name).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
