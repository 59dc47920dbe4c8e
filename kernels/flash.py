"""flash: FlashAttention in the paper's loop order (Algorithms 1/2 forward, Algorithm 4 backward).

K/V blocks form the outer loop and Q blocks the inner loop, and O, ℓ, m (forward) and
dQ (backward) are read from and written to HBM at every inner step, exactly as the
pseudo-code says. The kernel exists so that its HBM traffic can be measured (Nsight
Compute) and compared with the simulator's count for the same B_r, B_c; it is not meant
to be fast: one thread block per batch·head runs the whole double loop, so the only
parallelism is over batch·heads and within a tile.

Deviations from the paper:
- The forward pass also writes lse = m + log ℓ (and O cast to the input dtype) at the
  last K/V block a query block visits; ℓ and m stay in HBM as the paper has them.
- The backward pass takes lse instead of ℓ and m: P = exp(S − lse) = diag(ℓ)⁻¹ exp(S − m).
- Q is multiplied by tau while it is loaded, so S arrives scaled.
- Causal: (i, j) tiles entirely above the diagonal are skipped (they contribute exactly 0),
  so their O_i, ℓ_i, m_i are not re-read or re-written.
- For float16 inputs, O lives in HBM as float32 between steps (float32 accumulation) and
  is cast to float16 at the last step; for float32 the working O is the output itself.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32

from iosim.algorithms import flash as simulated
from iosim.kernels import _device as dev
from iosim.kernels import _flash_tiles as tiles
from iosim.kernels.config import FLOAT32_BYTES, TileConfig

# The iosim algorithm this kernel computes: iosim counts its HBM traffic, the tests compare outputs.
ALGORITHM = simulated.ALGORITHM
BFLOAT16 = False  # the host API hands it float32 or float16 only (kernels.api.Implementation)
# grouped-query attention (k, v with fewer heads than q): its thread block per batch·head indexes K/V by the query head
GROUPED_FORWARD = False
SPLITS = False  # its forward does not split K/V (kernels.api: splits= is for split-kv)
SAWTOOTH = False  # one K/V order (kernels.api: sawtooth= is for flash-swapped)

NEG_INF = dev.NEG_INF
ZERO = dev.ZERO
ONE = dev.ONE

FORWARD_TILES = (TileConfig(Br=32, Bc=32, TM=2, TN=4), TileConfig(Br=16, Bc=16, TM=2, TN=2),
                 TileConfig(Br=8, Bc=8, TM=1, TN=1))
BACKWARD_TILES = (TileConfig(Br=32, Bc=32, TM=4, TN=4), TileConfig(Br=16, Bc=16, TM=2, TN=2),
                  TileConfig(Br=8, Bc=8, TM=1, TN=1))


def shared_bytes(config: TileConfig, d: int, backward: bool) -> int:
    """Static shared memory of one thread block, matching the cuda.shared.array calls below."""
    w = config.row_width(d, backward)
    if backward:
        b = config.Br
        # K_j, V_j, Q_i, dO_i tiles; Pᵀ∘Z and dSᵀ tiles; lse_i and D_i
        return FLOAT32_BYTES * (4 * b * w + 2 * b * (b + 1) + 2 * b)
    tc = config.threads_per_row()
    # Q_i, K_j, V_j tiles; P̃_ij tile; row partials of m̃_ij and ℓ̃_ij
    return FLOAT32_BYTES * ((config.Br + 2 * config.Bc) * w + config.Br * (config.Bc + 1) + 2 * config.Br * tc)


def _last_block(row0: int, Br: int, n_q: int, n_k: int, Bc: int, Tc: int, causal: bool) -> int:
    """Index of the last K/V block that query block row0 visits; −1 when it sees no key."""
    if not causal:
        return Tc - 1
    last_key = min(row0 + Br, n_q) - 1 + (n_k - n_q)
    if last_key < 0:
        return -1
    return min(Tc - 1, last_key // Bc)


def check_config(config, d: int, backward: bool) -> None:
    """Raise naming `config` or `d` when this tiling cannot run this kernel for head dim d."""
    if not isinstance(config, TileConfig):
        raise TypeError(f"config must be a kernels.TileConfig; got {config!r}")
    config.check(d, backward, shared_bytes(config, d, backward))


@functools.cache
def forward_kernel(d: int, config: TileConfig, causal: bool, dropout: bool, cast_out: bool):
    """Alg. 2 (Alg. 1 with tau, MASK and dropout) for one batch·head per thread block: grid (batch·heads,)."""
    Br, Bc, TM, TN = config.Br, config.Bc, config.TM, config.TN
    TC = config.threads_per_row()
    FD = config.acc_cols(d)
    W = config.row_width(d)
    BCP = Bc + 1
    last_block = cuda.jit(device=True)(_last_block)

    @cuda.jit
    def kernel(q, k, v, o, l, m, out, lse, tau, seed_lo, seed_hi, threshold, inv_keep):
        n_q = q.shape[1]
        n_k = k.shape[1]
        Tr = (n_q + Br - 1) // Br
        Tc = (n_k + Bc - 1) // Bc
        bh = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        nthreads = cuda.blockDim.x
        ty = tid // TC
        tx = tid - ty * TC
        r0 = ty * TM

        Q_s = cuda.shared.array((Br, W), float32)
        K_s = cuda.shared.array((Bc, W), float32)
        V_s = cuda.shared.array((Bc, W), float32)
        P_s = cuda.shared.array((Br, BCP), float32)
        red_m = cuda.shared.array((Br, TC), float32)  # per-thread partials of m̃_ij
        red_l = cuda.shared.array((Br, TC), float32)  # per-thread partials of ℓ̃_ij

        s = cuda.local.array((TM, TN), float32)
        o_i = cuda.local.array((TM, FD), float32)  # this thread's slice of O_i, from HBM
        pv = cuda.local.array((TM, FD), float32)  # its slice of P̃_ij V_j
        m_i = cuda.local.array(TM, float32)
        l_i = cuda.local.array(TM, float32)
        m_t = cuda.local.array(TM, float32)  # m̃_ij
        a_reg = cuda.local.array(TM, float32)
        b_reg = cuda.local.array(TN, float32)

        # Alg. 2 line 3: O = 0, ℓ = 0, m = −inf in HBM (also lse = −inf for rows that see no key)
        for idx in range(tid, n_q * d, nthreads):
            row = idx // d
            o[bh, row, idx - row * d] = ZERO
            if cast_out:
                out[bh, row, idx - row * d] = ZERO
        for row in range(tid, n_q, nthreads):
            l[bh, row] = ZERO
            m[bh, row] = NEG_INF
            lse[bh, row] = NEG_INF

        for j in range(Tc):  # line 6
            col0 = j * Bc
            cuda.syncthreads()
            tiles.load_rows(K_s, k, bh, col0, n_k, d, ONE)  # line 7
            tiles.load_rows(V_s, v, bh, col0, n_k, d, ONE)
            for i in range(Tr):  # line 8
                row0 = i * Br
                last_j = last_block(row0, Br, n_q, n_k, Bc, Tc, causal)
                if j > last_j:
                    continue  # tile entirely masked (causal): nothing to add
                cuda.syncthreads()
                # line 9: Q_i (scaled by tau) to shared memory; O_i, ℓ_i, m_i slices to registers
                tiles.load_rows(Q_s, q, bh, row0, n_q, d, tau)
                for a in range(TM):
                    row = row0 + r0 + a
                    if row < n_q:
                        m_i[a] = m[bh, row]
                        l_i[a] = l[bh, row]
                        for f in range(FD):
                            e = tx + TC * f
                            o_i[a, f] = o[bh, row, e] if e < d else ZERO
                    else:
                        m_i[a] = NEG_INF
                        l_i[a] = ZERO
                cuda.syncthreads()

                # line 10: S_ij = tau Q_i K_jᵀ; line 11: MASK; line 12: this thread's share of m̃_ij
                tiles.masked_scores(s, a_reg, b_reg, Q_s, K_s, red_m, r0, tx, TC, d, row0, col0, n_q, n_k, causal)
                cuda.syncthreads()

                # line 12: P̃_ij = exp(S_ij − m̃_ij), ℓ̃_ij = rowsum(P̃_ij); line 14: dropout into P_s
                for a in range(TM):
                    m_tilde = NEG_INF
                    for t in range(TC):
                        m_tilde = max(m_tilde, red_m[r0 + a, t])
                    m_use = dev.safe_max(m_tilde)
                    part = ZERO
                    for b in range(TN):
                        p = math.exp(s[a, b] - m_use)
                        part += p
                        if dropout:
                            p *= dev.dropout_scale(seed_lo, seed_hi, threshold, inv_keep, bh, row0 + r0 + a,
                                                   col0 + tx + TC * b)
                        P_s[r0 + a, tx + TC * b] = p
                    red_l[r0 + a, tx] = part
                    m_t[a] = m_tilde
                cuda.syncthreads()

                dev.zero_tile(pv)
                tiles.rows_dot_cols(pv, a_reg, P_s, r0, V_s, tx, TC, Bc)
                for a in range(TM):
                    row = row0 + r0 + a
                    if row < n_q:
                        m_tilde = m_t[a]
                        l_tilde = ZERO
                        for t in range(TC):
                            l_tilde += red_l[r0 + a, t]
                        # line 13: m_new = max(m_i, m̃_ij), ℓ_new = e^{m_i−m_new} ℓ_i + e^{m̃_ij−m_new} ℓ̃_ij
                        m_new = max(m_i[a], m_tilde)
                        alpha = dev.rescale(m_i[a], m_new)
                        beta = dev.rescale(m_tilde, m_new)
                        l_new = alpha * l_i[a] + beta * l_tilde
                        inv_l = ONE / l_new if l_new > ZERO else ZERO
                        # line 15: O_i = diag(ℓ_new)⁻¹ (diag(ℓ_i) e^{m_i−m_new} O_i + e^{m̃_ij−m_new} P̃_ij^dropped V_j)
                        for f in range(FD):
                            e = tx + TC * f
                            if e < d:
                                o_new = inv_l * (l_i[a] * alpha * o_i[a, f] + beta * pv[a, f])
                                o[bh, row, e] = o_new
                                if cast_out and j == last_j:
                                    out[bh, row, e] = o_new
                        if tx == 0:  # line 16: ℓ_i = ℓ_new, m_i = m_new
                            l[bh, row] = l_new
                            m[bh, row] = m_new
                            if j == last_j:
                                lse[bh, row] = dev.log_sum_exp(m_new, l_new)

    return kernel


@functools.cache
def backward_kernel(d: int, config: TileConfig, causal: bool, dropout: bool):
    """Alg. 4 for one batch·head per thread block: grid (batch·heads,), tile B keys × B queries."""
    B, TM, TN = config.Br, config.TM, config.TN
    TC = config.threads_per_row(backward=True)
    FD = config.acc_cols(d, backward=True)
    W = config.row_width(d, backward=True)
    BP = B + 1

    @cuda.jit
    def kernel(q, k, v, o, do, lse, dq_acc, dk, dv, tau, seed_lo, seed_hi, threshold, inv_keep):
        n_q = q.shape[1]
        n_k = k.shape[1]
        Tr = (n_q + B - 1) // B
        Tc = (n_k + B - 1) // B
        bh = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        nthreads = cuda.blockDim.x
        ty = tid // TC
        tx = tid - ty * TC
        r0 = ty * TM
        draw = dev.DropoutArgs(seed_lo, seed_hi, threshold, inv_keep)

        K_s = cuda.shared.array((B, W), float32)
        V_s = cuda.shared.array((B, W), float32)
        Q_s = cuda.shared.array((B, W), float32)
        dO_s = cuda.shared.array((B, W), float32)
        PT_s = cuda.shared.array((B, BP), float32)  # (P_ij ∘ Z_ij)ᵀ
        dST_s = cuda.shared.array((B, BP), float32)  # dS_ijᵀ
        lse_s = cuda.shared.array(B, float32)
        D_s = cuda.shared.array(B, float32)

        s = cuda.local.array((TM, TN), float32)
        dp = cuda.local.array((TM, TN), float32)
        dk_acc = cuda.local.array((TM, FD), float32)
        dv_acc = cuda.local.array((TM, FD), float32)
        dq_t = cuda.local.array((TM, FD), float32)
        a_reg = cuda.local.array(TM, float32)
        b_reg = cuda.local.array(TN, float32)

        # line 5: dQ = 0 in HBM
        for idx in range(tid, n_q * d, nthreads):
            row = idx // d
            dq_acc[bh, row, idx - row * d] = ZERO

        for j in range(Tc):  # line 6
            col0 = j * B
            cuda.syncthreads()
            tiles.load_rows(K_s, k, bh, col0, n_k, d, ONE)  # line 7
            tiles.load_rows(V_s, v, bh, col0, n_k, d, ONE)
            dev.zero_tile(dk_acc)  # line 8
            dev.zero_tile(dv_acc)
            i_start = 0
            if causal:
                i_start = max(0, col0 - (n_k - n_q)) // B
            for i in range(i_start, Tr):  # line 9
                row0 = i * B
                cuda.syncthreads()
                # line 10: Q_i, dO_i, lse_i to shared memory (O_i and dQ_i are read below)
                tiles.load_rows(Q_s, q, bh, row0, n_q, d, ONE)
                tiles.load_rows(dO_s, do, bh, row0, n_q, d, ONE)
                tiles.load_vector(lse_s, lse, bh, row0, n_q, ZERO)
                cuda.syncthreads()
                # line 19: D_i = rowsum(dO_i ∘ O_i), one thread per row, O_i straight from HBM
                for r in range(tid, B, nthreads):
                    acc = ZERO
                    if row0 + r < n_q:
                        for e in range(d):
                            acc += dO_s[r, e] * np.float32(o[bh, row0 + r, e])
                    D_s[r] = acc
                # line 11: S_ijᵀ = K_j Q_iᵀ; line 17: dP_ijᵀ = V_j dO_iᵀ
                dev.zero_tile(s)
                tiles.rows_dot_rows(s, a_reg, b_reg, K_s, r0, Q_s, tx, TC, d)
                dev.zero_tile(dp)
                tiles.rows_dot_rows(dp, a_reg, b_reg, V_s, r0, dO_s, tx, TC, d)
                cuda.syncthreads()  # D_s is complete
                # lines 12-20
                tiles.backward_tile(s, dp, PT_s, dST_s, lse_s, D_s, r0, tx, TC, col0, row0, n_q, n_k, causal, tau,
                                    dropout, draw, bh)
                cuda.syncthreads()
                tiles.rows_dot_cols(dv_acc, a_reg, PT_s, r0, dO_s, tx, TC, B)  # line 16
                tiles.rows_dot_cols(dk_acc, a_reg, dST_s, r0, Q_s, tx, TC, B)  # line 22 (tau at line 24)
                # line 21: dQ_i ← dQ_i + tau dS_ij K_j, read-modify-write in HBM (this block owns bh)
                dev.zero_tile(dq_t)
                tiles.cols_dot_cols(dq_t, a_reg, dST_s, r0, K_s, tx, TC, B)
                for a in range(TM):
                    query = row0 + r0 + a
                    if query < n_q:
                        for f in range(FD):
                            e = tx + TC * f
                            if e < d:
                                dq_acc[bh, query, e] += tau * dq_t[a, f]
            # line 24: write dK_j, dV_j
            tiles.store_rows(dk, dk_acc, bh, col0, n_k, d, tau, r0, tx, TC)
            tiles.store_rows(dv, dv_acc, bh, col0, n_k, d, ONE, r0, tx, TC)

    return kernel


def forward(q, k, v, *, tau: float, causal: bool, dropout, config: TileConfig):
    """O and lse on device arrays q (bh, N_q, d), k, v (bh, N_k, d); see flash_swapped.forward."""
    n_bh, n_q, d = q.shape
    cast_out = q.dtype != np.float32
    o = cuda.device_array((n_bh, n_q, d), dtype=np.float32)  # O in HBM between steps
    out = cuda.device_array((n_bh, n_q, d), dtype=q.dtype) if cast_out else o
    l = cuda.device_array((n_bh, n_q), dtype=np.float32)
    m = cuda.device_array((n_bh, n_q), dtype=np.float32)
    lse = cuda.device_array((n_bh, n_q), dtype=np.float32)
    kernel = forward_kernel(d, config, bool(causal), dropout.enabled, cast_out)
    kernel[n_bh, config.threads()](q, k, v, o, l, m, out, lse, np.float32(tau), *dropout.kernel_args())
    return out, lse


def backward(q, k, v, out, lse, dout, *, tau: float, causal: bool, dropout, config: TileConfig):
    """dQ, dK, dV (in q's dtype) on device arrays, as in `forward`."""
    n_bh, n_q, d = q.shape
    n_k = k.shape[1]
    dq_acc = cuda.device_array((n_bh, n_q, d), dtype=np.float32)
    dk = cuda.device_array((n_bh, n_k, d), dtype=q.dtype)
    dv = cuda.device_array((n_bh, n_k, d), dtype=q.dtype)
    kernel = backward_kernel(d, config, bool(causal), dropout.enabled)
    kernel[n_bh, config.threads(backward=True)](
        q, k, v, out, dout, lse, dq_acc, dk, dv, np.float32(tau), *dropout.kernel_args()
    )
    if q.dtype == np.float32:
        return dq_acc, dk, dv
    dq = cuda.device_array((n_bh, n_q, d), dtype=q.dtype)
    dev.cast_kernel[dev.grid_stride_launch(n_bh * n_q * d)](dq_acc, dq)
    return dq, dk, dv
