"""flash-swapped-tc: flash-swapped's forward and backward with every product on tensor cores.

The loop orders, HBM traffic and outputs are flash-swapped's (FlashAttention-2). Forward:
one thread block per (batch·head, query block Q_i) keeps Q_i, O_i, m_i and ℓ_i on chip
while K_j, V_j stream through shared memory. Backward: one block per (batch·head, key
block K_j) keeps K_j, V_j, dK_j and dV_j on chip while Q_i, dO_i stream through, and adds
dQ_i into a float32 buffer with atomics. Every product runs as warp-wide mma.sync.m16n8k16
(kernels/_mma.py: float16 or bfloat16 operands, float32 accumulation; a fragment-exact
Python twin under the simulator). bfloat16, which numpy lacks, travels as uint16 bit
patterns (kernels.bfloat16).

Forward. Everything a warp computes stays in its registers, as in FlashAttention-2. Each
of the block's WARPS warps owns 16 query rows and holds
  - Q_i's A fragments, loaded once from HBM (16 × d, d padded to a multiple of 16 with zeros);
  - S_ij as C fragments (16 × B_c), which the softmax works on in place: a lane's values
    lie on two rows, so the row max and sum combine the four lanes of a quad with warp
    shuffles, and the C fragments of two adjacent n8 tiles are exactly the A fragment of
    one k16 chunk of P̃_ij, so P̃_ij goes from softmax to product without leaving registers;
  - O_i as C fragments (16 × d), rescaled and accumulated in place.
K_j and V_j sit in shared memory as 32-bit words of two halves (kernels/_tc_tiles.py: rows
padded so that ldmatrix reads them without bank conflicts). One `ldmatrix.x4` gives the B
fragments of two n8 tiles of K_jᵀ, and one `ldmatrix.x4.trans` those of two n8 tiles of
V_j, whose key pairs lie on different rows. The next step's K_j, V_j are fetched from HBM into registers
(64-bit word pairs where d is a multiple of 4) while this step computes, and stored to
shared memory at the start of the next. Key blocks that need no mask (full, and wholly
below the causal diagonal) run a step without the mask test; the rest (at most
⌈B_r/B_c⌉ + 1 per query block) run it with it.

Backward. Each of the block's warps owns 16 keys and holds their dK_j, dV_j as C
fragments. Per query block: Sᵀ = K_j Q_iᵀ and dPᵀ = V_j dO_iᵀ as C fragments, Alg. 4
lines 12-20 on them in registers, then dV_j += (P∘Z)ᵀ dO_i and dK_j += dSᵀ Q_i with those
C fragments as A fragments; dSᵀ goes through shared memory, from which dQ_i += tau dS K_j
is split over the warps by 16-query tile and pairs of n8 column tiles. Query blocks that
need no mask run first, without the mask test.

Deviations from Algorithms 1/2 and 4, beyond flash-swapped's (O unnormalised until the end,
lse = m + log ℓ written instead of m and ℓ, log2 units, causal blocks skipped):
- P̃_ij is rounded to the input type (float16 or bfloat16) for the P̃V product, as
  FlashAttention does; ℓ_i sums the float32 values, each lane its own columns until the
  end.
- The backward rounds P∘Z and dS to the input type for its products, and computes
  D = rowsum(dO ∘ O) in a small kernel before, from the 16-bit dO and O.
- float32 inputs run flash-swapped's CUDA-core kernels (the tensor cores take float16 and
  bfloat16 only), and so does a float16 backward at a head dim whose tensor-core tiles
  overflow shared memory (d > 128; bfloat16 raises there, naming d).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from numba import cuda, float32, uint32

from iosim.kernels import _device as dev
from iosim.kernels import _mma as mma
from iosim.kernels import _tc_tiles as tc
from iosim.kernels import flash_swapped
from iosim.kernels._register_tiles import unrolled
from iosim.kernels.config import STATIC_SHARED_LIMIT

# The iosim algorithm this kernel computes: iosim counts its HBM traffic, the tests compare outputs.
ALGORITHM = flash_swapped.ALGORITHM

BFLOAT16 = True  # the host API may hand this implementation bfloat16 (kernels.api)
# grouped-query attention (k, v with fewer heads than q): its 16-bit kernels index K/V by the query head
GROUPED_FORWARD = False
SPLITS = False  # its forward does not split K/V (kernels.api: splits= is for split-kv)
SAWTOOTH = False  # one K/V order (kernels.api: sawtooth= is for flash-swapped)
WARPS = tc.WARPS  # each owning one m16 row tile of Q_i
THREADS = tc.THREADS
BR = mma.M * WARPS  # 64 query rows per block
BC_CHOICES = (64, 32)  # keys per K/V step, the largest that fits registers and shared memory
MAX_SCORE_FLOATS = 64 * 64  # B_c · d_padded at most: S_ij's and O_i's fragments share a thread's registers
MIN_BLOCKS = 2  # blocks per SM the compiler must make room for (at most 255 registers a thread)

# The tilings of the float32 forward and of the backward, which are flash-swapped's.
FORWARD_TILES = flash_swapped.FORWARD_TILES
BACKWARD_TILES = flash_swapped.BACKWARD_TILES

NEG_INF = dev.NEG_INF
POS_INF = np.float32(np.inf)
ZERO = dev.ZERO
ONE = dev.ONE
LOG2E = flash_swapped.LOG2E
padded_head_dim = tc.padded_head_dim
paired_words = tc.paired_words

# The forward's online-softmax state, one float32 array of 4 per lane: entry M_I + h holds m_i
# of the lane's row (h = 0) or row + 8 (h = 1), in log2 units; entry L_I + h their ℓ_i, summed
# over this lane's columns only until the epilogue adds up the quad.
M_I = 0
L_I = 2
STATE = 4


class ForwardRegisters(NamedTuple):
    """What a lane of the forward keeps in registers across K/V steps."""

    q_frag: object  # (KD, 4) uint32: Q_i's A fragments, one per k16 chunk
    s: object  # (NS, 4) float32: S_ij, then P̃_ij
    o: object  # (NO, 4) float32: O_i, n8 tile t holding columns 8t … 8t + 7
    state: object  # (STATE,) float32: m_i at M_I, ℓ_i at L_I
    m_use: object  # (2,) float32: this step's row maxima as subtracted (0 for a row that saw no key)
    k_buf: object  # the next K_j on its way to shared memory
    v_buf: object  # the next V_j


class ForwardShared(NamedTuple):
    """The forward's shared memory and the addresses this lane names to ldmatrix in it (kernels/_tc_tiles.py)."""

    K_s: object  # (B_c, row words) uint32
    V_s: object
    red: object  # the simulator's quad reductions
    scratch: object  # the simulator's fragment exchange
    k_as_b: object  # K_j's row for Kᵀ's B fragments (PAIR_OF_TILES, untransposed)
    v_as_b: object  # V_j's row for V's B fragments (ONE_TILE, transposed)


