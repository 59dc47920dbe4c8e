"""FlashAttention forward: Algorithm 1, with Algorithm 2's scale, mask and dropout.

Dao et al., "FlashAttention: Fast and Memory-Efficient Exact Attention with
IO-Awareness" (2022), Algorithm 2; line numbers below are Algorithm 2's. K/V blocks
form the outer loop; the running O_i, ℓ_i and m_i go back to HBM after every inner
step.

On-chip buffers per head: K_j (B_c × d), V_j (B_c × d_v), Q_i (B_r × d), O_i (B_r × d_v),
S_ij (B_r × B_c, overwritten by P̃_ij), ℓ_i, m_i, m̃_ij, ℓ̃_ij, m_i^new, ℓ_i^new
(B_r each), and the mask tile (B_r × B_c) when a mask is given.

Deviations: the RNG state R is the seed itself (dropout is counter-based, see
``iosim.core.rng``), so nothing is written for it (lines 1, 19). With a band (causal, or
a sliding window), an inner step whose tile is entirely hidden is skipped (it would
leave O_i, ℓ_i, m_i unchanged), and so is a key block no query sees, as
FlashAttention's kernels do; an explicit mask is not inspected, so
its tiles are all visited. Rows that see no key end with O = 0, ℓ = 0, m = −inf. Learned attention sinks
(``Problem.sinks``, gpt-oss) start line 3 at ℓ = 1, m = sink, read once per query block: the sink is a score with
no value, so a row that sees no key then ends with O = 0, ℓ = 1, m = sink.
"""

from __future__ import annotations

import numpy as np

from iosim.algorithms import flash_backward
from iosim.algorithms.algorithm import OUTPUT, STATISTICS, Algorithm, Needs, exact_counts
from iosim.algorithms.tile_ops import apply_dropout, exp_diff, load_mask, safe_divide, scores
from iosim.core.counts import Counts
from iosim.core.flops import Flops, matmul
from iosim.core.memory import Memory
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.core.visits import Visits, visits

TENSORS = (OUTPUT, *STATISTICS)


def run(mem: Memory, pb: Problem, tiling: Tiling) -> None:
    """Run Alg. 2 on Q, K, V (and mask) in ``mem``; leaves O, l, m in HBM."""
    run_on(mem, pb, tiling, visits(pb, tiling, skips_hidden=True))


def run_on(mem: Memory, pb: Problem, tiling: Tiling, tiles: Visits) -> None:
    """Alg. 2 over the tiles ``tiles`` visits: those the causal mask leaves, or a block-sparse mask's."""
    d, d_v = pb.shape.d, pb.shape.d_v

    # line 3: initialize O = (0), ℓ = (0), m = (−inf) in HBM; with attention sinks, ℓ = (1), m = (sink): the sink is
    # a score column with no value, taken in before any key
    for _, rows in mem.loop(tiles.q.all()):
        br = rows.stop - rows.start
        for name, cols, fill in (("O", d_v, 0.0), ("l", 1, float(pb.sinks)), ("m", 1, -np.inf)):
            init = mem.alloc(f"{name}_i", br, cols, fill=fill)
            if name == "m" and pb.sinks:  # the head's sink, beside m_i
                sink = mem.load("sinks", slice(0, 1))
                if mem.numeric:
                    init.data[...] = sink.data
                mem.free(sink)
            mem.store(init, name, rows)
            mem.free(init)

    for j, cols in mem.loop(tiles.key_blocks()):  # line 6
        K_j, V_j = mem.load("K", cols), mem.load("V", cols)  # line 7
        bc = cols.stop - cols.start
        for _, rows in mem.loop(tiles.queries_seeing(j)):  # line 8, the query blocks that see K_j
            br = rows.stop - rows.start
            Q_i, O_i = mem.load("Q", rows), mem.load("O", rows)  # line 9
            l_i, m_i = mem.load("l", rows), mem.load("m", rows)
            mask_ij = load_mask(mem, pb, rows, cols)
            S_ij = mem.alloc("S_ij", br, bc)
            m_tilde, l_tilde = mem.alloc("m~_ij", br), mem.alloc("l~_ij", br)
            m_new, l_new = mem.alloc("m_new", br), mem.alloc("l_new", br)
            # S_ij = Q_i K_jᵀ and P̃_ij V_j; exp for P̃_ij and the two rescalings of line 13
            mem.compute(matmul=matmul(br, d, bc) + matmul(br, bc, d_v), exp=br * bc + 2 * br)
            if mem.numeric:
                S_ij.data = scores(pb, Q_i, K_j, rows, cols, mask_ij)  # lines 10-11: (bh, Br, Bc)
                m_tilde.data = S_ij.data.max(axis=-1, keepdims=True)  # line 12
                S_ij.data = exp_diff(S_ij.data, m_tilde.data)  # P̃_ij, in place of S_ij
                l_tilde.data = S_ij.data.sum(axis=-1, keepdims=True)
                m_new.data = np.maximum(m_i.data, m_tilde.data)  # line 13
                alpha, beta = exp_diff(m_i.data, m_new.data), exp_diff(m_tilde.data, m_new.data)
                l_new.data = alpha * l_i.data + beta * l_tilde.data
                P_dropped = apply_dropout(pb, S_ij.data, rows, cols)  # line 14
                O_i.data = safe_divide(  # line 15: (bh, Br, d_v)
                    l_i.data * alpha * O_i.data + beta * (P_dropped @ V_j.data), l_new.data
                )
            mem.store(O_i, "O", rows)  # line 15
            mem.store(l_new, "l", rows)  # line 16
            mem.store(m_new, "m", rows)
            mem.free(Q_i, O_i, l_i, m_i, S_ij, m_tilde, l_tilde, m_new, l_new)
            if mask_ij is not None:
                mem.free(mask_ij)
        mem.free(K_j, V_j)


