"""The one mapping of algorithm names that feeds the API, the CLI, the sweep and the tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from iosim import predict
from iosim.algorithms.flash import flash
from iosim.algorithms.flash_swapped import flash_swapped
from iosim.algorithms.standard import standard
from iosim.memory import Memory
from iosim.problem import Problem


@dataclass(frozen=True)
class Algorithm:
    name: str
    run: Callable[[Memory, Problem, int, int], None]
    outer: str  # the block of the outer loop, "Br" or "Bc": the block rules size it first
    outputs: tuple[str, ...]  # tensors the algorithm writes to HBM
    working_set: Callable[[Problem, int, int, int], int]
    traffic: Callable[[Problem, int, int, int], predict.Prediction]
    paper_form: Callable[[Problem, int], float]
    paper_label: str
    summary: str


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm("standard", standard, "Br", ("S", "P", "O"), predict.standard_working_set,
                  predict.standard_traffic, predict.standard_paper_form, "Θ(Nd + N²)",
                  "Algorithm 0: S and P materialized in HBM"),
        Algorithm("flash", flash, "Bc", ("O", "l", "m"), predict.flash_working_set,
                  predict.flash_traffic, predict.flash_paper_form, "12N²d²/M + 16N²d/M + 3Nd",
                  "Algorithms 1/2: K/V blocks outer, O, ℓ, m through HBM every step"),
        Algorithm("flash-swapped", flash_swapped, "Br", ("O", "l", "m"), predict.swapped_working_set,
                  predict.swapped_traffic, predict.swapped_paper_form, "8N²d²/M + 3dN + 2N",
                  "Q blocks outer, O, ℓ, m on chip and written once (seed 003, FlashAttention-2 order)"),
    )
}


def get_algorithm(name: str) -> Algorithm:
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm={name!r} is not one of {sorted(ALGORITHMS)}")
    return ALGORITHMS[name]
