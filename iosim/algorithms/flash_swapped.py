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
O = 0, ℓ = 0, m = −inf.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from iosim.algorithms.algorithm import OUTPUT, STATISTICS, Algorithm, Needs, exact_counts
from iosim.algorithms import flash_swapped_backward
from iosim.algorithms.tile_ops import absorb_block, load_mask, read_block_table, safe_divide, scores
from iosim.core.counts import Counts
from iosim.core.flops import Flops, matmul
from iosim.gpu.l2 import READ, SECTOR, WRITE, DramForm, Grid, SharedMemoryBound, SharedSteps, Step, Tiles, sectors
from iosim.core.memory import Memory
from iosim.variants.paging import entries
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.core.visits import visits

TENSORS = (OUTPUT, *STATISTICS)


def run(mem: Memory, pb: Problem, tiling: Tiling) -> None:
    """Run the swapped-loop forward on Q, K, V (and mask) in ``mem``; leaves O, l, m in HBM."""
    d = pb.shape.d
    tiles = visits(pb, tiling, skips_hidden=True)

    for i, rows in mem.loop(tiles.query_blocks()):  # outer loop over query blocks
        br = rows.stop - rows.start
        Q_i = mem.load("Q", rows)
        O_i = mem.alloc("O_i", br, d, fill=0.0)  # on chip for the whole inner loop (line 3)
        l_i, m_i = mem.alloc("l_i", br, fill=0.0), mem.alloc("m_i", br, fill=-np.inf)
        for _, cols in mem.loop(tiles.keys_seen_by(i)):  # inner loop over the K/V blocks Q_i sees
            bc = cols.stop - cols.start
            read_block_table(mem, pb, cols)  # a paged cache: where K_j, V_j are
            K_j, V_j = mem.load("K", cols), mem.load("V", cols)  # line 7
            mask_ij = load_mask(mem, pb, rows, cols)
            S_ij = mem.alloc("S_ij", br, bc)
            m_new, l_tilde = mem.alloc("m_new", br), mem.alloc("l~_ij", br)
            # S_ij = Q_i K_jᵀ and P̃_ij V_j; exp for P̃_ij and the rescaling of O_i, ℓ_i
            mem.compute(matmul=matmul(br, d, bc) + matmul(br, bc, d), exp=br * bc + br)
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
    # Q_i, O_i + K_j, V_j + S_ij + (ℓ_i, m_i, m_new, ℓ̃) [+ mask tile]
    Br, Bc, d = tiling.Br, tiling.Bc, pb.shape.d
    return 2 * Br * d + 2 * Bc * d + Br * Bc + 4 * Br + pb.has_mask * Br * Bc


def traffic(pb: Problem, tiling: Tiling, M: int) -> Counts:
    """Exact counts: sums over the visited tiles (b_i query rows × b_j key rows each).

    Without a causal skip, Σ b_j = T_r·N_k. The peak is the largest working set among
    the visited tiles, or of a query block that meets no key block (Q_i, O_i, ℓ_i, m_i).
    """
    n_q, d = pb.shape.n_q, pb.shape.d
    tiles = visits(pb, tiling, skips_hidden=True)
    pairs = tiles.pairs()
    cols = sum(b_j * n for _, b_j, n in pairs)  # key rows met by query blocks
    reads = {"Q": n_q * d, "K": cols * d, "V": cols * d}  # K, V once per query block meeting them
    writes = {"O": n_q * d, "l": n_q, "m": n_q}  # each written once
    if pb.has_mask:
        reads["mask"] = sum(b_i * b_j * n for b_i, b_j, n in pairs)  # each visited tile of the mask, once
    if pb.page_size:
        reads["block_table"] = sum(entries(pb, b_j) * n for _, b_j, n in pairs)  # its pages' entries per K/V load
    blind = [2 * b_i * d + 2 * b_i for b_i in tiles.blind_query_sizes()]  # Q_i, O_i, ℓ_i, m_i alone
    peak = max(blind + [working_set(pb, Tiling(b_i, b_j), M) for b_i, b_j, _ in pairs])
    return exact_counts(TENSORS, pb, reads, writes, peak)


