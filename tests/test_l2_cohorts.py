"""Cohorts in the L2 simulation (iosim.gpu.schedule.simulate): blocks that share a run of steps (``SharedSteps``) and
start in one round advance together, and the counts are those of the schedule run block by block; so do the
sawtooth's pairs of blocks fused into one (``Grid.fuse``)."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iosim.core.problem import AttentionShape, Problem
from iosim.core.tiling import Tiling
from iosim.gpu import call1, schedule
from iosim.gpu.grids import flash_swapped
from iosim.gpu.kernel import Launch
from iosim.gpu.l2 import LRU, READ, READ_WRITE, WRITE, Grid, L2Config, SharedSteps, Tiles
from iosim.gpu.schedule import simulate

TILES = Tiles(("A", "B", "C"))


def swapped_backward(pb: Problem, tiling: Tiling) -> Grid:
    """flash-swapped's backward main kernel, as call 1's kernel launches it after row_dot and fill."""
    grids = call1.FLASH_SWAPPED.grids(Launch(pb, tiling, backward=True))
    assert len(grids) == (3 if pb.dtype == "float32" else 4)
    return grids[2]


def block_by_block(grid: Grid) -> Grid:
    """The same grid with every block's steps as a plain iterator: no cohorts."""
    return replace(grid, steps=lambda b: iter(list(grid.steps(b))))


def schedule_by_hand(grid: Grid, config: L2Config):
    """The schedule written out plainly, as an independent check: W slots in slot order, the first W blocks started
    together, one step per running block a round; a block that finishes gives its slot to the next block in grid
    order, whose first step comes next round; a block without steps leaves its slot empty; a step that is the very
    object just run is all hits if it fits (it changes nothing in an LRU that holds it)."""
    l2 = LRU(config.capacity, len(grid.tiles.tensors))
    pending = iter(range(grid.blocks))

    def start(b):
        steps = iter(grid.steps(b))
        return [steps, next(steps, None)]

    slots = [start(next(pending)) for _ in range(min(config.concurrent, grid.blocks))]
    last = None
    while slots:
        for slot in slots:
            if slot[1] is None:
                continue
            if slot[1] is not last or not l2.fits(slot[1]):
                l2.step(slot[1])
            last = slot[1]
            slot[1] = next(slot[0], None)
            if slot[1] is None:
                b = next(pending, None)
                if b is not None:
                    slot[:] = start(b)
        slots = [slot for slot in slots if slot[1] is not None]
    return l2.counts(grid.tiles, config)


# One step: 1 to 3 accesses, each one of the 585 to tiles 0-12 of A, B or C, of 32, 64, 96, 200 or 4096 bytes, read,
# written or both, drawn as one choice. The strategies are built once, here: built anew at every draw, with four
# choices an access, Hypothesis spent about four fifths of the cohort tests' time building and drawing them.
ACCESSES = [TILES.access(t, i, n, mode) for t in TILES.tensors for i in range(13) for n in (32, 64, 96, 200, 4096)
            for mode in (READ, WRITE, READ_WRITE)]
_STEP = st.lists(st.sampled_from(ACCESSES), min_size=1, max_size=3).map(tuple)
_BODY = st.lists(_STEP, min_size=1, max_size=6)
_PLAIN = st.lists(_STEP, max_size=4).map(tuple)  # a plain block's steps, maybe none
_ENDS = st.lists(_STEP, max_size=2).map(tuple)  # a shared block's own head or tail
_KIND = st.sampled_from(["plain", "shared", "shared", "shared", "again", "longer", "shorter"])


@st.composite
def grids(draw):
    """Blocks of three kinds, in random order: plain iterators (some without steps), and SharedSteps over one of
    two bodies with random runs, heads and tails (blocks beside each other often share all of it, or all but the
    end of their run, which may come later or sooner than the one before it's)."""
    bodies = [draw(_BODY) for _ in range(2)]
    kinds = []
    for _ in range(draw(st.integers(1, 30))):
        kind = draw(_KIND)
        if kind in ("again", "longer", "shorter") and kinds and kinds[-1][0] == "shared":
            _, body, (start, stop), head, tail = kinds[-1]
            if kind != "again":  # the same run from the same start, ending later or sooner
                stop = draw(st.integers(stop, len(bodies[body])) if kind == "longer" else st.integers(start, stop))
            kinds.append(("shared", body, (start, stop), tuple(draw(_STEP) for _ in head),
                          tuple(draw(_STEP) for _ in tail)))
            continue
        if kind in ("again", "longer", "shorter"):
            kind = "plain"
        if kind == "plain":
            kinds.append(("plain", draw(_PLAIN), None, (), ()))
            continue
        body = draw(st.integers(0, 1))
        start = draw(st.integers(0, len(bodies[body])))
        stop = draw(st.integers(start, len(bodies[body])))
        kinds.append(("shared", body, (start, stop), draw(_ENDS), draw(_ENDS)))

    def block_steps(b):
        kind, body, run, head, tail = kinds[b]
        if kind == "plain":
            return iter(body)
        return SharedSteps(head, bodies[body], run[0], run[1], tail)

    config = L2Config(draw(st.sampled_from([64, 300, 1000, 10_000])), draw(st.integers(1, 8)))
    return Grid(len(kinds), block_steps, TILES, 1), config


