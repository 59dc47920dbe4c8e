"""Standard attention as PyTorch runs it eagerly: one kernel, one full pass over HBM, per op.

The forward of a GPT-2-style attention written op by op (``w = q @ k.T``,
``w = w / sqrt(d)``, the mask, ``softmax``, ``dropout``, ``w @ v``), each op reading
its operands from HBM and writing its result back:

1. S = Q Kᵀ: for each Q_i, K_j streams past and S_ij is written (as Alg. 0 step 1).
2. S = τ·S: every tile of S read and written.
3. S = MASK(S), when the problem has a band (causal, or a sliding window) or a mask:
   every tile of S read, with the mask tile when there is one, and written. A band is
   computed from indices (as a PyTorch user passes it, an explicit mask would be read).
4. P = softmax(S): R whole rows at a time, or two passes on tiles (as Alg. 0 step 2).
5. P_drop = P ∘ Z and the keep-mask Z (one byte per element), when dropout_p > 0:
   every tile of P read, both written, as PyTorch's dropout saves its mask.
6. O = P_drop V: O_i on chip while P_drop_ij (P without dropout) and V_j stream past.

On-chip buffers per head: step 1 Q_i (B_r × d), K_j (B_c × d), S_ij (B_r × B_c);
steps 2, 3, 5 one or two B_r × B_c tiles (S_ij and the mask tile; P_ij and Z_ij);
step 4 as Alg. 0; step 6 O_i (B_r × d_v), P_ij (B_r × B_c), V_j (B_c × d_v).

Deviations: each matmul is tiled like Alg. 0's (K and V re-read once per query block),
not as cuBLAS tiles it; masked scores are −inf rather than GPT-2's −10⁴, so fully
masked rows give 0 rather than a uniform average; the causal mask costs no reads.
"""

from __future__ import annotations

import numpy as np

from iosim.algorithms import standard_eager_backward
from iosim.algorithms._softmax import materialized_flops, softmax_rows, softmax_two_pass, softmax_whole_rows
from iosim.algorithms.algorithm import OUTPUT, Algorithm, Needs, Tensor, exact_counts
from iosim.algorithms.standard import paper_form  # Alg. 0's form: the same matrices, unfused
from iosim.algorithms.tile_ops import apply_dropout, load_mask, transpose, visible
from iosim.core.counts import Counts
from iosim.core.flops import matmul
from iosim.core.memory import Memory
from iosim.core.problem import Problem
from iosim.core.rng import dropout_tile
from iosim.core.tiling import Tiling
from iosim.core.visits import visits

TENSORS = (
    Tensor("S", "N_q", "N_k", "intermediate"), Tensor("P", "N_q", "N_k", "intermediate"),
    Tensor("Z", "N_q", "N_k", "intermediate", "mask"), Tensor("P_drop", "N_q", "N_k", "intermediate"), OUTPUT,
)


def masks(pb: Problem) -> bool:
    """Whether step 3 runs: a band (a sliding window, or causal) or an explicit mask."""
    return pb.hides_keys


