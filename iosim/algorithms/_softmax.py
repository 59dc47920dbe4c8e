"""Step 2 of the algorithms that write S to HBM: P = softmax(S), read from S and written to P.

Alg. 0 line 2 (Dao et al. 2022). R = ⌊M / (N_k + 2)⌋ whole rows of S fit on chip
with their max and sum: S is read once. Where not even one row fits it is the
two-pass online softmax (Milakov and Gimelshein, 2018) on the visited B_r × B_c
tiles: one pass for the running max and sum, one to normalize, reading S twice.
P in HBM is the softmax itself, what a backward pass reads: dropout is applied where
P is used (the PV step).
"""

from __future__ import annotations

import numpy as np

from iosim.algorithms.tile_ops import exp_diff, safe_divide
from iosim.core.flops import Flops
from iosim.core.memory import Memory
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.core.visits import Axis, Visits, visits


def softmax_rows(M: int, n_q: int, n_k: int) -> int:
    """R, the rows of S that step 2 holds at once; 0 selects the two-pass fallback."""
    return min(n_q, M // (n_k + 2))


def materialized_flops(pb: Problem, tiling: Tiling, M: int) -> Flops:
    """The arithmetic of attention that writes S to HBM (standard, standard-eager, small-cache): both products
    over all of S, 2·N_q·N_k·d (QKᵀ) and 2·N_q·N_k·d_v (PV), and the softmax pass's exponentials."""
    n_q, n_k = pb.shape.n_q, pb.shape.n_k
    matmul = 2 * n_q * n_k * (pb.shape.d + pb.shape.d_v)
    return Flops(matmul=matmul, exp=softmax_exps(pb, tiling, M)).scaled(pb.shape.bh)


def softmax_exps(pb: Problem, tiling: Tiling, M: int) -> int:
    """Exponentials of the pass, per head: one per element of S; with two passes, two per element
    and one per row and tile (ℓ's rescaling)."""
    n_q, n_k = pb.shape.n_q, pb.shape.n_k
    if softmax_rows(M, n_q, n_k) >= 1:
        return n_q * n_k
    return 2 * n_q * n_k + sum(b_i * n for b_i, _, n in visits(pb, tiling, skips_hidden=False).pairs())


def softmax_whole_rows(mem: Memory, pb: Problem, R: int) -> None:
    """Step 2 with R full rows of S on chip: S is read once."""
    for _, rows in mem.loop(Axis(pb.shape.n_q, R).all()):
        S_i = mem.load("S", rows, tile="S_i")  # (bh, R, N_k)
        m_i, l_i = mem.alloc("m_i", rows.stop - rows.start), mem.alloc("l_i", rows.stop - rows.start)
        mem.compute(exp=S_i.size)
        if mem.numeric:
            m_i.data = S_i.data.max(axis=-1, keepdims=True)
            S_i.data = exp_diff(S_i.data, m_i.data)
            l_i.data = S_i.data.sum(axis=-1, keepdims=True)
            S_i.data = safe_divide(S_i.data, l_i.data)
        mem.store(S_i, "P", rows)
        mem.free(S_i, m_i, l_i)


def softmax_two_pass(mem: Memory, pb: Problem, tiles: Visits) -> None:
    """Step 2 when no row fits: online max and sum, then normalize; S is read twice."""
    for i, rows in mem.loop(tiles.query_blocks()):
        br = rows.stop - rows.start
        m_i, l_i = mem.alloc("m_i", br, fill=-np.inf), mem.alloc("l_i", br, fill=0.0)
        for _, cols in mem.loop(tiles.keys_seen_by(i)):  # pass 1: running max and sum
            S_ij = mem.load("S", rows, cols, tile="S_ij")
            m_tilde, l_tilde = mem.alloc("m~_ij", br), mem.alloc("l~_ij", br)
            mem.compute(exp=S_ij.size + br)  # exp(S_ij − m̃) and the rescaling of ℓ_i
            if mem.numeric:
                m_tilde.data = np.maximum(m_i.data, S_ij.data.max(axis=-1, keepdims=True))
                l_tilde.data = exp_diff(S_ij.data, m_tilde.data).sum(axis=-1, keepdims=True)
                l_i.data = exp_diff(m_i.data, m_tilde.data) * l_i.data + l_tilde.data
                m_i.data = m_tilde.data
            mem.free(S_ij, m_tilde, l_tilde)
        for _, cols in mem.loop(tiles.keys_seen_by(i)):  # pass 2: P_ij = exp(S_ij − m_i) / ℓ_i
            S_ij = mem.load("S", rows, cols, tile="S_ij")
            mem.compute(exp=S_ij.size)
            if mem.numeric:
                S_ij.data = safe_divide(exp_diff(S_ij.data, m_i.data), l_i.data)
            mem.store(S_ij, "P", rows, cols)
            mem.free(S_ij)
        mem.free(m_i, l_i)
