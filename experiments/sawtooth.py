"""Does alternating the K/V scan direction pay on an H100? The L2 model's prediction (issue 17, item 5).

The "sawtooth" order (arXiv 2601.16032, FlashAttention on GB10) scans K/V forward on even
query blocks of a head and backward on odd ones, so that a block starts on the K_j, V_j its
predecessor ended on, which are still in the L2 once K and V of a head exceed it. This
script runs flash-swapped's forward grid (``iosim.gpu.grids.flash_swapped.forward``) in both orders
(``sawtooth=True``: odd query blocks reversed, as the kernel's ``sawtooth=True``
runs them) through ``iosim.gpu.schedule.simulate`` at shapes where K and V of one head reach
past the H100's effective L2, and reports the DRAM bytes of both under the lockstep schedule.
(The staggered schedule's columns, in the file as made at cef7a5e, went with that schedule's
retirement: ``iosim.gpu.hardware.RETIRED_SCHEDULES``.) Nothing here is measured on a GPU.

Usage: python -m experiments.sawtooth [--out experiments/results/sawtooth.json] [--smoke]
(``--smoke``: one small shape, which CI runs to keep the script working.)
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

from iosim.core.gpus import GPUS
from iosim.core.problem import AttentionShape, Problem
from iosim.core.tiling import Tiling
from iosim.gpu.hardware import hardware
from iosim.gpu.kernel import Launch
from iosim.gpu.kernels import KERNELS
from iosim.gpu.schedule import simulate

GPU = "h100"
# (batch·heads, N, d): K and V of one head in float16 are 4·N·d bytes: 33.6 MB at N = 65,536, d = 128 (just under
# the 37 MB effective L2), 67 MB at 131,072, 134 MB at 262,144; one head, and as many heads as fill the SMs
CASES = [(1, 65_536, 128), (1, 131_072, 128), (1, 262_144, 128), (4, 131_072, 128), (1, 262_144, 64)]
TILING = Tiling(64, 64)  # a float16 tile of the size FlashAttention-2 uses at d = 128
SMOKE_CASES = [(2, 4096, 64)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="default experiments/results/sawtooth.json; --smoke "
                                                                "needs its own")
    parser.add_argument("--smoke", action="store_true", help="one small shape (CI)")
    args = parser.parse_args(argv)
    if args.smoke and args.out is None:
        parser.error("--smoke is not the committed result: give --out PATH")
    args.out = args.out or Path("experiments/results/sawtooth.json")
    kernel, rows = KERNELS["flash-swapped"], []
    for bh, n, d in SMOKE_CASES if args.smoke else CASES:
        pb = Problem(AttentionShape(1, bh, n, n, d), tau=1.0, dtype="float16")
        (g,) = kernel.grids(Launch(pb, TILING))
        config = hardware(GPU).config(g)
        start = time.perf_counter()
        (saw_g,) = kernel.grids(Launch(pb, TILING, sawtooth=True))
        plain, saw = simulate(g, config), simulate(saw_g, config)
        row = dict(batch_heads=bh, N=n, d=d, Br=TILING.Br, Bc=TILING.Bc, concurrent=config.concurrent,
                   l2_bytes=config.capacity, kv_bytes_per_head=4 * n * d,
                   kv_read_plain=plain.tensor("K").reads + plain.tensor("V").reads,
                   kv_read_sawtooth=saw.tensor("K").reads + saw.tensor("V").reads,
                   dram_read_plain=plain.reads, dram_read_sawtooth=saw.reads,
                   seconds=time.perf_counter() - start)
        rows.append(row)
        print(f"bh={bh} N={n} d={d}: K/V read {row['kv_read_plain'] / 1e6:,.1f} MB in order, "
              f"{row['kv_read_sawtooth'] / 1e6:,.1f} MB sawtooth "
              f"({row['kv_read_sawtooth'] / row['kv_read_plain']:.3f}x); K/V of a head "
              f"{row['kv_bytes_per_head'] / 1e6:,.1f} MB, {row['seconds']:.1f} s", flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    command = "python -m experiments.sawtooth" + (" --smoke" if args.smoke else "")
    args.out.write_text(json.dumps(dict(command=command, commit=commit, gpu=GPU,
                                        l2_effective=GPUS[GPU].l2_effective.value, machine=platform.machine(),
                                        rows=rows), indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
