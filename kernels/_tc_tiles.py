"""The tensor-core kernels' shared pieces: 16-bit tiles as words, their copy from HBM, fragment addresses.

flash-swapped-tc's forward and backward hold their shared tiles as 32-bit words of two
halves (float16, or bfloat16 bit patterns), rows of d padded to a multiple of 16 and to a
width of 4 mod 8 words (`row_words`). Rows then start 16 bytes apart modulo 128: every
row is 16-byte aligned, as ldmatrix needs, and the 8 rows of one 8 × 8 matrix that an
ldmatrix phase reads lie in 8 different groups of 4 banks.

A tile is copied from HBM in two halves, `fetch` (loads into registers) and `put`
(stores to shared memory), so that a kernel can issue the loads of its next tile before
computing on the current one. Thread (cr, cc) of the copy grid takes units cc,
cc + LANES, … of rows cr, cr + ROW_STEP, …, consecutive threads reading consecutive
units. With d a multiple of 4 a unit is two words, one 64-bit load at a row base plus a
constant (the host passes Q, K, V as uint64 views); otherwise it is one word, joined from
two halves.

ldmatrix.x4 reads four 8 × 8 matrices, lane 8i + r naming row r of matrix i. Two lane
patterns cover every operand of m16n8k16 (kernels/_mma.py), for a 16 × 16 region of a
row-major tile:
  - PAIR_OF_TILES: matrices (rows 0-7, words 0-3), (0-7, 4-7), (8-15, 0-3), (8-15, 4-7).
    Untransposed it gives the B fragments of two n8 tiles when the tile's rows are B's n
    (Kᵀ from K); transposed, the A fragment when the rows are A's k (dS from dSᵀ).
  - ONE_TILE: matrices (0-7, 0-3), (8-15, 0-3), (0-7, 4-7), (8-15, 4-7). Untransposed it
    gives the A fragment when the rows are A's m (Q, K, V as left operands); transposed,
    the B fragments of two n8 tiles when the rows are B's k (V in P̃V, dO in dV, Q in dK).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from numba import cuda, float32, int32, uint16, uint32, uint64

from iosim.kernels import _device as dev
from iosim.kernels import _mma as mma
from iosim.kernels._register_tiles import unrolled

TC_DTYPES = ("float16", "bfloat16")  # what the tensor cores take; bfloat16 travels as uint16 bits
WARPS = 4  # warps per block
THREADS = mma.WARP * WARPS
WORD_BYTES = 4  # shared tiles hold 32-bit words of two halves
COPY_LANES = 32  # at most this many threads copy one tile row together
LOW_HALF = uint32(0xFFFF)
LOW_WORD = np.uint64(0xFFFFFFFF)
PAIR_SHIFT = np.uint64(32)
FULL_WARP = np.uint32(0xFFFFFFFF)
ZERO = dev.ZERO
SIM = dev.simulator_enabled()
INLINE = dev.inline_options()
# the simulator's shared scratch: a warp's fragments for the MMA and ldmatrix twins, and quad reductions
SCRATCH = (THREADS, mma.SCRATCH_WORDS) if SIM else (1, 1)
RED = (THREADS, 2) if SIM else (1, 1)


def padded_head_dim(d: int) -> int:
    """d rounded up to the k16 of one MMA (the padding columns hold zeros)."""
    return mma.K * -(-d // mma.K)


def row_words(columns: int) -> int:
    """Shared row width in words of a tile with `columns` halves: padded to 16, plus 4 words (4 mod 8)."""
    return padded_head_dim(columns) // 2 + 4


def tile_bytes(rows: int, columns: int) -> int:
    return rows * row_words(columns) * WORD_BYTES


def paired_words(d: int) -> bool:
    """Whether Q, K, V (dO, O) reach a kernel as uint64 pairs of words (d a multiple of 4: a row is whole pairs)."""
    return d % 4 == 0


def words_view(x):
    """A flat device array of halves as the kernels take it: uint64 word pairs when d is a multiple of 4."""
    flat = x.reshape(x.size)
    return flat.view(np.uint64) if paired_words(tuple(x.shape)[-1]) else flat


class Place(NamedTuple):
    """A thread's places (thread_places) as one bundle for the kernels' step functions."""

    tid: object  # thread index in the block
    warp: object
    g: object  # the lane's group: fragment rows g and g + 8
    qd: object  # its place in the group: fragment columns 2·qd, 2·qd + 1
    cr: object  # its row in the tile-copy grid (unsigned)
    cc: object  # its column there


@cuda.jit(device=True, **INLINE)
def thread_places(tid, lanes):
    """(warp, lane, g, qd, cr, cc) of thread tid: its warp and lane; the lane's group g (fragment
    rows g and g + 8) and its place qd in the group (fragment columns 2·qd, 2·qd + 1); its place
    (cr, cc) in a copy grid `lanes` wide, unsigned so that tile indices need no wraparound."""
    warp = tid // mma.WARP
    lane = tid - warp * mma.WARP
    g = lane // 4
    cr = uint32(tid) // uint32(lanes)
    return warp, lane, g, lane - 4 * g, cr, uint32(tid) - cr * uint32(lanes)


@cuda.jit(device=True, **INLINE)
def pattern_pair_of_tiles(lane):
    """(row, word) that `lane` names to ldmatrix.x4 in the PAIR_OF_TILES pattern."""
    return lane % 8 + 8 * (lane // 16), 4 * (lane // 8 % 2)


@cuda.jit(device=True, **INLINE)
def pattern_one_tile(lane):
    """(row, word) that `lane` names to ldmatrix.x4 in the ONE_TILE pattern."""
    return lane % 8 + 8 * (lane // 8 % 2), 4 * (lane // 16)


class Halves(NamedTuple):
    """Device functions for one 16-bit type."""

    pack: object  # (float32, float32) -> word, each rounded
    mma: object  # mma.sync.m16n8k16 for the type
    store: object  # float32 -> what an output array of the type holds
    widen: object  # an element of an input array -> float32
    half: object  # (src, i) -> element i of an input array, as join takes it
    join: object  # (lo, hi) -> the word of two elements
    zero: object  # the element join takes for a padding half
    a_from_c: object  # (c, kc) -> the A fragment of k16 chunk kc from C fragments c[2kc], c[2kc + 1]
    mma_pair: object  # (acc, t, a0…a3, b0, b1, c0, c1, scratch): acc[t] += A·(b0, b1), acc[t + 1] += A·(c0, c1)


@functools.cache
def halves(dtype: str) -> Halves:
    if dtype not in TC_DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of {TC_DTYPES}")
    bf16 = dtype == "bfloat16"
    pack = mma.pack_bfloat162 if bf16 else mma.pack_half2

    if bf16:
        HALF_ZERO = uint16(0)

        @cuda.jit(device=True, **INLINE)
        def half(src, i):
            return src[i]

        join = mma.join_halves  # bfloat16 bits join as they are

        @cuda.jit(device=True, **INLINE)
        def store(x):
            """An output element as bfloat16 bits, rounded to nearest even (the low half of the packed word)."""
            return uint16(pack(x, ZERO) & LOW_HALF)

        @cuda.jit(device=True, **INLINE)
        def widen(x):
            """A bfloat16 element's value: its bits are the top half of the float32's."""
            return mma.float_from_bits(uint32(x) << uint32(16))
    else:
        HALF_ZERO = ZERO

        @cuda.jit(device=True, **INLINE)
        def half(src, i):
            return float32(src[i])

        join = pack  # float16 values are exact in float32 and pack back unchanged

        @cuda.jit(device=True, **INLINE)
        def store(x):
            """An output element; the float16 array's store rounds it."""
            return x

        @cuda.jit(device=True, **INLINE)
        def widen(x):
            return float32(x)

    mma_16816 = mma.mma_16816_bf16 if bf16 else mma.mma_16816

    @cuda.jit(device=True, **INLINE)
    def a_from_c(c, kc):
        """The A fragment of k16 chunk kc, rounded to the type, from the float32 C fragments of n8 tiles 2kc, 2kc + 1.

        A C fragment's values 0, 1 (row g) and 2, 3 (row g + 8) at columns 2·quad, 2·quad + 1
        are where A words 0 and 1 want them for the chunk's first 8 columns, and tile
        2kc + 1's for words 2 and 3: a product's output feeds the next one in registers.
        """
        return (pack(c[2 * kc, 0], c[2 * kc, 1]), pack(c[2 * kc, 2], c[2 * kc, 3]),
                pack(c[2 * kc + 1, 0], c[2 * kc + 1, 1]), pack(c[2 * kc + 1, 2], c[2 * kc + 1, 3]))

    @cuda.jit(device=True, **INLINE)
    def mma_pair(acc, t, a0, a1, a2, a3, b0, b1, c0, c1, scratch):
        """acc[t] += A·B with B = (b0, b1) and acc[t + 1] += A·B with B = (c0, c1): the two n8 tiles
        of one ldmatrix.x4."""
        acc[t, 0], acc[t, 1], acc[t, 2], acc[t, 3] = mma_16816(
            a0, a1, a2, a3, b0, b1, acc[t, 0], acc[t, 1], acc[t, 2], acc[t, 3], scratch)
        acc[t + 1, 0], acc[t + 1, 1], acc[t + 1, 2], acc[t + 1, 3] = mma_16816(
            a0, a1, a2, a3, c0, c1, acc[t + 1, 0], acc[t + 1, 1], acc[t + 1, 2], acc[t + 1, 3], scratch)

    return Halves(pack, mma_16816, store, widen, half, join, HALF_ZERO, a_from_c, mma_pair)


