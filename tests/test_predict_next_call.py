"""experiments/predict_next_call.py's backward and split-kv rows: in call 3's grid, and equal to the L2 model's
simulation."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from experiments import ncu_traffic as ncu
from experiments import predict_next_call as predict
from iosim.core.gpus import GPUS
from iosim.core.problem import AttentionShape, Problem
from iosim.core.tiling import Tiling
from iosim.core.visits import visits
from iosim.gpu import call1
from iosim.gpu.dram import kernel_counts
from iosim.gpu.grids import _device, flash_swapped, flash_swapped_tc
from iosim.gpu.grids import split_kv as split_kv_grids
from iosim.gpu.hardware import hardware
from iosim.gpu.kernel import Launch
from iosim.gpu.kernels import KERNELS
from iosim.gpu.l2 import L2Config, in_sequence
from iosim.gpu.schedule import simulate

RESULTS = Path(__file__).resolve().parents[1] / "experiments/results/gpu"
H100 = GPUS["h100"]
SMS = int(H100.sms.value)
# Blocks per H100 SM of the kernels the predictions run, as the resource report gives them (written out here, so that
# the predictions, which read the report through iosim.gpu.kernels, are checked against grids built by hand): the
# backward's grid-stride kernels, row_dot 3 since 8eb2624 (coalesced: 80 registers x 256 threads), fill and cast 5
# (48 and 42 x 256); split-kv's split kernel by d (cd9c224: 220 registers x 128 threads at 64 x 32, 241 x 64 at
# 32 x 16) and its combine (48 x 128)
ROW_DOT_BLOCKS_PER_SM, FILL_BLOCKS_PER_SM, CAST_BLOCKS_PER_SM = 3, 5, 5
SPLIT_BLOCKS_PER_SM = {64: 2, 128: 4}
SPLIT_KV_COMBINE_BLOCKS = 10


def backward_grids(pb: Problem, tiling: Tiling, main: int, tc: bool = False) -> tuple:
    """flash-swapped's backward launch written out: row_dot, fill, the main kernel at ``main`` blocks per SM
    (flash-swapped-tc's where ``tc``), and below float32 the cast of dQ."""
    grid = flash_swapped_tc.backward(pb, tiling, main) if tc else flash_swapped.backward(pb, tiling, main)
    grids = (_device.row_dot(pb, ROW_DOT_BLOCKS_PER_SM), _device.fill(pb, FILL_BLOCKS_PER_SM), grid)
    return grids if pb.dtype == "float32" else grids + (_device.cast(pb, CAST_BLOCKS_PER_SM),)


def split_kv_launches(pb: Problem, tiling: Tiling, split: int) -> tuple:
    """split-kv's launch written out: the split kernel at ``split`` blocks per SM, then the combine where S > 1."""
    grid = split_kv_grids.split(pb, tiling, split)
    return (grid,) if tiling.splits == 1 else (grid, split_kv_grids.combine(pb, tiling, SPLIT_KV_COMBINE_BLOCKS))


def simulated(grids, hw):
    """Every kernel simulated from a cold L2, one after another (``in_sequence``)."""
    return in_sequence([simulate(g, hw.config(g)) for g in grids])


def test_call3_holds_the_forward_rows_first_then_flash_swapped_backward_full_and_causal():
    grid = ncu.GRIDS["call3"]()
    forward = [c for c in grid if c.direction == "forward"]
    tc, gqa, split = ncu.GRIDS["call3-tc-backward"](), ncu.GRIDS["call3-gqa"](), ncu.GRIDS["call3-split-kv"]()
    saw = ncu.GRIDS["call3-sawtooth"]()
    later = len(gqa) + len(split) + len(saw)  # forward parts after the backward ones
    forward = forward[:len(forward) - later]
    backward = grid[len(forward):len(grid) - len(tc) - later]
    # then flash-swapped-tc's backward, the grouped-query forwards, split-kv's decoding, the sawtooth order, the
    # indices before each kept
    assert grid[len(grid) - len(tc) - later:] == tc + gqa + split + saw
    # the forward rows keep the indices predictions-2502058 gave them: 176 of them, first
    assert grid[:len(forward)] == ncu.call3_forward_grid() and len(forward) == 176, len(forward)
    assert backward == ncu.GRIDS["call3-backward"]()
    keys = {(c.impl, c.dtype, c.d, c.causal, c.batch * c.heads, c.n_q, c.n_k) for c in backward}
    # 2 dtypes × 2 d × 2 masks × (3 batch·heads × N 1024, 4096 + batch·heads 1, 16 × N 16384) = 8 × 8
    expected = {("flash-swapped", dtype, d, causal, bh, n, n)
                for dtype in ("float32", "float16") for d in (64, 128) for causal in (False, True)
                for bh, sizes in ((1, (1024, 4096, 16384)), (16, (1024, 4096, 16384)), (256, (1024, 4096)))
                for n in sizes}
    assert keys == expected and len(backward) == 64, sorted(keys ^ expected)
    # the square tile the backward kernel picks now, whose blocks per SM the resource report gives
    assert {c.d: (c.tile()["Br"], c.tile()["Bc"]) for c in backward} == {64: (32, 32), 128: (16, 16)}
    assert all(predict.blocks_per_sm(c) == 4 for c in backward)


def _problem(cfg) -> tuple[Problem, Tiling]:
    tile = cfg.tile()
    return (Problem(AttentionShape(cfg.batch, cfg.heads, cfg.n_q, cfg.n_k, cfg.d), tau=1.0, dtype=cfg.dtype,
                    causal=cfg.causal), Tiling(tile["Br"], tile["Bc"]))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_backward_prediction_is_the_simulation_of_its_kernels(dtype):
    cfg = ncu.LaunchConfig("flash-swapped", "backward", 1, 3, 113, 113, 64, dtype, causal=True)
    pb, tiling = _problem(cfg)
    main = predict.blocks_per_sm(cfg)
    row = predict.predict(cfg)
    nominal = int(GPUS["h100"].l2.value)
    for label, capacity in [("effective", None), ("0.5x", nominal // 2)]:
        got = row[label]
        want = simulated(backward_grids(pb, tiling, main), hardware("h100", l2_bytes=capacity))
        assert (got["reads"], got["writes"], got["dirty_at_end"]) == (want.reads, want.writes, want.dirty_at_end)
        # the report's counts: the main kernel's and the coalesced row_dot's; fill (and cast) 5, as in call 1
        sms, rd = SMS, ROW_DOT_BLOCKS_PER_SM
        assert [k["concurrent"] for k in got["kernels"]] == [rd * sms, 5 * sms, main * sms] + [5 * sms] * (
            dtype != "float32"), got["kernels"]
    # as call 1's kernels (iosim.gpu.call1, grid-stride kernels at 5) would run it, with two grids changed by hand
    grids = call1.FLASH_SWAPPED.grids(Launch(pb, tiling, backward=True))
    assert [g.per_sm(H100) for g in grids] == [call1.GRID_STRIDE, call1.GRID_STRIDE,
                                               call1.SWAPPED_BACKWARD[(64, 32)]] + [call1.GRID_STRIDE] * (
        dtype != "float32")
    hand = simulated([replace(g, blocks_per_sm={0: rd, 2: main}.get(k, g.blocks_per_sm)) for k, g in enumerate(grids)],
                     hardware("h100"))
    assert row["effective"]["reads"] == hand.reads and row["effective"]["writes"] == hand.writes


def test_a_small_l2_evicts_and_still_matches_the_simulation():
    # 16 KiB of L2 at N = 239, d = 128, float16, tile 16 × 16: a main-kernel step's K_j, V_j, Q_i, dO_i are 4 KiB
    # each and dQ_i 8 KiB, so tiles are evicted within a block
    cfg = ncu.LaunchConfig("flash-swapped", "backward", 2, 1, 239, 239, 128, "float16")
    pb, tiling = _problem(cfg)
    main = predict.blocks_per_sm(cfg)
    got = in_sequence(kernel_counts(KERNELS[cfg.impl], predict.launch(cfg), hardware("h100", l2_bytes=16384)))
    grids = call1.FLASH_SWAPPED.grids(Launch(pb, tiling, backward=True))
    per_sm = {0: ROW_DOT_BLOCKS_PER_SM, 2: main}
    want = simulated([replace(g, blocks_per_sm=per_sm.get(k, g.blocks_per_sm)) for k, g in enumerate(grids)],
                     hardware("h100", l2_bytes=16384))
    assert want == simulated(backward_grids(pb, tiling, main), hardware("h100", l2_bytes=16384))
    assert (got.reads, got.writes, got.dirty_at_end) == (want.reads, want.writes, want.dirty_at_end)
    # more than everything read once: dO, O (row_dot), Q, K, V, dO (main) in float16 and dQ in float32 (main, cast)
    once = 2 * 239 * 128 * (6 * 2 + 2 * 4)
    assert got.reads > once, (got.reads, once)


def test_call3_tc_backward_is_the_same_shapes_at_the_tc_kernel_s_tile():
    tc, swapped = ncu.GRIDS["call3-tc-backward"](), ncu.GRIDS["call3-backward"]()
    def shape(c):
        return c.d, c.causal, c.batch, c.heads, c.n_q, c.n_k

    assert sorted(map(shape, tc)) == sorted(map(shape, swapped)) and {c.dtype for c in tc} == {"float16", "bfloat16"}
    # 64 keys by queries_per_step(d): 64 at d = 64, 16 at d = 128 (the resource report's 64x64 and 64x16)
    assert {c.d: (c.tile()["Br"], c.tile()["Bc"]) for c in tc} == {64: (64, 64), 128: (16, 64)}
    assert all(predict.blocks_per_sm(c) == 2 for c in tc)


@pytest.mark.parametrize("n_q, n_k", [(256, 256), (239, 113), (113, 239), (64, 300), (1, 130)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("BQ", [64, 16])
def test_tc_backward_visits_the_blocks_that_see_its_keys_the_whole_ones_first(n_q, n_k, causal, BQ):
    pb = Problem(AttentionShape(1, 1, n_q, n_k, 64), tau=1.0, dtype="float16", causal=causal)
    tiling = Tiling(BQ, 64)
    order = flash_swapped_tc.backward_order(pb, tiling)
    met = visits(pb, tiling, skips_hidden=True)
    for j in range(-(-n_k // 64)):
        run = list(order(j))
        assert sorted(run) == list(met.query_run(j)) and len(set(run)) == len(run), (j, run)
        cols = slice(64 * j, min(n_k, 64 * j + 64))
        whole = [i for i in run if cols.stop - cols.start == 64 and (i + 1) * BQ <= n_q
                 and pb.band.keep(n_q, n_k, slice(i * BQ, (i + 1) * BQ), cols).all()]
        # the kernel's plain steps (every query of the block sees every key, both blocks full) come first
        assert run[:len(whole)] == whole, (j, run, whole)


@pytest.mark.parametrize("causal", [False, True])
def test_tc_backward_grid_counts_the_same_with_cohorts(causal):
    pb = Problem(AttentionShape(2, 3, 300, 300, 64), tau=1.0, dtype="float16", causal=causal)
    grid = flash_swapped_tc.backward(pb, Tiling(16, 64), 2)
    plain = replace(grid, steps=lambda b: iter(list(grid.steps(b))))
    for config in (L2Config(40_000, 7), L2Config(10**8, 264)):
        assert simulate(grid, config) == simulate(plain, config)


def test_call3_gqa_is_flash_swapped_forward_with_grouped_heads_within_the_element_bound():
    gqa = ncu.GRIDS["call3-gqa"]()
    assert {(c.impl, c.direction, c.dtype) for c in gqa} == {("flash-swapped", "forward", "float16")}
    assert {(c.heads, c.kv_heads) for c in gqa} == {(32, 8), (32, 1)} and all(c.kv < c.heads for c in gqa)
    assert all(c.heads * c.n_q * c.d <= ncu.CALL3_MAX_ELEMENTS for c in gqa) and len(gqa) == 20
    # the prediction runs the declared grid on the grouped problem: K/V tiles by K/V head, shared in the L2
    small = ncu.LaunchConfig("flash-swapped", "forward", 1, 4, 256, 256, 64, "float16", kv_heads=1)
    pb = predict.problem(small)
    assert pb.shape.kv_heads == 1 and predict.predict(small)["method"] == "simulation"
    grouped, alone = (predict.predict(c)["effective"]["reads"] for c in (small, replace(small, kv_heads=None)))
    k_v = 2 * 256 * 64 * 2  # one head's K and V, float16
    assert alone - grouped == 3 * k_v  # at this size the L2 holds everything: each K/V head is read once


def test_split_kv_rows_decode_at_the_splits_the_kernel_takes_for_132_sms_and_the_report_s_occupancy():
    from iosim.kernels import split_kv

    rows = ncu.GRIDS["call3-split-kv"]()
    assert len(rows) == 40 and {(c.impl, c.direction, c.dtype, c.n_q, c.causal) for c in rows} == {
        ("split-kv", "forward", "float16", 1, False)}
    for c in rows:
        shape = AttentionShape(c.batch, c.heads, c.n_q, c.n_k, c.d, kv_heads=c.kv_heads)
        config = ncu.kernels.resolve_config("split-kv", c.d, False)
        assert c.splits == split_kv.resolve_splits(None, shape, False, config, sms=132)
        # the package's split grid takes the same blocks per SM at the kernel's tile as the predictions
        split, *combine = KERNELS["split-kv"].grids(predict.launch(c))
        assert split.per_sm(H100) == predict.blocks_per_sm(c) == SPLIT_BLOCKS_PER_SM[c.d], c
        assert all(g.per_sm(H100) == SPLIT_KV_COMBINE_BLOCKS for g in combine)
        assert len(combine) == (c.splits > 1)


@pytest.mark.parametrize("kv_heads, splits", [(2, 5), (8, 1)])
def test_a_split_kv_prediction_is_the_simulation_of_its_two_kernels(kv_heads, splits):
    cfg = ncu.LaunchConfig("split-kv", "forward", 2, 8, 1, 999, 128, "float16", kv_heads=kv_heads, splits=splits)
    row = predict.predict(cfg)
    launch = predict.launch(cfg)
    pb, tiling = launch.problem, launch.tiling
    assert tiling.splits == splits and pb.shape.n_q == 8 // kv_heads  # the group's queries are one head's rows
    for label, capacity in [("effective", None), ("0.5x", int(GPUS["h100"].l2.value) // 2)]:
        grids = split_kv_launches(pb, tiling, SPLIT_BLOCKS_PER_SM[cfg.d])
        want = simulated(grids, hardware("h100", l2_bytes=capacity))
        got = row[label]
        assert (got["reads"], got["writes"], got["dirty_at_end"]) == (want.reads, want.writes, want.dirty_at_end)
        assert [k["kernel"] for k in got["kernels"]] == ["split", "combine"][:len(grids)]
    # K and V are read once from DRAM, each split's share by its own block
    kv = {t["name"]: t["reads"] for t in row["effective"]["by_tensor"]}
    assert kv["K"] == kv["V"] == 2 * kv_heads * 999 * 128 * 2


@pytest.mark.parametrize("path, index", [("predictions-80f2354.json", 176), ("predictions-80f2354.json", 235),
                                         ("predictions-6d16ff6.json", 0)])
def test_committed_backward_predictions_stand_for_the_coalesced_row_dot(path, index):
    # the predictions were committed for the one-thread-per-row row_dot (5 blocks per SM); its coalesced successor
    # runs 3, and every byte of these rows (all 128 backward rows, checked when it changed) comes out the same
    record = json.loads((RESULTS / path).read_text())
    row = record["rows"][index]
    cfg = ncu.LaunchConfig(**{k: row.get(k) for k in ("impl", "direction", "batch", "heads", "n_q", "n_k", "d",
                                                      "dtype", "causal", "dropout_p", "kv_heads")})
    assert cfg.direction == "backward" and cfg.batch * cfg.heads * cfg.n_q <= 16 * 1024, cfg
    got = predict.predict(cfg)
    for label in ("effective", "0.5x"):
        want = row["predicted"][label]
        assert (got[label]["reads"], got[label]["writes"], got[label]["dirty_at_end"]) == (
            want["reads"], want["writes"], want["dirty_at_end"]), (label, cfg)


def test_a_sawtooth_prediction_simulates_the_sawtooth_grid_and_its_pair_is_the_plain_one():
    rows = ncu.GRIDS["call3-sawtooth"]()
    assert len(rows) == 24 and [c.sawtooth for c in rows[:2]] == [False, True]
    assert all(replace(a, sawtooth=True) == b for a, b in zip(rows[::2], rows[1::2]))  # each shape in both orders
    cfg = ncu.LaunchConfig("flash-swapped", "forward", 1, 3, 300, 300, 64, "float16", sawtooth=True)
    pb, tiling = _problem(cfg)
    assert predict.blocks_per_sm(cfg) == 2  # the report's sawtooth build, float16, d = 64, 64 x 32
    grid = flash_swapped.forward(pb, tiling, predict.blocks_per_sm(cfg), sawtooth=True)
    want = simulate(grid, hardware("h100").config(grid))
    got = predict.predict(cfg)
    assert got["grid"] == "iosim.algorithms.flash_swapped.sawtooth_grid"
    assert (got["effective"]["reads"], got["effective"]["writes"]) == (want.reads, want.writes)


def test_a_bfloat16_tensor_core_row_is_set_beside_flash_swapped_s_grid_though_that_kernel_has_no_bfloat16_build():
    # the declared grid at the row's tiles is the grid alone: the refusal of flash-swapped's missing bfloat16 build
    # (a dtype check added after predictions-80f2354) stopped that file's regeneration at its first bfloat16 row
    cfg = next(c for c in ncu.GRIDS["call3"]() if c.dtype == "bfloat16" and c.impl == "flash-swapped-tc"
               and not c.causal and c.batch * c.heads == 1 and c.n_q == 1024)
    row = predict.predict(cfg)
    float16 = predict.predict(replace(cfg, dtype="float16"))
    assert row["declared_grid_effective"] == float16["declared_grid_effective"]  # 2 bytes an element either way
    assert row["declared_grid_effective"]["reads"] > 0
