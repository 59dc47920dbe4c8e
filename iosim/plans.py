"""A request resolved once: the ``Plan`` of each pass (algorithm, problem, M, tiling) and the ``Request`` holding them.

``iosim.api.plan`` builds them; ``measure`` runs them count-only, ``closed_form`` evaluates
them, the results keep them, and the GPU's DRAM level (``iosim.gpu.dram``) runs their kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

from iosim.algorithms.algorithm import Algorithm
from iosim.core.counts import Counts, combined
from iosim.core.flops import Flops
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.variants.flex import head_groups
from iosim.variants.varlen import documents


@dataclass(frozen=True)
class Plan:
    """One pass of one algorithm on one problem, resolved once: what a run and a closed form both need."""

    algorithm: Algorithm  # the pass's own: a forward algorithm, or its backward pass
    problem: Problem  # the caller's
    M: int  # SRAM capacity, elements
    tiling: Tiling

    @property
    def run_problem(self) -> Problem:
        """The problem as the algorithm runs it (``Algorithm.run_problem``)."""
        return self.algorithm.run_problem(self.problem)

    def parts(self) -> tuple[Plan, ...]:
        """The plain plans it adds up: one per distinct document length of packed documents (iosim.variants.varlen),
        each at this tiling capped to its documents, as ``count(N=L, tiling=...)`` caps it; one per group of heads of
        equal blocks of a per-head FlexAttention mask (``head_groups``); else itself."""
        if self.problem.flex is not None and self.problem.flex.per_head:
            return tuple(Plan(self.algorithm, pb, self.M, self.tiling) for pb in head_groups(self.problem))
        if self.problem.seqlens is None:
            return (self,)
        return tuple(Plan(self.algorithm, pb, self.M, self.tiling.capped(self.algorithm.run_problem(pb)))
                     for pb in documents(self.problem))

    def exact(self) -> Counts:
        return combined(*(self.algorithm.traffic(p.run_problem, p.tiling, p.M) for p in self.parts()))

    def flops(self) -> Flops | None:
        algo = self.algorithm
        parts = [algo.flops(p.run_problem, p.tiling, p.M) for p in self.parts()] if algo.flops else [None]
        return None if None in parts else sum(parts[1:], parts[0])

    def paper(self) -> float:
        return sum(self.algorithm.paper_form(p.run_problem, self.M) for p in self.parts())


@dataclass(frozen=True)
class Request:
    """What one call asks for: the forward algorithm it names, the pass, and the plan of each pass run."""

    algorithm: Algorithm  # the forward algorithm named
    pass_: str  # one of iosim.api.PASSES
    forward: Plan | None  # None with pass "bwd"
    backward: Plan | None  # None with pass "fwd"

    @property
    def plans(self) -> tuple[Plan, ...]:
        return tuple(p for p in (self.forward, self.backward) if p is not None)

    @property
    def name(self) -> str:
        """The name results carry: the forward's, or the backward pass's own when it runs alone."""
        return self.backward.algorithm.name if self.pass_ == "bwd" else self.algorithm.name

    @property
    def problem(self) -> Problem:
        return self.plans[0].problem

    @property
    def M(self) -> int:
        return self.plans[0].M
