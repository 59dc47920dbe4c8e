"""The grids of kernels/_device.py's grid-stride kernels, which flash-swapped's and flash-swapped-tc's backward
launch around their main kernel: row_dot (D = rowsum(dO ∘ O)), fill (dQ's float32 accumulator set to zero) and
cast (the accumulator to dQ in the problem's dtype).

Their tiles share one key space with the backward's main kernel (``TILES``), so that a pass's kernels count
each tensor under one name (``iosim.gpu.l2.in_sequence``).
"""

from __future__ import annotations

from iosim.core.problem import Problem
from iosim.gpu.l2 import READ, WRITE, Grid, SharedMemoryBound, Tiles

# dQ: the float32 accumulator dq_acc; dQ_cast: dQ in the problem's dtype, which cast_kernel writes from it
BACKWARD_TENSORS = ("Q", "K", "V", "O", "dO", "lse", "D", "dQ", "dK", "dV", "dQ_cast")
TILES = Tiles(BACKWARD_TENSORS)
GRID_STRIDE_THREADS, GRID_STRIDE_MAX_BLOCKS = 256, 8192  # kernels/_device.py's grid_stride_launch


def _grid_stride(items: int, chunk_steps, per_sm: int | SharedMemoryBound) -> Grid:
    """A grid-stride kernel over ``items``: min(8192, ⌈items/256⌉) blocks of 256 threads; block b takes chunks
    b, b + G, b + 2G, ... of 256 consecutive items, one step each (``chunk_steps(c, n)`` for chunk c of n items).
    Uniform (every block the same steps on chunks of its own) when the chunks are whole and G divides them."""
    G = max(1, min(GRID_STRIDE_MAX_BLOCKS, -(-items // GRID_STRIDE_THREADS)))
    chunks = -(-items // GRID_STRIDE_THREADS)

    def steps(b: int):
        for c in range(b, chunks, G):
            first = c * GRID_STRIDE_THREADS
            yield chunk_steps(c, min(GRID_STRIDE_THREADS, items - first))

    uniform = items % GRID_STRIDE_THREADS == 0 and chunks % G == 0
    return Grid(G, steps, TILES, per_sm, uniform=uniform)


def row_dot(pb: Problem, per_sm: int | SharedMemoryBound) -> Grid:
    """row_dot_kernel: D_i = rowsum(dO_i ∘ O_i) over the query rows of every batch·head (rows flattened), in chunks
    of 256 rows; the DRAM level sees a chunk's dO, O and D whatever the lanes' order within it."""
    s, data, stat = pb.shape, pb.itemsize("data"), 4  # D is float32 whatever the dtype
    return _grid_stride(s.bh * s.n_q, lambda c, n: (
        TILES.access("dO", c, n * s.d * data, READ), TILES.access("O", c, n * s.d * data, READ),
        TILES.access("D", c, n * stat, WRITE)), per_sm)


def cast(pb: Problem, per_sm: int | SharedMemoryBound) -> Grid:
    """cast_kernel: one thread per element of dq_acc, read in float32 and written to dQ in the problem's dtype."""
    s, data = pb.shape, pb.itemsize("data")
    return _grid_stride(s.bh * s.n_q * s.d, lambda c, n: (TILES.access("dQ", c, n * 4, READ),
                                                          TILES.access("dQ_cast", c, n * data, WRITE)),
                        per_sm)


def fill(pb: Problem, per_sm: int | SharedMemoryBound) -> Grid:
    """fill_kernel: one thread per element of the float32 dq_acc (bh, N_q, d), each set to zero."""
    s = pb.shape
    return _grid_stride(s.bh * s.n_q * s.d, lambda c, n: (TILES.access("dQ", c, n * 4, WRITE),), per_sm)


def around(pb: Problem, main: Grid, row_dot_per_sm: int | SharedMemoryBound, fill_per_sm: int | SharedMemoryBound,
           cast_per_sm: int | SharedMemoryBound) -> tuple[Grid, ...]:
    """A flash-swapped backward's launches in order: row_dot, fill, its ``main`` kernel, and in a dtype narrower than
    float32 the cast of dQ (kernels/flash_swapped.py's and kernels/flash_swapped_tc.py's ``backward``)."""
    grids = (row_dot(pb, row_dot_per_sm), fill(pb, fill_per_sm), main)
    return grids if pb.dtype == "float32" else grids + (cast(pb, cast_per_sm),)
