"""Standard attention backward: Algorithm 3, with dP and dS materialized in HBM.

Dao et al. (2022), Algorithm 3 (appendix B), each step reading its inputs from HBM
by blocks and writing its result back:

1. dV = (P ∘ Z)ᵀ dO: dV_j on chip while P_ij and dO_i stream past.
2. dP = (dO Vᵀ) ∘ Z: for each dO_i, V_j streams past and dP_ij is written.
3. D = rowsum(dO ∘ O) and dS = P ∘ (dP − D): D_i from O_i and dO_i, then P_ij and
   dP_ij stream past and dS_ij is written.
4. dQ = τ dS K: dQ_i on chip while dS_ij and K_j stream past.
5. dK = τ dSᵀ Q: dK_j on chip while dS_ij and Q_i stream past.

It reads what the ``standard`` forward saved: P = softmax(S) and O. Z is the
dropout mask, regenerated on chip from the seed, as the forward applied it.

On-chip buffers per head: steps 1, 2, 4, 5 one B_r × d block, one B_c × d block and
one B_r × B_c tile; step 3 O_i, dO_i (B_r × d each) and D_i (B_r), then D_i, P_ij and
dP_ij (B_r × B_c each, dS_ij in place of dP_ij).

Deviations: Algorithm 3 computes D_i = Σ_l P_il dP_il from whole rows; here it is
rowsum(dO_i ∘ O_i), the same number (Alg. 4 line 19), so that every step works on
tiles. Every tile is visited, masked or not, and the mask is not read: P is zero
where it hides a key.
"""

from __future__ import annotations

from iosim.algorithms.algorithm import DOUT, GRADIENTS, OUTPUT, Algorithm, Needs, Tensor, exact_counts, saved
from iosim.algorithms.tile_ops import apply_dropout, row_dot, transpose
from iosim.core.counts import Counts
from iosim.core.flops import Flops, matmul
from iosim.core.memory import Memory
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.core.visits import visits

TENSORS = (
    *saved(Tensor("P", "N_q", "N_k", "intermediate"), OUTPUT), DOUT,
    Tensor("dP", "N_q", "N_k", "intermediate"), Tensor("dS", "N_q", "N_k", "intermediate"),
    *GRADIENTS,
)


def run(mem: Memory, pb: Problem, tiling: Tiling) -> None:
    """Run Alg. 3 on P, O, dO, K, V, Q in ``mem``; leaves dP, dS, dQ, dK and dV in HBM."""
    d, d_v, tau = pb.shape.d, pb.shape.d_v, pb.tau
    tiles = visits(pb, tiling, skips_hidden=False)

    # step 1: dV = (P ∘ Z)ᵀ dO
    for j, cols in mem.loop(tiles.key_blocks()):
        dV_j = mem.alloc("dV_j", cols.stop - cols.start, d_v, fill=0.0)
        for _, rows in mem.loop(tiles.queries_seeing(j)):
            P_ij, dO_i = mem.load("P", rows, cols, tile="P_ij"), mem.load("dO", rows)
            mem.compute(matmul=matmul(P_ij.cols, P_ij.rows, d_v))
            if mem.numeric:
                dV_j.data += transpose(apply_dropout(pb, P_ij.data, rows, cols)) @ dO_i.data  # (bh, Bc, d_v)
            mem.free(P_ij, dO_i)
        mem.store(dV_j, "dV", cols)
        mem.free(dV_j)

    # step 2: dP = (dO Vᵀ) ∘ Z
    for i, rows in mem.loop(tiles.query_blocks()):
        dO_i = mem.load("dO", rows)
        for _, cols in mem.loop(tiles.keys_seen_by(i)):
            V_j = mem.load("V", cols)
            dP_ij = mem.alloc("dP_ij", rows.stop - rows.start, cols.stop - cols.start)
            mem.compute(matmul=matmul(dP_ij.rows, d_v, dP_ij.cols))
            if mem.numeric:
                dP_ij.data = apply_dropout(pb, dO_i.data @ transpose(V_j.data), rows, cols)  # (bh, Br, Bc)
            mem.store(dP_ij, "dP", rows, cols)
            mem.free(V_j, dP_ij)
        mem.free(dO_i)

    # step 3: D = rowsum(dO ∘ O), dS = P ∘ (dP − D)
    for i, rows in mem.loop(tiles.query_blocks()):
        O_i, dO_i = mem.load("O", rows), mem.load("dO", rows)
        D_i = mem.alloc("D_i", rows.stop - rows.start)
        if mem.numeric:
            D_i.data = row_dot(dO_i.data, O_i.data)  # (bh, Br, 1)
        mem.free(O_i, dO_i)
        for _, cols in mem.loop(tiles.keys_seen_by(i)):
            P_ij, dP_ij = mem.load("P", rows, cols, tile="P_ij"), mem.load("dP", rows, cols, tile="dP_ij")
            if mem.numeric:
                dP_ij.data = P_ij.data * (dP_ij.data - D_i.data)  # dS_ij in place of dP_ij
            mem.store(dP_ij, "dS", rows, cols)
            mem.free(P_ij, dP_ij)
        mem.free(D_i)

    # step 4: dQ = τ dS K
    for i, rows in mem.loop(tiles.query_blocks()):
        dQ_i = mem.alloc("dQ_i", rows.stop - rows.start, d, fill=0.0)
        for _, cols in mem.loop(tiles.keys_seen_by(i)):
            dS_ij, K_j = mem.load("dS", rows, cols, tile="dS_ij"), mem.load("K", cols)
            mem.compute(matmul=matmul(dS_ij.rows, dS_ij.cols, d))
            if mem.numeric:
                dQ_i.data += tau * (dS_ij.data @ K_j.data)  # (bh, Br, d)
            mem.free(dS_ij, K_j)
        mem.store(dQ_i, "dQ", rows)
        mem.free(dQ_i)

    # step 5: dK = τ dSᵀ Q
    for j, cols in mem.loop(tiles.key_blocks()):
        dK_j = mem.alloc("dK_j", cols.stop - cols.start, d, fill=0.0)
        for _, rows in mem.loop(tiles.queries_seeing(j)):
            dS_ij, Q_i = mem.load("dS", rows, cols, tile="dS_ij"), mem.load("Q", rows)
            mem.compute(matmul=matmul(dS_ij.cols, dS_ij.rows, d))
            if mem.numeric:
                dK_j.data += tau * (transpose(dS_ij.data) @ Q_i.data)  # (bh, Bc, d)
            mem.free(dS_ij, Q_i)
        mem.store(dK_j, "dK", cols)
        mem.free(dK_j)


