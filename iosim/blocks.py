"""Block sizes B_r × B_c: the paper's rule, or the largest blocks that fit M.

Both policies share the paper's shape: the block of the outer loop is B and the
other is min(B, d) (Alg. 1 line 1 has B_c = ⌈M/4d⌉, B_r = min(B_c, d); for the
swapped loop, whose outer block is B_r, the roles swap, as seed 003 suggests).
Blocks never exceed the sequence they split (B_r ≤ N_q, B_c ≤ N_k); this changes no
count, only how much SRAM sits idle.

- ``paper``: B = ⌈M/4d⌉. The paper budgets 4·B·d for Q, K, V, O and forgets the
  S tile and the statistics, so for larger d the working set overflows M; that is
  reported as a ``BlockSizeError`` rather than exceeded silently.
- ``fit`` (default): the largest B whose whole working set fits M.
"""

from __future__ import annotations

import math

from iosim.problem import Problem
from iosim.registry import Algorithm

POLICIES = ("fit", "paper")


class BlockSizeError(ValueError):
    """No block sizes of the chosen policy fit the SRAM."""


def shape_rule(algo: Algorithm, pb: Problem, B: int) -> tuple[int, int]:
    """(B_r, B_c) from the outer block size B, capped at the sequence lengths."""
    outer, inner = B, min(B, pb.shape.d)
    Br, Bc = (outer, inner) if algo.outer == "Br" else (inner, outer)
    return min(Br, pb.shape.n_q), min(Bc, pb.shape.n_k)


def choose_blocks(algo: Algorithm, pb: Problem, M: int, policy: str = "fit") -> tuple[int, int]:
    """Block sizes (B_r, B_c) for ``algo`` on ``pb`` with SRAM capacity M."""
    if policy not in POLICIES:
        raise ValueError(f"block_policy={policy!r} is not one of {list(POLICIES)}")
    d = pb.shape.d
    if policy == "paper":
        B = math.ceil(M / (4 * d))
        Br, Bc = shape_rule(algo, pb, B)
        need = algo.working_set(pb, Br, Bc, M)
        if need > M:
            raise BlockSizeError(
                f"block policy 'paper' gives B_r={Br}, B_c={Bc} (B = ⌈M/4d⌉ = {B}) for {algo.name} at d={d}, "
                f"whose working set of {need} elements exceeds M={M}: the paper's rule leaves no room for "
                f"the S tile and the statistics; use block policy 'fit'"
            )
        return Br, Bc
    smallest = algo.working_set(pb, 1, 1, M)
    if smallest > M:
        raise BlockSizeError(
            f"M={M} is below the smallest working set of {algo.name} at d={d}, N_q={pb.shape.n_q}, "
            f"N_k={pb.shape.n_k}: {smallest} elements (B_r = B_c = 1); allowed range M >= {smallest}"
        )
    lo, hi = 1, pb.shape.n_q if algo.outer == "Br" else pb.shape.n_k
    while lo < hi:  # the working set grows with B: find the largest B that fits
        mid = (lo + hi + 1) // 2
        if algo.working_set(pb, *shape_rule(algo, pb, mid), M) <= M:
            lo = mid
        else:
            hi = mid - 1
    return shape_rule(algo, pb, lo)
