"""The persistent grid (iosim/gpu/grids/persistent.py): without the sawtooth it moves what the dispatched grid moves
in lockstep where every tile has as many steps; with it, odd waves scan their key blocks downwards."""

from __future__ import annotations

import pytest

from iosim.core.problem import AttentionShape, Problem
from iosim.core.tiling import Tiling
from iosim.gpu.grids import flash_swapped, persistent
from iosim.gpu.l2 import L2Config
from iosim.gpu.schedule import simulate


def problem(heads=3, n=300, d=16, causal=False) -> Problem:
    return Problem(AttentionShape(1, heads, n, n, d), tau=1.0, dtype="float16", causal=causal)


@pytest.mark.parametrize("heads, n, tiling, ctas", [(3, 300, Tiling(32, 16), 5), (2, 512, Tiling(64, 64), 8),
                                                    (1, 1000, Tiling(16, 32), 7), (4, 128, Tiling(32, 32), 16)])
@pytest.mark.parametrize("capacity", [30_000, 300_000, 10**9])
def test_without_the_sawtooth_it_moves_what_the_dispatched_grid_moves(heads, n, tiling, ctas, capacity):
    pb = problem(heads, n)
    config = L2Config(capacity, ctas)
    dispatched = flash_swapped.forward(pb, tiling, 1)
    assert simulate(persistent.forward(pb, tiling, 1, ctas), config) == simulate(dispatched, config)


def test_the_sawtooth_scans_odd_waves_downwards_and_reads_each_tile_once_where_the_l2_holds_all():
    pb, tiling = problem(heads=1, n=128, d=8), Tiling(32, 32)  # 4 tiles of 4 key blocks; 2 CTAs: 2 waves
    grid = persistent.forward(pb, tiling, 1, ctas=2, sawtooth=True)
    names = grid.tiles.tensors

    def kv_order(c):
        return [key // len(names) for step in grid.steps(c) for key, _, _ in step if names[key % len(names)] == "K"]

    assert kv_order(0) == [0, 1, 2, 3, 3, 2, 1, 0]  # tile 0 upwards, tile 2 (its second wave) downwards
    assert kv_order(1) == [0, 1, 2, 3, 3, 2, 1, 0]
    plain = persistent.forward(pb, tiling, 1, ctas=2)
    config = L2Config(10**9, 2)
    assert simulate(grid, config) == simulate(plain, config)


@pytest.mark.parametrize("heads, n, tiling, ctas", [(3, 300, Tiling(32, 16), 5), (2, 512, Tiling(64, 64), 8),
                                                    (1, 1000, Tiling(16, 32), 7), (4, 128, Tiling(32, 32), 16)])
@pytest.mark.parametrize("capacity", [30_000, 300_000, 10**9])
@pytest.mark.parametrize("sawtooth", [False, True])
def test_in_waves_moves_what_the_ctas_move_under_lockstep(heads, n, tiling, ctas, capacity, sawtooth):
    pb = problem(heads, n)
    config = L2Config(capacity, ctas)
    waves = persistent.in_waves(pb, tiling, 1, ctas, sawtooth)
    assert simulate(waves, config) == simulate(persistent.forward(pb, tiling, 1, ctas, sawtooth), config)
    assert persistent.in_waves(problem(heads, n, causal=True), tiling, 1, ctas, sawtooth) is None
