"""The timed schedule's event loop in Numba (``iosim.gpu.timed_engine.run`` calls it): a binary heap of (issue time,
slot) and an LRU of whole tiles as a doubly linked list over dense tile indices, making each step as
``iosim.gpu.l2.LRU.step`` does."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _less(t1, s1, t2, s2):
    return t1 < t2 or (t1 == t2 and s1 < s2)


@njit(cache=True)
def _push(times, slots, n, t, s):
    i = n
    times[i], slots[i] = t, s
    while i > 0:
        parent = (i - 1) // 2
        if _less(times[i], slots[i], times[parent], slots[parent]):
            times[i], times[parent] = times[parent], times[i]
            slots[i], slots[parent] = slots[parent], slots[i]
            i = parent
        else:
            break
    return n + 1


@njit(cache=True)
def _pop(times, slots, n):
    t, s = times[0], slots[0]
    n -= 1
    times[0], slots[0] = times[n], slots[n]
    i = 0
    while True:
        left, right, low = 2 * i + 1, 2 * i + 2, i
        if left < n and _less(times[left], slots[left], times[low], slots[low]):
            low = left
        if right < n and _less(times[right], slots[right], times[low], slots[low]):
            low = right
        if low == i:
            break
        times[i], times[low] = times[low], times[i]
        slots[i], slots[low] = slots[low], slots[i]
        i = low
    return t, s, n


@njit(cache=True)
def events(pre_offsets, pre_ids, body, start, stop, body_offsets, body_ids, post_offsets, post_ids, step_offsets,
           keys, nbytes, modes, key_tensor, n_tensors, capacity, concurrent, sm_speed, block_speed,
           penalty, READ, WRITE):
    blocks = body.shape[0]
    n_keys = key_tensor.shape[0]
    sms = sm_speed.shape[0]
    # the LRU: a list from least to most recent, through prev and next; n_keys is its head and tail
    prev = np.full(n_keys + 1, n_keys, dtype=np.int64)
    nxt = np.full(n_keys + 1, n_keys, dtype=np.int64)
    resident = np.zeros(n_keys, dtype=np.bool_)
    dirty = np.zeros(n_keys, dtype=np.bool_)
    size = np.zeros(n_keys, dtype=np.int64)
    reads = np.zeros(n_tensors, dtype=np.int64)
    writes = np.zeros(n_tensors, dtype=np.int64)
    used = 0
    # the running blocks: a slot's block, its next step and its speed
    slot_block = np.zeros(concurrent, dtype=np.int64)
    slot_t = np.zeros(concurrent, dtype=np.int64)
    slot_speed = np.zeros(concurrent, dtype=np.float64)
    times = np.zeros(concurrent, dtype=np.float64)
    heap_slots = np.zeros(concurrent, dtype=np.int64)
    n = 0
    pending = 0
    last, last_fits = -1, False
    for slot in range(min(concurrent, blocks)):
        b = pending
        pending += 1
        total = (pre_offsets[b + 1] - pre_offsets[b]) + (stop[b] - start[b] if body[b] >= 0 else 0) + (
            post_offsets[b + 1] - post_offsets[b])
        if total > 0:
            slot_block[slot], slot_t[slot] = b, 0
            slot_speed[slot] = sm_speed[slot % sms] * block_speed[b]
            n = _push(times, heap_slots, n, 0.0, slot)
    while n > 0:
        at, slot, n = _pop(times, heap_slots, n)
        b, t = slot_block[slot], slot_t[slot]
        n_pre = pre_offsets[b + 1] - pre_offsets[b]
        n_body = stop[b] - start[b] if body[b] >= 0 else 0
        n_post = post_offsets[b + 1] - post_offsets[b]
        if t < n_pre:
            step = pre_ids[pre_offsets[b] + t]
        elif t < n_pre + n_body:
            step = body_ids[body_offsets[body[b]] + start[b] + t - n_pre]
        else:
            step = post_ids[post_offsets[b] + t - n_pre - n_body]
        missed = 0
        if not (step == last and last_fits):
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
            # again at once, it changes nothing if its tiles all stayed resident, and dirty where it writes them
            last, last_fits = step, True
            for a in range(step_offsets[step], step_offsets[step + 1]):
                k = keys[a]
                last_fits = last_fits and resident[k] and (not (modes[a] & WRITE) or dirty[k])
        done = at + slot_speed[slot] + missed * penalty
        t += 1
        if t < n_pre + n_body + n_post:
            slot_t[slot] = t
            n = _push(times, heap_slots, n, done, slot)
            continue
        if pending < blocks:  # the next block in grid order takes the slot; one without steps leaves it empty
            b = pending
            pending += 1
            total = (pre_offsets[b + 1] - pre_offsets[b]) + (stop[b] - start[b] if body[b] >= 0 else 0) + (
                post_offsets[b + 1] - post_offsets[b])
            if total > 0:
                slot_block[slot], slot_t[slot] = b, 0
                slot_speed[slot] = sm_speed[slot % sms] * block_speed[b]
                n = _push(times, heap_slots, n, done, slot)
    left = np.zeros(n_tensors, dtype=np.int64)
    for k in range(n_keys):
        if resident[k] and dirty[k]:
            left[key_tensor[k]] += size[k]
    return reads, writes, left
