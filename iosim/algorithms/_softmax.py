"""Step 2 of the algorithms that write S to HBM: P = softmax(S), read from S and written to P.

Alg. 0 line 2 (Dao et al. 2022). R = ⌊M / (N_k + 2)⌋ whole rows of S fit on chip
with their max and sum: S is read once. Where not even one row fits it is the
two-pass online softmax (Milakov and Gimelshein, 2018) on the visited B_r × B_c
tiles: one pass for the running max and sum, one to normalize, reading S twice.
Dropout is applied to P as it is written.
"""

from __future__ import annotations

import numpy as np

from iosim.algorithms._tile_ops import apply_dropout, exp_diff, safe_divide
from iosim.memory import Memory
from iosim.problem import Problem
from iosim.visits import Axis, Visits


def softmax_rows(M: int, n_q: int, n_k: int) -> int:
    """R, the rows of S that step 2 holds at once; 0 selects the two-pass fallback."""
    return min(n_q, M // (n_k + 2))


def softmax_whole_rows(mem: Memory, pb: Problem, R: int) -> None:
    """Step 2 with R full rows of S on chip: S is read once."""
    n_k = pb.shape.n_k
    for _, rows in mem.loop(Axis(pb.shape.n_q, R).all()):
        S_i = mem.load("S", rows, tile="S_i")  # (bh, R, N_k)
        m_i, l_i = mem.alloc("m_i", rows.stop - rows.start), mem.alloc("l_i", rows.stop - rows.start)
        if mem.numeric:
            m_i.data = S_i.data.max(axis=-1, keepdims=True)
            S_i.data = exp_diff(S_i.data, m_i.data)
            l_i.data = S_i.data.sum(axis=-1, keepdims=True)
            S_i.data = apply_dropout(pb, safe_divide(S_i.data, l_i.data), rows, slice(0, n_k))
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
            if mem.numeric:
                m_tilde.data = np.maximum(m_i.data, S_ij.data.max(axis=-1, keepdims=True))
                l_tilde.data = exp_diff(S_ij.data, m_tilde.data).sum(axis=-1, keepdims=True)
                l_i.data = exp_diff(m_i.data, m_tilde.data) * l_i.data + l_tilde.data
                m_i.data = m_tilde.data
            mem.free(S_ij, m_tilde, l_tilde)
        for _, cols in mem.loop(tiles.keys_seen_by(i)):  # pass 2: P_ij = exp(S_ij − m_i) / ℓ_i
            S_ij = mem.load("S", rows, cols, tile="S_ij")
            if mem.numeric:
                P = safe_divide(exp_diff(S_ij.data, m_i.data), l_i.data)
                S_ij.data = apply_dropout(pb, P, rows, cols)
            mem.store(S_ij, "P", rows, cols)
            mem.free(S_ij)
        mem.free(m_i, l_i)
