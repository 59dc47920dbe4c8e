"""FlexAttention's backward (``torch.nn.attention.flex_attention``, its Triton kernel): dQ over the block mask, dK and
dV over its transpose, each written once.

A first pass over the query blocks computes D_i = rowsum(dO_i ∘ O_i) and the log-sum-exp L_i from the forward's ℓ
and m, and saves both. Then two loops, as the kernel's two kinds of program: each query block loads Q_i, dO_i, L_i
and D_i once and runs over its partial key blocks and then its full ones (one ``kv_indices`` or ``full_kv_indices``
entry each), recomputing P_ij = exp(S_ij − L_i) and adding τ·dS_ij·K_j into dQ_i, written once; each key block loads
K_j and V_j once and runs over the query blocks of its partial tiles and then its full ones, from the block mask's
transpose (``q_num_blocks``, ``q_indices`` and their full ones), adding P_ijᵀ·dO_i into dV_j and τ·dS_ijᵀ·Q_i into
dK_j, written once. The mask function is evaluated on partial tiles only, with the tensors it declares read there,
in both loops. A score_mod (with its derivative, ``score_mod(..., grad=)``) is applied to every recomputed S_ij in
both loops, before the mask, and dS_ij is multiplied by its derivative at S_ij before it meets K_j or Q_i: its FLOPs
and its derivative's per score (``Flops.score``) and the tensors it declares, per query and key row of every visited
tile, in each loop. Line numbers are Algorithm 4's (Dao et al. 2022) that each step corresponds to.

On-chip buffers per head: first pass O_i, dO_i (B_r × d_v each) and ℓ_i, m_i, D_i, L_i (B_r each); the dQ loop
Q_i, dQ_i (B_r × d), dO_i (B_r × d_v), L_i, D_i (B_r each), K_j (B_c × d), V_j (B_c × d_v), S_ij and dP_ij
(B_r × B_c each); the dK, dV loop K_j, dK_j (B_c × d), V_j, dV_j (B_c × d_v), Q_i (B_r × d), dO_i (B_r × d_v),
L_i, D_i (B_r each), S_ij and dP_ij; on a partial tile, one entry of each tensor the mask declares per query and key
row; on every tile, the score_mod's, and its derivative at S_ij (B_r × B_c).

Deviations: FlexAttention's forward saves L itself; the forward modelled here (``flex``) saves ℓ and m, so the first
pass reads both and writes L, as ``flash-swapped backward`` does. A key block none of whose tiles is visited still
loads K_j, V_j and writes zeros for dK_j, dV_j, as a program of the kernel does.
"""

from __future__ import annotations

import numpy as np

from iosim.algorithms.algorithm import STATISTICS_PASS_TENSORS, Algorithm, Needs, exact_counts
from iosim.algorithms.tile_ops import exp_diff, gradient_statistics, score_gradient, scores, transpose
from iosim.core.counts import Counts
from iosim.core.flops import Flops, matmul
from iosim.core.memory import Memory, Tile
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.variants.flex import FULL, PARTIAL, flex_visits
from iosim.variants.score_mods import head_indices

TENSORS = STATISTICS_PASS_TENSORS


