"""The stack-distance counts of a grid of equal blocks, equal to ``iosim.gpu.schedule.simulate``'s where they apply.

``lockstep`` counts a grid whose blocks make the same steps on tiles of their own (``Grid.uniform``: flash,
causal or not, without GQA) from one block's steps, about 30 times faster than the simulation; the kernels'
closed forms (``iosim.gpu.grids``) use ``lockstep_hits``. ``iosim.gpu.dram`` picks the fastest path that applies.

Both rest on the stack-distance rule of ``iosim.gpu.l2`` and on blocks that run in lockstep: when the blocks of a
wave have equal steps, an access by the block at position p of w has stack distance a + b·p, and
``lockstep_hits`` counts the positions where it fits.
"""

from __future__ import annotations

import numpy as np

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
    capacity or a tile once written is later only read (then ask ``simulate``).

    Equal blocks run in waves in lockstep (the last wave holds batch·heads mod W), so the stack distance of an
    access by the block at position p of a wave of w is own + (w−1−p)·F1 + p·F2: own, the distinct bytes its
    block touched since the tile's last use (itself included), F1 and F2 those one block touches over the steps
    from the last use's to the one before this, and one step later (the blocks after p and before it). A
    Fenwick tree over the block's accesses, holding each tile's bytes at its latest use, gives all three.
    """
    trace = [(key, nbytes, mode, r) for r, step in enumerate(grid.steps(0)) for key, nbytes, mode in step]
    n, cap = len(trace), config.capacity
    if any(nbytes > cap for _, nbytes, _, _ in trace):
        return None
    start = [0] * (trace[-1][3] + 2 if trace else 1)  # first access of each step, and n past the last
    for t in range(n - 1, -1, -1):
        start[trace[t][3]] = t
    start[-1] = n
    tree = [0] * (n + 1)

    def add(t, x):
        t += 1
        while t <= n:
            tree[t] += x
            t += t & -t

    def below(t):  # bytes held at accesses 0..t−1
        total = 0
        while t > 0:
            total += tree[t]
            t -= t & -t
        return total

    latest: dict[int, int] = {}
    prev, own, F1, F2 = [-1] * n, [0] * n, [0] * n, [0] * n
    held = 0
    for r in range(len(start) - 1):
        for t in range(start[r], start[r + 1]):  # steps r' .. r−1, before step r
            p = prev[t] = latest.get(trace[t][0], -1)
            if p >= 0:
                F1[t] = held - below(start[trace[p][3]])
        for t in range(start[r], start[r + 1]):
            key, nbytes, p = trace[t][0], trace[t][1], prev[t]
            if p >= 0:
                add(p, -nbytes)
            add(t, nbytes)
            held += 0 if p >= 0 else nbytes
            latest[key] = t
            if p >= 0:
                own[t] = held - below(p + 1)
        for t in range(start[r], start[r + 1]):  # steps r' + 1 .. r
            if prev[t] >= 0:
                F2[t] = held - below(start[trace[prev[t]][3] + 1])
    # at the end: the bytes touched after each tile's last use, itself included (own), in its step and after (F1)
    after, seen, end, end_F1, end_F2 = 0, set(), [0] * n, [0] * n, [0] * n
    step_after, last_use = [0] * (len(start) - 1), set()
    for t in range(n - 1, -1, -1):
        if trace[t][0] not in seen:
            seen.add(trace[t][0])
            last_use.add(t)
            after += trace[t][1]
            end[t] = after
        step_after[trace[t][3]] = after  # set last at the step's first access: the step and all after it
    for t in range(n):
        r = trace[t][3]
        end_F1[t], end_F2[t] = step_after[r], step_after[r + 1] if r + 1 < len(step_after) else 0
    written, first_write = set(), [False] * n  # once written, a tile must be written at every later use
    for t, (key, _, mode, _) in enumerate(trace):
        if key in written and not mode & WRITE:
            return None
        if mode & WRITE and key not in written:
            written.add(key)
            first_write[t] = True
    k = len(grid.tiles.tensors)
    reads, writes, dirty = (np.zeros(k, dtype=np.int64) for _ in range(3))
    W = config.concurrent
    waves = [W] * (grid.blocks // W) + ([grid.blocks % W] if grid.blocks % W else [])
    own, F1, F2 = (np.array(x, dtype=np.int64) for x in (own, F1, F2))
    fresh = np.array(prev) < 0
    size = np.array([x[1] for x in trace], dtype=np.int64)
    tensor = np.array([x[0] % k for x in trace])
    is_read = np.array([bool(x[2] & READ) for x in trace])
    is_write = np.array([bool(x[2] & WRITE) for x in trace])
    last = np.array([t in last_use for t in range(n)]) & is_write  # a written tile's last use: dirty from there
    first = np.array(first_write)
    for w in set(waves):  # a miss reads; a write starts a dirty copy at the tile's first write and at a miss
        misses = np.where(fresh, w, w - lockstep_hits(own + (w - 1) * F1, F2 - F1, w, cap))
        np.add.at(reads, tensor[is_read], (misses * size * waves.count(w))[is_read])
        episodes = np.where(first, w, misses) * size * waves.count(w)
        np.add.at(writes, tensor[is_write], episodes[is_write])
    later = 0
    for w in reversed(waves):  # dirty at the end: from the last wave back, while a later one leaves room
        if later >= cap:
            break
        keep = lockstep_hits(np.array(end) + later + (w - 1) * np.array(end_F1), np.array(end_F2) - np.array(end_F1),
                             w, cap)
        np.add.at(dirty, tensor[last], (keep * size)[last])
        later += w * after
    return DramCounts(tuple(DramTensor(name, int(reads[i]), int(writes[i] - dirty[i]), int(dirty[i]))
                            for i, name in enumerate(grid.tiles.tensors)), config.capacity, config.concurrent)