def run(mem: Memory, pb: Problem, tiling: Tiling) -> None:
    """Run the six eager ops on Q, K, V (and mask) in ``mem``; leaves S, P, Z, P_drop and O in HBM."""
    d, d_v = pb.shape.d, pb.shape.d_v
    tiles = visits(pb, tiling, skips_hidden=False)

    for i, rows in mem.loop(tiles.query_blocks()):  # 1: S = Q Kᵀ
        Q_i = mem.load("Q", rows)
        for _, cols in mem.loop(tiles.keys_seen_by(i)):
            K_j = mem.load("K", cols)
            S_ij = mem.alloc("S_ij", rows.stop - rows.start, cols.stop - cols.start)
            mem.compute(matmul=matmul(S_ij.rows, d, S_ij.cols))
            if mem.numeric:
                S_ij.data = Q_i.data @ transpose(K_j.data)  # (bh, Br, Bc)
            mem.store(S_ij, "S", rows, cols)
            mem.free(K_j, S_ij)
        mem.free(Q_i)

    for i, rows in mem.loop(tiles.query_blocks()):  # 2: S = τ·S
        for _, cols in mem.loop(tiles.keys_seen_by(i)):
            S_ij = mem.load("S", rows, cols, tile="S_ij")
            if mem.numeric:
                S_ij.data = pb.tau * S_ij.data
            mem.store(S_ij, "S", rows, cols)
            mem.free(S_ij)

    if masks(pb):  # 3: S = MASK(S)
        for i, rows in mem.loop(tiles.query_blocks()):
            for _, cols in mem.loop(tiles.keys_seen_by(i)):
                S_ij, mask_ij = mem.load("S", rows, cols, tile="S_ij"), load_mask(mem, pb, rows, cols)
                if mem.numeric:
                    S_ij.data = np.where(visible(pb, rows, cols, mask_ij), S_ij.data, -np.inf)  # (bh, Br, Bc)
                mem.store(S_ij, "S", rows, cols)
                mem.free(S_ij)
                if mask_ij is not None:
                    mem.free(mask_ij)

    R = softmax_rows(mem.M, pb.shape.n_q, pb.shape.n_k)  # 4: P = softmax(S)
    if R >= 1:
        softmax_whole_rows(mem, pb, R)
    else:
        softmax_two_pass(mem, pb, tiles)

    if pb.dropout_p > 0:  # 5: P_drop = P ∘ Z, and Z saved
        for i, rows in mem.loop(tiles.query_blocks()):
            for _, cols in mem.loop(tiles.keys_seen_by(i)):
                P_ij = mem.load("P", rows, cols, tile="P_ij")
                Z_ij = mem.alloc("Z_ij", P_ij.rows, P_ij.cols)
                if mem.numeric:
                    Z_ij.data = dropout_tile(pb.seed, pb.dropout_p, pb.dropout_streams(), rows, cols)
                    P_ij.data = apply_dropout(pb, P_ij.data, rows, cols)
                mem.store(P_ij, "P_drop", rows, cols)
                mem.store(Z_ij, "Z", rows, cols)
                mem.free(P_ij, Z_ij)

    dropped = "P_drop" if pb.dropout_p > 0 else "P"
    for i, rows in mem.loop(tiles.query_blocks()):  # 6: O = P_drop V
        O_i = mem.alloc("O_i", rows.stop - rows.start, d_v, fill=0.0)
        for _, cols in mem.loop(tiles.keys_seen_by(i)):
            P_ij, V_j = mem.load(dropped, rows, cols, tile="P_ij"), mem.load("V", cols)
            mem.compute(matmul=matmul(P_ij.rows, P_ij.cols, d_v))
            if mem.numeric:
                O_i.data += P_ij.data @ V_j.data  # (bh, Br, d_v)
            mem.free(P_ij, V_j)
        mem.store(O_i, "O", rows)
        mem.free(O_i)


def working_set(pb: Problem, tiling: Tiling, M: int) -> int:
    n_q, n_k = pb.shape.n_q, pb.shape.n_k
    Br, Bc = tiling.Br, tiling.Bc
    matmuls = (Br + Bc) * max(pb.shape.d, pb.shape.d_v) + Br * Bc  # steps 1 (of d) and 6 (of d_v)
    elementwise = (2 if pb.has_mask or pb.dropout_p > 0 else 1) * Br * Bc  # S_ij [+ mask tile]; P_ij [+ Z_ij]
    R = softmax_rows(M, n_q, n_k)
    softmax = R * (n_k + 2) if R >= 1 else Br * Bc + 4 * Br  # as Alg. 0 step 2
    return max(matmuls, elementwise, softmax)


def traffic(pb: Problem, tiling: Tiling, M: int) -> Counts:
    """Exact counts: each op's pass, every tile visited."""
    n_q, n_k, d, d_v = pb.shape.n_q, pb.shape.n_k, pb.shape.d, pb.shape.d_v
    area = n_q * n_k
    cols = sum(b_j * n for _, b_j, n in visits(pb, tiling, skips_hidden=False).pairs())  # T_r·N_k
    softmax_passes = 1 if softmax_rows(M, n_q, n_k) >= 1 else 2
    masked = masks(pb)
    dropout = pb.dropout_p > 0
    reads = {
        "Q": n_q * d, "K": cols * d, "V": cols * d_v,  # steps 1 and 6
        "S": area + masked * area + softmax_passes * area,  # steps 2, 3, 4
        "P": area,  # step 5, or step 6 without dropout
        "P_drop": dropout * area,  # step 6
    }
    writes = {
        "S": area + area + masked * area,  # steps 1, 2, 3
        "P": area, "P_drop": dropout * area, "Z": dropout * area, "O": n_q * d_v,
    }
    if pb.has_mask:
        reads["mask"] = area  # step 3
    return exact_counts(TENSORS, pb, reads, writes, working_set(pb, tiling, M))


ALGORITHM = Algorithm(
    name="standard-eager", run=run, tensors=TENSORS, outer="Br", working_set=working_set, traffic=traffic,
    paper_form=paper_form, paper_label="Θ(Nd + N²)", backward=standard_eager_backward.ALGORITHM,
    flops=materialized_flops,
    needs=Needs(window=True),
)
