"""The timed schedule (iosim/gpu/timed.py): with every speed 1 and no miss penalty it is the lockstep schedule, count
for count; a penalty reorders steps but never loses a compulsory read; its parameters are checked by name."""

from __future__ import annotations

import heapq
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_l2_cohorts import grids

from iosim.core.errors import InputError
from iosim.core.problem import AttentionShape, Band, Problem
from iosim.core.tiling import Tiling
from iosim.gpu import timed_engine
from iosim.gpu.grids import flash_swapped
from iosim.gpu.kernel import Launch
from iosim.gpu.kernels import KERNELS
from iosim.gpu.l2 import LRU, READ, WRITE, DramCounts, Grid, L2Config, SharedSteps, Tiles
from iosim.gpu.schedule import simulate
from iosim.gpu.timed import Timing, factors, simulate_rounds, simulate_timed, simulate_timed_each


def problem(heads=3, n=300, n_k=None, d=16, causal=False, dtype="float16") -> Problem:
    return Problem(AttentionShape(1, heads, n, n if n_k is None else n_k, d), tau=1.0, dtype=dtype, causal=causal)


CASES = [  # (kernel, problem, tiling, backward, sawtooth)
    ("flash-swapped", problem(), Tiling(32, 16), False, False),
    ("flash-swapped", problem(causal=True, n_k=260), Tiling(16, 32), False, False),
    ("flash-swapped", problem(heads=2, n=200), Tiling(16, 16), False, True),
    ("flash-swapped", problem(heads=2, n=100, dtype="float32"), Tiling(16, 16), True, False),
    ("flash", problem(causal=True), Tiling(32, 32), False, False),
    ("flash", problem(heads=2, n=90), Tiling(16, 16), True, False),
    ("sdpa-flash", problem(heads=2, n=700, d=64, causal=True), Tiling(128, 128), False, False),
    ("sdpa-flash", problem(heads=2, n=300, d=128), Tiling(64, 128), True, False),
]


@pytest.mark.parametrize("kernel, pb, tiling, backward, sawtooth", CASES)
@pytest.mark.parametrize("capacity, concurrent", [(40_000, 5), (200_000, 16), (10**9, 3)])
def test_without_penalty_or_spread_it_is_the_lockstep_schedule(kernel, pb, tiling, backward, sawtooth, capacity,
                                                               concurrent):
    for g in KERNELS[kernel].grids(Launch(pb, tiling, backward, sawtooth, sms=1)):
        config = L2Config(capacity, concurrent)
        want = simulate(g, config)
        assert simulate_timed(g, config, Timing(), sms=2) == want
        assert simulate_rounds(g, config) == want  # the lockstep schedule's own compiled loop


@settings(max_examples=200, deadline=None)
@given(grids())
def test_the_compiled_lockstep_loop_counts_what_the_schedule_counts(case):
    # random blocks, some without steps, some sharing runs (tests/test_l2_cohorts.py)
    grid, config = case
    assert simulate_rounds(grid, config) == simulate(grid, config)


@pytest.mark.parametrize("kernel, pb, tiling, backward, sawtooth", CASES[:3] + CASES[6:7])
def test_a_penalty_and_a_spread_reorder_steps_but_an_l2_that_holds_everything_reads_each_tile_once(
        kernel, pb, tiling, backward, sawtooth):
    (g,) = KERNELS[kernel].grids(Launch(pb, tiling, backward, sawtooth, sms=1))
    config = L2Config(10**9, 7)
    timing = Timing(miss_bytes_per_step=500.0, sm_spread=0.05, block_spread=0.02, seed=4)
    assert simulate_timed(g, config, timing, sms=3) == simulate(g, config)


def grid_of(blocks: list[list[str]]) -> Grid:
    """Blocks reading one 32-byte tile a step, named by letter: the same letter is the same tile."""
    tiles = Tiles(("K",))
    steps = [[(tiles.access("K", ord(name), 32, READ),) for name in block] for block in blocks]
    return Grid(len(blocks), lambda b: iter(steps[b]), tiles, 1)


