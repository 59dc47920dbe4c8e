"""FlashAttention backward: Algorithm 4, recomputing S and P from Q, K and the forward's ℓ, m.

Dao et al. (2022), Algorithm 4 (appendix B); line numbers below are Algorithm 4's.
K/V blocks form the outer loop (line 6) and keep dK_j, dV_j on chip, written once
(line 24); Q_i, O_i, dO_i, dQ_i, ℓ_i, m_i are loaded at every inner step (line 10)
and dQ_i goes back to HBM after each (line 21). S_ij and P_ij are recomputed, and
the dropout mask Z_ij is regenerated from the forward's seed (lines 1, 14).

On-chip buffers per head: K_j, dK_j (B_c × d each), V_j, dV_j (B_c × d_v each), Q_i, dQ_i
(B_r × d each), O_i, dO_i (B_r × d_v each), ℓ_i, m_i, D_i (B_r each), S_ij (B_r × B_c, overwritten by P_ij),
dP_ij (B_r × B_c, overwritten by dS_ij), and the mask tile (B_r × B_c) when a mask
is given.

Deviations: the RNG state R is the seed itself (``iosim.core.rng``), so line 1 reads
nothing. Line 2's block sizes are the block policy's, as in the forward pass. With
a band (causal, or a sliding window), an inner step whose tile is entirely hidden is
skipped (it would add zero to dQ_i, dK_j and dV_j), and so is a key block no query
sees (line 5 left its dK_j, dV_j zero); an explicit mask is not inspected. Line 5 is followed
as printed: dQ, dK and dV are zeroed in HBM, though line 24 overwrites dK and dV. With learned
attention sinks (``Problem.sinks``) the forward's ℓ and m include them, so P and the gradients
above are unchanged; their own gradient, −Σ_rows exp(sink − L_i)·D_i, takes a first pass over the
query blocks (as FlashAttention-2's backward computes D in one): O_i, dO_i, ℓ_i, m_i and the
sink read once per query block, the gradient held on chip and written once (dsinks).
"""

from __future__ import annotations

from iosim.algorithms.algorithm import DOUT, GRADIENTS, OUTPUT, STATISTICS, Algorithm, Needs, exact_counts, saved
from iosim.algorithms.tile_ops import (
    absorb_gradients,
    absorb_sink_gradient,
    gradient_statistics,
    load_mask,
    probabilities,
    row_dot,
    scores,
)
from iosim.core.counts import Counts
from iosim.core.flops import Flops, matmul
from iosim.core.memory import Memory
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.core.visits import Visits, visits

TENSORS = (*saved(OUTPUT, *STATISTICS), DOUT, *GRADIENTS)


def run(mem: Memory, pb: Problem, tiling: Tiling) -> None:
    """Run Alg. 4 on Q, K, V, O, ℓ, m, dO (and mask) in ``mem``; leaves dQ, dK, dV in HBM."""
    run_on(mem, pb, tiling, visits(pb, tiling, skips_hidden=True))


