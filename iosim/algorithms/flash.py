"""FlashAttention forward: Algorithm 1, with Algorithm 2's scale, mask and dropout.

Dao et al., "FlashAttention: Fast and Memory-Efficient Exact Attention with
IO-Awareness" (2022); seed 000 (Alg. 2) and seed 003 (Alg. 1). K/V blocks form the
outer loop; the running O_i, ℓ_i and m_i go back to HBM after every inner step.

On-chip buffers per head: K_j, V_j (B_c × d each), Q_i, O_i (B_r × d each),
S_ij (B_r × B_c, overwritten by P̃_ij), ℓ_i, m_i, m̃_ij, ℓ̃_ij, m_i^new, ℓ_i^new
(B_r each), and the mask tile (B_r × B_c) when a mask is given.

Deviations: the RNG state R is the seed itself (dropout is counter-based, see
``iosim.rng``), so nothing is written for it. With a causal mask, an inner step
whose block is entirely hidden is skipped (it would leave O_i, ℓ_i, m_i unchanged),
as FlashAttention's kernels do; an explicit mask is not inspected, so its blocks are
all visited. Rows that see no key end with O = 0, ℓ = 0, m = −inf.
"""

from __future__ import annotations

import numpy as np

from iosim.algorithms._tile_ops import apply_dropout, exp_diff, load_mask, safe_divide, scores
from iosim.inputs import causal_first_query_block
from iosim.memory import Memory
from iosim.problem import Problem


def flash(mem: Memory, pb: Problem, Br: int, Bc: int) -> None:
    """Run Alg. 1/2 on Q, K, V (and mask) in ``mem``; leaves O, l, m in HBM."""
    n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d

    # Alg. 2 line 3: initialize O = (0), ℓ = (0), m = (−inf) in HBM
    for _, rows in mem.blocks(n_q, Br):
        br = rows.stop - rows.start
        for name, cols, fill in (("O", d, 0.0), ("l", 1, 0.0), ("m", 1, -np.inf)):
            init = mem.alloc(f"{name}_i", br, cols, fill=fill)
            mem.store(init, name, rows)
            mem.free(init)

    for _, cols in mem.blocks(n_k, Bc, every=pb.causal):  # Alg. 2 line 6
        K_j, V_j = mem.load("K", cols), mem.load("V", cols)  # line 7 (the last query row sees every K_j)
        bc = cols.stop - cols.start
        first = causal_first_query_block(n_q, n_k, cols.start, Br) if pb.causal else 0
        for _, rows in mem.blocks(n_q, Br, start=first):  # line 8, from the first block that sees K_j
            br = rows.stop - rows.start
            Q_i, O_i = mem.load("Q", rows), mem.load("O", rows)  # line 9
            l_i, m_i = mem.load("l", rows), mem.load("m", rows)
            mask_ij = load_mask(mem, pb, rows, cols)
            S_ij = mem.alloc("S_ij", br, bc)
            m_tilde, l_tilde = mem.alloc("m~_ij", br), mem.alloc("l~_ij", br)
            m_new, l_new = mem.alloc("m_new", br), mem.alloc("l_new", br)
            if mem.numeric:
                S_ij.data = scores(pb, Q_i, K_j, rows, cols, mask_ij)  # lines 10-11: (bh, Br, Bc)
                m_tilde.data = S_ij.data.max(axis=-1, keepdims=True)  # line 12
                S_ij.data = exp_diff(S_ij.data, m_tilde.data)  # P̃_ij, in place of S_ij
                l_tilde.data = S_ij.data.sum(axis=-1, keepdims=True)
                m_new.data = np.maximum(m_i.data, m_tilde.data)  # line 13
                alpha, beta = exp_diff(m_i.data, m_new.data), exp_diff(m_tilde.data, m_new.data)
                l_new.data = alpha * l_i.data + beta * l_tilde.data
                P_dropped = apply_dropout(pb, S_ij.data, rows, cols)  # line 14
                O_i.data = safe_divide(  # line 15: (bh, Br, d)
                    l_i.data * alpha * O_i.data + beta * (P_dropped @ V_j.data), l_new.data
                )
            mem.store(O_i, "O", rows)  # line 15
            mem.store(l_new, "l", rows)  # line 16
            mem.store(m_new, "m", rows)
            mem.free(Q_i, O_i, l_i, m_i, S_ij, m_tilde, l_tilde, m_new, l_new)
            if mask_ij is not None:
                mem.free(mask_ij)
        mem.free(K_j, V_j)
