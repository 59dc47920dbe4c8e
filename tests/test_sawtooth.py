"""flash-swapped's sawtooth grid (``flash_swapped.sawtooth_grid``, which experiments/sawtooth.py runs): the same
accesses as flash-swapped's, odd query blocks scanning K/V backward."""

from collections import Counter

import pytest

from iosim.algorithms.flash_swapped import sawtooth_grid
from iosim.gpu.l2 import L2Config
from iosim.gpu.schedule import simulate
from iosim.core.problem import AttentionShape, Problem
from iosim.registry import ALGORITHMS
from iosim.core.tiling import Tiling



@pytest.mark.parametrize("n, Br, Bc, causal", [(113, 16, 16, False), (239, 32, 8, True), (64, 64, 16, False),
                                               (16, 16, 16, True), (100, 16, 32, True)])
def test_sawtooth_reorders_only_the_kv_steps_of_odd_query_blocks(n, Br, Bc, causal):
    pb = Problem(AttentionShape(1, 2, n, n, 8), tau=1.0, dtype="float16", causal=causal)
    plain = ALGORITHMS["flash-swapped"].grid(pb, Tiling(Br, Bc))
    Tr = -(-n // Br)
    reordered = sawtooth_grid(pb, Tiling(Br, Bc))
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
    grid = sawtooth_grid(pb, Tiling(16, 16))
    for config in (L2Config(20_000, 7), L2Config(60_000, 30, "staggered")):
        assert simulate(grid, config) == simulate(block_by_block(grid), config)
    assert simulate(grid, L2Config(20_000, 7)) == schedule_by_hand(grid, L2Config(20_000, 7))
