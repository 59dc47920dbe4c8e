"""FlashAttention forward with the loops swapped: Q blocks outer, K/V blocks inner.

Seed 003, "Possible Improvement" (also the loop order of FlashAttention-2). O_i,
ℓ_i and m_i stay on chip for the whole inner loop and are written once, so HBM
sees Q, O, ℓ, m once and K, V once per query block.

On-chip buffers per head: Q_i, O_i (B_r × d each), K_j, V_j (B_c × d each),
S_ij (B_r × B_c, overwritten by P̃_ij), ℓ_i, m_i, m_i^new, ℓ̃_ij (B_r each), and
the mask tile (B_r × B_c) when a mask is given.

Deviations: O_i is accumulated unnormalized and divided by ℓ_i once at the end
(FlashAttention-2's order); the result is the same attention. With a causal mask,
K/V blocks entirely hidden from the query block are skipped, as FlashAttention's
kernels do (an explicit mask is not inspected). Rows that see no key end with
O = 0, ℓ = 0, m = −inf.
"""

from __future__ import annotations

import numpy as np

from iosim.algorithms._tile_ops import apply_dropout, exp_diff, load_mask, safe_divide, scores
from iosim.inputs import causal_key_blocks
from iosim.memory import Memory
from iosim.problem import Problem


def flash_swapped(mem: Memory, pb: Problem, Br: int, Bc: int) -> None:
    """Run the swapped-loop forward on Q, K, V (and mask) in ``mem``; leaves O, l, m in HBM."""
    n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d

    for _, rows in mem.blocks(n_q, Br, every=pb.causal):  # outer loop over query blocks
        br = rows.stop - rows.start
        Q_i = mem.load("Q", rows)
        O_i = mem.alloc("O_i", br, d, fill=0.0)  # on chip for the whole inner loop
        l_i, m_i = mem.alloc("l_i", br, fill=0.0), mem.alloc("m_i", br, fill=-np.inf)
        Tc_i = causal_key_blocks(n_q, n_k, rows.stop - 1, Bc) if pb.causal else None
        for _, cols in mem.blocks(n_k, Bc, stop=Tc_i):  # inner loop over the key/value blocks Q_i sees
            bc = cols.stop - cols.start
            K_j, V_j = mem.load("K", cols), mem.load("V", cols)
            mask_ij = load_mask(mem, pb, rows, cols)
            S_ij = mem.alloc("S_ij", br, bc)
            m_new, l_tilde = mem.alloc("m_new", br), mem.alloc("l~_ij", br)
            if mem.numeric:
                S_ij.data = scores(pb, Q_i, K_j, rows, cols, mask_ij)  # (bh, Br, Bc)
                m_new.data = np.maximum(m_i.data, S_ij.data.max(axis=-1, keepdims=True))
                S_ij.data = exp_diff(S_ij.data, m_new.data)  # P̃_ij against the new max
                l_tilde.data = S_ij.data.sum(axis=-1, keepdims=True)
                alpha = exp_diff(m_i.data, m_new.data)
                l_i.data = alpha * l_i.data + l_tilde.data
                O_i.data = alpha * O_i.data + apply_dropout(pb, S_ij.data, rows, cols) @ V_j.data
                m_i.data = m_new.data
            mem.free(K_j, V_j, S_ij, m_new, l_tilde)
            if mask_ij is not None:
                mem.free(mask_ij)
        if mem.numeric:
            O_i.data = safe_divide(O_i.data, l_i.data)
        mem.store(O_i, "O", rows)  # written once per query block
        mem.store(l_i, "l", rows)
        mem.store(m_i, "m", rows)
        mem.free(Q_i, O_i, l_i, m_i)
