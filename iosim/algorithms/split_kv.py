"""Split-KV attention for decoding (Flash-Decoding), serving each GQA group from one K/V load.

Flash-Decoding (Dao, Haziza, Massa and Sizov, 2023) splits the keys and values into
S chunks that separate thread blocks process at once, each into a partial output and
its logsumexp, written to HBM; a second step reads them back and combines them. With
one query (decoding) FlashAttention has a single query block per head, so without
splits a batch·heads of 8 keeps 8 of an H100's 132 SMs busy; the splits fill the rest.

Each split is the swapped loop (``flash-swapped``) over its own K/V blocks. The run
is on the problem packed by GQA group (``Problem.packed_by_group``): the G =
heads/kv_heads query heads that share a K/V head are G·N_q query rows of one head, so
a K/V block loaded once serves the whole group (the query-head packing of
Flash-Decoding's and FlashInfer's GQA kernels).

On-chip buffers per K/V head: those of ``flash-swapped`` (Q_i, O_i, K_j, V_j, S_ij,
ℓ_i, m_i, m_i^new, ℓ̃_ij, the mask tile); the combine holds O_i, ℓ_i, m_i, one split's
O_s and lse_s and the new max, which is less.

Deviations: no causal skipping (a decoding query sees the whole cache; with a few
speculative tokens the hidden tiles are at most the last block), and no sliding window
(refused by name, ``Needs.window``): its splits are dealt over every key block. With S = 1 the split
writes O, ℓ, m directly and there is no combine. Q_i is loaded by every split, as each
split's thread block loads it. Decode-only: there is no backward pass (inference has
no gradients); ``backward`` is None.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from iosim.algorithm import OUTPUT, STATISTICS, Algorithm, Needs, Tensor, exact_counts
from iosim.algorithms.flash_swapped import kv_step_cache
from iosim.algorithms.tile_ops import (absorb_block, exp_diff, load_mask, logsumexp, read_block_table, safe_divide,
                                       scores)
from iosim.counts import Counts
from iosim.errors import InputError
from iosim.flops import Flops, matmul
from iosim.l2 import READ, WRITE, Grid, SharedMemoryBound, Tiles
from iosim.memory import Memory
from iosim.paging import entries
from iosim.problem import Problem
from iosim.tiling import Tiling, ceil_div
from iosim.visits import Axis, Blocks, visits

# One partial output and its logsumexp per split, S·N_q rows (split s holds rows s·N_q … s·N_q + N_q − 1).
PARTIALS = (Tensor("O_split", "S·N_q", "d", "intermediate"),
            Tensor("lse_split", "S·N_q", "1", "intermediate", "stat"))
TENSORS = (OUTPUT, *STATISTICS, *PARTIALS)


def default_splits(pb: Problem, tiling: Tiling, sms: int) -> int:
    """Splits enough that the work units, batch·kv_heads·T_r·S, fill the GPU's ``sms`` SMs, each split at least
    one K/V block of min(B_c, d) keys.

    A problem that already has a work unit per SM (batch·kv_heads·T_r ≥ sms, as in prefill
    or a large batch) is not split. Where the policy's K/V blocks are fewer than the splits,
    ``Algorithm.with_splits`` shortens them so that each split has one; no shorter than
    min(B_c, d), as a decode kernel's K/V block (64 to 256 keys) is about a head dimension.
    """
    units = pb.shape.bh * ceil_div(pb.shape.n_q, tiling.Br)
    most = ceil_div(pb.shape.n_k, min(tiling.Bc, pb.shape.d))
    return max(1, min(most, ceil_div(sms, units)))


@dataclass(frozen=True)
class Splits:
    """The key blocks of ``k`` dealt, in order, to S splits as evenly as possible (split-KV).

    With T_c = q·S + r, the first r splits take q + 1 blocks and the others q (S ≤ T_c, so
    each takes at least one). A loop over the splits (``Memory.loop(splits)``) sees it as
    it sees ``Blocks``: split s covers the key rows ``axis.slice(s)``, and in count-only
    mode one split stands for every split of its kind, kinds being the number of blocks
    and whether the split holds the ragged last key block.
    """

    k: Axis
    S: int
    nested = None  # a loop over the splits nests the loop over each split's blocks, which it builds itself

    @property
    def axis(self) -> Splits:
        return self

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.S))

    def blocks(self, s: int) -> Blocks:
        """The key blocks of split s."""
        q, r = divmod(self.k.T, self.S)
        first = s * q + min(s, r)
        return Blocks(self.k, (range(first, first + q + (s < r)),))

    def slice(self, s: int) -> slice:
        run = self.blocks(s).runs[0]
        return slice(self.k.slice(run.start).start, self.k.slice(run.stop - 1).stop)

    def classes(self) -> list[tuple[int, int]]:
        """(representative split, number of splits) for each kind of split."""
        q, r = divmod(self.k.T, self.S)
        kinds = [[0, r], [r, self.S - r]]  # q + 1 blocks, then q blocks
        if self.k.n % self.k.B:  # the last split (one of q blocks, as r < S) holds the ragged last key block
            kinds[1][1] -= 1
            kinds.append([self.S - 1, 1])
        return [(first, n) for first, n in kinds if n]


def run(mem: Memory, pb: Problem, tiling: Tiling) -> None:
    """Split-KV forward on Q, K, V (and mask) in ``mem``, on the packed problem; leaves O, l, m in HBM."""
    d, n = pb.shape.d, pb.shape.n_q
    tiles = visits(pb, tiling, skips_hidden=False)
    chunks = Splits(tiles.k, tiling.splits)
    for _, rows in mem.loop(tiles.q.all()):  # every (query block, split) is a thread block of its own
        br = rows.stop - rows.start
        for s, _ in mem.loop(chunks):
            Q_i = mem.load("Q", rows)
            O_i = mem.alloc("O_i", br, d, fill=0.0)
            l_i, m_i = mem.alloc("l_i", br, fill=0.0), mem.alloc("m_i", br, fill=-np.inf)
            for _, cols in mem.loop(chunks.blocks(s)):  # the swapped loop over the split's K/V blocks
                bc = cols.stop - cols.start
                read_block_table(mem, pb, cols)  # a paged cache: where K_j, V_j are
                K_j, V_j = mem.load("K", cols), mem.load("V", cols)
                mask_ij = load_mask(mem, pb, rows, cols)
                S_ij = mem.alloc("S_ij", br, bc)
                m_new, l_tilde = mem.alloc("m_new", br), mem.alloc("l~_ij", br)
                mem.compute(matmul=matmul(br, d, bc) + matmul(br, bc, d), exp=br * bc + br)
                if mem.numeric:
                    S_ij.data = scores(pb, Q_i, K_j, rows, cols, mask_ij)  # (bh, Br, Bc)
                    absorb_block(pb, S_ij, V_j, m_i, l_i, O_i, m_new, l_tilde, rows, cols)
                mem.free(K_j, V_j, S_ij, m_new, l_tilde)
                if mask_ij is not None:
                    mem.free(mask_ij)
            if mem.numeric:
                O_i.data = safe_divide(O_i.data, l_i.data)
            if tiling.splits == 1:  # nothing to combine
                mem.store(O_i, "O", rows)
                mem.store(l_i, "l", rows)
                mem.store(m_i, "m", rows)
            else:
                if mem.numeric:
                    l_i.data = logsumexp(l_i.data, m_i.data)  # the split's lse, in place of ℓ_i
                mem.store(O_i, "O_split", _part(rows, s, n))
                mem.store(l_i, "lse_split", _part(rows, s, n))
            mem.free(Q_i, O_i, l_i, m_i)
    if tiling.splits > 1:
        combine(mem, pb, tiles.q.all(), chunks)


def _part(rows: slice, s: int, n: int) -> slice:
    """The rows of split s's partials for query rows ``rows``."""
    return slice(s * n + rows.start, s * n + rows.stop)


