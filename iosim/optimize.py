"""The IO optimizer: for any registered algorithm, the tiling with the fewest exact HBM accesses that fits M.

What is searched. Every algorithm's working set grows with each block size (the
``fit`` policy relies on the same), so the tilings that fit M lie under a staircase.
The search evaluates the algorithm's exact closed form (``Algorithm.traffic``, O(1)
per tiling even with a causal mask) on

- without a causal mask, the staircase of least blocks: for each B_r = ⌈N_q/T_r⌉
  (T_r = 1 … N_q: O(√N_q) distinct sizes) that fits, the largest B_c that fits, and
  that B_c shrunk to the least block with as many blocks, ⌈N_k/T_c⌉; and the other way
  round. Without a causal mask the traffic of every algorithm here depends on one block
  only through its count and never grows with the other (most depend on T_r and T_c
  alone; small-cache's O tiles are min(B_c, d) wide, so it gains from the largest B_c),
  so this holds the best tiling of all, and among tied ones one that leaves little SRAM
  idle;
- with a causal mask, where the exact block sizes matter, every tiling maximal in one
  block size (for each B_r the largest B_c that fits, and for each B_c the largest B_r)
  and the thin tilings B_r = 1 (every B_c that fits) and B_c = 1 (every B_r): a causal
  mask rewards a small block in the other dimension (it skips hidden tiles more finely,
  and reads fewer elements of an explicit mask).

``tests/test_optimize.py`` checks the result against every tiling on small problems,
for every registered algorithm, causal and masked ones included. No
algorithm is named: the search uses only ``working_set`` and ``traffic``, so an
algorithm registered later (a backward pass, say) is covered as it stands.

Cost. Without a causal mask at most 2·(√N_q + √N_k) tilings, each one closed form (tens
of microseconds) and a binary search of working sets; with one at most
2·(min(N_q, B_r,max) + min(N_k, B_c,max)) tilings, about 2·M/d for the FlashAttention
loops.

Ranking: fewest HBM elements (the paper's unit), then fewest bytes, then the
smaller working set, then the smaller blocks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from iosim.algorithm import Algorithm
from iosim.api import _count_problem, count, run_problem
from iosim.counts import Counts
from iosim.errors import BlockSizeError, InputError
from iosim.problem import Problem
from iosim.registry import ALGORITHMS, get_algorithm
from iosim.tiling import POLICIES, Tiling
from iosim.units import parse_size
from iosim.visits import ceil_div

TOP_DEFAULT = 3  # tilings per algorithm that `iosim optimize` shows


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
            f"M={M} is below the smallest working set of {algo.name} at d={pb.shape.d}, N_q={pb.shape.n_q}, "
            f"N_k={pb.shape.n_k}: {smallest} elements (B_r = B_c = 1); allowed range M >= {smallest}"
        )


def _largest(fits: Callable[[int], bool], hi: int) -> int:
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
    b = _largest(lambda b: fits(1, b), n_inner)
    for a in range(1, n_outer + 1):
        if not fits(a, b):
            b = _largest(lambda x: fits(a, x), b - 1) if b > 1 else 0
        if b == 0:
            return
        yield a, b


def block_sizes(n: int) -> list[int]:
    """The least block size giving each block count: ⌈n/T⌉ for T = 1 … n, distinct, ascending (O(√n) of them)."""
    out, T = [], 1
    while T <= n:
        b = ceil_div(n, T)
        out.append(b)
        if b == 1:
            break
        T = ceil_div(n, b - 1)  # the first block count whose least size is below b
    return out[::-1]


def candidates(algo: Algorithm, pb: Problem, M: int) -> list[Tiling]:
    """The tilings the search evaluates (see the module docstring), no block longer than its sequence."""
    check_fits(algo, pb, M)
    n_q, n_k = pb.shape.n_q, pb.shape.n_k

    def fits(Br: int, Bc: int) -> bool:
        return algo.working_set(pb, Tiling(Br, Bc), M) <= M

    if not pb.causal:  # traffic depends on T_r and T_c only: the least block of each count will do
        return _canonical_staircase(fits, n_q, n_k)
    shapes = set(_staircase(fits, n_q, n_k))  # for each B_r, the largest B_c
    shapes |= {(Br, Bc) for Bc, Br in _staircase(lambda Bc, Br: fits(Br, Bc), n_k, n_q)}  # and the other way
    shapes |= {(1, Bc) for Bc in range(1, _largest(lambda Bc: fits(1, Bc), n_k) + 1)}  # the thin tilings
    shapes |= {(Br, 1) for Br in range(1, _largest(lambda Br: fits(Br, 1), n_q) + 1)}
    return [Tiling(Br, Bc) for Br, Bc in sorted(shapes)]


def _canonical_staircase(fits: Callable[[int, int], bool], n_q: int, n_k: int) -> list[Tiling]:
    """For each least block size B_r = ⌈N_q/T_r⌉ that fits, the largest B_c that fits and the least B_c with
    as few blocks; and the other way round."""
    shapes = set()
    for n_a, n_b, fits_ab, swap in ((n_q, n_k, fits, False), (n_k, n_q, lambda a, b: fits(b, a), True)):
        for a in block_sizes(n_a):
            b = _largest(lambda x: fits_ab(a, x), n_b)
            if b == 0:
                break
            for b in (b, ceil_div(n_b, ceil_div(n_b, b))):  # the largest, and the least with as few blocks
                shapes.add((b, a) if swap else (a, b))
    return [Tiling(Br, Bc) for Br, Bc in sorted(shapes)]


def evaluate(algo: Algorithm, pb: Problem, M: int, tiling: Tiling) -> Candidate:
    """A tiling's exact traffic from the closed form."""
    counts: Counts = algo.traffic(pb, tiling, M)
    return Candidate(tiling, counts.total, counts.total_bytes, algo.working_set(pb, tiling, M),
                     constant(pb, M, counts.total))


