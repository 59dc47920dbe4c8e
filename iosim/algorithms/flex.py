"""FlexAttention's forward (``torch.nn.attention.flex_attention``, its Triton kernel): FlashAttention-2's loop over
the blocks a mask function leaves, as its block mask sorts them.

The block mask (``iosim.block_mask``, ``Problem.flex``) sorts each B_r × B_c tile into full, partial and empty. For
each query block the kernel reads how many partial and how many full key blocks it has, loads Q_i once and keeps
O_i, ℓ_i and m_i on chip, then runs two loops over its key blocks, each reading one index per block: the partial
blocks, where it evaluates the mask function on the tile (and reads, for each of the tile's query and key rows, the
tensors the function declares), then the full blocks, with no mask at all. A score_mod (``Problem.score_mod``) is
applied to every visited tile's scores before the mask: its declared FLOPs per score (``Flops.score``) and, per
query and key row, the tensors it declares. Empty blocks are never visited. O, ℓ and
m are written once per query block. The runs are on the block mask's own blocks, whatever the block policy.

On-chip buffers per head: those of ``flash-swapped`` (Q_i, O_i, K_j, V_j, S_ij, ℓ_i, m_i, m_new, ℓ̃), and on a partial
block one entry of each declared tensor for each of its query and key rows.

Deviations: the kernel writes the log-sum-exp alone; here ℓ and m, as ``flash-swapped`` writes them. The mask
function's arithmetic is not counted (it is no matrix product); its reads are.
"""

from __future__ import annotations

import numpy as np

from iosim.algorithms import flex_backward
from iosim.algorithms.algorithm import OUTPUT, STATISTICS, Algorithm, Needs, exact_counts
from iosim.algorithms.tile_ops import absorb_block, kv_width, load_kv, safe_divide, scores
from iosim.core.counts import Counts
from iosim.core.flops import Flops, matmul
from iosim.core.memory import Memory
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.variants.flex import EMPTY, FULL, PARTIAL, flex_visits
from iosim.variants.score_mods import head_indices

TENSORS = (OUTPUT, *STATISTICS)


def run(mem: Memory, pb: Problem, tiling: Tiling) -> None:
    """FlexAttention's forward over ``pb``'s block mask; leaves O, ℓ, m in HBM."""
    d, d_v = pb.shape.d, pb.shape.d_v
    tiles = flex_visits(pb, tiling)
    for i, rows in mem.loop(tiles.query_blocks()):
        br = rows.stop - rows.start
        for counts in ("kv_num_blocks", "full_kv_num_blocks"):  # how many partial and full key blocks
            mem.free(mem.load(counts, rows=slice(i, i + 1)))
        Q_i = mem.load("Q", rows)
        l_i, m_i = mem.alloc("l_i", br, fill=0.0), mem.alloc("m_i", br, fill=-np.inf)
        O_i = mem.alloc("O_i", br, d_v, fill=0.0)
        for kind, blocks in ((PARTIAL, tiles.partial.keys_seen_by(i)), (FULL, tiles.full.keys_seen_by(i))):
            indices = "kv_indices" if kind == PARTIAL else "full_kv_indices"
            for j, cols in mem.loop(blocks):
                bc = cols.stop - cols.start
                mem.free(mem.load(indices, slice(i, i + 1), slice(j, j + 1), tile="index"))  # which block is next
                K_j, V_j = load_kv(mem, pb, cols)
                S_ij = mem.alloc("S_ij", br, bc)
                m_new, l_tilde = mem.alloc("m_new", br), mem.alloc("l~_ij", br)
                score_flops = pb.score_mod.flops * br * bc if pb.score_mod is not None else 0
                mem.compute(matmul=matmul(br, d, bc) + matmul(br, bc, d_v), exp=br * bc + br, score=score_flops)
                names = [*(pb.flex.reads if kind == PARTIAL else ()), *getattr(pb.score_mod, "reads", ())]
                ids = [mem.load(name, rows_of, tile=f"{name}_{side}")  # the mask's (partial) and score_mod's reads
                       for name in names for side, rows_of in (("q", rows), ("kv", cols))]
                if mem.numeric:
                    S_ij.data = scores(pb, Q_i, K_j, rows, cols, None)  # (bh, Br, Bc)
                    if pb.score_mod is not None:
                        S_ij.data = pb.score_mod.apply(S_ij.data, rows, cols, *head_indices(pb))
                    if kind == PARTIAL:
                        S_ij.data = np.where(pb.flex.keep(rows, cols), S_ij.data, -np.inf)
                    absorb_block(pb, S_ij, V_j, m_i, l_i, O_i, m_new, l_tilde, rows, cols)
                mem.free(K_j, V_j, S_ij, m_new, l_tilde, *ids)
        if mem.numeric:
            O_i.data = safe_divide(O_i.data, l_i.data)
        mem.store(O_i, "O", rows)
        mem.store(l_i, "l", rows)
        mem.store(m_i, "m", rows)
        mem.free(Q_i, O_i, l_i, m_i)