def combine(mem: Memory, pb: Problem, query_blocks, chunks: Splits) -> None:
    """O = Σ_s e^(lse_s − m) O_s / Σ_s e^(lse_s − m), m = max_s lse_s, online over the splits.

    Writes O, ℓ = Σ_s e^(lse_s − m) and m, so that m + log ℓ is the row's logsumexp.
    """
    d, n = pb.shape.d, pb.shape.n_q
    for _, rows in mem.loop(query_blocks):
        br = rows.stop - rows.start
        O_i = mem.alloc("O_i", br, d, fill=0.0)
        l_i, m_i = mem.alloc("l_i", br, fill=0.0), mem.alloc("m_i", br, fill=-np.inf)
        for s, _ in mem.loop(chunks):
            O_s, lse_s = mem.load("O_split", _part(rows, s, n)), mem.load("lse_split", _part(rows, s, n))
            m_new = mem.alloc("m_new", br)
            mem.compute(exp=2 * br)  # the rescalings of the running sum and of the split
            if mem.numeric:
                m_new.data = np.maximum(m_i.data, lse_s.data)
                alpha, beta = exp_diff(m_i.data, m_new.data), exp_diff(lse_s.data, m_new.data)
                O_i.data = alpha * O_i.data + beta * O_s.data
                l_i.data = alpha * l_i.data + beta
                m_i.data = m_new.data
            mem.free(O_s, lse_s, m_new)
        if mem.numeric:
            O_i.data = safe_divide(O_i.data, l_i.data)
        mem.store(O_i, "O", rows)
        mem.store(l_i, "l", rows)
        mem.store(m_i, "m", rows)
        mem.free(O_i, l_i, m_i)


