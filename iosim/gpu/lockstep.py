"""The stack-distance counts of a grid of equal blocks, equal to ``iosim.gpu.schedule.simulate``'s where they apply.

``lockstep`` counts a grid whose blocks make the same steps on tiles of their own (``Grid.uniform``: flash,
causal or not, without GQA) from one block's steps, their stack distances compiled (``iosim.gpu._loops.stack``);
the kernels' closed forms (``iosim.gpu.grids``) use ``lockstep_hits``. ``iosim.gpu.dram`` picks the fastest path that
applies.

Both rest on the stack-distance rule of ``iosim.gpu.l2`` and on blocks that run in lockstep: when the blocks of a
wave have equal steps, an access by the block at position p of w has stack distance a + b·p, and
``lockstep_hits`` counts the positions where it fits.
"""

from __future__ import annotations

from itertools import chain

import numpy as np

from iosim.gpu import _loops
from iosim.gpu.l2 import READ, WRITE, DramCounts, DramTensor, Grid, L2Config


def lockstep_hits(a: np.ndarray, b: np.ndarray, w: int, capacity: int) -> np.ndarray:
    """How many p in 0..w−1 have a + b·p <= ``capacity``, elementwise: the hits of an access whose stack
    distance, for the block at position p of w running in lockstep, is a + b·p."""
    a, b = np.broadcast_arrays(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))
    slack = capacity - a
    safe = np.where(b == 0, 1, np.abs(b))
    up = np.clip(slack // safe + 1, 0, w)  # b > 0: p <= slack / b
    down = np.clip(w - np.maximum(0, -(slack // safe)), 0, w)  # b < 0: p >= −slack / |b|
    return np.where(b > 0, up, np.where(b < 0, down, np.where(slack >= 0, w, 0)))


def lockstep(grid: Grid, config: L2Config) -> DramCounts | None:
    """``simulate``'s counts for a ``uniform`` grid, from one block's steps; None where a tile exceeds the
    capacity, a step touches a tile twice, a tile is touched at two sizes or a tile once written is later only read
    (then ask ``simulate``).

    Equal blocks run in waves in lockstep (the last wave holds batch·heads mod W), so the stack distance of an
    access by the block at position p of a wave of w is own + (w−1−p)·F1 + p·F2: own, the distinct bytes its
    block touched since the tile's last use (itself included), F1 and F2 those one block touches over the steps
    from the last use's to the one before this, and one step later (the blocks after p and before it). A
    Fenwick tree over the block's accesses, holding each tile's bytes at its latest use, gives all three.
    """
    lengths: list[int] = []  # each step's accesses, noted as the steps stream past (one block's may be millions)

    def noted(step):
        lengths.append(len(step))
        return step

    keys, size, modes = np.fromiter(chain.from_iterable(chain.from_iterable(map(noted, grid.steps(0)))),
                                    dtype=np.int64).reshape(-1, 3).T
    step_of = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    if (size > config.capacity).any():
        return None
    dense, inverse = np.unique(keys, return_inverse=True)
    ok, prev, own, F1, F2, last_use, end, end_F1, end_F2, first = _loops.stack(
        inverse.astype(np.int64).reshape(-1), np.ascontiguousarray(size), np.ascontiguousarray(modes), step_of,
        dense.shape[0], WRITE)
    if not ok:  # each tile once a step and always of its bytes; once written, written at every later use
        return None
    cap = config.capacity
    k = len(grid.tiles.tensors)
    reads, writes, dirty = (np.zeros(k, dtype=np.int64) for _ in range(3))
    W = config.concurrent
    waves = [W] * (grid.blocks // W) + ([grid.blocks % W] if grid.blocks % W else [])
    fresh = prev < 0
    tensor = keys % k
    is_read, is_write = (modes & READ) != 0, (modes & WRITE) != 0
    last = last_use & is_write  # a written tile's last use: dirty from there
    after = int(size[last_use].sum())  # the bytes of every tile the block touches
    for w in set(waves):  # a miss reads; a write starts a dirty copy at the tile's first write and at a miss
        misses = np.where(fresh, w, w - lockstep_hits(own + (w - 1) * F1, F2 - F1, w, cap))
        np.add.at(reads, tensor[is_read], (misses * size * waves.count(w))[is_read])
        episodes = np.where(first, w, misses) * size * waves.count(w)
        np.add.at(writes, tensor[is_write], episodes[is_write])
    later = 0
    for w in reversed(waves):  # dirty at the end: from the last wave back, while a later one leaves room
        if later >= cap:
            break
        keep = lockstep_hits(end + later + (w - 1) * end_F1, end_F2 - end_F1, w, cap)
        np.add.at(dirty, tensor[last], (keep * size)[last])
        later += w * after
    return DramCounts(tuple(DramTensor(name, int(reads[i]), int(writes[i] - dirty[i]), int(dirty[i]))
                            for i, name in enumerate(grid.tiles.tensors)), config.capacity, config.concurrent)
