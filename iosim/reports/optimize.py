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
smaller working set, then the smaller blocks. With ``objective="dram"`` and a GPU preset,
the ``DRAM_CANDIDATES`` tilings of least HBM traffic are run against the preset's L2
(``iosim.gpu.dram.pass_counts``: the kernel's grid, its blocks at once, LRU) and ranked by
the DRAM bytes they move (reads, writes and the dirty bytes written back after), then as
above: the L2 model has no closed form over tilings, so this ranks a shortlist.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from iosim.algorithms.algorithm import Algorithm
from iosim.api import count, count_problem
from iosim.core.counts import Counts
from iosim.core.errors import BlockSizeError, InputError
from iosim.core.problem import Problem
from iosim.core.units import parse_size
from iosim.gpu.dram import pass_counts
from iosim.gpu.hardware import Hardware, hardware
from iosim.gpu.kernel import Launch, check_launchable
from iosim.gpu.kernels import KERNELS, kernel_for, named_for
from iosim.gpu.l2 import DramCounts
from iosim.registry import ALGORITHMS, get_algorithm
from iosim.tilings.policies import POLICIES
from iosim.tilings.search import Candidate, evaluate, rank_key, ranked, smallest_working_set
from iosim.variants.paging import aligned

TOP_DEFAULT = 3  # tilings per algorithm that `iosim optimize` shows
OBJECTIVES = ("hbm", "dram")  # what the search minimizes: the two-level count, or the DRAM bytes behind an L2
# Tilings of least HBM traffic that objective "dram" runs against the L2 model: a forward pass's closed form
# takes milliseconds, a simulated one (causal, GQA) 1 to 2 s at batch·heads 256, N 4096 (2-core container)
DRAM_CANDIDATES = 16


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
    dram: tuple[DramCounts, ...] | None = None  # objective "dram": the DRAM bytes of each of ``best``


def optimize(algorithms: Iterable[str | Algorithm] | None = None, *, N, d, M, N_k=None, batch=1, heads=1,
             causal=False, mask=False, dtype="float16", kv_heads=None, top: int = TOP_DEFAULT,
             objective: str = "hbm", gpu: str | None = None, window=None, page_size=None,
             on_done: Callable[[Optimum | None], None] | None = None,
             hw: Hardware | None = None, kernel: str | None = None,
             block_sparsity=None, d_v=None) -> list[Optimum | InputError]:
    """The best tilings of each algorithm (every registered one by default) under block policy ``optimal``.

    Each winner is run count-only and must move exactly what its closed form says. An
    algorithm that cannot fit M at all gives its ``BlockSizeError`` in its place, one
    whose search would be too large its ``SearchTooLargeError``; when none has a result,
    that error is raised. ``on_done`` sees each algorithm's result as it ends.
    With ``kv_heads`` < heads (grouped-query attention) each algorithm is searched on the
    problem as it runs it, packed by group where it serves a group from one K/V load.
    ``objective="dram"`` ranks by the DRAM bytes behind ``gpu``'s L2 instead (forward passes
    of the algorithms that have a GPU kernel, ``kernel`` for the algorithm it implements; the others get an
    ``InputError`` in their place), on ``hw``: ``gpu`` resolved with the user's overrides of the L2 model (capacity,
    blocks per SM, schedule), the preset's own when None.
    ``window=(left, right)`` is a sliding window and ``page_size`` a paged K/V cache (iosim.variants.paging: the search
    then takes K/V blocks of whole pages or within one); an algorithm that takes neither gives its
    ``InputError`` in its place. ``block_sparsity`` is the block-sparse algorithms' block mask
    (``iosim.BlockSparsity``), drawn on each tiling's own tiles (docs/optimizer.md says how the search stays exact);
    the others refuse it. ``d_v`` is V's and O's head size (None: d).
    """
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise InputError(f"top={top!r} must be a whole number >= 1")
    if objective not in OBJECTIVES:
        raise InputError(f"objective={objective!r}; allowed: {list(OBJECTIVES)}")
    if objective == "dram" and gpu is None:
        raise InputError("objective='dram' needs a GPU preset, such as gpu='h100': its L2 sets the DRAM bytes")
    if objective == "dram" and hw is None:
        hw = hardware(gpu)
    user_pb = count_problem(N, d, N_k, batch, heads, causal=causal, mask=mask, dtype=dtype, kv_heads=kv_heads,
                            window=window, page_size=page_size, block_sparsity=block_sparsity, d_v=d_v)
    M = parse_size(M, dtype)
    # by default every algorithm whose tiling is searched: flex runs on its block mask's
    algos = [get_algorithm(a) for a in ([n for n, a in ALGORITHMS.items() if not a.accepts("block_mask")]
                                         if algorithms is None else algorithms)]
    out: list[Optimum | InputError] = []
    for algo in algos:
        pb = algo.run_problem(user_pb)  # c is the same on either: bh·N_q is unchanged by packing
        try:
            algo.refuse_options(pb, "bwd" if algo.is_backward else "fwd", ALGORITHMS.values())
            searched, dram = ranked(algo, pb, M), None
            if objective == "dram":
                searched, dram = by_dram(algo, pb, searched, hw, kernel)
        except InputError as err:  # no fit, a search too large, no window, or no kernel grid
            out.append(err)
            if on_done:
                on_done(None)
            continue
        winner = searched[0].tiling
        measured = count(algo, N=N, d=d, d_v=d_v, M=M, N_k=N_k, batch=batch, heads=heads, causal=causal, mask=mask,
                         dtype=dtype, kv_heads=kv_heads, tiling=winner, window=window, page_size=page_size,
                         block_sparsity=block_sparsity).traffic
        if measured != algo.traffic(pb, winner, M):
            raise RuntimeError(f"{algo.name} with {winner}: the simulator measured {measured}, the closed form says "
                               f"{algo.traffic(pb, winner, M)}")
        policies = {}
        for policy in ("fit", "paper"):
            try:
                policies[policy] = evaluate(algo, pb, M, aligned(pb, POLICIES[policy].choose(algo, pb, M), fixed=False))
            except BlockSizeError:
                policies[policy] = None
        best = _distinct(searched, top, None if dram is None else [x.moved for x in dram])
        shown = None if dram is None else tuple(dram[searched.index(x)] for x in best)
        result = Optimum(algo.name, user_pb, M, best, len(searched), measured, **policies, dram=shown)
        out.append(result)
        if on_done:
            on_done(result)
    if not any(isinstance(r, Optimum) for r in out):
        other = [r for r in out if not isinstance(r, BlockSizeError)]  # a search too large, no kernel grid
        if other:
            raise other[0]
        needs = {a.name: smallest_working_set(a, a.run_problem(user_pb), M) for a in algos}
        raise BlockSizeError(
            f"M={M} is below the smallest working set of every algorithm asked for ("
            + ", ".join(f"{name}: {need}" for name, need in needs.items())
            + f" elements at d={user_pb.shape.d}, N_q={user_pb.shape.n_q}, N_k={user_pb.shape.n_k}); "
              f"allowed range M >= {min(needs.values())}")
    return out


def by_dram(algo: Algorithm, pb: Problem, searched: tuple[Candidate, ...], hw: Hardware, kernel: str | None = None
            ) -> tuple[tuple[Candidate, ...], list[DramCounts]]:
    """The ``DRAM_CANDIDATES`` tilings of least HBM traffic, ranked by the DRAM bytes their kernel (``kernel`` where it
    implements the algorithm, else the algorithm's own) moves behind ``hw``'s L2, then as the HBM search ranks them;
    beside each, its DRAM counts."""
    with_kernel = sorted({k.algorithm for k in KERNELS.values()})
    if algo.is_backward or algo.name not in with_kernel:
        raise InputError(f"{algo.name}: objective 'dram' ranks the forward passes of the algorithms with a GPU "
                         f"kernel: {with_kernel}")
    found = kernel_for(algo.name, named_for(algo.name, kernel))
    if found.tile is not None:
        raise InputError(f"kernel={found.name!r} launches its own tile, so objective 'dram' has no tiling to choose "
                         f"for it; allowed: {sorted(k.name for k in KERNELS.values() if k.tile is None)}")
    check_launchable(pb, found.takes)  # before the shortlist: a mask, a window or documents no kernel takes
    scored = sorted(((pass_counts(found, Launch(pb, x.tiling, sms=hw.sms), hw), x)
                     for x in searched[:DRAM_CANDIDATES]),
                    key=lambda s: (s[0].moved, rank_key(s[1])))
    return tuple(x for _, x in scored), [dram for dram, _ in scored]


def _distinct(ranked_: tuple[Candidate, ...], top: int, score: list[int] | None = None) -> tuple[Candidate, ...]:
    """The first tiling of each of the ``top`` least scores (the traffic unless ``score`` gives one per tiling):
    ties differ only in idle SRAM."""
    score = [x.traffic for x in ranked_] if score is None else score
    out: list[Candidate] = []
    last = None
    for x, value in zip(ranked_, score):
        if not out or value != last:
            out.append(x)
            last = value
            if len(out) == top:
                break
    return tuple(out)
