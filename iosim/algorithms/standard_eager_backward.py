"""The backward of ``standard-eager``: PyTorch autograd's op-by-op chain, each op a full pass over HBM.

The forward's ops in reverse, each reading what its forward op saved:

1. dP_drop = dO Vᵀ (matmul backward, for the first operand): dP_drop written.
2. dV = P_dropᵀ dO (matmul backward, for the second): dV_j on chip while P_drop_ij and
   dO_i stream past (P_drop is P without dropout).
3. dP = dP_drop ∘ Z / (1 − p), when dropout_p > 0: dP_drop and the saved keep-mask Z
   read, dP written.
4. dS = P ∘ (dP − rowsum(dP ∘ P)) (softmax backward, from the saved output P): R whole
   rows of P and dP at a time, R = ⌊M / (2·N_k + 1)⌋; where no row fits, two passes on
   tiles, the first for the row sums, so P and dP are read twice.
5. dS = MASK'(dS), when the forward masked: hidden entries zeroed, the mask tile read
   when there is one.
6. dS = τ·dS (the scale's backward).
7. dQ = dS K and 8. dK = dSᵀ Q (the backward of S = Q Kᵀ): dQ_i, dK_j on chip.

On-chip buffers per head: steps 1, 2, 7, 8 one B_r × d block, one B_c × d block and one
B_r × B_c tile; steps 3 and 5 two B_r × B_c tiles, step 6 one; step 4 R rows of P and
dP and their R row sums, or two B_r × B_c tiles and B_r row sums.

Deviations: as in the forward, each matmul is tiled like Alg. 0's, not as cuBLAS tiles it.
"""

from __future__ import annotations

import numpy as np

from iosim.algorithms.algorithm import DOUT, GRADIENTS, Algorithm, Needs, Tensor, exact_counts, saved
from iosim.algorithms.standard_backward import flops, paper_form  # the same four products as Alg. 3
from iosim.algorithms.tile_ops import load_mask, row_dot, transpose, visible
from iosim.core.counts import Counts
from iosim.core.flops import matmul
from iosim.core.memory import Memory
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.core.visits import Axis, Visits, visits

TENSORS = (
    *saved(Tensor("P", "N_q", "N_k", "intermediate"), Tensor("Z", "N_q", "N_k", "intermediate", "mask"),
           Tensor("P_drop", "N_q", "N_k", "intermediate")),
    DOUT, Tensor("dP_drop", "N_q", "N_k", "intermediate"), Tensor("dP", "N_q", "N_k", "intermediate"),
    Tensor("dS", "N_q", "N_k", "intermediate"), *GRADIENTS,
)