class BackwardRegisters(NamedTuple):
    """What a lane of the backward keeps in registers: this step's fragments, its key block's gradients."""

    s: object  # (NQ, 4) float32: Sᵀ, then (P ∘ Z)ᵀ
    dp: object  # (NQ, 4) float32: dPᵀ, then dSᵀ
    dk: object  # (NO, 4) float32: dK_j / tau
    dv: object  # (NO, 4) float32: dV_j
    dq: object  # (DQ_TILES, 4) float32: this warp's share of the step's dQ_i
    q_buf: object  # Q_i on its way to shared memory
    do_buf: object  # dO_i


class BackwardShared(NamedTuple):
    """The backward's shared memory."""

    K_s: object  # (B_c, row words) uint32
    V_s: object
    Q_s: object  # (B_r, row words) uint32
    dO_s: object
    dST_s: object  # (B_c, query words) uint32: dS_ijᵀ, keys × query pairs
    lse_s: object  # (B_r,) float32, log2 units
    D_s: object  # (B_r,) float32
    scratch: object  # the simulator's fragment exchange


class BackwardOperands(NamedTuple):
    """The shared addresses this lane names to ldmatrix, one per operand of the backward's products.

    "as a" / "as b": the fragment the load fills; "trans": loaded with ldmatrix.trans (the
    tile's rows are the operand's k). Patterns from kernels/_tc_tiles.py.
    """

    k_as_a: object  # K_j, this warp's 16 keys (ONE_TILE): A of Sᵀ = K_j Q_iᵀ
    v_as_a: object  # V_j, the same keys: A of dPᵀ = V_j dO_iᵀ
    q_as_b: object  # Q_i (PAIR_OF_TILES): B fragments of Q_iᵀ
    do_as_b: object  # dO_i: B fragments of dO_iᵀ
    q_as_b_trans: object  # Q_i (ONE_TILE, transposed): B of dK_j += dSᵀ Q_i
    do_as_b_trans: object  # dO_i: B of dV_j += (P∘Z)ᵀ dO_i
    k_as_b_trans: object  # K_j: B of dQ_i += dS K_j
    ds_as_a_trans: object  # dSᵀ (PAIR_OF_TILES, transposed): A fragments of dS


class BackwardInputs(NamedTuple):
    """The backward's flat HBM arrays that a query step reads, and dQ's float32 buffer it adds to."""

    q: object
    do: object
    lse: object
    big_d: object  # D = rowsum(dO ∘ O)
    dq_acc: object


def keys_per_step(d: int) -> int:
    """B_c: 64 keys per step up to d = 64, 32 above, where O_i's fragments take the registers that S_ij's
    would need (64 keys at d = 128 spill in the step loop on sm_90); 32 too where 64 overflow shared memory."""
    for bc in BC_CHOICES:
        if bc <= MAX_SCORE_FLOATS // padded_head_dim(d) and 2 * tc.tile_bytes(bc, d) <= STATIC_SHARED_LIMIT:
            return bc
    return BC_CHOICES[-1]


def tc_shared_bytes(d: int) -> int:
    """Static shared memory of the tensor-core forward on a GPU: K_j and V_j as words."""
    return 2 * tc.tile_bytes(keys_per_step(d), d)


def check_config(config, d: int, backward: bool) -> None:
    """Raise naming `config` or `d` when this head dim cannot run (config tiles the CUDA-core paths)."""
    flash_swapped.check_config(config, d, backward)
    if not backward and tc_shared_bytes(d) > STATIC_SHARED_LIMIT:
        raise ValueError(
            f"d={d}: the tensor-core forward needs {tc_shared_bytes(d)} bytes of shared memory "
            f"(K_j, V_j as words at d padded to {padded_head_dim(d)}, {BC_CHOICES[-1]} keys), "
            f"more than {STATIC_SHARED_LIMIT}"
        )


