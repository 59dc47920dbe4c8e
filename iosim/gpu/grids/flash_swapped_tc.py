"""The grids of kernels/flash_swapped_tc.py, the tensor-core kernels of flash-swapped in float16 and bfloat16.

The forward is flash-swapped's grid with K_(j+1), V_(j+1) fetched into registers during step j: each block's K/V
accesses come one step earlier. The backward's main kernel is flash-swapped's key-block grid at its own tile
(64 keys by queries_per_step(d) queries), each block visiting first the query blocks that see its keys whole,
then the masked ones; its row_dot, fill and cast are kernels/_device.py's (``iosim.gpu.grids._device``).
"""

from __future__ import annotations

from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.gpu.grids import flash_swapped
from iosim.gpu.l2 import Grid, SharedMemoryBound, SharedSteps, Tiles


def forward(pb: Problem, tiling: Tiling, per_sm: int | SharedMemoryBound) -> Grid:
    """flash-swapped-tc's 16-bit forward: block bh·T_r + i as flash-swapped's, K/V one step early.

    Step 0 reads Q_i, K_0, V_0 (the fetch before the loop) and K_1, V_1 (fetched during step 0); step r
    reads K_(r+1), V_(r+1) while there is one (``keys_end`` stops the fetch at the last key block the
    query block sees); the last step writes O_i (input dtype) and lse_i (float32). A query block that
    sees no key reads Q_i and writes O_i, lse_i.
    """
    tiles = Tiles(flash_swapped.FORWARD_TENSORS)
    accesses = flash_swapped.block_accesses(tiles, pb, tiling)

    def steps(b: int):
        q, kv, run, out = accesses(b)
        j0, n = run.start, len(run)
        if n <= 1:
            return iter((q + (kv[j0] if n else ()) + out,))
        # step r fetches K_(r+1), V_(r+1), the head's shared steps; the last computes on K_(n−1), V_(n−1), fetched
        # the step before, and writes O_i, lse_i
        return SharedSteps((q + kv[j0] + kv[j0 + 1],), kv, j0 + 2, j0 + n, (out,))

    return Grid(pb.shape.bh * -(-pb.shape.n_q // tiling.Br), steps, tiles, per_sm)


def backward_order(pb: Problem, tiling: Tiling):
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


def backward(pb: Problem, tiling: Tiling, per_sm: int | SharedMemoryBound) -> Grid:
    """flash-swapped-tc's 16-bit main backward kernel: flash-swapped's blocks (bh·T_c + j, key block fastest) at
    its tile, 64 keys by queries_per_step(d) queries, each visiting its query blocks in ``backward_order``."""
    return flash_swapped.key_block_grid(pb, tiling, backward_order(pb, tiling), per_sm)
