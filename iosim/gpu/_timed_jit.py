"""The timed schedule's event loop in Numba (``iosim.gpu.timed_engine.run`` calls it): a queue of (issue time, slot)
kept sorted and an LRU of whole tiles as a doubly linked list over dense tile indices, making each step as
``iosim.gpu.l2.LRU.step`` does; and the lockstep schedule's loop, round by round (``run_rounds``).

The functions are written in plain Python and compiled at the first timed count (``events``), so that importing iosim
does not import Numba (0.2 s of every command's start-up).
"""

from __future__ import annotations

from functools import cache
from threading import Lock

import numpy as np


def events(*args):
    """The timed schedule's reads, writes and dirty bytes per tensor (``_events``' arguments), compiled once."""
    return _compiled()["_events"](*args)


def rounds(*args):
    """The lockstep schedule's reads, writes and dirty bytes per tensor (``_rounds``' arguments), compiled once."""
    return _compiled()["_rounds"](*args)


_COMPILING = Lock()  # the band's threads (iosim.gpu.dram.dram) may ask for the loops at once: one compiles them


def _compiled() -> dict:
    with _COMPILING:
        return _compile()


@cache
def _compile() -> dict:
    """``_events`` and ``_rounds`` compiled with Numba, the helpers they call first: each module-level name is rebound
    to its compiled function, so that the compiled callers find compiled callees."""
    from numba import njit  # third-party, deferred: only a timed count needs it

    module = globals()
    for name in ("_lru", "_left"):
        module[name] = njit(cache=True)(module[name])
    # at every step: inlined into the loops, not called. The loops call nothing at their steps: a call there, even one
    # rarely taken, made Numba count references to the arrays at every step (2.7 times slower on a row, 2026-12-02)
    for name in ("_queue", "_access", "_holds"):
        module[name] = njit(cache=True, inline="always")(module[name])
    for name in ("_events", "_rounds"):  # without the GIL: the timed schedule's band runs its ends beside its middle
        module[name] = njit(cache=True, nogil=True)(module[name])
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


def _access(step, step_offsets, keys, nbytes, modes, key_tensor, capacity, prev, nxt, resident, dirty, size, reads,
            writes, used, READ, WRITE):
    """Make ``step`` against the LRU holding ``used`` bytes: each tile to the most recent end, a miss read where it
    reads and the least recent evicted (written back if dirty) until it fits. The bytes it missed, and those held."""
    n_keys = key_tensor.shape[0]
    missed = 0
    for a in range(step_offsets[step], step_offsets[step + 1]):
        k, x, mode = keys[a], nbytes[a], modes[a]
        if resident[k]:  # to the most recent end
            nxt[prev[k]], prev[nxt[k]] = nxt[k], prev[k]
        else:
            if mode & READ:
                reads[key_tensor[k]] += x
                missed += x
            if x > capacity:  # never fits: straight through
                if mode & WRITE:
                    writes[key_tensor[k]] += x
                continue
            used += x
            while used > capacity:  # evict the least recent
                old = nxt[n_keys]
                nxt[n_keys], prev[nxt[old]] = nxt[old], n_keys
                resident[old] = False
                used -= size[old]
                if dirty[old]:
                    dirty[old] = False
                    writes[key_tensor[old]] += size[old]
            resident[k], size[k] = True, x
        tail = prev[n_keys]
        prev[k], nxt[k] = tail, n_keys
        nxt[tail], prev[n_keys] = k, k
        if mode & WRITE:
            dirty[k] = True
    return missed, used


def _holds(step, step_offsets, keys, modes, resident, dirty, WRITE):
    """Whether ``step`` again at once changes nothing: its tiles all resident, and dirty where it writes them."""
    for a in range(step_offsets[step], step_offsets[step + 1]):
        k = keys[a]
        if not resident[k] or (modes[a] & WRITE and not dirty[k]):
            return False
    return True


def _lru(n_keys, n_tensors):
    """An empty LRU: a list from least to most recent through prev and next (n_keys is its head and tail), residency,
    dirtiness and size per tile, and reads and writes per tensor."""
    return (np.full(n_keys + 1, n_keys, dtype=np.int64), np.full(n_keys + 1, n_keys, dtype=np.int64),
            np.zeros(n_keys, dtype=np.bool_), np.zeros(n_keys, dtype=np.bool_), np.zeros(n_keys, dtype=np.int64),
            np.zeros(n_tensors, dtype=np.int64), np.zeros(n_tensors, dtype=np.int64))


def _left(key_tensor, n_tensors, resident, dirty, size):
    """The dirty bytes still held at the end, per tensor."""
    left = np.zeros(n_tensors, dtype=np.int64)
    for k in range(key_tensor.shape[0]):
        if resident[k] and dirty[k]:
            left[key_tensor[k]] += size[k]
    return left