def run_on(mem: Memory, pb: Problem, tiling: Tiling, tiles: Visits) -> None:
    """Alg. 4 over the tiles ``tiles`` visits: those the causal mask leaves, or a block-sparse mask's."""
    d, d_v = pb.shape.d, pb.shape.d_v
    if pb.sinks:
        sink_gradient(mem, pb, tiles)

    # line 5: initialize dQ = (0), dK = (0), dV = (0) in HBM
    for _, rows in mem.loop(tiles.q.all()):
        zero = mem.alloc("dQ_i", rows.stop - rows.start, d, fill=0.0)
        mem.store(zero, "dQ", rows)
        mem.free(zero)
    for _, cols in mem.loop(tiles.k.all()):
        for name, width in (("dK", d), ("dV", d_v)):
            zero = mem.alloc(f"{name}_j", cols.stop - cols.start, width, fill=0.0)
            mem.store(zero, name, cols)
            mem.free(zero)

    for j, cols in mem.loop(tiles.key_blocks()):  # line 6
        bc = cols.stop - cols.start
        K_j, V_j = mem.load("K", cols), mem.load("V", cols)  # line 7
        dK_j, dV_j = mem.alloc("dK_j", bc, d, fill=0.0), mem.alloc("dV_j", bc, d_v, fill=0.0)  # line 8
        for _, rows in mem.loop(tiles.queries_seeing(j)):  # line 9, the query blocks that see K_j
            br = rows.stop - rows.start
            Q_i, O_i, dO_i, dQ_i = (mem.load(name, rows) for name in ("Q", "O", "dO", "dQ"))  # line 10
            l_i, m_i = mem.load("l", rows), mem.load("m", rows)
            mask_ij = load_mask(mem, pb, rows, cols)
            S_ij, dP_ij, D_i = mem.alloc("S_ij", br, bc), mem.alloc("dP_ij", br, bc), mem.alloc("D_i", br)
            # lines 11, 21, 22 (of d: S_ij recomputed, dQ_i, dK_j) and 16, 17 (of d_v: dV_j, dP_ij); exp for P_ij
            mem.compute(matmul=3 * matmul(br, d, bc) + 2 * matmul(br, d_v, bc), exp=br * bc)
            if mem.numeric:
                S_ij.data = scores(pb, Q_i, K_j, rows, cols, mask_ij)  # lines 11-12: (bh, Br, Bc)
                S_ij.data = probabilities(S_ij.data, l_i.data, m_i.data)  # line 13: P_ij in place of S_ij
                D_i.data = row_dot(dO_i.data, O_i.data)  # line 19: (bh, Br, 1)
                absorb_gradients(pb, S_ij, dO_i, Q_i, K_j, V_j, D_i, dP_ij, dQ_i, dK_j, dV_j, rows, cols)  # 14-22
            mem.store(dQ_i, "dQ", rows)  # line 21
            mem.free(Q_i, O_i, dO_i, dQ_i, l_i, m_i, S_ij, dP_ij, D_i)
            if mask_ij is not None:
                mem.free(mask_ij)
        mem.store(dK_j, "dK", cols)  # line 24
        mem.store(dV_j, "dV", cols)
        mem.free(K_j, V_j, dK_j, dV_j)


def sink_gradient(mem: Memory, pb: Problem, tiles: Visits) -> None:
    """The sinks' gradient, −Σ_rows exp(sink − L_i)·D_i, in a first pass over the query blocks: D_i = rowsum(dO_i ∘
    O_i) (line 19) and L_i from the forward's ℓ_i, m_i, the gradient held on chip and written once."""
    dsinks = mem.alloc("dsinks", pb.packed, fill=0.0)
    for _, rows in mem.loop(tiles.q.all()):
        D_i, L_i, loaded = gradient_statistics(mem, rows)
        absorb_sink_gradient(mem, pb, rows, D_i, L_i, dsinks)
        mem.free(*loaded, D_i, L_i)
    mem.store(dsinks, "dsinks", slice(0, pb.packed))
    mem.free(dsinks)


def working_set(pb: Problem, tiling: Tiling, M: int) -> int:
    # K_j, V_j, dK_j, dV_j + Q_i, O_i, dO_i, dQ_i + S_ij, dP_ij + (ℓ_i, m_i, D_i) [+ mask tile]
    Br, Bc, d, d_v = tiling.Br, tiling.Bc, pb.shape.d, pb.shape.d_v
    return 2 * (Bc + Br) * (d + d_v) + 2 * Br * Bc + 3 * Br + pb.has_mask * Br * Bc


def traffic(pb: Problem, tiling: Tiling, M: int) -> Counts:
    """Exact counts: sums over the visited tiles (b_i query rows × b_j key rows each).

    Without a causal skip, Σ b_i = T_c·N_q. The peak is the largest working set among
    the visited tiles, or one of line 5's zero tiles (B_r × d, B_c × d, B_c × d_v).
    """
    return traffic_on(pb, tiling, M, visits(pb, tiling, skips_hidden=True))