def run(mem: Memory, pb: Problem, tiling: Tiling) -> None:
    """FlexAttention's backward over ``pb``'s block mask on Q, K, V, O, ℓ, m, dO; leaves dQ, dK, dV in HBM."""
    d, d_v = pb.shape.d, pb.shape.d_v
    tiles = flex_visits(pb, tiling)
    for _, rows in mem.loop(tiles.q.all()):  # first pass: D and L (line 19)
        D_i, L_i, loaded = gradient_statistics(mem, rows)
        mem.store(D_i, "D", rows)
        mem.store(L_i, "L", rows)
        mem.free(*loaded, D_i, L_i)

    for i, rows in mem.loop(tiles.query_blocks()):  # dQ: each query block over its key blocks
        br = rows.stop - rows.start
        for counts in ("kv_num_blocks", "full_kv_num_blocks"):
            mem.free(mem.load(counts, slice(i, i + 1)))
        Q_i, dO_i, L_i, D_i = (mem.load(name, rows) for name in ("Q", "dO", "L", "D"))
        dQ_i = mem.alloc("dQ_i", br, d, fill=0.0)
        for kind, blocks in ((PARTIAL, tiles.partial.keys_seen_by(i)), (FULL, tiles.full.keys_seen_by(i))):
            indices = "kv_indices" if kind == PARTIAL else "full_kv_indices"
            for j, cols in mem.loop(blocks):
                bc = cols.stop - cols.start
                mem.free(mem.load(indices, slice(i, i + 1), slice(j, j + 1), tile="index"))
                K_j, V_j = mem.load("K", cols), mem.load("V", cols)
                S_ij, dP_ij = mem.alloc("S_ij", br, bc), mem.alloc("dP_ij", br, bc)
                # S_ij recomputed, dP_ij = dO_i V_jᵀ, dQ_i += τ dS_ij K_j; exp for P_ij
                mem.compute(matmul=2 * matmul(br, d, bc) + matmul(br, d_v, bc), exp=br * bc,
                            score=score_flops(pb, br, bc))
                ids = read_ids(mem, pb, kind, rows, cols)
                slope = mem.alloc("dmod_ij", br, bc) if pb.score_mod is not None else None
                if mem.numeric:
                    probabilities(pb, kind, Q_i, K_j, L_i, S_ij, rows, cols, slope)
                    score_gradient(pb, S_ij, dO_i, V_j, D_i, dP_ij, rows, cols)  # dS_ij in place of dP_ij
                    through_score_mod(dP_ij, slope)
                    dQ_i.data += pb.tau * (dP_ij.data @ K_j.data)  # (bh, Br, d)
                mem.free(K_j, V_j, S_ij, dP_ij, *ids, *([slope] if slope else []))
        mem.store(dQ_i, "dQ", rows)
        mem.free(Q_i, dO_i, L_i, D_i, dQ_i)

    for j, cols in mem.loop(tiles.key_blocks()):  # dK, dV: each key block over the query blocks of its tiles
        bc = cols.stop - cols.start
        for counts in ("q_num_blocks", "full_q_num_blocks"):
            mem.free(mem.load(counts, slice(j, j + 1)))
        K_j, V_j = mem.load("K", cols), mem.load("V", cols)
        dK_j, dV_j = mem.alloc("dK_j", bc, d, fill=0.0), mem.alloc("dV_j", bc, d_v, fill=0.0)
        for kind, blocks in ((PARTIAL, tiles.partial_t.keys_seen_by(j)), (FULL, tiles.full_t.keys_seen_by(j))):
            indices = "q_indices" if kind == PARTIAL else "full_q_indices"
            for i, rows in mem.loop(blocks):
                br = rows.stop - rows.start
                mem.free(mem.load(indices, slice(j, j + 1), slice(i, i + 1), tile="index"))
                Q_i, dO_i, L_i, D_i = (mem.load(name, rows) for name in ("Q", "dO", "L", "D"))
                S_ij, dP_ij = mem.alloc("S_ij", br, bc), mem.alloc("dP_ij", br, bc)
                # S_ij recomputed, dP_ij, dV_j += P_ijᵀ dO_i, dK_j += τ dS_ijᵀ Q_i; exp for P_ij
                mem.compute(matmul=2 * matmul(br, d, bc) + 2 * matmul(br, d_v, bc), exp=br * bc,
                            score=score_flops(pb, br, bc))
                ids = read_ids(mem, pb, kind, rows, cols)
                slope = mem.alloc("dmod_ij", br, bc) if pb.score_mod is not None else None
                if mem.numeric:
                    probabilities(pb, kind, Q_i, K_j, L_i, S_ij, rows, cols, slope)
                    dropped = score_gradient(pb, S_ij, dO_i, V_j, D_i, dP_ij, rows, cols)
                    through_score_mod(dP_ij, slope)
                    dV_j.data += transpose(dropped) @ dO_i.data  # (bh, Bc, d_v)
                    dK_j.data += pb.tau * (transpose(dP_ij.data) @ Q_i.data)  # (bh, Bc, d)
                mem.free(Q_i, dO_i, L_i, D_i, S_ij, dP_ij, *ids, *([slope] if slope else []))
        mem.store(dK_j, "dK", cols)
        mem.store(dV_j, "dV", cols)
        mem.free(K_j, V_j, dK_j, dV_j)


