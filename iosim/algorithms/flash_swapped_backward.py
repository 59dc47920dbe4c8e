"""FlashAttention-2 backward: D in its own pass, K/V blocks outer, dQ accumulated in HBM.

Dao, "FlashAttention-2" (2023), Algorithm 2, as its kernels run it. A first pass
over the query blocks computes D_i = rowsum(dO_i ∘ O_i) and the logsumexp
L_i = m_i + log ℓ_i, saves both, and zeroes dQ. The main pass keeps K_j, V_j, dK_j,
dV_j on chip while the query blocks that see them stream past; it reads Q_i, dO_i,
L_i, D_i at every inner step, recomputes P_ij = exp(S_ij − L_i), and adds
τ·dS_ij·K_j into dQ_i in HBM, a read-modify-write. Line numbers below are those of
Algorithm 4 (Dao et al. 2022, appendix B) that each step corresponds to.

On-chip buffers per head: first pass O_i, dO_i (B_r × d each) and ℓ_i, m_i, D_i, L_i
(B_r each), then a zero B_r × d tile; main pass K_j, V_j, dK_j, dV_j (B_c × d each),
Q_i, dO_i, dQ_i (B_r × d each), L_i, D_i (B_r each), S_ij (B_r × B_c, overwritten by
P_ij), dP_ij (B_r × B_c, overwritten by dS_ij), and the mask tile (B_r × B_c) when a
mask is given.

Deviations: FlashAttention-2's forward saves L itself; the forward modelled here
(``flash-swapped``) saves ℓ and m, so the first pass reads both and writes L once,
rather than every inner step reading two statistics. dQ is accumulated in the data
dtype; the kernels accumulate it in float32 with atomic adds and convert it in a
third pass, which is not modelled. Tiles the band (causal, or a sliding window) hides
entirely are skipped, and a key block no query sees gets zeros for dK_j, dV_j without
loading K_j, V_j, as the kernels do; an explicit mask is not inspected.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from iosim.algorithms.algorithm import DOUT, GRADIENTS, OUTPUT, STATISTICS, Algorithm, Needs, Tensor, exact_counts, saved
from iosim.algorithms.tile_ops import absorb_gradients, exp_diff, load_mask, logsumexp, row_dot, scores
from iosim.core.counts import Counts
from iosim.core.errors import InputError
from iosim.core.flops import Flops, matmul
from iosim.gpu.l2 import READ, READ_WRITE, WRITE, Grid, SharedMemoryBound, SharedSteps, Tiles
from iosim.core.memory import Memory
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.core.visits import visits

TENSORS = (
    *saved(OUTPUT, *STATISTICS), DOUT,
    Tensor("D", "N_q", "1", "intermediate", "stat"), Tensor("L", "N_q", "1", "intermediate", "stat"),
    *GRADIENTS,
)


def run(mem: Memory, pb: Problem, tiling: Tiling) -> None:
    """Run the FlashAttention-2 backward on Q, K, V, O, ℓ, m, dO (and mask); leaves dQ, dK, dV in HBM."""
    d = pb.shape.d
    tiles = visits(pb, tiling, skips_hidden=True)

    for _, rows in mem.loop(tiles.q.all()):  # first pass: D, L and dQ = (0), per query block
        br = rows.stop - rows.start
        O_i, dO_i = mem.load("O", rows), mem.load("dO", rows)
        l_i, m_i = mem.load("l", rows), mem.load("m", rows)
        D_i, L_i = mem.alloc("D_i", br), mem.alloc("L_i", br)
        mem.compute(exp=br)  # the log of L_i
        if mem.numeric:
            D_i.data = row_dot(dO_i.data, O_i.data)  # line 19, once per row
            L_i.data = logsumexp(l_i.data, m_i.data)
        mem.store(D_i, "D", rows)
        mem.store(L_i, "L", rows)
        mem.free(O_i, dO_i, l_i, m_i, D_i, L_i)
        zero = mem.alloc("dQ_i", br, d, fill=0.0)  # line 5
        mem.store(zero, "dQ", rows)
        mem.free(zero)

    for j, cols in mem.loop(tiles.key_blocks()):  # line 6
        bc = cols.stop - cols.start
        K_j, V_j = mem.load("K", cols), mem.load("V", cols)  # line 7
        dK_j, dV_j = mem.alloc("dK_j", bc, d, fill=0.0), mem.alloc("dV_j", bc, d, fill=0.0)  # line 8
        for _, rows in mem.loop(tiles.queries_seeing(j)):  # line 9, the query blocks that see K_j
            br = rows.stop - rows.start
            Q_i, dO_i, dQ_i = mem.load("Q", rows), mem.load("dO", rows), mem.load("dQ", rows)  # line 10
            L_i, D_i = mem.load("L", rows), mem.load("D", rows)
            mask_ij = load_mask(mem, pb, rows, cols)
            S_ij, dP_ij = mem.alloc("S_ij", br, bc), mem.alloc("dP_ij", br, bc)
            # S_ij recomputed, then dV_j, dP_ij, dQ_i, dK_j; exp for P_ij
            mem.compute(matmul=5 * matmul(br, d, bc), exp=br * bc)
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
        zero = mem.alloc("dK_j", cols.stop - cols.start, d, fill=0.0)
        mem.store(zero, "dK", cols)
        mem.store(zero, "dV", cols)
        mem.free(zero)


def working_set(pb: Problem, tiling: Tiling, M: int) -> int:
    # main pass: K_j, V_j, dK_j, dV_j + Q_i, dO_i, dQ_i + S_ij, dP_ij + (L_i, D_i) [+ mask tile];
    # first pass: O_i, dO_i + (ℓ_i, m_i, D_i, L_i)
    Br, Bc, d = tiling.Br, tiling.Bc, pb.shape.d
    main = 4 * Bc * d + 3 * Br * d + 2 * Br * Bc + 2 * Br + pb.has_mask * Br * Bc
    return max(main, 2 * Br * d + 4 * Br)


def traffic(pb: Problem, tiling: Tiling, M: int) -> Counts:
    """Exact counts: the first pass once per query row, the main pass summed over the visited tiles.

    Without a causal skip, Σ b_i = T_c·N_q. The peak is the largest of the first pass's
    buffers for a full query block and the main pass's working set over the visited tiles.
    """
    n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d
    tiles = visits(pb, tiling, skips_hidden=True)
    pairs = tiles.pairs()
    rows = sum(b_i * n for b_i, _, n in pairs)  # query rows met by key blocks
    met = sum(size * n for size, n in tiles.key_blocks().sizes().items())  # key rows some query sees (N_k but windows)
    reads = {
        "O": n_q * d, "l": n_q, "m": n_q,  # first pass
        "dO": n_q * d + rows * d,  # first pass, then per visited tile
        "K": met * d, "V": met * d,  # once each
        "Q": rows * d, "dQ": rows * d, "L": rows, "D": rows,  # per visited tile
    }
    writes = {
        "D": n_q, "L": n_q,  # first pass
        "dQ": n_q * d + rows * d,  # first pass's zeros, then per visited tile
        "dK": n_k * d, "dV": n_k * d,  # once each: line 24, or zeros for a key block no query sees
    }
    if pb.has_mask:
        reads["mask"] = sum(b_i * b_j * n for b_i, b_j, n in pairs)  # each visited tile of the mask, once
    Br = tiles.q.size(0)
    blind = [b_j * d for b_j in tiles.blind_key_blocks().sizes()]  # the zero tile of a key block no query sees
    peak = max([2 * Br * d + 4 * Br] + blind + [working_set(pb, Tiling(b_i, b_j), M) for b_i, b_j, _ in pairs])
    return exact_counts(TENSORS, pb, reads, writes, peak)


def flops(pb: Problem, tiling: Tiling, M: int) -> Flops:
    """Five B_r × B_c × d products and B_r·B_c exps per visited tile, and one log per query row."""
    pairs = visits(pb, tiling, skips_hidden=True).pairs()
    area = sum(b_i * b_j * n for b_i, b_j, n in pairs)  # N_q·N_k without a causal skip
    return Flops(matmul=10 * pb.shape.d * area, exp=area + pb.shape.n_q).scaled(pb.shape.bh)


def paper_form(pb: Problem, M: int) -> float:
    """Θ(N²d²/M), counted as the forward's form is: T_c = 4Nd/M blocks of B_c = M/4d.

    T_c·N·(4d + 2) for the inner steps, 3Nd + 4N for the first pass, and 4Nd for
    K, V, dK, dV: 16N²d²/M + 8N²d/M + 7Nd + 4N, with N² ↦ N_q·N_k and N ↦ N_q.
    """
    n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d
    return pb.shape.bh * (16 * n_q * n_k * d * d / M + 8 * n_q * n_k * d / M + 7 * n_q * d + 4 * n_q)


# --- on a GPU: the backward kernels of kernels/flash_swapped.py (iosim.gpu.l2) ------------------------------------

# The host's backward at d4169c1 (call 1) launches three kernels, in order: row_dot_kernel (D = rowsum(dO ∘ O)),
# fill_kernel (dq_acc = 0, float32) and the main kernel; a fourth, cast_kernel, converts dQ for float16 only.
# Resident blocks per H100 SM, from the sm_90 resource report of d4169c1's kernels (git show
# 8d6aafb:experiments/results/kernels_resources_sm90.md, at c325e6e): the main kernel 5 at both of call 1's
# tilings (d = 64, 32x32: 200 registers x 64 threads; d = 128, 16x16: 188), limited by registers; fill fp32 5
# (48 registers x 256 threads); row_dot 5 (the report lists its float16 build, 48 registers x 256 threads; the
# float32 build is taken to be the same).
CALL1_BLOCKS_PER_SM = {(64, 32): 5, (128, 16): 5}
GRID_STRIDE_BLOCKS_PER_SM = 5
GRID_STRIDE_THREADS, GRID_STRIDE_MAX_BLOCKS = 256, 8192  # kernels/_device.py's grid_stride_launch at d4169c1
# dQ: the float32 accumulator dq_acc; dQ_cast: dQ in the problem's dtype, which cast_kernel writes from it
GRID_TENSORS = ("Q", "K", "V", "O", "dO", "lse", "D", "dQ", "dK", "dV", "dQ_cast")
TILES = Tiles(GRID_TENSORS)


def _grid_stride(items: int, chunk_steps) -> Grid:
    """A grid-stride kernel over ``items``: min(8192, ⌈items/256⌉) blocks of 256 threads; block b takes chunks
    b, b + G, b + 2G, ... of 256 consecutive items, one step each (``chunk_steps(c, n)`` for chunk c of n items).
    Uniform (every block the same steps on chunks of its own) when the chunks are whole and G divides them."""
    G = max(1, min(GRID_STRIDE_MAX_BLOCKS, -(-items // GRID_STRIDE_THREADS)))
    chunks = -(-items // GRID_STRIDE_THREADS)

    def steps(b: int):
        for c in range(b, chunks, G):
            first = c * GRID_STRIDE_THREADS
            yield chunk_steps(c, min(GRID_STRIDE_THREADS, items - first))

    uniform = items % GRID_STRIDE_THREADS == 0 and chunks % G == 0
    return Grid(G, steps, TILES, GRID_STRIDE_BLOCKS_PER_SM, uniform=uniform)


def row_dot_grid(pb: Problem) -> Grid:
    """row_dot_kernel: one thread per query row of every batch·head (rows flattened), D_i = rowsum(dO_i ∘ O_i)."""
    s, data, stat = pb.shape, pb.itemsize("data"), 4  # D is float32 whatever the dtype
    return _grid_stride(s.bh * s.n_q, lambda c, n: (
        TILES.access("dO", c, n * s.d * data, READ), TILES.access("O", c, n * s.d * data, READ),
        TILES.access("D", c, n * stat, WRITE)))


def cast_grid(pb: Problem) -> Grid:
    """cast_kernel: one thread per element of dq_acc, read in float32 and written to dQ in the problem's dtype."""
    s, data = pb.shape, pb.itemsize("data")
    return _grid_stride(s.bh * s.n_q * s.d, lambda c, n: (TILES.access("dQ", c, n * 4, READ),
                                                          TILES.access("dQ_cast", c, n * data, WRITE)))


