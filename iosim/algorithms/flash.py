"""FlashAttention forward: Algorithm 1, with Algorithm 2's scale, mask and dropout.

Dao et al., "FlashAttention: Fast and Memory-Efficient Exact Attention with
IO-Awareness" (2022), Algorithm 2; line numbers below are Algorithm 2's. K/V blocks
form the outer loop; the running O_i, ℓ_i and m_i go back to HBM after every inner
step.

On-chip buffers per head: K_j, V_j (B_c × d each), Q_i, O_i (B_r × d each),
S_ij (B_r × B_c, overwritten by P̃_ij), ℓ_i, m_i, m̃_ij, ℓ̃_ij, m_i^new, ℓ_i^new
(B_r each), and the mask tile (B_r × B_c) when a mask is given.

Deviations: the RNG state R is the seed itself (dropout is counter-based, see
``iosim.core.rng``), so nothing is written for it (lines 1, 19). With a band (causal, or
a sliding window), an inner step whose tile is entirely hidden is skipped (it would
leave O_i, ℓ_i, m_i unchanged), and so is a key block no query sees, as
FlashAttention's kernels do; an explicit mask is not inspected, so
its tiles are all visited. Rows that see no key end with O = 0, ℓ = 0, m = −inf.
"""

from __future__ import annotations

import numpy as np

