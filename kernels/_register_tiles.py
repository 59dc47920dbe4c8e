"""Register-blocked tile products for flash-swapped, specialised at compile time to one layout.

Every loop bound here is a Python constant frozen into the kernel (one compiled kernel per
head dim and tiling), so the compiler unrolls the d and tile loops, shared-memory
addresses become immediate offsets, and nothing in a loop divides. Shared tiles are read
four floats at a time from 16-byte aligned addresses, which ptxas turns into 128-bit
loads (LDS.128).

Thread layout. A tile of R rows × C columns is covered by TR·TC threads, TR = R/TM,
TC = C/TN; thread tid = ty·TC + tx owns
  - the TM contiguous tile rows r0 = ty·TM, …, r0 + TM − 1,
  - the TN score columns tx, tx + TC, …, tx + (TN−1)·TC (strided: a warp's lanes read
    consecutive shared rows),
  - the accumulator columns 4·(tx + TC·g) + u, u < 4, g < G, of each d-wide row: four
    consecutive floats per group, so one LDS.128 feeds 4·TM FMAs, and the 8 lanes of a
    128-bit load phase read 8 consecutive 16-byte words (no bank conflict).
The TC threads of a row are TC consecutive lanes of one warp (TC divides 32), so row
maxima and sums combine with warp shuffles; Numba's CUDA simulator has no shuffles, and
there the same reduction goes through a small shared array instead.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import cuda, float32

from iosim.kernels import _device as dev

VEC = 4  # floats per 128-bit shared-memory load (LDS.128)
SHARED_ALIGN = 16  # bytes: shared tiles start where a 128-bit load may read
COPY_LANES = 16  # threads copying one tile row together: 64 contiguous bytes per row (32 lanes per row spill at d = 64)
INLINE = dev.inline_options()
FULL_WARP = np.uint32(0xFFFFFFFF)  # every lane takes part in the shuffles: row reductions run warp-uniform
ZERO = dev.ZERO
NEG_INF = dev.NEG_INF


def padded_width(n: int) -> int:
    """Smallest shared row width ≥ n that is 4·odd floats.

    A multiple of 4 keeps every row 16-byte aligned (128-bit loads); 4·odd makes 8
    consecutive rows start in 8 different 4-bank groups, so the 8 lanes of a 128-bit load
    phase reading 8 different rows hit no bank twice.
    """
    w = VEC * -(-n // VEC)
    return w if (w // VEC) % 2 else w + VEC


@dataclass(frozen=True)
class Layout:
    """Compile-time shape of a flash-swapped thread block: its tile, head dim and micro-tiles."""

    rows: int  # tile rows: B_r forward (queries), B_c backward (keys)
    cols: int  # tile columns: B_c forward (keys), B_r backward (queries)
    d: int
    TM: int  # tile rows per thread
    TN: int  # tile columns per thread

    @property
    def TC(self) -> int:
        """Threads sharing one tile row."""
        return self.cols // self.TN

    @property
    def TR(self) -> int:
        return self.rows // self.TM

    @property
    def threads(self) -> int:
        return self.TR * self.TC

    @property
    def G(self) -> int:
        """4-wide accumulator column groups per thread: ⌈d / (4·TC)⌉."""
        return -(-self.d // (VEC * self.TC))

    @property
    def KC(self) -> int:
        """4-wide chunks of a d-long inner product: ⌈d / 4⌉."""
        return -(-self.d // VEC)

    @property
    def W(self) -> int:
        """Row width of the d-wide shared tiles, covering every column an accumulator group reads."""
        return padded_width(max(VEC * self.TC * self.G, VEC * self.KC))

    @property
    def PW(self) -> int:
        """Row width of the score-sized shared tiles (P̃, Pᵀ, dSᵀ)."""
        return padded_width(self.cols)

    @property
    def copy_lanes(self) -> int:
        return math.gcd(self.threads, COPY_LANES)

    def problems(self) -> list[str]:
        """What keeps this layout from running, as messages naming the config field."""
        out = []
        if self.cols % VEC:
            out.append(f"the tile's {self.cols} columns must be a multiple of {VEC} (128-bit loads of P)")
        tc = self.TC
        if tc > 32 or tc & (tc - 1):
            out.append(f"TC = {self.cols}/config.TN = {tc} threads per row must be a power of two <= 32 "
                       "(a row's threads reduce with warp shuffles)")
        return out


class Tiles(NamedTuple):
    """The device functions of one layout."""

    load_row_tile: object  # (rows, W) tiles: Q_i forward, K_j and V_j backward
    load_col_tile: object  # (cols, W) tiles: K_j and V_j forward, Q_i and dO_i backward
    zero_padding: object
    store_acc: object  # dst = scale · acc, dst in the input dtype
    add_acc: object  # dst += scale · acc atomically, dst float32; apart, so no atomic is typed for a float16 dst
    load_vector: object
    rows_dot_rows: object
    rows_dot_cols: object
    cols_dot_cols: object
    row_max: object
    row_sum: object


def unrolled(step, starts):
    """A device function f(*args) that runs step(start, *args) for each start, in order.

    Each start is a compile-time constant of its own call, so after inlining every shared
    address in the products is a base register plus an immediate: this is the loop
    unrolling that LLVM declines for bodies of this size.
    """

    @cuda.jit(device=True, **INLINE)
    def nothing(*args):
        return None

    f = nothing
    for start in starts:
        f = _then(f, step, start)
    return f


def _then(before, step, start):
    @cuda.jit(device=True, **INLINE)
    def f(*args):
        before(*args)
        step(start, *args)

    return f


@cuda.jit(device=True, **INLINE)
def assign(dst, i, x):
    dst[i] = x


@cuda.jit(device=True, **INLINE)
def atomic_add(dst, i, x):
    cuda.atomic.add(dst, i, x)


@functools.cache
def tiles(layout: Layout) -> Tiles:
    """Device functions specialised to `layout`; every loop bound below is a constant."""
    TM, TN, TC, G, KC = layout.TM, layout.TN, layout.TC, layout.G, layout.KC
    D, W = layout.d, layout.W
    LANES = layout.copy_lanes
    THREADS = layout.threads
    ROW_STEP = layout.threads // LANES  # tile rows copied per pass
    D_PASSES = -(-D // LANES)
    FULL_PASSES = D % LANES == 0  # every pass over a row's d columns is complete: no column test
    SIM = dev.simulator_enabled()

    @cuda.jit(device=True, **INLINE)
    def load_tile_row(t, dst, src, first, n_valid, scale, cr, cc):
        """Copy pass t of load: tile row cr + ROW_STEP·t, columns cc, cc + LANES, … below d."""
        r = cr + ROW_STEP * t
        if r < dst.shape[0]:
            src_row = first + np.uint64(ROW_STEP * D * t)
            keep = r < n_valid
            for u in range(D_PASSES):
                c = cc + LANES * u
                if FULL_PASSES or c < D:
                    if keep:
                        dst[r, c] = np.float32(src[src_row + np.uint64(LANES * u)]) * scale
                    else:
                        dst[r, c] = ZERO

    def tile_loader(R):
        ROW_PASSES = -(-R // ROW_STEP)

        @cuda.jit(device=True, **INLINE)
        def load(dst, src, row_start, n_valid, scale, cr, cc):
            """dst[r, c] = scale · src[(row_start + r)·d + c] as float32 for c < d; rows ≥ n_valid get 0.

            dst is an (R, W) shared tile, src a flat (…·N·d) array and row_start the flat row
            of tile row 0. Thread (cr, cc) of the copy grid copies rows cr, cr + ROW_STEP, …
            and columns cc, cc + LANES, …: consecutive threads read consecutive elements, and
            the global index is unsigned (no negative-index fix-up) and a row base plus a
            constant. Columns d … W − 1 are left alone (zero_padding clears them once). The
            ROW_PASSES loop is left to LLVM: unrolling it by hand puts every pass's loads
            in flight at once and spills at d = 64.
            """
            first = np.uint64((row_start + cr) * D + cc)
            for t in range(ROW_PASSES):
                load_tile_row(t, dst, src, first, n_valid, scale, cr, cc)

        return load

    @cuda.jit(device=True)
    def zero_padding(dst, cr, cc):
        """dst[r, c] = 0 for the padding columns d ≤ c < W of an (R, W) shared tile."""
        for r in range(cr, dst.shape[0], ROW_STEP):
            for c in range(D + cc, W, LANES):
                dst[r, c] = ZERO

    def acc_writer(put):
        @cuda.jit(device=True)
        def write(dst, acc, row_start, n_valid, scale, r0, tx):
            """put(dst, (row_start + r0 + a)·d + e, scale · acc[a, 4g + w]), e = 4(tx + TC·g) + w.

            Writes a thread's (TM, 4·G) accumulator slice to a flat HBM array, for tile rows
            below n_valid and columns below d.
            """
            for a in range(TM):
                if r0 + a < n_valid:
                    base = (row_start + r0 + a) * D
                    for g in range(G):
                        for w in range(VEC):
                            e = VEC * (tx + TC * g) + w
                            if e < D:
                                put(dst, base + e, scale * acc[a, VEC * g + w])

        return write

    @cuda.jit(device=True)
    def load_vector(dst, src, start, n_valid, scale, fill):
        """dst[r] = scale · src[start + r] as float32 for r < n_valid, else `fill` (one pass per THREADS entries)."""
        for t in range(-(-dst.shape[0] // THREADS)):
            r = cuda.threadIdx.x + THREADS * t
            if r < dst.shape[0]:
                if r < n_valid:
                    dst[r] = np.float32(src[start + r]) * scale
                else:
                    dst[r] = fill

    @cuda.jit(device=True, **INLINE)
    def rows_dot_rows_slice(k, acc, A, r0, B, tx):
        """acc[a, b] += Σ_{k ≤ κ < k+4} A[r0 + a, κ] · B[tx + TC·b, κ]: TM + TN 128-bit loads, 4·TM·TN FMAs."""
        a4 = cuda.local.array((TM, VEC), float32)
        b4 = cuda.local.array((TN, VEC), float32)
        for a in range(TM):
            for u in range(VEC):
                a4[a, u] = A[r0 + a, k + u]
        for b in range(TN):
            for u in range(VEC):
                b4[b, u] = B[tx + TC * b, k + u]
        for u in range(VEC):
            for a in range(TM):
                for b in range(TN):
                    acc[a, b] += a4[a, u] * b4[b, u]

    @cuda.jit(device=True, **INLINE)
    def rows_dot_cols_slice(c, acc, A, r0, B, tx):
        """acc[a, 4g + w] += Σ_{c ≤ γ < c+4} A[r0 + a, γ] · B[γ, 4(tx + TC·g) + w]: TM + 4·G loads, 16·TM·G FMAs."""
        a4 = cuda.local.array((TM, VEC), float32)
        b4 = cuda.local.array(VEC, float32)
        for a in range(TM):
            for u in range(VEC):
                a4[a, u] = A[r0 + a, c + u]
        for u in range(VEC):
            for g in range(G):
                e = VEC * (tx + TC * g)
                for w in range(VEC):
                    b4[w] = B[c + u, e + w]
                for a in range(TM):
                    for w in range(VEC):
                        acc[a, VEC * g + w] += a4[a, u] * b4[w]

    @cuda.jit(device=True, **INLINE)
    def cols_dot_cols_slice(c, acc, A, r0, B, tx):
        """acc[a, 4g + w] += A[c, r0 + a] · B[c, 4(tx + TC·g) + w]: one c, TM contiguous floats of a row of A."""
        a1 = cuda.local.array(TM, float32)
        b4 = cuda.local.array(VEC, float32)
        for a in range(TM):
            a1[a] = A[c, r0 + a]
        for g in range(G):
            e = VEC * (tx + TC * g)
            for w in range(VEC):
                b4[w] = B[c, e + w]
            for a in range(TM):
                for w in range(VEC):
                    acc[a, VEC * g + w] += a1[a] * b4[w]

    # S = Q Kᵀ forward, Sᵀ = K Qᵀ and dPᵀ = V dOᵀ backward: acc[a, b] += Σ_k A[r0 + a, k] · B[tx + TC·b, k]
    rows_dot_rows = unrolled(rows_dot_rows_slice, range(0, VEC * KC, VEC))
    # O += P̃ V forward, dV += (P∘Z)ᵀ dO and dK += dSᵀ Q backward, A row-major in shared memory:
    # acc[a, 4g + w] += Σ_c A[r0 + a, c] · B[c, 4(tx + TC·g) + w]; columns ≥ d are padding
    # whose results the caller never stores
    rows_dot_cols = unrolled(rows_dot_cols_slice, range(0, layout.cols, VEC))
    # dQ += dS K with the tile holding dSᵀ (keys × queries): acc[a, 4g + w] += Σ_c A[c, r0 + a] · B[c, …]
    cols_dot_cols = unrolled(cols_dot_cols_slice, range(layout.rows))

    @cuda.jit(device=True)
    def row_max(vals, red, r0, tx):
        """vals[a] = max of vals[a] over the TC threads of tile row r0 + a (all threads call it)."""
        if SIM:
            reduce_shared(vals, red, r0, tx, True)
        else:
            for a in range(TM):
                x = vals[a]
                off = TC // 2
                while off > 0:
                    x = max(x, cuda.shfl_xor_sync(FULL_WARP, x, off))
                    off //= 2
                vals[a] = x

    @cuda.jit(device=True)
    def row_sum(vals, red, r0, tx):
        """vals[a] = Σ of vals[a] over the TC threads of tile row r0 + a (all threads call it)."""
        if SIM:
            reduce_shared(vals, red, r0, tx, False)
        else:
            for a in range(TM):
                x = vals[a]
                off = TC // 2
                while off > 0:
                    x += cuda.shfl_xor_sync(FULL_WARP, x, off)
                    off //= 2
                vals[a] = x

    @cuda.jit(device=True)
    def reduce_shared(vals, red, r0, tx, take_max):
        """The simulator's row reduction: through red (R, TC) in shared memory, two barriers."""
        for a in range(TM):
            red[r0 + a, tx] = vals[a]
        cuda.syncthreads()
        for a in range(TM):
            x = red[r0 + a, 0]
            for t in range(1, TC):
                x = max(x, red[r0 + a, t]) if take_max else x + red[r0 + a, t]
            vals[a] = x
        cuda.syncthreads()

    return Tiles(tile_loader(layout.rows), tile_loader(layout.cols), zero_padding, acc_writer(assign),
                 acc_writer(atomic_add), load_vector, rows_dot_rows, rows_dot_cols, cols_dot_cols, row_max, row_sum)
