"""Device functions shared by the kernels: Philox dropout, visibility, the online softmax's scalars, launches.

Everything here runs both compiled for a GPU and under Numba's CUDA simulator: no warp
shuffles, no inline PTX, and the generator uses only unsigned 64-bit integer arithmetic.
The tiles and micro-tile products of flash alone live in kernels/_flash_tiles.py, those of
flash-swapped in kernels/_register_tiles.py, those of flash-swapped-tc in kernels/_tc_tiles.py.
"""

from __future__ import annotations

import math
import sys
import threading
from typing import NamedTuple

import numpy as np
from numba import config as numba_config
from numba import cuda, float32

from iosim.core.rng import MASK32, PHILOX_M0, PHILOX_M1, PHILOX_ROUNDS, PHILOX_W0, PHILOX_W1

# Module-level numpy scalars are frozen into the kernels as typed constants. Mixing a
# uint64 with a Python int would make Numba promote to float64, so every integer the
# generator touches is a uint64.
_M0 = np.uint64(PHILOX_M0)
_M1 = np.uint64(PHILOX_M1)
_W0 = np.uint64(PHILOX_W0)
_W1 = np.uint64(PHILOX_W1)
_MASK32 = np.uint64(MASK32)
_SHIFT32 = np.uint64(32)
_U0 = np.uint64(0)

NEG_INF = np.float32(-np.inf)
ZERO = np.float32(0.0)
ONE = np.float32(1.0)


class DropoutArgs(NamedTuple):
    """A kernel's four dropout arguments (kernels.config.Dropout.kernel_args()) as one bundle for device functions."""

    seed_lo: object  # uint64 holding the seed's low 32 bits: Philox key word 0
    seed_hi: object  # uint64 holding its high 32 bits: key word 1
    threshold: object  # uint64: an element is kept iff its Philox word >= threshold
    inv_keep: object  # float32 1/(1 − p), the scale of a kept element


@cuda.jit(device=True)
def philox_word(seed_lo, seed_hi, bh, row, col):
    """First output word of Philox4x32-10 at counter (col, row, bh, 0), key (seed_lo, seed_hi).

    The device twin of ``iosim.core.rng.philox_word``: same rounds, same word order, so the
    two agree bit for bit. seed_lo, seed_hi are uint64 holding 32-bit values.
    """
    c0 = np.uint64(col)
    c1 = np.uint64(row)
    c2 = np.uint64(bh)
    c3 = _U0
    k0 = seed_lo
    k1 = seed_hi
    for _ in range(PHILOX_ROUNDS):
        p0 = _M0 * c0  # < 2^64: both factors are below 2^32
        p1 = _M1 * c2
        hi0 = p0 >> _SHIFT32
        lo0 = p0 & _MASK32
        hi1 = p1 >> _SHIFT32
        lo1 = p1 & _MASK32
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + _W0) & _MASK32
        k1 = (k1 + _W1) & _MASK32
    return c0


@cuda.jit(device=True)
def dropout_scale(seed_lo, seed_hi, threshold, inv_keep, bh, row, col):
    """Z_ij of Alg. 4 line 14 for one element: 1/(1-p) when kept (word >= threshold), else 0."""
    if philox_word(seed_lo, seed_hi, bh, row, col) >= threshold:
        return inv_keep
    return ZERO


@cuda.jit(device=True)
def visible(row, col, n_q, n_k, causal):
    """True when query `row` attends to key `col`: both in range and, if causal, col <= row + N_k − N_q."""
    if row >= n_q or col >= n_k:
        return False
    if causal:
        return col <= row + (n_k - n_q)
    return True


@cuda.jit(device=True)
def zero_tile(acc):
    """acc[:, :] = 0 for a thread's (rows, cols) register tile."""
    for a in range(acc.shape[0]):
        for b in range(acc.shape[1]):
            acc[a, b] = ZERO


