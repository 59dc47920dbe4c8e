"""A tiling: the block sizes of a run.

A ``Tiling`` says how many query rows (B_r) and key rows (B_c) one tile holds, and into
how many chunks the K/V blocks are split; it can grow further dimensions (a d-tile)
without changing its callers. Tilings never exceed the sequence they split
(B_r ≤ N_q, B_c ≤ N_k); this changes no count, only how much SRAM sits idle. The
policies that choose one are in ``iosim.tilings.policies``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from iosim.core.units import MAX_COUNT, parse_count

if TYPE_CHECKING:
    from iosim.core.problem import Problem


def ceil_div(a: int, b: int) -> int:
    """⌈a/b⌉ in integers, exact at any size (b ≥ 1)."""
    return -(-a // b)


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

    def __post_init__(self):  # a count as counts are taken (4, 4.0, "4"), kept as an int; an int passes cheaply
        for name in ("Br", "Bc", "splits"):
            value = getattr(self, name)
            if type(value) is not int or not 1 <= value <= MAX_COUNT:
                object.__setattr__(self, name, parse_count(name, value))

    def capped(self, pb: Problem) -> Tiling:
        """The same tiling with no block longer than the sequence it splits."""
        return Tiling(min(self.Br, pb.shape.n_q), min(self.Bc, pb.shape.n_k), self.splits)


def tiling_record(tiling: Tiling | None, prefix: str = "") -> dict:
    """A tiling as the records of every command carry it: ``Br``, ``Bc``, ``splits`` (each None without one), each key
    after ``prefix`` (``bwd_`` for a training step's backward)."""
    return {f"{prefix}Br": getattr(tiling, "Br", None), f"{prefix}Bc": getattr(tiling, "Bc", None),
            f"{prefix}splits": getattr(tiling, "splits", None)}


def one_pass(forward: Tiling | None, backward: Tiling | None) -> Tiling | None:
    """The tiling of a result that ran one pass; None when it ran both (each has its own)."""
    if forward is not None and backward is not None:
        return None
    return forward or backward
