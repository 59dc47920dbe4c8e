"""FlashAttention-2 backward: D in its own pass, K/V blocks outer, dQ accumulated in HBM.

Dao, "FlashAttention-2" (2023), Algorithm 2, as its kernels run it. A first pass
over the query blocks computes D_i = rowsum(dO_i ∘ O_i) and the logsumexp
L_i = m_i + log ℓ_i, saves both, and zeroes dQ. The main pass keeps K_j, V_j, dK_j,
dV_j on chip while the query blocks that see them stream past; it reads Q_i, dO_i,
L_i, D_i at every inner step, recomputes P_ij = exp(S_ij − L_i), and adds
τ·dS_ij·K_j into dQ_i in HBM, a read-modify-write. Line numbers below are those of
Algorithm 4 (Dao et al. 2022, appendix B) that each step corresponds to.

On-chip buffers per head: first pass O_i, dO_i (B_r × d_v each) and ℓ_i, m_i, D_i, L_i
(B_r each), then a zero B_r × d tile; main pass K_j, dK_j (B_c × d each), V_j, dV_j (B_c × d_v each),
Q_i, dQ_i (B_r × d each), dO_i (B_r × d_v), L_i, D_i (B_r each), S_ij (B_r × B_c, overwritten by
P_ij), dP_ij (B_r × B_c, overwritten by dS_ij), and the mask tile (B_r × B_c) when a
mask is given.

Deviations: FlashAttention-2's forward saves L itself; the forward modelled here
(``flash-swapped``) saves ℓ and m, so the first pass reads both and writes L once,
rather than every inner step reading two statistics. dQ is accumulated in the data
dtype; the kernels accumulate it in float32 with atomic adds and convert it in a
third pass, which is not modelled. Tiles the band (causal, or a sliding window) hides
entirely are skipped, and a key block no query sees gets zeros for dK_j, dV_j without
loading K_j, V_j, as the kernels do; an explicit mask is not inspected. With learned attention sinks
(``Problem.sinks``) the forward's ℓ and m include them, so P, D and the gradients above are unchanged; the first
pass also reads each query block's sink and adds −Σ_rows exp(sink − L_i)·D_i into the sink's gradient, held on chip
and written once (dsinks).
"""

from __future__ import annotations

from iosim.algorithms.algorithm import STATISTICS_PASS_TENSORS, Algorithm, Needs, exact_counts
from iosim.algorithms.tile_ops import (
    absorb_gradients,
    absorb_sink_gradient,
    exp_diff,
    gradient_statistics,
    load_mask,
    scores,
)
from iosim.core.counts import Counts
from iosim.core.flops import Flops, matmul
from iosim.core.memory import Memory
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.core.visits import visits

TENSORS = STATISTICS_PASS_TENSORS


def run(mem: Memory, pb: Problem, tiling: Tiling) -> None:
    """Run the FlashAttention-2 backward on Q, K, V, O, ℓ, m, dO (and mask); leaves dQ, dK, dV in HBM."""
    d, d_v = pb.shape.d, pb.shape.d_v
    tiles = visits(pb, tiling, skips_hidden=True)

    # attention sinks: their gradient −Σ_rows P_sink·D, P_sink = exp(sink − L), summed on chip over the first pass
    dsinks = mem.alloc("dsinks", pb.packed, fill=0.0) if pb.sinks else None
    for _, rows in mem.loop(tiles.q.all()):  # first pass: D, L and dQ = (0), per query block
        D_i, L_i, loaded = gradient_statistics(mem, rows)  # line 19, once per row
        if dsinks is not None:
            absorb_sink_gradient(mem, pb, rows, D_i, L_i, dsinks)
        mem.store(D_i, "D", rows)
        mem.store(L_i, "L", rows)
        mem.free(*loaded, D_i, L_i)
        zero = mem.alloc("dQ_i", rows.stop - rows.start, d, fill=0.0)  # line 5
        mem.store(zero, "dQ", rows)
        mem.free(zero)

    if dsinks is not None:
        mem.store(dsinks, "dsinks", slice(0, pb.packed))
        mem.free(dsinks)
    for j, cols in mem.loop(tiles.key_blocks()):  # line 6
        bc = cols.stop - cols.start
        K_j, V_j = mem.load("K", cols), mem.load("V", cols)  # line 7
        dK_j, dV_j = mem.alloc("dK_j", bc, d, fill=0.0), mem.alloc("dV_j", bc, d_v, fill=0.0)  # line 8
        for _, rows in mem.loop(tiles.queries_seeing(j)):  # line 9, the query blocks that see K_j
            br = rows.stop - rows.start
            Q_i, dO_i, dQ_i = mem.load("Q", rows), mem.load("dO", rows), mem.load("dQ", rows)  # line 10
            L_i, D_i = mem.load("L", rows), mem.load("D", rows)
            mask_ij = load_mask(mem, pb, rows, cols)
            S_ij, dP_ij = mem.alloc("S_ij", br, bc), mem.alloc("dP_ij", br, bc)
            # S_ij recomputed, dQ_i, dK_j (of d) and dV_j, dP_ij (of d_v); exp for P_ij
            mem.compute(matmul=3 * matmul(br, d, bc) + 2 * matmul(br, d_v, bc), exp=br * bc)
            if mem.numeric:
                S_ij.data = scores(pb, Q_i, K_j, rows, cols, mask_ij)  # lines 11-12: (bh, Br, Bc)
                S_ij.data = exp_diff(S_ij.data, L_i.data)  # line 13: P_ij = exp(S_ij − L_i) in place
                absorb_gradients(pb, S_ij, dO_i, Q_i, K_j, V_j, D_i, dP_ij, dQ_i, dK_j, dV_j, rows, cols)  # 14-22
            mem.store(dQ_i, "dQ", rows)  # line 21: the write of the read-modify-write
            mem.free(Q_i, dO_i, dQ_i, L_i, D_i, S_ij, dP_ij)
            if mask_ij is not None:
                mem.free(mask_ij)
        mem.store(dK_j, "dK", cols)  # line 24
        mem.store(dV_j, "dV", cols)
        mem.free(K_j, V_j, dK_j, dV_j)
    for _, cols in mem.loop(tiles.blind_key_blocks()):  # a window's key blocks no query sees: zero gradients
        for name, width in (("dK", d), ("dV", d_v)):
            zero = mem.alloc(f"{name}_j", cols.stop - cols.start, width, fill=0.0)
            mem.store(zero, name, cols)
            mem.free(zero)