def fill_grid(pb: Problem) -> Grid:
    """fill_kernel: one thread per element of the float32 dq_acc (bh, N_q, d), each set to zero."""
    s = pb.shape
    return _grid_stride(s.bh * s.n_q * s.d, lambda c, n: (TILES.access("dQ", c, n * 4, WRITE),))


def grid(pb: Problem, tiling: Tiling) -> Grid:
    """The main kernel: one thread block per (key block j, batch·head), j fastest: block bh·T_c + j, as the
    kernel's ``grid (batch·heads · T_c,)``; tile B × B with B = B_r = B_c. Block (bh, j) loads K_j, V_j (lines
    7-8), then for each query block i that sees K_j, in order from the kernel's i_start under a causal mask,
    reads Q_i, dO_i, lse_i, D_i (line 10) and adds into dQ_i with atomics (line 21: a read-modify-write in the
    L2), and writes dK_j, dV_j after the last (line 24)."""
    if tiling.Br != tiling.Bc:
        raise InputError(f"Br={tiling.Br}, Bc={tiling.Bc}: the backward kernel's tile is square; allowed: Br == Bc")
    B, d = tiling.Br, pb.shape.d
    per_sm = CALL1_BLOCKS_PER_SM.get((d, B))
    if per_sm is None:  # as shared memory allows: K_j, V_j, Q_i, dO_i, Pᵀ, dSᵀ, lse_i, D_i, float32
        per_sm = SharedMemoryBound(4 * (4 * B * d + 2 * B * (B + 1) + 2 * B))
    return key_block_grid(pb, tiling, visits(pb, tiling, skips_hidden=True).query_run, per_sm)


