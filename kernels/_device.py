"""Device functions shared by every kernel: Philox dropout, visibility, tile loads, micro-tile products.

Everything here runs both compiled for a GPU and under Numba's CUDA simulator: no warp
shuffles, no inline PTX, and the generator uses only unsigned 64-bit integer arithmetic.

Thread layout used by the tiled kernels. A tile of R rows × C columns is covered by
(R/TM)·TC threads, TC = C/TN. Thread tid = ty·TC + tx owns
  - the TM contiguous rows r0 = ty·TM, ..., r0 + TM − 1,
  - the TN score columns tx, tx + TC, ..., tx + (TN−1)·TC (strided, so that the threads
    of a warp read consecutive shared-memory rows),
  - the FD = ceil(d/TC) accumulator columns tx, tx + TC, ... of a d-wide output row.
So a thread holds TM × FD accumulators, never a whole d-vector (issue 3, item 3), and
the TC threads sharing a row combine their partial row statistics through shared memory.
"""

from __future__ import annotations

import math
import sys
import threading

import numpy as np
from numba import config as numba_config
from numba import cuda

from iosim.rng import MASK32, PHILOX_M0, PHILOX_M1, PHILOX_ROUNDS, PHILOX_W0, PHILOX_W1

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


@cuda.jit(device=True)
def philox_word(seed_lo, seed_hi, bh, row, col):
    """First output word of Philox4x32-10 at counter (col, row, bh, 0), key (seed_lo, seed_hi).

    The device twin of ``iosim.rng.philox_word``: same rounds, same word order, so the
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
def load_rows(dst, src, bh, start, n, d, scale):
    """dst[r, c] = scale · src[bh, start + r, c] as float32 for r < R, c < d; 0 elsewhere in dst.

    dst is an (R, W >= d) shared tile; all threads of the block take part, consecutive
    threads reading consecutive elements of a row (coalesced). Rows past n and the
    padding columns c >= d are zeroed, so products over the padding stay finite.
    """
    rows = dst.shape[0]
    width = dst.shape[1]
    for idx in range(cuda.threadIdx.x, rows * width, cuda.blockDim.x):
        r = idx // width
        c = idx - r * width
        if start + r < n and c < d:
            dst[r, c] = np.float32(src[bh, start + r, c]) * scale
        else:
            dst[r, c] = ZERO


@cuda.jit(device=True)
def store_rows(dst, acc, bh, start, n, d, scale, r0, tx, TC):
    """dst[bh, start + r0 + a, tx + TC·f] = scale · acc[a, f] for rows < n and columns < d.

    Writes a thread's (TM, ⌈d/TC⌉) accumulator slice back to HBM: its rows r0 … r0 + TM − 1
    of the tile, its columns tx, tx + TC, … of each d-wide row.
    """
    for a in range(acc.shape[0]):
        row = start + r0 + a
        if row < n:
            for f in range(acc.shape[1]):
                e = tx + TC * f
                if e < d:
                    dst[bh, row, e] = scale * acc[a, f]


@cuda.jit(device=True)
def load_vector(dst, src, bh, start, n, fill):
    """dst[r] = src[bh, start + r] as float32 for r < R; entries past n get `fill`."""
    for r in range(cuda.threadIdx.x, dst.shape[0], cuda.blockDim.x):
        if start + r < n:
            dst[r] = np.float32(src[bh, start + r])
        else:
            dst[r] = fill


@cuda.jit(device=True)
def zero_tile(acc):
    """acc[:, :] = 0 for a thread's (rows, cols) register tile."""
    for a in range(acc.shape[0]):
        for b in range(acc.shape[1]):
            acc[a, b] = ZERO


@cuda.jit(device=True)
def rows_dot_rows(acc, a_reg, b_reg, A, r0, B, tx, TC, length):
    """acc[a, b] += Σ_k A[r0 + a, k] · B[tx + TC·b, k]: a micro-tile of A Bᵀ.

    Used for S = Q Kᵀ, Sᵀ = K Qᵀ and dPᵀ = V dOᵀ. a_reg (TM,) and b_reg (TN,) are
    register scratch so that each shared value is read once per k.
    """
    TM = acc.shape[0]
    TN = acc.shape[1]
    for k in range(length):
        for a in range(TM):
            a_reg[a] = A[r0 + a, k]
        for b in range(TN):
            b_reg[b] = B[tx + TC * b, k]
        for a in range(TM):
            for b in range(TN):
                acc[a, b] += a_reg[a] * b_reg[b]