@settings(max_examples=300)
@given(grids())
def test_cohorts_count_what_blocks_run_one_by_one_count(case):
    grid, config = case
    assert simulate(grid, config) == simulate(block_by_block(grid), config) == schedule_by_hand(grid, config)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 9), st.sampled_from([1, 17, 64, 100, 257]), st.sampled_from([1, 64, 300]),
       st.sampled_from([4, 8, 16]), st.booleans(), st.sampled_from([2_000, 40_000, 37_000_000]), st.integers(1, 40))
def test_the_swapped_backward_grid_counts_the_same_with_cohorts(bh, n_q, n_k, B, causal, capacity, concurrent):
    pb = Problem(AttentionShape(1, bh, n_q, n_k, 16), tau=1.0, dtype="float32", causal=causal)
    grid = swapped_backward(pb, Tiling(B, B))
    config = L2Config(capacity, concurrent)
    assert simulate(grid, config) == schedule_by_hand(grid, config)


def count_joins(monkeypatch) -> list[bool]:
    """Every cohort's attempt to take the blocks after it, whether it did, as the simulation makes them."""
    joined = []
    join = schedule._Cohort.join

    def spy(self, other):
        joined.append(join(self, other))
        return joined[-1]

    monkeypatch.setattr(schedule._Cohort, "join", spy)
    return joined


@pytest.mark.parametrize("concurrent", [7, 12, 64])
def test_a_head_s_blocks_do_run_as_cohorts(concurrent, monkeypatch):
    # full attention: the key blocks of a head that start in one round join one cohort (heads of 8 blocks)
    joined = count_joins(monkeypatch)
    pb = Problem(AttentionShape(1, 5, 128, 128, 16), tau=1.0, dtype="float32")
    grid = swapped_backward(pb, Tiling(16, 16))
    config = L2Config(30_000, concurrent)
    assert simulate(grid, config) == schedule_by_hand(grid, config)
    assert sum(joined) >= grid.blocks // 2, sum(joined)


def test_a_head_s_blocks_share_their_middle_steps():
    # non-causal: every key block of a head meets the same query blocks, so blocks 0 and 1 share the body
    pb = Problem(AttentionShape(1, 2, 64, 96, 8), tau=1.0, dtype="float32")
    grid = swapped_backward(pb, Tiling(16, 16))
    a, b, other_head = grid.steps(0), grid.steps(1), grid.steps(6)
    assert a.runs_with(b) and not a.runs_with(other_head)
    assert a.head != b.head and a.total == 64 // 16  # K_j, V_j with Q_0, then Q_1, Q_2, then Q_3 with dK_j, dV_j


def test_a_shared_run_must_lie_within_its_body():
    body = [((1, 32, READ),)] * 3
    with pytest.raises(ValueError, match="run 2:4 must lie within its body of 3 steps"):
        SharedSteps((), body, 2, 4, ())


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.sampled_from([1, 17, 100, 300]), st.sampled_from([1, 64, 300]),
       st.sampled_from([(16, 16), (32, 16), (16, 64)]), st.sampled_from([2_000, 40_000, 37_000_000]),
       st.integers(1, 24))
def test_the_sawtooth_s_pairs_run_as_one_block_with_the_counts_of_its_blocks(bh, n_q, n_k, tile, capacity,
                                                                             concurrent):
    # the odd query blocks scan downwards: the fused pairs (an upward and a downward block) count what the blocks
    # count run one by one, and by hand; an odd number of slots runs the blocks unfused
    pb = Problem(AttentionShape(1, bh, n_q, n_k, 16), tau=1.0, dtype="float16")
    grid = flash_swapped.forward(pb, Tiling(*tile), 1, sawtooth=True)
    assert grid.fuse == 2
    config = L2Config(capacity, concurrent)
    assert simulate(grid, config) == simulate(block_by_block(replace(grid, fuse=1)), config) \
        == schedule_by_hand(grid, config)


def test_fused_pairs_form_cohorts_and_refuse_blocks_of_unequal_steps(monkeypatch):
    pb = Problem(AttentionShape(1, 2, 512, 512, 16), tau=1.0, dtype="float16")
    grid = flash_swapped.forward(pb, Tiling(16, 16), 1, sawtooth=True)  # 32 query blocks of 32 steps a head
    pairs = schedule.fused(grid)
    assert pairs.blocks == 32 and pairs.steps(0).runs_with(pairs.steps(5))  # a head's pairs share their run
    joined = count_joins(monkeypatch)
    simulate(grid, L2Config(40_000, 16))
    assert sum(joined) >= 24, sum(joined)  # 8 pairs at once: at least 6 join the first of their round, 4 rounds
    causal = replace(flash_swapped.forward(replace(pb, causal=True), Tiling(16, 16), 1), fuse=2)
    with pytest.raises(ValueError, match="fused blocks must make as many"):
        list(schedule.fused(causal).steps(0))
