"""What the L2 model changes in the analysis (issue 17, item 5): predictions on the H100 preset, not measurements.

Three tables, each from ``iosim.dram`` (forward pass, float16, d = 128, the fit tiling at
M = the H100's 228 KiB of shared memory per SM, the preset's effective 37 MB L2):

- loop order: flash (K/V outer) against flash-swapped (FlashAttention-2's order), DRAM
  read bytes beside the two-level count's, over batch·heads and N;
- when K and V of one head stop fitting: flash-swapped's K/V DRAM reads over the bytes of
  K and V, against N at one batch·head;
- grouped-query attention with per-head blocks (the packing of split-kv aside): K/V DRAM
  reads over one read per K/V head, 32 query heads sharing kv_heads K/V heads.

Usage: python -m experiments.l2_analysis [--out experiments/results/l2_analysis.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
from pathlib import Path

import iosim

SHAPE = dict(d=128, M="228KiB", dtype="float16", gpu="h100")
ITEM = 2  # bytes of a float16 element
LOOP_ORDER = [(bh, n) for bh in (1, 16, 256) for n in (1024, 4096, 16384, 65536)]
FIT = (4096, 16384, 32768, 49152, 65536, 131072)  # N at one batch·head
GQA = [(kv, n) for kv in (32, 8, 1) for n in (4096, 16384, 65536)]  # (kv_heads, N) under 32 query heads


def kv_reads(r) -> int:
    return r.dram.tensor("K").reads + r.dram.tensor("V").reads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("experiments/results/l2_analysis.json"))
    args = parser.parse_args()
    order = []
    for bh, n in LOOP_ORDER:
        flash, swapped = (iosim.dram(a, N=n, heads=bh, **SHAPE) for a in ("flash", "flash-swapped"))
        order.append(dict(batch_heads=bh, N=n, flash_hbm_read=flash.hbm.read_bytes, flash_dram_read=flash.dram.reads,
                          swapped_hbm_read=swapped.hbm.read_bytes, swapped_dram_read=swapped.dram.reads))
    fit = []
    for n in FIT:
        r = iosim.dram("flash-swapped", N=n, heads=1, **SHAPE)
        fit.append(dict(N=n, kv_bytes=2 * n * SHAPE["d"] * ITEM, kv_dram_read=kv_reads(r), tiling=str(r.tiling)))
    gqa = []
    for kv, n in GQA:
        r = iosim.dram("flash-swapped", N=n, heads=32, kv_heads=kv, **SHAPE)
        gqa.append(dict(kv_heads=kv, N=n, kv_once=kv * 2 * n * SHAPE["d"] * ITEM, kv_dram_read=kv_reads(r),
                        kv_hbm_read=r.hbm.tensor("K").read_bytes + r.hbm.tensor("V").read_bytes))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    args.out.write_text(json.dumps(dict(command="python -m experiments.l2_analysis", commit=commit,
                                        machine=platform.machine(), shape=SHAPE, loop_order=order, kv_fit=fit,
                                        gqa=gqa), indent=1) + "\n")
    mb = 1e6
    print("loop order (MB read): batch·heads, N, flash two-level / DRAM, flash-swapped two-level / DRAM")
    for r in order:
        print(f"  {r['batch_heads']:>4} {r['N']:>6}  "
              f"{r['flash_hbm_read'] / mb:>12,.1f} / {r['flash_dram_read'] / mb:>12,.1f}"
              f"  {r['swapped_hbm_read'] / mb:>12,.1f} / {r['swapped_dram_read'] / mb:>10,.1f}")
    print("K/V of one head against the L2: N, K+V MB, K/V DRAM reads ÷ K+V")
    for r in fit:
        print(f"  {r['N']:>6}  {r['kv_bytes'] / mb:>7.1f}  {r['kv_dram_read'] / r['kv_bytes']:.2f}")
    print("GQA, 32 query heads: kv_heads, N, K/V DRAM reads ÷ one read per K/V head (two-level ÷ the same)")
    for r in gqa:
        print(f"  {r['kv_heads']:>2} {r['N']:>6}  {r['kv_dram_read'] / r['kv_once']:.2f}  "
              f"({r['kv_hbm_read'] / r['kv_once']:,.0f})")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