def key_block_grid(pb: Problem, tiling: Tiling, order: Callable[[int], Sequence[int]],
                   per_sm: int | SharedMemoryBound) -> Grid:
    """A backward kernel of one thread block per (key block j of B_c keys, batch·head), j fastest: block
    bh·T_c + j loads K_j, V_j, then for each query block i of B_r rows in ``order(j)`` reads Q_i, dO_i, lse_i, D_i
    and adds into dQ_i (a read-modify-write), and writes dK_j, dV_j after the last; ``grid``'s kernel visits
    them in ascending order, a kernel variant may order them otherwise."""
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

    def steps(b: int):
        bh, j = divmod(b, Tc)
        kvh = s.kv_head(bh)
        bc = min(Bc, s.n_k - j * Bc)
        kv = tuple(TILES.access(x, kvh * Tc + j, bc * s.d * data, READ) for x in ("K", "V"))
        out = tuple(TILES.access(x, b, bc * s.d * data, WRITE) for x in ("dK", "dV"))
        run = order(j)
        n = len(run)
        if n == 0:
            return iter(((*kv, *out),))
        seen = inner(bh)
        if n == 1:
            return iter(((*kv, *seen[run[0]], *out),))
        if isinstance(run, range) and run.step == 1:
            # the first and last steps are the block's own, those between its head's, shared: the blocks of a head
            # that start together run as one cohort in the simulation (its hot path)
            i0 = run.start
            return SharedSteps((kv + seen[i0],), seen, i0 + 1, i0 + n - 1, (seen[i0 + n - 1] + out,))
        return iter([kv + seen[run[0]], *(seen[i] for i in run[1:-1]), seen[run[-1]] + out])

    return Grid(s.bh * Tc, steps, TILES, per_sm)


def launches(pb: Problem, tiling: Tiling) -> tuple[Grid, ...]:
    """The kernels of one backward, in launch order: row_dot, fill, the main kernel, and in a dtype narrower than
    float32 the cast of dQ (kernels/flash_swapped.py's ``backward``)."""
    kernels = (row_dot_grid(pb), fill_grid(pb), grid(pb, tiling))
    return kernels if pb.dtype == "float32" else kernels + (cast_grid(pb),)


ALGORITHM = Algorithm(
    name="flash-swapped backward", run=run, tensors=TENSORS, outer="Bc", working_set=working_set,
    traffic=traffic, paper_form=paper_form, paper_label="16N²d²/M + 8N²d/M + 7Nd + 4N", flops=flops,
    grid=grid, launches=launches, needs=Needs(window=True),
)
