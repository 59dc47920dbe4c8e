"""The grids of kernels/flash_swapped.py: FlashAttention-2's forward (query blocks outer), with its sawtooth
option, and the main kernel of its backward (key blocks outer, dQ accumulated with atomics), and the forward's
closed form of the L2 model's DRAM bytes.

The backward's other kernels (row_dot, fill, cast) are kernels/_device.py's (``iosim.gpu.grids._device``).
Each grid takes the kernel's blocks per SM (``iosim.gpu.kernels`` reads them from the resource report); the
``*_smem`` bounds are what shared memory allows where the report has no row for the tiling.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from iosim.core.errors import InputError
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.core.visits import visits
from iosim.gpu import head_waves
from iosim.gpu.grids import swapped_flat
from iosim.gpu.grids._device import TILES
from iosim.gpu.l2 import (
    READ,
    READ_WRITE,
    SECTOR,
    WRITE,
    DramForm,
    Grid,
    SharedMemoryBound,
    Step,
    Tiles,
    sectors,
    shared_run,
)
from iosim.gpu.lockstep import lockstep_hits

FORWARD_TENSORS = ("Q", "K", "V", "O", "lse")  # the kernel writes lse = m + log l instead of l and m


def kv_step_cache(tiles: Tiles, pb: Problem, tiling: Tiling) -> Callable[[int], list]:
    """The steps (K_j, V_j) of each K/V head, built once: one object per j for every block of the head, so that
    ``iosim.gpu.l2`` sees a repeated step and skips it. K_j has d columns, V_j d_v."""
    s, Bc = pb.shape, tiling.Bc
    Tc, data = -(-s.n_k // Bc), pb.itemsize("data")
    shared: dict[int, list] = {}  # K/V head -> its steps

    def kv_steps(kvh: int) -> list:
        if kvh not in shared:
            shared[kvh] = [tuple(tiles.access(x, kvh * Tc + j, min(Bc, s.n_k - j * Bc) * width * data, READ)
                                 for x, width in (("K", s.d), ("V", s.d_v))) for j in range(Tc)]
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


def forward(pb: Problem, tiling: Tiling, per_sm: int | SharedMemoryBound, sawtooth: bool = False) -> Grid:
    """One thread block per (query block i, batch·head), i fastest: block bh·T_r + i, as the kernel's
    ``grid (batch·heads · T_r,)``. Block (bh, i) loads Q_i, then K_j, V_j at each step j of the K/V blocks
    it sees (a causal mask ends the loop early, as the kernel does) and writes O_i and lse_i after the last.

    ``sawtooth``: the odd query blocks of each head visit their key blocks last to first, as the forward kernel
    compiled with ``sawtooth`` runs (kernels/flash_swapped.py): block (bh, i) with i odd reads Q_i with its last key
    block, ends with its first and O_i, lse_i. (arXiv 2601.16032 alternates per wave of a persistent kernel instead:
    ``iosim.gpu.grids.persistent``.) The two-level count is the same: only the order, which the L2 sees, differs."""
    Tr = -(-pb.shape.n_q // tiling.Br)
    grid = ordered_forward(pb, tiling, per_sm, lambda b: sawtooth and b % Tr % 2 == 1)
    if sawtooth and pb.band.full and not pb.has_mask:  # every block sees every key block: pairs run as one
        return replace(grid, fuse=2)
    return grid


def ordered_forward(pb: Problem, tiling: Tiling, per_sm: int | SharedMemoryBound,
                    downwards: Callable[[int], bool]) -> Grid:
    """``forward``'s blocks, block b visiting its key blocks last to first where ``downwards(b)``."""
    tiles = Tiles(FORWARD_TENSORS)
    accesses = block_accesses(tiles, pb, tiling)
    backward: dict[int, list] = {}  # a head's (K_j, V_j) steps, last first: the same step objects, shared

    def steps(b: int):
        q, kv, run, out = accesses(b)
        j0, n = run.start, len(run)
        if n <= 1:
            return iter((q + (kv[j0] if n else ()) + out,))
        if downwards(b):
            kv = backward.setdefault(id(kv), kv[::-1])  # kv[k] is now K/V block T_c − 1 − k
            j0 = len(kv) - run.stop  # the run's last key block, first in this order
        return shared_run(q, kv, j0, n, out)

    return Grid(pb.shape.bh * -(-pb.shape.n_q // tiling.Br), steps, tiles, per_sm,
                flat=lambda: swapped_flat.forward_flat(pb, tiling, downwards, tiles.tensors))


def downward_forward(pb: Problem, tiling: Tiling, per_sm: int | SharedMemoryBound,
                     tile_at: Callable[[int], tuple[int, int]]) -> Grid:
    """FlashAttention-2's and -3's forward blocks, each visiting its key blocks from the last down to the first: block
    b (in launch or dispatch order) computes query block i of batch·head bh, (bh, i) = ``tile_at(b)``. It reads Q_i
    (and, for FP8 data, its K/V head's three float32 descales) with its first key block, K_j (d columns) and V_j (d_v)
    at each, and writes O_i (d_v columns in the output dtype) and lse_i (float32) with the last. A block that sees no
    key writes O_i and lse_i and reads nothing. The tiles of a head are shared objects, so that the blocks of one
    head started in one round run as a cohort (``iosim.gpu.schedule``)."""
    s, Br = pb.shape, tiling.Br
    Tr = -(-s.n_q // Br)
    data, out_size, stat = pb.itemsize("data"), pb.itemsize("out"), 4
    tiles = Tiles(FORWARD_TENSORS + (("descale",) if pb.fp8 else ()))
    upwards = kv_step_cache(tiles, pb, tiling)
    downwards: dict[int, list] = {}  # K/V head -> its (K_j, V_j) steps, last first: one list for all its blocks
    met = visits(pb, tiling, skips_hidden=True)

    def steps(b: int):
        bh, i = tile_at(b)
        rows = min(Br, s.n_q - i * Br)
        t = bh * Tr + i
        out = (tiles.access("O", t, rows * s.d_v * out_size, WRITE), tiles.access("lse", t, rows * stat, WRITE))
        run = met.key_run(i)
        if not run:
            return iter((out,))
        kvh = s.kv_head(bh)
        q = (tiles.access("Q", t, rows * s.d * data, READ),)
        if pb.fp8:
            q += (tiles.access("descale", kvh, 3 * stat, READ),)
        kv = downwards.get(kvh)
        if kv is None:
            kv = downwards[kvh] = upwards(kvh)[::-1]  # kv[k] is key block T_c − 1 − k
        return shared_run(q, kv, len(kv) - run.stop, len(run), out)

    return Grid(s.bh * Tr, steps, tiles, per_sm)


def forward_dram(pb: Problem, tiling: Tiling, capacity: int, concurrent: int) -> DramForm | None:
    """Closed form of ``iosim.gpu.schedule.simulate(forward(pb, tiling, per_sm), ...)`` for full attention (no mask, no
    GQA): reads per tensor, and bytes written (during the kernel and left dirty together). None outside that domain.
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
    # every block but the last of a head is full: a size is (full, last), and the work O(waves), not O(T_r·T_c)
    r_last, k_last = s.n_q - (Tr - 1) * Br, s.n_k - (Tc - 1) * Bc
    K, Kl = sectors(Bc * s.d * data), sectors(k_last * s.d * data)  # K_j (= V_j): j < T_c − 1, and the last
    Q, Ql = sectors(Br * s.d * data), sectors(r_last * s.d * data)  # Q_i (= O_i)
    L, Ll = sectors(Br * stat), sectors(r_last * stat)  # lse_i
    if Tr == 1:
        Q, L = Ql, Ll
    if Tc == 1:
        K = Kl
    kv_sum = (Tc - 1) * K + Kl
    blocks, W = s.bh * Tr, concurrent
    if 2 * max(K, Kl) + 2 * Q + L > capacity:
        return None  # outside the domain: two blocks of a head in one round may not share K_j, V_j
    kv_reads = s.bh * kv_sum  # once per head at its first wave
    w = np.arange(W, blocks, W, dtype=np.int64)  # wave boundaries: block w is the first of the next wave
    w = w[w // Tr == (w - 1) // Tr]  # only where a head crosses the boundary
    if len(w):
        end = np.minimum(w + W, blocks)
        heads_w = (w - 1) // Tr - (w - W) // Tr + 1
        heads_next = (end - 1) // Tr - w // Tr + 1
        ends = lambda a, b: b // Tr - a // Tr  # noqa: E731  (blocks in [a, b) that end a head)
        out_w = W * (Q + L) - ends(w - W, w) * (Q - Ql + L - Ll)
        q_next = (end - w) * Q - ends(w, end) * (Q - Ql)
        ends_head = (w - 1) % Tr == Tr - 1
        last_of_w = np.where(ends_head, Ql + Ll, Q + L)  # O, lse of the last block of wave w
        first_next = np.where(w % Tr == Tr - 1, Ql, Q)  # Q of the first block of w + 1

        def misses(D):  # K_j, V_j evicted between the head's two uses
            return D > capacity

        if Tc == 1:
            kv_reads += int(Kl * misses(2 * Kl + last_of_w + first_next).sum())
        else:
            after0 = kv_sum - K
            kv_reads += int(K * misses(2 * K + 2 * heads_w * after0 + out_w + first_next).sum())  # j = 0
            kv_reads += int(Kl * misses(2 * Kl + 2 * heads_next * (Tc - 1) * K + last_of_w + q_next).sum())  # last
            if Tc > 2:  # 1 <= j <= T_c − 2: D_j = c0 + β·j
                c0 = 2 * K + 2 * heads_w * ((Tc - 2) * K + Kl) + out_w + q_next
                beta = 2 * K * (heads_next - heads_w)
                # j = 1 + p for p in 0..T_c − 3: the misses are the j whose D_j does not fit
                kv_reads += int(K * ((Tc - 2) - lockstep_hits(c0 + beta, beta, Tc - 2, capacity)).sum())
    q, lse = s.bh * ((Tr - 1) * Q + Ql), s.bh * ((Tr - 1) * L + Ll)
    # a write of part of a sector reads it first (iosim.gpu.l2)
    partial = lambda rows, size: size * (rows % SECTOR != 0)  # noqa: E731
    fetched = {"O": s.bh * ((Tr - 1) * partial(Br * s.d * data, Q) + partial(r_last * s.d * data, Ql)),
               "lse": s.bh * ((Tr - 1) * partial(Br * stat, L) + partial(r_last * stat, Ll))}
    dirty = _dirty_at_end((Q, Ql), (L, Ll), (K, Kl, Tc), Tr, blocks, W, capacity)
    return DramForm(reads={"Q": q, "K": kv_reads, "V": kv_reads, **fetched}, written={"O": q, "lse": lse},
                    dirty_at_end=dirty)


def _dirty_at_end(q: tuple[int, int], lse: tuple[int, int], kv: tuple[int, int, int], Tr: int, blocks: int, W: int,
                  capacity: int) -> dict[str, int]:
    """O_b, lse_b of each block b still in the L2 at the end: those whose stack distance at the end fits. Only the
    blocks of the last waves can: a block with more than ``capacity`` of Q, O and lse of later blocks after it is
    evicted, so the work is over those last blocks alone. ``q``, ``lse``: (a head's full block's, its last's);
    ``kv``: (K_j, the last K_j, T_c)."""
    (Q, Ql), (L, Ll), (K, Kl, Tc) = q, lse, kv
    kv_sum = (Tc - 1) * K + Kl
    smallest = min(2 * Q + L, 2 * Ql + Ll)
    b0 = max(0, blocks - W - capacity // smallest - 1)  # blocks before b0 have more than the capacity after them
    c = np.arange(b0, blocks + 1)  # block indices and one past the last
    is_last = (c % Tr == Tr - 1)[:-1]
    q_b, lse_b = np.where(is_last, Ql, Q), np.where(is_last, Ll, L)  # Q_b (= O_b), lse_b, b >= b0

    def suffix(x):  # Σ over blocks >= c, for c in b0..blocks
        return np.concatenate((np.cumsum(x[::-1])[::-1], [0]))

    at = lambda table, index: table[index - b0]  # noqa: E731
    last_round = suffix(q_b + lse_b + (Tc == 1) * q_b)  # what a block touches after its K, V in its last round
    whole = suffix(2 * q_b + lse_b)  # Q, O, lse of a block
    b = c[:-1]
    start = np.minimum((b // W + 1) * W, blocks)  # the first block of the next wave
    heads_total = blocks // Tr
    later = at(whole, start) + 2 * kv_sum * (heads_total - start // Tr)  # every tile of the later waves
    # the heads of the blocks after b in its wave, less one that goes on into the next wave (counted there)
    heads = np.maximum(0, (start - 1) // Tr - (start // Tr == (start - 1) // Tr) - (b + 1) // Tr + 1) * (b + 1 < start)
    rest = at(last_round, b + 1) - at(last_round, start) + 2 * Kl * heads + later
    return {"O": int(q_b @ (q_b + lse_b + rest <= capacity)), "lse": int(lse_b @ (lse_b + rest <= capacity))}


def forward_smem(pb: Problem, tiling: Tiling) -> SharedMemoryBound:
    """The forward's occupancy as shared memory allows (float32 tiles): Q_i, K_j, V_j and S_ij."""
    return SharedMemoryBound(4 * ((tiling.Br + 2 * tiling.Bc) * pb.shape.d + tiling.Br * (tiling.Bc + 1)))


def backward(pb: Problem, tiling: Tiling, per_sm: int | SharedMemoryBound) -> Grid:
    """The main kernel: one thread block per (key block j, batch·head), j fastest: block bh·T_c + j, as the
    kernel's ``grid (batch·heads · T_c,)``; tile B × B with B = B_r = B_c. Block (bh, j) loads K_j, V_j (lines
    7-8), then for each query block i that sees K_j, in order from the kernel's i_start under a causal mask,
    reads Q_i, dO_i, lse_i, D_i (line 10) and adds into dQ_i with atomics (line 21: a read-modify-write in the
    L2), and writes dK_j, dV_j after the last (line 24)."""
    if tiling.Br != tiling.Bc:
        raise InputError(f"Br={tiling.Br}, Bc={tiling.Bc}: the backward kernel's tile is square; allowed: Br == Bc")
    return key_block_grid(pb, tiling, visits(pb, tiling, skips_hidden=True).query_run, per_sm)


def key_block_grid(pb: Problem, tiling: Tiling, order: Callable[[int], Sequence[int]],
                   per_sm: int | SharedMemoryBound) -> Grid:
    """A backward kernel of one thread block per (key block j of B_c keys, batch·head), j fastest: block
    bh·T_c + j loads K_j, V_j, then for each query block i of B_r rows in ``order(j)`` reads Q_i, dO_i, lse_i, D_i
    and adds into dQ_i (a read-modify-write), and writes dK_j, dV_j after the last; ``grid``'s kernel visits
    them in ascending order, flash-swapped-tc's in its own (``iosim.gpu.grids.flash_swapped_tc``)."""
    s, Br, Bc = pb.shape, tiling.Br, tiling.Bc
    Tr, Tc = -(-s.n_q // Br), -(-s.n_k // Bc)
    data, stat, acc = pb.itemsize("data"), 4, 4  # lse, D and dq_acc are float32
    rows = [min(Br, s.n_q - i * Br) for i in range(Tr)]
    shared: dict[int, list] = {}  # batch·head -> its steps over i, one object per i for all its blocks

    def inner(bh: int) -> list:
        if bh not in shared:
            shared[bh] = [tuple(TILES.access(x, bh * Tr + i, r * s.d * data, READ) for x in ("Q", "dO")) + tuple(
                TILES.access(x, bh * Tr + i, r * stat, READ) for x in ("lse", "D")) + (
                TILES.access("dQ", bh * Tr + i, r * s.d * acc, READ_WRITE),) for i, r in enumerate(rows)]
        return shared[bh]

    def own(b: int) -> tuple[Step, Step]:  # K_j, V_j read first, dK_j, dV_j written last
        bh, j = divmod(b, Tc)
        bc = min(Bc, s.n_k - j * Bc)
        return (tuple(TILES.access(x, s.kv_head(bh) * Tc + j, bc * s.d * data, READ) for x in ("K", "V")),
                tuple(TILES.access(x, b, bc * s.d * data, WRITE) for x in ("dK", "dV")))

    def steps(b: int):
        bh, j = divmod(b, Tc)
        kv, out = own(b)
        run = order(j)
        n = len(run)
        if n == 0:
            return iter(((*kv, *out),))
        seen = inner(bh)
        if n == 1 or isinstance(run, range) and run.step == 1:
            return shared_run(kv, seen, run[0], n, out)
        return iter([kv + seen[run[0]], *(seen[i] for i in run[1:-1]), seen[run[-1]] + out])

    def form(capacity: int, concurrent: int) -> DramForm | None:
        """The closed form where every block of a head visits every query block in one order and no two heads
        share K and V (``iosim.gpu.head_waves``)."""
        run = order(0)
        if (s.kv_heads != s.heads or Tr + Tc > head_waves.MOST_LISTED or run != range(Tr)
                or any(order(j) != run for j in range(1, Tc))):
            return None
        mine = [own(j) for j in range(Tc)]
        return head_waves.dram(head_waves.of_accesses(TILES, s.bh, [m[0] for m in mine], [inner(0)[i] for i in run],
                                                      [m[1] for m in mine]), capacity, concurrent)

    return Grid(s.bh * Tc, steps, TILES, per_sm, form=form)


def backward_smem(pb: Problem, tiling: Tiling) -> SharedMemoryBound:
    """The main backward kernel's occupancy as shared memory allows: K_j, V_j, Q_i, dO_i, Pᵀ, dSᵀ, lse_i, D_i,
    float32."""
    B, d = tiling.Br, pb.shape.d
    return SharedMemoryBound(4 * (4 * B * d + 2 * B * (B + 1) + 2 * B))
