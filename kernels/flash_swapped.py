"""flash-swapped: FlashAttention with the loops swapped (FlashAttention-2 style), forward and backward.

Forward. One thread block per (batch·head, query block Q_i): Q_i stays in shared memory,
K_j and V_j stream through it, and O_i, m_i, ℓ_i live on chip until the single write at
the end. This is the "possible improvement" of seed 003 (Q blocks outer) and the loop
order of FlashAttention-2 (Dao, 2023): HBM traffic 2·N·d for Q, O plus T_r·2·N_k·d for
K, V streamed once per query block.

Backward. One thread block per (batch·head, key block K_j), as in FlashAttention-2:
K_j, V_j and the accumulators dK_j, dV_j stay on chip while Q_i, dO_i stream through
(Alg. 4's loop order, parallel over j); dQ_i is accumulated with atomic adds into a
float32 buffer in HBM. D = rowsum(dO ∘ O) (Alg. 4 line 19) is computed once, before.

Deviations from the paper's Algorithms 1/2 and 4:
- O is kept unnormalised during the loop and divided by ℓ once at the end (FlashAttention-2);
  ℓ_i is accumulated per thread over its own columns and summed across threads at the end.
- The kernels store lse = m + log ℓ instead of m and ℓ; the backward pass uses
  P = exp(S − lse), equal to diag(ℓ)⁻¹ exp(S − m) of Alg. 4 line 13.
- Q is multiplied by tau while it is loaded, so S arrives scaled.
- Causal: key blocks entirely above the diagonal are skipped (they contribute exactly 0).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32

from kernels import _device as dev
from kernels.config import FLOAT32_BYTES, TileConfig

NEG_INF = dev.NEG_INF
ZERO = dev.ZERO
ONE = dev.ONE

# Tile preferences, tried in order; the first whose shared memory fits is the default.
FORWARD_TILES = (TileConfig(Br=64, Bc=32, TM=4, TN=4), TileConfig(Br=32, Bc=16, TM=4, TN=2), TileConfig(Br=16, Bc=16, TM=2, TN=2))
# Blocks of the forward kernel per SM that the compiler must make room for: at d = 64 this
# caps it at 128 registers with no spills (151 uncapped), 4 blocks instead of 3 on an H100
# (experiments/results/kernels_resources_sm90.md); 6 would spill.
FORWARD_MIN_BLOCKS = 4
BACKWARD_TILES = (TileConfig(Br=32, Bc=32, TM=4, TN=4), TileConfig(Br=16, Bc=16, TM=2, TN=2), TileConfig(Br=8, Bc=8, TM=1, TN=1))


def shared_bytes(config: TileConfig, d: int, backward: bool) -> int:
    """Static shared memory of one thread block, matching the cuda.shared.array calls below."""
    w = config.row_width(d, backward)
    if backward:
        b = config.Br
        # K_j, V_j, Q_i, dO_i tiles; Pᵀ∘Z and dSᵀ tiles; lse_i and D_i
        return FLOAT32_BYTES * (4 * b * w + 2 * b * (b + 1) + 2 * b)
    tc = config.threads_per_row()
    # Q_i, K_j, V_j tiles; P̃_ij tile; per-thread row partials
    return FLOAT32_BYTES * ((config.Br + 2 * config.Bc) * w + config.Br * (config.Bc + 1) + config.Br * tc)


def check_config(config, d: int, backward: bool) -> None:
    """Raise naming `config` or `d` when this tiling cannot run this kernel for head dim d."""
    if not isinstance(config, TileConfig):
        raise TypeError(f"config must be a kernels.TileConfig; got {config!r}")
    config.check(d, backward, shared_bytes(config, d, backward))


@functools.lru_cache(maxsize=None)
def forward_kernel(d: int, config: TileConfig, causal: bool, dropout: bool):
    """Compile-time specialised forward kernel: grid (batch·heads · T_r,), block config.threads()."""
    Br, Bc, TM, TN = config.Br, config.Bc, config.TM, config.TN
    TC = config.threads_per_row()
    FD = config.acc_cols(d)
    W = config.row_width(d)
    BCP = Bc + 1

    @cuda.jit(**dev.launch_bounds(config.threads(), FORWARD_MIN_BLOCKS))
    def kernel(q, k, v, out, lse, tau, seed_lo, seed_hi, threshold, inv_keep):
        n_q = q.shape[1]
        n_k = k.shape[1]
        Tr = (n_q + Br - 1) // Br
        bh = cuda.blockIdx.x // Tr
        i = cuda.blockIdx.x - bh * Tr
        tid = cuda.threadIdx.x
        ty = tid // TC
        tx = tid - ty * TC
        r0 = ty * TM  # first tile row of this thread
        row0 = i * Br  # first query row of the block

        Q_s = cuda.shared.array((Br, W), float32)
        K_s = cuda.shared.array((Bc, W), float32)
        V_s = cuda.shared.array((Bc, W), float32)
        P_s = cuda.shared.array((Br, BCP), float32)
        red = cuda.shared.array((Br, TC), float32)  # (Br, TC) per-thread partials of a row statistic

        s = cuda.local.array((TM, TN), float32)  # this thread's part of S_ij
        acc = cuda.local.array((TM, FD), float32)  # unnormalised O_i, columns tx + TC·f
        m_i = cuda.local.array(TM, float32)
        l_i = cuda.local.array(TM, float32)  # partial ℓ_i over this thread's columns
        a_reg = cuda.local.array(TM, float32)
        b_reg = cuda.local.array(TN, float32)

        # Alg. 1 line 2 (on chip): O_i = 0, ℓ_i = 0, m_i = −inf
        dev.zero_tile(acc)
        for a in range(TM):
            m_i[a] = NEG_INF
            l_i[a] = ZERO
        # Alg. 1 line 8, hoisted out of the K/V loop: Q_i, pre-scaled by tau
        dev.load_rows(Q_s, q, bh, row0, n_q, d, tau)

        Tc = (n_k + Bc - 1) // Bc
        if causal:
            # the block's last row sees keys up to last_row + N_k − N_q; later blocks are all masked
            last_key = min(row0 + Br, n_q) - 1 + (n_k - n_q)
            Tc = min(Tc, (last_key + Bc) // Bc) if last_key >= 0 else 0
        for j in range(Tc):
            col0 = j * Bc
            cuda.syncthreads()  # the previous step's readers of K_s, V_s, P_s are done
            dev.load_rows(K_s, k, bh, col0, n_k, d, ONE)  # Alg. 1 line 6
            dev.load_rows(V_s, v, bh, col0, n_k, d, ONE)
            cuda.syncthreads()

            # Alg. 2 lines 10-12: S_ij = tau Q_i K_jᵀ, (TM, TN) per thread, MASK, this thread's share of rowmax
            dev.masked_scores(s, a_reg, b_reg, Q_s, K_s, red, r0, tx, TC, d, row0, col0, n_q, n_k, causal)
            cuda.syncthreads()

            for a in range(TM):
                # Alg. 2 line 13: m_new = max(m_i, m̃_ij), rescale ℓ_i and O_i by e^{m_i − m_new}
                m_new = m_i[a]
                for t in range(TC):
                    m_new = max(m_new, red[r0 + a, t])
                m_use = dev.safe_max(m_new)
                alpha = math.exp(m_i[a] - m_use)
                m_i[a] = m_new
                l_i[a] *= alpha
                for f in range(FD):
                    acc[a, f] *= alpha
                # P̃_ij = exp(S_ij − m_new); ℓ_i += rowsum(P̃_ij); Alg. 2 line 14: dropout
                row = row0 + r0 + a
                for b in range(TN):
                    p = math.exp(s[a, b] - m_use)
                    l_i[a] += p
                    if dropout:
                        p *= dev.dropout_scale(seed_lo, seed_hi, threshold, inv_keep, bh, row, col0 + tx + TC * b)
                    P_s[r0 + a, tx + TC * b] = p
            cuda.syncthreads()
            # Alg. 2 line 15 (unnormalised): O_i += P̃_ij^dropped V_j
            dev.rows_dot_cols(acc, a_reg, P_s, r0, V_s, tx, TC, Bc)

        # Epilogue: ℓ_i = Σ over the row's TC threads, O_i = diag(ℓ_i)⁻¹ O_i, lse_i = m_i + log ℓ_i
        cuda.syncthreads()
        for a in range(TM):
            red[r0 + a, tx] = l_i[a]
        cuda.syncthreads()
        for a in range(TM):
            row = row0 + r0 + a
            if row < n_q:
                l = ZERO
                for t in range(TC):
                    l += red[r0 + a, t]
                inv_l = ONE / l if l > ZERO else ZERO
                for f in range(FD):
                    e = tx + TC * f
                    if e < d:
                        out[bh, row, e] = acc[a, f] * inv_l
                if tx == 0:
                    lse[bh, row] = dev.log_sum_exp(m_i[a], l)

    return kernel


@functools.lru_cache(maxsize=None)
def backward_kernel(d: int, config: TileConfig, causal: bool, dropout: bool):
    """Compile-time specialised backward kernel: grid (batch·heads · T_c,), block config.threads(True).

    The tile is B keys × B queries (B = Br = Bc); thread rows are keys for Sᵀ, Pᵀ, dV, dK
    and queries for dQ.
    """
    B, TM, TN = config.Br, config.TM, config.TN
    TC = config.threads_per_row(backward=True)
    FD = config.acc_cols(d, backward=True)
    W = config.row_width(d, backward=True)
    BP = B + 1

    @cuda.jit
    def kernel(q, k, v, do, lse, big_d, dq_acc, dk, dv, tau, seed_lo, seed_hi, threshold, inv_keep):
        n_q = q.shape[1]
        n_k = k.shape[1]
        Tc = (n_k + B - 1) // B
        Tr = (n_q + B - 1) // B
        bh = cuda.blockIdx.x // Tc
        j = cuda.blockIdx.x - bh * Tc
        tid = cuda.threadIdx.x
        ty = tid // TC
        tx = tid - ty * TC
        r0 = ty * TM
        col0 = j * B  # first key of the block

        K_s = cuda.shared.array((B, W), float32)
        V_s = cuda.shared.array((B, W), float32)
        Q_s = cuda.shared.array((B, W), float32)
        dO_s = cuda.shared.array((B, W), float32)
        PT_s = cuda.shared.array((B, BP), float32)  # (P_ij ∘ Z_ij)ᵀ, keys × queries
        dST_s = cuda.shared.array((B, BP), float32)  # dS_ijᵀ
        lse_s = cuda.shared.array(B, float32)
        D_s = cuda.shared.array(B, float32)

        s = cuda.local.array((TM, TN), float32)  # S_ijᵀ / tau
        dp = cuda.local.array((TM, TN), float32)  # dP_ijᵀ before dropout
        dk_acc = cuda.local.array((TM, FD), float32)
        dv_acc = cuda.local.array((TM, FD), float32)
        dq_acc_t = cuda.local.array((TM, FD), float32)
        a_reg = cuda.local.array(TM, float32)
        b_reg = cuda.local.array(TN, float32)

        # Alg. 4 lines 7-8: K_j, V_j to shared memory, dK_j = dV_j = 0 on chip
        dev.load_rows(K_s, k, bh, col0, n_k, d, ONE)
        dev.load_rows(V_s, v, bh, col0, n_k, d, ONE)
        dev.zero_tile(dk_acc)
        dev.zero_tile(dv_acc)

        i_start = 0
        if causal:
            # query i sees key col0 only if i >= col0 − (N_k − N_q)
            i_start = max(0, col0 - (n_k - n_q)) // B
        for i in range(i_start, Tr):
            row0 = i * B
            cuda.syncthreads()
            # Alg. 4 line 10: Q_i, dO_i, lse_i (for ℓ_i, m_i) and D_i (line 19, precomputed)
            dev.load_rows(Q_s, q, bh, row0, n_q, d, ONE)
            dev.load_rows(dO_s, do, bh, row0, n_q, d, ONE)
            dev.load_vector(lse_s, lse, bh, row0, n_q, ZERO)
            dev.load_vector(D_s, big_d, bh, row0, n_q, ZERO)
            cuda.syncthreads()

            # Alg. 4 line 11: S_ijᵀ = K_j Q_iᵀ; line 17: dP_ijᵀ = V_j dO_iᵀ
            dev.zero_tile(s)
            dev.rows_dot_rows(s, a_reg, b_reg, K_s, r0, Q_s, tx, TC, d)
            dev.zero_tile(dp)
            dev.rows_dot_rows(dp, a_reg, b_reg, V_s, r0, dO_s, tx, TC, d)
            # lines 12-20: MASK, P_ij, Z_ij, (P∘Z)ᵀ and dSᵀ into shared memory
            dev.backward_tile(s, dp, PT_s, dST_s, lse_s, D_s, r0, tx, TC, col0, row0, n_q, n_k, causal, tau,
                              dropout, seed_lo, seed_hi, threshold, inv_keep, bh)
            cuda.syncthreads()

            dev.rows_dot_cols(dv_acc, a_reg, PT_s, r0, dO_s, tx, TC, B)  # line 16: dV_j += (P∘Z)ᵀ dO_i
            dev.rows_dot_cols(dk_acc, a_reg, dST_s, r0, Q_s, tx, TC, B)  # line 22 (tau applied at line 24)
            # line 21: dQ_i += tau dS_ij K_j; here this thread's rows are queries r0 + a
            dev.zero_tile(dq_acc_t)
            dev.cols_dot_cols(dq_acc_t, a_reg, dST_s, r0, K_s, tx, TC, B)
            for a in range(TM):
                query = row0 + r0 + a
                if query < n_q:
                    for f in range(FD):
                        e = tx + TC * f
                        if e < d:
                            cuda.atomic.add(dq_acc, (bh, query, e), tau * dq_acc_t[a, f])

        # Alg. 4 line 24: write dK_j, dV_j
        dev.store_rows(dk, dk_acc, bh, col0, n_k, d, tau, r0, tx, TC)
        dev.store_rows(dv, dv_acc, bh, col0, n_k, d, ONE, r0, tx, TC)

    return kernel


def forward(q, k, v, *, tau: float, causal: bool, dropout, config: TileConfig):
    """O and lse of attention on device arrays q (bh, N_q, d), k, v (bh, N_k, d).

    Returns (out (bh, N_q, d) in q's dtype, lse (bh, N_q) float32). Inputs are checked by
    kernels.api before this is called.
    """
    n_bh, n_q, d = q.shape
    out = cuda.device_array((n_bh, n_q, d), dtype=q.dtype)
    lse = cuda.device_array((n_bh, n_q), dtype=np.float32)
    kernel = forward_kernel(d, config, bool(causal), dropout.enabled)
    Tr = -(-n_q // config.Br)
    kernel[n_bh * Tr, config.threads()](q, k, v, out, lse, np.float32(tau), *dropout.kernel_args())
    return out, lse


def backward(q, k, v, out, lse, dout, *, tau: float, causal: bool, dropout, config: TileConfig):
    """dQ, dK, dV (in q's dtype) of attention on device arrays, as in `forward`."""
    n_bh, n_q, d = q.shape
    n_k = k.shape[1]
    big_d = cuda.device_array((n_bh, n_q), dtype=np.float32)
    dev.row_dot_kernel[dev.grid_stride_launch(n_bh * n_q)](dout, out, big_d)
    dq_acc = cuda.device_array((n_bh, n_q, d), dtype=np.float32)
    dev.fill_kernel[dev.grid_stride_launch(n_bh * n_q * d)](dq_acc, ZERO)
    dk = cuda.device_array((n_bh, n_k, d), dtype=q.dtype)
    dv = cuda.device_array((n_bh, n_k, d), dtype=q.dtype)
    kernel = backward_kernel(d, config, bool(causal), dropout.enabled)
    Tc = -(-n_k // config.Bc)
    kernel[n_bh * Tc, config.threads(backward=True)](
        q, k, v, dout, lse, big_d, dq_acc, dk, dv, np.float32(tau), *dropout.kernel_args()
    )
    if q.dtype == np.float32:
        return dq_acc, dk, dv
    dq = cuda.device_array((n_bh, n_q, d), dtype=q.dtype)
    dev.cast_kernel[dev.grid_stride_launch(n_bh * n_q * d)](dq_acc, dq)
    return dq, dk, dv
