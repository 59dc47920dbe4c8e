"""The closed form of a grid of heads in lockstep waves: the DRAM bytes of ``iosim.gpu.schedule.simulate`` on it,
without running it.

A ``HeadWaves`` grid has H heads of T blocks each, block b = h·T + t (t fastest), and every block makes the same n
steps: at step r (0 … n − 1) the tiles ``shared[r]`` of its head (one set for all T blocks of the head), with its own
tiles ``head[t]`` before them at step 0 and its own ``tail[t]`` after them at step n − 1. FlashAttention-2's forward
without a mask is one (a query block reads Q_i, then K_j, V_j of its head at each step, and writes O_i, lse_i), and
so is its backward's main kernel (a key block reads K_j, V_j, then Q_i, dO_i, lse_i, D_i and adds into dQ_i at each
step, and writes dK_j, dV_j). Blocks run in waves of W = ``concurrent``, each wave's n rounds after the last one's.

The stack-distance rule of ``iosim.gpu.l2`` gives every count:

- **In a wave** the blocks of a head touch ``shared[r]`` one after another in round r, and all but the first hit
  where a block's own tiles and a step fit together (``fits``; else there is no closed form).
- **Across a wave boundary** only the head whose blocks cross it (the last head of wave w, the first of w + 1) meets
  ``shared[r]`` again. Between its two uses it sees, besides ``shared[r]`` itself: the steps after r of every head of
  w, the tails of w's blocks (only the last block's at r = n − 1), the steps before r of every head of w + 1, and the
  heads of w + 1's blocks (only the first block's at r = 0). Where that exceeds the capacity the tiles are evicted,
  written back if dirty, and read again.
- **At the end** a tile is dirty in the L2 when the distinct bytes touched after its last use, itself and what follows
  it in its step included, fit. Only the last waves' tiles can; the work is over those alone.

Every tile's size is in bytes rounded to sectors, and its mode as ``Tiles.access`` gives it (a write of part of a
sector reads first). tests/test_head_waves.py holds the counts equal to the simulation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from iosim.gpu.l2 import READ, WRITE, DramForm, Step, Tiles

Tile = tuple[str, int, int]  # (tensor, bytes rounded to sectors, READ, WRITE or READ_WRITE)
# a grid lists each block of a head and each step; past this many together, its kernels give no form (the count is
# then the simulation's, under its time budget): a list of millions takes seconds to build
MOST_LISTED = 1 << 20


@dataclass(frozen=True)
class HeadWaves:
    """H heads of T blocks, each block making n steps: ``head[t]`` and ``tail[t]`` are block t's own tiles (of every
    head: t < T), ``shared[r]`` the head's tiles at step r (r < n), in the order a step touches them."""

    heads: int
    head: Sequence[tuple[Tile, ...]]
    shared: Sequence[tuple[Tile, ...]]
    tail: Sequence[tuple[Tile, ...]]

    @property
    def per_head(self) -> int:
        return len(self.head)


def of_accesses(tiles: Tiles, heads: int, head: Sequence[Step], shared: Sequence[Step], tail: Sequence[Step]
                ) -> HeadWaves:
    """A ``HeadWaves`` from the accesses of one head's blocks (``Tiles.access``'s keys named by their tensor)."""
    named = lambda steps: [tuple((tiles.tensor(k), x, mode) for k, x, mode in step) for step in steps]  # noqa: E731
    return HeadWaves(heads, named(head), named(shared), named(tail))


def _bytes(tiles: Sequence[tuple[Tile, ...]]) -> np.ndarray:
    return np.array([sum(x for _, x, _ in ts) for ts in tiles], dtype=np.int64)


def _add(table: dict[str, int], tensor: str, nbytes: int) -> None:
    table[tensor] = table.get(tensor, 0) + int(nbytes)


class _Blocks:
    """Sums over ranges of blocks of a per-block size that repeats with each head (``size[t]``)."""

    def __init__(self, size: np.ndarray):
        self.T, self.whole = len(size), int(size.sum())
        self.prefix = np.concatenate(([0], np.cumsum(size)))

    def upto(self, b):
        """Σ size over blocks 0 … b − 1."""
        b = np.asarray(b, dtype=np.int64)
        return b // self.T * self.whole + self.prefix[b % self.T]

    def over(self, start, stop):
        """Σ size over blocks start … stop − 1."""
        return self.upto(stop) - self.upto(start)