def flops(pb: Problem, tiling: Tiling, M: int) -> Flops:
    """Two B_r × B_c × d products and B_r·B_c + B_r exponentials per visited tile."""
    pairs = visits(pb, tiling, skips_hidden=True).pairs()
    area = sum(b_i * b_j * n for b_i, b_j, n in pairs)  # N_q·N_k without a causal skip
    rows = sum(b_i * n for b_i, _, n in pairs)
    return Flops(matmul=4 * pb.shape.d * area, exp=area + rows).scaled(pb.shape.bh)


def paper_form(pb: Problem, M: int) -> float:
    """The swapped loop's count 8N²d²/M + 3dN + 2N (docs/derivations.md), N² ↦ N_q·N_k and N ↦ N_q."""
    n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d
    return pb.shape.bh * (8 * n_q * n_k * d * d / M + 3 * d * n_q + 2 * n_q)


# --- on a GPU: the grid of kernels/flash_swapped.py and its L2 traffic (iosim.gpu.l2) ----------------------------

# Resident blocks per H100 SM of the forward kernel as call 1 ran it (d4169c1, float32, full attention), by
# (d, B_r, B_c): the sm_90 resource report at c325e6e, whose kernels are d4169c1's (git show
# 8d6aafb:experiments/results/kernels_resources_sm90.md): 128 registers, 44,800 B shared -> 4 (d = 64, 64x32);
# 159 registers, 37,248 B -> 6 (d = 128, 32x16). Both limited by registers.
CALL1_BLOCKS_PER_SM = {(64, 64, 32): 4, (128, 32, 16): 6}
GRID_TENSORS = ("Q", "K", "V", "O", "lse")  # the kernel writes lse = m + log l instead of l and m


def _blocks_per_sm(pb: Problem, tiling: Tiling) -> int | SharedMemoryBound:
    """Call 1's occupancy where the report measured it, else as shared memory allows (float32 tiles)."""
    known = CALL1_BLOCKS_PER_SM.get((pb.shape.d, tiling.Br, tiling.Bc))
    if known is not None:
        return known
    return SharedMemoryBound(4 * ((tiling.Br + 2 * tiling.Bc) * pb.shape.d + tiling.Br * (tiling.Bc + 1)))


