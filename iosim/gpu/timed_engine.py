"""The timed schedule's event loop (``iosim.gpu.timed``), compiled: a grid as arrays, and the LRU and the queue of
events in Numba; and the lockstep schedule's loop, round by round (``run_rounds``).

``flatten`` turns a ``Grid`` into arrays once: every distinct step (by identity: a step object shared by the blocks of
a head is one step) as its accesses, with the tiles' keys made dense; every block as its own head steps, a run of a
shared body and its own tail steps (a block of plain steps has them all as its head). ``run`` then makes the steps in
the timed schedule's order against an LRU of whole tiles, as ``iosim.gpu.l2.LRU`` does, and returns the DRAM bytes
read and written per tensor and the dirty bytes left: a step that is the very step run just before, all of whose
tiles stayed resident (and dirty, where it writes them), is all hits and changes nothing, so it is skipped.
tests/test_timed.py holds the counts equal to the event loop written out in Python, step by step.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from itertools import islice

import numpy as np

from iosim.gpu import _loops
from iosim.gpu.l2 import READ, WRITE, Grid, SharedSteps

# how many of a block's own steps ``flatten`` walks between calls of its ``watch``
WATCH_EVERY = 1 << 14


@dataclass(frozen=True)
class FlatGrid:
    """A grid as arrays (``flatten``)."""

    pre_offsets: np.ndarray  # block b's own first steps: pre_ids[pre_offsets[b]:pre_offsets[b + 1]]
    pre_ids: np.ndarray
    body: np.ndarray  # block b's shared run: body_ids[body_offsets[body[b]] + start[b] : … + stop[b]]; -1: none
    start: np.ndarray
    stop: np.ndarray
    body_offsets: np.ndarray
    body_ids: np.ndarray
    post_offsets: np.ndarray  # block b's own last steps
    post_ids: np.ndarray
    step_offsets: np.ndarray  # step s's accesses: keys[step_offsets[s]:step_offsets[s + 1]]
    keys: np.ndarray  # dense tile indices
    nbytes: np.ndarray
    modes: np.ndarray
    key_tensor: np.ndarray  # the tensor of each dense tile
    # an access that stands for two tiles (``paired``): per access, the second's bytes (0 for an access of one);
    # per tile (as key_tensor), the second's tensor (the tile's own where it is no pair's first)
    partner_bytes: np.ndarray
    partner_tensor: np.ndarray


def flatten(grid: Grid, watch: Callable[[int], None] | None = None) -> FlatGrid:
    """``grid``'s blocks and steps as arrays; the step objects are held while it runs, so that their identities stay
    distinct. ``watch``, where given, is called with the steps the blocks have made so far (a shared run's counted
    once per block that makes it) after each block, and every ``WATCH_EVERY`` steps within a block of its own steps:
    it may raise to stop a walk that would take too long (iosim.gpu.budget.walk_watch). A grid that builds its own
    arrays (``Grid.flat``) is not walked: ``watch`` sees its steps once."""
    if grid.flat is not None:
        flat = grid.flat()
        if watch is not None:
            watch(int(step_counts(flat)[2].sum()))
        return flat
    ids: dict[int, int] = {}
    held: list = []  # every step object seen, in id order: alive, so that no two share an id()
    bodies: dict[int, int] = {}
    body_lists: list[list[int]] = []
    held_bodies: list = []

    def step_id(step) -> int:
        found = ids.get(id(step))
        if found is None:
            found = ids[id(step)] = len(held)
            held.append(step)
        return found

    walked = 0

    def own(steps) -> list[int]:  # a block's own steps, walked in chunks that ``watch`` is shown
        nonlocal walked
        if watch is None:
            return [step_id(s) for s in steps]
        made, steps = [], iter(steps)
        while chunk := [step_id(s) for s in islice(steps, WATCH_EVERY)]:
            made += chunk
            walked += len(chunk)
            watch(walked)
        return made

    pre, post, body, start, stop = [], [], [], [], []
    for b in range(grid.blocks):
        steps = grid.steps(b)
        if isinstance(steps, SharedSteps):
            walked += steps.total
            pre.append([step_id(s) for s in steps.head])
            post.append([step_id(s) for s in steps.tail])
            index = bodies.get(id(steps.body))
            if index is None:
                index = bodies[id(steps.body)] = len(body_lists)
                held_bodies.append(steps.body)
                body_lists.append([step_id(s) for s in steps.body])
            body.append(index)
            start.append(steps.start)
            stop.append(steps.stop)
            if watch is not None:
                watch(walked)
        else:
            pre.append(own(steps))
            post.append([])
            body.append(-1)
            start.append(0)
            stop.append(0)
    raw = [access for s in held for access in s]
    tile_keys = np.array([k for k, _, _ in raw], dtype=np.int64)
    dense, inverse = np.unique(tile_keys, return_inverse=True) if raw else (np.zeros(0, np.int64), np.zeros(0, int))
    n = len(grid.tiles.tensors)
    sizes = np.array([len(s) for s in held], dtype=np.int64)
    nbytes = np.array([x for _, x, _ in raw], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    key_tensor = (dense % n).astype(np.int64)
    return FlatGrid(
        *_ragged(pre), np.array(body, dtype=np.int64), np.array(start, dtype=np.int64), np.array(stop, dtype=np.int64),
        *_ragged(body_lists), *_ragged(post), offsets, inverse.astype(np.int64), nbytes,
        np.array([m for _, _, m in raw], dtype=np.int64), key_tensor, np.zeros_like(nbytes), key_tensor.copy())


def paired(flat: FlatGrid, capacity: int) -> FlatGrid:
    """``flat`` with each pair of tiles A, B that are only ever read, each always of the same bytes, where every access
    of A is followed at once by one of B and every access of B follows one of A (K_j, V_j in a step of
    flash-swapped's), as one tile of both sizes: half the LRU's work on such grids, and the same counts, so long as
    A + B fits in ``capacity``.

    Why the counts hold. The tiles an LRU holds are always its most recent ones (one that goes straight through, too
    large, touches no entry), and A and B are adjacent in recency, B the newer. While both or neither are held, the
    two LRUs hold the same. When A is evicted and B stays, A + B + all newer than B exceeded the capacity, and while
    B stays, B + all newer only grows (a held tile keeps its bytes on a hit, and nothing newer than B goes before B):
    so the unpaired LRU's next eviction takes B first (clean: nothing is counted), after which both evict the same
    tiles; and if A is read before that, A's refill (the same bytes) does not fit beside B and what came after it,
    evicts B, and A and B both miss, as the joined tile does. A refill evicts in two stages apart, for A then for B,
    and ends on the same tiles as the joined one, since A + B fits and B's refill never evicts A. The missed bytes of
    every step are the same, so the timed schedule's order of events is too, and nothing is written to A or B, so no
    dirty byte moves. (A tile read at another size could come back smaller and fit beside B: such tiles are left
    apart.) tests/test_timed.py holds the counts of paired grids equal to the loops written out in Python."""
    keys, steps = flat.keys, np.diff(flat.step_offsets)
    n_keys = flat.key_tensor.shape[0]
    if keys.shape[0] < 2:
        return flat
    begins = flat.step_offsets[:-1][steps > 0]  # the first and last access of every step that makes one
    ends = flat.step_offsets[1:][steps > 0] - 1
    after, before = np.full_like(keys, -1), np.full_like(keys, -1)
    after[:-1], before[1:] = keys[1:], keys[:-1]
    after[ends], before[begins] = -1, -1

    def same(values):  # the value every access of a tile has (each tile has one at least), or -2 where they differ
        low, high = np.full(n_keys, np.iinfo(np.int64).max), np.full(n_keys, np.iinfo(np.int64).min)
        np.minimum.at(low, keys, values)
        np.maximum.at(high, keys, values)
        return np.where(low == high, low, -2)

    plain = (same(flat.modes) == READ) & (same(flat.nbytes) >= 0)  # only read, and always of the same bytes
    second = same(after)  # the tile read right after each access of a tile, where it is always the same
    first = np.arange(n_keys)
    ok = (second >= 0) & plain
    ok[ok] &= (second[ok] != first[ok]) & plain[second[ok]] & (same(before)[second[ok]] == first[ok])
    ok[second[ok]] = False  # a pair's second starts no pair of its own (in a run of three, only the first two join)
    lead = np.flatnonzero(ok[keys])  # every access of a pair's first tile, its second right after
    joined = flat.nbytes[lead] + flat.nbytes[lead + 1]
    too_big = np.zeros(n_keys, bool)
    too_big[keys[lead[joined > capacity]]] = True
    if too_big.any():  # a pair the L2 cannot hold goes past it where its tiles alone would not: left apart
        ok &= ~too_big
        lead = np.flatnonzero(ok[keys])
    if not lead.size:
        return flat
    kept = np.ones(keys.shape[0], bool)
    kept[lead + 1] = False
    nbytes, partner = flat.nbytes.copy(), np.zeros_like(flat.nbytes)
    nbytes[lead] += flat.nbytes[lead + 1]
    partner[lead] = flat.nbytes[lead + 1]
    partner_tensor = flat.key_tensor.copy()
    partner_tensor[keys[lead]] = flat.key_tensor[keys[lead + 1]]
    offsets = np.concatenate(([0], np.cumsum(kept)))[flat.step_offsets]
    return replace(flat, step_offsets=offsets.astype(np.int64), keys=keys[kept], nbytes=nbytes[kept],
                   modes=flat.modes[kept], partner_bytes=partner[kept], partner_tensor=partner_tensor)


def _ragged(lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Lists as (offsets, concatenation)."""
    offsets = np.concatenate(([0], np.cumsum([len(x) for x in lists]))).astype(np.int64)
    flat = np.array([v for x in lists for v in x], dtype=np.int64)
    return offsets, flat


def step_counts(flat: FlatGrid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each block's own first steps, steps of its shared run, and steps in all."""
    n_pre = np.diff(flat.pre_offsets)
    n_body = np.where(flat.body >= 0, flat.stop - flat.start, 0)
    return n_pre, n_body, n_pre + n_body + np.diff(flat.post_offsets)


def _arrays(flat: FlatGrid) -> tuple:
    """The compiled loops' first arguments: the blocks' steps and the steps' accesses."""
    n_pre, n_body, n_steps = step_counts(flat)
    return (flat.pre_offsets, flat.pre_ids, n_pre, flat.body, flat.start, n_body, flat.body_offsets, flat.body_ids,
            flat.post_offsets, flat.post_ids, n_steps, flat.step_offsets, flat.keys, flat.nbytes, flat.modes,
            flat.key_tensor, flat.partner_bytes, flat.partner_tensor)


def run(flat: FlatGrid, n_tensors: int, capacity: int, concurrent: int, sm_speed: np.ndarray,
        block_speed: np.ndarray, penalty: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Reads, writes and dirty bytes at the end, per tensor, of the timed schedule on ``flat``."""
    return run_each(flat, n_tensors, capacity, concurrent, [(sm_speed, block_speed, penalty)])[0]


def run_each(flat: FlatGrid, n_tensors: int, capacity: int, concurrent: int,
             speeds: list[tuple[np.ndarray, np.ndarray, float]]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``run`` at each of ``speeds`` (the SMs' and blocks' speed factors and the penalty): ``flat`` paired once, and
    the loops side by side in threads, since the compiled loop runs without the GIL."""
    arrays = _arrays(paired(flat, capacity))

    def one(speed: tuple[np.ndarray, np.ndarray, float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return _loops.events(*arrays, n_tensors, capacity, concurrent, *speed, READ, WRITE)

    if len(speeds) == 1:
        return [one(speeds[0])]
    with ThreadPoolExecutor(len(speeds)) as pool:
        return list(pool.map(one, speeds))


def run_rounds(flat: FlatGrid, n_tensors: int, capacity: int, concurrent: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The same of the lockstep schedule (``run`` without spread or penalty), round by round, without a queue."""
    return _loops.rounds(*_arrays(paired(flat, capacity)), n_tensors, capacity, concurrent, READ, WRITE)
