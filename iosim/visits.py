"""Which (i, j) tiles an algorithm visits: the one place that works it out.

Query rows are split into blocks i of B_r rows and key rows into blocks j of B_c
rows. An algorithm that skips tiles a mask hides entirely visits only the pairs
(i, j) where some query of block i sees some key of block j; one that does not
skip visits every pair. The algorithms loop over what ``Visits`` yields, the closed
forms sum over it and the peak computations maximize over it, so the three cannot
disagree about which tiles are visited.

Count-only mode needs only how many visited blocks and tiles have each size, since
a block's traffic depends on its size alone. ``Visits.pairs`` gives the visited
tiles by size in closed form, in time independent of N (a causal mask's visited
tiles are sums of floor functions, summed by ``floor_sum``), and ``Blocks.classes``
the blocks of a loop by size; ``iosim.memory.Memory.loop`` derives its grouping from
them.

Causal masking is bottom-right aligned (``iosim.inputs``): query r sees key c
exactly when c ≤ r + N_k − N_q.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from iosim.problem import Problem
from iosim.tiling import Tiling, ceil_div


def floor_sum(n: int, m: int, a: int, b: int) -> int:
    """Σ_{i=0}^{n−1} ⌊(a·i + b)/m⌋ for n ≥ 0, m ≥ 1, a ≥ 0, b ≥ 0, in O(log m) steps.

    Each step takes the whole parts of a/m and b/m out of the sum, then counts the
    lattice points under the line the other way round (swapping the roles of a and m),
    as Euclid's algorithm does.
    """
    total = 0
    while n > 0:
        if a >= m:
            total += (n - 1) * n // 2 * (a // m)
            a %= m
        if b >= m:
            total += n * (b // m)
            b %= m
        y_max = a * n + b
        if y_max < m:
            break
        n, b, m, a = y_max // m, y_max % m, a, m
    return total


@dataclass(frozen=True)
class Axis:
    """n rows split into T = ⌈n/B⌉ blocks of B rows; the last block has n − (T−1)·B rows."""

    n: int
    B: int

    @property
    def T(self) -> int:
        return ceil_div(self.n, self.B)

    @property
    def full(self) -> int:
        """How many blocks hold B rows: all but a ragged last one."""
        return self.n // self.B

    def size(self, t: int) -> int:
        return min(self.B, self.n - t * self.B)

    def slice(self, t: int) -> slice:
        return slice(t * self.B, t * self.B + self.size(t))

    def first_of_size(self, size: int) -> int:
        """The first block holding ``size`` rows."""
        return 0 if size == self.B else self.T - 1

    def all(self) -> Blocks:
        """Every block of the axis, as a loop that nests nothing visits them."""
        return Blocks(self, (range(self.T),))


@dataclass(frozen=True)
class Blocks:
    """The blocks of one axis that a loop visits, as runs of block indices.

    ``nested(t)`` gives the blocks the loop nested in block t visits (None when it nests
    no loop), and ``pairs()`` how many (block, nested block) pairs there are of each
    pair of sizes, over all its blocks.
    """

    axis: Axis
    runs: tuple[range, ...]
    nested: Callable[[int], Blocks] | None = None
    pairs: Callable[[], dict[tuple[int, int], int]] | None = None

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

    def classes(self) -> list[tuple[int, int]]:
        """(representative block, number of blocks) for each block size visited."""
        return [(self.axis.first_of_size(size), count) for size, count in self.sizes().items()]

    def nested_sizes(self, size: int) -> dict[int, int]:
        """Nested block size → how many nested blocks of that size all blocks of ``size`` visit together."""
        return {inner: n for (outer, inner), n in self.pairs().items() if outer == size}


class PairCounts:
    """What every set of visited tiles derives from its tile counts by (b_i, b_j)."""

    def _pair_counts(self) -> dict[tuple[int, int], int]:
        raise NotImplementedError

    def pairs(self) -> list[tuple[int, int, int]]:
        """(b_i, b_j, count): how many visited tiles have b_i query rows and b_j key rows."""
        return [(b_i, b_j, n) for (b_i, b_j), n in self._pair_counts().items()]

    def _transposed_pair_counts(self) -> dict[tuple[int, int], int]:
        return {(b_j, b_i): n for (b_i, b_j), n in self._pair_counts().items()}


@dataclass(frozen=True)
class Visits(PairCounts):
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

    def _keys_seen(self, last_row: int) -> int:
        """How many key blocks, from the first, a query block ending at ``last_row`` meets.

        Its last row sees keys up to L = last_row + N_k − N_q, so with a causal skip it
        meets the key blocks j ≤ ⌊L / B_c⌋: min(T_c, ⌊L / B_c⌋ + 1) of them, none when L < 0.
        """
        if not self.skips_hidden:
            return self.k.T
        last_key = last_row + self.offset
        return 0 if last_key < 0 else min(self.k.T, last_key // self.k.B + 1)

    def keys_met(self, i: int) -> int:
        """How many key blocks, from the first, query block i meets."""
        return self._keys_seen(self.q.slice(i).stop - 1)

    def keys_seen_by(self, i: int) -> Blocks:
        """The key blocks query block i meets."""
        return Blocks(self.k, (range(self.keys_met(i)),))

    def first_query(self, j: int) -> int:
        """The first query block that meets key block j; every later one meets it too.

        Row r sees the block's first key j·B_c when r ≥ j·B_c − (N_k − N_q), so with a causal
        skip the query blocks from ⌊max(0, j·B_c − (N_k − N_q)) / B_r⌋ on meet it.
        """
        return max(0, j * self.k.B - self.offset) // self.q.B if self.skips_hidden else 0

    def queries_seeing(self, j: int) -> Blocks:
        """The query blocks that meet key block j (``first_query`` on). The last query row sees
        every key, so every key block is met."""
        return Blocks(self.q, (range(self.first_query(j), self.q.T),))

    def query_blocks(self) -> Blocks:
        """Every query block, each nesting the key blocks it meets (a loop with Q blocks outer)."""
        return Blocks(self.q, (range(self.q.T),), self.keys_seen_by, self._pair_counts)

    def key_blocks(self) -> Blocks:
        """Every key block, each nesting the query blocks that meet it (a loop with K/V blocks outer)."""
        return Blocks(self.k, (range(self.k.T),), self.queries_seeing, self._transposed_pair_counts)

    def blind_query_sizes(self) -> set[int]:
        """Sizes of query blocks that meet no key block at all (causal, N_q > N_k)."""
        seen = {b_i for b_i, _, _ in self.pairs()}
        return set(Blocks(self.q, (range(self.q.T),)).sizes()) - seen

    def _pair_counts(self) -> dict[tuple[int, int], int]:
        """Visited tiles by (b_i, b_j), in closed form.

        The full query blocks i = 0 … ⌊N_q/B_r⌋ − 1 end at row (i + 1)·B_r − 1, so block i
        meets c_i = clamp(⌊(B_r·i + B_r − 1 + N_k − N_q) / B_c⌋ + 1, 0, T_c) key blocks;
        Σ c_i is a floor sum over the i where the clamp is inactive. A query block meets
        the ragged last key block exactly when it meets all T_c of them.
        """
        q, k = self.q, self.k
        k_ragged = k.size(k.T - 1) if k.n % k.B else None
        out: dict[tuple[int, int], int] = {}

        def add(b_i: int, met: int, all_met: int) -> None:
            """Blocks of b_i rows that meet ``met`` key blocks in all, ``all_met`` of them meeting every one."""
            full = met - all_met if k_ragged is not None else met
            for b_j, n in ((k.B, full), (k_ragged, met - full)):
                if n:
                    out[(b_i, b_j)] = out.get((b_i, b_j), 0) + n

        add(q.B, *self._keys_seen_by_full_query_blocks())
        if q.full < q.T:
            c = self._keys_seen(q.n - 1)
            add(q.size(q.T - 1), c, int(c == k.T))
        return out

    def _keys_seen_by_full_query_blocks(self) -> tuple[int, int]:
        """(Σ c_i, how many c_i = T_c) over the full query blocks, without visiting them."""
        n, Br, Bc, Tc = self.q.full, self.q.B, self.k.B, self.k.T
        if not self.skips_hidden:
            return n * Tc, n
        c0 = Br - 1 + self.offset  # block i's last row sees keys up to B_r·i + c0
        first = min(n, max(0, ceil_div(-c0, Br)))  # the first block that sees a key
        all_keys = min(n, max(first, ceil_div((Tc - 1) * Bc - c0, Br)))  # the first that sees every block
        partial = all_keys - first
        total = partial + floor_sum(partial, Bc, Br, Br * first + c0) + Tc * (n - all_keys)
        return total, n - all_keys


def visits(pb: Problem, tiling: Tiling, skips_hidden: bool) -> Visits:
    """The tiles visited on ``pb`` with ``tiling``; ``skips_hidden`` skips those a causal mask hides."""
    return Visits(Axis(pb.shape.n_q, tiling.Br), Axis(pb.shape.n_k, tiling.Bc), skips_hidden and pb.causal)