def kv_step_cache(tiles: Tiles, pb: Problem, tiling: Tiling) -> Callable[[int], list]:
    """The steps (K_j, V_j) of each K/V head, built once: one object per j for every block of the head, so that
    ``iosim.gpu.l2`` sees a repeated step and skips it."""
    s, Bc = pb.shape, tiling.Bc
    Tc, data = -(-s.n_k // Bc), pb.itemsize("data")
    shared: dict[int, list] = {}  # K/V head -> its steps

    def kv_steps(kvh: int) -> list:
        if kvh not in shared:
            shared[kvh] = [tuple(tiles.access(x, kvh * Tc + j, min(Bc, s.n_k - j * Bc) * s.d * data, READ)
                                 for x in ("K", "V")) for j in range(Tc)]
        return shared[kvh]

    return kv_steps


def block_accesses(tiles: Tiles, pb: Problem, tiling: Tiling) -> Callable[[int], tuple[Step, list, range, Step]]:
    """What forward block b = bh·T_r + i touches: (its Q_i read, the (K_j, V_j) steps of its K/V head, one list
    shared by the head's blocks, the run of key blocks j it sees, its O_i and lse_i writes)."""
    s, Br = pb.shape, tiling.Br
    Tr = -(-s.n_q // Br)
    data, stat = pb.itemsize("data"), pb.itemsize("stat")
    kv_steps = kv_step_cache(tiles, pb, tiling)
    met = visits(pb, tiling, skips_hidden=True)

    def accesses(b: int) -> tuple[Step, list, range, Step]:
        bh, i = divmod(b, Tr)
        rows = min(Br, s.n_q - i * Br)
        q = (tiles.access("Q", b, rows * s.d * data, READ),)
        out = (tiles.access("O", b, rows * s.d * data, WRITE), tiles.access("lse", b, rows * stat, WRITE))
        return q, kv_steps(s.kv_head(bh)), met.key_run(i), out

    return accesses


def grid(pb: Problem, tiling: Tiling) -> Grid:
    """One thread block per (query block i, batch·head), i fastest: block bh·T_r + i, as the kernel's
    ``grid (batch·heads · T_r,)``. Block (bh, i) loads Q_i, then K_j, V_j at each step j of the K/V blocks
    it sees (a causal mask ends the loop early, as the kernel does) and writes O_i and lse_i after the last."""
    return _grid(pb, tiling, sawtooth=False)


def sawtooth_grid(pb: Problem, tiling: Tiling) -> Grid:
    """``grid`` with the odd query blocks of each head visiting their key blocks last to first, as the forward kernel
    compiled with ``sawtooth`` runs (kernels/flash_swapped.py; the order of arXiv 2601.16032): block (bh, i) with i
    odd reads Q_i with its last key block, ends with its first and O_i, lse_i. The two-level count is flash-swapped's:
    only the order, which the L2 sees, differs."""
    return _grid(pb, tiling, sawtooth=True)


def _grid(pb: Problem, tiling: Tiling, sawtooth: bool) -> Grid:
    """The forward grid, its odd query blocks' key blocks in reverse where ``sawtooth``."""
    tiles = Tiles(GRID_TENSORS)
    accesses = block_accesses(tiles, pb, tiling)
    Tr = -(-pb.shape.n_q // tiling.Br)
    backward: dict[int, list] = {}  # a head's (K_j, V_j) steps, last first: the same step objects, shared

    def steps(b: int):
        q, kv, run, out = accesses(b)
        j0, n = run.start, len(run)
        if n <= 1:
            return iter((q + (kv[j0] if n else ()) + out,))
        if sawtooth and b % Tr % 2:
            kv = backward.setdefault(id(kv), kv[::-1])  # kv[k] is now K/V block T_c − 1 − k
            j0 = len(kv) - run.stop  # the run's last key block, first in this order
        # the key blocks between the first and the last are the head's steps, shared: the query blocks of a head
        # that start together run as one cohort in the simulation (iosim.gpu.schedule)
        return SharedSteps((q + kv[j0],), kv, j0 + 1, j0 + n - 1, (kv[j0 + n - 1] + out,))

    return Grid(pb.shape.bh * Tr, steps, tiles, _blocks_per_sm(pb, tiling))


def dram(pb: Problem, tiling: Tiling, capacity: int, concurrent: int) -> DramForm | None:
    """Closed form of ``iosim.gpu.schedule.simulate(grid(pb, tiling), ...)`` for full attention (no mask, no GQA):
    reads per tensor, and bytes written (during the kernel and left dirty together). None outside that domain.
    O_i and lse_i tiles that are not whole sectors are read before they are written, as ``iosim.gpu.l2`` has it.

    Blocks run in waves of W = ``concurrent``, in lockstep. Q_i is read once, O_i and lse_i written once.
    K_j, V_j of a head are read at the first wave that holds one of its query blocks; a head whose blocks
    cross from wave w into w+1 (the last head of w, the first of w+1) re-reads them at w+1 exactly when they
    were evicted, i.e. when the distinct bytes touched between its two uses of K_j exceed the capacity:
    D_j = K_j + V_j + the K/V of steps after j of every head of w + O, lse of w's blocks (j < T_c − 1; only the
    last block's when j = T_c − 1) + the K/V of steps before j of every head of w+1 + Q of w+1's blocks (j ≥ 1;
    only the first block's when j = 0).

    Dirty at the end: O_i and lse_i are written once, at their block's last step, and never touched again; they
    stay when the bytes touched after them fit with them: the rest of that round (O, lse and K_(T_c−1), V_(T_c−1)
    of the blocks after it in its wave, and their Q when T_c = 1) and every tile of the later waves.
    """
    s, (Br, Bc) = pb.shape, (tiling.Br, tiling.Bc)
    if not pb.band.full or pb.has_mask or s.kv_heads != s.heads:
        return None
    Tr, Tc = -(-s.n_q // Br), -(-s.n_k // Bc)
    data, stat = pb.itemsize("data"), pb.itemsize("stat")
    kv = np.array([sectors(min(Bc, s.n_k - j * Bc) * s.d * data) for j in range(Tc)])  # one K_j (= V_j)
    q_of = [sectors(min(Br, s.n_q - i * Br) * s.d * data) for i in range(Tr)]  # Q_i (= O_i), by i
    lse_of = [sectors(min(Br, s.n_q - i * Br) * stat) for i in range(Tr)]
    blocks, W = s.bh * Tr, concurrent
    if 2 * kv.max() + 2 * q_of[0] + lse_of[0] > capacity:
        return None  # outside the domain: two blocks of a head in one round may not share K_j, V_j
    after = np.concatenate((np.cumsum(kv[::-1])[::-1][1:], [0]))  # Σ_{r > j} kv(r)
    before = np.concatenate(([0], np.cumsum(kv)[:-1]))  # Σ_{r < j} kv(r)
    kv_reads = s.bh * int(kv.sum())  # once per head at its first wave
    for w in range(W, blocks, W):  # wave boundaries: block w is the first of the next wave
        first, last = w // Tr, (w - 1) // Tr  # heads of the first block of w+1 and the last block of w
        if first != last:
            continue  # no head crosses this boundary
        heads_w = last - (w - W) // Tr + 1
        heads_next = (min(w + W, blocks) - 1) // Tr - first + 1
        out_w = sum(q_of[b % Tr] + lse_of[b % Tr] for b in range(w - W, w))
        q_next = sum(q_of[b % Tr] for b in range(w, min(w + W, blocks)))
        D = 2 * kv + 2 * heads_w * after + 2 * heads_next * before
        D = D + np.where(np.arange(Tc) < Tc - 1, out_w, q_of[(w - 1) % Tr] + lse_of[(w - 1) % Tr])
        D = D + np.where(np.arange(Tc) >= 1, q_next, q_of[w % Tr])
        kv_reads += int(kv[D > capacity].sum())
    q, lse = s.bh * sum(q_of), s.bh * sum(lse_of)
    rows = [min(Br, s.n_q - i * Br) for i in range(Tr)]  # a write of part of a sector reads it first (iosim.gpu.l2)
    fetched = {"O": s.bh * sum(q_of[i] for i, r in enumerate(rows) if r * s.d * data % SECTOR),
               "lse": s.bh * sum(lse_of[i] for i, r in enumerate(rows) if r * stat % SECTOR)}
    dirty = _dirty_at_end(np.array(q_of), np.array(lse_of), kv, Tr, blocks, W, capacity)
    return DramForm(reads={"Q": q, "K": kv_reads, "V": kv_reads, **fetched}, written={"O": q, "lse": lse},
                    dirty_at_end=dirty)


def _dirty_at_end(q_of: np.ndarray, lse_of: np.ndarray, kv: np.ndarray, Tr: int, blocks: int, W: int,
                  capacity: int) -> dict[str, int]:
    """O_b, lse_b of each block b still in the L2 at the end: those whose stack distance at the end fits."""
    b = np.arange(blocks)
    head = np.arange(blocks + 1) // Tr  # head[blocks] = batch·heads: past the last block
    q_b, lse_b = q_of[b % Tr], lse_of[b % Tr]  # Q_b (= O_b), lse_b

    def suffix(x):  # Σ over blocks >= c, for c in 0..blocks
        return np.concatenate((np.cumsum(x[::-1])[::-1], [0]))

    last_round = suffix(q_b + lse_b + (len(kv) == 1) * q_b)  # what a block touches after its K, V in its last round
    whole = suffix(2 * q_b + lse_b)  # Q, O, lse of a block
    start = np.minimum((b // W + 1) * W, blocks)  # the first block of the next wave
    later = whole[start] + 2 * int(kv.sum()) * (head[-1] - head[start])  # every tile of the later waves
    # the heads of the blocks after b in its wave, less one that goes on into the next wave (counted there)
    heads = np.maximum(0, head[start - 1] - (head[start] == head[start - 1]) - head[b + 1] + 1) * (b + 1 < start)
    rest = last_round[b + 1] - last_round[start] + 2 * int(kv[-1]) * heads + later
    return {"O": int(q_b @ (q_b + lse_b + rest <= capacity)), "lse": int(lse_b @ (lse_b + rest <= capacity))}


ALGORITHM = Algorithm(
    name="flash-swapped", run=run, tensors=TENSORS, outer="Br", working_set=working_set, traffic=traffic,
    paper_form=paper_form, paper_label="8N²d²/M + 3dN + 2N", backward=flash_swapped_backward.ALGORITHM,
    flops=flops, grid=grid, dram=dram, needs=Needs(window=True, pages=True),
)
