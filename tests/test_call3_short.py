"""Call 3's short script (experiments/results/gpu/call3.sh first|second): its rows, its time, and its probes on the CPU.

The block-timing probe and the L2 curve run on a GPU; here the traced kernel is held to the untraced one's results
under Numba's CUDA simulator, the probe's summary to stamps whose schedule is known, and the dry run to the rows and
the time the issue asks for.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from numba import cuda

from experiments import block_trace, call3_short, l2_capacity, ncu_traffic
from iosim.kernels import flash_swapped, resolve_config
from iosim.kernels._trace import STAMPS_PER_BLOCK
from iosim.kernels.config import Dropout, TileConfig

DEVICE_CALL_S = 330  # issue 29: each half is one device call of timeout_s about 330


def test_each_half_fits_one_device_call_of_330_s():
    report = call3_short.plan()
    assert set(report["halves_s"]) == {"first", "second", "rest-first", "rest-second", "call5", "call5b"}
    for half, seconds in report["halves_s"].items():
        assert seconds <= DEVICE_CALL_S - 15, (half, seconds)  # 15 s for the setup: the wheel, env.txt


def test_every_short_row_has_both_committed_predictions_and_the_first_part_parts_most():
    report = call3_short.plan()  # raises LookupError for a row with no committed prediction under either schedule
    first, rest = report["ncu"]["short-schedule"]["rows"], report["ncu"]["short-rest"]["rows"]
    assert len(first) + len(rest) == 26
    parting = sorted(r["parting"] for r in first)
    assert parting[len(parting) // 2] > 3.0  # the median row of the first part: schedules part by more than 3×
    keys = [ncu_traffic.join_key(r["config"]) for r in first + rest]
    assert len(set(keys)) == len(keys)


def test_the_dry_run_prints_every_row(capsys):
    call3_short.main([])
    printed = capsys.readouterr().out
    assert printed.count("flash-swapped") >= 24 and "first half" in printed and "second half" in printed


def test_the_traced_forward_computes_what_the_untraced_one_does_and_stamps_every_block():
    rng = np.random.default_rng(3)
    heads, n, d = 2, 37, 16
    q, k, v = (cuda.to_device(rng.standard_normal((heads, n, d)).astype(np.float32)) for _ in range(3))
    config = resolve_config("flash-swapped", d, False, TileConfig(Br=16, Bc=16, TM=2, TN=4))  # 32 threads a block
    blocks = flash_swapped.blocks(heads, n, config)
    assert blocks == heads * math.ceil(n / config.Br) == 6
    options = dict(tau=0.25, causal=False, dropout=Dropout.checked(0.0, 0), config=config, sawtooth=True)
    out, lse = flash_swapped.forward(q, k, v, **options)
    stamps = cuda.to_device(np.zeros(STAMPS_PER_BLOCK * blocks, dtype=np.uint64))
    out_t, lse_t = flash_swapped.forward(q, k, v, **options, stamps=stamps)
    np.testing.assert_array_equal(out_t.copy_to_host(), out.copy_to_host())
    np.testing.assert_array_equal(lse_t.copy_to_host(), lse.copy_to_host())
    words = stamps.copy_to_host().reshape(blocks, STAMPS_PER_BLOCK)
    assert (words[:, 1] > 0).all() and (words[:, 2] >= words[:, 1]).all()
    with pytest.raises(ValueError, match="stamps: shape"):
        flash_swapped.forward(q, k, v, **options, stamps=cuda.to_device(np.zeros(3, dtype=np.uint64)))


def test_the_probe_summary_reads_a_known_schedule():
    # two SMs, two blocks each at once, 6 blocks: blocks 4 and 5 start when 0 and 1 end
    sm = np.array([0, 1, 0, 1, 0, 1])
    start = np.array([0, 10, 5, 15, 100, 110])
    end = np.array([100, 110, 200, 210, 300, 310])
    s = block_trace.summarize(sm, start, end)
    assert s["blocks"] == 6 and s["sms_used"] == 2
    assert s["most_blocks_at_once"] == 4 and s["most_blocks_at_once_on_one_sm"] == 2
    assert s["first_wave_blocks"] == 4 and s["first_wave_start_spread_ns"] == 15
    assert s["span_ns"] == 310 and s["block_ns"]["p50"] == 195
    assert s["start_order_mean_displacement"] == pytest.approx(1 / 3)  # blocks 1 and 2 started in swapped order


def test_the_l2_curve_and_the_probe_run_their_smoke_sizes(tmp_path):
    report = l2_capacity.main(["--smoke", "--out", str(tmp_path)])
    assert [r["bytes"] for r in report["rows"]] == [4096] and (tmp_path / "l2_capacity.json").exists()
    summary = block_trace.main(["--smoke", "--repeats", "1", "--out", str(tmp_path)])
    stamps = summary["traces"]["smoke"]["stamps"]
    assert stamps["blocks"] == summary["traces"]["smoke"]["blocks"] == 6  # 2 heads × 3 blocks of 16 of 40 rows
    assert np.load(tmp_path / "smoke.npz")["start"].min() == 0


def test_the_sanitize_grid_launches_every_kernel_build_once():
    builds = {(c.impl, c.direction, c.dtype, c.sawtooth) for c in ncu_traffic.sanitize_grid()}
    assert ("flash-swapped-tc", "backward", "bfloat16", False) in builds
    assert ("flash-swapped", "forward", "float16", True) in builds


def test_compare_counts_the_tensor_core_kernels_rows_by_their_algorithm(tmp_path):
    folder = call3_short.PREDICTIONS / "call3" / "first" / "ncu-short-schedule"
    rows = ncu_traffic.compare(folder, tmp_path / "traffic")
    (tc,) = [r for r in rows if r["impl"] == "flash-swapped-tc"]
    assert len(rows) == 12
    fields = {f: tc[f] for f in ("direction", "batch", "heads", "n_q", "n_k", "d", "dtype", "causal")}
    twin = ncu_traffic.simulated(ncu_traffic.LaunchConfig("flash-swapped", **fields), **tc["tiling"])
    assert tc["simulated"]["read_bytes"] == twin["read_bytes"] and tc["simulated"]["Br"] == tc["tiling"]["Br"]