def traffic_on(pb: Problem, tiling: Tiling, M: int, tiles: Visits) -> Counts:
    """The counts of ``run_on`` over ``tiles``: lines 7 and 24 for each key block of the outer loop."""
    n_q, n_k, d, d_v = pb.shape.n_q, pb.shape.n_k, pb.shape.d, pb.shape.d_v
    outer = sum(size * n for size, n in tiles.key_blocks().sizes().items())  # key rows loaded: N_k when dense
    pairs = tiles.pairs()
    rows = sum(b_i * n for b_i, _, n in pairs)  # query rows met by key blocks
    reads = {
        "K": outer * d, "V": outer * d_v,  # line 7: once each
        "Q": rows * d, "O": rows * d_v, "dO": rows * d_v, "dQ": rows * d,  # line 10, per visited tile
        "l": rows, "m": rows,
    }
    writes = {
        "dQ": n_q * d + rows * d,  # line 5's zeros, then line 21 per visited tile
        "dK": n_k * d + outer * d, "dV": n_k * d_v + outer * d_v,  # line 5's zeros, then line 24 once
    }
    if pb.has_mask:
        reads["mask"] = sum(b_i * b_j * n for b_i, b_j, n in pairs)  # each visited tile of the mask, once
    sinks = []
    if pb.sinks:  # the first pass: O, dO, ℓ, m and the head's sink once per query block, their gradient written once
        for name, width in (("O", d_v), ("dO", d_v), ("l", 1), ("m", 1)):
            reads[name] = reads.get(name, 0) + n_q * width
        reads["sinks"], writes["dsinks"] = tiles.q.T, 1
        # O_i, dO_i, ℓ_i, m_i, D_i, L_i beside the gradient, and the sink
        sinks = [2 * b_i * d_v + 4 * b_i + 2 for b_i in tiles.q.all().sizes()]
    zeros = [tiles.q.size(0) * d, tiles.k.size(0) * max(d, d_v)]
    outer = [2 * b_j * (d + d_v) for b_j in tiles.key_blocks().sizes()]  # K_j, V_j, dK_j, dV_j of a key block alone
    peak = max(sinks + zeros + outer + [working_set(pb, Tiling(b_i, b_j), M) for b_i, b_j, _ in pairs])
    return exact_counts(TENSORS, pb, reads, writes, peak)


def flops(pb: Problem, tiling: Tiling, M: int) -> Flops:
    """Five products per visited tile, three of d (S_ij recomputed, dQ_i, dK_j) and two of d_v (dV_j, dP_ij), and
    B_r·B_c exps."""
    return flops_on(pb, visits(pb, tiling, skips_hidden=True))


def flops_on(pb: Problem, tiles: Visits) -> Flops:
    """The arithmetic of ``run_on`` over ``tiles``."""
    pairs = tiles.pairs()
    area = sum(b_i * b_j * n for b_i, b_j, n in pairs)  # N_q·N_k without a causal skip
    sinks = 2 * pb.shape.n_q * pb.sinks  # with sinks: the log of L and the sink's probability, per row
    return Flops(matmul=2 * (3 * pb.shape.d + 2 * pb.shape.d_v) * area, exp=area + sinks).scaled(pb.shape.bh)


def paper_form(pb: Problem, M: int) -> float:
    """Theorem 5's Θ(N²d²/M), counted as the forward's form is: T_c = 4Nd/M blocks of B_c = M/4d.

    T_c·N·(5d + 2) for line 10 and line 21, and 7Nd for K, V and lines 5 and 24:
    20N²d²/M + 8N²d/M + 7Nd, with N² ↦ N_q·N_k and N ↦ N_q.
    """
    n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d
    return pb.shape.bh * (20 * n_q * n_k * d * d / M + 8 * n_q * n_k * d / M + 7 * n_q * d)


ALGORITHM = Algorithm(
    name="flash backward", run=run, tensors=TENSORS, outer="Bc", working_set=working_set, traffic=traffic,
    paper_form=paper_form, paper_label="20N²d²/M + 8N²d/M + 7Nd", flops=flops,
    needs=Needs(window=True, sinks=True),
)
