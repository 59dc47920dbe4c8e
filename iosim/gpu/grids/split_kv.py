"""The grids of kernels/split_kv.py, Flash-Decoding's two kernels as flash-attn launches them: the split kernel on
the problem packed by GQA group (``iosim.algorithms.split_kv``), and the combine that merges its partials.
"""

from __future__ import annotations

from iosim.algorithms import split_kv
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling, ceil_div
from iosim.gpu.grids.flash_swapped import kv_step_cache
from iosim.gpu.l2 import READ, WRITE, Grid, SharedMemoryBound, Tiles

# The kernels write lse = m + log ℓ instead of ℓ and m, as flash_fwd_splitkv_kernel and its combine do, and keep
# the partials O_split, lse_split in float32 whatever the dtype (flash-attn's oaccum and softmax_lseaccum).
GRID_TENSORS = ("Q", "K", "V", "O_split", "lse_split", "O", "lse")
TILES = Tiles(GRID_TENSORS)
PARTIAL_ITEMSIZE = 4


def split(pb: Problem, tiling: Tiling, per_sm: int | SharedMemoryBound) -> Grid:
    """The split kernel on the packed problem: one thread block per (query block i, split s, K/V head), i fastest,
    then s: block (kvh·S + s)·T_r + i, as flash-attn's ``grid(num_m_block, num_splits, b·h)``. Block (i, s) loads
    Q_i, then K_j, V_j at each of its split's blocks, and writes its partial O_split, lse_split after the last, in
    float32 (O and lse themselves, O in the dtype, with one split)."""
    s, Br, S = pb.shape, tiling.Br, tiling.splits
    Tr = ceil_div(s.n_q, Br)
    data, stat = pb.itemsize("data"), pb.itemsize("stat")
    tiles = split_kv.visited(pb, tiling)
    kv_steps = kv_step_cache(TILES, pb, tiling)
    o, lse = ("O_split", "lse_split") if S > 1 else ("O", "lse")

    def steps(b: int):
        kvh_split, i = divmod(b, Tr)
        kvh, split = divmod(kvh_split, S)
        rows = min(Br, s.n_q - i * Br)
        run = split_kv.deal(tiles.key_run(i), S, split)
        kv = kv_steps(kvh)[run.start:run.stop]
        q = (TILES.access("Q", kvh * Tr + i, rows * s.d * data, READ),)
        out = (TILES.access(o, b, rows * s.d * (PARTIAL_ITEMSIZE if S > 1 else data), WRITE),
               TILES.access(lse, b, rows * stat, WRITE))
        # an empty split writes its empty partial (flash-attn exits before loading Q; kernels/split_kv.py, whose
        # split kernel is flash-swapped's forward, loads it)
        if not kv:
            yield q + out
            return
        yield q + kv[0] + (out if len(kv) == 1 else ())
        yield from kv[1:-1]
        if len(kv) > 1:
            yield kv[-1] + out

    # uniform with one query block and one split: the splits of a head share its Q_i, as query blocks share K_j
    return Grid(s.bh * S * Tr, steps, TILES, per_sm, uniform=Tr == 1 and S == 1)


def combine(pb: Problem, tiling: Tiling, per_sm: int | SharedMemoryBound) -> Grid:
    """The combine kernel: one thread block per (query block i, K/V head), i fastest; block i reads the S partials
    O_split, lse_split of its rows, one split a step, and writes O and lse after the last."""
    s, Br, S = pb.shape, tiling.Br, tiling.splits
    Tr = ceil_div(s.n_q, Br)
    data, stat = pb.itemsize("data"), pb.itemsize("stat")

    def steps(b: int):
        kvh, i = divmod(b, Tr)
        rows = min(Br, s.n_q - i * Br)
        parts = [(TILES.access("O_split", (kvh * S + split) * Tr + i, rows * s.d * PARTIAL_ITEMSIZE, READ),
                  TILES.access("lse_split", (kvh * S + split) * Tr + i, rows * stat, READ)) for split in range(S)]
        parts[-1] += (TILES.access("O", b, rows * s.d * data, WRITE), TILES.access("lse", b, rows * stat, WRITE))
        yield from parts

    return Grid(s.bh * Tr, steps, TILES, per_sm, uniform=s.n_q % Br == 0)


def split_smem(pb: Problem, tiling: Tiling) -> SharedMemoryBound:
    """The split kernel's occupancy as its tiles in shared memory allow (split-kv's working set, in the dtype)."""
    return SharedMemoryBound(split_kv.working_set(pb, tiling, 0) * pb.itemsize("data"))
