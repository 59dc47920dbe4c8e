"""FlashAttention forward with the loops swapped: Q blocks outer, K/V blocks inner.

The loop order of FlashAttention-2 (Dao, 2023, Algorithm 1), suggested as a
"possible improvement" to Dao et al. (2022), Algorithm 2. O_i, ℓ_i and m_i stay on
chip for the whole inner loop and are written once, so HBM sees Q, O, ℓ, m once and
K, V once per query block. Line numbers below are those of Algorithm 2 that each step
corresponds to.

On-chip buffers per head: Q_i, O_i (B_r × d each), K_j, V_j (B_c × d each),
S_ij (B_r × B_c, overwritten by P̃_ij), ℓ_i, m_i, m_i^new, ℓ̃_ij (B_r each), and
the mask tile (B_r × B_c) when a mask is given.

Deviations: O_i is accumulated unnormalized and divided by ℓ_i once at the end
(FlashAttention-2's order); the result is the same attention. With a band (causal,
or a sliding window), K/V blocks entirely hidden from the query block are skipped, as FlashAttention's
kernels do (an explicit mask is not inspected). Rows that see no key end with
O = 0, ℓ = 0, m = −inf. Learned attention sinks (``Problem.sinks``, gpt-oss) start ℓ_i = 1, m_i = sink, read once
per query block before O_i is allocated (so no peak grows): the sink is a score with no value.
"""

from __future__ import annotations

import numpy as np

from iosim.algorithms import flash_swapped_backward
from iosim.algorithms.algorithm import OUTPUT, STATISTICS, Algorithm, Needs, exact_counts
from iosim.algorithms.tile_ops import (
    absorb_block,
    kv_width,
    load_kv,
    load_mask,
    read_block_table,
    read_descales,
    safe_divide,
    scores,
    start_at_sinks,
)
from iosim.core.counts import Counts
from iosim.core.flops import Flops, matmul
from iosim.core.memory import Memory
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.core.visits import visits
from iosim.variants.paging import entries

TENSORS = (OUTPUT, *STATISTICS)


def run(mem: Memory, pb: Problem, tiling: Tiling) -> None:
    """Run the swapped-loop forward on Q, K, V (and mask) in ``mem``; leaves O, l, m in HBM."""
    d, d_v = pb.shape.d, pb.shape.d_v
    tiles = visits(pb, tiling, skips_hidden=True)

    for i, rows in mem.loop(tiles.query_blocks()):  # outer loop over query blocks
        br = rows.stop - rows.start
        Q_i = mem.load("Q", rows)
        read_descales(mem, pb)  # FP8 data: the head's descales of Q, K and V
        l_i, m_i = mem.alloc("l_i", br, fill=0.0), mem.alloc("m_i", br, fill=-np.inf)
        if pb.sinks:  # the head's sink logit: a score column with no value, taken in before any key
            start_at_sinks(mem, pb, rows, l_i, m_i)
        O_i = mem.alloc("O_i", br, d_v, fill=0.0)  # on chip for the whole inner loop (line 3)
        for _, cols in mem.loop(tiles.keys_seen_by(i)):  # inner loop over the K/V blocks Q_i sees
            bc = cols.stop - cols.start
            read_block_table(mem, pb, cols)  # a paged cache: where K_j, V_j are
            K_j, V_j = load_kv(mem, pb, cols)  # line 7
            mask_ij = load_mask(mem, pb, rows, cols)
            S_ij = mem.alloc("S_ij", br, bc)
            m_new, l_tilde = mem.alloc("m_new", br), mem.alloc("l~_ij", br)
            # S_ij = Q_i K_jᵀ and P̃_ij V_j; exp for P̃_ij and the rescaling of O_i, ℓ_i
            mem.compute(matmul=matmul(br, d, bc) + matmul(br, bc, d_v), exp=br * bc + br)
            if mem.numeric:
                S_ij.data = scores(pb, Q_i, K_j, rows, cols, mask_ij)  # lines 10-11: (bh, Br, Bc)
                absorb_block(pb, S_ij, V_j, m_i, l_i, O_i, m_new, l_tilde, rows, cols)  # lines 12-15
            mem.free(K_j, V_j, S_ij, m_new, l_tilde)
            if mask_ij is not None:
                mem.free(mask_ij)
        if mem.numeric:
            O_i.data = safe_divide(O_i.data, l_i.data)
        mem.store(O_i, "O", rows)  # written once per query block (lines 15-16)
        mem.store(l_i, "l", rows)
        mem.store(m_i, "m", rows)
        mem.free(Q_i, O_i, l_i, m_i)