def _events(pre_offsets, pre_ids, n_pre, body, start, n_body, body_offsets, body_ids, post_offsets, post_ids, n_steps,
            step_offsets, keys, nbytes, modes, key_tensor, n_tensors, capacity, concurrent, sm_speed, block_speed,
            penalty, READ, WRITE):
    blocks = body.shape[0]
    sms = sm_speed.shape[0]
    prev, nxt, resident, dirty, size, reads, writes = _lru(key_tensor.shape[0], n_tensors)
    used = 0
    # the running blocks: a slot's block, its next step and its speed; the queue of their next steps' times
    slot_block = np.zeros(concurrent, dtype=np.int64)
    slot_t = np.zeros(concurrent, dtype=np.int64)
    slot_speed = np.zeros(concurrent, dtype=np.float64)
    times = np.zeros(2 * concurrent, dtype=np.float64)
    queued = np.zeros(2 * concurrent, dtype=np.int64)
    head, n = 0, 0
    pending = min(concurrent, blocks)
    last, last_fits = -1, False
    for slot in range(pending):  # the first blocks start at 0 in slot order; one without steps leaves its slot empty
        if n_steps[slot] > 0:
            slot_block[slot], slot_t[slot], slot_speed[slot] = slot, 0, sm_speed[slot % sms] * block_speed[slot]
            head, n = _queue(times, queued, head, n, 0.0, slot)
    while n > 0:
        at, slot = times[head], queued[head]
        head, n = head + 1, n - 1
        b, t = slot_block[slot], slot_t[slot]
        if t < n_pre[b]:  # its own first steps, its shared run, its own last (written out: a call here costs 20 %)
            step = pre_ids[pre_offsets[b] + t]
        elif t < n_pre[b] + n_body[b]:
            step = body_ids[body_offsets[body[b]] + start[b] + t - n_pre[b]]
        else:
            step = post_ids[post_offsets[b] + t - n_pre[b] - n_body[b]]
        missed = 0
        if not (step == last and last_fits):
            missed, used = _access(step, step_offsets, keys, nbytes, modes, key_tensor, capacity, prev, nxt, resident,
                                   dirty, size, reads, writes, used, READ, WRITE)
            last, last_fits = step, _holds(step, step_offsets, keys, modes, resident, dirty, WRITE)
        done = at + slot_speed[slot] + missed * penalty
        t += 1
        if t < n_steps[b]:
            slot_t[slot] = t
            head, n = _queue(times, queued, head, n, done, slot)
        elif pending < blocks:  # the next block in grid order takes the slot at the end of this one, or leaves it
            if n_steps[pending] > 0:  # empty if it has no steps
                slot_block[slot], slot_t[slot] = pending, 0
                slot_speed[slot] = sm_speed[slot % sms] * block_speed[pending]
                head, n = _queue(times, queued, head, n, done, slot)
            pending += 1
    return reads, writes, _left(key_tensor, n_tensors, resident, dirty, size)


def _rounds(pre_offsets, pre_ids, n_pre, body, start, n_body, body_offsets, body_ids, post_offsets, post_ids, n_steps,
            step_offsets, keys, nbytes, modes, key_tensor, n_tensors, capacity, concurrent, READ, WRITE):
    """The lockstep schedule (``_events`` with every step one unit long and no miss penalty), round by round: the
    running blocks in slot order, one step each a round; a block that ends gives its slot to the next block in grid
    order, which starts in the next round; one without steps leaves the slot empty."""
    blocks = body.shape[0]
    prev, nxt, resident, dirty, size, reads, writes = _lru(key_tensor.shape[0], n_tensors)
    used = 0
    running = np.zeros(concurrent, dtype=np.int64)  # the running slots' blocks and next steps, in slot order
    running_t = np.zeros(concurrent, dtype=np.int64)
    n, pending = 0, 0
    while pending < min(concurrent, blocks):
        if n_steps[pending] > 0:
            running[n], running_t[n] = pending, 0
            n += 1
        pending += 1
    last, last_fits = -1, False
    while n > 0:
        kept = 0
        for i in range(n):
            b, t = running[i], running_t[i]
            if t < n_pre[b]:  # as in _events
                step = pre_ids[pre_offsets[b] + t]
            elif t < n_pre[b] + n_body[b]:
                step = body_ids[body_offsets[body[b]] + start[b] + t - n_pre[b]]
            else:
                step = post_ids[post_offsets[b] + t - n_pre[b] - n_body[b]]
            if not (step == last and last_fits):
                _, used = _access(step, step_offsets, keys, nbytes, modes, key_tensor, capacity, prev, nxt, resident,
                                  dirty, size, reads, writes, used, READ, WRITE)
                last, last_fits = step, _holds(step, step_offsets, keys, modes, resident, dirty, WRITE)
            t += 1
            if t == n_steps[b]:  # its slot to the next block in grid order, or empty
                if pending >= blocks or n_steps[pending] == 0:
                    pending += pending < blocks
                    continue
                b, t = pending, 0
                pending += 1
            running[kept], running_t[kept] = b, t
            kept += 1
        n = kept
    return reads, writes, _left(key_tensor, n_tensors, resident, dirty, size)
