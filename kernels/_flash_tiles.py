"""flash's shared tiles and micro-tile products: tile loads and stores, S = Q Kᵀ with MASK, Alg. 4 lines 12-20.

Used by kernels/flash.py only (flash-swapped has kernels/_register_tiles.py, flash-swapped-tc
kernels/_tc_tiles.py). Like kernels/_device.py it runs both compiled for a GPU and under
Numba's CUDA simulator: no warp shuffles, no inline PTX.

Thread layout of flash's tiles. A tile of R rows × C columns is covered by
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

import numpy as np
from numba import cuda

from iosim.kernels import _device as dev
from iosim.kernels._device import NEG_INF, ONE, ZERO


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
    dev.zero_tile(s)
    rows_dot_rows(s, a_reg, b_reg, Q_s, r0, K_s, tx, TC, d)
    for a in range(s.shape[0]):
        mx = NEG_INF
        for b in range(s.shape[1]):
            if not dev.visible(row0 + r0 + a, col0 + tx + TC * b, n_q, n_k, causal):
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
def backward_tile(s, dp, PT_s, dST_s, lse_s, D_s, r0, tx, TC, key0, query0, n_q, n_k, causal, tau,
                  dropout, draw, bh):
    """Alg. 4 lines 12-20 on one thread's micro-tile of the transposed (keys × queries) tile.

    In: s = (K_j Q_iᵀ) and dp = (V_j dO_iᵀ) for keys key0 + r0 + a and queries
    query0 + tx + TC·b. Out, in shared memory: PT_s = (P_ij ∘ Z_ij)ᵀ and
    dST_s = (P_ij ∘ (dP_ij ∘ Z_ij − D_i))ᵀ at tile positions [r0 + a, tx + TC·b]. draw is the
    kernel's dev.DropoutArgs, read only when `dropout`.
    """
    for a in range(s.shape[0]):
        key = key0 + r0 + a
        for b in range(s.shape[1]):
            c = tx + TC * b
            query = query0 + c
            p = ZERO
            if dev.visible(query, key, n_q, n_k, causal):  # line 12: MASK
                p = math.exp(tau * s[a, b] - lse_s[c])  # line 13, with lse = m + log ℓ
            z = ONE
            if dropout:  # line 14
                z = dev.dropout_scale(draw.seed_lo, draw.seed_hi, draw.threshold, draw.inv_keep, bh, query, key)
            PT_s[r0 + a, c] = p * z  # line 15
            dST_s[r0 + a, c] = p * (dp[a, b] * z - D_s[c])  # lines 18 and 20
