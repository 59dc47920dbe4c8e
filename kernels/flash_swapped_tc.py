"""flash-swapped-tc: flash-swapped's forward with S = Q Kᵀ and O += P̃ V on tensor cores.

The loop order, HBM traffic and outputs are flash-swapped's (FlashAttention-2, Q blocks
outer): one thread block per (batch·head, query block Q_i) keeps Q_i, O_i, m_i and ℓ_i on
chip while K_j, V_j stream through shared memory. Both products run as warp-wide
mma.sync.m16n8k16 (kernels/_mma.py: float16 or bfloat16 operands, float32 accumulation;
a fragment-exact Python twin under the simulator). bfloat16, which numpy lacks, travels
as uint16 bit patterns (kernels.bfloat16): Q, K, V in and O out. Each of the block's
WARPS warps owns 16 query rows: its S_ij fragments (16 × B_c) and its O_i accumulator
fragments (16 × d, d padded to a multiple of 16 with zeros) stay in its registers.

Deviations from Algorithms 1/2, beyond flash-swapped's (O unnormalised until the end,
lse = m + log ℓ written instead of m and ℓ, log2 units, causal blocks skipped):
- P̃_ij is rounded to the input type (float16 or bfloat16) for the P̃V product, as
  FlashAttention does; ℓ_i sums the float32 values.
- The row max and sum go through shared memory, one thread per query row, between
  barriers (a first version: the fragments' rows could reduce with quad shuffles).
- float32 inputs run flash-swapped's CUDA-core forward (the tensor cores take float16 and
  bfloat16 only); the backward pass is flash-swapped's (float32 and float16: the host
  API offers bfloat16 forward only).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, types, uint16, uint32

from iosim.kernels import _device as dev
from iosim.kernels import _mma as mma
from iosim.kernels import flash_swapped
from iosim.kernels.config import FLOAT32_BYTES, STATIC_SHARED_LIMIT, TileConfig

# The iosim algorithm this kernel computes: iosim counts its HBM traffic, the tests compare outputs.
ALGORITHM = flash_swapped.ALGORITHM

FLOAT16_BYTES = 2  # float16 and bfloat16 alike
TC_DTYPES = ("float16", "bfloat16")  # what the tensor cores take; bfloat16 travels as uint16 bits
BFLOAT16 = True  # the host API may hand this implementation bfloat16 (kernels.api)
LOW_HALF = uint32(0xFFFF)
WARPS = 4  # warps per block, each owning one m16 row tile of Q_i
BR = mma.M * WARPS  # 64 query rows per block
BC = 32  # keys per K/V step: two k16 chunks of P̃ V, four n8 tiles of S
THREADS = mma.WARP * WARPS
S_PAD = 1  # the S/P̃ tile is read by rows and by fragments; an odd row stride spreads the banks
S_W = BC + S_PAD  # its row width

# The tilings of the float32 forward and of the backward, which are flash-swapped's.
FORWARD_TILES = flash_swapped.FORWARD_TILES
BACKWARD_TILES = flash_swapped.BACKWARD_TILES
backward = flash_swapped.backward

NEG_INF = dev.NEG_INF
ZERO = dev.ZERO
ONE = dev.ONE
LOG2E = flash_swapped.LOG2E


def padded_head_dim(d: int) -> int:
    """d rounded up to the k16 of one MMA (the padding columns hold zeros)."""
    return mma.K * -(-d // mma.K)


def tc_shared_bytes(d: int) -> int:
    """Static shared memory of the tensor-core forward: Q_i, K_j, V_j in 16 bits, S/P̃ and row state in float32."""
    dp = padded_head_dim(d)
    scratch = THREADS * mma.SCRATCH_WORDS * 4 if dev.simulator_enabled() else 0
    return FLOAT16_BYTES * (BR + 2 * BC) * dp + FLOAT32_BYTES * (BR * S_W + 3 * BR) + scratch


def check_config(config, d: int, backward: bool) -> None:
    """Raise naming `config` or `d` when this head dim cannot run (config tiles the CUDA-core paths)."""
    flash_swapped.check_config(config, d, backward)
    if not backward and tc_shared_bytes(d) > STATIC_SHARED_LIMIT:
        raise ValueError(
            f"d={d}: the tensor-core forward needs {tc_shared_bytes(d)} bytes of shared memory "
            f"(Q_i, K_j, V_j in 16 bits at d padded to {padded_head_dim(d)}), more than {STATIC_SHARED_LIMIT}"
        )


@functools.lru_cache(maxsize=None)
def forward_kernel(d: int, causal: bool, dropout: bool, dtype: str = "float16"):
    """Tensor-core forward for head dim d: grid (batch·heads · T_r,), block THREADS, T_r = ⌈N_q/64⌉.

    q, k, v, out are flat arrays, as in flash_swapped.forward_kernel: float16 for
    dtype="float16", uint16 bfloat16 bit patterns (kernels.bfloat16) for dtype="bfloat16".
    """
    if dtype not in TC_DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of {TC_DTYPES}")
    bf16 = dtype == "bfloat16"
    DP = padded_head_dim(d)
    KD = DP // mma.K  # k16 chunks of Q_i K_jᵀ
    NS = BC // mma.N  # n8 tiles of S_ij per warp
    KP = BC // mma.K  # k16 chunks of P̃_ij V_j
    NO = DP // mma.N  # n8 tiles of O_i per warp
    SCRATCH = (THREADS, mma.SCRATCH_WORDS) if dev.simulator_enabled() else (1, 1)
    pack = mma.pack_bfloat162 if bf16 else mma.pack_half2  # float32 pair -> 2-half word, rounded
    mma_16816 = mma.mma_16816_bf16 if bf16 else mma.mma_16816
    TILE = types.uint16 if bf16 else types.float16  # Q_i, K_j, V_j in shared memory

    if bf16:
        join = mma.join_halves  # the 2-half word of two tile elements: bfloat16 bits join as they are

        @cuda.jit(device=True)
        def q_fragment(A, r, c):
            """The four bf16x2 words of the 16 × 16 A fragment at rows r, r + 8, columns c … c + 15 of tile A."""
            a0 = join(A[r, c], A[r, c + 1])
            a1 = join(A[r + 8, c], A[r + 8, c + 1])
            a2 = join(A[r, c + 8], A[r, c + 9])
            a3 = join(A[r + 8, c + 8], A[r + 8, c + 9])
            return a0, a1, a2, a3

        @cuda.jit(device=True)
        def p_fragment(A, r, c):
            """The same fragment of float32 A (P̃_ij), each value rounded to bfloat16."""
            a0 = pack(A[r, c], A[r, c + 1])
            a1 = pack(A[r + 8, c], A[r + 8, c + 1])
            a2 = pack(A[r, c + 8], A[r, c + 9])
            a3 = pack(A[r + 8, c + 8], A[r + 8, c + 9])
            return a0, a1, a2, a3

        @cuda.jit(device=True)
        def store(x):
            """An output element as bfloat16 bits, rounded to nearest even (the low half of the packed word)."""
            return uint16(pack(x, ZERO) & LOW_HALF)
    else:
        # float16 and float32 elements pack alike, through float32; calling pack directly
        # here, not through join, keeps ptxas at 168 registers for d = 64 (170 through join)

        @cuda.jit(device=True)
        def join(lo, hi):
            """The f16x2 word of two elements, each rounded to float16."""
            return pack(float32(lo), float32(hi))

        @cuda.jit(device=True)
        def q_fragment(A, r, c):
            """The four f16x2 words of the 16 × 16 A fragment at rows r, r + 8, columns c … c + 15 of A."""
            a0 = pack(float32(A[r, c]), float32(A[r, c + 1]))
            a1 = pack(float32(A[r + 8, c]), float32(A[r + 8, c + 1]))
            a2 = pack(float32(A[r, c + 8]), float32(A[r, c + 9]))
            a3 = pack(float32(A[r + 8, c + 8]), float32(A[r + 8, c + 9]))
            return a0, a1, a2, a3

        p_fragment = q_fragment  # P̃_ij in float32 rounds to float16 in the same packs

        @cuda.jit(device=True)
        def store(x):
            """An output element; the float16 array's store rounds it."""
            return x

    @cuda.jit(device=True)
    def load_tile(dst, src, row_start, n_valid):
        """dst[r, c] = src[(row_start + r)·d + c] for r < n_valid and c < d, else 0; dst is (R, DP) of TILE."""
        for e in range(cuda.threadIdx.x, dst.shape[0] * DP, THREADS):
            r = e // DP
            c = e - r * DP
            if r < n_valid and c < d:
                dst[r, c] = src[(row_start + r) * d + c]
            else:
                dst[r, c] = ZERO  # a float16 constant does not lower through NVVM; float32 0 is cast

    @cuda.jit(**dev.launch_bounds(THREADS, 2))
    def kernel(q, k, v, out, lse, n_q, n_k, tau, seed_lo, seed_hi, threshold, inv_keep):
        Tr = (n_q + BR - 1) // BR
        bh = cuda.blockIdx.x // Tr
        i = cuda.blockIdx.x - bh * Tr
        tid = cuda.threadIdx.x
        warp = tid // mma.WARP
        lane = tid - warp * mma.WARP
        g = lane // 4  # the lane's group: fragment rows g and g + 8
        qd = lane - 4 * g  # its place in the group: fragment columns 2·qd, 2·qd + 1
        r0 = mma.M * warp  # first tile row of this warp
        row0 = i * BR

        Q_s = cuda.shared.array((BR, DP), TILE)
        K_s = cuda.shared.array((BC, DP), TILE)
        V_s = cuda.shared.array((BC, DP), TILE)
        S_s = cuda.shared.array((BR, S_W), float32)  # S_ij in log2 units, then P̃_ij
        m_s = cuda.shared.array(BR, float32)  # m_i, log2 units
        l_s = cuda.shared.array(BR, float32)  # ℓ_i
        alpha_s = cuda.shared.array(BR, float32)  # 2^(m_old − m_new) of this step
        scratch = cuda.shared.array(SCRATCH, uint32)  # the simulator's fragment exchange

        o = cuda.local.array((NO, 4), float32)  # O_i fragments: rows g, g + 8 of columns 8·t + 2·qd + (0, 1)
        s = cuda.local.array(4, float32)
        dev.zero_tile(o)
        if tid < BR:
            m_s[tid] = NEG_INF
            l_s[tid] = ZERO
        load_tile(Q_s, q, bh * n_q + row0, n_q - row0)  # Alg. 1 line 8, hoisted
        scale = tau * LOG2E

        Tc = (n_k + BC - 1) // BC
        if causal:
            last_key = min(row0 + BR, n_q) - 1 + (n_k - n_q)
            Tc = min(Tc, (last_key + BC) // BC) if last_key >= 0 else 0
        for j in range(Tc):
            col0 = j * BC
            cuda.syncthreads()  # the previous step's readers of K_s, V_s, S_s are done
            load_tile(K_s, k, bh * n_k + col0, n_k - col0)  # Alg. 1 line 6
            load_tile(V_s, v, bh * n_k + col0, n_k - col0)
            cuda.syncthreads()

            # Alg. 2 line 10: S_ij = tau Q_i K_jᵀ, one 16 × 8 fragment per n8 tile of keys
            for t in range(NS):
                for u in range(4):
                    s[u] = ZERO
                for kc in range(KD):
                    a0, a1, a2, a3 = q_fragment(Q_s, r0 + g, mma.K * kc + 2 * qd)
                    key = mma.N * t + g  # B(k, n) = K_j[n, k]: this lane's column n is key g of the tile
                    b0 = join(K_s[key, mma.K * kc + 2 * qd], K_s[key, mma.K * kc + 2 * qd + 1])
                    b1 = join(K_s[key, mma.K * kc + 2 * qd + 8], K_s[key, mma.K * kc + 2 * qd + 9])
                    s[0], s[1], s[2], s[3] = mma_16816(a0, a1, a2, a3, b0, b1, s[0], s[1], s[2], s[3], scratch)
                for u in range(4):
                    S_s[r0 + g + 8 * (u // 2), mma.N * t + 2 * qd + u % 2] = s[u] * scale
            cuda.syncthreads()

            # Alg. 2 lines 11-14 for query row tid: MASK, m_new, P̃_ij = 2^(S_ij − m_new) (∘ Z), ℓ_i
            if tid < BR:
                row = row0 + tid
                m_new = m_s[tid]
                for c in range(BC):
                    if not dev.visible(row, col0 + c, n_q, n_k, causal):  # line 11
                        S_s[tid, c] = NEG_INF
                    m_new = max(m_new, S_s[tid, c])
                m_use = dev.safe_max(m_new)
                alpha = math.exp2(m_s[tid] - m_use)
                l_i = l_s[tid] * alpha
                for c in range(BC):
                    p = math.exp2(S_s[tid, c] - m_use)
                    l_i += p
                    if dropout:  # line 14
                        p *= dev.dropout_scale(seed_lo, seed_hi, threshold, inv_keep, bh, row, col0 + c)
                    S_s[tid, c] = p
                m_s[tid] = m_new
                l_s[tid] = l_i
                alpha_s[tid] = alpha
            cuda.syncthreads()

            # Alg. 2 line 15 (unnormalised): O_i = diag(alpha) O_i + P̃_ij V_j
            for t in range(NO):
                for u in range(4):
                    o[t, u] *= alpha_s[r0 + g + 8 * (u // 2)]
            for kc in range(KP):
                a0, a1, a2, a3 = p_fragment(S_s, r0 + g, mma.K * kc + 2 * qd)
                key = mma.K * kc + 2 * qd  # B(k, n) = V_j[k, n]: this lane's rows k are keys key, key + 1, +8, +9
                for t in range(NO):
                    col = mma.N * t + g
                    b0 = join(V_s[key, col], V_s[key + 1, col])
                    b1 = join(V_s[key + 8, col], V_s[key + 9, col])
                    o[t, 0], o[t, 1], o[t, 2], o[t, 3] = mma_16816(
                        a0, a1, a2, a3, b0, b1, o[t, 0], o[t, 1], o[t, 2], o[t, 3], scratch
                    )

        # Epilogue: O_i = diag(ℓ_i)⁻¹ O_i, lse_i = m_i + log ℓ_i
        cuda.syncthreads()
        for u in range(4):
            r = r0 + g + 8 * (u // 2)
            row = row0 + r
            if row < n_q:
                l_i = l_s[r]
                inv_l = ONE / l_i if l_i > ZERO else ZERO
                for t in range(NO):
                    col = mma.N * t + 2 * qd + u % 2
                    if col < d:
                        out[(bh * n_q + row) * d + col] = store(o[t, u] * inv_l)
        if tid < BR and row0 + tid < n_q:
            lse[bh * n_q + row0 + tid] = flash_swapped.lse_from_log2(m_s[tid], l_s[tid])

    return kernel


def forward(q, k, v, *, tau: float, causal: bool, dropout, config: TileConfig):
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
    kernel = forward_kernel(d, bool(causal), dropout.enabled, dtype)
    Tr = -(-n_q // BR)
    flat = flash_swapped.flat
    kernel[n_bh * Tr, THREADS](
        flat(q), flat(k), flat(v), flat(out), flat(lse), n_q, n_k, np.float32(tau), *dropout.kernel_args()
    )
    return out, lse
