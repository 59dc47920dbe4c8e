"""experiments/gpu_bench.py runs end to end (under the CUDA simulator) and keeps finished work.

Nothing timed is asserted: simulator times are host wall-clock and mean nothing.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import kernels

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_smoke_sweep_writes_seed_002_json_per_config_and_resumes(tmp_path):
    bench = _load("gpu_bench")
    args = bench.build_parser().parse_args(["--smoke", "--causal", "both", "--out", str(tmp_path)])
    records = bench.run(args)

    files = sorted(tmp_path.glob("*.json"))
    assert len(records) == len(files) == 2 * len(kernels.IMPLS), [f.name for f in files]
    for path in files:
        record = json.loads(path.read_text())
        assert "error" not in record, f"{path.name}: {record.get('error')}"
        for mode in ("forward", "backward", "forward_backward"):
            assert set(record[mode]) == {"time(s)", "FLOPS(TFLOPs/s)"}, f"{path.name} {mode}: {record[mode]}"
            assert record[mode]["time(s)"] > 0
        assert "peak_memory_usage(MB)" in record
        meta = record["metadata"]
        for key in ("device", "git_commit", "command", "numba", "numba_cuda", "timing"):
            assert meta.get(key), f"{path.name}: metadata lacks {key}: {meta}"
        p = record["parameters"]
        assert p["head_dim"] == p["emb_dim"] // p["num_heads"]

    # A second run finds every configuration saved and measures nothing again.
    assert bench.run(bench.build_parser().parse_args(["--smoke", "--causal", "both", "--out", str(tmp_path)])) == []

    plot = _load("plot_gpu_bench")
    figure = plot.plot(plot.load(tmp_path), tmp_path / "bench.png")
    assert figure.stat().st_size > 0


def test_flop_counts_follow_flashattention_convention():
    bench = _load("gpu_bench")
    cfg = bench.BenchConfig(batch_size=2, seq_len=8, num_heads=3, emb_dim=12, causal=False, impl="flash", dtype="float32")
    forward = 4 * 2 * 3 * 8**2 * 4  # two N × N × d matmuls, 2 FLOPs per multiply-add
    assert bench.flops(cfg, "forward") == forward
    assert bench.flops(cfg, "backward") == 2.5 * forward
    assert bench.flops(cfg, "forward_backward") == 3.5 * forward
    causal = bench.BenchConfig(2, 8, 3, 12, True, "flash", "float32")
    assert bench.flops(causal, "forward") == forward / 2