def working_set(pb: Problem, tiling: Tiling, M: int) -> int:
    # Q_i, O_i + K_j, V_j (none with MLA's latent cache: V_j is columns of K_j) + S_ij + (ℓ_i, m_i, m_new, ℓ̃)
    # [+ mask tile]
    Br, Bc, d, d_v = tiling.Br, tiling.Bc, pb.shape.d, pb.shape.d_v
    return Br * (d + d_v) + Bc * kv_width(pb) + Br * Bc + 4 * Br + pb.has_mask * Br * Bc


def traffic(pb: Problem, tiling: Tiling, M: int) -> Counts:
    """Exact counts: sums over the visited tiles (b_i query rows × b_j key rows each).

    Without a causal skip, Σ b_j = T_r·N_k. The peak is the largest working set among
    the visited tiles, or of a query block that meets no key block (Q_i, O_i, ℓ_i, m_i).
    """
    n_q, d, d_v = pb.shape.n_q, pb.shape.d, pb.shape.d_v
    tiles = visits(pb, tiling, skips_hidden=True)
    pairs = tiles.pairs()
    cols = sum(b_j * n for _, b_j, n in pairs)  # key rows met by query blocks
    reads = {"Q": n_q * d, "K": cols * d}  # K, V once per query block meeting them; MLA's latent V is K's
    if not pb.latent:
        reads["V"] = cols * d_v
    writes = {"O": n_q * d_v, "l": n_q, "m": n_q}  # each written once
    if pb.has_mask:
        reads["mask"] = sum(b_i * b_j * n for b_i, b_j, n in pairs)  # each visited tile of the mask, once
    if pb.page_size:
        reads["block_table"] = sum(entries(pb, b_j) * n for _, b_j, n in pairs)  # its pages' entries per K/V load
    if pb.sinks:
        reads["sinks"] = tiles.q.T  # the head's sink, once per query block, before O_i is allocated
    if pb.fp8:
        reads["descale"] = 3 * tiles.q.T  # Q's, K's and V's descales, once per query block beside Q_i
    blind = [b_i * (d + d_v) + 2 * b_i for b_i in tiles.blind_query_sizes()]  # Q_i, O_i, ℓ_i, m_i alone
    peak = max(blind + [working_set(pb, Tiling(b_i, b_j), M) for b_i, b_j, _ in pairs])
    return exact_counts(TENSORS, pb, reads, writes, peak)


def flops(pb: Problem, tiling: Tiling, M: int) -> Flops:
    """Two products per visited tile, B_r × d × B_c and B_r × B_c × d_v, and B_r·B_c + B_r exponentials."""
    pairs = visits(pb, tiling, skips_hidden=True).pairs()
    area = sum(b_i * b_j * n for b_i, b_j, n in pairs)  # N_q·N_k without a causal skip
    rows = sum(b_i * n for b_i, _, n in pairs)
    return Flops(matmul=2 * (pb.shape.d + pb.shape.d_v) * area, exp=area + rows).scaled(pb.shape.bh)


def paper_form(pb: Problem, M: int) -> float:
    """The swapped loop's count 8N²d²/M + 3dN + 2N (docs/derivations.md), N² ↦ N_q·N_k and N ↦ N_q."""
    n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d
    return pb.shape.bh * (8 * n_q * n_k * d * d / M + 3 * d * n_q + 2 * n_q)


ALGORITHM = Algorithm(
    name="flash-swapped", run=run, tensors=TENSORS, outer="Br", working_set=working_set, traffic=traffic,
    paper_form=paper_form, paper_label="8N²d²/M + 3dN + 2N", backward=flash_swapped_backward.ALGORITHM,
    flops=flops, needs=Needs(window=True, pages=True, sinks=True, latent=True, fp8=True),
)
