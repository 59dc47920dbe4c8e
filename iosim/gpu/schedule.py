"""Running a grid of thread blocks against the L2 (``iosim.gpu.l2``): the schedule, step by step.

W = SMs × blocks per SM blocks run at once. They start in grid order, the first W together
(the "lockstep" schedule), and a new one starts in the slot of one that finishes, in the next
round (dynamic dispatch). Each round, every running block makes one tile step, in slot order
(round robin), against the LRU L2. (The "timed" schedule, in which blocks drift, is
``iosim.gpu.timed``.)

Speed: a step that is the very same ``Step`` object as the one just run (the blocks of one
head reading the same K_j, V_j in one round) changes nothing in an LRU that holds it, so it
is counted as hits and skipped; a grid shares its step objects to use this. A grid whose
blocks share a whole run of steps says so with ``SharedSteps``: blocks adjacent in slot
order that start in one round with the same shared run, and heads and tails of equal
length, then make one cohort, which a round advances once instead of block by block, with
the same counts (tests/test_l2_cohorts.py holds them equal to the schedule run block by block).
A grid whose blocks all make as many steps, and whose groups of ``Grid.fuse`` consecutive blocks share their steps
joined (the sawtooth's pairs of an upward and a downward query block), runs under lockstep as a grid of those groups
(``fused``): its blocks start and end in waves of W in grid order, so a group's steps joined, one group per ``fuse``
slots, are the same accesses in the same order, and the groups form cohorts where the blocks alone cannot.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from itertools import islice

from iosim.gpu.l2 import LRU, DramCounts, Grid, L2Config, SharedSteps, Step


def simulate(grid: Grid, config: L2Config) -> DramCounts:
    """Run ``grid`` with ``config.concurrent`` blocks at once against an LRU L2 of ``config.capacity`` bytes.

    The running blocks are held in slot order as entries, each a ``_Block`` (one block's step iterator) or a
    ``_Cohort`` (consecutive blocks of ``SharedSteps`` started in one round that run with each other): a
    round makes, entry by entry, each block's step in slot order, a cohort's shared step once for all its
    blocks. A finished entry's slots go to the next blocks in grid order, which start in the next round.
    """
    l2 = LRU(config.capacity, len(grid.tiles.tensors))
    counted = config
    if grid.fuse > 1 and config.schedule == "lockstep" and config.concurrent % grid.fuse == 0:
        grid, config = fused(grid), replace(config, concurrent=config.concurrent // grid.fuse)
    pending = iter(range(grid.blocks))
    state = _Run(l2)
    entries: list = []
    _entries(grid, pending, config.concurrent, entries, [], 0)
    entries = _settled(entries, range(len(entries)))
    round_ = 0
    l2_step, fits = l2.step, l2.fits
    while entries:
        round_ += 1
        fresh: list[int] = []  # where in ``out`` the blocks started this round are
        out: list = []
        for entry in entries:
            if type(entry) is _Block:  # _Run.run inlined: the path of blocks that share no run
                step = entry.next  # never None: ``_settled`` drops a block without steps
                if step is not state.last:
                    l2_step(step)
                    state.last, state.last_fits = step, None
                else:
                    if state.last_fits is None:
                        state.last_fits = fits(step)
                    if not state.last_fits:
                        l2_step(step)
                entry.next = next(entry.steps, None)
                done = entry.next is None
            else:
                done = entry.advance(state)
            if done:  # its slots go to the next blocks in grid order, from the next round
                _entries(grid, pending, entry.slots, out, fresh, round_)
            else:
                out.append(entry)
        entries = _settled(out, fresh) if fresh else out
    return l2.counts(grid.tiles, counted)


def fused(grid: Grid) -> Grid:
    """``grid`` with each ``grid.fuse`` consecutive blocks as one, whose steps are theirs joined round by round (in
    slot order, as the schedule runs them). Where the group's blocks are ``SharedSteps`` with runs of one length,
    the group's are too, its run joined once for every group of the same blocks' runs, so that groups started together
    form a cohort. The blocks must make as many steps each (``Grid.fuse``'s promise)."""
    k = grid.fuse
    joined: dict[tuple, list] = {}  # the members' (body, start) -> their run joined: one object for all groups

    def steps(g: int):
        members = [grid.steps(b) for b in range(g * k, min((g + 1) * k, grid.blocks))]
        shared = all(isinstance(m, SharedSteps) for m in members)
        if shared and len({(len(m.head), m.stop - m.start, len(m.tail)) for m in members}) == 1:
            key = tuple((id(m.body), m.start) for m in members)
            n = members[0].stop - members[0].start
            if key not in joined:
                joined[key] = [sum((m.body[m.start + t] for m in members), ()) for t in range(n)]
            head = tuple(sum(parts, ()) for parts in zip(*(m.head for m in members)))
            tail = tuple(sum(parts, ()) for parts in zip(*(m.tail for m in members)))
            return SharedSteps(head, joined[key], 0, n, tail)
        runs = [list(m) for m in members]
        if len({len(r) for r in runs}) != 1:
            raise ValueError(f"Grid.fuse={k}: blocks {g * k}..{g * k + len(runs) - 1} make {[len(r) for r in runs]} "
                             f"steps; fused blocks must make as many")
        return iter([sum(parts, ()) for parts in zip(*runs)])

    return Grid(-(-grid.blocks // k), steps, grid.tiles, grid.blocks_per_sm)


class _Run:
    """The L2 and the step just run: a step that is that very object again is all hits where its tiles all stayed
    resident, and dirty where it writes them (``LRU.fits``)."""

    __slots__ = ("l2", "last", "last_fits")

    def __init__(self, l2: LRU):
        self.l2, self.last, self.last_fits = l2, None, None

    def run(self, step: Step, times: int = 1) -> None:
        """Run ``step`` ``times`` times in a row."""
        if step is not self.last:
            self.l2.step(step)
            self.last, self.last_fits = step, None
            times -= 1
        if times:
            if self.last_fits is None:
                self.last_fits = self.l2.fits(step)
            if not self.last_fits:
                for _ in range(times):
                    self.l2.step(step)


class _Block:
    """One running block: its step iterator and its next step (None: it has none, or no more)."""

    __slots__ = ("steps", "next", "slots")

    def __init__(self, steps: Iterator[Step]):
        self.steps, self.slots = iter(steps), 1
        self.next = next(self.steps, None)

    @property
    def empty(self) -> bool:
        return self.next is None


class _Cohort:
    """Blocks of ``SharedSteps`` that run with each other, in slot order, at step ``t`` of theirs (started in
    round ``born``)."""

    __slots__ = ("members", "t", "slots", "first", "born", "h", "mid", "total", "body", "offset")
    empty = False

    def __init__(self, member: SharedSteps, born: int):
        self.members, self.t, self.slots, self.first, self.born = [member], 0, 1, member, born
        self.h, self.total, self.body = len(member.head), member.total, member.body
        self.mid = self.h + member.stop - member.start  # steps before the tail
        self.offset = member.start - self.h  # body index of step t

    def join(self, other: _Cohort) -> bool:
        """Take ``other``'s blocks, which come right after its own in slot order, if they started in the same round
        (both at their first step) and run with its own; whether it did."""
        if other.born != self.born or not self.first.runs_with(other.first):
            return False
        self.members.extend(other.members)
        self.slots += other.slots
        return True

    def advance(self, state: _Run) -> bool:
        t = self.t
        if t < self.h:
            for m in self.members:
                state.run(m.head[t])
        elif t < self.mid:
            state.run(self.body[self.offset + t], self.slots)
        else:
            for m in self.members:
                state.run(m.tail[t - self.mid])
        self.t = t + 1
        return self.t == self.total


def _entries(grid: Grid, pending: Iterator[int], slots: int, out: list, fresh: list[int], born: int) -> None:
    """Append to ``out`` up to ``slots`` next blocks in grid order, started in round ``born``, and their places
    to ``fresh``: a ``SharedSteps`` block joins the cohort before it when that one started in the same round and
    runs with it."""
    for b in islice(pending, slots):
        steps = grid.steps(b)
        entry = _Cohort(steps, born) if isinstance(steps, SharedSteps) and steps.total else _Block(steps)
        if not (out and type(out[-1]) is _Cohort and type(entry) is _Cohort and out[-1].join(entry)):
            fresh.append(len(out))
            out.append(entry)


def _settled(out: list, fresh) -> list:
    """``out`` once the round's new blocks are placed: a cohort of one stays alone, and runs as a block, which is
    cheaper; a block without steps is dropped, and its slot stays empty, as in the schedule."""
    empty = False
    for i in fresh:
        e = out[i]
        if type(e) is _Cohort and e.slots == 1:
            out[i] = _Block(e.first)
        empty |= out[i].empty
    return [e for e in out if not e.empty] if empty else out
