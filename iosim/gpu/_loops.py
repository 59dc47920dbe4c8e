"""The DRAM level's compiled loops: the timed schedule's event loop (``iosim.gpu.timed_engine.run`` calls it), a
queue of (issue time, slot) kept sorted and an LRU of whole tiles as a doubly linked list over dense tile indices,
making each step as ``iosim.gpu.l2.LRU.step`` does; the lockstep schedule's loop, round by round (``run_rounds``);
and the stack distances of one block's accesses, over a Fenwick tree, from which ``iosim.gpu.lockstep.lockstep``
counts a grid of equal blocks (``stack``).

What a step touches sits together, since the loops wait on memory, not arithmetic: a tile's links, size and state
are one record of ``RECORD`` words (32 bytes), a running slot keeps where its block's shared run lies,
whether a step holds is asked only when it comes again at once, and K_j and V_j, read together at every step, are one
tile (``iosim.gpu.timed_engine.paired``). On 2026-12-02 (this project's 2-core container, best of 3 beside the loops
before) that took the causal lockstep row of 16 heads of N = 65,536 (67 million steps) from 2.17 s to 1.08 s, and the
timed row of 4 heads of N = 131,072 (134 million) from 5.37 s to 3.35 s. Of those, 2.6 s are the events' order alone
(the loop with its L2 work taken out); at zero spread, where the blocks step in slot order, the whole loop takes 1.0 s
(``timed_floor`` of ``python -m experiments.speed --only grid``).

The functions are written in plain Python and compiled at the first count that needs one, so that importing iosim
does not import Numba (0.2 s of every command's start-up).
"""

from __future__ import annotations

from functools import cache
from threading import Lock

import numpy as np

# a tile's record in the LRU: its less and more recent neighbours' records, its bytes, and its state
PREV, NEXT, SIZE, STATE = range(4)
RECORD = 4
RESIDENT, DIRTY = 1, 2  # STATE's bits
UNKNOWN = -1  # whether the step just run holds, not yet asked


def events(*args):
    """The timed schedule's reads, writes and dirty bytes per tensor (``_events``' arguments), compiled once."""
    return _compiled()["_events"](*args)


def rounds(*args):
    """The lockstep schedule's reads, writes and dirty bytes per tensor (``_rounds``' arguments), compiled once."""
    return _compiled()["_rounds"](*args)


def stack(*args):
    """One block's stack distances (``_stack``' arguments and results), compiled once."""
    return _compiled()["_stack"](*args)


_COMPILING = Lock()  # the band's threads (iosim.gpu.timed_engine.run_each) may ask for the loops at once: one compiles
# them


def _compiled() -> dict:
    with _COMPILING:
        return _compile()


@cache
def _compile() -> dict:
    """``_events``, ``_rounds`` and ``_stack`` compiled with Numba, the helpers they call first: each module-level name
    is rebound to its compiled function, so that the compiled callers find compiled callees."""
    from numba import njit  # third-party, deferred: only a count that runs one of the loops needs it

    module = globals()
    for name in ("_lru", "_left", "_add", "_below", "_stack"):
        module[name] = njit(cache=True)(module[name])
    # at every step: inlined into the loops, not called. The loops call nothing at their steps: a call there, even one
    # rarely taken, made Numba count references to the arrays at every step (2.7 times slower on a row, 2026-12-02)
    for name in ("_queue", "_access", "_holds", "_body"):
        module[name] = njit(cache=True, inline="always")(module[name])
    # without the GIL: the timed schedule's band runs its three loops side by side
    module["_events"] = njit(cache=True, nogil=True)(module["_events"])
    module["_rounds"] = njit(cache=True)(module["_rounds"])
    return module


def _queue(times, slots, head, n, t, s):
    """Insert (t, s) into the queue ``times[head:head + n]`` (with ``slots``), kept sorted by (time, slot), from its
    end: a step's next event is almost always among the latest, so this moves a few entries where a binary heap
    compared a dozen. The buffer holds twice the slots; the queue moves to its start when it reaches the end. The new
    head and size."""
    if head + n == times.shape[0]:
        for i in range(n):
            times[i], slots[i] = times[head + i], slots[head + i]
        head = 0
    at = head + n
    while at > head and (t < times[at - 1] or (t == times[at - 1] and s < slots[at - 1])):
        times[at], slots[at] = times[at - 1], slots[at - 1]
        at -= 1
    times[at], slots[at] = t, s
    return head, n + 1