def read_ids(mem: Memory, pb: Problem, kind: int, rows: slice, cols: slice) -> list[Tile]:
    """The entries, for the tile's query and key rows, of every tensor the mask function declares (on a partial tile)
    and the score_mod declares (on every tile)."""
    names = [*(pb.flex.reads if kind == PARTIAL else ()), *getattr(pb.score_mod, "reads", ())]
    return [mem.load(name, part, tile=f"{name}_{side}") for name in names for side, part in (("q", rows), ("kv", cols))]


def score_flops(pb: Problem, br: int, bc: int) -> int:
    """A score_mod's FLOPs on a B_r × B_c tile of the backward: the function again, and its derivative."""
    return (pb.score_mod.flops + pb.score_mod.grad_flops) * br * bc if pb.score_mod is not None else 0


def probabilities(pb: Problem, kind: int, Q_i: Tile, K_j: Tile, L_i: Tile, S_ij: Tile, rows: slice,
                  cols: slice, slope: Tile | None = None) -> None:
    """P_ij = exp(S_ij − L_i) into S_ij (line 13), the score_mod applied first (its derivative at S_ij into
    ``slope``) and the mask function on a partial tile."""
    S_ij.data = scores(pb, Q_i, K_j, rows, cols, None)
    if pb.score_mod is not None:
        at = head_indices(pb)
        slope.data = pb.score_mod.derivative(S_ij.data, rows, cols, *at)
        S_ij.data = pb.score_mod.apply(S_ij.data, rows, cols, *at)
    if kind == PARTIAL:
        S_ij.data = np.where(pb.flex.keep(rows, cols), S_ij.data, -np.inf)
    S_ij.data = exp_diff(S_ij.data, L_i.data)


def through_score_mod(dS_ij: Tile, slope: Tile | None) -> None:
    """dS_ij, the gradient in the modified scores, taken back through the score_mod to the scores (the chain rule)."""
    if slope is not None:
        dS_ij.data = dS_ij.data * slope.data


def loop_sets(pb: Problem, b_i: int, b_j: int, partial: bool) -> tuple[int, int]:
    """On chip at one tile of the dQ loop and of the dK, dV loop: what each holds beside S_ij and dP_ij."""
    d, d_v = pb.shape.d, pb.shape.d_v
    reads = len(pb.flex.reads) * (b_i + b_j) if pb.flex is not None and partial else 0
    if pb.score_mod is not None:  # its tensors' entries and its derivative on every tile
        reads += len(pb.score_mod.reads) * (b_i + b_j) + b_i * b_j
    tile = 2 * b_i * b_j + reads
    dq = b_i * (2 * d + d_v) + 2 * b_i + b_j * (d + d_v) + tile  # Q_i, dQ_i, dO_i, L_i, D_i + K_j, V_j
    dkdv = 2 * b_j * (d + d_v) + b_i * (d + d_v) + 2 * b_i + tile  # K_j, V_j, dK_j, dV_j + Q_i, dO_i, L_i, D_i
    return dq, dkdv


def working_set(pb: Problem, tiling: Tiling, M: int) -> int:
    # the largest of the first pass, the dQ loop and the dK, dV loop at one full tile (partial where the mask has one)
    Br, d_v = tiling.Br, pb.shape.d_v
    partial = pb.flex is not None and bool((pb.flex.kinds == PARTIAL).any())
    return max(2 * Br * d_v + 4 * Br, *loop_sets(pb, Br, tiling.Bc, partial))