def test_a_follower_that_hits_catches_up_with_a_leader_that_misses():
    # Two slots, an L2 of three 32-byte tiles, a miss costs one more unit (B = 32 bytes). Block 0 reads a b c d e f,
    # block 1 reads a x y b c d e f. In lockstep block 1 falls two rounds behind on b … f and misses all but f: 6 + 6
    # reads. Timed, block 1 hits a (1 unit) while block 0 misses it (2 units), and at each of block 0's misses it
    # gains a unit: it reaches b at t = 5 while b is still held, hits b c d e, and leads on f (block 0 then hits it):
    # a b c d e by block 0, x y f by block 1, 8 reads. Issue times (block 0 | block 1): a 0 | a 0, x 1; b 2 | y 3;
    # c 4 | b 5; d 6 | c 6, d 7; e 8 | e 8, f 9; f 10
    g = grid_of([list("abcdef"), list("axybcdef")])
    config = L2Config(96, 2)
    assert simulate(g, config).reads == 12 * 32
    assert simulate_timed(g, config, Timing(miss_bytes_per_step=32.0), sms=2).reads == 8 * 32


def test_the_same_seed_gives_the_same_counts_and_parameters_are_checked_by_name():
    (g,) = KERNELS["flash-swapped"].grids(Launch(problem(causal=True), Tiling(16, 16)))
    timing = Timing(miss_bytes_per_step=2000.0, sm_spread=0.1, seed=7)
    config = L2Config(30_000, 6)
    assert simulate_timed(g, config, timing, sms=3) == simulate_timed(g, config, timing, sms=3)
    with pytest.raises(InputError, match="miss_bytes_per_step=0"):
        Timing(miss_bytes_per_step=0)
    with pytest.raises(InputError, match="sm_spread=0.7"):
        Timing(sm_spread=0.7)
    with pytest.raises(InputError, match="sms=0"):
        simulate_timed(g, config, Timing(), sms=0)
    assert Timing().miss_bytes_per_step == math.inf


@settings(max_examples=40, deadline=None)
@given(grids(), st.integers(0, 3))
def test_the_band_s_loops_run_side_by_side_from_one_grid_count_what_each_counts_alone(case, seed):
    grid, config = case
    timings = (Timing(500.0, 0.0, 0.005, seed), Timing(500.0), Timing(32.0, 0.05, 0.2, seed))
    assert simulate_timed_each(grid, config, timings, sms=2) == [simulate_timed(grid, config, t, sms=2)
                                                                   for t in timings]


def test_iosim_dram_runs_the_timed_schedule_with_its_penalty_from_the_preset_and_the_kernel_s_measured_rate():
    import iosim
    from iosim.core.gpus import GPUS
    from iosim.gpu.hardware import hardware

    # one head, causal, 512 query blocks over 264 slots, K and V of 8.4 MB through a 4 MB L2
    shape = dict(N=32768, d=64, M="228KiB", heads=1, causal=True, tiling=iosim.Tiling(64, 32), l2_bytes=4_000_000)
    r = iosim.dram("flash-swapped", schedule="timed", **shape)
    # B = 3,352.32 GB/s × (4 · 64 · 32 · 64 FLOPs a step) / 20.59 TFLOP/s, call 3's flash-swapped forward
    B = 5120 / 8 * 2 * 2619e6 * 4 * 64 * 32 * 64 / 20.59e12
    assert GPUS["h100"].hbm_bandwidth.value == 5120 / 8 * 2 * 2619e6
    (g,) = KERNELS["flash-swapped"].grids(Launch(r.problem, r.tiling, sms=132))
    hw = hardware("h100", l2_bytes=4_000_000)
    assert g.code_bytes is None  # a causal build without dropout was not compiled: no code counted
    for counts, spread in zip((r.dram, *r.band), (0.005, 0.0, 0.01)):
        assert counts == simulate_timed(g, hw.config(g), Timing(B, 0.0, spread), sms=132)
    # the refill blocks catch up with the leaders: fewer reads than lockstep, fewer still once the blocks spread
    assert max(r.dram.reads, r.band[1].reads) < r.band[0].reads < simulate(g, hw.config(g)).reads
    with pytest.raises(InputError, match="schedule='timed' with kernel='flash-swapped' backward"):
        iosim.dram("flash-swapped", schedule="timed", pass_="bwd", N=256, d=64, M="228KiB",
                   tiling=iosim.Tiling(32, 32))
    with pytest.raises(InputError, match="schedule='timed' with kernel='flash' forward"):
        iosim.dram("flash", schedule="timed", N=256, d=64, M="228KiB")