def softmax_backward_rows(M: int, n_q: int, n_k: int) -> int:
    """R, the rows of P and dP that step 4 holds at once; 0 selects the two-pass fallback."""
    return min(n_q, M // (2 * n_k + 1))


def run(mem: Memory, pb: Problem, tiling: Tiling) -> None:
    """Run the eager backward on Q, K, V, dO and the forward's P, Z, P_drop; leaves dQ, dK, dV in HBM."""
    d, d_v = pb.shape.d, pb.shape.d_v
    tiles = visits(pb, tiling, skips_hidden=False)
    dropout = pb.dropout_p > 0
    dropped = "P_drop" if dropout else "P"

    for i, rows in mem.loop(tiles.query_blocks()):  # 1: dP_drop = dO Vᵀ
        dO_i = mem.load("dO", rows)
        for _, cols in mem.loop(tiles.keys_seen_by(i)):
            V_j = mem.load("V", cols)
            dP_ij = mem.alloc("dP_ij", rows.stop - rows.start, cols.stop - cols.start)
            mem.compute(matmul=matmul(dP_ij.rows, d_v, dP_ij.cols))
            if mem.numeric:
                dP_ij.data = dO_i.data @ transpose(V_j.data)  # (bh, Br, Bc)
            mem.store(dP_ij, "dP_drop", rows, cols)
            mem.free(V_j, dP_ij)
        mem.free(dO_i)

    for j, cols in mem.loop(tiles.key_blocks()):  # 2: dV = P_dropᵀ dO
        dV_j = mem.alloc("dV_j", cols.stop - cols.start, d_v, fill=0.0)
        for _, rows in mem.loop(tiles.queries_seeing(j)):
            P_ij, dO_i = mem.load(dropped, rows, cols, tile="P_ij"), mem.load("dO", rows)
            mem.compute(matmul=matmul(P_ij.cols, P_ij.rows, d_v))
            if mem.numeric:
                dV_j.data += transpose(P_ij.data) @ dO_i.data  # (bh, Bc, d_v)
            mem.free(P_ij, dO_i)
        mem.store(dV_j, "dV", cols)
        mem.free(dV_j)

    if dropout:  # 3: dP = dP_drop ∘ Z / (1 − p)
        for i, rows in mem.loop(tiles.query_blocks()):
            for _, cols in mem.loop(tiles.keys_seen_by(i)):
                dP_ij, Z_ij = mem.load("dP_drop", rows, cols, tile="dP_ij"), mem.load("Z", rows, cols, tile="Z_ij")
                if mem.numeric:
                    dP_ij.data = np.where(Z_ij.data > 0.5, dP_ij.data / (1.0 - pb.dropout_p), 0.0)
                mem.store(dP_ij, "dP", rows, cols)
                mem.free(dP_ij, Z_ij)

    grad = "dP" if dropout else "dP_drop"  # 4: dS = P ∘ (dP − rowsum(dP ∘ P))
    R = softmax_backward_rows(mem.M, pb.shape.n_q, pb.shape.n_k)
    if R >= 1:
        _softmax_backward_whole_rows(mem, pb, R, grad)
    else:
        _softmax_backward_two_pass(mem, tiles, grad)

    for i, rows in mem.loop(tiles.query_blocks()):  # 5 and 6: dS = τ·MASK'(dS), one pass each
        for _, cols in mem.loop(tiles.keys_seen_by(i)):
            if pb.hides_keys:
                dS_ij, mask_ij = mem.load("dS", rows, cols, tile="dS_ij"), load_mask(mem, pb, rows, cols)
                if mem.numeric:
                    dS_ij.data = np.where(visible(pb, rows, cols, mask_ij), dS_ij.data, 0.0)
                mem.store(dS_ij, "dS", rows, cols)
                mem.free(dS_ij)
                if mask_ij is not None:
                    mem.free(mask_ij)
    for i, rows in mem.loop(tiles.query_blocks()):
        for _, cols in mem.loop(tiles.keys_seen_by(i)):
            dS_ij = mem.load("dS", rows, cols, tile="dS_ij")
            if mem.numeric:
                dS_ij.data = pb.tau * dS_ij.data
            mem.store(dS_ij, "dS", rows, cols)
            mem.free(dS_ij)

    for i, rows in mem.loop(tiles.query_blocks()):  # 7: dQ = dS K
        dQ_i = mem.alloc("dQ_i", rows.stop - rows.start, d, fill=0.0)
        for _, cols in mem.loop(tiles.keys_seen_by(i)):
            dS_ij, K_j = mem.load("dS", rows, cols, tile="dS_ij"), mem.load("K", cols)
            mem.compute(matmul=matmul(dS_ij.rows, dS_ij.cols, d))
            if mem.numeric:
                dQ_i.data += dS_ij.data @ K_j.data  # (bh, Br, d)
            mem.free(dS_ij, K_j)
        mem.store(dQ_i, "dQ", rows)
        mem.free(dQ_i)

    for j, cols in mem.loop(tiles.key_blocks()):  # 8: dK = dSᵀ Q
        dK_j = mem.alloc("dK_j", cols.stop - cols.start, d, fill=0.0)
        for _, rows in mem.loop(tiles.queries_seeing(j)):
            dS_ij, Q_i = mem.load("dS", rows, cols, tile="dS_ij"), mem.load("Q", rows)
            mem.compute(matmul=matmul(dS_ij.cols, dS_ij.rows, d))
            if mem.numeric:
                dK_j.data += transpose(dS_ij.data) @ Q_i.data  # (bh, Bc, d)
            mem.free(dS_ij, Q_i)
        mem.store(dK_j, "dK", cols)
        mem.free(dK_j)


def _softmax_backward_whole_rows(mem: Memory, pb: Problem, R: int, grad: str) -> None:
    """Step 4 with R full rows of P and dP on chip: each read once."""
    for _, rows in mem.loop(Axis(pb.shape.n_q, R).all()):
        P_i, dP_i = mem.load("P", rows, tile="P_i"), mem.load(grad, rows, tile="dP_i")  # (bh, R, N_k)
        D_i = mem.alloc("D_i", rows.stop - rows.start)
        if mem.numeric:
            D_i.data = row_dot(P_i.data, dP_i.data)
            dP_i.data = P_i.data * (dP_i.data - D_i.data)  # dS_i in place of dP_i
        mem.store(dP_i, "dS", rows)
        mem.free(P_i, dP_i, D_i)


def _softmax_backward_two_pass(mem: Memory, tiles: Visits, grad: str) -> None:
    """Step 4 when no row fits: the row sums first, then dS; P and dP are read twice."""
    for i, rows in mem.loop(tiles.query_blocks()):
        D_i = mem.alloc("D_i", rows.stop - rows.start, fill=0.0)
        for _, cols in mem.loop(tiles.keys_seen_by(i)):
            P_ij, dP_ij = mem.load("P", rows, cols, tile="P_ij"), mem.load(grad, rows, cols, tile="dP_ij")
            if mem.numeric:
                D_i.data = D_i.data + row_dot(P_ij.data, dP_ij.data)
            mem.free(P_ij, dP_ij)
        for _, cols in mem.loop(tiles.keys_seen_by(i)):
            P_ij, dP_ij = mem.load("P", rows, cols, tile="P_ij"), mem.load(grad, rows, cols, tile="dP_ij")
            if mem.numeric:
                dP_ij.data = P_ij.data * (dP_ij.data - D_i.data)
            mem.store(dP_ij, "dS", rows, cols)
            mem.free(P_ij, dP_ij)
        mem.free(D_i)


def working_set(pb: Problem, tiling: Tiling, M: int) -> int:
    n_q, n_k = pb.shape.n_q, pb.shape.n_k
    Br, Bc = tiling.Br, tiling.Bc
    matmuls = (Br + Bc) * max(pb.shape.d, pb.shape.d_v) + Br * Bc  # steps 1, 2 (of d_v) and 7, 8 (of d)
    elementwise = (2 if pb.has_mask or pb.dropout_p > 0 else 1) * Br * Bc  # dP_drop [+ Z]; dS [+ mask]
    R = softmax_backward_rows(M, n_q, n_k)
    softmax = R * (2 * n_k + 1) if R >= 1 else 2 * Br * Bc + Br
    return max(matmuls, elementwise, softmax)


def traffic(pb: Problem, tiling: Tiling, M: int) -> Counts:
    """Exact counts: each op's pass, every tile visited."""
    n_q, n_k, d, d_v = pb.shape.n_q, pb.shape.n_k, pb.shape.d, pb.shape.d_v
    area = n_q * n_k
    pairs = visits(pb, tiling, skips_hidden=False).pairs()
    rows = sum(b_i * n for b_i, _, n in pairs)  # T_c·N_q
    cols = sum(b_j * n for _, b_j, n in pairs)  # T_r·N_k
    sp = 1 if softmax_backward_rows(M, n_q, n_k) >= 1 else 2  # reads of P and dP in step 4
    dropout, masked = pb.dropout_p > 0, pb.hides_keys
    reads = {
        "dO": n_q * d_v + rows * d_v, "V": cols * d_v,  # steps 1 and 2
        "P_drop": dropout * area, "P": (not dropout) * area + sp * area,  # steps 2 and 4
        "dP_drop": dropout * area + (not dropout) * sp * area, "Z": dropout * area,  # step 3, or 4
        "dP": dropout * sp * area,  # step 4
        "dS": masked * area + area + 2 * area,  # steps 5, 6, 7 and 8
        "K": cols * d, "Q": rows * d,  # steps 7 and 8
    }
    writes = {
        "dP_drop": area, "dV": n_k * d_v, "dP": dropout * area,
        "dS": area + masked * area + area,  # steps 4, 5, 6
        "dQ": n_q * d, "dK": n_k * d,
    }
    if pb.has_mask:
        reads["mask"] = area  # step 5
    return exact_counts(TENSORS, pb, reads, writes, working_set(pb, tiling, M))


ALGORITHM = Algorithm(
    name="standard-eager backward", run=run, tensors=TENSORS, outer="Br", working_set=working_set,
    traffic=traffic, paper_form=paper_form, paper_label="Θ(Nd + N²)", flops=flops,
    needs=Needs(window=True),
)