def dram(grid: HeadWaves, capacity: int, concurrent: int) -> DramForm | None:
    """``simulate``'s counts of ``grid`` with ``concurrent`` blocks at once in an L2 of ``capacity`` bytes, in lockstep;
    None where its blocks' own tiles are written or a step does not fit beside them (the module docstring)."""
    H, T, n, W = grid.heads, grid.per_head, len(grid.shared), concurrent
    if H < 1 or T < 1 or n < 1 or any(mode & WRITE for ts in grid.head for _, _, mode in ts):
        return None
    a, s, z = _bytes(grid.head), _bytes(grid.shared), _bytes(grid.tail)
    if int(a.max() + s.max() + z.max()) > capacity:  # the blocks of a head in one round may not share a step
        return None
    B = H * T
    heads_of = lambda start, stop: np.where(stop > start, (stop - 1) // T - start // T + 1, 0)  # noqa: E731
    A, Z = _Blocks(a), _Blocks(z)
    S, P = int(s.sum()), np.concatenate(([0], np.cumsum(s)))
    reads: dict[str, int] = {}
    written: dict[str, int] = {}

    def touch(tiles: tuple[Tile, ...], times: int) -> None:  # a miss of each tile: read where its mode reads, and
        for tensor, x, mode in tiles:  # written back where it writes (dirty until evicted or the end)
            if mode & READ:
                _add(reads, tensor, times * x)
            if mode & WRITE:
                _add(written, tensor, times * x)

    for steps in (grid.head, grid.shared, grid.tail):  # each tile once
        for tiles, where in _alike(steps).items():
            touch(tiles, H * len(where))
    starts = np.arange(0, B, W, dtype=np.int64)
    ends = np.minimum(starts + W, B)
    # the boundaries a head crosses: wave w's last block and w + 1's first are of one head
    w = np.flatnonzero((ends[:-1] - 1) // T == ends[:-1] // T)
    if len(w):
        nxt = w + 1
        rows = np.stack([heads_of(starts[w], ends[w]), heads_of(starts[nxt], ends[nxt]), Z.over(starts[w], ends[w]),
                         A.over(starts[nxt], ends[nxt]), z[(ends[w] - 1) % T], a[starts[nxt] % T]], axis=1)
        kinds, count = np.unique(rows, axis=0, return_counts=True)
        r = np.arange(n)
        missed = np.zeros(n, dtype=np.int64)  # how many boundaries evict step r's tiles between their two uses
        for (h_w, h_next, z_w, a_next, z_last, a_first), times in zip(kinds, count):
            between = (s + h_w * (S - P[1:]) + h_next * P[:-1] + np.where(r < n - 1, z_w, z_last)
                       + np.where(r >= 1, a_next, a_first))
            missed += times * (between > capacity)
        for tiles, where in _alike(grid.shared).items():
            touch(tiles, int(missed[where].sum()))
    dirty = _dirty_at_end(grid, capacity, W, (s, z), (A, Z), (starts, ends), heads_of)
    return DramForm(reads=reads, written=written, dirty_at_end=dirty)


def _dirty_at_end(grid: HeadWaves, capacity: int, W: int, sizes, sums, waves, heads_of) -> dict[str, int]:
    """The written tiles still in the L2 at the end: those whose last use has at most ``capacity`` distinct bytes
    after it, itself included. A wave's blocks can hold one only where the waves after it touch less than that."""
    (s, z), (A, Z), (starts, ends) = sizes, sums, waves
    H, T, n = grid.heads, grid.per_head, len(grid.shared)
    B, S = H * T, int(s.sum())
    later_heads = heads_of(ends, np.full_like(ends, B))
    later = A.over(ends, B) + Z.over(ends, B) + later_heads * S  # every tile of the waves after each wave
    crosses = (ends < B) & ((ends - 1) // T == ends // T)  # its last head goes on into the next wave
    closing = heads_of(starts, ends) - crosses  # heads whose last blocks are in the wave
    dirty: dict[str, int] = {}

    def count(tiles: tuple[Tile, ...], after: np.ndarray) -> None:  # ``after``: what follows the tiles' step part
        for k, (tensor, x, mode) in enumerate(tiles):
            if mode & WRITE:
                rest = sum(y for _, y, _ in tiles[k:])
                _add(dirty, tensor, x * int(np.count_nonzero(rest + after <= capacity)))

    # a block's tail, at round n − 1 of its wave: the tails and last steps of the blocks after it in the wave (the
    # steps of a head that goes on counted with the later waves; their heads too where n = 1), then the later waves
    late = np.flatnonzero(later <= capacity)  # waves whose tiles may still be in the L2 at the end
    if len(late):
        b = np.concatenate([np.arange(starts[w], ends[w]) for w in late])
        wave = b // W
        heads_after = heads_of(b + 1, ends[wave]) - crosses[wave] * (b + 1 < ends[wave])
        after = Z.over(b + 1, ends[wave]) + s[n - 1] * heads_after + later[wave] + (n == 1) * A.over(b + 1, ends[wave])
        for tiles, ts in _alike(grid.tail).items():
            count(tiles, after[np.isin(b % T, ts)])
    # a head's shared tiles, at round r of its last wave, by its last block: what follows in that round, the later
    # rounds of the wave's heads that end there, the tails of the wave, then the later waves
    last = np.arange(1, H + 1, dtype=np.int64) * T - 1
    last = last[later[last // W] <= capacity]
    if not len(last) or not any(mode & WRITE for ts in grid.shared for _, _, mode in ts):
        return dirty
    wave = last // W
    heads_after = heads_of(last + 1, ends[wave]) - crosses[wave] * (last + 1 < ends[wave])
    suffix = np.concatenate((np.cumsum(s[::-1])[::-1][1:], [0]))  # Σ s over the rounds after r
    r = np.arange(n)[:, None]
    after = (s[:, None] * heads_after + (r == 0) * A.over(last + 1, ends[wave])
             + np.where(r == n - 1, z[T - 1] + Z.over(last + 1, ends[wave]), Z.over(starts[wave], ends[wave]))
             + suffix[:, None] * closing[wave] + later[wave])  # [round, head]
    for tiles, rounds in _alike(grid.shared).items():
        count(tiles, after[rounds].ravel())
    return dirty


def _alike(steps: Sequence[tuple[Tile, ...]]) -> dict[tuple[Tile, ...], list[int]]:
    """The indices of equal steps (a block's tail, a head's step), grouped: the full ones and the ragged last."""
    groups: dict[tuple[Tile, ...], list[int]] = {}
    for i, tiles in enumerate(steps):
        groups.setdefault(tuple(tiles), []).append(i)
    return groups