def working_set(pb: Problem, tiling: Tiling, M: int) -> int:
    # Q_i, O_i + K_j, V_j + S_ij + (ℓ_i, m_i, m_new, ℓ̃) [+ mask tile]; the combine's 2·B_r·d + 4·B_r is less
    Br, Bc, d = tiling.Br, tiling.Bc, pb.shape.d
    return 2 * Br * d + 2 * Bc * d + Br * Bc + 4 * Br + pb.has_mask * Br * Bc


def traffic(pb: Problem, tiling: Tiling, M: int) -> Counts:
    """Exact counts per K/V head of the packed problem (n = G·N_q query rows), T_r query blocks, S splits.

    Every split reads its query block (S·n·d of Q) and each query block reads every key
    once across its splits (T_r·N_k·d of K and of V). With S > 1 each split writes and
    the combine reads back S·n·d partial outputs and S·n logsumexps.
    """
    n, n_k, d, S = pb.shape.n_q, pb.shape.n_k, pb.shape.d, tiling.splits
    tiles = visits(pb, tiling, skips_hidden=False)
    reads = {"Q": S * n * d, "K": tiles.q.T * n_k * d, "V": tiles.q.T * n_k * d}
    writes = {"O": n * d, "l": n, "m": n}
    if S > 1:
        reads.update(O_split=S * n * d, lse_split=S * n)
        writes.update(O_split=S * n * d, lse_split=S * n)
    if pb.has_mask:
        reads["mask"] = n * n_k
    if pb.page_size:  # each query block reads the entries of every K/V block's pages
        reads["block_table"] = tiles.q.T * sum(entries(pb, b_j) * k for b_j, k in tiles.k.all().sizes().items())
    peak = max(working_set(pb, Tiling(b_i, b_j), M) for b_i, b_j, _ in tiles.pairs())
    return exact_counts(TENSORS, pb, reads, writes, peak)


def flops(pb: Problem, tiling: Tiling, M: int) -> Flops:
    """Two B_r × B_c × d products and B_r·B_c + B_r exponentials per tile; 2 per row and split to combine."""
    n, n_k, S = pb.shape.n_q, pb.shape.n_k, tiling.splits
    tiles = visits(pb, tiling, skips_hidden=False)
    combine_exp = 2 * S * n if S > 1 else 0
    return Flops(matmul=4 * pb.shape.d * n * n_k, exp=n * n_k + n * tiles.k.T + combine_exp).scaled(pb.shape.bh)


def paper_form(pb: Problem, M: int) -> float:
    """The decoding lower bound it approaches: K and V read once per K/V head, Q read and O written once."""
    return pb.shape.bh * (2 * pb.shape.n_k * pb.shape.d + 2 * pb.shape.n_q * pb.shape.d)


# --- on a GPU: Flash-Decoding's two kernels as flash-attn launches them (iosim.l2) ---------------------------

