"""The IO optimizer's search: for any algorithm, the tilings with the fewest exact HBM accesses that fit M.

It evaluates closed forms only (``Algorithm.traffic``) and imports nothing that runs
an algorithm, so the ``optimal`` block policy (``iosim.tilings.policies``) can use it;
``iosim.reports.optimize`` reports its result beside a simulation. What is searched, and why
it holds the best tiling: docs/optimizer.md.

An algorithm whose traffic follows a block mask drawn on its own tiles
(``Algorithm.follows_block_mask``) gets a search of its own: a new block count redraws the
mask, so traffic is neither monotone in a block nor fixed by the block counts. Without a band
(no causal mask, no window), the mask is the same for every tiling of one pair of block counts
(T_r, T_c), and the traffic a sum over its visited tiles of their rows and columns, so within the
pair it is affine in B_r at fixed B_c and in B_c at fixed B_r (``_mask_corners`` says where its
least lies); every such corner that fits is evaluated. With a band the hidden tiles move with the
block sizes themselves, and every tiling that fits is evaluated, up to ``MAX_EXHAUSTIVE``; more
are refused.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from iosim.algorithms.algorithm import Algorithm
from iosim.core.counts import Counts
from iosim.core.errors import BlockSizeError, InputError, SearchTooLargeError
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling, ceil_div
from iosim.variants import paging

# The most tilings evaluated one by one when traffic follows a block mask drawn per tiling
# (Algorithm.follows_block_mask): about 4 s of closed forms (40 to 50 µs each, measured with time.process_time
# on the 2-core x86_64 container), below the optimizer's 5 s target (docs/optimizer.md).
MAX_EXHAUSTIVE = 100_000
# The most mask cells (T_r·T_c summed over the tilings evaluated) the block-mask search without a band evaluates: a
# closed form under a block mask takes time in proportion to its tiles, about 3·10⁷ a second (time.process_time on
# the 2-core x86_64 container, 2026-11-27: N = 1,000 to 4,096, M = 100k), so at most about 20 s
MAX_MASK_CELLS = 6 * 10**8
MASK_CELLS_PER_S = 3 * 10**7


@dataclass(frozen=True)
class Candidate:
    """One tiling the search evaluated, with its exact traffic over all batch·heads."""

    tiling: Tiling
    traffic: int  # HBM elements
    traffic_bytes: int
    working_set: int  # on-chip elements per head with full blocks (<= M)
    c: float  # traffic·M / (bh·N_q·N_k·d²): the constant in front of N²d²/M


def constant(pb: Problem, M: int, traffic: int) -> float:
    """c in traffic = c·N_q·N_k·d²/M per head (Alg. 1 reaches 12, the swapped loop 8: docs/derivations.md)."""
    s = pb.shape
    return traffic * M / (s.bh * s.n_q * s.n_k * s.d * s.d)


def smallest_working_set(algo: Algorithm, pb: Problem, M: int) -> int:
    """The working set of 1 × 1 blocks: no tiling of ``algo`` fits a smaller M."""
    return algo.working_set(pb, Tiling(1, 1), M)


def check_fits(algo: Algorithm, pb: Problem, M: int) -> None:
    """Raise ``BlockSizeError`` when not even 1 × 1 blocks of ``algo`` fit M."""
    smallest = smallest_working_set(algo, pb, M)
    if smallest > M:
        raise BlockSizeError(
            f"M={M} is below the smallest working set of {algo.name} at d={pb.shape.d}"
            f"{f', d_v={pb.shape.d_v}' if pb.shape.d_v != pb.shape.d else ''}, N_q={pb.shape.n_q}, "
            f"N_k={pb.shape.n_k}: {smallest} elements (B_r = B_c = 1); allowed range M >= {smallest}"
        )


MAX_BLOCK_SIZES = 200_000  # block sizes one search may try per side: about 20 s of closed forms on one core


def check_search_size(sizes: int, side: str, name: str, pb: Problem, M: int) -> None:
    """Refuse, by name, a search that would try more than ``MAX_BLOCK_SIZES`` block sizes on one side."""
    if sizes > MAX_BLOCK_SIZES:
        s = pb.shape
        raise SearchTooLargeError(
            f"the optimal tiling search of {name} at N_q={s.n_q:,}, N_k={s.n_k:,}, d={s.d}, M={M:,} would try "
            f"more than {MAX_BLOCK_SIZES:,} sizes of {side}; allowed: at most {MAX_BLOCK_SIZES:,} (a smaller M, or "
            f"the fit policy, answers at once)")


def largest(fits: Callable[[int], bool], hi: int) -> int:
    """The largest b in [1, hi] with fits(b), for fits true at 1 and monotone; 0 if fits(1) is false."""
    if not fits(1):
        return 0
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _staircase(fits: Callable[[int, int], bool], n_outer: int, n_inner: int) -> Iterable[tuple[int, int]]:
    """(a, largest b that fits with a) for a = 1, 2, … while some b fits; b never grows with a."""
    b = largest(lambda b: fits(1, b), n_inner)
    for a in range(1, n_outer + 1):
        if not fits(a, b):
            b = largest(lambda x: fits(a, x), b - 1) if b > 1 else 0
        if b == 0:
            return
        yield a, b


def block_sizes(n: int) -> Iterator[int]:
    """The least block size giving each block count, ascending: ⌈n/T⌉ for T = n, n − 1, … 1, each once.

    Lazy, so a search that stops at the first size that does not fit costs no more than the sizes it
    tried, at any n (there are O(√n) sizes in all).
    """
    b = 1
    while True:
        yield b
        count = (n - 1) // b  # the most blocks that are each longer than b
        if count == 0:
            return
        b = ceil_div(n, count)


def candidates(algo: Algorithm, pb: Problem, M: int) -> list[Tiling]:
    """The tilings the search evaluates (see the module docstring), no block longer than its sequence.

    A paged K/V cache takes only K/V blocks that hold whole pages or lie in one (``iosim.variants.paging.aligned``):
    each candidate's B_c is rounded down to one, which only shrinks its working set. Among such blocks the traffic
    never grows with B_c (K and V are read by rows, and a block reads the table entries of its pages), so the
    largest aligned B_c under each candidate's is the one to try.
    """
    shapes = _shapes(algo, pb, M)
    if pb.page_size is None:
        return shapes
    return sorted({paging.aligned(pb, t, fixed=False) for t in shapes}, key=lambda t: (t.Br, t.Bc))


def _shapes(algo: Algorithm, pb: Problem, M: int) -> list[Tiling]:
    check_fits(algo, pb, M)
    n_q, n_k = pb.shape.n_q, pb.shape.n_k

    def fits(Br: int, Bc: int) -> bool:
        return algo.working_set(pb, Tiling(Br, Bc), M) <= M

    if algo.follows_block_mask(pb):  # traffic is neither monotone in a block nor set by the block counts
        return _mask_corners(algo, pb, M, fits) if pb.band.full else _every_tiling(algo, pb, M, fits)
    if pb.band.full:  # traffic depends on T_r and T_c only: the least block of each count will do
        return _canonical_staircase(fits, algo.name, pb, M)
    thin_q = largest(lambda Br: fits(Br, 1), n_q)
    thin_k = largest(lambda Bc: fits(1, Bc), n_k)
    check_search_size(thin_q, "B_r", algo.name, pb, M)
    check_search_size(thin_k, "B_c", algo.name, pb, M)
    shapes = set(_staircase(fits, n_q, n_k))  # for each B_r, the largest B_c
    shapes |= {(Br, Bc) for Bc, Br in _staircase(lambda Bc, Br: fits(Br, Bc), n_k, n_q)}  # and the other way
    shapes |= {(1, Bc) for Bc in range(1, thin_k + 1)}  # the thin tilings
    shapes |= {(Br, 1) for Br in range(1, thin_q + 1)}
    return [Tiling(Br, Bc) for Br, Bc in sorted(shapes)]


def _every_tiling(algo: Algorithm, pb: Problem, M: int, fits: Callable[[int, int], bool]) -> list[Tiling]:
    """Every tiling whose working set fits M, refused by name when there are more than MAX_EXHAUSTIVE."""
    out: list[Tiling] = []
    for Br, most in _staircase(fits, pb.shape.n_q, pb.shape.n_k):  # for each B_r, every B_c up to the largest
        if len(out) + most > MAX_EXHAUSTIVE:
            raise SearchTooLargeError(
                f"block_policy='optimal' for {algo.name} with a block mask at N_q={pb.shape.n_q}, N_k={pb.shape.n_k}, "
                f"d={pb.shape.d}, M={M}: the mask is drawn on each tiling's own tiles, so the search evaluates every "
                f"tiling that fits, and more than MAX_EXHAUSTIVE={MAX_EXHAUSTIVE} do; allowed: at most "
                f"{MAX_EXHAUSTIVE} tilings that fit (a smaller M or shorter sequences), or block policy 'fit', "
                f"or an explicit tiling")
        out += [Tiling(Br, Bc) for Bc in range(1, most + 1)]
    return out


def _count_classes(n: int) -> list[tuple[int, int]]:
    """The block sizes of each block count of a sequence of n, as ranges [least, most], least block first."""
    least = list(block_sizes(n))
    return [(lo, hi - 1) for lo, hi in zip(least, least[1:])] + [(least[-1], n)]


def _mask_corners(algo: Algorithm, pb: Problem, M: int, fits: Callable[[int, int], bool]) -> list[Tiling]:
    """The tilings at which the traffic under a block mask drawn on (T_r, T_c) tiles can be least, without a band.

    Within one pair of block counts, B_r in [r_lo, r_hi] and B_c in [c_lo, c_hi], the mask is fixed and the traffic
    affine in each block size at the other's fixed value. At fixed B_r its least is at B_c = c_lo or at the largest
    B_c that fits, h(B_r) = min(c_hi, b(B_r)) with b(B_r) the largest B_c that fits beside B_r, non-increasing. So
    it lies on f(·, c_lo), affine over the B_r for which c_lo fits (least at either end), or on f(B_r, h(B_r)),
    affine over each run of B_r with one h (least at either end of a run). Those ends are all this returns: at most
    two per pair of counts and two per run, O(N_q^½·N_k^½ + N_k) tilings, not the O(N_q·N_k) that fit. A search
    whose tilings' masks hold more than ``MAX_MASK_CELLS`` tiles in all is refused, with its estimate.
    """
    widest = dict(_staircase(fits, pb.shape.n_q, pb.shape.n_k))  # B_r -> the largest B_c that fits beside it
    shapes: set[tuple[int, int]] = set()
    for c_lo, c_hi in _count_classes(pb.shape.n_k):
        for r_lo, r_hi in _count_classes(pb.shape.n_q):
            if widest.get(r_lo, 0) < c_lo:
                break  # b never grows with B_r: no larger B_r fits beside c_lo either
            r_top = largest(lambda x: widest.get(r_lo - 1 + x, 0) >= c_lo, r_hi - r_lo + 1) + r_lo - 1
            shapes |= {(r_lo, c_lo), (r_top, c_lo)}
            start = r_lo
            while start <= r_top:  # the runs of one h(B_r) = min(c_hi, b(B_r)) over [r_lo, r_top]
                h = min(c_hi, widest[start])
                end = largest(lambda x: min(c_hi, widest[start - 1 + x]) == h, r_top - start + 1) + start - 1
                shapes |= {(start, h), (end, h)}
                start = end + 1
    n_q, n_k = pb.shape.n_q, pb.shape.n_k
    cells = sum(ceil_div(n_q, Br) * ceil_div(n_k, Bc) for Br, Bc in shapes)
    if cells > MAX_MASK_CELLS:
        raise SearchTooLargeError(
            f"block_policy='optimal' for {algo.name} with a block mask at N_q={n_q:,}, N_k={n_k:,}, d={pb.shape.d}, "
            f"M={M:,}: its {len(shapes):,} candidate tilings hold {cells:,} mask tiles, about "
            f"{cells / MASK_CELLS_PER_S:,.0f} s of closed forms; allowed: at most MAX_MASK_CELLS={MAX_MASK_CELLS:,} "
            f"(shorter sequences or a smaller M), or block policy 'fit', or an explicit tiling")
    return [Tiling(Br, Bc) for Br, Bc in sorted(shapes)]


def _canonical_staircase(fits: Callable[[int, int], bool], name: str, pb: Problem, M: int) -> list[Tiling]:
    """For each least block size B_r = ⌈N_q/T_r⌉ that fits, the largest B_c that fits and the least B_c with
    as few blocks; and the other way round."""
    shapes = set()
    n_q, n_k = pb.shape.n_q, pb.shape.n_k
    for n_a, n_b, fits_ab, side in ((n_q, n_k, fits, "B_r"), (n_k, n_q, lambda a, b: fits(b, a), "B_c")):
        # every size up to √n_a is the least of its block count, so the search tries at least this many:
        check_search_size(min(largest(lambda x: fits_ab(x, 1), n_a), math.isqrt(n_a)), side, name, pb, M)
        b = n_b
        for tried, a in enumerate(block_sizes(n_a), 1):  # the largest b that fits never grows with a
            check_search_size(tried, side, name, pb, M)
            if not fits_ab(a, b):
                b = largest(lambda x: fits_ab(a, x), b - 1) if b > 1 else 0
            if b == 0:
                break
            for b_kept in (b, ceil_div(n_b, ceil_div(n_b, b))):  # the largest, and the least with as few blocks
                shapes.add((b_kept, a) if side == "B_c" else (a, b_kept))
    return [Tiling(Br, Bc) for Br, Bc in sorted(shapes)]


def evaluate(algo: Algorithm, pb: Problem, M: int, tiling: Tiling) -> Candidate:
    """A tiling's exact traffic from the closed form."""
    counts: Counts = algo.traffic(pb, tiling, M)
    return Candidate(tiling, counts.total, counts.total_bytes, algo.working_set(pb, tiling, M),
                     constant(pb, M, counts.total))


def rank_key(x: Candidate) -> tuple:
    """The search's order: fewest HBM elements, then bytes, then the smaller working set, then smaller blocks."""
    return x.traffic, x.traffic_bytes, x.working_set, x.tiling.Br, x.tiling.Bc


@functools.lru_cache(maxsize=512)
def ranked(algo: Algorithm, pb: Problem, M: int) -> tuple[Candidate, ...]:
    """Every searched tiling of ``algo`` on ``pb`` under M, best first."""
    if not isinstance(algo, Algorithm):
        raise InputError(f"algorithm={algo!r} must be an iosim.Algorithm")
    return tuple(sorted((evaluate(algo, pb, M, t) for t in candidates(algo, pb, M)), key=rank_key))


def optimal(algo: Algorithm, pb: Problem, M: int) -> Tiling:
    """Block policy ``optimal``: the searched tiling with the fewest exact HBM accesses that fits M."""
    return ranked(algo, pb, M)[0].tiling
