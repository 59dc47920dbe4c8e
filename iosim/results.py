"""What the API returns: a run's counts (``SimResult``) and a request's closed forms (``PredictResult``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from iosim.algorithms.tile_ops import logsumexp
from iosim.core.counts import Counts, combined
from iosim.core.flops import Flops
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling, one_pass
from iosim.variants.varlen import padded

if TYPE_CHECKING:
    from iosim.plans import Plan


class Packing:
    """What packed documents (``Problem.seqlens``, iosim.variants.varlen) save against padding each to the longest."""

    problem: Problem
    plans: tuple[Plan, ...]

    @cached_property
    def padded(self) -> Counts | None:
        """The traffic of the documents padded to the longest, at the same tiling: ``count(N=max(seqlens),
        batch=len(seqlens), tiling=...)`` of each pass, added; None without documents."""
        if self.problem.seqlens is None or not self.plans:
            return None
        return combined(*(replace(p, problem=padded(p.problem)).exact() for p in self.plans))

    @property
    def packing_ratio(self) -> float | None:
        """Packed traffic over padded traffic (≤ 1); None without documents."""
        return None if self.padded is None else self.traffic_total / self.padded.total


@dataclass(frozen=True)
class SimResult(Packing):
    """One simulated run. Arrays are None in count-only mode and for outputs the algorithm lacks.

    ``forward_tiling`` and ``backward_tiling`` are the tilings of the passes run (None for
    a pass that did not run); ``tiling`` is the one pass's, None when both ran.
    """

    algorithm: str
    problem: Problem
    M: int
    forward_tiling: Tiling | None
    backward_tiling: Tiling | None
    traffic: Counts
    out: np.ndarray | None = None  # (batch, heads, N_q, d)
    l: np.ndarray | None = None  # (batch, heads, N_q): softmax normalizer ℓ
    m: np.ndarray | None = None  # (batch, heads, N_q): row max m
    flops: Flops | None = None  # the arithmetic the run counted
    gpu: str | None = None  # the preset whose SMs split-kv's default splits filled; None: the default's
    plans: tuple[Plan, ...] = field(default=(), repr=False, compare=False)  # the passes run (iosim.gpu.dram runs them)

    @property
    def tiling(self) -> Tiling | None:
        return one_pass(self.forward_tiling, self.backward_tiling)

    @property
    def traffic_total(self) -> int:
        return self.traffic.total

    @property
    def lse(self) -> np.ndarray | None:
        """log Σ_j exp(S_ij) = m + log ℓ; −inf on rows that see no key."""
        return None if self.l is None else logsumexp(self.l, self.m)


@dataclass(frozen=True)
class PredictResult(Packing):
    """The closed forms of one request: exact counts, the paper's form and the arithmetic (tilings as SimResult)."""

    algorithm: str
    problem: Problem
    M: int
    forward_tiling: Tiling | None
    backward_tiling: Tiling | None
    exact: Counts  # equal to what count() and simulate() measure
    paper: float  # the paper's asymptotic form, in elements
    paper_label: str
    flops: Flops | None = None  # exact arithmetic; None for an algorithm that declares no closed form for it
    plans: tuple[Plan, ...] = field(default=(), repr=False, compare=False)  # the passes predicted, for ``padded``

    @property
    def traffic_total(self) -> int:
        return self.exact.total

    @property
    def tiling(self) -> Tiling | None:
        return one_pass(self.forward_tiling, self.backward_tiling)
