"""standard: Algorithm 0, attention as separate kernels that materialise S and P in HBM.

Forward (Alg. 0):
  line 1  S = tau Q Kᵀ                 matmul kernel, S written to HBM      (bh, N_q, N_k) float32
  line 2  P = dropout(softmax(MASK(S))) row-softmax kernel, reads S, writes P (in place) and lse
  line 3  O = P V                      matmul kernel
Backward (the same algebra as Alg. 4 on whole matrices, each step its own kernel):
  S = tau Q Kᵀ; P = exp(MASK(S) − lse) and P∘Z; dV = (P∘Z)ᵀ dO; dP = dO Vᵀ;
  D = rowsum(dO ∘ O); dS = P ∘ (dP∘Z − D); dQ = tau dS K; dK = tau dSᵀ Q.

Deviations: the softmax kernel reads each row of S twice (an online max/sum pass, then
the write pass) and overwrites S with P, so the forward pass holds one N_q × N_k buffer;
with dropout the backward pass holds three (P, P∘Z, dP/dS), without it two.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numba import cuda, float32

from iosim.algorithms import standard as simulated
from iosim.kernels import _device as dev
from iosim.kernels.config import FLOAT32_BYTES, MAX_THREADS_PER_BLOCK, STATIC_SHARED_LIMIT

# The iosim algorithm this kernel computes: iosim counts its HBM traffic, the tests compare outputs.
ALGORITHM = simulated.ALGORITHM
BFLOAT16 = False  # the host API hands it float32 or float16 only (kernels.api.Implementation)
# grouped-query attention (k, v with fewer heads than q): its matmuls index K/V by the query head
GROUPED_FORWARD = False
SPLITS = False  # its forward does not split K/V (kernels.api: splits= is for split-kv)
SAWTOOTH = False  # one K/V order (kernels.api: sawtooth= is for flash-swapped)

NEG_INF = dev.NEG_INF
ZERO = dev.ZERO
ONE = dev.ONE


@dataclass(frozen=True)
class MatmulConfig:
    """Tiles of the batched matmul and the thread count of the row kernels."""

    BM: int = 64  # rows of C per thread block
    BN: int = 64  # columns of C per thread block
    BK: int = 16  # depth of one shared-memory stage
    TM: int = 4  # rows of C per thread
    TN: int = 4  # columns of C per thread
    row_threads: int = 128  # threads of the softmax kernel (one block per row); a power of two

    def threads(self) -> int:
        return (self.BM // self.TM) * (self.BN // self.TN)

    def check(self, d: int, backward: bool) -> None:
        for name in ("BM", "BN", "BK", "TM", "TN", "row_threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"config.{name}={value!r} must be an integer >= 1")
        if self.BM % self.TM or self.BN % self.TN:
            raise ValueError(f"config.TM={self.TM} must divide BM={self.BM} and TN={self.TN} must divide BN={self.BN}")
        if self.row_threads & (self.row_threads - 1) or self.row_threads > MAX_THREADS_PER_BLOCK:
            raise ValueError(f"config.row_threads={self.row_threads} must be a power of two in "
                             f"[1, {MAX_THREADS_PER_BLOCK}]")
        if not 1 <= self.threads() <= MAX_THREADS_PER_BLOCK:
            raise ValueError(f"config {self} gives {self.threads()} matmul threads; "
                             f"allowed range [1, {MAX_THREADS_PER_BLOCK}]")
        if shared_bytes(self, d, backward) > STATIC_SHARED_LIMIT:
            raise ValueError(
                f"config {self} needs {shared_bytes(self, d, backward)} bytes of shared memory; "
                f"allowed range [0, {STATIC_SHARED_LIMIT}]"
            )


FORWARD_TILES = (MatmulConfig(),)
BACKWARD_TILES = (MatmulConfig(),)


def shared_bytes(config: MatmulConfig, d: int, backward: bool) -> int:
    """Largest static shared memory of the kernels: the matmul's A and B stages (d plays no part)."""
    matmul = FLOAT32_BYTES * config.BK * (config.BM + 1 + config.BN + 1)
    softmax = 2 * FLOAT32_BYTES * config.row_threads
    return max(matmul, softmax)