def traffic(pb: Problem, tiling: Tiling, M: int) -> Counts:
    """Exact counts: the first pass once per query row, each loop summed over the partial and full tiles.

    The dQ loop reads Q, dO, L, D once per query block and K, V once per visited tile; the dK, dV loop reads K, V
    once per key block and Q, dO, L, D once per visited tile; each reads one index per tile and two counts per block
    of its outer loop, and the declared tensors on partial tiles.
    """
    n_q, n_k, d, d_v = pb.shape.n_q, pb.shape.n_k, pb.shape.d, pb.shape.d_v
    tiles = flex_visits(pb, tiling)
    partial, full = tiles.partial.pairs(), tiles.full.pairs()
    rows = sum(b_i * n for b_i, _, n in partial + full)  # query rows met by the key blocks' loops
    cols = sum(b_j * n for _, b_j, n in partial + full)  # key rows met by the query blocks' loops
    reads = {
        "O": n_q * d_v, "l": n_q, "m": n_q,  # first pass
        "dO": n_q * d_v + n_q * d_v + rows * d_v,  # first pass, dQ loop, dK, dV loop
        "L": n_q + rows, "D": n_q + rows,
        "Q": n_q * d + rows * d, "K": cols * d + n_k * d, "V": cols * d_v + n_k * d_v,
        "kv_num_blocks": tiles.q.T, "full_kv_num_blocks": tiles.q.T,
        "q_num_blocks": tiles.k.T, "full_q_num_blocks": tiles.k.T,
        "kv_indices": sum(n for *_, n in partial), "full_kv_indices": sum(n for *_, n in full),
        "q_indices": sum(n for *_, n in partial), "full_q_indices": sum(n for *_, n in full),
    }
    for name in pb.flex.reads:  # in each loop, on every partial tile
        reads[name] = 2 * sum((b_i + b_j) * n for b_i, b_j, n in partial)
    for name in getattr(pb.score_mod, "reads", ()):  # the score_mod's, in each loop, on every visited tile
        reads[name] = 2 * sum((b_i + b_j) * n for b_i, b_j, n in partial + full)
    writes = {"D": n_q, "L": n_q, "dQ": n_q * d, "dK": n_k * d, "dV": n_k * d_v}
    first = [2 * b_i * d_v + 4 * b_i for b_i in tiles.q.all().sizes()]
    alone = [b_i * (2 * d + d_v) + 2 * b_i for b_i in tiles.q.all().sizes()]  # the dQ loop's query block alone
    alone += [2 * b_j * (d + d_v) for b_j in tiles.k.all().sizes()]  # the dK, dV loop's key block alone
    at_tiles = [s for pairs, p in ((partial, True), (full, False)) for b_i, b_j, _ in pairs
                for s in loop_sets(pb, b_i, b_j, p)]
    return exact_counts(TENSORS, pb, reads, writes, max(first + alone + at_tiles))


def flops(pb: Problem, tiling: Tiling, M: int) -> Flops:
    """Per visited tile, three products in the dQ loop (S_ij, dP_ij, dQ_i) and four in the dK, dV loop (S_ij, dP_ij,
    dV_j, dK_j), B_r·B_c exps in each; a log per query row; in each loop a score_mod's FLOPs and its derivative's
    per score."""
    pairs = flex_visits(pb, tiling).visited().pairs()
    area = sum(b_i * b_j * n for b_i, b_j, n in pairs)
    d, d_v = pb.shape.d, pb.shape.d_v
    score = 2 * area * (pb.score_mod.flops + pb.score_mod.grad_flops) if pb.score_mod is not None else 0
    return Flops(matmul=2 * (4 * d + 3 * d_v) * area, exp=2 * area + pb.shape.n_q, score=score).scaled(pb.shape.bh)


def paper_form(pb: Problem, M: int) -> float:
    """FlashAttention-2's backward form 16N²d²/M + 8N²d/M + 7Nd + 4N with its N² terms scaled by the fraction of
    tiles the mask leaves (N² ↦ N_q·N_k, N ↦ N_q)."""
    n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d
    left = float(np.mean(pb.flex.kinds != 0)) if pb.flex is not None else 1.0
    return pb.shape.bh * (left * (16 * n_q * n_k * d * d / M + 8 * n_q * n_k * d / M) + 7 * n_q * d + 4 * n_q)


ALGORITHM = Algorithm(
    name="flex backward", run=run, tensors=TENSORS, outer="Br", working_set=working_set, traffic=traffic,
    paper_form=paper_form, paper_label="s(16N²d²/M + 8N²d/M) + 7Nd + 4N", flops=flops, needs=Needs(flex=True),
)