# The kernels write lse = m + log ℓ instead of ℓ and m, as flash_fwd_splitkv_kernel and its combine do.
GRID_TENSORS = ("Q", "K", "V", "O_split", "lse_split", "O", "lse")
TILES = Tiles(GRID_TENSORS)


def _per_sm(pb: Problem, tiling: Tiling) -> SharedMemoryBound:
    """Blocks per SM as the split's tiles in shared memory allow (iosim.kernels has no split-KV kernel)."""
    return SharedMemoryBound(working_set(pb, tiling, 0) * pb.itemsize("data"))


def grid(pb: Problem, tiling: Tiling) -> Grid:
    """The split kernel on the packed problem: one thread block per (query block i, split s, K/V head), i fastest,
    then s: block (kvh·S + s)·T_r + i, as flash-attn's ``grid(num_m_block, num_splits, b·h)``. Block (i, s) loads
    Q_i, then K_j, V_j at each of its split's blocks, and writes its partial O_split, lse_split after the last (O
    and lse themselves with one split)."""
    if pb.has_mask:
        raise InputError("has_mask=True: the split-KV grid takes no explicit mask; allowed: has_mask=False")
    s, Br, S = pb.shape, tiling.Br, tiling.splits
    Tr = ceil_div(s.n_q, Br)
    data, stat = pb.itemsize("data"), pb.itemsize("stat")
    chunks = Splits(Axis(s.n_k, tiling.Bc), S)
    kv_steps = kv_step_cache(TILES, pb, tiling)
    o, lse = ("O_split", "lse_split") if S > 1 else ("O", "lse")

    def steps(b: int):
        kvh_split, i = divmod(b, Tr)
        kvh, split = divmod(kvh_split, S)
        rows = min(Br, s.n_q - i * Br)
        run = chunks.blocks(split).runs[0]
        kv = kv_steps(kvh)[run.start:run.stop]
        q = (TILES.access("Q", kvh * Tr + i, rows * s.d * data, READ),)
        out = (TILES.access(o, b, rows * s.d * data, WRITE), TILES.access(lse, b, rows * stat, WRITE))
        yield q + kv[0] + (out if len(kv) == 1 else ())
        yield from kv[1:-1]
        if len(kv) > 1:
            yield kv[-1] + out

    # uniform with one query block and one split: the splits of a head share its Q_i, as query blocks share K_j
    return Grid(s.bh * S * Tr, steps, TILES, _per_sm(pb, tiling), uniform=Tr == 1 and S == 1)


def combine_grid(pb: Problem, tiling: Tiling) -> Grid:
    """The combine kernel: one thread block per (query block i, K/V head), i fastest; block i reads the S partials
    O_split, lse_split of its rows, one split a step, and writes O and lse after the last."""
    s, Br, S = pb.shape, tiling.Br, tiling.splits
    Tr = ceil_div(s.n_q, Br)
    data, stat = pb.itemsize("data"), pb.itemsize("stat")

    def steps(b: int):
        kvh, i = divmod(b, Tr)
        rows = min(Br, s.n_q - i * Br)
        parts = [(TILES.access("O_split", (kvh * S + split) * Tr + i, rows * s.d * data, READ),
                  TILES.access("lse_split", (kvh * S + split) * Tr + i, rows * stat, READ)) for split in range(S)]
        parts[-1] += (TILES.access("O", b, rows * s.d * data, WRITE), TILES.access("lse", b, rows * stat, WRITE))
        yield from parts

    return Grid(s.bh * Tr, steps, TILES, _per_sm(pb, tiling), uniform=s.n_q % Br == 0)


def launches(pb: Problem, tiling: Tiling) -> tuple[Grid, ...]:
    """The split kernel, then the combine where there is more than one split."""
    return (grid(pb, tiling), combine_grid(pb, tiling)) if tiling.splits > 1 else (grid(pb, tiling),)


ALGORITHM = Algorithm(
    name="split-kv", run=run, tensors=TENSORS, outer="Br", working_set=working_set, traffic=traffic,
    paper_form=paper_form, paper_label="2N_k·d + 2N_q·d per K/V head", flops=flops,
    needs=Needs(packs_groups=True, splits=default_splits, pages=True), grid=grid, launches=launches,
)