@cuda.jit(device=True)
def masked_scores(s, a_reg, b_reg, Q_s, K_s, red, r0, tx, TC, d, row0, col0, n_q, n_k, causal):
    """S_ij = Q_i K_jᵀ (Q_s pre-scaled by tau), MASK, and this thread's share of rowmax(S_ij).

    The forward kernels' Alg. 2 lines 10-12: s gets the thread's (TM, TN) micro-tile with
    hidden entries at −inf, and red[r0 + a, tx] its partial max of tile row r0 + a, for
    the TC threads of the row to combine after a barrier.
    """
    zero_tile(s)
    rows_dot_rows(s, a_reg, b_reg, Q_s, r0, K_s, tx, TC, d)
    for a in range(s.shape[0]):
        mx = NEG_INF
        for b in range(s.shape[1]):
            if not visible(row0 + r0 + a, col0 + tx + TC * b, n_q, n_k, causal):
                s[a, b] = NEG_INF
            mx = max(mx, s[a, b])
        red[r0 + a, tx] = mx


@cuda.jit(device=True)
def rows_dot_cols(acc, a_reg, A, r0, B, tx, TC, length):
    """acc[a, f] += Σ_c A[r0 + a, c] · B[c, tx + TC·f]: a micro-tile of A B.

    Used for O += P V, dV += Pᵀ dO and dK += dSᵀ Q, with P, dSᵀ stored row-major in shared
    memory. B must be at least TC·FD wide; columns >= d hold padding whose results the
    caller never stores, which keeps a bounds test out of the inner loop.
    """
    TM = acc.shape[0]
    FD = acc.shape[1]
    for c in range(length):
        for a in range(TM):
            a_reg[a] = A[r0 + a, c]
        for f in range(FD):
            b_val = B[c, tx + TC * f]
            for a in range(TM):
                acc[a, f] += a_reg[a] * b_val


@cuda.jit(device=True)
def cols_dot_cols(acc, a_reg, A, r0, B, tx, TC, length):
    """acc[a, f] += Σ_c A[c, r0 + a] · B[c, tx + TC·f]: a micro-tile of Aᵀ B.

    Used for dQ += dS K where the tile holds dSᵀ (keys × queries).
    """
    TM = acc.shape[0]
    FD = acc.shape[1]
    for c in range(length):
        for a in range(TM):
            a_reg[a] = A[c, r0 + a]
        for f in range(FD):
            b_val = B[c, tx + TC * f]
            for a in range(TM):
                acc[a, f] += a_reg[a] * b_val


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


@cuda.jit(device=True)
def backward_tile(s, dp, PT_s, dST_s, lse_s, D_s, r0, tx, TC, key0, query0, n_q, n_k, causal, tau,
                  dropout, seed_lo, seed_hi, threshold, inv_keep, bh):
    """Alg. 4 lines 12-20 on one thread's micro-tile of the transposed (keys × queries) tile.

    In: s = (K_j Q_iᵀ) and dp = (V_j dO_iᵀ) for keys key0 + r0 + a and queries
    query0 + tx + TC·b. Out, in shared memory: PT_s = (P_ij ∘ Z_ij)ᵀ and
    dST_s = (P_ij ∘ (dP_ij ∘ Z_ij − D_i))ᵀ at tile positions [r0 + a, tx + TC·b].
    """
    for a in range(s.shape[0]):
        key = key0 + r0 + a
        for b in range(s.shape[1]):
            c = tx + TC * b
            query = query0 + c
            p = ZERO
            if visible(query, key, n_q, n_k, causal):  # line 12: MASK
                p = math.exp(tau * s[a, b] - lse_s[c])  # line 13, with lse = m + log ℓ
            z = ONE
            if dropout:  # line 14
                z = dropout_scale(seed_lo, seed_hi, threshold, inv_keep, bh, query, key)
            PT_s[r0 + a, c] = p * z  # line 15
            dST_s[r0 + a, c] = p * (dp[a, b] * z - D_s[c])  # lines 18 and 20


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


def row_dot_kernel_for(widen):
    """The row_dot kernel for inputs whose elements widen(x) turns into float32."""

    @cuda.jit
    def row_dot(do, o, big_d):
        """D_i = rowsum(dO_i ∘ O_i) (Alg. 4 line 19) for every row: (bh, N_q, d) x2 -> (bh, N_q)."""
        n_q = o.shape[1]
        start = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        for idx in range(start, o.shape[0] * n_q, cuda.gridDim.x * cuda.blockDim.x):
            bh = idx // n_q
            i = idx - bh * n_q
            acc = ZERO
            for e in range(o.shape[2]):
                acc += widen(do[bh, i, e]) * widen(o[bh, i, e])
            big_d[bh, i] = acc

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