@cuda.jit(device=True)
def safe_max(m):
    """The row maximum to subtract in exp(S − m): 0 when the row has seen no key yet (m = −inf)."""
    if m == NEG_INF:
        return ZERO
    return m


@cuda.jit(device=True)
def log_sum_exp(m, l):
    """lse = m + log ℓ, or −inf for a row that saw no key (ℓ = 0)."""
    if l > ZERO:
        return m + math.log(l)
    return NEG_INF


@cuda.jit(device=True)
def rescale(m_old, m_new):
    """e^{m_old − m_new}, with e^{−inf − m} = 0 also when m_new is −inf (a row with no key yet)."""
    if m_old == NEG_INF:
        return ZERO
    return math.exp(m_old - m_new)


# ----------------------------------------------------------------------------------
# Small grid-stride kernels shared by several implementations. Their results do not
# depend on the launch shape, which `grid_stride_launch` picks.
# ----------------------------------------------------------------------------------

GRID_STRIDE_THREADS = 256
GRID_STRIDE_MAX_BLOCKS = 8192


def simulator_enabled() -> bool:
    """True under Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1)."""
    return bool(numba_config.ENABLE_CUDASIM)


def _lock_simulator_shared_arrays() -> None:
    """Make the simulator's cuda.shared.array hand every thread of a block the same array.

    Numba's simulator (numba-cuda 0.30.4) finds a block's shared array by the calling
    (file, line) in FakeCUDAShared.array with an unlocked get-then-set: two threads that
    reach the line first, together, both miss, each allocate, and one keeps a private
    array that no other thread reads or writes. Its loads never reach the block, and it
    computes from its own uninitialised copy (np.empty): wrong scores, exp overflow. A
    GPU has no such race. This is that method with the lookup and insertion under a lock,
    keyed as the simulator keys it; dynamic shared memory (shape 0) is left to the
    original, which has no per-line lookup. The simulator takes no `alignment`; numpy's
    allocations already meet the 16 bytes the kernels ask for. Proof and details: docs/kernels.md.
    """
    from numba.cuda import types
    from numba.cuda.np import numpy_support
    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    original = FakeCUDAShared.array
    if getattr(original, "locked_by_kernels", False):
        return
    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        # numpy allocations are at least 16-byte aligned, which is all the kernels ask for
        if shape == 0:
            return original(self, shape, dtype)
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)  # the simulator's key
        with lock:
            res = self._allocations.get(key)
            if res is None:
                res = np.empty(shape, dtype)
                self._allocations[key] = res
        return res

    array.locked_by_kernels = True
    FakeCUDAShared.array = array


if simulator_enabled():
    _lock_simulator_shared_arrays()


def launch_bounds(threads: int, min_blocks: int) -> dict:
    """cuda.jit options asking the compiler to fit `min_blocks` blocks of `threads` on an SM.

    That caps registers per thread at 65536 / (threads · min_blocks). The simulator has no
    launch bounds, so there the options are empty (same results, no register cap).
    """
    return {} if simulator_enabled() else {"launch_bounds": (threads, min_blocks)}


def inline_options() -> dict:
    """cuda.jit options forcing a device function inline at the NVVM IR level; none under the simulator."""
    return {} if simulator_enabled() else {"forceinline": True}


