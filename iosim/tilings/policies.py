"""Block policies: how a run's tiling is chosen, given the algorithm, the problem and M.

A block policy is a function (algorithm, problem, M) → Tiling, registered in
``POLICIES``. ``optimal`` searches free shapes (``iosim.tilings.search``); ``fit`` and ``paper``
keep the paper's shape: the block of the outer loop is B and the other is min(B, d)
(Alg. 1 line 1 has B_c = ⌈M/4d⌉, B_r = min(B_c, d); for a loop with Q blocks outer the
roles swap). ``choose_tiling`` then sets the K/V splits through the algorithm
(``Algorithm.with_splits``), and with a paged K/V cache aligns the K/V blocks to the pages
(``iosim.variants.paging.aligned``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from iosim.algorithms.algorithm import Algorithm
from iosim.core.errors import BlockSizeError, InputError
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling, ceil_div
from iosim.core.units import parse_count
from iosim.tilings.search import check_fits, largest
from iosim.tilings.search import optimal as search_optimal
from iosim.variants import paging


def shape_rule(algo: Algorithm, pb: Problem, B: int) -> Tiling:
    """The paper's shape from the outer block size B: the outer block is B, the other min(B, d)."""
    outer, inner = B, min(B, pb.shape.d)
    tiling = Tiling(outer, inner) if algo.outer == "Br" else Tiling(inner, outer)
    return tiling.capped(pb)


def paper(algo: Algorithm, pb: Problem, M: int) -> Tiling:
    """B = ⌈M/4d⌉ (Alg. 1 line 1); with V's head size d_v apart, ⌈M/(2(d + d_v))⌉.

    The paper budgets 4·B·d for Q, K, V, O (2·B·(d + d_v)) and forgets the S tile and the statistics,
    so for larger d the working set overflows M: a ``BlockSizeError``, never an overflow.

    The rule is the forward pass's. A FlashAttention backward pass (Alg. 4, and
    FlashAttention-2's) holds K_j, V_j, dK_j and dV_j, 4·B_c·d ≥ M at B_c = ⌈M/4d⌉, before
    any inner block: ``paper`` refuses it unless a sequence shorter than B caps the blocks
    (N_k < M/4d), that is at every realistic N. Use ``fit`` or ``optimal`` for such a pass.
    """
    d, d_v = pb.shape.d, pb.shape.d_v
    B = ceil_div(M, 2 * (d + d_v))
    rule = "⌈M/4d⌉" if d == d_v else "⌈M/2(d + d_v)⌉"
    tiling = shape_rule(algo, pb, B)
    need = algo.working_set(pb, tiling, M)
    if need > M:
        why = ("the rule is Algorithm 1's, for the forward pass, and a backward pass holds its gradients' blocks "
               "as well; use block policy 'fit' or 'optimal' for pass 'bwd' or 'fwd+bwd'"
               if algo.is_backward else
               "the paper's rule leaves no room for the S tile and the statistics; use block policy 'fit'")
        raise BlockSizeError(
            f"block policy 'paper' gives B_r={tiling.Br}, B_c={tiling.Bc} (B = {rule} = {B}) for {algo.name} at "
            f"d={pb.shape.d}{f', d_v={d_v}' if d_v != d else ''}, whose working set of {need} elements exceeds "
            f"M={M}: {why}"
        )
    return tiling


def fit(algo: Algorithm, pb: Problem, M: int) -> Tiling:
    """The largest outer block B, in the paper's shape, whose whole working set fits M.

    Where one outer block holds the whole outer sequence and that is shorter than d
    (decoding: N_q = 1 with the query blocks outer), the paper's shape would make the
    inner block as short as it (1 × 1); the inner block then grows to the largest that
    fits, as a decode kernel streams K/V in long blocks past one query block.
    """
    check_fits(algo, pb, M)
    s = pb.shape
    n_outer, n_inner = (s.n_q, s.n_k) if algo.outer == "Br" else (s.n_k, s.n_q)
    tiling = shape_rule(algo, pb, largest(lambda B: algo.working_set(pb, shape_rule(algo, pb, B), M) <= M, n_outer))
    B = tiling.Br if algo.outer == "Br" else tiling.Bc
    if B < n_outer or n_outer >= s.d:
        return tiling

    def with_inner(b: int) -> Tiling:
        return Tiling(B, b) if algo.outer == "Br" else Tiling(b, B)

    return with_inner(largest(lambda b: algo.working_set(pb, with_inner(b), M) <= M, n_inner))


@dataclass(frozen=True)
class Policy:
    """A block policy: the function that chooses the blocks, and whether the algorithm's K/V splits are added.

    ``fills_gpu``: an algorithm that splits K/V gets its own policy's count of splits
    (to fill the GPU's SMs). ``optimal`` minimizes HBM accesses, and splits buy
    parallelism with traffic, never less traffic: it keeps one.
    """

    choose: Callable[[Algorithm, Problem, int], Tiling]
    fills_gpu: bool


POLICIES: dict[str, Policy] = {
    "fit": Policy(fit, fills_gpu=True),
    "paper": Policy(paper, fills_gpu=True),
    "optimal": Policy(search_optimal, fills_gpu=False),  # any block shape, the fewest exact HBM accesses
}


def choose_tiling(algo: Algorithm, pb: Problem, M: int, policy: str = "fit", tiling: Tiling | None = None,
                  splits: int | None = None, sms: int = 1) -> Tiling:
    """The tiling of a run: ``tiling`` itself when given (it must fit M), else what ``policy`` chooses.

    Its K/V splits are ``splits`` when given, else the algorithm's default for a GPU of
    ``sms`` SMs when the policy fills the GPU and no tiling is given
    (``Algorithm.with_splits``).
    """
    own = algo.own_tiling(pb)
    if own is not None:  # a FlexAttention block mask's blocks
        if tiling is not None and tiling.capped(pb) != own:
            raise InputError(f"tiling={tiling} for {algo.name}: it runs on its block mask's blocks, {own}; allowed: "
                             f"tiling=None, or that one")
        return algo.with_splits(pb, _checked(algo, pb, M, own), splits, default=False, sms=sms, fixed=True)
    if tiling is not None:
        if isinstance(tiling, Tiling) and tiling.splits != 1 and splits is not None \
                and parse_count("splits", splits) != tiling.splits:
            raise InputError(f"splits={splits!r} with tiling={tiling}: two K/V splits; allowed: one of them, or both "
                             f"the same")
        tiling = algo.with_splits(pb, _checked(algo, pb, M, tiling), splits, default=False, sms=sms, fixed=True)
        return paging.aligned(pb, tiling, fixed=True)
    if policy not in POLICIES:
        raise InputError(f"block_policy={policy!r} is not one of {list(POLICIES)}")
    chosen = POLICIES[policy]
    tiling = algo.with_splits(pb, chosen.choose(algo, pb, M), splits, default=chosen.fills_gpu, sms=sms)
    return paging.aligned(pb, tiling, fixed=False)  # K/V blocks of whole pages, or within one


def _checked(algo: Algorithm, pb: Problem, M: int, tiling: Tiling) -> Tiling:
    """An explicit tiling, capped to the sequences, whose working set must fit M."""
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