def mma_per_step(d: int) -> int:
    """mma.sync instructions a warp issues per K/V step: S_ij's n8 tiles × k16 chunks, then P̃_ij V_j's."""
    bc, dp = keys_per_step(d), padded_head_dim(d)
    return (bc // mma.N) * (dp // mma.K) + (bc // mma.K) * (dp // mma.N)


@functools.cache
def forward_kernel(d: int, causal: bool, dropout: bool, dtype: str = "float16", negative_scale: bool = False):
    """Tensor-core forward for head dim d: grid (batch·heads · T_r,), block THREADS, T_r = ⌈N_q/64⌉.

    q, k, v are flat arrays of uint64 word pairs (four halves each) when d is a multiple of 4, else flat
    arrays of halves (float16 for dtype="float16", uint16 bfloat16 bit patterns for
    "bfloat16"); out is a flat array of halves, lse a flat float32 array. negative_scale
    compiles the kernel for tau < 0, whose row maxima of tau·S come from row minima of Q Kᵀ.
    """
    h = tc.halves(dtype)
    store, a_from_c, mma_pair = h.store, h.a_from_c, h.mma_pair
    word = tc.word_reader(d, dtype)
    DP = padded_head_dim(d)
    SW = tc.row_words(d)
    BC = keys_per_step(d)
    KD = DP // mma.K  # k16 chunks of Q_i K_jᵀ
    NS = BC // mma.N  # n8 tiles of S_ij per warp
    KP = BC // mma.K  # k16 chunks of P̃_ij V_j
    NO = DP // mma.N  # n8 tiles of O_i per warp
    LANES = tc.copy_lanes(d)
    copy = tc.tile_copy(d, dtype, BC)
    fetch, put = copy.fetch, copy.put
    BUFFERED, UNIT = copy.buffered, copy.unit
    RED, SCRATCH = tc.RED, tc.SCRATCH  # closure constants: numba sizes shared arrays only from those
    NEGATIVE = negative_scale
    FAR = POS_INF if NEGATIVE else NEG_INF  # the score that scales to −inf
    inline = dev.inline_options()

    @cuda.jit(device=True, **inline)
    def extreme(x, red, tid, slot):
        """The max of x over this lane's quad, or the min where the scale is negative."""
        if NEGATIVE:
            return -tc.quad_max(-x, red, tid, slot)
        return tc.quad_max(x, red, tid, slot)

    @cuda.jit(device=True, **inline)
    def tile_probabilities(t, s, state, m_use, scale, bh, row, col, draw):
        """Line 14 on S tile t (keys col + 8t, col + 8t + 1 of rows row, row + 8): P̃ in place, ℓ in state[L_I:].

        s holds Q_i K_jᵀ unscaled: the scale enters with the subtraction, one FFMA per score.
        """
        for u in range(4):
            p = mma.exp2(s[t, u] * scale - m_use[u // 2])
            state[L_I + u // 2] += p
            if dropout:
                p *= dev.dropout_scale(draw.seed_lo, draw.seed_hi, draw.threshold, draw.inv_keep, bh,
                                       row + 8 * (u // 2), col + mma.N * t + u % 2)
            s[t, u] = p

    # unrolled by hand: with the dropout draws inside, LLVM keeps the tile loop and S in local memory
    probabilities = unrolled(tile_probabilities, range(NS))

    def make_step(masked):
        """One K/V step, with the mask test (masked) or without it (blocks every row sees whole)."""

        @cuda.jit(device=True, **inline)
        def step(j, regs, smem, k, v, bh, n_q, n_k, keys_end, row, scale, place, draw):
            """Alg. 2 lines 6-15 for key block j: regs (ForwardRegisters) and smem (ForwardShared) in place.

            K_j, V_j arrive in regs' buffers, fetched during the previous step; this step fetches
            K_{j+1}, V_{j+1} (up to keys_end). place is the lane's tc.Place, draw its dev.DropoutArgs.
            """
            q_frag, s, o, state, m_use, k_buf, v_buf = regs
            K_s, V_s, red, scratch, k_as_b, v_as_b = smem
            tid, qd, cr, cc = place.tid, place.qd, place.cr, place.cc
            col0 = j * BC
            cuda.syncthreads()  # the previous step's readers of K_s, V_s are done
            put(K_s, k_buf, cr, cc)  # Alg. 1 line 6, fetched during the previous step
            put(V_s, v_buf, cr, cc)
            cuda.syncthreads()
            # K_{j+1}, V_{j+1} into registers: the loads are in flight while this step computes
            fetch(k_buf, k, bh * n_k + col0 + BC, keys_end - col0 - BC, cr, cc)
            fetch(v_buf, v, bh * n_k + col0 + BC, keys_end - col0 - BC, cr, cc)

            # Alg. 2 line 10: S_ij = tau Q_i K_jᵀ, one 16 × 8 C fragment per n8 tile of keys. B(k, n) =
            # K_j[n, k]: one ldmatrix gives B fragments (b0, b1) of tiles 2P and 2P + 1 for chunk kc
            for P in range(NS // 2):
                for u in range(4):
                    s[2 * P, u] = ZERO
                    s[2 * P + 1, u] = ZERO
                for kc in range(KD):
                    b0, b1, c0, c1 = mma.ldmatrix_x4(K_s, k_as_b, 2 * mma.N * P * SW + 8 * kc, scratch)
                    mma_pair(s, 2 * P, q_frag[kc, 0], q_frag[kc, 1], q_frag[kc, 2], q_frag[kc, 3], b0, b1, c0, c1,
                             scratch)

            # Alg. 2 lines 11-13 on rows row (values 0, 1) and row + 8 (values 2, 3). The row max of
            # tau·S in log2 units is scale times the max of Q_i K_jᵀ, or its min where scale < 0; a
            # masked score is the value that scales to −inf
            e_0 = FAR
            e_1 = FAR
            for t in range(NS):
                if masked:
                    for u in range(4):
                        if not dev.visible(row + 8 * (u // 2), col0 + mma.N * t + 2 * qd + u % 2,
                                           n_q, n_k, causal):  # line 11
                            s[t, u] = FAR
                if NEGATIVE:
                    e_0 = min(e_0, min(s[t, 0], s[t, 1]))
                    e_1 = min(e_1, min(s[t, 2], s[t, 3]))
                else:
                    e_0 = max(e_0, max(s[t, 0], s[t, 1]))
                    e_1 = max(e_1, max(s[t, 2], s[t, 3]))
            m_0 = max(state[M_I], extreme(e_0, red, tid, 0) * scale)
            m_1 = max(state[M_I + 1], extreme(e_1, red, tid, 1) * scale)
            use_0 = dev.safe_max(m_0)
            use_1 = dev.safe_max(m_1)
            alpha_0 = mma.exp2(state[M_I] - use_0)
            alpha_1 = mma.exp2(state[M_I + 1] - use_1)
            state[M_I] = m_0
            state[M_I + 1] = m_1
            l_0 = state[L_I] * alpha_0
            l_1 = state[L_I + 1] * alpha_1
            for t in range(NO):  # line 15's diag(alpha) O_i
                o[t, 0] *= alpha_0
                o[t, 1] *= alpha_0
                o[t, 2] *= alpha_1
                o[t, 3] *= alpha_1
            # line 14: P̃_ij = 2^(S_ij − m_new) (∘ Z); ℓ_i gains the undropped values
            state[L_I] = l_0
            state[L_I + 1] = l_1
            m_use[0] = use_0
            m_use[1] = use_1
            probabilities(s, state, m_use, scale, bh, row, col0 + 2 * qd, draw)

            # Alg. 2 line 15 (unnormalised): O_i += P̃_ij V_j. The C fragments of S tiles 2kc and
            # 2kc + 1 are the A fragment of key chunk kc. B(k, n) = V_j[k, n]: one transposing
            # ldmatrix gives B fragments (b0, b1) of O tiles 2T and 2T + 1 for chunk kc
            for kc in range(KP):
                a0, a1, a2, a3 = a_from_c(s, kc)
                for T in range(NO // 2):
                    b0, b1, c0, c1 = mma.ldmatrix_x4_trans(V_s, v_as_b, mma.K * kc * SW + 8 * T, scratch)
                    mma_pair(o, 2 * T, a0, a1, a2, a3, b0, b1, c0, c1, scratch)

        return step

    plain_step = make_step(False)
    masked_step = make_step(True)

    @cuda.jit(**dev.launch_bounds(THREADS, MIN_BLOCKS))
    def kernel(q, k, v, out, lse, n_q, n_k, tau, seed_lo, seed_hi, threshold, inv_keep):
        Tr = (n_q + BR - 1) // BR
        bh = cuda.blockIdx.x // Tr
        i = cuda.blockIdx.x - bh * Tr
        tid = cuda.threadIdx.x
        warp, lane, g, qd, cr, cc = tc.thread_places(tid, LANES)
        place = tc.Place(tid, warp, g, qd, cr, cc)
        row0 = i * BR
        row = row0 + mma.M * warp + g  # this lane's first query row; its second is row + 8
        draw = dev.DropoutArgs(seed_lo, seed_hi, threshold, inv_keep)

        K_s = cuda.shared.array((BC, SW), uint32, alignment=16)
        V_s = cuda.shared.array((BC, SW), uint32, alignment=16)
        red = cuda.shared.array(RED, float32)  # the simulator's quad reductions
        scratch = cuda.shared.array(SCRATCH, uint32)  # the simulator's fragment exchange
        # the rows this lane names to ldmatrix (kernels/_tc_tiles.py): Kᵀ's B fragments, V's transposed
        k_row, k_word = tc.pattern_pair_of_tiles(lane)
        v_row, v_word = tc.pattern_one_tile(lane)
        smem = ForwardShared(K_s, V_s, red, scratch, mma.shared_address(K_s, k_row, k_word),
                             mma.shared_address(V_s, v_row, v_word))

        q_frag = cuda.local.array((KD, 4), uint32)
        s = cuda.local.array((NS, 4), float32)
        o = cuda.local.array((NO, 4), float32)
        k_buf = cuda.local.array(BUFFERED, UNIT)
        v_buf = cuda.local.array(BUFFERED, UNIT)
        state = cuda.local.array(STATE, float32)
        m_use = cuda.local.array(2, float32)
        regs = ForwardRegisters(q_frag, s, o, state, m_use, k_buf, v_buf)
        dev.zero_tile(o)
        state[M_I] = NEG_INF
        state[M_I + 1] = NEG_INF
        state[L_I] = ZERO
        state[L_I + 1] = ZERO
        # Alg. 1 line 8, hoisted: word i of chunk kc holds rows row + 8(i mod 2), words 8kc + qd + 4(i // 2)
        for kc in range(KD):
            for w in range(4):
                q_frag[kc, w] = word(q, bh * n_q + row + 8 * (w % 2), 8 * kc + qd + 4 * (w // 2), bh * n_q + n_q)
        scale = tau * LOG2E

        # key blocks every row of this query block sees whole, then the rest up to the causal edge
        Tc = (n_k + BC - 1) // BC
        whole = n_k // BC
        if causal:
            first_row_keys = row0 + 1 + (n_k - n_q)  # keys 0 … row0 + N_k − N_q: what the block's first row sees
            whole = min(whole, max(first_row_keys, 0) // BC)
            last_key = min(row0 + BR, n_q) - 1 + (n_k - n_q)
            Tc = min(Tc, (last_key + BC) // BC) if last_key >= 0 else 0
        keys_end = min(n_k, Tc * BC)  # no fetch reads past the last key block this query block visits
        fetch(k_buf, k, bh * n_k, keys_end, cr, cc)
        fetch(v_buf, v, bh * n_k, keys_end, cr, cc)
        for j in range(whole):
            plain_step(j, regs, smem, k, v, bh, n_q, n_k, keys_end, row, scale, place, draw)
        for j in range(whole, Tc):
            masked_step(j, regs, smem, k, v, bh, n_q, n_k, keys_end, row, scale, place, draw)

        # Epilogue: ℓ_i over the quad, O_i = diag(ℓ_i)⁻¹ O_i, lse_i = m_i + log ℓ_i
        l_0 = tc.quad_sum(state[L_I], red, tid, 0)
        l_1 = tc.quad_sum(state[L_I + 1], red, tid, 1)
        for half_row in range(2):
            r = row + 8 * half_row
            l_i = l_0 if half_row == 0 else l_1
            if r < n_q:
                inv_l = ONE / l_i if l_i > ZERO else ZERO
                base = (bh * n_q + r) * d
                for t in range(NO):
                    for c in range(2):
                        col = mma.N * t + 2 * qd + c  # value 2·half_row + c of tile t
                        if col < d:
                            out[base + col] = store(o[t, 2 * half_row + c] * inv_l)
                if qd == 0:
                    m_i = state[M_I + half_row]
                    lse[bh * n_q + r] = flash_swapped.lse_from_log2(m_i, l_i)

    return kernel


BKB = mma.M * WARPS  # 64 keys per backward block, 16 per warp
BQ_CHOICES = (64, 32, 16)  # queries per backward step, the largest whose tiles fit shared memory


def backward_shared_bytes(d: int, bq: int) -> int:
    """K_j, V_j (B_c rows), Q_i, dO_i (bq rows), dS_ijᵀ (B_c × bq) as words, lse_i and D_i."""
    return 2 * tc.tile_bytes(BKB, d) + 2 * tc.tile_bytes(bq, d) + tc.tile_bytes(BKB, bq) + 2 * bq * 4


def queries_per_step(d: int) -> int | None:
    """The backward's B_r: the largest of BQ_CHOICES that fits the static shared memory, None if none does."""
    return next((bq for bq in BQ_CHOICES if backward_shared_bytes(d, bq) <= STATIC_SHARED_LIMIT), None)


def dq_split(d: int) -> tuple[int, int]:
    """(warps sharing one 16-query tile of dQ_i, pairs of its n8 column tiles each of them takes)."""
    sharing = WARPS // (queries_per_step(d) // mma.M)
    return sharing, -(-(padded_head_dim(d) // (2 * mma.N)) // sharing)


def backward_mma_per_step(d: int) -> int:
    """mma.sync a warp issues per query step: Sᵀ, dPᵀ, dV, dK (16 keys each) and its share of dQ."""
    bq, dp = queries_per_step(d), padded_head_dim(d)
    per_product = (bq // mma.N) * (dp // mma.K)  # 16 keys × bq queries × d, as n8 × k16 tiles
    return 4 * per_product + (BKB // mma.K) * 2 * dq_split(d)[1]


@functools.cache
def backward_kernel(d: int, causal: bool, dropout: bool, dtype: str = "float16"):
    """Tensor-core backward for head dim d: grid (batch·heads · ⌈N_k/64⌉,), block THREADS.

    One block per (batch·head, key block K_j of 64 keys), as flash-swapped's backward; each
    warp owns 16 keys and holds their dK_j, dV_j as C fragments. Per query block Q_i (B_r
    = queries_per_step(d) rows): Sᵀ = K_j Q_iᵀ and dPᵀ = V_j dO_iᵀ as C fragments, then
    Alg. 4 lines 12-20 on them in registers, dV_j += (P∘Z)ᵀ dO_i and dK_j += dSᵀ Q_i with
    the C fragments as A fragments, dSᵀ through shared memory, and dQ_i += tau dS K_j split
    over the warps by query tile and column pairs, added to a float32 dQ with atomics.
    q, k, v, do are flat word arrays as the forward's (tc.words_view); dk, dv flat arrays of
    halves; lse, big_d (D = rowsum(dO ∘ O)) and dq_acc flat float32.
    """
    h = tc.halves(dtype)
    store, a_from_c, mma_pair = h.store, h.a_from_c, h.mma_pair
    BQ = queries_per_step(d)
    if BQ is None:
        raise ValueError(f"d={d}: the tensor-core backward's tiles need {backward_shared_bytes(d, BQ_CHOICES[-1])} "
                         f"bytes of shared memory, more than {STATIC_SHARED_LIMIT}")
    DP = padded_head_dim(d)
    SW = tc.row_words(d)
    QW = tc.row_words(BQ)  # dSᵀ row width in words
    KD = DP // mma.K  # k16 chunks over d: Sᵀ, dPᵀ
    NQ = BQ // mma.N  # n8 tiles of queries in Sᵀ, dPᵀ
    KQ = BQ // mma.K  # k16 chunks over queries: dV, dK
    NO = DP // mma.N  # n8 tiles over d: dK, dV, dQ
    KK = BKB // mma.K  # k16 chunks over keys: dQ
    DS, PAIRS = dq_split(d)  # warps sharing a 16-query tile of dQ, each taking PAIRS of its NO / 2 pairs of n8 tiles
    DQ_TILES = 2 * PAIRS
    LANES = tc.copy_lanes(d)
    key_copy = tc.tile_copy(d, dtype, BKB)
    query_copy = tc.tile_copy(d, dtype, BQ)
    KEY_BUF, QUERY_BUF, UNIT = key_copy.buffered, query_copy.buffered, key_copy.unit
    SCRATCH = tc.SCRATCH
    inline = dev.inline_options()

    @cuda.jit(device=True, **inline)
    def tile_gradients(t, s, dp, lse_s, D_s, bh, key, query0, qd, n_q, n_k, tau2, masked, draw):
        """Alg. 4 lines 12-20 on n8 tile t of Sᵀ (keys key, key + 8; queries query0 + 8t + 2qd + (0, 1)).

        In: s = K_j Q_iᵀ, dp = V_j dO_iᵀ. Out, in place: s = (P ∘ Z)ᵀ, dp = dSᵀ = (P ∘ (dP ∘ Z − D))ᵀ.
        """
        for u in range(4):
            c = mma.N * t + 2 * qd + u % 2  # the query's place in the tile
            key_u = key + 8 * (u // 2)
            p = mma.exp2(s[t, u] * tau2 - lse_s[c])  # line 13, with lse = m + log ℓ
            if masked and not dev.visible(query0 + c, key_u, n_q, n_k, causal):  # line 12: MASK
                p = ZERO
            z = ONE
            if dropout:  # line 14
                z = dev.dropout_scale(draw.seed_lo, draw.seed_hi, draw.threshold, draw.inv_keep, bh, query0 + c, key_u)
            s[t, u] = p * z  # line 15
            dp[t, u] = p * (dp[t, u] * z - D_s[c])  # lines 18 and 20

    gradients = unrolled(tile_gradients, range(NQ))

    def make_step(masked):
        """One query step, with the mask test (masked) or without it (blocks every key and query see whole)."""

        @cuda.jit(device=True, **inline)
        def step(i, regs, smem, ops, hbm, bh, n_q, n_k, key, key_row, tau, place, draw):
            """Alg. 4 lines 10-22 for query block i: regs (BackwardRegisters) and smem (BackwardShared) in place.

            ops are the lane's BackwardOperands, hbm the BackwardInputs; key is the lane's first key
            and key_row its row in the block's tiles; place is its tc.Place, draw its dev.DropoutArgs.
            """
            s, dp, dk_acc, dv_acc, dq_t, q_buf, do_buf = regs
            K_s, V_s, Q_s, dO_s, dST_s, lse_s, D_s, scratch = smem
            q, do, lse, big_d, dq_acc = hbm
            tid, warp, g, qd, cr, cc = place
            row0 = i * BQ
            query_copy.fetch(q_buf, q, bh * n_q + row0, n_q - row0, cr, cc)  # Alg. 4 line 10
            query_copy.fetch(do_buf, do, bh * n_q + row0, n_q - row0, cr, cc)
            cuda.syncthreads()  # the previous step's readers of Q_s, dO_s, dST_s, lse_s, D_s are done
            query_copy.put(Q_s, q_buf, cr, cc)
            query_copy.put(dO_s, do_buf, cr, cc)
            if tid < BQ:
                valid = row0 + tid < n_q
                lse_s[tid] = lse[bh * n_q + row0 + tid] * LOG2E if valid else ZERO
                D_s[tid] = big_d[bh * n_q + row0 + tid] if valid else ZERO
            cuda.syncthreads()

            # Alg. 4 line 11: Sᵀ = K_j Q_iᵀ; line 17: dPᵀ = V_j dO_iᵀ (this warp's 16 keys × BQ queries)
            for t in range(NQ):
                for u in range(4):
                    s[t, u] = ZERO
                    dp[t, u] = ZERO
            for kc in range(KD):
                a0, a1, a2, a3 = mma.ldmatrix_x4(K_s, ops.k_as_a, 8 * kc, scratch)
                v0, v1, v2, v3 = mma.ldmatrix_x4(V_s, ops.v_as_a, 8 * kc, scratch)
                for P in range(NQ // 2):
                    b0, b1, c0, c1 = mma.ldmatrix_x4(Q_s, ops.q_as_b, 2 * mma.N * P * SW + 8 * kc, scratch)
                    mma_pair(s, 2 * P, a0, a1, a2, a3, b0, b1, c0, c1, scratch)
                    b0, b1, c0, c1 = mma.ldmatrix_x4(dO_s, ops.do_as_b, 2 * mma.N * P * SW + 8 * kc, scratch)
                    mma_pair(dp, 2 * P, v0, v1, v2, v3, b0, b1, c0, c1, scratch)
            gradients(s, dp, lse_s, D_s, bh, key, row0, qd, n_q, n_k, tau * LOG2E, masked, draw)

            # line 16: dV_j += (P∘Z)ᵀ dO_i; line 22: dK_j += dSᵀ Q_i (tau at the end). The C fragments of
            # tiles 2kc, 2kc + 1 are the A fragment of query chunk kc; dO_i's and Q_i's rows are B's k
            for kc in range(KQ):
                a0, a1, a2, a3 = a_from_c(s, kc)
                e0, e1, e2, e3 = a_from_c(dp, kc)
                for T in range(NO // 2):
                    b0, b1, c0, c1 = mma.ldmatrix_x4_trans(dO_s, ops.do_as_b_trans, mma.K * kc * SW + 8 * T, scratch)
                    mma_pair(dv_acc, 2 * T, a0, a1, a2, a3, b0, b1, c0, c1, scratch)
                    b0, b1, c0, c1 = mma.ldmatrix_x4_trans(Q_s, ops.q_as_b_trans, mma.K * kc * SW + 8 * T, scratch)
                    mma_pair(dk_acc, 2 * T, e0, e1, e2, e3, b0, b1, c0, c1, scratch)
                # dSᵀ to shared memory for dQ: this lane's keys (tile rows key_row, key_row + 8), query pair 8t + 2qd
                # as one word
                dST_s[key_row, 8 * kc + qd] = e0
                dST_s[key_row + 8, 8 * kc + qd] = e1
                dST_s[key_row, 8 * kc + 4 + qd] = e2
                dST_s[key_row + 8, 8 * kc + 4 + qd] = e3
            cuda.syncthreads()

            # line 21: dQ_i += tau dS_ij K_j. This warp: query tile warp // DS, n8 tile pairs from
            # (warp mod DS)·PAIRS (the last pair again where they run out; its sums are not added)
            for t in range(DQ_TILES):
                for u in range(4):
                    dq_t[t, u] = ZERO
            first_pair = (warp % DS) * PAIRS
            for kc in range(KK):
                a0, a1, a2, a3 = mma.ldmatrix_x4_trans(dST_s, ops.ds_as_a_trans, mma.K * kc * QW + 8 * (warp // DS),
                                                       scratch)
                for P in range(PAIRS):
                    pair = min(first_pair + P, NO // 2 - 1)
                    b0, b1, c0, c1 = mma.ldmatrix_x4_trans(K_s, ops.k_as_b_trans, mma.K * kc * SW + 8 * pair, scratch)
                    mma_pair(dq_t, 2 * P, a0, a1, a2, a3, b0, b1, c0, c1, scratch)
            query = row0 + mma.M * (warp // DS) + g
            for P in range(PAIRS):
                if first_pair + P < NO // 2:
                    for e in range(2):
                        for u in range(4):
                            row = query + 8 * (u // 2)
                            col = mma.N * (2 * (first_pair + P) + e) + 2 * qd + u % 2
                            if row < n_q and col < d:
                                cuda.atomic.add(dq_acc, (bh * n_q + row) * d + col, tau * dq_t[2 * P + e, u])

        return step

    plain_step = make_step(False)
    masked_step = make_step(True)

    @cuda.jit(**dev.launch_bounds(THREADS, MIN_BLOCKS))
    def kernel(q, k, v, do, lse, big_d, dq_acc, dk, dv, n_q, n_k, tau, seed_lo, seed_hi, threshold, inv_keep):
        Tc = (n_k + BKB - 1) // BKB
        Tr = (n_q + BQ - 1) // BQ
        bh = cuda.blockIdx.x // Tc
        j = cuda.blockIdx.x - bh * Tc
        tid = cuda.threadIdx.x
        warp, lane, g, qd, cr, cc = tc.thread_places(tid, LANES)
        place = tc.Place(tid, warp, g, qd, cr, cc)
        draw = dev.DropoutArgs(seed_lo, seed_hi, threshold, inv_keep)
        col0 = j * BKB
        key = col0 + mma.M * warp + g  # this lane's first key; its second is key + 8
        key_row = uint32(mma.M * warp + g)  # its row in the block's tiles (unsigned: no index wraparound)

        K_s = cuda.shared.array((BKB, SW), uint32, alignment=16)
        V_s = cuda.shared.array((BKB, SW), uint32, alignment=16)
        Q_s = cuda.shared.array((BQ, SW), uint32, alignment=16)
        dO_s = cuda.shared.array((BQ, SW), uint32, alignment=16)
        dST_s = cuda.shared.array((BKB, QW), uint32, alignment=16)
        lse_s = cuda.shared.array(BQ, float32)
        D_s = cuda.shared.array(BQ, float32)
        scratch = cuda.shared.array(SCRATCH, uint32)
        smem = BackwardShared(K_s, V_s, Q_s, dO_s, dST_s, lse_s, D_s, scratch)

        # the rows each lane names to ldmatrix (kernels/_tc_tiles.py)
        one_row, one_word = tc.pattern_one_tile(lane)
        pair_row, pair_word = tc.pattern_pair_of_tiles(lane)
        ops = BackwardOperands(
            k_as_a=mma.shared_address(K_s, mma.M * warp + one_row, one_word),
            v_as_a=mma.shared_address(V_s, mma.M * warp + one_row, one_word),
            q_as_b=mma.shared_address(Q_s, pair_row, pair_word),
            do_as_b=mma.shared_address(dO_s, pair_row, pair_word),
            q_as_b_trans=mma.shared_address(Q_s, one_row, one_word),
            do_as_b_trans=mma.shared_address(dO_s, one_row, one_word),
            k_as_b_trans=mma.shared_address(K_s, one_row, one_word),
            ds_as_a_trans=mma.shared_address(dST_s, pair_row, pair_word),
        )
        hbm = BackwardInputs(q, do, lse, big_d, dq_acc)

        key_buf = cuda.local.array(KEY_BUF, UNIT)
        q_buf = cuda.local.array(QUERY_BUF, UNIT)
        do_buf = cuda.local.array(QUERY_BUF, UNIT)
        s = cuda.local.array((NQ, 4), float32)
        dp = cuda.local.array((NQ, 4), float32)
        dk_acc = cuda.local.array((NO, 4), float32)
        dv_acc = cuda.local.array((NO, 4), float32)
        dq_t = cuda.local.array((DQ_TILES, 4), float32)
        regs = BackwardRegisters(s, dp, dk_acc, dv_acc, dq_t, q_buf, do_buf)

        # Alg. 4 lines 7-8: K_j, V_j to shared memory, dK_j = dV_j = 0 on chip
        key_copy.fetch(key_buf, k, bh * n_k + col0, n_k - col0, cr, cc)
        key_copy.put(K_s, key_buf, cr, cc)
        key_copy.fetch(key_buf, v, bh * n_k + col0, n_k - col0, cr, cc)
        key_copy.put(V_s, key_buf, cr, cc)
        dev.zero_tile(dk_acc)
        dev.zero_tile(dv_acc)

        # query blocks: those every key of this block and every query see whole run without the
        # mask test; before them the causal edge's, after them the ragged last one
        # query i sees key col0 iff i ≥ col0 − (N_k − N_q)
        i_start = max(0, col0 - (n_k - n_q)) // BQ if causal else 0
        full_rows = n_q // BQ
        whole_from = i_start
        if causal:  # the block's last key col0 + BKB − 1 is seen from query col0 + BKB − 1 − (N_k − N_q) on
            whole_from = max(i_start, (max(0, col0 + BKB - 1 - (n_k - n_q)) + BQ - 1) // BQ)
        whole_from = min(whole_from, Tr)
        whole_to = max(whole_from, full_rows) if col0 + BKB <= n_k else whole_from  # a ragged key block: all masked
        edge = whole_from - i_start  # masked blocks before the whole ones; Tr − whole_to after them
        for i in range(whole_from, whole_to):
            plain_step(i, regs, smem, ops, hbm, bh, n_q, n_k, key, key_row, tau, place, draw)
        for m in range(edge + (Tr - whole_to)):
            i = i_start + m if m < edge else whole_to + (m - edge)
            masked_step(i, regs, smem, ops, hbm, bh, n_q, n_k, key, key_row, tau, place, draw)

        # Alg. 4 line 24: dK_j = tau Σ dSᵀ Q, dV_j
        for half_row in range(2):
            r = key + 8 * half_row
            if r < n_k:
                base = (bh * n_k + r) * d
                for t in range(NO):
                    for c in range(2):
                        col = mma.N * t + 2 * qd + c
                        if col < d:
                            dk[base + col] = store(tau * dk_acc[t, 2 * half_row + c])
                            dv[base + col] = store(dv_acc[t, 2 * half_row + c])

    return kernel


@functools.cache
def row_dot_kernel(dtype: str):
    """D_i = rowsum(dO_i ∘ O_i) (Alg. 4 line 19) for (bh, N_q, d) arrays of halves -> (bh, N_q) float32."""
    return dev.row_dot_kernel_for(tc.halves(dtype).widen)


@functools.cache
def store_kernel(dtype: str):
    """dst = src rounded to the 16-bit type, for (bh, N, d) arrays: float32 -> float16, or bfloat16 bits."""
    return dev.convert_kernel_for(tc.halves(dtype).store)


def check_bfloat16(d: int, backward: bool) -> None:
    """Raise naming d when bfloat16 cannot run at head dim d (float16 and float32 have CUDA-core fallbacks)."""
    if backward and queries_per_step(d) is None:
        d_max = max(x for x in range(1, STATIC_SHARED_LIMIT) if queries_per_step(x) is not None)
        raise ValueError(f"d={d} is outside the allowed range [1, {d_max}] for the bfloat16 backward of "
                         f"flash-swapped-tc: its tensor-core tiles would not fit in shared memory")


def backward(q, k, v, out, lse, dout, *, tau: float, causal: bool, dropout, config):
    """dQ, dK, dV (in q's dtype) as flash_swapped.backward: float16 and bfloat16 on tensor cores.

    float32 runs flash-swapped's CUDA-core backward, and so does float16 at a head dim whose
    tensor-core tiles overflow shared memory (queries_per_step(d) is None); bfloat16 has no
    such fallback and raises there, naming d.
    """
    n_bh, n_q, d = q.shape
    if q.dtype == np.float32 or (q.dtype == np.float16 and queries_per_step(d) is None):
        return flash_swapped.backward(q, k, v, out, lse, dout, tau=tau, causal=causal, dropout=dropout, config=config)
    dtype = "float16" if q.dtype == np.float16 else "bfloat16"
    kernel = backward_kernel(d, bool(causal), dropout.enabled, dtype)
    n_k = k.shape[1]
    big_d = cuda.device_array((n_bh, n_q), dtype=np.float32)
    row_dot_kernel(dtype)[dev.grid_stride_launch(n_bh * n_q)](dout, out, big_d)
    dq_acc = cuda.device_array((n_bh, n_q, d), dtype=np.float32)
    dev.fill_kernel[dev.grid_stride_launch(n_bh * n_q * d)](dq_acc, ZERO)
    dk = cuda.device_array((n_bh, n_k, d), dtype=q.dtype)
    dv = cuda.device_array((n_bh, n_k, d), dtype=q.dtype)
    flat = flash_swapped.flat
    kernel[n_bh * -(-n_k // BKB), THREADS](
        *(tc.words_view(x) for x in (q, k, v, dout)), flat(lse), flat(big_d), flat(dq_acc), flat(dk), flat(dv),
        n_q, n_k, np.float32(tau), *dropout.kernel_args()
    )
    dq = cuda.device_array((n_bh, n_q, d), dtype=q.dtype)
    store_kernel(dtype)[dev.grid_stride_launch(n_bh * n_q * d)](dq_acc, dq)
    return dq, dk, dv


def forward(q, k, v, *, tau: float, causal: bool, dropout, config):
    """O and lse as flash_swapped.forward: float16 and bfloat16 on tensor cores, float32 on flash-swapped's kernel.

    bfloat16 inputs arrive as uint16 bit patterns (kernels.bfloat16) and O leaves as them.
    """
    if q.dtype == np.float16:
        dtype = "float16"
    elif q.dtype == np.uint16:
        dtype = "bfloat16"
    else:
        return flash_swapped.forward(q, k, v, tau=tau, causal=causal, dropout=dropout, config=config)
    n_bh, n_q, d = q.shape
    n_k = k.shape[1]
    out = cuda.device_array((n_bh, n_q, d), dtype=q.dtype)
    lse = cuda.device_array((n_bh, n_q), dtype=np.float32)
    kernel = forward_kernel(d, bool(causal), dropout.enabled, dtype, tau < 0)
    Tr = -(-n_q // BR)
    flat = flash_swapped.flat
    kernel[n_bh * Tr, THREADS](*(tc.words_view(x) for x in (q, k, v)), flat(out), flat(lse), n_q, n_k,
                               np.float32(tau), *dropout.kernel_args())
    return out, lse
