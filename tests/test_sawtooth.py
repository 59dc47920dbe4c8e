"""flash-swapped's sawtooth grid (the flash-swapped kernel's ``sawtooth`` option, ``Launch(..., sawtooth=True)``,
which experiments/sawtooth.py runs): the same accesses as flash-swapped's, odd query blocks scanning K/V backward."""

from collections import Counter

import pytest

from iosim.core.errors import InputError
from iosim.core.problem import AttentionShape, Problem
from iosim.core.tiling import Tiling
from iosim.gpu import call1
from iosim.gpu.grids import flash_swapped
from iosim.gpu.kernel import Launch
from iosim.gpu.kernels import KERNELS
from iosim.gpu.l2 import Grid, L2Config
from iosim.gpu.schedule import simulate

SWAPPED = KERNELS["flash-swapped"]  # today's kernel, whose forward takes the sawtooth order


def forward(pb: Problem, tiling: Tiling, sawtooth: bool = False) -> Grid:
    (g,) = SWAPPED.grids(Launch(pb, tiling, sawtooth=sawtooth))
    return g


@pytest.mark.parametrize("n, Br, Bc, causal", [(113, 16, 16, False), (239, 32, 8, True), (64, 64, 16, False),
                                               (16, 16, 16, True), (100, 16, 32, True)])
def test_sawtooth_reorders_only_the_kv_steps_of_odd_query_blocks(n, Br, Bc, causal):
    pb = Problem(AttentionShape(1, 2, n, n, 8), tau=1.0, dtype="float16", causal=causal)
    plain = forward(pb, Tiling(Br, Bc))
    Tr = -(-n // Br)
    reordered = forward(pb, Tiling(Br, Bc), sawtooth=True)
    for b in range(plain.blocks):
        before, after = list(plain.steps(b)), list(reordered.steps(b))
        assert Counter(a for step in before for a in step) == Counter(a for step in after for a in step)
        assert after[0][0] == before[0][0] and after[-1][-2:] == before[-1][-2:]  # Q_i first; O_i, lse_i last
        if b % Tr % 2 and len(before) > 1:  # odd block: K/V blocks from the last to the first
            assert after[0][1:] == before[-1][:2] and after[-1][:2] == before[0][1:]
            assert [s[-2:] for s in after[1:-1]] == [s[-2:] for s in before[1:-1]][::-1]
        else:
            assert after == before
    # an L2 that holds everything reads each input once either way
    config = L2Config(10**9, 8)
    assert simulate(plain, config) == simulate(reordered, config)


@pytest.mark.parametrize("causal", [False, True])
def test_the_sawtooth_grid_counts_the_same_with_cohorts(causal):
    # odd blocks share their head's backward run of steps: run as cohorts, they count what they count one by one
    from test_l2_cohorts import block_by_block, schedule_by_hand

    pb = Problem(AttentionShape(2, 3, 300, 300, 16), tau=1.0, dtype="float16", causal=causal)
    grid = forward(pb, Tiling(16, 16), sawtooth=True)
    for config in (L2Config(20_000, 7), L2Config(60_000, 30)):
        assert simulate(grid, config) == simulate(block_by_block(grid), config)
    assert simulate(grid, L2Config(20_000, 7)) == schedule_by_hand(grid, L2Config(20_000, 7))


def test_the_sawtooth_order_is_the_grid_s_option_and_a_kernel_without_it_refuses_it():
    pb, tiling = Problem(AttentionShape(1, 2, 100, 100, 8), tau=1.0, dtype="float16"), Tiling(16, 32)
    own = flash_swapped.forward(pb, tiling, 1, sawtooth=True)
    got = forward(pb, tiling, sawtooth=True)
    assert [list(own.steps(b)) for b in range(own.blocks)] == [list(got.steps(b)) for b in range(got.blocks)]
    # call 1's kernel description takes no sawtooth option: refused by name, not run in the plain order
    with pytest.raises(InputError, match=r"sawtooth=True: kernel='flash-swapped@d4169c1' takes no sawtooth order"):
        call1.FLASH_SWAPPED.grids(Launch(pb, tiling, sawtooth=True))