def test_the_sweep_runs_the_timed_schedule_and_says_so(capsys):
    from iosim.cli import main

    assert main(["sweep", "--gpu", "h100", "--schedule", "timed", "--algo", "flash-swapped", "--N", "1024", "--d",
                 "128"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    # Q, K, V read, O and lse written, once each: 4 × 262 KB + 4 KB
    assert "the timed schedule (blocks at their own speed" in out and "1.05MB" in out
    assert "HBM and DRAM traffic in bytes" in out


def test_a_row_the_timed_schedule_cannot_time_says_why_it_has_no_DRAM_bytes(tmp_path, capsys):
    import json

    from iosim.cli import main

    path = tmp_path / "rows.json"
    grid = ["--gpu", "h100", "--algo", "flash", "flash-swapped", "--N", "1024", "--d", "64", "--json", str(path)]
    assert main(["sweep", "--schedule", "timed", *grid]) == 0
    timed = {r["algorithm"]: r for r in json.loads(path.read_text())}
    out = " ".join(capsys.readouterr().out.split())
    assert "DRAM B — (flash): schedule='timed' with kernel='flash' forward" in out and "lockstep schedule counts" in out
    assert timed["flash"]["dram_read_bytes"] is None and "kernel='flash'" in timed["flash"]["dram_note"]
    assert timed["flash-swapped"]["dram_read_bytes"] > 0 and timed["flash-swapped"]["dram_note"] is None
    assert main(["sweep", *grid]) == 0  # lockstep, the default, counts flash's kernel
    lockstep = {r["algorithm"]: r for r in json.loads(path.read_text())}
    assert lockstep["flash"]["dram_read_bytes"] > 0 and lockstep["flash"]["dram_note"] is None


def test_a_row_the_spread_moves_by_more_than_10_percent_is_bracketed_and_its_range_recorded(tmp_path, capsys):
    import json

    import iosim
    from iosim.cli import main

    # call 3's causal row at the tiles the sweep picks: the two ends and the middle read 0.97 to 1.27 GB
    shape = dict(N=65536, d=128, dtype="float32", causal=True)
    r = iosim.dram("flash-swapped", M="58368", schedule="timed", **shape)
    reads = sorted([r.dram.reads, *(b.reads for b in r.band)])
    assert r.bracketed is (any(abs(b.reads - r.dram.reads) > 0.1 * r.dram.reads for b in r.band)) is True
    path = tmp_path / "rows.json"
    assert main(["sweep", "--gpu", "h100", "--schedule", "timed", "--algo", "flash-swapped", "--N", "64Ki", "--d",
                 "128", "--dtype", "float32", "--causal", "--json", str(path)]) == 0
    (row,) = json.loads(path.read_text())
    assert (row["dram_read_bytes"], row["dram_read_low"], row["dram_read_high"], row["dram_bracketed"]) == (
        r.dram.reads, reads[0], reads[-1], True)
    out = " ".join(capsys.readouterr().out.split())
    assert "DRAM B *: bracketed, not predicted" in out
    run_path = tmp_path / "run.json"
    assert main(["run", "--gpu", "h100", "--schedule", "timed", "--algo", "flash-swapped", "--N", "256", "--d", "64",
                 "--json", str(run_path)]) == 0
    record = json.loads(run_path.read_text())
    assert record["dram_read_low"] == record["dram_read_high"] == record["dram_read_bytes"]  # Q, K, V once at any speed
    assert record["dram_bracketed"] is False
    assert main(["run", "--gpu", "h100", "--algo", "flash-swapped", "--N", "256", "--d", "64", "--json",
                 str(run_path)]) == 0
    record = json.loads(run_path.read_text())
    assert (record["dram_read_low"], record["dram_read_high"], record["dram_bracketed"]) == (None, None, None)


def timed_by_hand(grid: Grid, config: L2Config, timing: Timing, sms: int) -> DramCounts:
    """The timed schedule written out in Python, event by event, as an independent check of the compiled loop: the
    first W blocks start at 0 in slot order; the step whose issue time is earliest (ties in slot order) runs against
    the LRU and takes f_s·g_b + (bytes missed) / B; a block that ends gives its slot to the next block in grid order at
    its end (a block without steps leaves the slot empty)."""
    l2 = LRU(config.capacity, len(grid.tiles.tensors))
    rng = np.random.default_rng(timing.seed)
    sm_speed = factors(sms, timing.sm_spread, rng)
    block_speed = factors(grid.blocks, timing.block_spread, rng)
    penalty = 0.0 if math.isinf(timing.miss_bytes_per_step) else 1.0 / timing.miss_bytes_per_step
    running, heap, pending = {}, [], iter(range(grid.blocks))

    def start(slot, at):
        b = next(pending, None)
        if b is None:
            return
        steps = iter(grid.steps(b))
        first = next(steps, None)
        if first is not None:
            running[slot] = (steps, first, float(sm_speed[slot % sms] * block_speed[b]))
            heapq.heappush(heap, (at, slot))

    for slot in range(min(config.concurrent, grid.blocks)):
        start(slot, 0.0)
    while heap:
        at, slot = heapq.heappop(heap)
        steps, step, speed = running[slot]
        before = sum(l2.reads)
        l2.step(step)
        done = at + speed + (sum(l2.reads) - before) * penalty
        following = next(steps, None)
        if following is None:
            del running[slot]
            start(slot, done)
        else:
            running[slot] = (steps, following, speed)
            heapq.heappush(heap, (done, slot))
    return l2.counts(grid.tiles, config)


@settings(max_examples=200, deadline=None)
@given(grids(), st.sampled_from([math.inf, 32.0, 500.0]), st.sampled_from([0.0, 0.05]),
       st.sampled_from([0.0, 0.01, 0.2]), st.integers(1, 4), st.integers(0, 3))
def test_the_compiled_loop_counts_what_the_loop_written_out_counts(case, miss, sm_spread, block_spread, sms, seed):
    grid, config = case
    timing = Timing(miss_bytes_per_step=miss, sm_spread=sm_spread, block_spread=block_spread, seed=seed)
    assert simulate_timed(grid, config, timing, sms) == timed_by_hand(grid, config, timing, sms)


@pytest.mark.parametrize("kernel, pb, tiling, backward, sawtooth", CASES)
def test_on_the_kernels_grids_too(kernel, pb, tiling, backward, sawtooth):
    timing = Timing(miss_bytes_per_step=3000.0, sm_spread=0.05, block_spread=0.01, seed=2)
    for g in KERNELS[kernel].grids(Launch(pb, tiling, backward, sawtooth, sms=1)):
        config = L2Config(60_000, 11)
        assert simulate_timed(g, config, timing, sms=3) == timed_by_hand(g, config, timing, sms=3)


def test_a_repeated_step_that_wrote_past_the_l2_is_run_again():
    # a write of 4,096 bytes to a tile the 64-byte L2 cannot hold goes past it; the read of 32 bytes after it makes the
    # tile resident, clean: the same step again hits the tile with the write and makes it dirty, so it is not skipped
    tiles = Tiles(("A",))
    step = (tiles.access("A", 0, 4096, WRITE), tiles.access("A", 0, 32, READ))
    g = Grid(2, lambda b: iter([step]), tiles, 1)
    config = L2Config(64, 2)
    expected = timed_by_hand(g, config, Timing(), 1)
    assert expected.dirty_at_end == 32
    assert simulate_timed(g, config, Timing(), 1) == simulate(g, config) == simulate_rounds(g, config) == expected


def with_partners(grid: Grid) -> Grid:
    """``grid`` with every plain read of a tile followed at once by a read of its own second tile (of C, 32 to 96
    bytes), as K_j is by V_j: a tile only ever read then makes a pair that ``paired`` joins; one also written does not.
    Shared step objects stay shared."""
    made: dict[int, tuple] = {}
    bodies: dict[int, list] = {}

    def partnered(step):
        if id(step) not in made:
            made[id(step)] = sum(((access, grid.tiles.access("C", 1000 + access[0], 32 * (1 + access[0] % 3), READ))
                                  if access[2] == READ else (access,) for access in step), ())
        return made[id(step)]

    def steps(b):
        found = grid.steps(b)
        if not isinstance(found, SharedSteps):
            return iter([partnered(s) for s in found])
        if id(found.body) not in bodies:
            bodies[id(found.body)] = [partnered(s) for s in found.body]
        return SharedSteps(tuple(map(partnered, found.head)), bodies[id(found.body)], found.start, found.stop,
                           tuple(map(partnered, found.tail)))

    return Grid(grid.blocks, steps, grid.tiles, grid.blocks_per_sm)


@settings(max_examples=150, deadline=None)
@given(grids(), st.sampled_from([math.inf, 64.0]), st.sampled_from([0.0, 0.1]), st.integers(0, 3))
def test_tiles_read_in_pairs_are_counted_as_the_loops_written_out_count_them(case, miss, block_spread, seed):
    grid, config = case
    grid = with_partners(grid)
    timing = Timing(miss_bytes_per_step=miss, block_spread=block_spread, seed=seed)
    assert simulate_rounds(grid, config) == simulate(grid, config)
    assert simulate_timed(grid, config, timing, 2) == timed_by_hand(grid, config, timing, 2)


def test_flatten_shows_its_watch_the_steps_walked_and_flattens_the_same(monkeypatch):
    # flash's grouped heads, each block its own steps (walked in chunks of WATCH_EVERY, here 7), and flash-swapped's
    # shared runs (a block's run counted once per block that makes it): the last count is every step the blocks make
    monkeypatch.setattr(timed_engine, "WATCH_EVERY", 7)
    grouped = Problem(AttentionShape(1, 4, 300, 300, 16, kv_heads=2), tau=1.0, dtype="float16")
    grids = [KERNELS["flash"].grids(Launch(grouped, Tiling(32, 16), sms=1))[0],
             KERNELS["flash-swapped"].grids(Launch(problem(d=16), Tiling(32, 16), sms=1))[0]]
    for g in grids:
        seen: list[int] = []
        flat = timed_engine.flatten(g, seen.append)
        assert seen == sorted(seen) and seen[-1] == sum(1 for b in range(g.blocks) for _ in g.steps(b))
        plain = timed_engine.flatten(g)
        assert all(np.array_equal(x, y) for x, y in zip(vars(flat).values(), vars(plain).values()))
    walked: list[int] = []

    def stop(n: int) -> None:  # a watch that raises stops the walk where it is
        walked.append(n)
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        timed_engine.flatten(grids[0], stop)
    assert walked == [7]


def as_steps(flat: timed_engine.FlatGrid) -> list[tuple]:
    """Every step every block of ``flat`` makes, in block order: (block, the step, its accesses as (the tile,
    tensor, bytes, mode)), steps and tiles named by where they first appear, so that two flattenings compare equal
    exactly when their blocks make the same steps, share the same ones and touch the same tiles."""
    steps: dict[int, int] = {}
    tiles: dict[int, int] = {}
    out = []
    for b in range(flat.body.shape[0]):
        ids = list(flat.pre_ids[flat.pre_offsets[b]:flat.pre_offsets[b + 1]])
        if flat.body[b] >= 0:
            base = flat.body_offsets[flat.body[b]]
            ids += list(flat.body_ids[base + flat.start[b]:base + flat.stop[b]])
        ids += list(flat.post_ids[flat.post_offsets[b]:flat.post_offsets[b + 1]])
        for s in ids:
            span = range(flat.step_offsets[s], flat.step_offsets[s + 1])
            out.append((b, steps.setdefault(int(s), len(steps)), tuple(
                (tiles.setdefault(int(flat.keys[a]), len(tiles)), int(flat.key_tensor[flat.keys[a]]),
                 int(flat.nbytes[a]), int(flat.modes[a])) for a in span)))
    return out


@pytest.mark.parametrize("shape, options, tiling, sawtooth", [
    (AttentionShape(1, 2, 113, 239, 16), {}, Tiling(32, 16), False),
    (AttentionShape(2, 2, 239, 113, 24, d_v=16), {"causal": True}, Tiling(16, 64), False),
    (AttentionShape(1, 4, 239, 239, 16, kv_heads=2), {"causal": True}, Tiling(16, 16), True),
    (AttentionShape(1, 2, 200, 200, 16), {}, Tiling(32, 32), True),
    (AttentionShape(1, 2, 239, 200, 16), {"window": Band(40, 8)}, Tiling(16, 32), True),
    (AttentionShape(1, 1, 1, 239, 16), {"causal": True}, Tiling(16, 16), False),
    (AttentionShape(1, 3, 113, 1, 40), {}, Tiling(32, 16), True),
    (AttentionShape(1, 2, 64, 64, 16), {"dtype": "float32"}, Tiling(64, 64), False),
])
def test_flash_swapped_s_forward_built_as_arrays_is_the_grid_its_blocks_walk(shape, options, tiling, sawtooth):
    # the forward grid builds its arrays from the shape (iosim.gpu.grids.swapped_flat) instead of walking its
    # blocks: the same steps, shared the same way, on the same tiles, and the same counts under both schedules
    pb = Problem(shape, tau=1.0, **{"dtype": "float16", **options})
    grid = flash_swapped.forward(pb, tiling, 2, sawtooth)  # the grid alone takes d_v != d and windows
    assert grid.flat is not None
    built, walked = timed_engine.flatten(grid), timed_engine.flatten(replace(grid, flat=None))
    assert as_steps(built) == as_steps(walked)
    for capacity, concurrent in [(6_000, 3), (60_000, 7), (10**8, 4)]:
        for counts in (lambda f: timed_engine.run_rounds(f, 5, capacity, concurrent),
                       lambda f: timed_engine.run(f, 5, capacity, concurrent, np.ones(2),
                                                  np.random.default_rng(3).normal(1, 0.01, grid.blocks), 1e-4)):
            assert all(np.array_equal(x, y) for x, y in zip(counts(built), counts(walked), strict=True))


def test_k_and_v_are_joined_where_the_pair_fits_and_left_apart_where_it_does_not():
    # flash-swapped, 3 heads of 300 rows, d = 16 in float16, at (32, 16): K_j and V_j, 512 B each (the last, of 12
    # rows, 384 B), read together at every step, join. A head's distinct steps hold 39 such pairs: the 19 of its shared
    # run, K_0, V_0 with each of its 10 query blocks' Q_i, and K_18, V_18 with each O_i; Q_i, O_i and lse_i are alone
    (g,) = KERNELS["flash-swapped"].grids(Launch(problem(d=16), Tiling(32, 16), sms=1))
    flat = timed_engine.flatten(g)
    joined = timed_engine.paired(flat, 10**9)
    pairs = joined.partner_bytes > 0
    assert len(flat.keys) - len(joined.keys) == pairs.sum() == 3 * (19 + 10 + 10)
    assert set(joined.partner_bytes[pairs]) == {512, 384} and set(joined.nbytes[pairs]) == {1024, 768}
    assert timed_engine.paired(flat, 767) is flat  # no pair fits: all left apart
    only_last = timed_engine.paired(flat, 1023).partner_bytes
    assert set(only_last[only_last > 0]) == {384}  # only the last pair fits
    # Y (32 B), then K (64 B) and V (64 B), then Y, through 96 B: apart, V evicts Y and Y misses again (192 B read);
    # joined, the 128 B pair would go past the L2 and leave Y held (160 B)
    tiles = Tiles(("K", "V", "Y"))
    step = (tiles.access("K", 0, 64, READ), tiles.access("V", 0, 64, READ))
    y = (tiles.access("Y", 0, 32, READ),)
    g = grid_of_steps(tiles, [[y, step, y]])
    config = L2Config(96, 1)
    assert simulate_rounds(g, config).reads == simulate(g, config).reads == 2 * 32 + 64 + 64
    # K read at 224 B, then at 96 B, beside V (64 B), through 300 B: apart, Y (96 B) evicts K alone, and K's smaller
    # refill fits beside V, which hits (480 B); joined, Y would evict the pair and V miss again (544 B)
    g = grid_of_steps(tiles, [[(tiles.access("K", 0, 224, READ), step[1], tiles.access("Y", 0, 96, READ)),
                               (tiles.access("K", 0, 96, READ), step[1])]])
    config = L2Config(300, 1)
    assert simulate_rounds(g, config).reads == simulate(g, config).reads == 224 + 64 + 96 + 96


def grid_of_steps(tiles: Tiles, blocks: list[list[tuple]]) -> Grid:
    return Grid(len(blocks), lambda b: iter(blocks[b]), tiles, 1)
