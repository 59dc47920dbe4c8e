"""Shared builders for the simulator tests."""

from __future__ import annotations

import numpy as np

from iosim.inputs import AttentionShape
from iosim.problem import Problem
from iosim.registry import ALGORITHMS
from iosim.tiling import shape_rule

ALGORITHM_NAMES = list(ALGORITHMS)
# the algorithms with a backward pass (small-cache, for one, has none: --pass bwd refuses it)
BACKWARD_NAMES = [name for name, a in ALGORITHMS.items() if a.backward is not None]


def random_qkv(rng: np.random.Generator, batch: int, heads: int, n_q: int, n_k: int, d: int):
    q = rng.standard_normal((batch, heads, n_q, d))
    k = rng.standard_normal((batch, heads, n_k, d))
    v = rng.standard_normal((batch, heads, n_k, d))
    return q, k, v


def problem(n_q: int, n_k: int, d: int, *, bh: int = 1, has_mask: bool = False) -> Problem:
    return Problem(AttentionShape(1, bh, n_q, n_k, d), tau=1.0, has_mask=has_mask)


def M_for_block(algorithm: str, n_q: int, n_k: int, d: int, B: int, has_mask: bool = False) -> int:
    """The smallest M whose 'fit' blocks have outer block B: tests pick tilings through it."""
    algo = ALGORITHMS[algorithm]
    pb = problem(n_q, n_k, d, has_mask=has_mask)
    tiling = shape_rule(algo, pb, B)
    M = algo.working_set(pb, tiling, 10**12)
    while algo.working_set(pb, tiling, M) > M:  # a working set may grow with M (standard's softmax rows)
        M += 1
    return M


def relative_error(x: np.ndarray, ref: np.ndarray) -> float:
    """max |x − ref| / max(1, max |ref|)."""
    return float(np.max(np.abs(x - ref)) / max(1.0, float(np.max(np.abs(ref)))))

