"""The grids of kernels/flash.py: FlashAttention's forward (Algorithm 2) and backward (Algorithm 4), one thread
block per batch·head, and the forward's closed form of the L2 model's DRAM bytes.

Line numbers are those of the algorithms as ``iosim.algorithms.flash`` and ``flash_backward`` run them. Each
grid takes the kernel's blocks per SM (``iosim.gpu.kernels`` reads them from the resource report); the
``*_smem`` bounds are what shared memory allows where the report has no row for the tiling.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from iosim.core.errors import InputError
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.core.visits import visits
from iosim.gpu.l2 import READ, READ_WRITE, SECTOR, WRITE, DramForm, Grid, SharedMemoryBound, Tiles
from iosim.gpu.lockstep import lockstep_hits

FORWARD_TENSORS = ("Q", "K", "V", "O", "l", "m", "lse", "out")  # out: the float16 output, cast at the last step


def forward(pb: Problem, tiling: Tiling, per_sm: int | SharedMemoryBound) -> Grid:
    """One thread block per batch·head, as the kernel's ``grid (batch·heads,)``. Its steps: line 3, zeros to
    O_i, ℓ_i, m_i (and lse_i, out_i) for each query block; then for each K/V block j (K_j, V_j loaded with its
    first query block) and each query block i that sees it, Q_i read and O_i, ℓ_i, m_i read and rewritten, lse_i
    (and out_i) written at the last j. O stays float32 in HBM whatever the dtype (the kernel accumulates in it)."""
    s, (Br, Bc) = pb.shape, (tiling.Br, tiling.Bc)
    Tr, Tc = -(-s.n_q // Br), -(-s.n_k // Bc)
    data, stat, acc = pb.itemsize("data"), pb.itemsize("stat"), 4
    cast = data != acc
    tiles = Tiles(FORWARD_TENSORS)
    met = visits(pb, tiling, skips_hidden=True)
    # the K/V blocks each query block meets (maybe none), listed when a block first steps, not when the grid is made:
    # at a billion tokens the list alone takes seconds, which a count refused by its budget never needs
    key_runs = cache(lambda: [met.key_run(i) for i in range(Tr)])

    def steps(bh: int):
        kvh = s.kv_head(bh)
        runs = key_runs()
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

    return Grid(s.bh, steps, tiles, per_sm, uniform=s.kv_heads == s.heads,  # GQA: heads share K_j, V_j
                block_steps=Tr + sum(n for _, _, n in met.pairs()))  # line 3's, then one a tile the head visits


# the closed form's arrays run over the query blocks: 2²¹ of them take about 3 s and 0.6 GB on this project's 2-core
# container (N = 128Mi at B_r = 64, 2026-11-27); beyond, it declines
FORM_MAX_QUERY_BLOCKS = 2**21


def forward_dram(pb: Problem, tiling: Tiling, capacity: int, concurrent: int) -> DramForm | None:
    """Closed form of ``iosim.gpu.schedule.simulate(forward(pb, tiling, per_sm), ...)`` for full attention (no causal
    mask, no GQA), every tile at most ``capacity``, up to ``FORM_MAX_QUERY_BLOCKS`` query blocks: reads, bytes
    written and dirty bytes at the end, per tensor. None elsewhere. Its work is O(T_r): the steps j ≥ 1 differ only
    through K_j, K_(j−1) and whether j is the last.

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
    if Tr > FORM_MAX_QUERY_BLOCKS:
        return None  # its arrays over the query blocks would outgrow memory (iosim.gpu.dram then refuses by time)
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
    # steps j ≥ 1 differ only through K_j, K_(j−1) and whether j is the last: one row per distinct triple, with how
    # many steps share it, so that the work is O(T_r), not O(T_r·T_c)
    js = np.arange(1, Tc)
    triples, repeats = np.unique(np.stack([kv[js], kv[js - 1], js == Tc - 1], axis=1), axis=0, return_counts=True)
    k_j, k_prev, last = (triples[:, c][:, None] for c in range(3))
    own_j = S + 2 * k_j + last * lt(LO)
    F1_j = S + 2 * np.where(i >= 1, k_j, k_prev) + last * lt(LO)
    F2_j = S + 2 * k_j + last * (lt(LO) + LO)
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
        miss_j = repeats @ (w - hits(own_j, F1_j, F2_j, w)) if Tc > 1 else np.zeros(Tr, np.int64)  # by i, j ≥ 1
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


