"""experiments/sawtooth.py's grid: the same accesses as flash-swapped's, odd query blocks scanning K/V backward."""

from collections import Counter

import pytest

from helpers import load_experiment
from iosim.l2 import L2Config
from iosim.l2_simulate import simulate
from iosim.problem import AttentionShape, Problem
from iosim.registry import ALGORITHMS
from iosim.tiling import Tiling

saw = load_experiment("sawtooth")


@pytest.mark.parametrize("n, Br, Bc", [(113, 16, 16), (239, 32, 8), (64, 64, 16), (16, 16, 16)])
def test_sawtooth_reorders_only_the_kv_steps_of_odd_query_blocks(n, Br, Bc):
    pb = Problem(AttentionShape(1, 2, n, n, 8), tau=1.0, dtype="float16")
    plain = ALGORITHMS["flash-swapped"].grid(pb, Tiling(Br, Bc))
    Tr = -(-n // Br)
    reordered = saw.sawtooth(plain, Tr)
    for b in range(plain.blocks):
        before, after = list(plain.steps(b)), list(reordered.steps(b))
        assert Counter(a for step in before for a in step) == Counter(a for step in after for a in step)
        assert after[0][0] == before[0][0] and after[-1][-2:] == before[-1][-2:]  # Q_i first; O_i, lse_i last
        if b % Tr % 2 and len(before) > 1:  # odd block: K/V blocks from the last to the first
            assert after[0][1:] == before[-1][:2] and after[-1][:2] == before[0][1:]
        else:
            assert after == before
    # an L2 that holds everything reads each input once either way
    config = L2Config(10**9, 8)
    assert simulate(plain, config) == simulate(reordered, config)