def working_set(pb: Problem, tiling: Tiling, M: int) -> int:
    # main pass: K_j, V_j, dK_j, dV_j + Q_i, dO_i, dQ_i + S_ij, dP_ij + (L_i, D_i) [+ mask tile];
    # first pass: O_i, dO_i + (ℓ_i, m_i, D_i, L_i), and with sinks the sink beside its gradient
    Br, Bc, d, d_v = tiling.Br, tiling.Bc, pb.shape.d, pb.shape.d_v
    main = 2 * Bc * (d + d_v) + Br * (2 * d + d_v) + 2 * Br * Bc + 2 * Br + pb.has_mask * Br * Bc
    return max(main, 2 * Br * d_v + 4 * Br + 2 * pb.sinks)  # main holds the first pass's zero dQ_i (Q_i's size)


def traffic(pb: Problem, tiling: Tiling, M: int) -> Counts:
    """Exact counts: the first pass once per query row, the main pass summed over the visited tiles.

    Without a causal skip, Σ b_i = T_c·N_q. The peak is the largest of the first pass's
    buffers for a full query block and the main pass's working set over the visited tiles.
    """
    n_q, n_k, d, d_v = pb.shape.n_q, pb.shape.n_k, pb.shape.d, pb.shape.d_v
    tiles = visits(pb, tiling, skips_hidden=True)
    pairs = tiles.pairs()
    rows = sum(b_i * n for b_i, _, n in pairs)  # query rows met by key blocks
    met = sum(size * n for size, n in tiles.key_blocks().sizes().items())  # key rows some query sees (N_k but windows)
    reads = {
        "O": n_q * d_v, "l": n_q, "m": n_q,  # first pass
        "dO": n_q * d_v + rows * d_v,  # first pass, then per visited tile
        "K": met * d, "V": met * d_v,  # once each
        "Q": rows * d, "dQ": rows * d, "L": rows, "D": rows,  # per visited tile
    }
    writes = {
        "D": n_q, "L": n_q,  # first pass
        "dQ": n_q * d + rows * d,  # first pass's zeros, then per visited tile
        "dK": n_k * d, "dV": n_k * d_v,  # once each: line 24, or zeros for a key block no query sees
    }
    if pb.has_mask:
        reads["mask"] = sum(b_i * b_j * n for b_i, b_j, n in pairs)  # each visited tile of the mask, once
    if pb.sinks:  # the head's sink once per query block of the first pass, its gradient written once
        reads["sinks"], writes["dsinks"] = tiles.q.T, 1
    Br = tiles.q.size(0)
    # the zero tiles (dK_j, then dV_j) of a key block no query sees
    blind = [b_j * max(d, d_v) for b_j in tiles.blind_key_blocks().sizes()]
    # O_i, dO_i, ℓ_i, m_i, D_i, L_i and the sink beside its gradient; then the zero dQ_i beside the gradient
    first = max(2 * Br * d_v + 4 * Br + 2 * pb.sinks, Br * d + pb.sinks)
    peak = max([first] + blind + [working_set(pb, Tiling(b_i, b_j), M) for b_i, b_j, _ in pairs])
    return exact_counts(TENSORS, pb, reads, writes, peak)


def flops(pb: Problem, tiling: Tiling, M: int) -> Flops:
    """Five products per visited tile, three of d (S_ij, dQ_i, dK_j) and two of d_v (dV_j, dP_ij), B_r·B_c exps, and
    one log per query row (and with sinks one exp, the sink's probability)."""
    pairs = visits(pb, tiling, skips_hidden=True).pairs()
    area = sum(b_i * b_j * n for b_i, b_j, n in pairs)  # N_q·N_k without a causal skip
    matmul = 2 * (3 * pb.shape.d + 2 * pb.shape.d_v) * area
    return Flops(matmul=matmul, exp=area + pb.shape.n_q * (1 + pb.sinks)).scaled(pb.shape.bh)


def paper_form(pb: Problem, M: int) -> float:
    """Θ(N²d²/M), counted as the forward's form is: T_c = 4Nd/M blocks of B_c = M/4d.

    T_c·N·(4d + 2) for the inner steps, 3Nd + 4N for the first pass, and 4Nd for
    K, V, dK, dV: 16N²d²/M + 8N²d/M + 7Nd + 4N, with N² ↦ N_q·N_k and N ↦ N_q.
    """
    n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d
    return pb.shape.bh * (16 * n_q * n_k * d * d / M + 8 * n_q * n_k * d / M + 7 * n_q * d + 4 * n_q)


ALGORITHM = Algorithm(
    name="flash-swapped backward", run=run, tensors=TENSORS, outer="Bc", working_set=working_set,
    traffic=traffic, paper_form=paper_form, paper_label="16N²d²/M + 8N²d/M + 7Nd + 4N", flops=flops,
    needs=Needs(window=True, sinks=True),
)
