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
tiles, and a sliding window's, are sums of floor functions, summed by ``floor_sum``), and ``Blocks.classes``
the blocks of a loop by size; ``iosim.core.memory.Memory.loop`` derives its grouping from
them.

Which keys a query sees is the problem's band (``iosim.core.problem.Band``), bottom-right
aligned: query r sees key c exactly when r + off − left ≤ c ≤ r + off + right, with
off = N_k − N_q; causal is the band (−1, 0).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from iosim.core.problem import UNBOUNDED, Band, Problem
from iosim.core.tiling import Tiling, ceil_div


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
    # further loops nested in each block, after ``nested``'s: (the blocks of block t, their pairs), one per loop
    siblings: tuple[tuple[Callable[[int], Blocks], Callable[[], dict[tuple[int, int], int]]], ...] = ()

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

    def nested_plans(self, t: int) -> list[tuple[Blocks, dict[int, int]]]:
        """Each loop nested in block t, in order, with its ``nested_sizes``: what ``Memory.loop`` weights them by."""
        if self.nested is None:
            return []
        size = self.axis.size(t)
        return [(self.nested(t), self.nested_sizes(size))] + [
            (nested(t), {inner: n for (outer, inner), n in pairs().items() if outer == size})
            for nested, pairs in self.siblings]


class PairCounts:
    """What every set of visited tiles derives from its tile counts by (b_i, b_j), over its query blocks ``q``."""

    q: Axis

    def _pair_counts(self) -> dict[tuple[int, int], int]:
        raise NotImplementedError

    def pairs(self) -> list[tuple[int, int, int]]:
        """(b_i, b_j, count): how many visited tiles have b_i query rows and b_j key rows."""
        return [(b_i, b_j, n) for (b_i, b_j), n in self._pair_counts().items()]

    def _transposed_pair_counts(self) -> dict[tuple[int, int], int]:
        return {(b_j, b_i): n for (b_i, b_j), n in self._pair_counts().items()}

    def blind_query_sizes(self) -> set[int]:
        """Sizes of query blocks that meet no key block at all (a band with N_q > N_k, or a narrow window)."""
        seen = {b_i for b_i, _, _ in self.pairs()}
        return set(Blocks(self.q, (range(self.q.T),)).sizes()) - seen


def clamped_floor_sum(start: int, stop: int, a: int, c: int, m: int, lo: int, hi: int) -> tuple[int, int]:
    """(Σ_{i=start}^{stop−1} clamp(⌊(a·i + c)/m⌋, lo, hi), how many terms are hi) for a, m ≥ 1 and 0 ≤ lo ≤ hi.

    The floor is nondecreasing in i: it is below lo up to the first i with a·i + c ≥ lo·m,
    and at least hi from the first i with a·i + c ≥ hi·m; in between, a floor sum.
    """
    if stop <= start:
        return 0, 0
    at_lo = min(stop, max(start, ceil_div(lo * m - c, a)))  # the first i whose floor is at least lo
    at_hi = min(stop, max(at_lo, ceil_div(hi * m - c, a)))  # the first i whose floor is at least hi
    inside = floor_sum(at_hi - at_lo, m, a, a * at_lo + c)  # a·at_lo + c ≥ lo·m ≥ 0
    return lo * (at_lo - start) + inside + hi * (stop - at_hi), stop - at_hi


