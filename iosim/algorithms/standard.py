"""Standard attention: Algorithm 0, with S and P materialized in HBM.

Dao et al. (2022), Algorithm 0: (1) S = QKᵀ, (2) P = softmax(S), (3) O = PV, each
step reading its inputs from HBM by blocks and writing its result back.

Step 1 streams K_j past each Q_i and writes S_ij = MASK(tau · Q_i K_jᵀ). Step 2
reads R whole rows of S at a time, R = ⌊M / (N_k + 2)⌋ (the rows and their max and
sum fit on chip), and writes P = softmax(S). Where not even one row fits
(N_k + 2 > M) it falls back to the two-pass online softmax (Milakov and Gimelshein,
2018) on B_r × B_c tiles, reading S twice. Step 3 accumulates O_i on chip while P_ij
and V_j stream past, applies dropout to each P_ij as it arrives, and writes O_i once.

On-chip buffers per head: step 1 Q_i (B_r × d), K_j (B_c × d), S_ij (B_r × B_c),
mask tile (B_r × B_c) when masked; step 2 R rows of S (R × N_k) and their m, ℓ
(R each), or in the two-pass case S_ij plus m_i, ℓ_i, m̃_ij, ℓ̃_ij (B_r each);
step 3 O_i (B_r × d), P_ij (B_r × B_c), V_j (B_c × d).

Deviations: the scale and the mask are applied in step 1, before S is written.
Every tile is visited, masked or not: S and P are materialized whole. Algorithm 0
has no dropout; it is applied in step 3, from the counter-based mask regenerated on
chip, so that P in HBM is the softmax the backward pass needs (``standard_backward``).
"""

from __future__ import annotations

from iosim.algorithms import standard_backward
from iosim.algorithms._softmax import materialized_flops, softmax_rows, softmax_two_pass, softmax_whole_rows
from iosim.algorithms.algorithm import OUTPUT, Algorithm, Needs, Tensor, exact_counts
from iosim.algorithms.tile_ops import apply_dropout, load_mask, scores
from iosim.core.counts import Counts
from iosim.core.flops import matmul
from iosim.core.memory import Memory
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.core.visits import visits

TENSORS = (Tensor("S", "N_q", "N_k", "intermediate"), Tensor("P", "N_q", "N_k", "intermediate"), OUTPUT)


def run(mem: Memory, pb: Problem, tiling: Tiling) -> None:
    """Run Alg. 0 on Q, K, V (and mask) in ``mem``; leaves S, P and O in HBM."""
    tiles = visits(pb, tiling, skips_hidden=False)

    # Alg. 0 line 1: load Q, K by blocks, compute S = QKᵀ, write S to HBM
    for i, rows in mem.loop(tiles.query_blocks()):
        Q_i = mem.load("Q", rows)
        for _, cols in mem.loop(tiles.keys_seen_by(i)):
            K_j = mem.load("K", cols)
            mask_ij = load_mask(mem, pb, rows, cols)
            S_ij = mem.alloc("S_ij", rows.stop - rows.start, cols.stop - cols.start)
            mem.compute(matmul=matmul(S_ij.rows, pb.shape.d, S_ij.cols))
            if mem.numeric:
                S_ij.data = scores(pb, Q_i, K_j, rows, cols, mask_ij)  # (bh, Br, Bc)
            mem.store(S_ij, "S", rows, cols)
            mem.free(K_j, S_ij)
            if mask_ij is not None:
                mem.free(mask_ij)
        mem.free(Q_i)

    # Alg. 0 line 2: read S, compute P = softmax(S), write P to HBM
    R = softmax_rows(mem.M, pb.shape.n_q, pb.shape.n_k)
    if R >= 1:
        softmax_whole_rows(mem, pb, R)
    else:
        softmax_two_pass(mem, pb, tiles)

    # Alg. 0 line 3: load P and V by blocks, compute O = PV, write O to HBM
    for i, rows in mem.loop(tiles.query_blocks()):
        O_i = mem.alloc("O_i", rows.stop - rows.start, pb.shape.d_v, fill=0.0)
        for _, cols in mem.loop(tiles.keys_seen_by(i)):
            P_ij, V_j = mem.load("P", rows, cols, tile="P_ij"), mem.load("V", cols)
            mem.compute(matmul=matmul(P_ij.rows, P_ij.cols, pb.shape.d_v))
            if mem.numeric:
                O_i.data += apply_dropout(pb, P_ij.data, rows, cols) @ V_j.data  # (bh, Br, d_v)
            mem.free(P_ij, V_j)
        mem.store(O_i, "O", rows)
        mem.free(O_i)


def working_set(pb: Problem, tiling: Tiling, M: int) -> int:
    n_q, n_k, d, d_v = pb.shape.n_q, pb.shape.n_k, pb.shape.d, pb.shape.d_v
    Br, Bc = tiling.Br, tiling.Bc
    step1 = Br * d + Bc * d + Br * Bc + pb.has_mask * Br * Bc  # Q_i, K_j, S_ij [, mask]
    R = softmax_rows(M, n_q, n_k)
    step2 = R * (n_k + 2) if R >= 1 else Br * Bc + 4 * Br  # rows of S with m, ℓ; or two-pass
    step3 = Br * d_v + Br * Bc + Bc * d_v  # O_i, P_ij, V_j
    return max(step1, step2, step3)


def traffic(pb: Problem, tiling: Tiling, M: int) -> Counts:
    """Exact counts; the peak is the working set, since every tile is visited."""
    n_q, n_k, d, d_v = pb.shape.n_q, pb.shape.n_k, pb.shape.d, pb.shape.d_v
    cols = sum(b_j * n for _, b_j, n in visits(pb, tiling, skips_hidden=False).pairs())  # T_r·N_k
    passes = 1 if softmax_rows(M, n_q, n_k) >= 1 else 2
    reads = {
        "Q": n_q * d, "K": cols * d,  # step 1: K streamed once per query block
        "S": passes * n_q * n_k,  # step 2
        "P": n_q * n_k, "V": cols * d_v,  # step 3: V streamed once per query block
    }
    writes = {"S": n_q * n_k, "P": n_q * n_k, "O": n_q * d_v}
    if pb.has_mask:
        reads["mask"] = n_q * n_k  # every tile of the mask, once
    return exact_counts(TENSORS, pb, reads, writes, working_set(pb, tiling, M))


def paper_form(pb: Problem, M: int) -> float:
    """Theorem 2's Θ(Nd + N²) for standard attention, as Nd + N², with N² ↦ N_q·N_k and N ↦ N_q."""
    n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d
    return pb.shape.bh * (n_q * d + n_q * n_k)


ALGORITHM = Algorithm(
    name="standard", run=run, tensors=TENSORS, outer="Br", working_set=working_set, traffic=traffic,
    paper_form=paper_form, paper_label="Θ(Nd + N²)", baseline=True, backward=standard_backward.ALGORITHM,
    flops=materialized_flops, needs=Needs(window=True),
)
