"""What the API returns: a run's counts (``SimResult``) and a request's closed forms (``PredictResult``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from iosim.algorithms.tile_ops import logsumexp
from iosim.counts import Counts
from iosim.errors import InputError
from iosim.flops import Flops
from iosim.l2 import DramCounts
from iosim.l2_counts import covers, passes_dram
from iosim.problem import Problem
from iosim.tiling import Tiling, one_pass

if TYPE_CHECKING:
    from iosim.api import Plan


@dataclass(frozen=True)
class SimResult:
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
    gpu: str | None = None  # the preset behind ``dram``; None: no DRAM level
    plans: tuple[Plan, ...] = field(default=(), repr=False, compare=False)  # the passes run, for ``dram``

    @property
    def tiling(self) -> Tiling | None:
        return one_pass(self.forward_tiling, self.backward_tiling)

    @cached_property
    def dram(self) -> DramCounts | None:
        """The DRAM bytes behind the ``gpu`` preset's L2 (iosim.l2), worked out when first asked: ``reads``,
        ``writes`` during the kernels and ``dirty_at_end``, per tensor. None without a ``gpu``, and where the L2
        model does not cover the run: an algorithm with no kernel grid, a mask, or a tiling its kernel does not
        launch (``iosim.dram`` says which). A backward pass is simulated: seconds to minutes at scale."""
        if self.gpu is None or not self.plans or not covers(self.plans):
            return None
        try:
            return passes_dram(self.plans, self.gpu)
        except InputError:  # the kernel refuses this tiling or dtype: the model has nothing to say
            return None

    @property
    def lse(self) -> np.ndarray | None:
        """log Σ_j exp(S_ij) = m + log ℓ; −inf on rows that see no key."""
        return None if self.l is None else logsumexp(self.l, self.m)


@dataclass(frozen=True)
class PredictResult:
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

    @property
    def tiling(self) -> Tiling | None:
        return one_pass(self.forward_tiling, self.backward_tiling)
