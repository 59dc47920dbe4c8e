"""The staggered schedule of the L2 simulation (``L2Config.schedule``): the first W blocks start s/W of a mean block
apart instead of together, and from then on the same dynamic dispatch; the counts equal a plain schedule written out
by hand (tests/test_l2_cohorts.py's schedule_by_hand), and differ from lockstep where the blocks' interleaving
decides what the L2 holds."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from test_l2_cohorts import block_by_block, grids, schedule_by_hand

from iosim.core.errors import InputError
from iosim.core.problem import AttentionShape, Problem
from iosim.core.tiling import Tiling
from iosim.gpu import call1
from iosim.gpu.dram import pass_counts
from iosim.gpu.hardware import check_schedule, hardware
from iosim.gpu.kernel import Launch
from iosim.gpu.kernels import KERNELS
from iosim.gpu.l2 import READ, Grid, L2Config, Tiles, in_sequence
from iosim.gpu.schedule import simulate

# call 1's flash-swapped kernel (iosim.gpu.call1): its forward grid at the occupancy these tests were written at
SWAPPED = call1.FLASH_SWAPPED


@settings(max_examples=200)
@given(grids())
def test_the_staggered_schedule_counts_what_it_does_written_out_by_hand(case):
    grid, config = case
    staggered = replace(config, schedule="staggered")
    assert simulate(grid, staggered) == simulate(block_by_block(grid), staggered) == schedule_by_hand(grid, staggered)


TILES = Tiles(("K",))


def two_heads(blocks_per_head: int = 2, steps: int = 4) -> Grid:
    """Blocks of two heads, each block reading its head's tiles 0 … steps − 1 in order (as query blocks read K_j)."""
    return Grid(2 * blocks_per_head, lambda b: iter([(TILES.access("K", (b // blocks_per_head) * steps + j, 64, READ),)
                                                     for j in range(steps)]), TILES, 1)


def test_a_head_s_blocks_share_its_tiles_in_lockstep_and_not_staggered_where_the_l2_holds_one_tile():
    grid = two_heads()
    lockstep, staggered = L2Config(64, 2), L2Config(64, 2, "staggered")
    # in lockstep blocks 0 and 1 read tile j in one round, the second read a hit: each tile once
    assert simulate(grid, lockstep).reads == 8 * 64
    # staggered, block 1 starts 2 rounds after block 0 (⌊1 · 4 / 2⌋) and each of its reads finds another tile
    assert simulate(grid, staggered).reads == 16 * 64
    # with room for both heads' tiles the two schedules read each tile once
    roomy = simulate(grid, replace(lockstep, capacity=512)), simulate(grid, replace(staggered, capacity=512))
    assert roomy[0].reads == roomy[1].reads == 8 * 64


def test_one_block_at_a_time_is_the_same_schedule_either_way():
    pb = Problem(AttentionShape(1, 3, 200, 300, 16), tau=1.0, dtype="float32", causal=True)
    (grid,) = SWAPPED.grids(Launch(pb, Tiling(32, 32)))
    assert simulate(grid, L2Config(20_000, 1)) == simulate(grid, L2Config(20_000, 1, "staggered"))


@pytest.mark.parametrize("kernel", [SWAPPED, KERNELS["flash-swapped"]], ids=lambda k: k.name)
def test_staggered_counts_go_past_the_lockstep_closed_form_to_the_simulation(kernel):
    # full attention: pass_counts takes flash-swapped's closed form in lockstep, and simulates a staggered start
    pb = Problem(AttentionShape(2, 4, 512, 512, 32), tau=1.0, dtype="float16")
    launch = Launch(pb, Tiling(64, 32))
    assert kernel.closed_form(launch) is not None
    for schedule in ("lockstep", "staggered"):
        hw = hardware("h100", l2_bytes=200_000, blocks_per_sm=1, schedule=schedule)
        got = pass_counts(kernel, launch, hw)
        assert got == in_sequence([simulate(g, hw.config(g)) for g in kernel.grids(launch)])


def test_an_unknown_schedule_is_refused_by_name():
    message = r"schedule='waves' is not one of \['lockstep', 'staggered', 'timed'\]"
    with pytest.raises(InputError, match=message):
        hardware("h100", schedule="waves")
    with pytest.raises(InputError, match=message):
        check_schedule("waves")