def working_set(pb: Problem, tiling: Tiling, M: int) -> int:
    # K_j, V_j + Q_i, O_i + S_ij + (ℓ_i, m_i, m̃, ℓ̃, m_new, ℓ_new) [+ mask tile]
    Br, Bc, d, d_v = tiling.Br, tiling.Bc, pb.shape.d, pb.shape.d_v
    return (Bc + Br) * (d + d_v) + Br * Bc + 6 * Br + pb.has_mask * Br * Bc


def traffic(pb: Problem, tiling: Tiling, M: int) -> Counts:
    """Exact counts: sums over the visited tiles (b_i query rows × b_j key rows each).

    Without a causal skip, Σ b_i = T_c·N_q and Σ b_i·b_j = N_q·N_k. The peak is the
    largest working set among the visited tiles, line 3's one B_r × d tile, or (block-sparse)
    K_j, V_j of a key block none of whose tiles is visited.
    """
    return traffic_on(pb, tiling, M, visits(pb, tiling, skips_hidden=True))


def traffic_on(pb: Problem, tiling: Tiling, M: int, tiles: Visits) -> Counts:
    """The counts of ``run_on`` over ``tiles``: K_j, V_j read for each key block of the outer loop."""
    n_q, d, d_v = pb.shape.n_q, pb.shape.d, pb.shape.d_v
    n_k = sum(size * n for size, n in tiles.key_blocks().sizes().items())  # key rows loaded: N_k when dense
    pairs = tiles.pairs()
    rows = sum(b_i * n for b_i, _, n in pairs)  # query rows met by key blocks
    reads = {
        "Q": rows * d,  # Q_i re-read at every visited tile (line 9)
        "K": n_k * d, "V": n_k * d_v,  # K_j, V_j read once (line 7)
        "O": rows * d_v, "l": rows, "m": rows,  # line 9
    }
    writes = {
        "O": rows * d_v + n_q * d_v,  # line 15 per visited tile, plus the zeros of line 3
        "l": rows + n_q, "m": rows + n_q,  # line 16, plus line 3
    }
    if pb.has_mask:
        reads["mask"] = sum(b_i * b_j * n for b_i, b_j, n in pairs)  # each visited tile of the mask, once
    if pb.sinks:
        reads["sinks"] = tiles.q.T  # the head's sink, once per query block at line 3
    outer = [b_j * (d + d_v) for b_j in tiles.key_blocks().sizes()]  # K_j, V_j of a key block with no visited tile
    init = [tiles.q.size(0) * d_v, tiles.q.size(0) + pb.sinks]  # line 3's O_i, or its m_i beside the sink
    peak = max(init + outer + [working_set(pb, Tiling(b_i, b_j), M) for b_i, b_j, _ in pairs])
    return exact_counts(TENSORS, pb, reads, writes, peak)


def flops(pb: Problem, tiling: Tiling, M: int) -> Flops:
    """Two products per visited tile, B_r × d × B_c and B_r × B_c × d_v, and B_r·B_c + 2·B_r exponentials."""
    return flops_on(pb, visits(pb, tiling, skips_hidden=True))


def flops_on(pb: Problem, tiles: Visits) -> Flops:
    """The arithmetic of ``run_on`` over ``tiles``."""
    pairs = tiles.pairs()
    area = sum(b_i * b_j * n for b_i, b_j, n in pairs)  # N_q·N_k without a causal skip
    rows = sum(b_i * n for b_i, _, n in pairs)
    return Flops(matmul=2 * (pb.shape.d + pb.shape.d_v) * area, exp=area + 2 * rows).scaled(pb.shape.bh)


def paper_form(pb: Problem, M: int) -> float:
    """Theorem 2's Θ(N²d²/M) with the constants of docs/derivations.md: 12N²d²/M + 16N²d/M + 3Nd.

    Shown with N² ↦ N_q·N_k and N ↦ N_q, so it reads as printed when N_q = N_k = N.
    """
    n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d
    return pb.shape.bh * (12 * n_q * n_k * d * d / M + 16 * n_q * n_k * d / M + 3 * n_q * d)


ALGORITHM = Algorithm(
    name="flash", run=run, tensors=TENSORS, outer="Bc", working_set=working_set, traffic=traffic,
    paper_form=paper_form, paper_label="12N²d²/M + 16N²d/M + 3Nd", backward=flash_backward.ALGORITHM,
    flops=flops, needs=Needs(window=True, sinks=True),
)
