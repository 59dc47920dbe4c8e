"""The DRAM level's time budget: a count estimated to take longer than ``BUDGET_S`` is refused with its estimate
(``DramTooLong``) before it runs, from its tile visits at measured rates (``check_budget``), or, for a grid whose
blocks walk their own steps in Python, as it walks (``walk_watch``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from itertools import islice

from iosim.core.errors import InputError
from iosim.core.visits import visits
from iosim.gpu import head_waves
from iosim.gpu.grids.flash import FORM_MAX_QUERY_BLOCKS
from iosim.gpu.kernel import Kernel, Launch
from iosim.gpu.l2 import Grid


class DramTooLong(InputError):
    """The DRAM count of a request would take longer than ``BUDGET_S``: refused, with the estimate, before it runs."""


BUDGET_S = 20.0  # the longest a DRAM count may take before it is refused
# tile visits (query block, key block) a second, measured on this project's 2-core container: the lockstep count of
# flash's one block per head (its stack distances compiled, iosim.gpu._loops.stack) 2.4·10⁵ to 3.4·10⁵ forward and
# 2·10⁵ backward, whose steps make more accesses (Q_i, dO_i, O_i, lse_i and dQ_i beside K_j, V_j), on one head of N =
# 32,768 to 65,536 and 8 causal heads of 16,384 (2026-12-02), taken at half; the simulation of a grid's every block,
# 500,000: flash-swapped's cohorts of blocks that share a head's steps run at 2 to 4 million (2026-11-27), and the
# slowest grid, flash's one block per head over 32 heads grouped by 8 decoding (d = 128, one query block, six accesses
# a step), below the rate: 4.1·10⁵ to 5.2·10⁵ over 4Mi and 16Mi keys, causal or not, on an idle container, and
# 3.6·10⁵ to 4·10⁵ beside another job (2026-12-03, python -m experiments.speed --only rates:
# experiments/results/speed_rates.json), so its estimate near 20 s may run to 25
LOCKSTEP_VISITS_PER_S = 1.2e5
LOCKSTEP_BACKWARD_VISITS_PER_S = 1e5
SIMULATION_VISITS_PER_S = 5e5
# the timed schedule: an insert into its sorted queue and the step's accesses per step, compiled
# (iosim.gpu.timed_engine); its band (three loops side by side, kernel_counts_at) measured 1.6·10⁷ to 2.5·10⁷ steps
# a second, grid built and flattened, on the short grids' six slowest rows (this project's 2-core container,
# 2026-12-02, experiments/results/speed_grid.json at 022f2ca), taken at four fifths of the fewer
TIMED_VISITS_PER_S = 1.3e7
# the lockstep schedule's compiled loop (simulate_rounds), its grid flattened first: about 4·10⁷ tile visits a second
# on 16 causal heads of N = 65,536 (the same record), taken at a third
ROUNDS_VISITS_PER_S = 1.3e7
# how long the walk of a grid's steps runs before its pace is taken to judge the rest (walk_watch), and the share of
# the count it is taken to be: on flash's grid of 32 heads grouped by 8 (d = 128, causal, H100), the walk took 0.63
# to 0.68 of the count in prefills of 2,048 queries over 1Mi keys and 4,096 over 512Ki (3.1·10⁶ steps in about 1 s),
# and 0.38 to 0.41 decoding over 4Mi and 16Mi keys (3.5·10⁵ and 1.4·10⁶ steps in 1.1 and 3.6 s; a decode now streams
# its steps through the simulation instead, iosim.gpu.dram), on this project's 2-core container (2026-12-03), taken
# at a third
WATCH_AFTER_S = 1.0
WALK_SHARE = 1 / 3


def tile_visits(launch: Launch) -> int:
    """The (query block, key block) tiles one batch·head's pass visits: what a count's work grows with."""
    return sum(n for _, _, n in visits(launch.problem, launch.tiling, skips_hidden=True).pairs())


def check_budget(kernel: Kernel, launch: Launch, grid: Grid, lockstep_path: bool, budget_s: float | None,
                 per_s: float = SIMULATION_VISITS_PER_S) -> None:
    """Refuse, with the estimate, a lockstep count or a simulation (at ``per_s`` tile visits a second) of ``grid``, one
    of ``launch``'s kernels, that would take longer than ``budget_s`` (None: no limit). The lockstep count works from
    one block's steps, so it costs those (the grid's ``block_steps`` where it knows them, else counted up to what
    the budget allows; past it, the pass's tile visits a head, which flash's block of a head makes); a simulation
    costs the pass's tile visits."""
    if budget_s is None:
        return
    if lockstep_path:
        rate = LOCKSTEP_BACKWARD_VISITS_PER_S if launch.backward else LOCKSTEP_VISITS_PER_S
        most, unit = int(budget_s * rate), "steps of one block"
        work = grid.block_steps
        if work is None:
            work = sum(1 for _ in islice(iter(grid.steps(0)), most + 1))
            work = work if work <= most else max(work, tile_visits(launch))
    else:
        work, rate, unit = tile_visits(launch) * launch.problem.shape.bh, per_s, "tile visits"
    seconds = work / rate
    if seconds > budget_s:
        how = "the lockstep count" if lockstep_path else "the simulation"
        raise too_long(kernel, launch, f"{how} of its {work:,} {unit} would take about {seconds:,.0f} s", budget_s)


def too_long(kernel: Kernel, launch: Launch, estimate: str, budget_s: float) -> DramTooLong:
    """The refusal of a DRAM count of ``launch`` on ``kernel`` whose ``estimate`` passes ``budget_s``, naming the
    closed forms that answer at once."""
    s = launch.problem.shape
    return DramTooLong(
        f"the DRAM level of {kernel.name} at N={s.n_q:,}, N_k={s.n_k:,}, batch·heads={s.bh:,}: {estimate} (more than "
        f"{budget_s:g} s); closed forms answer at once for the forward without a mask or grouped heads of "
        f"flash-swapped (any N) and of flash (up to {FORM_MAX_QUERY_BLOCKS:,} query blocks), and for the backward's "
        f"main kernels of flash-swapped, flash-swapped-tc, sdpa-flash and fa3 without them (up to "
        f"{head_waves.MOST_LISTED:,} query and key blocks a head)")


def walk_watch(kernel: Kernel, launch: Launch, budget_s: float | None) -> Callable[[int], None] | None:
    """What ``timed_engine.flatten`` calls with the steps it has walked so far: once it has walked for
    ``WATCH_AFTER_S``, it raises ``DramTooLong`` where the count, at the walk's pace so far over the pass's tile
    visits and the walk ``WALK_SHARE`` of it, would take longer than ``budget_s`` (None: no limit). check_budget's
    rates hold for grids whose blocks share their steps; a grid of a block per head's own steps (flash's grouped
    heads at long contexts) walks each step in Python, at a pace its tile visits do not tell, so it is timed as it
    walks."""
    if budget_s is None:
        return None
    visits = tile_visits(launch) * launch.problem.shape.bh
    began = time.perf_counter()

    def watch(walked: int) -> None:
        elapsed = time.perf_counter() - began
        seconds = elapsed * visits / walked / WALK_SHARE
        if elapsed >= WATCH_AFTER_S and walked < visits and seconds > budget_s:
            raise too_long(kernel, launch, f"the simulation of its {visits:,} tile visits would take about "
                           f"{seconds:,.0f} s (its walk of their steps, a third of it, paced over the first "
                           f"{walked:,} in {elapsed:.1f} s)", budget_s)

    return watch
