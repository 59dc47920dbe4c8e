"""Which (i, j) tiles an algorithm visits: the one place that works it out.

Query rows are split into blocks i of B_r rows and key rows into blocks j of B_c
rows. An algorithm that skips tiles a mask hides entirely visits only the pairs
(i, j) where some query of block i sees some key of block j; one that does not
skip visits every pair. The algorithms loop over what ``Visits`` yields, the closed
forms sum over it and the peak computations maximize over it, so the three cannot
disagree about which tiles are visited.

Count-only mode groups the blocks of a loop into classes that move identical
traffic: blocks of the same size whose nested loops visit blocks of the same sizes.
``Blocks.classes`` derives the classes from the visited set itself, so no algorithm
chooses its own grouping.

Causal masking is bottom-right aligned (``iosim.inputs``): query r sees key c
exactly when c ≤ r + N_k − N_q.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from iosim.problem import Problem
from iosim.tiling import Tiling


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Axis:
    """n rows split into T = ⌈n/B⌉ blocks of B rows; the last block has n − (T−1)·B rows."""

    n: int
    B: int

    @property
    def T(self) -> int:
        return ceil_div(self.n, self.B)

    def size(self, t: int) -> int:
        return min(self.B, self.n - t * self.B)

    def slice(self, t: int) -> slice:
        return slice(t * self.B, t * self.B + self.size(t))

    def all(self) -> Blocks:
        """Every block of the axis, as an innermost loop visits them."""
        return Blocks(self, (range(self.T),))


@dataclass(frozen=True)
class Blocks:
    """The blocks of one axis that a loop visits, as runs of block indices.

    ``nested(t)`` gives the blocks the loop nested in block t visits (None for an
    innermost loop); ``nested_varies`` says whether they differ between blocks.
    """

    axis: Axis
    runs: tuple[range, ...]
    nested: Callable[[int], Blocks] | None = None
    nested_varies: bool = False

    def __iter__(self) -> Iterator[int]:
        for run in self.runs:
            yield from run

    def sizes(self) -> dict[int, int]:
        """Block size → how many visited blocks have it, in O(number of runs)."""
        ragged = self.axis.T - 1 if self.axis.n % self.axis.B else None
        out: dict[int, int] = {}
        for run in self.runs:
            n_ragged = 1 if ragged is not None and ragged in run else 0
            if len(run) > n_ragged:
                out[self.axis.B] = out.get(self.axis.B, 0) + len(run) - n_ragged
            if n_ragged:
                out[self.axis.size(ragged)] = out.get(self.axis.size(ragged), 0) + 1
        return out

    def signature(self) -> tuple:
        """What the traffic of visiting these blocks depends on: their sizes, and what each nests."""
        return tuple(sorted((key, count) for key, (_, count) in self._classes().items()))

    def classes(self) -> list[tuple[int, int]]:
        """(representative block, number of blocks) for each class of blocks that move identical traffic."""
        return list(self._classes().values())

    def _key(self, t: int):
        size = self.axis.size(t)
        return size if self.nested is None else (size, self.nested(t).signature())

    def _classes(self) -> dict:
        """Class key → (first block of the class, number of blocks)."""
        out: dict = {}
        if self.nested is not None and self.nested_varies:
            for t in self:
                key = self._key(t)
                first, count = out.get(key, (t, 0))
                out[key] = (first, count + 1)
            return out
        # What a block nests is the same for every block, so its size alone decides its class.
        # Only the last block of the axis is ragged, so each run's first and last block cover every size.
        sizes = self.sizes()
        for run in self.runs:
            for t in dict.fromkeys((run[0], run[-1]) if len(run) else ()):
                out.setdefault(self._key(t), (t, sizes[self.axis.size(t)]))
        return out


@dataclass(frozen=True)
class Visits:
    """The tiles (query block i, key block j) visited on one problem with one tiling.

    ``skips_hidden``: only pairs that a causal mask leaves partly visible are visited.
    An explicit mask is not inspected: its tiles are all visited.
    """

    q: Axis  # query rows in blocks of B_r
    k: Axis  # key rows in blocks of B_c
    skips_hidden: bool

    @property
    def offset(self) -> int:
        """N_k − N_q: query r sees key c exactly when c ≤ r + offset (causal)."""
        return self.k.n - self.q.n

    def keys_seen_by(self, i: int) -> Blocks:
        """The key blocks query block i meets.

        Its last row r sees keys up to L_i = r + N_k − N_q, so with a causal skip it meets
        the key blocks j ≤ ⌊L_i / B_c⌋: min(T_c, ⌊L_i / B_c⌋ + 1) of them, none when L_i < 0.
        """
        if not self.skips_hidden:
            return self.k.all()
        last_key = self.q.slice(i).stop - 1 + self.offset
        return Blocks(self.k, (range(0 if last_key < 0 else min(self.k.T, last_key // self.k.B + 1)),))

    def queries_seeing(self, j: int) -> Blocks:
        """The query blocks that meet key block j.

        Row r sees the block's first key j·B_c when r ≥ j·B_c − (N_k − N_q), so with a causal
        skip the query blocks from ⌊max(0, j·B_c − (N_k − N_q)) / B_r⌋ on meet it. The last
        query row sees every key, so every key block is met.
        """
        first = max(0, j * self.k.B - self.offset) // self.q.B if self.skips_hidden else 0
        return Blocks(self.q, (range(first, self.q.T),))

    def query_blocks(self) -> Blocks:
        """Every query block, each nesting the key blocks it meets (a loop with Q blocks outer)."""
        return Blocks(self.q, (range(self.q.T),), self.keys_seen_by, self.skips_hidden)

    def key_blocks(self) -> Blocks:
        """Every key block, each nesting the query blocks that meet it (a loop with K/V blocks outer)."""
        return Blocks(self.k, (range(self.k.T),), self.queries_seeing, self.skips_hidden)

    def pairs(self) -> list[tuple[int, int, int]]:
        """(b_i, b_j, count): how many visited tiles have b_i query rows and b_j key rows."""
        out: dict[tuple[int, int], int] = {}
        for i, count in self.query_blocks().classes():
            for b_j, n in self.keys_seen_by(i).sizes().items():
                key = (self.q.size(i), b_j)
                out[key] = out.get(key, 0) + count * n
        return [(b_i, b_j, n) for (b_i, b_j), n in out.items()]


def visits(pb: Problem, tiling: Tiling, skips_hidden: bool) -> Visits:
    """The tiles visited on ``pb`` with ``tiling``; ``skips_hidden`` skips those a causal mask hides."""
    return Visits(Axis(pb.shape.n_q, tiling.Br), Axis(pb.shape.n_k, tiling.Bc), skips_hidden and pb.causal)