@functools.cache
def word_reader(d: int, dtype: str):
    """word(src, row, w, n_valid_rows): word w (halves 2w, 2w + 1) of row `row` of a flat q/k/v array of
    head dim d as the kernels take it (words_view), 0 past d or past n_valid_rows."""
    h = halves(dtype)
    half, join, HALF_ZERO = h.half, h.join, h.zero
    PAIRS = paired_words(d)
    HP = d // 4  # word pairs of a row in HBM (d a multiple of 4)

    @cuda.jit(device=True, **INLINE)
    def word(src, row, w, n_valid_rows):
        if row >= n_valid_rows:
            return uint32(0)
        if PAIRS:
            if w < 2 * HP:
                pair = src[np.uint64(row) * np.uint64(HP) + np.uint64(w // 2)]
                return uint32(pair >> PAIR_SHIFT) if w % 2 else uint32(pair & LOW_WORD)
            return uint32(0)
        base = np.uint64(row) * np.uint64(d) + np.uint64(2 * w)
        lo = half(src, base) if 2 * w < d else HALF_ZERO
        hi = half(src, base + np.uint64(1)) if 2 * w + 1 < d else HALF_ZERO
        return join(lo, hi)

    return word


def copy_lanes(d: int) -> int:
    """Threads copying one row of a d-wide tile: a power of two up to COPY_LANES and the row's units."""
    units = padded_head_dim(d) // (4 if paired_words(d) else 2)
    return min(COPY_LANES, 1 << (units.bit_length() - 1))


class TileCopy(NamedTuple):
    fetch: object  # (buf, src, row_start, n_valid, cr, cc): rows row_start … of src into registers
    put: object  # (dst, buf, cr, cc): those registers into a shared tile
    buffered: int  # units a thread holds between fetch and put
    unit: object  # their numba type


@functools.cache
def tile_copy(d: int, dtype: str, rows: int) -> TileCopy:
    """fetch and put for a (rows, row_words(d)) shared tile of a flat (…, d) array; see the module docstring."""
    word = word_reader(d, dtype)
    PAIRS = paired_words(d)
    DW = padded_head_dim(d) // 2  # words of a padded row
    HP = d // 4
    UNIT = 2 if PAIRS else 1  # words a thread copies at a time
    UNITS = DW // UNIT  # of a padded row
    LANES = copy_lanes(d)
    ROW_STEP = THREADS // LANES  # rows per copy pass
    UNIT_PASSES = -(-UNITS // LANES)
    ROW_PASSES = -(-rows // ROW_STEP)
    WHOLE_ROW_PASSES = rows % ROW_STEP == 0  # every pass's row lies in the tile: no row test
    WHOLE_PASSES = UNITS % LANES == 0  # every copy pass lies within the padded row: no column test
    WHOLE_UNITS = WHOLE_PASSES and HP * 2 == DW  # and d is a multiple of 16: every unit read is one of d's

    @cuda.jit(device=True, **INLINE)
    def fetch_row(t, buf, src, row_start, n_valid, first, left, cr, cc):
        """Fetch pass t: units cc, cc + LANES, … of tile row cr + ROW_STEP·t into buf (left = n_valid − cr)."""
        keep = int32(ROW_STEP * t) < left
        for u in range(UNIT_PASSES):
            c = cc + LANES * u
            if not PAIRS:
                buf[UNIT_PASSES * t + u] = word(src, row_start + cr + ROW_STEP * t, c, row_start + n_valid)
            elif keep and (WHOLE_UNITS or c < HP):
                buf[UNIT_PASSES * t + u] = src[first + np.uint64(ROW_STEP * HP * t + LANES * u)]
            else:
                buf[UNIT_PASSES * t + u] = np.uint64(0)

    @cuda.jit(device=True, **INLINE)
    def put_row(t, dst, buf, cr, cc):
        """Put pass t: buf's units to tile row cr + ROW_STEP·t of dst."""
        r = cr + ROW_STEP * t
        if WHOLE_ROW_PASSES or r < rows:
            for u in range(UNIT_PASSES):
                c = cc + LANES * u
                if WHOLE_PASSES or c < UNITS:
                    x = buf[UNIT_PASSES * t + u]
                    if PAIRS:
                        dst[r, 2 * c] = uint32(x & LOW_WORD)
                        dst[r, 2 * c + 1] = uint32(x >> PAIR_SHIFT)
                    else:
                        dst[r, c] = x

    fetch_rows = unrolled(fetch_row, range(ROW_PASSES))
    put = unrolled(put_row, range(ROW_PASSES))

    @cuda.jit(device=True, **INLINE)
    def fetch(buf, src, row_start, n_valid, cr, cc):
        """This thread's part of rows row_start … row_start + rows − 1 of src, to registers (0 past d and
        past n_valid rows)."""
        first = np.uint64(row_start + cr) * np.uint64(HP) + np.uint64(cc)
        left = int32(min(max(n_valid, 0), rows)) - int32(cr)  # a 32-bit row test per pass, nothing kept across steps
        fetch_rows(buf, src, row_start, n_valid, first, left, cr, cc)

    return TileCopy(fetch, put, ROW_PASSES * UNIT_PASSES, uint64 if PAIRS else uint32)


@cuda.jit(device=True, **INLINE)
def quad_max(x, red, tid, slot):
    """The max of x over the 4 lanes of this lane's quad (the lanes sharing its fragment rows)."""
    if SIM:
        return quad_reduce(x, red, tid, slot, True)
    x = max(x, cuda.shfl_xor_sync(FULL_WARP, x, 1))
    return max(x, cuda.shfl_xor_sync(FULL_WARP, x, 2))


@cuda.jit(device=True, **INLINE)
def quad_sum(x, red, tid, slot):
    """The sum of x over the 4 lanes of this lane's quad."""
    if SIM:
        return quad_reduce(x, red, tid, slot, False)
    x += cuda.shfl_xor_sync(FULL_WARP, x, 1)
    return x + cuda.shfl_xor_sync(FULL_WARP, x, 2)


@cuda.jit(device=True)
def quad_reduce(x, red, tid, slot, take_max):
    """The simulator's quad reduction, through red (THREADS, 2) in shared memory between barriers."""
    red[tid, slot] = x
    cuda.syncthreads()
    first = tid - tid % 4
    y = red[first, slot]
    for lane in range(1, 4):
        y = max(y, red[first + lane, slot]) if take_max else y + red[first + lane, slot]
    cuda.syncthreads()
    return y