def _access(step, step_offsets, keys, nbytes, modes, key_tensor, partner_bytes, partner_tensor, capacity, lru, reads,
            writes, used, READ, WRITE):
    """Make ``step`` against the LRU holding ``used`` bytes: each tile to the most recent end, a miss read where it
    reads and the least recent evicted (written back if dirty) until it fits. The bytes it missed, and those held.
    ``lru`` holds a record per tile and, last, the list's head and tail (``_lru``); an access of a pair of tiles
    (``iosim.gpu.timed_engine.paired``) reads the second's bytes into its tensor."""
    end = RECORD * key_tensor.shape[0]  # the list's head and tail: its NEXT the least recent, its PREV the most
    missed = 0
    for a in range(step_offsets[step], step_offsets[step + 1]):
        k, x, mode = keys[a], nbytes[a], modes[a]
        r = RECORD * k
        if lru[r + STATE] & RESIDENT:  # out of its place in the list
            before, after = lru[r + PREV], lru[r + NEXT]
            lru[before + NEXT], lru[after + PREV] = after, before
        else:
            if mode & READ:
                reads[key_tensor[k]] += x - partner_bytes[a]
                reads[partner_tensor[k]] += partner_bytes[a]
                missed += x
            if x > capacity:  # never fits: straight through
                if mode & WRITE:
                    writes[key_tensor[k]] += x
                continue
            used += x
            while used > capacity:  # evict the least recent
                old = lru[end + NEXT]
                lru[end + NEXT], lru[lru[old + NEXT] + PREV] = lru[old + NEXT], end
                used -= lru[old + SIZE]
                if lru[old + STATE] & DIRTY:
                    writes[key_tensor[old // RECORD]] += lru[old + SIZE]
                lru[old + STATE] = 0
            lru[r + STATE], lru[r + SIZE] = RESIDENT, x
        newest = lru[end + PREV]  # to the most recent end
        lru[r + PREV], lru[r + NEXT] = newest, end
        lru[newest + NEXT], lru[end + PREV] = r, r
        if mode & WRITE:
            lru[r + STATE] |= DIRTY
    return missed, used


def _holds(step, step_offsets, keys, modes, lru, WRITE):
    """Whether ``step`` again at once changes nothing: its tiles all resident, and dirty where it writes them."""
    for a in range(step_offsets[step], step_offsets[step + 1]):
        state = lru[RECORD * keys[a] + STATE]
        if not state & RESIDENT or (modes[a] & WRITE and not state & DIRTY):
            return False
    return True


def _body(b, n_pre, body, start, n_body, body_offsets):
    """Block b's shared run as a running slot keeps it: its steps t in [first, stop) are body_ids[base + t]."""
    return n_pre[b], n_pre[b] + n_body[b], body_offsets[max(body[b], 0)] + start[b] - n_pre[b]


def _lru(n_keys):
    """An empty LRU: a record per tile (``RECORD`` words: ``PREV``, ``NEXT``, ``SIZE``, ``STATE``), then the list's
    head and tail, whose NEXT is the least recent record and PREV the most recent (itself while empty)."""
    lru = np.zeros(RECORD * (n_keys + 1), dtype=np.int64)
    lru[RECORD * n_keys + PREV] = lru[RECORD * n_keys + NEXT] = RECORD * n_keys
    return lru


def _left(key_tensor, n_tensors, lru):
    """The dirty bytes still held at the end, per tensor."""
    left = np.zeros(n_tensors, dtype=np.int64)
    for k in range(key_tensor.shape[0]):
        if lru[RECORD * k + STATE] == RESIDENT | DIRTY:
            left[key_tensor[k]] += lru[RECORD * k + SIZE]
    return left


def _events(pre_offsets, pre_ids, n_pre, body, start, n_body, body_offsets, body_ids, post_offsets, post_ids, n_steps,
            step_offsets, keys, nbytes, modes, key_tensor, partner_bytes, partner_tensor, n_tensors, capacity,
            concurrent, sm_speed, block_speed, penalty, READ, WRITE):
    blocks = body.shape[0]
    sms = sm_speed.shape[0]
    lru = _lru(key_tensor.shape[0])
    reads, writes = np.zeros(n_tensors, dtype=np.int64), np.zeros(n_tensors, dtype=np.int64)
    used = 0
    # the running blocks: a slot's block, its next step, its speed and its shared run; the queue of their next steps'
    # times
    slot_block = np.zeros(concurrent, dtype=np.int64)
    slot_t = np.zeros(concurrent, dtype=np.int64)
    slot_speed = np.zeros(concurrent, dtype=np.float64)
    first = np.zeros(concurrent, dtype=np.int64)
    stop, base = np.zeros_like(first), np.zeros_like(first)
    times = np.zeros(2 * concurrent, dtype=np.float64)
    queued = np.zeros(2 * concurrent, dtype=np.int64)
    head, n = 0, 0
    pending = min(concurrent, blocks)
    last, fits = -1, UNKNOWN
    for slot in range(pending):  # the first blocks start at 0 in slot order; one without steps leaves its slot empty
        if n_steps[slot] > 0:
            slot_block[slot], slot_t[slot], slot_speed[slot] = slot, 0, sm_speed[slot % sms] * block_speed[slot]
            first[slot], stop[slot], base[slot] = _body(slot, n_pre, body, start, n_body, body_offsets)
            head, n = _queue(times, queued, head, n, 0.0, slot)
    while n > 0:
        at, slot = times[head], queued[head]
        head, n = head + 1, n - 1
        b, t = slot_block[slot], slot_t[slot]
        if first[slot] <= t < stop[slot]:  # its shared run, its own first steps, its own last
            step = body_ids[base[slot] + t]
        elif t < first[slot]:
            step = pre_ids[pre_offsets[b] + t]
        else:
            step = post_ids[post_offsets[b] + t - stop[slot]]
        if step == last and fits == UNKNOWN:
            fits = _holds(step, step_offsets, keys, modes, lru, WRITE)
        missed = 0
        if step != last or not fits:
            missed, used = _access(step, step_offsets, keys, nbytes, modes, key_tensor, partner_bytes,
                                   partner_tensor, capacity, lru, reads, writes, used, READ, WRITE)
            last, fits = step, UNKNOWN
        done = at + slot_speed[slot] + missed * penalty
        t += 1
        if t < n_steps[b]:
            slot_t[slot] = t
            head, n = _queue(times, queued, head, n, done, slot)
        elif pending < blocks:  # the next block in grid order takes the slot at the end of this one, or leaves it
            if n_steps[pending] > 0:  # empty if it has no steps
                slot_block[slot], slot_t[slot] = pending, 0
                slot_speed[slot] = sm_speed[slot % sms] * block_speed[pending]
                first[slot], stop[slot], base[slot] = _body(pending, n_pre, body, start, n_body, body_offsets)
                head, n = _queue(times, queued, head, n, done, slot)
            pending += 1
    return reads, writes, _left(key_tensor, n_tensors, lru)


def _rounds(pre_offsets, pre_ids, n_pre, body, start, n_body, body_offsets, body_ids, post_offsets, post_ids, n_steps,
            step_offsets, keys, nbytes, modes, key_tensor, partner_bytes, partner_tensor, n_tensors, capacity,
            concurrent, READ, WRITE):
    """The lockstep schedule (``_events`` with every step one unit long and no miss penalty), round by round: the
    running blocks in slot order, one step each a round; a block that ends gives its slot to the next block in grid
    order, which starts in the next round; one without steps leaves the slot empty."""
    blocks = body.shape[0]
    lru = _lru(key_tensor.shape[0])
    reads, writes = np.zeros(n_tensors, dtype=np.int64), np.zeros(n_tensors, dtype=np.int64)
    used = 0
    # the running slots' blocks, next steps and shared runs, in slot order
    running = np.zeros(concurrent, dtype=np.int64)
    running_t, first = np.zeros_like(running), np.zeros_like(running)
    stop, base = np.zeros_like(running), np.zeros_like(running)
    n, pending = 0, 0
    while pending < min(concurrent, blocks):
        if n_steps[pending] > 0:
            running[n], running_t[n] = pending, 0
            first[n], stop[n], base[n] = _body(pending, n_pre, body, start, n_body, body_offsets)
            n += 1
        pending += 1
    last, fits = -1, UNKNOWN
    while n > 0:
        kept = 0
        for i in range(n):
            b, t = running[i], running_t[i]
            f, s, o = first[i], stop[i], base[i]
            if f <= t < s:  # as in _events
                step = body_ids[o + t]
            elif t < f:
                step = pre_ids[pre_offsets[b] + t]
            else:
                step = post_ids[post_offsets[b] + t - s]
            if step == last and fits == UNKNOWN:
                fits = _holds(step, step_offsets, keys, modes, lru, WRITE)
            if step != last or not fits:
                _, used = _access(step, step_offsets, keys, nbytes, modes, key_tensor, partner_bytes,
                                  partner_tensor, capacity, lru, reads, writes, used, READ, WRITE)
                last, fits = step, UNKNOWN
            t += 1
            if t == n_steps[b]:  # its slot to the next block in grid order, or empty
                if pending >= blocks or n_steps[pending] == 0:
                    pending += pending < blocks
                    continue
                b, t = pending, 0
                f, s, o = _body(b, n_pre, body, start, n_body, body_offsets)
                pending += 1
            running[kept], running_t[kept] = b, t
            first[kept], stop[kept], base[kept] = f, s, o
            kept += 1
        n = kept
    return reads, writes, _left(key_tensor, n_tensors, lru)


def _add(tree, t, x):
    """Add x at position t of the Fenwick tree ``tree`` (positions 0 .. len − 2)."""
    t += 1
    while t < tree.shape[0]:
        tree[t] += x
        t += t & -t


def _below(tree, t):
    """The sum of the Fenwick tree's positions 0 .. t − 1."""
    total = 0
    while t > 0:
        total += tree[t]
        t -= t & -t
    return total


def _stack(keys, nbytes, modes, step_of, n_keys, WRITE):
    """Over one block's n accesses (dense tile ``keys``, their bytes and modes, each one's step ``step_of``, in step
    order), for each access t: ``prev``, the tile's access before it (−1: none); ``own``, the distinct bytes the block
    touched since then, the tile's own included; ``F1`` and ``F2``, those it touched over the steps from that access's
    to the one before t's, and one step later; and for the tile's last use (``last_use``), ``end``, the bytes touched
    from it to the end, the tile's own included, with ``end_F1`` and ``end_F2``, those of t's step and after, and of
    the steps after; ``first_write``, a tile's first write. ``ok`` is False where a step touches a tile twice, a tile
    is touched at two sizes (an L2 keeps a held tile's bytes) or a tile once written is later only read
    (``iosim.gpu.lockstep.lockstep`` does not count those). A Fenwick tree over the accesses holds each tile's bytes
    at its latest use."""
    n = keys.shape[0]
    steps = step_of[n - 1] + 1 if n else 0
    start = np.searchsorted(step_of, np.arange(steps + 1))  # each step's first access; n past the last
    tree = np.zeros(n + 1, dtype=np.int64)
    latest = np.full(n_keys, -1, dtype=np.int64)
    prev = np.full(n, -1, dtype=np.int64)
    own, F1, F2 = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    held = 0
    ok = True
    for r in range(steps):
        for t in range(start[r], start[r + 1]):  # steps r' .. r−1, before step r
            p = latest[keys[t]]
            prev[t] = p
            if p >= 0:
                F1[t] = held - _below(tree, start[step_of[p]])
        for t in range(start[r], start[r + 1]):
            p = prev[t]
            if latest[keys[t]] >= start[r]:  # the step touched the tile already
                ok = False
            if p >= 0:
                _add(tree, p, -nbytes[t])
            else:
                held += nbytes[t]
            _add(tree, t, nbytes[t])
            latest[keys[t]] = t
            if p >= 0:
                own[t] = held - _below(tree, p + 1)
        for t in range(start[r], start[r + 1]):  # steps r' + 1 .. r
            if prev[t] >= 0:
                F2[t] = held - _below(tree, start[step_of[prev[t]] + 1])
    # at the end: the bytes touched from each tile's last use on, itself included, and from each step on
    after = 0
    seen = np.zeros(n_keys, dtype=np.bool_)
    last_use = np.zeros(n, dtype=np.bool_)
    end = np.zeros(n, dtype=np.int64)
    step_after = np.zeros(steps + 1, dtype=np.int64)  # step_after[steps]: nothing after the last
    for t in range(n - 1, -1, -1):
        if not seen[keys[t]]:
            seen[keys[t]] = True
            last_use[t] = True
            after += nbytes[t]
            end[t] = after
    for r in range(steps - 1, -1, -1):  # the last uses in step r and after (a step without accesses: its next's)
        step_after[r] = step_after[r + 1]
        for t in range(start[r], start[r + 1]):
            if last_use[t]:
                step_after[r] += nbytes[t]
    end_F1, end_F2 = step_after[step_of], step_after[step_of + 1]
    written = np.zeros(n_keys, dtype=np.bool_)
    first_write = np.zeros(n, dtype=np.bool_)
    for t in range(n):
        if written[keys[t]] and not modes[t] & WRITE or nbytes[t] != nbytes[latest[keys[t]]]:
            ok = False
        if modes[t] & WRITE and not written[keys[t]]:
            written[keys[t]] = True
            first_write[t] = True
    return ok, prev, own, F1, F2, last_use, end, end_F1, end_F2, first_write
