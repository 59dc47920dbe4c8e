"""flash-swapped: FlashAttention with the loops swapped (FlashAttention-2 style), forward and backward.

Forward. One thread block per (batch·head, query block Q_i): Q_i stays in shared memory,
K_j and V_j stream through it, and O_i, m_i, ℓ_i live on chip until the single write at
the end. This is the loop order of FlashAttention-2 (Dao, 2023): HBM traffic 2·N·d for
Q, O plus T_r·2·N_k·d for K, V streamed once per query block.

Backward. One thread block per (batch·head, key block K_j), as in FlashAttention-2:
K_j, V_j and the accumulators dK_j, dV_j stay on chip while Q_i, dO_i stream through
(Alg. 4's loop order, parallel over j); dQ_i is accumulated with atomic adds into a
float32 buffer in HBM. D = rowsum(dO ∘ O) (Alg. 4 line 19) is computed once, before.

Deviations from the paper's Algorithms 1/2 and 4:
- O is kept unnormalised during the loop and divided by ℓ once at the end (FlashAttention-2);
  ℓ_i is accumulated per thread over its own columns and summed across threads at the end.
- The kernels store lse = m + log ℓ instead of m and ℓ; the backward pass uses
  P = exp(S − lse), equal to diag(ℓ)⁻¹ exp(S − m) of Alg. 4 line 13.
- Scores are kept in log2 units: Q is multiplied by tau·log₂e while it is loaded, and
  exp(x) is computed as exp2(x·log₂e), one MUFU.EX2 on the GPU (ex2.approx, relative
  error about 2⁻²², below float32 rounding of the sums it feeds); m_i is in log2 units.
- Causal: key blocks entirely above the diagonal are skipped (they contribute exactly 0).

Speed by construction (kernels/_register_tiles.py): one kernel per (d, tiling), the d and
tile loops unrolled at compile time so that shared addresses are immediates, 128-bit
shared loads over padded, 16-byte aligned rows, a row's threads reducing with warp
shuffles, unsigned global indices. The static model (experiments/kernel_static_model.py)
reads the result from the sm_90 machine code.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32

from iosim.algorithms import flash_swapped as simulated
from iosim.kernels import _device as dev
from iosim.kernels import _trace
from iosim.kernels._register_tiles import SHARED_ALIGN, VEC, Layout, tiles
from iosim.kernels.config import FLOAT32_BYTES, TileConfig

# The iosim algorithm this kernel computes: iosim counts its HBM traffic, the tests compare outputs.
ALGORITHM = simulated.ALGORITHM
BFLOAT16 = False  # the host API hands it float32 or float16 only (kernels.api.Implementation)
# grouped-query attention (k, v with fewer heads than q): its forward reads each query head's K/V head by index
# (kernels.api)
GROUPED_FORWARD = True
SPLITS = False  # its forward does not split K/V (kernels.api: splits= is for split-kv)
SAWTOOTH = True  # its forward can scan K/V backward on odd query blocks (kernels.attention(..., sawtooth=True))

NEG_INF = dev.NEG_INF
ZERO = dev.ZERO
ONE = dev.ONE
LOG2E = np.float32(math.log2(math.e))  # scores are kept in log2 units: exp(x) = exp2(x · log2 e), one MUFU.EX2
LN2 = np.float32(math.log(2.0))

# Tile preferences, tried in order; the first whose shared memory fits is the default.
# 64 × 32 with 4 × 4 per thread: 128 threads, each doing 2,048 FMAs per K/V step at d = 64,
# fed by 8 128-bit shared loads per 64 FMAs of S and 12 per 128 FMAs of P̃V.
FORWARD_TILES = (TileConfig(Br=64, Bc=32, TM=4, TN=4), TileConfig(Br=32, Bc=16, TM=4, TN=2),
                 TileConfig(Br=16, Bc=16, TM=2, TN=2))
# Blocks of the forward kernel per SM that the compiler must make room for. The unrolled d = 64
# step keeps about 250 registers live: 2 blocks (255 registers) compile without spills, 3
# (168) spill inside the step loop (experiments/results/kernels_static_model_sm90.md).
FORWARD_MIN_BLOCKS = 2
BACKWARD_MIN_BLOCKS = 4
BACKWARD_TILES = (TileConfig(Br=32, Bc=32, TM=4, TN=4), TileConfig(Br=16, Bc=16, TM=2, TN=2),
                  TileConfig(Br=8, Bc=8, TM=2, TN=2))


def layout(config: TileConfig, d: int, backward: bool) -> Layout:
    rows, cols = config.tile_rows_cols(backward)
    return Layout(rows=rows, cols=cols, d=d, TM=config.TM, TN=config.TN)


def shared_bytes(config: TileConfig, d: int, backward: bool) -> int:
    """Static shared memory of one thread block, matching the cuda.shared.array calls below."""
    lay = layout(config, d, backward)
    # the row-reduction scratch exists only under the simulator, which has no warp shuffles
    red = lay.rows * lay.TC if dev.simulator_enabled() else 0
    if backward:
        # K_j, V_j, Q_i, dO_i tiles; Pᵀ∘Z and dSᵀ tiles; lse_i and D_i
        return FLOAT32_BYTES * (4 * lay.rows * lay.W + 2 * lay.rows * lay.PW + 2 * lay.cols + red)
    # Q_i, K_j, V_j tiles; P̃_ij tile
    return FLOAT32_BYTES * ((lay.rows + 2 * lay.cols) * lay.W + lay.rows * lay.PW + red)


def check_config(config, d: int, backward: bool) -> None:
    """Raise naming `config` or `d` when this tiling cannot run this kernel for head dim d."""
    if not isinstance(config, TileConfig):
        raise TypeError(f"config must be a kernels.TileConfig; got {config!r}")
    config.check(d, backward, shared_bytes(config, d, backward))
    for problem in layout(config, d, backward).problems():
        raise ValueError(f"config {config}: {problem}")


@cuda.jit(device=True)
def lse_from_log2(m2, l):
    """lse = ln 2 · (m₂ + log₂ ℓ) for a row max m₂ in log2 units, or −inf for a row that saw no key."""
    if l > ZERO:
        return LN2 * (m2 + math.log2(l))
    return NEG_INF


@functools.cache
def forward_kernel(d: int, config: TileConfig, causal: bool, dropout: bool, splits: int = 1, packed: bool = False,
                   sawtooth: bool = False, trace: bool = False):
    """Compile-time specialised forward kernel: grid (batch·heads · T_r,), block config.threads().

    q, out are flat (batch·heads·N_q·d) arrays and k, v flat (batch·heads·N_k·d), so every
    address is a base plus a constant offset.

    ``splits`` and ``packed`` make it the first kernel of split-KV decoding (kernels/split_kv.py), both fixed at
    compile time, so that the defaults compile to flash-swapped's kernel as it was. ``packed``: q is
    (batch·kv_heads, G·N_q, d), the G = ``group`` query heads of a K/V head as G·N_q rows of one head, and n_q is
    N_q of one query head (positions, the causal mask and dropout's head index follow row g·N_q + r back to query
    r of head kvh·G + g); the causal end of the K/V loop is not taken (a packed block holds every position).
    ``splits`` = S > 1: grid (heads · S · T_r,), block (h·S + s)·T_r + i, as iosim.gpu.grids.split_kv.split; split s
    visits ``split_kv.deal(range(T_c), S, s)``'s key blocks and writes its partial O_s (normalised by its own ℓ)
    and lse_s to out, lse at rows (h·S + s)·rows + r, out in float32 (a split that gets no key block writes
    O_s = 0, lse_s = −inf).

    ``sawtooth``: odd query blocks visit their key blocks last to first (the "sawtooth" order of arXiv
    2601.16032), so that a block starts on the K_j, V_j its even predecessor ended on; the online softmax gives
    the same attention in any order. ``iosim.gpu.grids.flash_swapped.forward(..., sawtooth=True)`` declares its grid.

    ``trace``: the kernel takes one more argument, a uint64 array of 3 words per block, where thread 0 of each block
    writes its SM, its start and its end time (kernels/_trace.py); the block's work is the untraced kernel's, one
    device function inlined into both.
    """
    lay = layout(config, d, False)
    t = tiles(lay)
    Br, Bc, TM, TN, TC, G = config.Br, config.Bc, config.TM, config.TN, lay.TC, lay.G
    W, PW, LANES = lay.W, lay.PW, lay.copy_lanes
    ACC_COLS = VEC * G
    RED_ROWS, RED_COLS = (Br, TC) if dev.simulator_enabled() else (1, 1)
    SPLIT_COUNT, PACKED, REVERSE_ODD = splits, packed, sawtooth

    @cuda.jit(device=True)
    def query(row, n_q):
        """The query position of tile row ``row``: itself, or r of packed row g·N_q + r."""
        if PACKED:
            return row % n_q
        return row

    @cuda.jit(device=True)
    def query_head(bh, group, row, n_q):
        """The query head of tile row ``row`` of head bh: bh, or kvh·G + g of packed row g·N_q + r of K/V head bh."""
        if PACKED:
            return bh * group + row // n_q
        return bh

    @cuda.jit(device=True)
    def softmax_step(s, acc, m_i, l_i, mx, P_s, red, r0, tx, row, col, n_q, n_k, bh, group,
                     seed_lo, seed_hi, threshold, inv_keep):
        """Alg. 2 lines 11-14 on this thread's micro-tile, FlashAttention-2 style (O unnormalised).

        s (TM, TN) holds S_ij in log2 units. MASK it, take m_new = max(m_i, rowmax S_ij),
        rescale ℓ_i and O_i by 2^(m_i − m_new), and write P̃_ij = 2^(S_ij − m_new) (times
        the dropout mask) to P_s; ℓ_i gains this thread's share of rowsum(P̃_ij).
        """
        for a in range(TM):
            mx[a] = m_i[a]
            for b in range(TN):
                if not dev.visible(query(row + a, n_q), col + TC * b, n_q, n_k, causal):  # line 11: MASK
                    s[a, b] = NEG_INF
                mx[a] = max(mx[a], s[a, b])
        t.row_max(mx, red, r0, tx)  # line 12 and 13: m_new = max(m_i, rowmax(S_ij))
        for a in range(TM):
            m_use = dev.safe_max(mx[a])
            alpha = math.exp2(m_i[a] - m_use)
            m_i[a] = mx[a]
            l_i[a] *= alpha
            for f in range(ACC_COLS):
                acc[a, f] *= alpha
            for b in range(TN):
                p = math.exp2(s[a, b] - m_use)
                l_i[a] += p
                if dropout:  # line 14
                    p *= dev.dropout_scale(seed_lo, seed_hi, threshold, inv_keep, query_head(bh, group, row + a, n_q),
                                           query(row + a, n_q), col + TC * b)
                P_s[r0 + a, tx + TC * b] = p

    @cuda.jit(device=True, **dev.inline_options())
    def attend(q, k, v, out, lse, n_q, n_k, group, tau, seed_lo, seed_hi, threshold, inv_keep):
        rows = n_q * group if PACKED else n_q  # query rows of a head: a packed head holds its group's G·N_q
        Tr = (rows + Br - 1) // Br
        unit = cuda.blockIdx.x // Tr  # (head, split) h·S + s
        i = cuda.blockIdx.x - unit * Tr
        bh = unit // SPLIT_COUNT
        split = unit - bh * SPLIT_COUNT
        kvh = bh if PACKED else bh // group  # grouped-query attention: the K/V head of this query head
        tid = cuda.threadIdx.x
        ty = tid // TC
        tx = tid - ty * TC
        r0 = ty * TM  # first tile row of this thread
        row0 = i * Br  # first query row of the block
        cr = tid // LANES  # this thread's place in the copy grid
        cc = tid - cr * LANES

        Q_s = cuda.shared.array((Br, W), float32, alignment=SHARED_ALIGN)
        K_s = cuda.shared.array((Bc, W), float32, alignment=SHARED_ALIGN)
        V_s = cuda.shared.array((Bc, W), float32, alignment=SHARED_ALIGN)
        P_s = cuda.shared.array((Br, PW), float32, alignment=SHARED_ALIGN)
        red = cuda.shared.array((RED_ROWS, RED_COLS), float32)  # the simulator's row reductions

        s = cuda.local.array((TM, TN), float32)  # this thread's part of S_ij
        acc = cuda.local.array((TM, ACC_COLS), float32)  # unnormalised O_i, columns 4(tx + TC·g) + w
        m_i = cuda.local.array(TM, float32)  # running row max, log2 units
        l_i = cuda.local.array(TM, float32)  # partial ℓ_i over this thread's columns
        mx = cuda.local.array(TM, float32)

        # Alg. 1 line 2 (on chip): O_i = 0, ℓ_i = 0, m_i = −inf
        dev.zero_tile(acc)
        for a in range(TM):
            m_i[a] = NEG_INF
            l_i[a] = ZERO
        # Alg. 1 line 8, hoisted out of the K/V loop: Q_i, pre-scaled by tau·log2 e
        for tile in (Q_s, K_s, V_s):
            t.zero_padding(tile, cr, cc)
        t.load_row_tile(Q_s, q, bh * rows + row0, rows - row0, tau * LOG2E, cr, cc)

        Tc = (n_k + Bc - 1) // Bc
        j_first = 0
        if SPLIT_COUNT > 1:  # split s's share of the key blocks, split_kv.deal(range(T_c), S, s)
            per = Tc // SPLIT_COUNT
            extra = Tc - per * SPLIT_COUNT
            j_first = split * per + min(split, extra)
            Tc = j_first + per + (1 if split < extra else 0)
        if causal and SPLIT_COUNT == 1 and not PACKED:
            # the block's last row sees keys up to last_row + N_k − N_q; later blocks are all masked
            last_key = min(row0 + Br, n_q) - 1 + (n_k - n_q)
            Tc = min(Tc, (last_key + Bc) // Bc) if last_key >= 0 else 0
        for step in range(j_first, Tc):
            j = step
            if REVERSE_ODD and i % 2 == 1:  # odd query blocks scan K/V backward
                j = Tc - 1 - (step - j_first)
            col0 = j * Bc
            cuda.syncthreads()  # the previous step's readers of K_s, V_s, P_s are done
            t.load_col_tile(K_s, k, kvh * n_k + col0, n_k - col0, ONE, cr, cc)  # Alg. 1 line 6
            t.load_col_tile(V_s, v, kvh * n_k + col0, n_k - col0, ONE, cr, cc)
            cuda.syncthreads()

            # Alg. 2 line 10: S_ij = tau Q_i K_jᵀ, (TM, TN) per thread
            dev.zero_tile(s)
            t.rows_dot_rows(s, Q_s, r0, K_s, tx)
            softmax_step(s, acc, m_i, l_i, mx, P_s, red, r0, tx, row0 + r0, col0 + tx, n_q, n_k, bh, group,
                         seed_lo, seed_hi, threshold, inv_keep)
            cuda.syncthreads()
            # Alg. 2 line 15 (unnormalised): O_i += P̃_ij^dropped V_j
            t.rows_dot_cols(acc, P_s, r0, V_s, tx)

        # Epilogue: ℓ_i = Σ over the row's TC threads, O_i = diag(ℓ_i)⁻¹ O_i, lse_i = m_i + log ℓ_i
        t.row_sum(l_i, red, r0, tx)
        for a in range(TM):
            inv_l = ONE / l_i[a] if l_i[a] > ZERO else ZERO
            for f in range(ACC_COLS):
                acc[a, f] *= inv_l
            row = row0 + r0 + a
            if tx == 0 and row < rows:
                lse[unit * rows + row] = lse_from_log2(m_i[a], l_i[a])
        t.store_acc(out, acc, unit * rows + row0, rows - row0, ONE, r0, tx)

    if trace:
        @cuda.jit(**dev.launch_bounds(lay.threads, FORWARD_MIN_BLOCKS))
        def traced(q, k, v, out, lse, n_q, n_k, group, tau, seed_lo, seed_hi, threshold, inv_keep, stamps):
            start = _trace.global_timer()
            attend(q, k, v, out, lse, n_q, n_k, group, tau, seed_lo, seed_hi, threshold, inv_keep)
            cuda.syncthreads()
            _trace.stamp(stamps, cuda.blockIdx.x, start)

        return traced

    @cuda.jit(**dev.launch_bounds(lay.threads, FORWARD_MIN_BLOCKS))
    def kernel(q, k, v, out, lse, n_q, n_k, group, tau, seed_lo, seed_hi, threshold, inv_keep):
        attend(q, k, v, out, lse, n_q, n_k, group, tau, seed_lo, seed_hi, threshold, inv_keep)

    return kernel


@functools.cache
def backward_kernel(d: int, config: TileConfig, causal: bool, dropout: bool):
    """Compile-time specialised backward kernel: grid (batch·heads · T_c,), block config.threads(True).

    The tile is B keys × B queries (B = Br = Bc); thread rows are keys for Sᵀ, Pᵀ, dV, dK
    and queries for dQ. Arrays are flat, as in `forward_kernel`.
    """
    lay = layout(config, d, True)
    t = tiles(lay)
    B, TM, TN, TC, G = config.Br, config.TM, config.TN, lay.TC, lay.G
    W, PW, LANES = lay.W, lay.PW, lay.copy_lanes
    ACC_COLS = VEC * G

    @cuda.jit(device=True)
    def probabilities(s, dp, PT_s, dST_s, lse_s, D_s, r0, tx, key, query, n_q, n_k, tau2, bh,
                      seed_lo, seed_hi, threshold, inv_keep):
        """Alg. 4 lines 12-20 on one thread's micro-tile of the transposed (keys × queries) tile.

        In: s = K_j Q_iᵀ and dp = V_j dO_iᵀ for keys key + a and queries query + TC·b, lse_s
        in log2 units. Out, in shared memory: PT_s = (P_ij ∘ Z_ij)ᵀ and
        dST_s = (P_ij ∘ (dP_ij ∘ Z_ij − D_i))ᵀ at tile positions [r0 + a, tx + TC·b].
        """
        for a in range(TM):
            for b in range(TN):
                c = tx + TC * b
                p = ZERO
                if dev.visible(query + TC * b, key + a, n_q, n_k, causal):  # line 12: MASK
                    p = math.exp2(s[a, b] * tau2 - lse_s[c])  # line 13, with lse = m + log ℓ
                z = ONE
                if dropout:  # line 14
                    z = dev.dropout_scale(seed_lo, seed_hi, threshold, inv_keep, bh, query + TC * b, key + a)
                PT_s[r0 + a, c] = p * z  # line 15
                dST_s[r0 + a, c] = p * (dp[a, b] * z - D_s[c])  # lines 18 and 20

    @cuda.jit(**dev.launch_bounds(lay.threads, BACKWARD_MIN_BLOCKS))
    def kernel(q, k, v, do, lse, big_d, dq_acc, dk, dv, n_q, n_k, tau, seed_lo, seed_hi, threshold, inv_keep):
        Tc = (n_k + B - 1) // B
        Tr = (n_q + B - 1) // B
        bh = cuda.blockIdx.x // Tc
        j = cuda.blockIdx.x - bh * Tc
        tid = cuda.threadIdx.x
        ty = tid // TC
        tx = tid - ty * TC
        r0 = ty * TM
        col0 = j * B  # first key of the block
        cr = tid // LANES  # this thread's place in the copy grid
        cc = tid - cr * LANES

        K_s = cuda.shared.array((B, W), float32, alignment=SHARED_ALIGN)
        V_s = cuda.shared.array((B, W), float32, alignment=SHARED_ALIGN)
        Q_s = cuda.shared.array((B, W), float32, alignment=SHARED_ALIGN)
        dO_s = cuda.shared.array((B, W), float32, alignment=SHARED_ALIGN)
        PT_s = cuda.shared.array((B, PW), float32, alignment=SHARED_ALIGN)  # (P_ij ∘ Z_ij)ᵀ, keys × queries
        dST_s = cuda.shared.array((B, PW), float32, alignment=SHARED_ALIGN)  # dS_ijᵀ
        lse_s = cuda.shared.array(B, float32)  # log2 units
        D_s = cuda.shared.array(B, float32)

        s = cuda.local.array((TM, TN), float32)  # S_ijᵀ / tau
        dp = cuda.local.array((TM, TN), float32)  # dP_ijᵀ before dropout
        dk_acc = cuda.local.array((TM, ACC_COLS), float32)
        dv_acc = cuda.local.array((TM, ACC_COLS), float32)
        dq_t = cuda.local.array((TM, ACC_COLS), float32)

        # Alg. 4 lines 7-8: K_j, V_j to shared memory, dK_j = dV_j = 0 on chip
        for tile in (K_s, V_s, Q_s, dO_s):
            t.zero_padding(tile, cr, cc)
        t.load_row_tile(K_s, k, bh * n_k + col0, n_k - col0, ONE, cr, cc)
        t.load_row_tile(V_s, v, bh * n_k + col0, n_k - col0, ONE, cr, cc)
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
            t.load_col_tile(Q_s, q, bh * n_q + row0, n_q - row0, ONE, cr, cc)
            t.load_col_tile(dO_s, do, bh * n_q + row0, n_q - row0, ONE, cr, cc)
            t.load_vector(lse_s, lse, bh * n_q + row0, n_q - row0, LOG2E, ZERO)
            t.load_vector(D_s, big_d, bh * n_q + row0, n_q - row0, ONE, ZERO)
            cuda.syncthreads()

            # Alg. 4 line 11: S_ijᵀ = K_j Q_iᵀ; line 17: dP_ijᵀ = V_j dO_iᵀ
            dev.zero_tile(s)
            t.rows_dot_rows(s, K_s, r0, Q_s, tx)
            dev.zero_tile(dp)
            t.rows_dot_rows(dp, V_s, r0, dO_s, tx)
            # lines 12-20: MASK, P_ij, Z_ij, (P∘Z)ᵀ and dSᵀ into shared memory
            probabilities(s, dp, PT_s, dST_s, lse_s, D_s, r0, tx, col0 + r0, row0 + tx, n_q, n_k, tau * LOG2E, bh,
                          seed_lo, seed_hi, threshold, inv_keep)
            cuda.syncthreads()

            t.rows_dot_cols(dv_acc, PT_s, r0, dO_s, tx)  # line 16: dV_j += (P∘Z)ᵀ dO_i
            t.rows_dot_cols(dk_acc, dST_s, r0, Q_s, tx)  # line 22 (tau applied at line 24)
            # line 21: dQ_i += tau dS_ij K_j; here this thread's rows are queries r0 + a
            dev.zero_tile(dq_t)
            t.cols_dot_cols(dq_t, dST_s, r0, K_s, tx)
            t.add_acc(dq_acc, dq_t, bh * n_q + row0, n_q - row0, tau, r0, tx)

        # Alg. 4 line 24: write dK_j, dV_j
        t.store_acc(dk, dk_acc, bh * n_k + col0, n_k - col0, tau, r0, tx)
        t.store_acc(dv, dv_acc, bh * n_k + col0, n_k - col0, ONE, r0, tx)

    return kernel


def forward(q, k, v, *, tau: float, causal: bool, dropout, config: TileConfig, sawtooth: bool = False,
            stamps=None):
    """O and lse of attention on device arrays q (bh, N_q, d), k, v (b·kv_heads, N_k, d).

    Under grouped-query attention each group of bh / (b·kv_heads) consecutive query heads reads one K/V head,
    by its index, with one thread block per (query block, query head) as without groups (per-head blocks: a
    group's blocks share its K_j, V_j only in the L2). ``sawtooth``: odd query blocks scan K/V backward. Returns
    (out (bh, N_q, d) in q's dtype, lse (bh, N_q) float32). Inputs are checked by kernels.api before this is called.
    ``stamps``: a device uint64 array of 3 words per block (`blocks`), run the traced kernel, which fills it with each
    block's SM, start and end time (kernels/_trace.py).
    """
    n_bh, n_q, d = q.shape
    n_k = k.shape[1]
    group = n_bh // k.shape[0]
    out = cuda.device_array((n_bh, n_q, d), dtype=q.dtype)
    lse = cuda.device_array((n_bh, n_q), dtype=np.float32)
    traced = stamps is not None
    kernel = forward_kernel(d, config, bool(causal), dropout.enabled, sawtooth=bool(sawtooth), trace=traced)
    args = (flat(q), flat(k), flat(v), flat(out), flat(lse), n_q, n_k, group, np.float32(tau), *dropout.kernel_args())
    grid = blocks(n_bh, n_q, config)
    if traced:
        if stamps.shape != (_trace.STAMPS_PER_BLOCK * grid,):
            raise ValueError(f"stamps: shape {stamps.shape}, needs ({_trace.STAMPS_PER_BLOCK} · blocks,) = "
                             f"({_trace.STAMPS_PER_BLOCK * grid},)")
        args += (stamps,)
    kernel[grid, config.threads()](*args)
    return out, lse


def blocks(n_bh: int, n_q: int, config: TileConfig) -> int:
    """Thread blocks of the forward grid: one per (batch·head, query block)."""
    return n_bh * -(-n_q // config.Br)


def flat(x):
    """A contiguous device array as one dimension, so that kernels compute addresses from constants."""
    return x.reshape(x.size)


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
        flat(q), flat(k), flat(v), flat(dout), flat(lse), flat(big_d), flat(dq_acc), flat(dk), flat(dv),
        n_q, n_k, np.float32(tau), *dropout.kernel_args()
    )
    if q.dtype == np.float32:
        return dq_acc, dk, dv
    dq = cuda.device_array((n_bh, n_q, d), dtype=q.dtype)
    dev.cast_kernel[dev.grid_stride_launch(n_bh * n_q * d)](dq_acc, dq)
    return dq, dk, dv