from iosim.algorithms.algorithm import OUTPUT, STATISTICS, Algorithm, Needs, exact_counts
from iosim.algorithms import flash_backward
from iosim.algorithms.tile_ops import apply_dropout, exp_diff, load_mask, safe_divide, scores
from iosim.core.counts import Counts
from iosim.gpu.lockstep import lockstep_hits
from iosim.core.flops import Flops, matmul
from iosim.gpu.l2 import READ, READ_WRITE, SECTOR, WRITE, DramForm, Grid, SharedMemoryBound, Tiles
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
    d = pb.shape.d

    # line 3: initialize O = (0), ℓ = (0), m = (−inf) in HBM
    for _, rows in mem.loop(tiles.q.all()):
        br = rows.stop - rows.start
        for name, cols, fill in (("O", d, 0.0), ("l", 1, 0.0), ("m", 1, -np.inf)):
            init = mem.alloc(f"{name}_i", br, cols, fill=fill)
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
            mem.compute(matmul=matmul(br, d, bc) + matmul(br, bc, d), exp=br * bc + 2 * br)
            if mem.numeric:
                S_ij.data = scores(pb, Q_i, K_j, rows, cols, mask_ij)  # lines 10-11: (bh, Br, Bc)
                m_tilde.data = S_ij.data.max(axis=-1, keepdims=True)  # line 12
                S_ij.data = exp_diff(S_ij.data, m_tilde.data)  # P̃_ij, in place of S_ij
                l_tilde.data = S_ij.data.sum(axis=-1, keepdims=True)
                m_new.data = np.maximum(m_i.data, m_tilde.data)  # line 13
                alpha, beta = exp_diff(m_i.data, m_new.data), exp_diff(m_tilde.data, m_new.data)
                l_new.data = alpha * l_i.data + beta * l_tilde.data
                P_dropped = apply_dropout(pb, S_ij.data, rows, cols)  # line 14
                O_i.data = safe_divide(  # line 15: (bh, Br, d)
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
    Br, Bc, d = tiling.Br, tiling.Bc, pb.shape.d
    return 2 * Bc * d + 2 * Br * d + Br * Bc + 6 * Br + pb.has_mask * Br * Bc


def traffic(pb: Problem, tiling: Tiling, M: int) -> Counts:
    """Exact counts: sums over the visited tiles (b_i query rows × b_j key rows each).

    Without a causal skip, Σ b_i = T_c·N_q and Σ b_i·b_j = N_q·N_k. The peak is the
    largest working set among the visited tiles, line 3's one B_r × d tile, or (block-sparse)
    K_j, V_j of a key block none of whose tiles is visited.
    """
    return traffic_on(pb, tiling, M, visits(pb, tiling, skips_hidden=True))


def traffic_on(pb: Problem, tiling: Tiling, M: int, tiles: Visits) -> Counts:
    """The counts of ``run_on`` over ``tiles``: K_j, V_j read for each key block of the outer loop."""
    n_q, d = pb.shape.n_q, pb.shape.d
    n_k = sum(size * n for size, n in tiles.key_blocks().sizes().items())  # key rows loaded: N_k when dense
    pairs = tiles.pairs()
    rows = sum(b_i * n for b_i, _, n in pairs)  # query rows met by key blocks
    reads = {
        "Q": rows * d,  # Q_i re-read at every visited tile (line 9)
        "K": n_k * d, "V": n_k * d,  # K_j, V_j read once (line 7)
        "O": rows * d, "l": rows, "m": rows,  # line 9
    }
    writes = {
        "O": rows * d + n_q * d,  # line 15 per visited tile, plus the zeros of line 3
        "l": rows + n_q, "m": rows + n_q,  # line 16, plus line 3
    }
    if pb.has_mask:
        reads["mask"] = sum(b_i * b_j * n for b_i, b_j, n in pairs)  # each visited tile of the mask, once
    outer = [2 * b_j * d for b_j in tiles.key_blocks().sizes()]  # K_j, V_j of a key block with no visited tile
    peak = max([tiles.q.size(0) * d] + outer + [working_set(pb, Tiling(b_i, b_j), M) for b_i, b_j, _ in pairs])
    return exact_counts(TENSORS, pb, reads, writes, peak)


def flops(pb: Problem, tiling: Tiling, M: int) -> Flops:
    """Two B_r × B_c × d products and B_r·B_c + 2·B_r exponentials per visited tile."""
    return flops_on(pb, visits(pb, tiling, skips_hidden=True))


def flops_on(pb: Problem, tiles: Visits) -> Flops:
    """The arithmetic of ``run_on`` over ``tiles``."""
    pairs = tiles.pairs()
    area = sum(b_i * b_j * n for b_i, b_j, n in pairs)  # N_q·N_k without a causal skip
    rows = sum(b_i * n for b_i, _, n in pairs)
    return Flops(matmul=4 * pb.shape.d * area, exp=area + 2 * rows).scaled(pb.shape.bh)


def paper_form(pb: Problem, M: int) -> float:
    """Theorem 2's Θ(N²d²/M) with the constants of docs/derivations.md: 12N²d²/M + 16N²d/M + 3Nd.

    Shown with N² ↦ N_q·N_k and N ↦ N_q, so it reads as printed when N_q = N_k = N.
    """
    n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d
    return pb.shape.bh * (12 * n_q * n_k * d * d / M + 16 * n_q * n_k * d / M + 3 * n_q * d)


# --- on a GPU: the grid of kernels/flash.py (iosim.gpu.l2) ------------------------------------------------------

# Resident blocks per H100 SM of the forward kernel as call 1 ran it (d4169c1, float32), by (d, B_r, B_c).
# d = 64, 32x32: 3 (153 registers x 128 threads; the sm_90 resource report, git show
# 8d6aafb:experiments/results/kernels_resources_sm90.md, at c325e6e, whose kernels are d4169c1's). d = 128,
# 16x16 is not in the report: 64 threads of at most 255 registers take at most 2 x 8,192 of the SM's 65,536,
# and its 25.7 KB of shared memory fit 8 times, so at least 4; 4 is used (call 1's 256 blocks are resident at
# once either way).
CALL1_BLOCKS_PER_SM = {(64, 32, 32): 3, (128, 16, 16): 4}
GRID_TENSORS = ("Q", "K", "V", "O", "l", "m", "lse", "out")  # out: the float16 output, cast at the last step


def grid(pb: Problem, tiling: Tiling) -> Grid:
    """One thread block per batch·head, as the kernel's ``grid (batch·heads,)``. Its steps: line 3, zeros to
    O_i, ℓ_i, m_i (and lse_i, out_i) for each query block; then for each K/V block j (K_j, V_j loaded with its
    first query block) and each query block i that sees it, Q_i read and O_i, ℓ_i, m_i read and rewritten, lse_i
    (and out_i) written at the last j. O stays float32 in HBM whatever the dtype (the kernel accumulates in it)."""
    s, (Br, Bc) = pb.shape, (tiling.Br, tiling.Bc)
    Tr, Tc = -(-s.n_q // Br), -(-s.n_k // Bc)
    data, stat, acc = pb.itemsize("data"), pb.itemsize("stat"), 4
    cast = data != acc
    tiles = Tiles(GRID_TENSORS)
    met = visits(pb, tiling, skips_hidden=True)
    runs = [met.key_run(i) for i in range(Tr)]  # the K/V blocks each query block meets (maybe none)

    def steps(bh: int):
        kvh = s.kv_head(bh)
        rows = [min(Br, s.n_q - i * Br) for i in range(Tr)]
        for i in range(Tr):  # line 3
            t, r = bh * Tr + i, rows[i]
            yield (tiles.access("O", t, r * s.d * acc, WRITE), tiles.access("l", t, r * stat, WRITE),
                   tiles.access("m", t, r * stat, WRITE), tiles.access("lse", t, r * stat, WRITE)) + (
                (tiles.access("out", t, r * s.d * data, WRITE),) if cast else ())
        inner = [(tiles.access("Q", bh * Tr + i, r * s.d * data, READ),  # line 9
                  tiles.access("O", bh * Tr + i, r * s.d * acc, READ_WRITE),  # lines 9, 15, 16
                  tiles.access("l", bh * Tr + i, r * stat, READ_WRITE),
                  tiles.access("m", bh * Tr + i, r * stat, READ_WRITE)) for i, r in enumerate(rows)]
        final = [(tiles.access("lse", bh * Tr + i, r * stat, WRITE),) + (
            (tiles.access("out", bh * Tr + i, r * s.d * data, WRITE),) if cast else ()) for i, r in enumerate(rows)]
        for j in range(Tc):  # line 6
            bc = min(Bc, s.n_k - j * Bc)
            kv = (tiles.access("K", kvh * Tc + j, bc * s.d * data, READ),
                  tiles.access("V", kvh * Tc + j, bc * s.d * data, READ))
            for i in range(Tr):  # line 8
                if j not in runs[i]:
                    continue
                step = kv + inner[i] if kv else inner[i]
                yield step + final[i] if j == runs[i].stop - 1 else step
                kv = ()

    per_sm = CALL1_BLOCKS_PER_SM.get((s.d, Br, Bc))
    if per_sm is None:  # as shared memory allows: Q_i, K_j, V_j, P_ij and row partials, float32
        per_sm = SharedMemoryBound(4 * ((Br + 2 * Bc) * s.d + Br * (Bc + 1) + 4 * Br))
    return Grid(s.bh, steps, tiles, per_sm, uniform=s.kv_heads == s.heads)  # GQA: heads share K_j, V_j


def dram(pb: Problem, tiling: Tiling, capacity: int, concurrent: int) -> DramForm | None:
    """Closed form of ``iosim.gpu.schedule.simulate(grid(pb, tiling), ...)`` for full attention (no causal mask, no GQA),
    every tile at most ``capacity``: reads, bytes written and dirty bytes at the end, per tensor. None elsewhere.

    Every block has the same steps (its own head's tiles), so blocks run in waves of w = ``concurrent`` (the
    last w = batch·heads mod W) in lockstep, and a wave's hits depend on w alone. An access by the block at
    position p of its wave hits when its stack distance is at most the capacity (iosim.gpu.l2): the bytes its own
    block touched since the tile's last use (own, the tile included), plus (w−1−p)·F1 + p·F2, what one other
    block touches in the rounds between (F1: blocks after p, from the round of the last use to the one before
    this; F2: blocks before p, one round later). Per head, with A_i = Q_i + O_i + ℓ_i + m_i, LO_i = lse_i (+ out_i),
    E_i = line 3's O_i, ℓ_i, m_i, lse_i (+ out_i), S = Σ A_i, L = Σ LO_i, KV = Σ K_j (sizes in 32-byte sectors):

    - Q_i, O_i, ℓ_i, m_i at step (j ≥ 1, i), last used at (j−1, i): own = S + 2K_j + [j = T_c−1]·L_<i,
      F1 = S + 2K_(j if i ≥ 1 else j−1) + [j = T_c−1]·L_<i, F2 = S + 2K_j + [j = T_c−1]·L_≤i.
    - O_i, ℓ_i, m_i at (0, i), last used at line 3 (Q_i is new): own = E_≥i + A_<i + Q_i + 2K_0 + [T_c = 1]·L_<i,
      F1 = E_≥i + A_<i + [i ≥ 1]·2K_0 + [T_c = 1]·L_<i, F2 = E_>i + A_≤i + 2K_0 + [T_c = 1]·L_≤i.
    - lse_i (out_i) at (T_c−1, i), last used at line 3: as O_i at (0, i) when T_c = 1; else own = F2 = S + L + 2KV,
      F1 = F2 − [i = 0]·2K_(T_c−1).
    - Dirty at the end: an output tile last written at (T_c−1, i) stays when the bytes after it (its own block's
      rest of the step and steps (T_c−1, >i); F1 = Σ_≥i (A + LO) + [i = 0]·2K_(T_c−1), F2 = Σ_>i (A + LO); every
      tile of every block of later waves) fit with it.

    A read-and-write that misses reads and starts a new dirty copy; line 3's writes always do; a write of part of
    a sector reads it first. K, V and the first Q_i are always misses.
    """
    s, (Br, Bc) = pb.shape, (tiling.Br, tiling.Bc)
    if not pb.band.full or pb.has_mask or pb.block_sparsity is not None or s.kv_heads != s.heads:
        return None
    Tr, Tc = -(-s.n_q // Br), -(-s.n_k // Bc)
    data, stat, acc = pb.itemsize("data"), pb.itemsize("stat"), 4
    rows = np.minimum(Br, s.n_q - Br * np.arange(Tr))
    raw = {"Q": rows * s.d * data, "O": rows * s.d * acc, "l": rows * stat, "m": rows * stat, "lse": rows * stat,
           "out": rows * s.d * data * (data != acc)}
    size = {x: -(-b // SECTOR) * SECTOR for x, b in raw.items()}  # (Tr,) each
    fetch = {x: size[x] * (raw[x] % SECTOR != 0) for x in raw}  # a partial write reads first
    kv = -(-np.minimum(Bc, s.n_k - Bc * np.arange(Tc)) * s.d * data // SECTOR) * SECTOR  # K_j (= V_j), (Tc,)
    if max(int(kv.max()), *(int(v.max()) for v in size.values())) > capacity:
        return None  # a tile larger than the L2 goes around it
    A = size["Q"] + size["O"] + size["l"] + size["m"]
    LO = size["lse"] + size["out"]
    E = A - size["Q"] + LO
    S, L, KV, T = int(A.sum()), int(LO.sum()), int(kv.sum()), int(A.sum() + LO.sum() + 2 * kv.sum())
    lt = lambda x: np.cumsum(x) - x  # Σ over i' < i  # noqa: E731
    ge = lambda x: np.cumsum(x[::-1])[::-1]  # Σ over i' ≥ i  # noqa: E731
    i, one = np.arange(Tr), Tc == 1
    j = np.arange(1, Tc)[:, None]  # steps j ≥ 1: (Tc−1, Tr)
    last = j == Tc - 1
    own_j = S + 2 * kv[j] + last * lt(LO)
    F1_j = S + 2 * np.where(i >= 1, kv[j], kv[j - 1]) + last * lt(LO)
    F2_j = S + 2 * kv[j] + last * (lt(LO) + LO)
    own_0 = ge(E) + lt(A) + size["Q"] + 2 * kv[0] + one * lt(LO)
    F1_0 = ge(E) + lt(A) + (i >= 1) * 2 * kv[0] + one * lt(LO)
    F2_0 = ge(E) - E + lt(A) + A + 2 * kv[0] + one * (lt(LO) + LO)
    F1_L = S + L + 2 * KV - (i == 0) * 2 * int(kv[-1])
    after = ge(A + LO) - (A + LO)  # Σ over i' > i of A + LO
    suffix = {"O": size["O"] + 2 * size["l"] + LO, "l": 2 * size["l"] + LO, "m": size["l"] + LO, "lse": LO,
              "out": size["out"]}  # the tile and what follows it in its last step

    def hits(own, F1, F2, w):
        return lockstep_hits(own + (w - 1) * F1, F2 - F1, w, capacity)

    W, blocks = concurrent, s.bh
    waves = [W] * (blocks // W) + ([blocks % W] if blocks % W else [])
    reads = {x: 0 for x in raw} | {"K": 0, "V": 0}
    written, dirty = {x: 0 for x in raw}, {x: 0 for x in raw}
    for w in sorted(set(waves)):
        n = waves.count(w)
        miss_j = (w - hits(own_j, F1_j, F2_j, w)).sum(axis=0)  # by i, over j ≥ 1
        miss = miss_j + w - hits(own_0, F1_0, F2_0, w)  # O, ℓ, m
        miss_L = w - (hits(own_0, F1_0, F2_0, w) if one else hits(S + L + 2 * KV, F1_L, S + L + 2 * KV, w))
        miss_Q = miss_j + w  # the first Q_i always misses
        reads["Q"] += n * int(size["Q"] @ miss_Q)
        reads["K"] += n * w * KV
        reads["V"] += n * w * KV
        for x in ("O", "l", "m"):
            reads[x] += n * int(w * fetch[x].sum() + size[x] @ miss)
            written[x] += n * int(size[x] @ (w + miss))
        for x in ("lse", "out"):
            reads[x] += n * int(fetch[x] @ (w + miss_L))
            written[x] += n * int(size[x] @ (w + miss_L))
    later = 0
    for w in reversed(waves):  # from the last wave back, while a later wave leaves room
        if later >= capacity:
            break
        for x, tail in suffix.items():
            dirty[x] += int(size[x] @ hits(tail + after + later, ge(A + LO) + (i == 0) * 2 * int(kv[-1]), after, w))
        later += w * T
    keep = lambda d: {x: v for x, v in d.items() if v}  # noqa: E731
    return DramForm(reads=keep(reads), written=keep(written), dirty_at_end=keep(dirty))


ALGORITHM = Algorithm(
    name="flash", run=run, tensors=TENSORS, outer="Bc", working_set=working_set, traffic=traffic,
    paper_form=paper_form, paper_label="12N²d²/M + 16N²d/M + 3Nd", backward=flash_backward.ALGORITHM,
    flops=flops, grid=grid, dram=dram, needs=Needs(window=True),
)
