"""Attention for a small cache, M < d²: Saha and Ye's N²d/√M algorithm.

Saha and Ye, "The I/O Complexity of Attention, or How Optimal is FlashAttention?"
(ICML 2024): below M ≈ d² the optimal forward IO is Θ(N²d/√M), reached by
materializing S with an IO-optimal matrix product rather than by FlashAttention.
Three steps, each a pass over HBM:

1. S = MASK(tau · Q Kᵀ) by an output-stationary tiled product: an S_ij tile of
   B_r × B_c stays on chip while the inner dimension d streams past one column of
   Q_i and of K_j at a time (a rank-1 update each); S_ij is then written to HBM.
2. P = softmax(S), the pass over S of Alg. 0 line 2 (``_softmax``): whole rows
   when one fits, else the two-pass online softmax on B_r × B_c tiles.
3. O = P V by the same kind of product: an O tile of B_r × B_d (B_d = min(B_c, d_v)
   columns of O) stays on chip while the inner dimension N_k streams past one
   column of P_i and one row of V at a time; the O tile is written once.

With square-ish tiles, B_r ≈ B_c ≈ √M, steps 1 and 3 move about 4·N²d/√M and
steps 2 and the S, P writes about 4·N², which is below N²d/√M exactly when M < d².

On-chip buffers per head: step 1 S_ij (B_r × B_c), a column of Q_i (B_r) and of
K_j (B_c), then the mask tile (B_r × B_c) when a mask is given; step 2 as in
``_softmax``; step 3 O_i (B_r × B_d), a column of P_i (B_r) and a row of V (B_d).

Deviations: the inner dimension streams one column at a time, which moves the same
traffic as any wider chunk and needs the least SRAM. The scale and the mask are
applied in step 1, before S is written, and dropout in step 3, to each column of P as
it arrives (P in HBM is the softmax itself, as in ``standard``). Every tile is visited, masked or not: S and P
are materialized whole, as in standard attention.
"""

from __future__ import annotations

import numpy as np

from iosim.algorithms._softmax import materialized_flops, softmax_rows, softmax_two_pass, softmax_whole_rows
from iosim.algorithms.algorithm import OUTPUT, Algorithm, Tensor, exact_counts
from iosim.algorithms.tile_ops import apply_dropout, load_mask, masked
from iosim.core.counts import Counts
from iosim.core.flops import matmul
from iosim.core.memory import Memory
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.core.visits import Axis, ceil_div, visits

TENSORS = (Tensor("S", "N_q", "N_k", "intermediate"), Tensor("P", "N_q", "N_k", "intermediate"), OUTPUT)


def output_columns(pb: Problem, tiling: Tiling) -> Axis:
    """The d_v columns of O in blocks of B_d = min(B_c, d_v): the O tiles of step 3 are B_r × B_d."""
    return Axis(pb.shape.d_v, min(tiling.Bc, pb.shape.d_v))


