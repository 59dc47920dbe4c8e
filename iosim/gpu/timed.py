"""A timed schedule: thread blocks that run at their own speed, and stall on the bytes they miss in the L2.

The lockstep schedule (``iosim.gpu.schedule``) moves every running block one step per round. On a GPU a block's step
takes the time of its arithmetic, set by its SM's and its own speed, plus the time to fetch what it missed in the L2
from DRAM, so a block that leads (and misses) slows down, and blocks behind it that hit catch up: blocks that read the
same tiles gather into convoys. ``simulate_timed`` runs a grid that way, event by event:

- W = SMs × blocks per SM slots; slot s is on SM s mod SMs (blocks are dealt round robin over the SMs). The first W
  blocks start at time 0 in slot order; a block that ends frees its slot, which takes the next block in grid order
  at the time the last one ended.
- A step of a block in slot s takes f_s·g_b + m / B time units: f_s the SM's speed factor, g_b the block's own, m the
  bytes the step missed in the L2 (read from DRAM), B ``Timing.miss_bytes_per_step``, the bytes a block's share of
  DRAM bandwidth delivers in the time of one step's arithmetic. The step whose issue time is earliest runs next
  against the L2 (``iosim.gpu.l2.LRU``), ties in slot order.
- With f = g = 1 and no miss penalty (B infinite) every step takes one unit and the blocks step in rounds, in slot
  order: the lockstep schedule exactly (tests/test_timed.py holds the counts equal).

Its cost is an insert into a queue of events kept sorted and the step's accesses per step, compiled with Numba
(``iosim.gpu.timed_engine``; K_j and V_j, read together, are one access): about 4·10⁷ steps a second once compiled,
a step that repeats the one just run, and fits, skipped as all hits. The queue's order is most of that time
(docs/gpu.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from iosim.core.errors import InputError
from iosim.gpu import timed_engine
from iosim.gpu.l2 import SECTOR, DramCounts, DramTensor, Grid, L2Config


@dataclass(frozen=True)
class Timing:
    """The timed schedule's parameters: the miss penalty and the spread of speeds (relative standard deviations of
    normal factors around 1, drawn with ``seed``)."""

    miss_bytes_per_step: float = math.inf  # B: a step that misses m bytes takes m / B units longer
    sm_spread: float = 0.0  # of the SMs' speed factors f_s
    block_spread: float = 0.0  # of each block's own factor g_b
    seed: int = 0

    def __post_init__(self):
        if not self.miss_bytes_per_step > 0:
            raise InputError(f"miss_bytes_per_step={self.miss_bytes_per_step}; allowed: > 0 (math.inf: no penalty)")
        for name in ("sm_spread", "block_spread"):
            value = getattr(self, name)
            if not 0 <= value < 0.5:
                raise InputError(f"{name}={value}; allowed: 0 to 0.5 (a relative standard deviation)")


def factors(n: int, spread: float, rng: np.random.Generator) -> np.ndarray:
    """n speed factors around 1 with relative standard deviation ``spread``, kept above 0.1."""
    return np.ones(n) if spread == 0 else np.maximum(0.1, rng.normal(1.0, spread, n))


def simulate_timed(grid: Grid, config: L2Config, timing: Timing, sms: int) -> DramCounts:
    """Run ``grid`` with ``config.concurrent`` slots on ``sms`` SMs against an LRU L2 of ``config.capacity`` bytes,
    each step timed as the module docstring says; the DRAM counts, as ``iosim.gpu.schedule.simulate`` reports them.
    The event loop is compiled (``iosim.gpu.timed_engine``)."""
    return simulate_timed_each(grid, config, (timing,), sms)[0]


def simulate_timed_each(grid: Grid, config: L2Config, timings: tuple[Timing, ...], sms: int,
                        watch: Callable[[int], None] | None = None) -> list[DramCounts]:
    """``simulate_timed`` under each of ``timings``, the grid flattened once (``watch`` as ``timed_engine.flatten``
    takes it) and the event loops side by side in threads (what the blocks' spread band runs:
    iosim.gpu.dram.at_spreads)."""
    if sms < 1 or config.concurrent < 1:
        raise InputError(f"sms={sms}, concurrent={config.concurrent}; allowed: at least 1 each")
    if config.capacity < SECTOR:
        raise InputError(f"L2 capacity={config.capacity} bytes; allowed: at least one {SECTOR}-byte sector")
    found = timed_engine.run_each(timed_engine.flatten(grid, watch), len(grid.tiles.tensors), config.capacity,
                                  config.concurrent, [draws(grid.blocks, timing, sms) for timing in timings])
    return [_counts(grid, config, f) for f in found]


def draws(blocks: int, timing: Timing, sms: int) -> tuple[np.ndarray, np.ndarray, float]:
    """What ``simulate_timed`` runs ``blocks`` blocks on ``sms`` SMs with: the SMs' and the blocks' speed factors,
    drawn with ``timing.seed``, and the time a missed byte adds (0 without a penalty)."""
    rng = np.random.default_rng(timing.seed)
    sm_speed = factors(sms, timing.sm_spread, rng)
    block_speed = factors(blocks, timing.block_spread, rng)
    return sm_speed, block_speed, 0.0 if math.isinf(timing.miss_bytes_per_step) else 1.0 / timing.miss_bytes_per_step


def simulate_rounds(grid: Grid, config: L2Config, watch: Callable[[int], None] | None = None) -> DramCounts:
    """``iosim.gpu.schedule.simulate``'s counts (the lockstep schedule), by the compiled loop round by round: faster
    where blocks run no cohorts (a causal mask), and equal (tests/test_timed.py). ``watch``: as
    ``timed_engine.flatten`` takes it."""
    return _counts(grid, config, timed_engine.run_rounds(timed_engine.flatten(grid, watch), len(grid.tiles.tensors),
                                                         config.capacity, config.concurrent))


def _counts(grid: Grid, config: L2Config, found: tuple[np.ndarray, np.ndarray, np.ndarray]) -> DramCounts:
    reads, writes, left = found
    return DramCounts(tuple(DramTensor(name, int(reads[k]), int(writes[k]), int(left[k]))
                            for k, name in enumerate(grid.tiles.tensors)), config.capacity, config.concurrent)
