"""iosim.dram: the two-level count beside the DRAM bytes behind a GPU preset's L2."""

import json

import numpy as np
import pytest

import iosim
from iosim.cli import build_parser, main, run
from iosim.gpu.l2 import in_sequence



@pytest.mark.parametrize("algorithm", ["flash", "flash-swapped"])
def test_the_two_level_count_is_counts_own(algorithm):
    problem = dict(N=300, N_k=200, d=64, M="100k", heads=3, causal=True)
    r = iosim.dram(algorithm, **problem)
    assert r.hbm == iosim.count(algorithm, **problem).traffic
    assert r.tiling == iosim.count(algorithm, **problem).tiling


def test_a_problem_the_l2_holds_reads_each_input_once():
    r = iosim.dram("flash-swapped", N=256, d=64, M="100k", heads=2)  # 4 × 64 KiB of q, k, v, o: far below 37 MB
    assert r.dram.reads == 3 * 2 * 256 * 64 * 2  # Q, K, V of both heads, float16
    assert r.dram.writes == 0 and r.dram.dirty_at_end > 0  # the output stays in the L2 until after the kernel


def test_an_l2_that_holds_nothing_passes_every_load_through():
    # one block at a time, an L2 of two sectors: every tile a step reads is a miss, as in the two-level count
    r = iosim.dram("flash-swapped", N=512, d=64, M="100k", heads=2, l2_bytes=64, blocks_per_sm=1)
    for name in ("Q", "K", "V"):
        assert r.dram.tensor(name).reads == r.hbm.tensor(name).read_bytes
    assert r.dram.tensor("O").writes == r.hbm.tensor("O").write_bytes and r.dram.dirty_at_end == 0


def test_the_l2_capacity_takes_units_and_changes_the_answer():
    big = iosim.dram("flash-swapped", N=4096, d=64, M="100k", heads=64)
    small = iosim.dram("flash-swapped", N=4096, d=64, M="100k", heads=64, l2_bytes="1M")
    assert small.dram.reads > big.dram.reads


@pytest.mark.parametrize("kwargs, message", [
    (dict(algorithm="standard"), "algorithm 'standard' declares no GPU grid"),
    (dict(gpu=None), "gpu=None: the DRAM level needs a GPU preset"),
    (dict(l2_bytes=0), r"l2_bytes=0 is outside the allowed range"),
    (dict(gpu="z80"), "z80"),
])
def test_bad_requests_are_refused_by_name(kwargs, message):
    request = dict(algorithm="flash", N=64, d=16, M="100k") | kwargs
    with pytest.raises(iosim.InputError, match=message):
        iosim.dram(request.pop("algorithm"), **request)


def test_a_sweep_on_a_gpu_carries_the_dram_bytes_of_iosim_dram():
    args = build_parser().parse_args(["sweep", "--gpu", "h100", "--N", "1024", "4096", "--d", "64", "--causal",
                                      "--algo", "flash", "flash-swapped", "standard"])
    for r in run(args).rows:
        if r.algorithm == "standard":  # no kernel grid declared: the two-level bytes stand
            assert r.dram is None and r.roofline.intensity == r.flops.matmul / r.total_bytes
            continue
        assert r.dram == iosim.dram(r.algorithm, N=r.N, d=r.d, M=r.M, causal=True, gpu="h100").dram
        assert r.roofline.intensity == r.flops.matmul / r.dram_bytes


@pytest.mark.parametrize("algorithm", ["flash", "flash-swapped", "standard"])
def test_run_on_a_gpu_reports_and_saves_the_dram_bytes(tmp_path, capsys, algorithm):
    path = tmp_path / "r.json"
    assert main(["run", "--algo", algorithm, "--N", "200", "--d", "16", "--heads", "2", "--gpu", "h100",
                 "--json", str(path)]) == 0
    record = json.loads(path.read_text())
    out = capsys.readouterr().out
    if algorithm == "standard":
        assert record["dram_read_bytes"] is None and "DRAM behind" not in out
        return
    expected = iosim.dram(algorithm, N=200, d=16, heads=2, M=record["M"], gpu="h100").dram
    assert (record["dram_read_bytes"], record["dram_write_bytes"], record["dram_dirty_bytes"]) == (
        expected.reads, expected.writes, expected.dirty_at_end)
    assert "DRAM behind the h100 preset's L2" in out


def test_a_training_step_is_its_passes_in_sequence_each_from_a_cold_l2():
    problem = dict(N=150, d=16, M="100k", heads=3, causal=True, dtype="float32", tiling=iosim.Tiling(32, 32))
    forward = iosim.dram("flash-swapped", **problem)
    backward = iosim.dram("flash-swapped", pass_="bwd", **problem)
    step = iosim.dram("flash-swapped", pass_="fwd+bwd", **problem)
    assert step.dram == in_sequence([forward.dram, backward.dram])
    assert step.hbm == iosim.count("flash-swapped", pass_="fwd+bwd", **problem).traffic
    assert step.tiling is None and (step.forward_tiling, step.backward_tiling) == (forward.tiling, backward.tiling)