def working_set(pb: Problem, tiling: Tiling, M: int) -> int:
    # flash-swapped's: Q_i, O_i + K_j, V_j + S_ij + (ℓ_i, m_i, m_new, ℓ̃); on a partial tile, where the mask has
    # one, the mask function's reads, one entry per query and key row of each declared tensor
    partial = pb.flex is not None and bool((pb.flex.kinds == PARTIAL).any())
    return tile_set(pb, tiling.Br, tiling.Bc, partial=partial)


def tile_set(pb: Problem, Br: int, Bc: int, partial: bool) -> int:
    reads = (len(pb.flex.reads) if pb.flex is not None and partial else 0) + len(getattr(pb.score_mod, "reads", ()))
    return Br * (pb.shape.d + pb.shape.d_v) + Bc * kv_width(pb) + Br * Bc + 4 * Br + reads * (Br + Bc)


def traffic(pb: Problem, tiling: Tiling, M: int) -> Counts:
    """Exact counts: sums over the partial and the full tiles of the block mask (b_i query rows × b_j key rows).

    Q is read and O, ℓ, m written once per query block; K and V once per visited tile; one index per visited tile
    and two counts per query block; the declared tensors' entries for every row of each partial tile.
    """
    n_q, d, d_v = pb.shape.n_q, pb.shape.d, pb.shape.d_v
    tiles = flex_visits(pb, tiling)
    partial, full = tiles.partial.pairs(), tiles.full.pairs()
    cols = sum(b_j * n for _, b_j, n in partial + full)  # key rows read, over every query block
    reads = {"Q": n_q * d, "K": cols * d, "kv_num_blocks": tiles.q.T, "full_kv_num_blocks": tiles.q.T,
             "kv_indices": sum(n for *_, n in partial), "full_kv_indices": sum(n for *_, n in full)}
    if not pb.latent:
        reads["V"] = cols * d_v
    for name in pb.flex.reads:
        reads[name] = sum((b_i + b_j) * n for b_i, b_j, n in partial)
    for name in getattr(pb.score_mod, "reads", ()):  # the score_mod's, on every visited tile
        reads[name] = sum((b_i + b_j) * n for b_i, b_j, n in partial + full)
    writes = {"O": n_q * d_v, "l": n_q, "m": n_q}
    alone = [b_i * (d + d_v) + 2 * b_i for b_i in tiles.q.all().sizes()]  # Q_i, O_i, ℓ_i, m_i of any query block
    peak = max(alone + [tile_set(pb, b_i, b_j, True) for b_i, b_j, _ in partial]
               + [tile_set(pb, b_i, b_j, False) for b_i, b_j, _ in full])
    return exact_counts(TENSORS, pb, reads, writes, peak)


def flops(pb: Problem, tiling: Tiling, M: int) -> Flops:
    """Two products per visited tile, B_r × d × B_c and B_r × B_c × d_v, B_r·B_c + B_r exponentials, and a
    score_mod's declared FLOPs per score."""
    pairs = flex_visits(pb, tiling).visited().pairs()
    area = sum(b_i * b_j * n for b_i, b_j, n in pairs)
    rows = sum(b_i * n for b_i, _, n in pairs)
    score = area * pb.score_mod.flops if pb.score_mod is not None else 0
    return Flops(matmul=2 * (pb.shape.d + pb.shape.d_v) * area, exp=area + rows, score=score).scaled(pb.shape.bh)


def paper_form(pb: Problem, M: int) -> float:
    """The swapped loop's 8N²d²/M + 3dN + 2N scaled by the fraction of tiles the mask leaves (N² ↦ N_q·N_k)."""
    n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d
    left = float(np.mean(pb.flex.kinds != EMPTY)) if pb.flex is not None else 1.0
    return pb.shape.bh * (left * 8 * n_q * n_k * d * d / M + 3 * d * n_q + 2 * n_q)


ALGORITHM = Algorithm(
    name="flex", run=run, tensors=TENSORS, outer="Br", working_set=working_set, traffic=traffic,
    paper_form=paper_form, paper_label="s(8N²d²/M) + 3dN + 2N", flops=flops, backward=flex_backward.ALGORITHM,
    needs=Needs(flex=True, latent=True),
)