def forward_smem(pb: Problem, tiling: Tiling) -> SharedMemoryBound:
    """The forward's occupancy as shared memory allows: Q_i, K_j, V_j, P_ij and row partials, float32."""
    Br, Bc, d = tiling.Br, tiling.Bc, pb.shape.d
    return SharedMemoryBound(4 * ((Br + 2 * Bc) * d + Br * (Bc + 1) + 4 * Br))


BACKWARD_TENSORS = ("Q", "K", "V", "O", "dO", "lse", "dQ", "dK", "dV")  # dQ: the float32 accumulator dq_acc


def backward(pb: Problem, tiling: Tiling, per_sm: int | SharedMemoryBound) -> Grid:
    """One thread block per batch·head, as the kernel's ``grid (batch·heads,)``, one kernel (float32: no cast
    of dQ after it). Tile B × B with B = B_r = B_c, as the kernel has it. Its steps: line 5, zeros to dQ_i for
    each query block; then for each K/V block j (K_j, V_j loaded with its first query block) and each query
    block i that sees it (from the first one the causal mask leaves, as the kernel's i_start), Q_i, dO_i, lse_i
    and O_i (for D_i = rowsum(dO_i ∘ O_i), recomputed at every step) read and dQ_i read and rewritten
    (line 21); dK_j, dV_j written after the last (line 24). The kernel reads lse, not ℓ and m."""
    if tiling.Br != tiling.Bc:
        raise InputError(f"Br={tiling.Br}, Bc={tiling.Bc}: the flash backward kernel's tile is square; "
                         "allowed: Br == Bc")
    s, B = pb.shape, tiling.Br
    Tr, Tc = -(-s.n_q // B), -(-s.n_k // B)
    data, stat, acc = pb.itemsize("data"), pb.itemsize("stat"), 4
    tiles = Tiles(BACKWARD_TENSORS)
    rows = [min(B, s.n_q - i * B) for i in range(Tr)]
    cols = [min(B, s.n_k - j * B) for j in range(Tc)]
    met = visits(pb, tiling, skips_hidden=True)

    def steps(bh: int):
        kvh = s.kv_head(bh)
        for i in range(Tr):  # line 5
            yield (tiles.access("dQ", bh * Tr + i, rows[i] * s.d * acc, WRITE),)
        inner = [tuple(tiles.access(x, bh * Tr + i, r * s.d * data, READ) for x in ("Q", "dO", "O")) + (
            tiles.access("lse", bh * Tr + i, r * stat, READ),
            tiles.access("dQ", bh * Tr + i, r * s.d * acc, READ_WRITE)) for i, r in enumerate(rows)]
        for j in range(Tc):  # line 6
            kv = tuple(tiles.access(x, kvh * Tc + j, cols[j] * s.d * data, READ) for x in ("K", "V"))  # line 7
            out = tuple(tiles.access(x, bh * Tc + j, cols[j] * s.d * data, WRITE) for x in ("dK", "dV"))  # line 24
            run = met.query_run(j)
            seen = inner[run.start:run.stop]  # from the kernel's i_start
            if not seen:
                yield kv + out
                continue
            for k, step in enumerate(seen):  # line 9
                yield (kv if k == 0 else ()) + step + (out if k == len(seen) - 1 else ())

    return Grid(s.bh, steps, tiles, per_sm, uniform=s.kv_heads == s.heads)  # GQA: heads share K_j, V_j


def backward_smem(pb: Problem, tiling: Tiling) -> SharedMemoryBound:
    """The backward's occupancy as shared memory allows: K_j, V_j, Q_i, dO_i, Pᵀ, dSᵀ, lse_i, D_i, float32."""
    B, d = tiling.Br, pb.shape.d
    return SharedMemoryBound(4 * (4 * B * d + 2 * B * (B + 1) + 2 * B))
