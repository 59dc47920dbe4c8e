"""The kernels of the first H100 run (2026-11-22, kernels at d4169c1), as a dated kernel description.

Their grids are those of today's flash and flash-swapped kernels (the kernels changed registers, not the order of
their tiles: row_dot's loads were coalesced later, which the DRAM level does not see), at the occupancy the sm_90
resource report of d4169c1's kernels gave (``git show 8d6aafb:experiments/results/kernels_resources_sm90.md``, at
c325e6e). ``experiments/l2_call1.py`` sets that run's measurements beside these descriptions; the measurements and
what they showed are in docs/gpu-logs/.
"""

from __future__ import annotations

from iosim.gpu.grids import _device, flash, flash_swapped
from iosim.gpu.kernel import Kernel, Launch
from iosim.gpu.l2 import Grid

COMMIT = "d4169c1"
SOURCE = f"the first H100 run's kernels (2026-11-22, kernels at {COMMIT}); blocks per SM from their sm_90 resource " \
         "report (8d6aafb, at c325e6e), else as shared memory allows; their code is not counted (experiments/results/" \
         "code_bytes.md sets it beside the run)"

# Resident blocks per H100 SM, float32, by (d, B_r, B_c) (the backward: (d, B), its tile square).
# flash forward, d = 64, 32x32: 3 (153 registers x 128 threads). d = 128, 16x16 is not in the report: 64 threads
# of at most 255 registers take at most 2 x 8,192 of the SM's 65,536, and its 25.7 KB of shared memory fit 8 times,
# so at least 4; 4 is used (the run's 256 blocks are resident at once either way).
FLASH_FORWARD = {(64, 32, 32): 3, (128, 16, 16): 4}
# flash backward, d = 64, 32x32: 4 (196 registers x 64 threads, 43,008 B shared: 6,400 registers a warp, 2 warps in
# each sub-partition's 16,384, 8 warps an SM; the report of 8d6aafb divided the whole register file and gave 5).
# d = 128, 16x16 is not in the report: at least 4 as above; 4 is used (the run's at most 256 blocks are resident at
# once either way).
FLASH_BACKWARD = {(64, 32): 4, (128, 16): 4}
# flash-swapped forward: 128 registers, 44,800 B shared -> 4 (d = 64, 64x32); 159 registers, 37,248 B -> 6
# (d = 128, 32x16). Both limited by registers.
SWAPPED_FORWARD = {(64, 64, 32): 4, (128, 32, 16): 6}
# flash-swapped's backward launches row_dot, fill (float32 dq_acc = 0) and the main kernel, and a cast of dQ for
# float16 only. The main kernel 4 at both tilings (d = 64, 32x32: 200 registers x 64 threads; d = 128, 16x16: 188),
# limited by registers: 6,400 and 6,144 registers a warp, 2 warps in each sub-partition, 8 an SM, 2 a block
# (iosim.gpu.l2.occupancy_limits, as cuda_occupancy.h allocates them; the report of 8d6aafb divided the whole
# register file and gave 5, which the L2 model took until 2026-12-02); fill fp32 5 (48 registers x 256 threads);
# row_dot 5 (the report lists its float16 build, 48 registers x 256 threads; the float32 build is taken to be the
# same).
SWAPPED_BACKWARD = {(64, 32): 4, (128, 16): 4}
GRID_STRIDE = 5


def _flash(launch: Launch) -> tuple[Grid, ...]:
    pb, t = launch.problem, launch.tiling
    if launch.backward:
        return (flash.backward(pb, t, FLASH_BACKWARD.get((pb.shape.d, t.Br)) or flash.backward_smem(pb, t)),)
    return (flash.forward(pb, t, FLASH_FORWARD.get((pb.shape.d, t.Br, t.Bc)) or flash.forward_smem(pb, t)),)


def _flash_swapped(launch: Launch) -> tuple[Grid, ...]:
    pb, t = launch.problem, launch.tiling
    if launch.backward:
        main = flash_swapped.backward(pb, t, SWAPPED_BACKWARD.get((pb.shape.d, t.Br))
                                      or flash_swapped.backward_smem(pb, t))
        return _device.around(pb, main, GRID_STRIDE, GRID_STRIDE, GRID_STRIDE)
    per_sm = SWAPPED_FORWARD.get((pb.shape.d, t.Br, t.Bc)) or flash_swapped.forward_smem(pb, t)
    return (flash_swapped.forward(pb, t, per_sm),)


# the blocks per SM above are an H100 SM's (compute capability 9.0, as the H200's): call 1 ran on an H100
FLASH = Kernel(f"flash@{COMMIT}", "flash", SOURCE, _flash, backward=True, forward_dram=flash.forward_dram,
               runs_on=("H100", "H200"), dtypes=("float32", "float16"))
FLASH_SWAPPED = Kernel(f"flash-swapped@{COMMIT}", "flash-swapped", SOURCE, _flash_swapped, backward=True,
                       forward_dram=flash_swapped.forward_dram, runs_on=("H100", "H200"),
                       dtypes=("float32", "float16"))