def run(mem: Memory, pb: Problem, tiling: Tiling) -> None:
    """Run the three steps on Q, K, V (and mask) in ``mem``; leaves S, P and O in HBM."""
    n_k, d = pb.shape.n_k, pb.shape.d
    tiles = visits(pb, tiling, skips_hidden=False)

    # step 1: S = MASK(tau · Q Kᵀ), one B_r × B_c tile at a time, d streamed
    for _, rows in mem.loop(tiles.q.all()):
        for _, cols in mem.loop(tiles.k.all()):
            S_ij = mem.alloc("S_ij", rows.stop - rows.start, cols.stop - cols.start, fill=0.0)
            for _, inner in mem.loop(Axis(d, 1).all()):
                q_col, k_col = mem.load("Q", rows, inner, tile="q_col"), mem.load("K", cols, inner, tile="k_col")
                mem.compute(matmul=matmul(q_col.rows, 1, k_col.rows))
                if mem.numeric:
                    S_ij.data += q_col.data @ np.swapaxes(k_col.data, -1, -2)  # rank 1: (bh, Br, Bc)
                mem.free(q_col, k_col)
            mask_ij = load_mask(mem, pb, rows, cols)
            if mem.numeric:
                S_ij.data = masked(pb, pb.tau * S_ij.data, rows, cols, mask_ij)
            mem.store(S_ij, "S", rows, cols)
            mem.free(S_ij)
            if mask_ij is not None:
                mem.free(mask_ij)

    # step 2: P = softmax(S)
    R = softmax_rows(mem.M, pb.shape.n_q, n_k)
    if R >= 1:
        softmax_whole_rows(mem, pb, R)
    else:
        softmax_two_pass(mem, pb, tiles)

    # step 3: O = P V, one B_r × B_d tile of O at a time, N_k streamed
    for _, rows in mem.loop(tiles.q.all()):
        for _, dcols in mem.loop(output_columns(pb, tiling).all()):
            O_i = mem.alloc("O_i", rows.stop - rows.start, dcols.stop - dcols.start, fill=0.0)
            for _, key in mem.loop(Axis(n_k, 1).all()):
                p_col, v_row = mem.load("P", rows, key, tile="p_col"), mem.load("V", key, dcols, tile="v_row")
                mem.compute(matmul=matmul(p_col.rows, 1, v_row.cols))
                if mem.numeric:
                    O_i.data += apply_dropout(pb, p_col.data, rows, key) @ v_row.data  # rank 1: (bh, Br, B_d)
                mem.free(p_col, v_row)
            mem.store(O_i, "O", rows, dcols)
            mem.free(O_i)


def working_set(pb: Problem, tiling: Tiling, M: int) -> int:
    n_q, n_k = pb.shape.n_q, pb.shape.n_k
    Br, Bc = tiling.Br, tiling.Bc
    Bd = min(Bc, pb.shape.d_v)
    step1 = Br * Bc + max(Br + Bc, pb.has_mask * Br * Bc)  # S_ij + (columns of Q_i, K_j; then the mask tile)
    R = softmax_rows(M, n_q, n_k)
    step2 = R * (n_k + 2) if R >= 1 else Br * Bc + 4 * Br  # rows of S with m, ℓ; or two-pass
    step3 = Br * Bd + Br + Bd  # O_i, a column of P_i, a row of V
    return max(step1, step2, step3)


def traffic(pb: Problem, tiling: Tiling, M: int) -> Counts:
    """Exact counts; the peak is the working set, since every tile is visited.

    Step 1 reads Q_i (b_i·d) for each of the T_c key blocks and K_j (b_j·d) for each of
    the T_r query blocks; step 3 reads P_i (b_i·N_k) for each of the T_d column blocks
    of O and V (N_k·b_d) for each query block.
    """
    n_q, n_k, d, d_v = pb.shape.n_q, pb.shape.n_k, pb.shape.d, pb.shape.d_v
    T_r, T_c = ceil_div(n_q, tiling.Br), ceil_div(n_k, tiling.Bc)
    T_d = output_columns(pb, tiling).T
    passes = 1 if softmax_rows(M, n_q, n_k) >= 1 else 2
    reads = {
        "Q": T_c * n_q * d, "K": T_r * n_k * d,  # step 1
        "S": passes * n_q * n_k,  # step 2
        "P": T_d * n_q * n_k, "V": T_r * n_k * d_v,  # step 3
    }
    writes = {"S": n_q * n_k, "P": n_q * n_k, "O": n_q * d_v}
    if pb.has_mask:
        reads["mask"] = n_q * n_k  # every tile of the mask, once
    return exact_counts(TENSORS, pb, reads, writes, working_set(pb, tiling, M))


def paper_form(pb: Problem, M: int) -> float:
    """Saha and Ye's Θ(N²d/√M), as N²d/√M with N² ↦ N_q·N_k."""
    n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d
    return pb.shape.bh * n_q * n_k * d / M**0.5


ALGORITHM = Algorithm(
    name="small-cache", run=run, tensors=TENSORS, outer="Br", working_set=working_set, traffic=traffic,
    paper_form=paper_form, paper_label="Θ(N²d/√M)", flops=materialized_flops,
)
