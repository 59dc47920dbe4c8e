"""Tilings: the block sizes of a run, and the policies that choose them.

A ``Tiling`` says how many query rows (B_r) and key rows (B_c) one tile holds; it
can grow further dimensions (a d-tile, a split count) without changing its callers.
Tilings never exceed the sequence they split (B_r ≤ N_q, B_c ≤ N_k); this changes no
count, only how much SRAM sits idle.

A block policy is a function (algorithm, problem, M) → Tiling, registered in
``POLICIES``. ``optimal`` searches free shapes (``iosim.optimize``); ``fit`` and ``paper`` keep the paper's shape: the block of the outer
loop is B and the other is min(B, d) (Alg. 1 line 1 has B_c = ⌈M/4d⌉,
B_r = min(B_c, d); for a loop with Q blocks outer the roles swap).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from iosim.errors import BlockSizeError, InputError
from iosim.inputs import check_positive_int
from iosim.problem import Problem

if TYPE_CHECKING:
    from iosim.algorithm import Algorithm


@dataclass(frozen=True)
class Tiling:
    """Block sizes of a run: tiles of B_r query rows by B_c key rows.

    ``splits``: how many chunks the K/V blocks are dealt into, each processed on its own
    and combined at the end (Flash-Decoding, the ``split-kv`` algorithm); 1 for every
    algorithm that does not split K/V.
    """

    Br: int
    Bc: int
    splits: int = 1

    def __post_init__(self):
        check_positive_int("Br", self.Br)
        check_positive_int("Bc", self.Bc)
        check_positive_int("splits", self.splits)

    def capped(self, pb: Problem) -> Tiling:
        """The same tiling with no block longer than the sequence it splits."""
        return Tiling(min(self.Br, pb.shape.n_q), min(self.Bc, pb.shape.n_k), self.splits)


def shape_rule(algo: Algorithm, pb: Problem, B: int) -> Tiling:
    """The paper's shape from the outer block size B: the outer block is B, the other min(B, d)."""
    outer, inner = B, min(B, pb.shape.d)
    tiling = Tiling(outer, inner) if algo.outer == "Br" else Tiling(inner, outer)
    return tiling.capped(pb)


def paper(algo: Algorithm, pb: Problem, M: int) -> Tiling:
    """B = ⌈M/4d⌉ (Alg. 1 line 1).

    The paper budgets 4·B·d for Q, K, V, O and forgets the S tile and the statistics,
    so for larger d the working set overflows M: a ``BlockSizeError``, never an overflow.
    """
    B = math.ceil(M / (4 * pb.shape.d))
    tiling = shape_rule(algo, pb, B)
    need = algo.working_set(pb, tiling, M)
    if need > M:
        raise BlockSizeError(
            f"block policy 'paper' gives B_r={tiling.Br}, B_c={tiling.Bc} (B = ⌈M/4d⌉ = {B}) for {algo.name} at "
            f"d={pb.shape.d}, whose working set of {need} elements exceeds M={M}: the paper's rule leaves no room "
            f"for the S tile and the statistics; use block policy 'fit'"
        )
    return tiling


def fit(algo: Algorithm, pb: Problem, M: int) -> Tiling:
    """The largest outer block B, in the paper's shape, whose whole working set fits M."""
    smallest = algo.working_set(pb, Tiling(1, 1), M)
    if smallest > M:
        raise BlockSizeError(
            f"M={M} is below the smallest working set of {algo.name} at d={pb.shape.d}, N_q={pb.shape.n_q}, "
            f"N_k={pb.shape.n_k}: {smallest} elements (B_r = B_c = 1); allowed range M >= {smallest}"
        )
    lo, hi = 1, pb.shape.n_q if algo.outer == "Br" else pb.shape.n_k
    while lo < hi:  # the working set grows with B: find the largest B that fits
        mid = (lo + hi + 1) // 2
        if algo.working_set(pb, shape_rule(algo, pb, mid), M) <= M:
            lo = mid
        else:
            hi = mid - 1
    return shape_rule(algo, pb, lo)


def optimal(algo: Algorithm, pb: Problem, M: int) -> Tiling:
    """Any block shape, for the fewest exact HBM accesses whose working set fits M (``iosim.optimize``)."""
    from iosim.optimize import optimal as search  # the optimizer builds Tilings: importing it here would be circular

    return search(algo, pb, M)


POLICIES: dict[str, Callable[[Algorithm, Problem, int], Tiling]] = {"fit": fit, "paper": paper, "optimal": optimal}


def choose_tiling(algo: Algorithm, pb: Problem, M: int, policy: str = "fit", tiling: Tiling | None = None,
                  splits: int | None = None) -> Tiling:
    """The tiling of a run: ``tiling`` itself when given (it must fit M), else what ``policy`` chooses.

    An algorithm that splits K/V (``algo.splits`` set) gets ``splits`` chunks, or its own
    default policy's count when ``splits`` is None and no tiling is given; the others take
    only 1. Under the ``optimal`` policy, fewest HBM accesses, the default is 1: splits buy
    parallelism with traffic, never less traffic.
    """
    explicit = tiling is not None
    tiling = _blocks(algo, pb, M, policy, tiling)
    T_c = -(-pb.shape.n_k // tiling.Bc)
    allowed = "1" if algo.splits is None else f"1 to {T_c} (the number of K/V blocks of B_c={tiling.Bc})"
    if splits is not None:
        if isinstance(splits, bool) or not isinstance(splits, int) or splits < 1:
            raise InputError(f"splits={splits!r} for {algo.name} at N_k={pb.shape.n_k}; allowed: {allowed}")
        tiling = replace(tiling, splits=splits)
    elif algo.splits is not None and not explicit and policy != "optimal":
        tiling = replace(tiling, splits=algo.splits(pb, tiling))
    if tiling.splits != 1 and (algo.splits is None or tiling.splits > T_c):
        raise InputError(f"splits={tiling.splits} for {algo.name} at N_k={pb.shape.n_k}; allowed: {allowed}")
    return tiling


def _blocks(algo: Algorithm, pb: Problem, M: int, policy: str, tiling: Tiling | None) -> Tiling:
    if tiling is not None:
        if not isinstance(tiling, Tiling):
            raise InputError(f"tiling={tiling!r} must be an iosim.Tiling(Br=..., Bc=...)")
        tiling = tiling.capped(pb)
        need = algo.working_set(pb, tiling, M)
        if need > M:
            raise BlockSizeError(
                f"tiling B_r={tiling.Br}, B_c={tiling.Bc} needs a working set of {need} elements for "
                f"{algo.name}, above M={M}; allowed: tilings whose working set is <= M"
            )
        return tiling
    if policy not in POLICIES:
        raise InputError(f"block_policy={policy!r} is not one of {list(POLICIES)}")
    return POLICIES[policy](algo, pb, M)