@dataclass(frozen=True)
class Visits(PairCounts):
    """The tiles (query block i, key block j) visited on one problem with one tiling.

    ``band``: only pairs where some query of block i sees some key of block j within the
    band (``iosim.core.problem.Band``: a sliding window, or causal) are visited; None visits
    every pair. An explicit mask is not inspected: its tiles are all visited.

    A query block's rows see one run of keys (each row's run is one key further on than
    the row before's), so block i meets one run of key blocks lo_i … hi_i, and key block
    j one run of query blocks; both boundaries are nondecreasing in the block.
    """

    q: Axis  # query rows in blocks of B_r
    k: Axis  # key rows in blocks of B_c
    band: Band | None

    @property
    def offset(self) -> int:
        """N_k − N_q: query r sees key c exactly when r + offset − left ≤ c ≤ r + offset + right."""
        return self.k.n - self.q.n

    def key_run(self, i: int) -> range:
        """The key blocks query block i meets, lo_i … hi_i (empty when it sees no key)."""
        rows = self.q.slice(i)
        if self.band is None:
            return range(self.k.T)
        first, last = self.band.keys(rows.start, rows.stop - 1, self.q.n, self.k.n)
        return range(first // self.k.B, last // self.k.B + 1) if first <= last else range(0)

    def query_run(self, j: int) -> range:
        """The query blocks that meet key block j (empty when no query sees its keys)."""
        cols = self.k.slice(j)
        if self.band is None:
            return range(self.q.T)
        first, last = self.band.queries(cols.start, cols.stop - 1, self.q.n, self.k.n)
        return range(first // self.q.B, last // self.q.B + 1) if first <= last else range(0)

    def keys_seen_by(self, i: int) -> Blocks:
        """The key blocks query block i meets."""
        return Blocks(self.k, (self.key_run(i),))

    def widest_keys(self) -> int:
        """The most keys one query block sees (N_k without a band), in closed form."""
        if self.band is None:
            return self.k.n
        q, widest = self.q, widest_run(self.band, self.q.B, self.k, self.q.full, self.offset)
        return max(widest, _keys(self.band, q.slice(q.T - 1).start, q.n - 1, q.n, self.k.n)) if q.full < q.T \
            else widest

    def queries_seeing(self, j: int) -> Blocks:
        """The query blocks that meet key block j."""
        return Blocks(self.q, (self.query_run(j),))

    def query_blocks(self) -> Blocks:
        """Every query block, each nesting the key blocks it meets (a loop with Q blocks outer)."""
        return Blocks(self.q, (range(self.q.T),), self.keys_seen_by, self._pair_counts)

    def key_blocks(self) -> Blocks:
        """The key blocks some query meets, each nesting the query blocks that meet it (a loop with K/V blocks
        outer). They are one run: every key block but those before or after every query's band; with a causal
        band or none, all of them (the last query row sees every key)."""
        return Blocks(self.k, (self._met_keys(),), self.queries_seeing, self._transposed_pair_counts)

    def blind_key_blocks(self) -> Blocks:
        """The key blocks no query meets: those ``key_blocks`` leaves out, before and after its run."""
        met = self._met_keys()
        return Blocks(self.k, tuple(r for r in (range(met.start), range(met.stop, self.k.T)) if r)
                      if met else (range(self.k.T),))

    def _met_keys(self) -> range:
        """The key blocks some query row meets: those the rows 0 … N_q − 1 see together."""
        if self.band is None:
            return range(self.k.T)
        first, last = self.band.keys(0, self.q.n - 1, self.q.n, self.k.n)
        return range(first // self.k.B, last // self.k.B + 1) if first <= last else range(0)

    def _pair_counts(self) -> dict[tuple[int, int], int]:
        """Visited tiles by (b_i, b_j), in closed form.

        Query block i meets hi_i − lo_i + 1 key blocks (see ``run_sums``); it meets the
        ragged last key block exactly when hi_i = T_c − 1.
        """
        q, k = self.q, self.k
        out: dict[tuple[int, int], int] = {}
        if self.band is None:
            add_runs(out, k, q.B, q.full * k.T, q.full)
        else:
            add_runs(out, k, q.B, *run_sums(self.band, q.B, k, q.full, self.offset))
        if q.full < q.T:
            run = self.key_run(q.T - 1)
            add_runs(out, k, q.size(q.T - 1), len(run), int(k.T - 1 in run))
        return out


def add_runs(out: dict[tuple[int, int], int], k: Axis, b_i: int, met: int, last_met: int) -> None:
    """Add to ``out`` the tiles of query blocks of b_i rows that meet ``met`` key blocks in all, ``last_met`` of them
    the last one (the ragged one, when N_k is not a multiple of B_c)."""
    k_ragged = k.size(k.T - 1) if k.n % k.B else None
    full = met - last_met if k_ragged is not None else met
    for b_j, n in ((k.B, full), (k_ragged, met - full)):
        if n:
            out[(b_i, b_j)] = out.get((b_i, b_j), 0) + n


def run_sums(band: Band, Br: int, k: Axis, count: int, shift: int) -> tuple[int, int]:
    """(Σ (hi_i − lo_i + 1), how many hi_i = T_c − 1) over ``count`` query blocks of B_r rows whose block i holds
    the rows that see keys from B_r·i + shift − left to B_r·i + B_r − 1 + shift + right (shift = N_k − N_q for the
    full query blocks of a problem), over those that see a key, in closed form.

    Clipped to [0, N_k): hi_i = min(T_c − 1, ⌊(B_r·i + B_r − 1 + shift + right)/B_c⌋) and
    lo_i = max(0, ⌊(B_r·i + shift − left)/B_c⌋), an unbounded side giving T_c − 1 or 0.
    The blocks that see a key are a run of i (the last row's band reaches key 0, the
    first row's starts before N_k); over it, Σ hi_i and Σ lo_i are two clamped floor sums.
    """
    Bc, Tc, left, right = k.B, k.T, band.left, band.right
    start = 0 if right == UNBOUNDED else min(count, max(0, ceil_div(-(Br - 1 + shift + right), Br)))
    stop = count if left == UNBOUNDED else min(count, max(start, (k.n - 1 - shift + left) // Br + 1))
    if right == UNBOUNDED:
        hi, last_met = (Tc - 1) * (stop - start), stop - start
    else:
        hi, last_met = clamped_floor_sum(start, stop, Br, Br - 1 + shift + right, Bc, 0, Tc - 1)
    lo = 0 if left == UNBOUNDED else clamped_floor_sum(start, stop, Br, shift - left, Bc, 0, Tc - 1)[0]
    return hi - lo + (stop - start), last_met


def widest_run(band: Band, Br: int, k: Axis, count: int, shift: int) -> int:
    """The most keys one of ``count`` query blocks sees, with the blocks of ``run_sums``.

    Block i sees min(N_k − 1, B_r·i + B_r − 1 + shift + right) − max(0, B_r·i + shift − left) + 1
    keys: concave in i (it rises while its first key is clipped to 0, falls once its last is
    clipped to N_k − 1), so its most is at an end or beside one of those two breakpoints.
    """
    if count <= 0:
        return 0
    i_lo = ceil_div(band.left - shift, Br)  # the first block whose first key is not clipped to 0
    i_hi = ceil_div(k.n - Br - shift - band.right, Br)  # the first whose last key is clipped to N_k − 1
    widest = 0
    for i in {0, count - 1, i_lo - 1, i_lo, i_hi - 1, i_hi}:
        if 0 <= i < count:
            first = 0 if band.left == UNBOUNDED else max(0, Br * i + shift - band.left)
            last = k.n - 1 if band.right == UNBOUNDED else min(k.n - 1, Br * i + Br - 1 + shift + band.right)
            widest = max(widest, last - first + 1)
    return widest


@dataclass(frozen=True)
class PackedVisits(PairCounts):
    """The tiles visited under a band on a problem packed by GQA group (``Problem.packed_by_group``).

    The query rows are ``group`` heads of n = N_q/group queries each, head by head: row r
    is query r mod n. A query block meets the run of key blocks that the hull of its
    queries sees: its own queries' run when it lies in one head, and every query's
    (0 … n − 1) when it holds the end of one head and the start of the next. That hull may
    hold key blocks which none of its rows sees (a narrow window, several queries), as a
    packed kernel's n_block_min … n_block_max does; the band masks them.
    """

    q: Axis  # the packed query rows, group·n, in blocks of B_r
    k: Axis
    band: Band
    group: int

    @property
    def n(self) -> int:
        """Queries per head."""
        return self.q.n // self.group

    def key_run(self, i: int) -> range:
        """The key blocks query block i meets (empty when none of its queries sees a key)."""
        lo, hi = self.band.keys(*self._queries(i), self.n, self.k.n)
        return range(lo // self.k.B, hi // self.k.B + 1) if lo <= hi else range(0)

    def keys_seen_by(self, i: int) -> Blocks:
        return Blocks(self.k, (self.key_run(i),))

    def _queries(self, i: int) -> tuple[int, int]:
        """The hull (first, last) of query block i's queries."""
        rows, n = self.q.slice(i), self.n
        first, last = rows.start, rows.stop - 1
        return (first % n, last % n) if first // n == last // n else (0, n - 1)

    def _edges(self) -> list[int]:
        """The query blocks that hold a head boundary, and the ragged last one: at most ``group`` blocks."""
        q, n = self.q, self.n
        return sorted({h * n // q.B for h in range(1, self.group) if h * n % q.B} | ({q.T - 1} if q.n % q.B else set()))

    def _inside(self, h: int) -> tuple[int, int]:
        """(how many, shift for ``run_sums``) of the query blocks that lie inside head h."""
        n, Br = self.n, self.q.B
        first, stop = ceil_div(h * n, Br), (h + 1) * n // Br
        return max(0, stop - first), self.k.n - n + first * Br - h * n

    def widest_keys(self) -> int:
        """The most keys one query block sees, in O(group) closed forms."""
        widest = max((_keys(self.band, *self._queries(i), self.n, self.k.n) for i in self._edges()), default=0)
        return max([widest] + [widest_run(self.band, self.q.B, self.k, *self._inside(h)) for h in range(self.group)])

    def _pair_counts(self) -> dict[tuple[int, int], int]:
        """Visited tiles by (b_i, b_j) in O(group) closed forms: a query block that holds a head boundary, and the
        ragged last one, one by one (at most group of them); those inside head h are the full query blocks of one
        head whose first query is B_r·⌈h·n/B_r⌉ − h·n (``run_sums``)."""
        q, k = self.q, self.k
        out: dict[tuple[int, int], int] = {}
        for i in self._edges():
            run = self.key_run(i)
            add_runs(out, k, q.size(i), len(run), int(k.T - 1 in run))
        for h in range(self.group):
            count, shift = self._inside(h)
            if count:
                add_runs(out, k, q.B, *run_sums(self.band, q.B, k, count, shift))
        return out


def _keys(band: Band, first_row: int, last_row: int, n_q: int, n_k: int) -> int:
    """How many keys the query rows first_row … last_row see together."""
    first, last = band.keys(first_row, last_row, n_q, n_k)
    return max(0, last - first + 1)


def visits(pb: Problem, tiling: Tiling, skips_hidden: bool) -> Visits | PackedVisits:
    """The tiles visited on ``pb`` with ``tiling``; ``skips_hidden`` skips those the problem's band hides (on a
    problem packed by GQA group, by the hull of each query block's queries: ``PackedVisits``)."""
    band = pb.band if skips_hidden and not pb.band.full else None
    q, k = Axis(pb.shape.n_q, tiling.Br), Axis(pb.shape.n_k, tiling.Bc)
    if band is not None and pb.packed > 1:
        return PackedVisits(q, k, band, pb.packed)
    return Visits(q, k, band)