@pytest.mark.parametrize("algorithm, pass_", [("flash", "fwd"), ("flash-swapped", "fwd"), ("split-kv", "fwd"),
                                              ("flash", "fwd+bwd")])
def test_count_on_a_gpu_carries_the_dram_bytes_of_iosim_dram(algorithm, pass_):
    problem = dict(N=200, N_k=300, d=64, M="100k", heads=3, dtype="float32", pass_=pass_)
    if pass_ != "fwd":  # the backward kernels' tile is square
        problem["tiling"] = iosim.Tiling(32, 32)
    counted = iosim.count(algorithm, gpu="a100", **problem)
    assert counted.dram == iosim.dram(algorithm, gpu="a100", **problem).dram
    assert counted.dram.reads > 0 and {"reads", "writes", "dirty_at_end"} <= set(dir(counted.dram))
    assert iosim.count(algorithm, **problem).dram is None  # no preset named: no DRAM level


def test_count_on_a_gpu_has_no_dram_level_where_the_model_does_not_cover_the_run():
    shape = dict(N=128, d=64, M="100k", gpu="h100")
    assert iosim.count("standard", **shape).dram is None  # no kernel grid declared
    assert iosim.count("flash", mask=True, **shape).dram is None  # no kernel takes an explicit mask
    # the backward kernels launch square tiles only; iosim.dram says so by name
    bwd = iosim.count("flash", pass_="bwd", tiling=iosim.Tiling(16, 32), **shape)
    assert bwd.dram is None
    with pytest.raises(iosim.InputError, match="Br == Bc"):
        iosim.dram("flash", pass_="bwd", tiling=iosim.Tiling(16, 32), **shape)


def test_simulate_on_a_gpu_carries_the_dram_bytes_of_its_forward_pass():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 113, 16)) for _ in range(3))
    r = iosim.simulate("flash-swapped", q, k, v, M="100k", gpu="h100")
    assert r.dram == iosim.count("flash-swapped", N=113, d=16, heads=2, M="100k", gpu="h100").dram


L2_FLAGS = ["--gpu", "h100", "--l2-bytes", "2MB", "--blocks-per-sm", "2", "--schedule", "staggered"]


def test_the_l2_overrides_reach_sweep_run_and_optimize_as_iosim_dram_takes_them(tmp_path):
    # 64 heads of N = 2048, d = 64 in float16: K and V of the heads running at once exceed a 2 MB L2
    problem = dict(N=2048, d=64, heads=64, causal=True)
    want = iosim.dram("flash-swapped", M="100k", **problem, l2_bytes="2M", blocks_per_sm=2, schedule="staggered")
    plain = iosim.dram("flash-swapped", M="100k", **problem)
    assert want.dram.reads > plain.dram.reads  # the overrides change the answer
    shape = ["--N", "2048", "--d", "64", "--heads", "64", "--causal", "--M", "100k"]
    path = tmp_path / "s.json"
    rows = run(build_parser().parse_args(["sweep", "--algo", "flash-swapped", *shape, *L2_FLAGS, "--json", str(path)])
               ).rows
    assert rows[0].dram == want.dram
    record = json.loads(path.read_text())[0]
    assert (record["l2_bytes"], record["blocks_per_sm"], record["schedule"]) == (2_000_000, 2, "staggered")
    found = run(build_parser().parse_args(["optimize", "--algo", "flash-swapped", *shape, *L2_FLAGS, "--objective",
                                           "dram", "--top", "1"])).results[0]
    assert found.dram[0] == iosim.dram("flash-swapped", M="100k", **problem, tiling=found.best[0].tiling,
                                       l2_bytes="2M", blocks_per_sm=2, schedule="staggered").dram


@pytest.mark.parametrize("command", ["sweep", "run", "optimize"])
def test_an_l2_override_without_a_gpu_is_refused_in_one_line(command, capsys):
    args = [command, "--algo", "flash-swapped", "--N", "64", "--d", "16", "--blocks-per-sm", "3"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("iosim: error: --blocks-per-sm 3 without --gpu: it changes a GPU preset's L2 model; "
                           "allowed: --gpu NAME --blocks-per-sm 3")


@pytest.mark.parametrize("kwargs, message", [
    (dict(schedule="waves"), r"schedule='waves' is not one of \['lockstep', 'staggered'\]"),
    (dict(blocks_per_sm=0), r"blocks_per_sm=0 is outside the allowed range"),
])
def test_bad_l2_overrides_are_refused_by_name(kwargs, message):
    with pytest.raises(iosim.InputError, match=message):
        iosim.dram("flash-swapped", N=64, d=16, M="100k", **kwargs)
