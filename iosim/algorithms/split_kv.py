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
Flash-Decoding's and FlashInfer's GQA kernels). Multi-head latent attention's decode, with
its projections absorbed (DeepSeek-V2/V3, as FlashMLA runs it), is such a problem: every
query head shares one latent K of d = 576 (512 + a 64-wide RoPE key) per token, and V is
its first d_v = 512 columns (``Problem.latent``): K_j is loaded once and V_j read from it on
chip, so a key row costs d elements, not d + d_v.

On-chip buffers per K/V head: those of ``flash-swapped`` (Q_i, O_i, K_j, V_j, S_ij,
ℓ_i, m_i, m_i^new, ℓ̃_ij, the mask tile); the combine holds O_i, ℓ_i, m_i, one split's
O_s and lse_s and the new max, which is less, unless V's head size d_v is much larger than
Q's and K's: its query blocks are then shorter, as many rows as fit M (``combine_blocks``).

With a sliding window (``Problem.window``) each query block's splits are dealt over the
run of key blocks its band meets (``Visits.key_run``; on the packed problem the hull of
its queries' runs, ``iosim.core.visits.PackedVisits``), so K/V outside the window are never
read, as flash-attn's split kernel deals n_block_min … n_block_max. The band is skipped
whole, its causal side included. A split that gets no block (a query block whose run
is shorter than S, or that sees no key) still exists and writes an empty partial,
O_s = 0 and lse_s = −inf, which the combine reads like any other: flash-attn's
``flash_fwd_splitkv_kernel`` does the same when n_block_min ≥ n_block_max.

Deviations: without a window, no causal skipping (a decoding query sees the whole cache;
with a few speculative tokens the hidden tiles are at most the last block; skipping them
would move every causal count). With S = 1 the split writes O, ℓ, m directly and there
is no combine. Q_i is loaded by every split, as each split's thread block loads it (an
empty split too, where flash-attn's exits before loading it). Decode-only: there is no
backward pass (inference has no gradients); ``backward`` is None. Learned attention sinks (``Problem.sinks``) join
where the row's softmax is finished: with S = 1 the split starts at them (ℓ = 1, m = sink), with S > 1 the combine
does, as one more partial with no value; either reads the query block's group's G sinks once.
The partial outputs are kept in the output's dtype (``Problem.itemsize("out")``: the data's,
bfloat16 for FP8 data), where flash-attn accumulates them in float32 at every dtype. FP8
data (``Problem.fp8``) adds each split's read of its K/V head's three descales.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from iosim.algorithms.algorithm import OUTPUT, STATISTICS, Algorithm, Needs, SplitRule, Tensor, exact_counts
from iosim.algorithms.tile_ops import (
    absorb_block,
    exp_diff,
    kv_width,
    load_kv,
    load_mask,
    logsumexp,
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
from iosim.core.tiling import Tiling, ceil_div
from iosim.core.visits import Axis, Blocks, PackedVisits, Visits, visits
from iosim.variants.paging import entries

# One partial output and its logsumexp per split, S·N_q rows (split s holds rows s·N_q … s·N_q + N_q − 1).
PARTIALS = (Tensor("O_split", "S·N_q", "d_v", "intermediate", "out"),
            Tensor("lse_split", "S·N_q", "1", "intermediate", "stat"))
TENSORS = (OUTPUT, *STATISTICS, *PARTIALS)


def visited(pb: Problem, tiling: Tiling) -> Visits | PackedVisits:
    """The key blocks each query block deals to its splits: those its band meets under a sliding window, else all."""
    return visits(pb, tiling, skips_hidden=pb.band.sliding)


def split_keys(pb: Problem, tiling: Tiling) -> int:
    """The most keys one query block deals to its splits: N_k, or its band's under a sliding window."""
    return visited(pb, tiling).widest_keys()


def default_splits(pb: Problem, tiling: Tiling, sms: int) -> int:
    """Splits enough that the work units, batch·kv_heads·T_r·S, fill the GPU's ``sms`` SMs, each split at least
    one K/V block of min(B_c, d) keys of the widest run a query block deals (``split_keys``).

    A problem that already has a work unit per SM (batch·kv_heads·T_r ≥ sms, as in prefill
    or a large batch) is not split. Where the policy's K/V blocks are fewer than the splits,
    ``Algorithm.with_splits`` shortens them so that each split has one; no shorter than
    min(B_c, d), as a decode kernel's K/V block (64 to 256 keys) is about a head dimension.
    """
    units = pb.shape.bh * ceil_div(pb.shape.n_q, tiling.Br)
    most = ceil_div(split_keys(pb, tiling), min(tiling.Bc, pb.shape.d))
    return max(1, min(most, ceil_div(sms, units)))


def deal(run: range, S: int, s: int) -> range:
    """Split s's share of the key blocks ``run``, dealt in order to S splits as evenly as possible: with
    len(run) = q·S + r the first r splits take q + 1 blocks and the others q (none when the run is shorter than S)."""
    q, r = divmod(len(run), S)
    first = run.start + s * q + min(s, r)
    return range(first, first + q + (s < r))


@dataclass(frozen=True)
class Splits:
    """Every (query block i, split s) of a run, a thread block each: t = i·S + s, i outer.

    Split s of query block i holds ``deal(tiles.key_run(i), S, s)``. A loop over it
    (``Memory.loop``) sees it as it sees ``Visits.query_blocks()``: unit t covers the query
    rows of its block, and ``nested(t)`` the split's key blocks. In count-only mode one
    unit stands for every unit whose query block has its size, and its loop over key
    blocks for all of theirs, weighted by the visited tiles' pair counts: every split of
    a query block together reads each key block of its run once, whatever the dealing.
    """

    tiles: Visits | PackedVisits
    S: int

    @property
    def axis(self) -> Splits:
        return self

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.tiles.q.T * self.S))

    def unit(self, t: int) -> tuple[int, int]:
        """(query block i, split s) of unit t."""
        return divmod(t, self.S)

    def slice(self, t: int) -> slice:
        return self.tiles.q.slice(t // self.S)

    def size(self, t: int) -> int:
        return self.tiles.q.size(t // self.S)

    def classes(self) -> list[tuple[int, int]]:
        """(representative unit, number of units) for each size of query block."""
        return [(t * self.S, n * self.S) for t, n in self.tiles.q.all().classes()]

    def nested(self, t: int) -> Blocks:
        """The key blocks of unit t's split."""
        i, s = self.unit(t)
        return Blocks(self.tiles.k, (deal(self.tiles.key_run(i), self.S, s),))

    def nested_sizes(self, size: int) -> dict[int, int]:
        """Key block size → how many the splits of every query block of ``size`` rows read together."""
        return {b_j: n for b_i, b_j, n in self.tiles.pairs() if b_i == size}

    def nested_plans(self, t: int) -> list[tuple[Blocks, dict[int, int]]]:
        return [(self.nested(t), self.nested_sizes(self.size(t)))]


def run(mem: Memory, pb: Problem, tiling: Tiling) -> None:
    """Split-KV forward on Q, K, V (and mask) in ``mem``, on the packed problem; leaves O, l, m in HBM."""
    d, d_v, n = pb.shape.d, pb.shape.d_v, pb.shape.n_q
    tiles = visited(pb, tiling)
    units = Splits(tiles, tiling.splits)
    for t, rows in mem.loop(units):  # every (query block, split) is a thread block of its own
        br, s = rows.stop - rows.start, units.unit(t)[1]
        Q_i = mem.load("Q", rows)
        read_descales(mem, pb)  # FP8 data: the K/V head's descales of Q, K and V
        l_i, m_i = mem.alloc("l_i", br, fill=0.0), mem.alloc("m_i", br, fill=-np.inf)
        if pb.sinks and tiling.splits == 1:  # with splits the combine takes the sinks in, once
            start_at_sinks(mem, pb, rows, l_i, m_i)
        O_i = mem.alloc("O_i", br, d_v, fill=0.0)
        for _, cols in mem.loop(units.nested(t)):  # the swapped loop over the split's K/V blocks (none: empty)
            bc = cols.stop - cols.start
            read_block_table(mem, pb, cols)  # a paged cache: where K_j, V_j are
            K_j, V_j = load_kv(mem, pb, cols)
            mask_ij = load_mask(mem, pb, rows, cols)
            S_ij = mem.alloc("S_ij", br, bc)
            m_new, l_tilde = mem.alloc("m_new", br), mem.alloc("l~_ij", br)
            mem.compute(matmul=matmul(br, d, bc) + matmul(br, bc, d_v), exp=br * bc + br)
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
        combine(mem, pb, combine_blocks(pb, tiling, mem.M).all(), tiling.splits)


def combine_blocks(pb: Problem, tiling: Tiling, M: int) -> Axis:
    """The combine's query blocks: the splits' B_r rows, or as many as fit M with their O_i and O_s of d_v columns
    (ℓ_i, m_i, lse_s and the new max beside them), at least one."""
    return Axis(pb.shape.n_q, max(1, min(tiling.Br, M // (2 * pb.shape.d_v + 4))))


def _part(rows: slice, s: int, n: int) -> slice:
    """The rows of split s's partials for query rows ``rows``."""
    return slice(s * n + rows.start, s * n + rows.stop)


def combine(mem: Memory, pb: Problem, query_blocks: Blocks, S: int) -> None:
    """O = Σ_s e^(lse_s − m) O_s / Σ_s e^(lse_s − m), m = max_s lse_s, online over the splits.

    Writes O, ℓ = Σ_s e^(lse_s − m) and m, so that m + log ℓ is the row's logsumexp.
    """
    d_v, n = pb.shape.d_v, pb.shape.n_q
    for _, rows in mem.loop(query_blocks):
        br = rows.stop - rows.start
        l_i, m_i = mem.alloc("l_i", br, fill=0.0), mem.alloc("m_i", br, fill=-np.inf)
        if pb.sinks:  # the sinks join as one more partial with no value
            start_at_sinks(mem, pb, rows, l_i, m_i)
        O_i = mem.alloc("O_i", br, d_v, fill=0.0)
        for s, _ in mem.loop(Axis(S, 1).all()):  # every split's partial, an empty one's too
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
    # Q_i, O_i + K_j, V_j + S_ij + (ℓ_i, m_i, m_new, ℓ̃) [+ mask tile]; with splits, the combine's O_i, O_s and
    # (ℓ_i, m_i, lse_s, m_new), more only where d_v is much larger than d; with sinks, taking them in can be more,
    # with tiny blocks and a large G
    Br, Bc, d, d_v, S = tiling.Br, tiling.Bc, pb.shape.d, pb.shape.d_v, tiling.splits
    main = Br * (d + d_v) + Bc * kv_width(pb) + Br * Bc + 4 * Br + pb.has_mask * Br * Bc
    b = combine_blocks(pb, tiling, M).B if S > 1 else Br  # the rows that take the sinks in
    combining = (S > 1) * b * (2 * d_v + 4)
    return max(main, combining, sinking(pb, b, S) if pb.sinks else 0)


def sinking(pb: Problem, Br: int, S: int) -> int:
    """On chip while a query block of B_r rows takes its sinks in: ℓ_i, m_i and a GQA group's G sinks, beside the
    split's Q_i when S = 1 (with S > 1 the combine takes them in)."""
    return (S == 1) * Br * pb.shape.d + 2 * Br + pb.packed


def traffic(pb: Problem, tiling: Tiling, M: int) -> Counts:
    """Exact counts per K/V head of the packed problem (n = G·N_q query rows), T_r query blocks, S splits.

    Every split reads its query block (S·n·d of Q) and the splits of a query block read
    each key of its run once together: Σ b_j over the visited tiles, T_r·N_k without a
    window. With S > 1 each split writes and the combine reads back S·n·d_v partial
    outputs and S·n logsumexps, an empty split's too.
    """
    n, d, d_v, S = pb.shape.n_q, pb.shape.d, pb.shape.d_v, tiling.splits
    tiles = visited(pb, tiling)
    pairs = tiles.pairs()
    cols = sum(b_j * k for _, b_j, k in pairs)  # key rows read by the query blocks' splits together
    reads = {"Q": S * n * d, "K": cols * d}
    if not pb.latent:  # MLA's latent V is the first d_v columns of K_j, on chip already
        reads["V"] = cols * d_v
    writes = {"O": n * d_v, "l": n, "m": n}
    if S > 1:
        reads.update(O_split=S * n * d_v, lse_split=S * n)
        writes.update(O_split=S * n * d_v, lse_split=S * n)
    if pb.has_mask:
        reads["mask"] = sum(b_i * b_j * k for b_i, b_j, k in pairs)  # each visited tile of the mask, once
    if pb.page_size:  # each K/V load reads the entries of its block's pages
        reads["block_table"] = sum(entries(pb, b_j) * k for _, b_j, k in pairs)
    # the query blocks that take the sinks in: the splits', or with S > 1 the combine's
    sinking_blocks = combine_blocks(pb, tiling, M) if S > 1 else tiles.q
    if pb.sinks:  # the sinks of a query block's group, once per query block: in the split, or with S > 1 the combine
        reads["sinks"] = sinking_blocks.T * pb.packed
    if pb.fp8:  # every split reads its K/V head's three descales beside its query block, an empty split's too
        reads["descale"] = 3 * S * tiles.q.T
    blind = [b_i * (d + d_v) + 2 * b_i for b_i in tiles.blind_query_sizes()]  # Q_i, O_i, ℓ_i, m_i of an empty split
    combining = [b_i * (2 * d_v + 4) for b_i in sinking_blocks.all().sizes()] if S > 1 else []  # O_i, O_s, ℓ_i, …
    sinks_in = [sinking(pb, b_i, S) for b_i in sinking_blocks.all().sizes()] if pb.sinks else []  # before O_i
    peak = max(blind + combining + sinks_in + [working_set(pb, Tiling(b_i, b_j, S), M) for b_i, b_j, _ in pairs])
    return exact_counts(TENSORS, pb, reads, writes, peak)


def flops(pb: Problem, tiling: Tiling, M: int) -> Flops:
    """Two products per visited tile, B_r × d × B_c and B_r × B_c × d_v, and B_r·B_c + B_r exponentials; 2 per row
    and split to combine."""
    n, S = pb.shape.n_q, tiling.splits
    pairs = visited(pb, tiling).pairs()
    area = sum(b_i * b_j * k for b_i, b_j, k in pairs)  # n·N_k without a window
    rows = sum(b_i * k for b_i, _, k in pairs)
    combine_exp = 2 * S * n if S > 1 else 0
    return Flops(matmul=2 * (pb.shape.d + pb.shape.d_v) * area, exp=area + rows + combine_exp).scaled(pb.shape.bh)


def paper_form(pb: Problem, M: int) -> float:
    """The decoding lower bound it approaches: K and V read once per K/V head, Q read and O written once:
    N_k·(d + d_v) + N_q·(d + d_v), 2N_k·d + 2N_q·d when d_v = d; from MLA's latent cache K alone, N_k·d."""
    s = pb.shape
    return s.bh * (s.n_k * kv_width(pb) + s.n_q * (s.d + s.d_v))


ALGORITHM = Algorithm(
    name="split-kv", run=run, tensors=TENSORS, outer="Br", working_set=working_set, traffic=traffic,
    paper_form=paper_form, paper_label="2N_k·d + 2N_q·d per K/V head", flops=flops,
    needs=Needs(packs_groups=True, splits=SplitRule(default_splits, split_keys), window=True, pages=True,
                sinks=True, latent=True, fp8=True),
)