def working_set(pb: Problem, tiling: Tiling, M: int) -> int:
    Br, Bc, d, d_v = tiling.Br, tiling.Bc, pb.shape.d, pb.shape.d_v
    # steps 1, 2 (of d_v: dO_i, V_j, dV_j) and 4, 5 (of d: Q_i, K_j, dQ_i, dK_j): one block of each kind and one tile
    streaming = (Br + Bc) * max(d, d_v) + Br * Bc
    step3 = max(2 * Br * d_v + Br, Br + 2 * Br * Bc)  # O_i, dO_i, D_i; then D_i, P_ij, dP_ij
    return max(streaming, step3)


def traffic(pb: Problem, tiling: Tiling, M: int) -> Counts:
    """Exact counts; the peak is the working set, since every tile is visited."""
    n_q, n_k, d, d_v = pb.shape.n_q, pb.shape.n_k, pb.shape.d, pb.shape.d_v
    pairs = visits(pb, tiling, skips_hidden=False).pairs()
    rows = sum(b_i * n for b_i, _, n in pairs)  # T_c·N_q
    cols = sum(b_j * n for _, b_j, n in pairs)  # T_r·N_k
    reads = {
        "P": 2 * n_q * n_k,  # steps 1 and 3
        "dO": rows * d_v + 2 * n_q * d_v,  # step 1 once per key block, steps 2 and 3 once
        "V": cols * d_v,  # step 2, once per query block
        "O": n_q * d_v,  # step 3
        "dP": n_q * n_k,  # step 3
        "dS": 2 * n_q * n_k,  # steps 4 and 5
        "K": cols * d,  # step 4, once per query block
        "Q": rows * d,  # step 5, once per key block
    }
    writes = {"dV": n_k * d_v, "dP": n_q * n_k, "dS": n_q * n_k, "dQ": n_q * d, "dK": n_k * d}
    return exact_counts(TENSORS, pb, reads, writes, working_set(pb, tiling, M))


def flops(pb: Problem, tiling: Tiling, M: int) -> Flops:
    """Four products over every tile, dV and dP of d_v, dQ and dK of d; no exponential: P is read, not recomputed."""
    return Flops(matmul=4 * pb.shape.n_q * pb.shape.n_k * (pb.shape.d + pb.shape.d_v)).scaled(pb.shape.bh)


def paper_form(pb: Problem, M: int) -> float:
    """Theorem 5's Θ(Nd + N²) for standard attention's backward, as Nd + N², N² ↦ N_q·N_k and N ↦ N_q."""
    n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d
    return pb.shape.bh * (n_q * d + n_q * n_k)


ALGORITHM = Algorithm(
    name="standard backward", run=run, tensors=TENSORS, outer="Br", working_set=working_set, traffic=traffic,
    paper_form=paper_form, paper_label="Θ(Nd + N²)", flops=flops, needs=Needs(window=True),
)