def check_config(config, d: int, backward: bool) -> None:
    """Raise naming `config` when it is not a valid MatmulConfig."""
    if not isinstance(config, MatmulConfig):
        raise TypeError(f"config for impl='standard' must be a kernels.standard.MatmulConfig; got {config!r}")
    config.check(d, backward)


@functools.cache
def matmul_kernel(trans_a: bool, trans_b: bool, config: MatmulConfig):
    """C[b] = alpha · op(A[b]) op(B[b]) for batched 3-D arrays, op = transpose when trans_*.

    op(A) is (M, K), op(B) is (K, N), C is (batch, M, N). Grid (batch · ⌈M/BM⌉ · ⌈N/BN⌉,).
    Accumulates in float32 whatever the input dtypes.
    """
    BM, BN, BK, TM, TN = config.BM, config.BN, config.BK, config.TM, config.TN
    TC = BN // TN
    THREADS = config.threads()
    BMP = BM + 1
    BNP = BN + 1

    @cuda.jit
    def kernel(a, b, c, alpha):
        M = c.shape[1]
        N = c.shape[2]
        K = a.shape[1] if trans_a else a.shape[2]
        tiles_m = (M + BM - 1) // BM
        tiles_n = (N + BN - 1) // BN
        batch = cuda.blockIdx.x // (tiles_m * tiles_n)
        rest = cuda.blockIdx.x - batch * tiles_m * tiles_n
        m0 = (rest // tiles_n) * BM
        n0 = (rest - (rest // tiles_n) * tiles_n) * BN
        tid = cuda.threadIdx.x
        ty = tid // TC
        tx = tid - ty * TC
        r0 = ty * TM

        A_s = cuda.shared.array((BK, BMP), float32)  # A_s[kk, r] = op(A)[m0 + r, k0 + kk]
        B_s = cuda.shared.array((BK, BNP), float32)  # B_s[kk, n] = op(B)[k0 + kk, n0 + n]
        acc = cuda.local.array((TM, TN), float32)
        a_reg = cuda.local.array(TM, float32)
        b_reg = cuda.local.array(TN, float32)
        dev.zero_tile(acc)

        for k0 in range(0, K, BK):
            cuda.syncthreads()
            for idx in range(tid, BM * BK, THREADS):
                # the contiguous index of A runs fastest, so loads coalesce
                if trans_a:
                    kk = idx // BM
                    r = idx - kk * BM
                    ok = m0 + r < M and k0 + kk < K
                    A_s[kk, r] = np.float32(a[batch, k0 + kk, m0 + r]) if ok else ZERO
                else:
                    r = idx // BK
                    kk = idx - r * BK
                    ok = m0 + r < M and k0 + kk < K
                    A_s[kk, r] = np.float32(a[batch, m0 + r, k0 + kk]) if ok else ZERO
            for idx in range(tid, BN * BK, THREADS):
                if trans_b:
                    n = idx // BK
                    kk = idx - n * BK
                    ok = n0 + n < N and k0 + kk < K
                    B_s[kk, n] = np.float32(b[batch, n0 + n, k0 + kk]) if ok else ZERO
                else:
                    kk = idx // BN
                    n = idx - kk * BN
                    ok = n0 + n < N and k0 + kk < K
                    B_s[kk, n] = np.float32(b[batch, k0 + kk, n0 + n]) if ok else ZERO
            cuda.syncthreads()
            for kk in range(BK):
                for i in range(TM):
                    a_reg[i] = A_s[kk, r0 + i]
                for j in range(TN):
                    b_reg[j] = B_s[kk, tx + TC * j]
                for i in range(TM):
                    for j in range(TN):
                        acc[i, j] += a_reg[i] * b_reg[j]

        for i in range(TM):
            row = m0 + r0 + i
            if row < M:
                for j in range(TN):
                    col = n0 + tx + TC * j
                    if col < N:
                        c[batch, row, col] = alpha * acc[i, j]

    return kernel


@functools.cache
def softmax_kernel(threads: int, causal: bool, dropout: bool):
    """Alg. 0 line 2, a thread block per row (grid-stride over rows): S (bh, N_q, N_k) -> P ∘ Z in place, and lse
    (bh, N_q).

    Pass 1 computes the row's max and sum with the online normaliser (Milakov and Gimelshein, 2018),
    combined across threads by a tree in shared memory; pass 2 writes P.
    """
    T = threads

    @cuda.jit
    def kernel(s, lse, seed_lo, seed_hi, threshold, inv_keep):
        n_q = s.shape[1]
        n_k = s.shape[2]
        tid = cuda.threadIdx.x
        red_m = cuda.shared.array(T, float32)
        red_l = cuda.shared.array(T, float32)
        for row in range(cuda.blockIdx.x, s.shape[0] * n_q, cuda.gridDim.x):
            bh = row // n_q
            i = row - bh * n_q
            # pass 1: this thread's running (max, sum) over its columns
            m = NEG_INF
            l = ZERO
            for col in range(tid, n_k, T):
                if dev.visible(i, col, n_q, n_k, causal):
                    x = s[bh, i, col]
                    m_new = max(m, x)
                    l = l * dev.rescale(m, m_new) + math.exp(x - m_new)
                    m = m_new
            cuda.syncthreads()  # the previous row's readers of red_m[0], red_l[0] are done
            red_m[tid] = m
            red_l[tid] = l
            half = T // 2
            while half > 0:
                cuda.syncthreads()
                if tid < half:
                    m_a = red_m[tid]
                    m_b = red_m[tid + half]
                    m_new = max(m_a, m_b)
                    red_l[tid] = red_l[tid] * dev.rescale(m_a, m_new) + red_l[tid + half] * dev.rescale(m_b, m_new)
                    red_m[tid] = m_new
                half //= 2
            cuda.syncthreads()
            m = red_m[0]
            l = red_l[0]
            # pass 2: P = exp(S − m) / ℓ, times Z, written over S
            inv_l = ONE / l if l > ZERO else ZERO
            for col in range(tid, n_k, T):
                p = ZERO
                if dev.visible(i, col, n_q, n_k, causal):
                    p = math.exp(s[bh, i, col] - m) * inv_l
                    if dropout:
                        p *= dev.dropout_scale(seed_lo, seed_hi, threshold, inv_keep, bh, i, col)
                s[bh, i, col] = p
            if tid == 0:
                lse[bh, i] = dev.log_sum_exp(m, l)

    return kernel


@functools.cache
def probs_kernel(causal: bool, dropout: bool):
    """Backward: S -> P = exp(MASK(S) − lse) in place, and P∘Z into pz when dropout is on."""

    @cuda.jit
    def kernel(s, lse, pz, seed_lo, seed_hi, threshold, inv_keep):
        n_q = s.shape[1]
        n_k = s.shape[2]
        start = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        for idx in range(start, s.shape[0] * n_q * n_k, cuda.gridDim.x * cuda.blockDim.x):
            bh = idx // (n_q * n_k)
            rest = idx - bh * n_q * n_k
            i = rest // n_k
            col = rest - i * n_k
            p = ZERO
            if dev.visible(i, col, n_q, n_k, causal):
                p = math.exp(s[bh, i, col] - lse[bh, i])
            s[bh, i, col] = p
            if dropout:
                pz[bh, i, col] = p * dev.dropout_scale(seed_lo, seed_hi, threshold, inv_keep, bh, i, col)

    return kernel


@functools.cache
def ds_kernel(dropout: bool):
    """Backward: dP -> dS = P ∘ (dP ∘ Z − D) in place."""

    @cuda.jit
    def kernel(p, dp, big_d, seed_lo, seed_hi, threshold, inv_keep):
        n_q = p.shape[1]
        n_k = p.shape[2]
        start = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        for idx in range(start, p.shape[0] * n_q * n_k, cuda.gridDim.x * cuda.blockDim.x):
            bh = idx // (n_q * n_k)
            rest = idx - bh * n_q * n_k
            i = rest // n_k
            col = rest - i * n_k
            g = dp[bh, i, col]
            if dropout:
                g *= dev.dropout_scale(seed_lo, seed_hi, threshold, inv_keep, bh, i, col)
            dp[bh, i, col] = p[bh, i, col] * (g - big_d[bh, i])

    return kernel


def _matmul(a, b, c, alpha, *, trans_a=False, trans_b=False, config: MatmulConfig):
    tiles = -(-c.shape[1] // config.BM) * -(-c.shape[2] // config.BN)
    matmul_kernel(trans_a, trans_b, config)[c.shape[0] * tiles, config.threads()](a, b, c, np.float32(alpha))


def forward(q, k, v, *, tau: float, causal: bool, dropout, config: MatmulConfig):
    """O and lse on device arrays q (bh, N_q, d), k, v (bh, N_k, d); O in q's dtype, lse float32."""
    n_bh, n_q, d = q.shape
    n_k = k.shape[1]
    s = cuda.device_array((n_bh, n_q, n_k), dtype=np.float32)
    lse = cuda.device_array((n_bh, n_q), dtype=np.float32)
    out = cuda.device_array((n_bh, n_q, d), dtype=q.dtype)
    _matmul(q, k, s, tau, trans_b=True, config=config)  # line 1: S = tau Q Kᵀ
    rows = 1 if dev.simulator_enabled() else n_bh * n_q  # one block per row on a GPU
    softmax_kernel(config.row_threads, bool(causal), dropout.enabled)[rows, config.row_threads](
        s, lse, *dropout.kernel_args()
    )  # line 2: P = dropout(softmax(MASK(S)))
    _matmul(s, v, out, 1.0, config=config)  # line 3: O = P V
    return out, lse


def backward(q, k, v, out, lse, dout, *, tau: float, causal: bool, dropout, config: MatmulConfig):
    """dQ, dK, dV (in q's dtype) on device arrays, each step a separate kernel over whole matrices."""
    n_bh, n_q, d = q.shape
    n_k = k.shape[1]
    n_elem = n_bh * n_q * n_k
    p = cuda.device_array((n_bh, n_q, n_k), dtype=np.float32)
    pz = cuda.device_array((n_bh, n_q, n_k), dtype=np.float32) if dropout.enabled else p
    g = cuda.device_array((n_bh, n_q, n_k), dtype=np.float32)
    big_d = cuda.device_array((n_bh, n_q), dtype=np.float32)
    dq = cuda.device_array((n_bh, n_q, d), dtype=q.dtype)
    dk = cuda.device_array((n_bh, n_k, d), dtype=q.dtype)
    dv = cuda.device_array((n_bh, n_k, d), dtype=q.dtype)
    args = dropout.kernel_args()
    _matmul(q, k, p, tau, trans_b=True, config=config)  # S = tau Q Kᵀ
    probs_kernel(bool(causal), dropout.enabled)[dev.grid_stride_launch(n_elem)](p, lse, pz, *args)
    _matmul(pz, dout, dv, 1.0, trans_a=True, config=config)  # dV = (P∘Z)ᵀ dO
    _matmul(dout, v, g, 1.0, trans_b=True, config=config)  # dP = dO Vᵀ (before dropout)
    dev.row_dot_kernel[dev.grid_stride_launch(n_bh * n_q)](dout, out, big_d)  # D = rowsum(dO∘O)
    ds_kernel(dropout.enabled)[dev.grid_stride_launch(n_elem)](p, g, big_d, *args)  # dS
    _matmul(g, k, dq, tau, config=config)  # dQ = tau dS K
    _matmul(g, q, dk, tau, trans_a=True, config=config)  # dK = tau dSᵀ Q
    return dq, dk, dv
