"""Arithmetic of a run: matrix-multiply FLOPs and exponentials, counted apart.

Tensor cores run the matmuls; the exponentials run on the special-function units at
a small fraction of that rate, so the two are kept apart rather than summed into one
number. Recomputation counts: FlashAttention's backward pass computes S = τQKᵀ again,
so it does more matmul FLOPs than standard attention's, which reads P back instead.

Conventions: an (a × k)(k × b) product is 2·a·k·b FLOPs; exp (and the log of a
logsumexp) count one each. Other elementwise work (scale, mask, max, sums,
divisions, dropout) is not counted, but for a FlexAttention ``score_mod``'s, which its user
declares per score (``score``). Like traffic, counts are summed over batch·heads.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Flops:
    """Matrix-multiply FLOPs and exponentials of a run, summed over batch·heads."""

    matmul: int = 0
    exp: int = 0
    score: int = 0  # a FlexAttention score_mod's elementwise FLOPs, as its user declares them per score

    def __add__(self, other: Flops) -> Flops:
        return Flops(self.matmul + other.matmul, self.exp + other.exp, self.score + other.score)

    def scaled(self, bh: int) -> Flops:
        return Flops(self.matmul * bh, self.exp * bh, self.score * bh)


def matmul(a: int, k: int, b: int) -> int:
    """FLOPs of an (a × k)(k × b) product: a·b dot products of k multiply-adds."""
    return 2 * a * k * b
