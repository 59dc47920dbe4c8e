"""experiments/gpu_bench.py runs end to end (under the CUDA simulator) and keeps finished work.

Nothing timed is asserted: simulator times are host wall-clock and mean nothing.
"""

from __future__ import annotations

import json

from experiments import gpu_bench as bench
from experiments import plot_gpu_bench as plot
from iosim import kernels
from iosim.kernels._device import simulator_enabled
from iosim.kernels.api import BACKWARD_IMPLS


def test_smoke_sweep_writes_seed_002_json_per_config_and_resumes(tmp_path):
    # every impl once, and one of them causal too (--causal both names the two apart): the causal kernels' results
    # are tests/test_kernels.py's, this is the harness
    first, *others = BACKWARD_IMPLS
    records = bench.run(bench.build_parser().parse_args(["--smoke", "--causal", "both", "--impl", first, "--out",
                                                         str(tmp_path)]))
    records += bench.run(bench.build_parser().parse_args(["--smoke", "--impl", *others, "--out", str(tmp_path)]))

    files = sorted(tmp_path.glob("*.json"))
    assert len(records) == len(files) == len(BACKWARD_IMPLS) + 1, [f.name for f in files]
    for path in files:
        record = json.loads(path.read_text())
        assert "error" not in record, f"{path.name}: {record.get('error')}"
        for mode in ("forward", "backward", "forward_backward"):
            assert set(record[mode]) == {"time(s)", "FLOPS(TFLOPs/s)"}, f"{path.name} {mode}: {record[mode]}"
            assert record[mode]["time(s)"] > 0
        peak, reserved = record["peak_memory_usage(MB)"], record["peak_memory_reserved(MB)"]
        if simulator_enabled():
            assert peak is None and reserved is None, (
                f"{path.name}: the simulator has no device memory: {peak}, {reserved}"
            )
        else:  # inputs alone are 4 · 16 · 2 · 16 · 4 bytes; the pass allocates more
            assert 0 < peak <= reserved, f"{path.name}: peak allocated {peak} MB, reserved {reserved} MB"
        assert set(record["implementation"]) == {"forward", "backward"}, record["implementation"]
        meta = record["metadata"]
        for key in ("device", "git_commit", "command", "numba", "numba_cuda", "timing"):
            assert meta.get(key), f"{path.name}: metadata lacks {key}: {meta}"
        p = record["parameters"]
        assert p["head_dim"] == p["emb_dim"] // p["num_heads"]

    # A second run finds every configuration saved and measures nothing again.
    assert bench.run(bench.build_parser().parse_args(["--smoke", "--causal", "both", "--impl", first, "--out",
                                                      str(tmp_path)])) == []
    assert bench.run(bench.build_parser().parse_args(["--smoke", "--impl", *others, "--out", str(tmp_path)])) == []

    figure = plot.plot(plot.load(tmp_path), tmp_path / "bench.png")
    assert figure.stat().st_size > 0


def test_bfloat16_runs_the_tensor_core_kernels_and_records_the_others_refusal(tmp_path):
    args = bench.build_parser().parse_args(
        ["--smoke", "--dtype", "bfloat16", "--impl", "flash-swapped-tc", "flash", "--out", str(tmp_path)]
    )
    records = {r["parameters"]["impl"]: r for r in bench.run(args)}
    assert set(records) == {"flash-swapped-tc", "flash"}
    tc = records["flash-swapped-tc"]
    assert "error" not in tc, tc.get("error")
    assert all(tc[mode]["time(s)"] > 0 for mode in ("forward", "backward", "forward_backward")), tc
    assert "bfloat16" in records["flash"]["error"] and records["flash"]["forward"]["time(s)"] is None, records["flash"]


def test_flop_counts_follow_flashattention_convention():
    cfg = bench.BenchConfig(
        batch_size=2, seq_len=8, num_heads=3, emb_dim=12, causal=False, impl="flash", dtype="float32"
    )
    forward = 4 * 2 * 3 * 8**2 * 4  # two N × N × d matmuls, 2 FLOPs per multiply-add
    assert bench.flops(cfg, "forward") == forward
    assert bench.flops(cfg, "backward") == 2.5 * forward
    assert bench.flops(cfg, "forward_backward") == 3.5 * forward
    causal = bench.BenchConfig(2, 8, 3, 12, True, "flash", "float32")
    assert bench.flops(causal, "forward") == forward / 2


def test_failed_configuration_writes_seed_002_keys_with_nulls_and_the_error(tmp_path):
    # a head dim one past what shared memory allows fails in the host API, before any launch
    impl = next(name for name in kernels.IMPLS if kernels.max_head_dim(name) is not None)
    d = kernels.max_head_dim(impl) + 1
    argv = ["--impl", impl, "--batch-size", "1", "--num-heads", "1", "--emb-dim", str(d), "--seq-len", "16",
            "--warmup", "0", "--repeats", "1", "--out", str(tmp_path)]
    (record,) = bench.run(bench.build_parser().parse_args(argv))

    assert record == json.loads(next(tmp_path.glob("*.json")).read_text())
    assert f"d={d}" in record["error"], record["error"]
    for mode in ("forward", "backward", "forward_backward"):
        assert record[mode] == {"time(s)": None, "FLOPS(TFLOPs/s)": None}, f"{mode}: {record[mode]}"
    assert record["peak_memory_usage(MB)"] is None and record["peak_memory_reserved(MB)"] is None
    assert record["metadata"]["git_commit"]
