"""The schedules of the L2 model (``iosim.gpu.hardware.SCHEDULES``): lockstep's blocks of one head share its tiles in
one round; an unknown schedule is refused by name, and a retired one (staggered) with the reason it was retired, by
the API and by the command line."""

from dataclasses import replace

import pytest

from iosim.cli import main
from iosim.core.errors import InputError
from iosim.core.problem import AttentionShape, Problem
from iosim.core.tiling import Tiling
from iosim.gpu import call1
from iosim.gpu.dram import pass_counts
from iosim.gpu.hardware import RETIRED_SCHEDULES, check_schedule, hardware
from iosim.gpu.kernel import Launch
from iosim.gpu.kernels import KERNELS
from iosim.gpu.l2 import READ, Grid, L2Config, Tiles, in_sequence
from iosim.gpu.schedule import simulate

# call 1's flash-swapped kernel (iosim.gpu.call1): its forward grid at the occupancy these tests were written at
SWAPPED = call1.FLASH_SWAPPED
TILES = Tiles(("K",))


def two_heads(blocks_per_head: int = 2, steps: int = 4) -> Grid:
    """Blocks of two heads, each block reading its head's tiles 0 … steps − 1 in order (as query blocks read K_j)."""
    return Grid(2 * blocks_per_head, lambda b: iter([(TILES.access("K", (b // blocks_per_head) * steps + j, 64, READ),)
                                                     for j in range(steps)]), TILES, 1)


def test_a_head_s_blocks_share_its_tiles_in_lockstep_where_the_l2_holds_one_tile():
    grid = two_heads()
    lockstep = L2Config(64, 2)
    # blocks 0 and 1 read tile j in one round, the second read a hit: each tile once
    assert simulate(grid, lockstep).reads == 8 * 64
    # one block at a time, block 1 re-reads what block 0 read and the L2 no longer holds
    assert simulate(grid, replace(lockstep, concurrent=1)).reads == 16 * 64
    # with room for both heads' tiles, one at a time reads each tile once too
    assert simulate(grid, replace(lockstep, concurrent=1, capacity=512)).reads == 8 * 64


@pytest.mark.parametrize("kernel", [SWAPPED, KERNELS["flash-swapped"]], ids=lambda k: k.name)
def test_pass_counts_take_the_closed_form_equal_to_the_simulation(kernel):
    pb = Problem(AttentionShape(2, 4, 512, 512, 32), tau=1.0, dtype="float16")
    launch = Launch(pb, Tiling(64, 32))
    assert kernel.closed_form(launch) is not None
    hw = hardware("h100", l2_bytes=200_000, blocks_per_sm=1)
    assert pass_counts(kernel, launch, hw) == in_sequence([simulate(g, hw.config(g)) for g in kernel.grids(launch)])


def test_an_unknown_schedule_is_refused_by_name():
    message = r"schedule='waves' is not one of \['lockstep', 'timed'\]"
    with pytest.raises(InputError, match=message):
        hardware("h100", schedule="waves")
    with pytest.raises(InputError, match=message):
        check_schedule("waves")
    with pytest.raises(InputError, match=r"schedule=\['lockstep'\] is not one of"):
        check_schedule(["lockstep"])


def test_the_retired_staggered_schedule_is_refused_with_why():
    assert "calls 3 and 4" in RETIRED_SCHEDULES["staggered"]
    message = r"schedule='staggered' is retired after calls 3 and 4: .*use one of \['lockstep', 'timed'\]"
    with pytest.raises(InputError, match=message):
        hardware("h100", schedule="staggered")


def test_the_command_line_refuses_the_retired_schedule_in_one_line(capsys):
    assert main(["sweep", "--N", "256", "--M", "100k", "--gpu", "h100", "--schedule", "staggered"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1 and "--schedule: staggered is retired after calls 3 and 4" in lines[0]