def _rank(x: Candidate) -> tuple:
    return x.traffic, x.traffic_bytes, x.working_set, x.tiling.Br, x.tiling.Bc


@functools.lru_cache(maxsize=512)
def ranked(algo: Algorithm, pb: Problem, M: int) -> tuple[Candidate, ...]:
    """Every searched tiling of ``algo`` on ``pb`` under M, best first."""
    if not isinstance(algo, Algorithm):
        raise InputError(f"algorithm={algo!r} must be an iosim.Algorithm")
    return tuple(sorted((evaluate(algo, pb, M, t) for t in candidates(algo, pb, M)), key=_rank))


def optimal(algo: Algorithm, pb: Problem, M: int) -> Tiling:
    """Block policy ``optimal``: the searched tiling with the fewest exact HBM accesses that fits M."""
    return ranked(algo, pb, M)[0].tiling


@dataclass(frozen=True)
class Optimum:
    """The best tilings of one algorithm on one problem, the winner confirmed by the simulator."""

    algorithm: str
    problem: Problem
    M: int  # elements
    best: tuple[Candidate, ...]  # the best tiling of each of the few least traffic totals, best first
    searched: int  # tilings whose closed form was evaluated
    measured: Counts  # a count-only simulation of the winner: equal to its closed form
    fit: Candidate | None  # the 'fit' policy's tiling (None where it does not fit M)
    paper: Candidate | None  # the 'paper' policy's tiling (None where it overflows M)


def optimize(algorithms: Iterable[str | Algorithm] | None = None, *, N, d, M, N_k=None, batch=1, heads=1,
             causal=False, mask=False, dtype="float16", kv_heads=None, top: int = TOP_DEFAULT,
             on_done: Callable[[Optimum | None], None] | None = None) -> list[Optimum | BlockSizeError]:
    """The best tilings of each algorithm (every registered one by default) under block policy ``optimal``.

    Each winner is run count-only and must move exactly what its closed form says. An
    algorithm that cannot fit M at all gives its ``BlockSizeError`` in its place; when
    none fits, that error is raised. ``on_done`` sees each algorithm's result as it ends.
    With ``kv_heads`` < heads (grouped-query attention) each algorithm is searched on the
    problem as it runs it, packed by group where it serves a group from one K/V load.
    """
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise InputError(f"top={top!r} must be a whole number >= 1")
    user_pb = _count_problem(N, d, N_k, batch, heads, causal=causal, mask=mask, dropout_p=0.0, seed=0, dtype=dtype,
                             kv_heads=kv_heads)
    M = parse_size(M, dtype)
    algos = [get_algorithm(a) for a in (ALGORITHMS if algorithms is None else algorithms)]
    out: list[Optimum | BlockSizeError] = []
    for algo in algos:
        pb = run_problem(algo, user_pb)  # c is the same on either: bh·N_q is unchanged by packing
        try:
            searched = ranked(algo, pb, M)
        except BlockSizeError as err:
            out.append(err)
            if on_done:
                on_done(None)
            continue
        winner = searched[0].tiling
        measured = count(algo, N=N, d=d, M=M, N_k=N_k, batch=batch, heads=heads, causal=causal, mask=mask,
                         dtype=dtype, kv_heads=kv_heads, tiling=winner).traffic
        if measured != algo.traffic(pb, winner, M):
            raise RuntimeError(f"{algo.name} with {winner}: the simulator measured {measured}, the closed form says "
                               f"{algo.traffic(pb, winner, M)}")
        policies = {}
        for policy in ("fit", "paper"):
            try:
                policies[policy] = evaluate(algo, pb, M, POLICIES[policy](algo, pb, M))
            except BlockSizeError:
                policies[policy] = None
        result = Optimum(algo.name, user_pb, M, _distinct(searched, top), len(searched), measured, **policies)
        out.append(result)
        if on_done:
            on_done(result)
    if not any(isinstance(r, Optimum) for r in out):
        needs = {a.name: smallest_working_set(a, run_problem(a, user_pb), M) for a in algos}
        raise BlockSizeError(
            f"M={M} is below the smallest working set of every algorithm asked for ("
            + ", ".join(f"{name}: {need}" for name, need in needs.items())
            + f" elements at d={user_pb.shape.d}, N_q={user_pb.shape.n_q}, N_k={user_pb.shape.n_k}); allowed range M >= "
              f"{min(needs.values())}")
    return out


def _distinct(ranked_: tuple[Candidate, ...], top: int) -> tuple[Candidate, ...]:
    """The first tiling of each of the ``top`` least traffic totals: ties differ only in idle SRAM."""
    out: list[Candidate] = []
    for x in ranked_:
        if not out or x.traffic != out[-1].traffic:
            out.append(x)
            if len(out) == top:
                break
    return tuple(out)