def grid_stride_launch(n_items: int) -> tuple[int, int]:
    """(blocks, threads) for a grid-stride kernel over n_items.

    The simulator runs every GPU thread as a Python thread and pays mostly per thread
    started, so there one small block does all the work; on a GPU the grid covers the items.
    """
    if simulator_enabled():
        return 1, 32
    return max(1, min(GRID_STRIDE_MAX_BLOCKS, -(-n_items // GRID_STRIDE_THREADS))), GRID_STRIDE_THREADS


@cuda.jit(device=True)
def to_float32(x):
    return np.float32(x)


@cuda.jit(device=True)
def as_is(x):
    return x


WARP = 32
ROW_DOT_WARPS = GRID_STRIDE_THREADS // WARP  # warps of a row_dot block on a GPU (one under the simulator)
ROW_DOT_MIN_BLOCKS = 3  # a streaming kernel: room for 3 blocks of 256 threads per SM (at most 85 registers, no spills)
PADDED_WARP = WARP + 1  # a row of row_dot's partial sums, padded: lane l reads row l's 32 without bank conflicts


def row_dot_kernel_for(widen):
    """The row_dot kernel for inputs whose elements widen(x) turns into float32."""

    @cuda.jit(**launch_bounds(GRID_STRIDE_THREADS, ROW_DOT_MIN_BLOCKS))
    def row_dot(do, o, big_d):
        """D_i = rowsum(dO_i ∘ O_i) (Alg. 4 line 19) for every row: (bh, N_q, d) x2 -> (bh, N_q).

        Grid-stride over chunks of GRID_STRIDE_THREADS consecutive rows, chunk c to block c mod gridDim, as the
        one-thread-per-row kernel before it (the chunks iosim's row_dot grid declares). Each warp takes 32 rows
        of a chunk at a time and reads them one after another, lane l their elements l, l + 32, ...: every
        load of a warp is 32 consecutive elements of one row, whole sectors, where one thread per row read one
        word of 32 rows (call 1 measured 2.5 to 3.5 × dO and O read from DRAM that way). Lane l's partial sums
        of the 32 rows go to shared memory, and lane l then adds up row l's.
        """
        partial = cuda.shared.array((ROW_DOT_WARPS, WARP, PADDED_WARP), float32)  # [warp, row, lane]
        n_q, d = o.shape[1], o.shape[2]
        rows = o.shape[0] * n_q
        warps = cuda.blockDim.x // WARP
        warp = cuda.threadIdx.x // WARP
        lane = cuda.threadIdx.x - warp * WARP
        for chunk in range(cuda.blockIdx.x, (rows + GRID_STRIDE_THREADS - 1) // GRID_STRIDE_THREADS,
                           cuda.gridDim.x):
            first = chunk * GRID_STRIDE_THREADS
            for r0 in range(first, min(rows, first + GRID_STRIDE_THREADS), warps * WARP):
                slab = r0 + warp * WARP  # this warp's 32 rows
                for j in range(WARP):
                    row = slab + j
                    acc = ZERO
                    if row < rows:
                        bh = row // n_q
                        i = row - bh * n_q
                        for e in range(lane, d, WARP):
                            acc += widen(do[bh, i, e]) * widen(o[bh, i, e])
                    partial[warp, j, lane] = acc
                cuda.syncthreads()
                row = slab + lane
                if row < rows:
                    total = ZERO
                    for k in range(WARP):
                        total += partial[warp, lane, k]
                    bh = row // n_q
                    big_d[bh, row - bh * n_q] = total
                cuda.syncthreads()  # the partials are read before the next rows overwrite them

    return row_dot


row_dot_kernel = row_dot_kernel_for(to_float32)


@cuda.jit
def fill_kernel(x, value):
    """x[...] = value for a (bh, N, d) array."""
    n, d = x.shape[1], x.shape[2]
    start = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    for idx in range(start, x.shape[0] * n * d, cuda.gridDim.x * cuda.blockDim.x):
        bh = idx // (n * d)
        rest = idx - bh * n * d
        i = rest // d
        x[bh, i, rest - i * d] = value


def convert_kernel_for(convert):
    """The cast kernel with convert(x) between reading src and storing into dst's dtype."""

    @cuda.jit
    def cast(src, dst):
        """dst[...] = src[...] converted to dst's dtype, for (bh, N, d) arrays."""
        n, d = src.shape[1], src.shape[2]
        start = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        for idx in range(start, src.shape[0] * n * d, cuda.gridDim.x * cuda.blockDim.x):
            bh = idx // (n * d)
            rest = idx - bh * n * d
            i = rest // d
            dst[bh, i, rest - i * d] = convert(src[bh, i, rest - i * d])

    return cast


cast_kernel = convert_kernel_for(as_is)
