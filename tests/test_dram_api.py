"""iosim.dram: the two-level count beside the DRAM bytes behind a GPU preset's L2."""

import json

import numpy as np
import pytest

import iosim
from iosim.cli import build_parser, main, run
from iosim.core.errors import InputError
from iosim.core.gpus import GPUS
from iosim.gpu import call1
from iosim.gpu.dram import covered_dram
from iosim.gpu.hardware import hardware
from iosim.gpu.kernels import get_kernel
from iosim.gpu.l2 import in_sequence
from iosim.results import SimResult


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
    (dict(algorithm="standard"), "algorithm 'standard' has no GPU kernel that the L2 model describes"),
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
    assert "DRAM behind the H100 preset's L2" in out


def test_a_training_step_is_its_passes_in_sequence_each_from_a_cold_l2():
    problem = dict(N=150, d=16, M="100k", heads=3, causal=True, dtype="float32", tiling=iosim.Tiling(32, 32))
    forward = iosim.dram("flash-swapped", **problem)
    backward = iosim.dram("flash-swapped", pass_="bwd", **problem)
    step = iosim.dram("flash-swapped", pass_="fwd+bwd", **problem)
    assert step.dram == in_sequence([forward.dram, backward.dram])
    assert step.hbm == iosim.count("flash-swapped", pass_="fwd+bwd", **problem).traffic
    assert step.tiling is None and (step.forward_tiling, step.backward_tiling) == (forward.tiling, backward.tiling)


@pytest.mark.parametrize("algorithm, pass_", [
    # split-kv in float32: its combine's one report build (float16, 48 registers) stands for every dtype and d
    ("flash", "fwd"), ("flash-swapped", "fwd"), ("split-kv", "fwd"), ("flash", "fwd+bwd")])
def test_count_on_a_gpu_carries_the_dram_bytes_of_iosim_dram(algorithm, pass_):
    problem = dict(N=200, N_k=300, d=64, M="100k", heads=3, dtype="float32", pass_=pass_)
    if pass_ != "fwd":  # the backward kernels' tile is square
        problem["tiling"] = iosim.Tiling(32, 32)
    want = iosim.dram(algorithm, gpu="a100", **problem).dram
    counted = iosim.count(algorithm, gpu="a100", **problem)
    assert not hasattr(counted, "dram") and not hasattr(SimResult, "dram")  # no hidden work behind an attribute
    dram = covered_dram(counted.plans, hardware("a100"), algorithm)
    assert dram == want
    assert dram.reads > 0 and {"reads", "writes", "dirty_at_end"} <= set(dir(dram))
    assert not hasattr(iosim.count(algorithm, **problem), "dram")  # no preset named: no DRAM level


def test_count_on_a_gpu_carries_split_kv_s_dram_bytes_where_the_report_has_its_kernels():
    # split-kv in float16 at d = 64, which the resource report measured: both kernels at their blocks per SM
    problem = dict(N=200, N_k=300, d=64, M="100k", heads=3, dtype="float16")
    r = iosim.dram("split-kv", gpu="a100", **problem)
    counted = iosim.count("split-kv", gpu="a100", **problem)
    assert covered_dram(counted.plans, hardware("a100"), "split-kv") == r.dram and r.dram.reads > 0
    assert counted.tiling.splits > 1 and r.kernel == "split-kv"  # the combine ran too


def test_count_on_a_gpu_has_no_dram_level_where_the_model_does_not_cover_the_run():
    shape = dict(N=128, d=64, M="100k", gpu="h100")
    hw = hardware("h100")

    def dram(algorithm, **options):
        counted = iosim.count(algorithm, **options, **shape)
        assert not hasattr(counted, "dram")  # the DRAM level is an explicit call
        return covered_dram(counted.plans, hw, algorithm)

    assert dram("standard") is None  # no kernel grid declared
    assert dram("flash", mask=True) is None  # no kernel takes an explicit mask
    # the backward kernels launch square tiles only; iosim.dram says so by name
    assert dram("flash", pass_="bwd", tiling=iosim.Tiling(16, 32)) is None
    with pytest.raises(iosim.InputError, match="Br == Bc"):
        iosim.dram("flash", pass_="bwd", tiling=iosim.Tiling(16, 32), **shape)


def test_simulate_on_a_gpu_carries_the_dram_bytes_of_its_forward_pass():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 113, 16)) for _ in range(3))
    r = iosim.simulate("flash-swapped", q, k, v, M="100k", gpu="h100")
    assert not hasattr(r, "dram")
    hw = hardware("h100")
    counted = iosim.count("flash-swapped", N=113, d=16, heads=2, M="100k", gpu="h100")
    assert covered_dram(r.plans, hw, "flash-swapped") == covered_dram(counted.plans, hw, "flash-swapped")
    assert covered_dram(r.plans, hw, "flash-swapped") == iosim.dram("flash-swapped", N=113, d=16, heads=2,
                                                                    M="100k", gpu="h100").dram


def test_a_sweep_s_kernel_goes_to_the_algorithm_it_implements_and_resume_keys_on_it(tmp_path):
    # N_q = 64 by N_k = 32 at d = 64 caps flash-swapped's tile at 64 x 32, where call 1's kernel held 4 blocks per SM
    # (iosim.gpu.call1.SWAPPED_FORWARD) and today's holds 2 (the resource report): 528 and 264 blocks at once
    path = tmp_path / "s.json"
    grid = ["sweep", "--gpu", "h100", "--N", "64", "--N-k", "32", "--d", "64", "--heads", "64",
            "--algo", "flash-swapped", "flash", "--json", str(path)]
    swapped, flash = run(build_parser().parse_args([*grid, "--kernel", "flash-swapped@d4169c1"])).rows
    problem = dict(N=64, N_k=32, d=64, heads=64, M=swapped.M, gpu="h100")
    call_1 = iosim.dram("flash-swapped", kernel="flash-swapped@d4169c1", **problem)
    today = iosim.dram("flash-swapped", **problem)
    sms = int(GPUS["h100"].sms.value)
    assert swapped.tiling == call_1.tiling == iosim.Tiling(64, 32) and call1.SWAPPED_FORWARD[(64, 64, 32)] == 4
    assert swapped.dram == call_1.dram != today.dram
    assert (call_1.dram.concurrent, today.dram.concurrent) == (4 * sms, 2 * sms)
    assert (call_1.kernel, today.kernel) == ("flash-swapped@d4169c1", "flash-swapped")
    assert flash.dram == iosim.dram("flash", **problem).dram  # --kernel names flash-swapped's: flash keeps its own
    assert (swapped.kernel, flash.kernel) == ("flash-swapped@d4169c1", None)
    records = json.loads(path.read_text())
    assert [(r["algorithm"], r["kernel"]) for r in records] == [("flash-swapped", "flash-swapped@d4169c1"),
                                                                ("flash", None)]
    assert (records[0]["dram_read_bytes"], records[0]["dram_write_bytes"], records[0]["dram_dirty_bytes"]) == (
        call_1.dram.reads, call_1.dram.writes, call_1.dram.dirty_at_end)
    # --resume keys on the kernel: the same one re-counts nothing, another re-counts the row it applies to
    again = run(build_parser().parse_args([*grid, "--kernel", "flash-swapped@d4169c1", "--resume"]))
    assert again.rows == [] and len(again.kept) == 2
    tc = run(build_parser().parse_args([*grid, "--kernel", "flash-swapped-tc", "--resume"]))
    assert [(r.algorithm, r.kernel) for r in tc.rows] == [("flash-swapped", "flash-swapped-tc")]
    assert tc.rows[0].dram == iosim.dram("flash-swapped", kernel="flash-swapped-tc", **problem).dram
    plain = run(build_parser().parse_args([*grid, "--resume"]))
    assert [(r.algorithm, r.kernel) for r in plain.rows] == [("flash-swapped", None)]
    assert plain.rows[0].dram == today.dram
    records = json.loads(path.read_text())
    assert sorted((r["algorithm"], str(r["kernel"])) for r in records) == [
        ("flash", "None"), ("flash-swapped", "None"), ("flash-swapped", "flash-swapped-tc"),
        ("flash-swapped", "flash-swapped@d4169c1")]


L2_FLAGS = ["--gpu", "h100", "--l2-bytes", "2MB", "--blocks-per-sm", "1"]


def test_the_l2_overrides_reach_sweep_run_and_optimize_as_iosim_dram_takes_them(tmp_path):
    # 64 heads of N = 2048, d = 64 in float16: K and V of the heads running at once exceed a 2 MB L2
    problem = dict(N=2048, d=64, heads=64, causal=True)
    want = iosim.dram("flash-swapped", M="100k", **problem, l2_bytes="2M", blocks_per_sm=1)
    plain = iosim.dram("flash-swapped", M="100k", **problem)
    assert want.dram != plain.dram  # the overrides change the answer
    shape = ["--N", "2048", "--d", "64", "--heads", "64", "--causal", "--M", "100k"]
    path = tmp_path / "s.json"
    rows = run(build_parser().parse_args(["sweep", "--algo", "flash-swapped", *shape, *L2_FLAGS, "--json", str(path)])
               ).rows
    assert rows[0].dram == want.dram
    record = json.loads(path.read_text())[0]
    assert (record["l2_bytes"], record["blocks_per_sm"], record["schedule"]) == (2_000_000, 1, None)
    found = run(build_parser().parse_args(["optimize", "--algo", "flash-swapped", *shape, *L2_FLAGS, "--objective",
                                           "dram", "--top", "1"])).results[0]
    assert found.dram[0] == iosim.dram("flash-swapped", M="100k", **problem, tiling=found.best[0].tiling,
                                       l2_bytes="2M", blocks_per_sm=1).dram


@pytest.mark.parametrize("command", ["sweep", "run", "optimize"])
def test_an_l2_override_without_a_gpu_is_refused_in_one_line(command, capsys):
    args = [command, "--algo", "flash-swapped", "--N", "64", "--d", "16", "--blocks-per-sm", "3"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("iosim: error: --blocks-per-sm 3 without --gpu: it changes a GPU preset's L2 model; "
                           "allowed: --gpu NAME --blocks-per-sm 3")


@pytest.mark.parametrize("kwargs, message", [
    (dict(schedule="waves"), r"schedule='waves' is not one of \['lockstep', 'timed'\]"),
    (dict(schedule="staggered"), r"schedule='staggered' is retired after calls 3 and 4"),
    (dict(blocks_per_sm=0), r"blocks_per_sm=0 is outside the allowed range"),
])
def test_bad_l2_overrides_are_refused_by_name(kwargs, message):
    with pytest.raises(iosim.InputError, match=message):
        iosim.dram("flash-swapped", N=64, d=16, M="100k", **kwargs)


def test_flash_swapped_forward_dram_is_independent_of_the_number_of_blocks():
    # the closed form's work is O(waves at a head boundary), not O(T_r·T_c): a billion tokens answer at once
    r = iosim.dram("flash-swapped", N=10**9, d=128, M="200k")
    t = r.forward_tiling
    kv = -(-10**9 // t.Bc) * t.Bc * 128 * 2  # K of one head, float16, read from DRAM at least once
    assert r.dram.tensor("K").reads >= kv and r.dram.tensor("Q").reads == 10**9 * 128 * 2


def test_a_count_that_would_take_too_long_is_refused_with_its_estimate():
    from iosim.gpu.dram import DramTooLong

    with pytest.raises(DramTooLong, match=r"lockstep count of its [\d,]+ steps of one block would take about [\d,]+ s"):
        iosim.dram("flash", N=16 * 2**20, d=128, M="100k", causal=True)
    with pytest.raises(DramTooLong, match="the simulation"):
        iosim.dram("flash-swapped", N=2**22, d=128, M="100k", causal=True)
    with pytest.raises(DramTooLong, match=r"more than 1e-09 s"):  # the budget is the caller's
        iosim.dram("flash-swapped", N=4096, d=128, M="100k", causal=True, budget_s=1e-9)
    assert iosim.dram("flash-swapped", N=4096, d=128, M="100k", causal=True, budget_s=None).dram.reads > 0
    # at a billion tokens the estimate comes from the block's step count, not from listing its steps
    t = iosim.count("flash", N=10**9, d=64, M="100k").forward_tiling
    q_blocks, k_blocks = -(-10**9 // t.Br), -(-10**9 // t.Bc)
    with pytest.raises(DramTooLong, match=f"lockstep count of its {q_blocks + q_blocks * k_blocks:,} steps of one"):
        iosim.dram("flash", N=10**9, d=64, M="100k")


def test_a_walk_of_steps_slower_than_the_rates_say_is_refused_as_it_walks(monkeypatch):
    # flash's causal prefill of 32 heads grouped by 8: each head's steps are its own, walked in Python. The rate of
    # the compiled loop passes it, and it is refused once the walk's pace shows how long the whole would take
    from iosim.gpu import budget

    monkeypatch.setattr(budget, "WATCH_AFTER_S", 0.0)
    args = dict(N=1024, N_k=2**16, d=128, heads=32, kv_heads=8, causal=True, M="100k")
    t = iosim.count("flash", **args).forward_tiling
    visits = 32 * -(-1024 // t.Br) * -(-2**16 // t.Bc)
    assert visits / budget.ROUNDS_VISITS_PER_S < 0.01  # what the rate alone would let through
    with pytest.raises(budget.DramTooLong, match=r"the simulation of its [\d,]+ tile visits would take about [\d,]+ s "
                                               r"\(its walk of their steps, a third of it, paced over the first"):
        iosim.dram("flash", **args, budget_s=0.01)
    assert iosim.dram("flash", **args).dram.reads > 0  # the default budget lets it through


@pytest.mark.parametrize("kernel, algorithm", [("flash", "flash"), ("flash-swapped", "flash-swapped"),
                                               ("flash-swapped-tc", "flash-swapped"), ("split-kv", "split-kv")])
def test_a_causal_decode_streams_its_steps_as_an_unmasked_one_with_the_same_count(kernel, algorithm):
    # one query block is the last query row's, which sees every key: the causal mask hides no tile, so the count is
    # the unmasked one, and its steps stream (no flattened arrays of every step: 9 MB for flash at 128Ki keys before)
    import tracemalloc

    args = dict(N=1, N_k=2**17, d=128, heads=32, kv_heads=8, M="100k", kernel=kernel)
    unmasked = iosim.dram(algorithm, **args).dram
    tracemalloc.start()
    try:
        causal = iosim.dram(algorithm, **args, causal=True).dram
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert causal == unmasked and peak < 2e6, peak


@pytest.mark.parametrize("n_q, n_k, d, heads, kv_heads, causal, window", [
    (1, 1, 8, 1, 1, False, None), (113, 239, 16, 2, 2, True, None), (239, 113, 8, 4, 2, False, None),
    (200, 200, 8, 1, 1, False, (30, 5)), (64, 1000, 16, 3, 3, True, None)])
def test_flash_s_grid_knows_its_block_s_steps_without_walking_them(n_q, n_k, d, heads, kv_heads, causal, window):
    from iosim.api import count_problem
    from iosim.gpu.grids import flash

    pb = count_problem(n_q, d, n_k, heads=heads, kv_heads=kv_heads, causal=causal, window=window)
    for tiling in (iosim.Tiling(16, 16), iosim.Tiling(32, 8), iosim.Tiling(7, 50)):
        grid = flash.forward(pb, tiling, 1)
        assert all(grid.block_steps == len(list(grid.steps(b))) for b in range(grid.blocks))
        # the backward's blocks may make steps of key blocks no query meets: it claims no count it cannot keep
        if tiling.Br == tiling.Bc:  # the backward kernel's tiles are square
            assert flash.backward(pb, tiling, 1).block_steps is None


def test_a_sweep_row_whose_dram_count_is_too_long_says_why(tmp_path, capsys):
    path = tmp_path / "rows.json"
    assert main(["sweep", "--gpu", "h100", "--N", "16Mi", "--d", "128", "--algo", "flash", "--causal",
                 "--json", str(path)]) == 0
    (row,) = json.loads(path.read_text())
    assert row["dram_read_bytes"] is None and "would take about" in row["dram_note"]
    assert "DRAM B — (flash): the DRAM level of flash" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["run", "--gpu", "h100", "--N", "64", "--d", "16", "--algo", "flash-swapped", "--kernel", "flash"],
    ["sweep", "--gpu", "h100", "--N", "64", "--d", "16", "--algo", "flash-swapped", "split-kv", "--kernel", "flash"],
    ["optimize", "--gpu", "h100", "--N", "64", "--d", "16", "--algo", "flash", "--objective", "dram",
     "--kernel", "sdpa-flash"],
])
def test_a_kernel_of_none_of_the_algorithms_counted_is_refused_in_one_line_before_any_work(capsys, argv):
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    implements = get_kernel(argv[-1]).algorithm
    assert len(err) == 1 and f"--kernel {argv[-1]} implements {implements}, which is not counted here" in err[0], err
    assert f"--algo {implements}; or no --kernel" in err[0] and captured.out == ""


def test_a_kernel_that_serves_some_of_the_algorithms_says_which_it_leaves_to_their_own(capsys):
    grid = ["--gpu", "h100", "--N", "64", "--d", "16", "--algo", "flash", "flash-swapped", "--kernel", "sdpa-flash"]
    sweep = run(build_parser().parse_args(["sweep", *grid]))
    note = "--kernel sdpa-flash implements flash-swapped only; ignored by flash"
    assert note in sweep.notes and [r.kernel for r in sweep.rows] == [None, "sdpa-flash"]
    optimum = run(build_parser().parse_args(["optimize", *grid[:-2], "--kernel", "flash-swapped-tc",
                                             "--objective", "dram"]))
    assert optimum.notes == ("--kernel flash-swapped-tc implements flash-swapped only; ignored by flash",)


@pytest.mark.parametrize("option", [["--kernel", "sdpa-flash"], ["--schedule", "timed"], ["--l2-bytes", "25MB"],
                                    ["--blocks-per-sm", "2"]])
def test_optimize_refuses_an_l2_option_its_hbm_objective_would_ignore(capsys, option):
    assert main(["optimize", "--gpu", "h100", "--N", "64", "--d", "16", "--algo", "flash-swapped", *option]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{option[0]} " in err[0] and "with --objective hbm" in err[0], err
    assert f"allowed: --objective dram, or no {option[0]}" in err[0]


def test_a_kernel_that_refuses_a_row_says_why_in_its_record_and_once_below_the_table(tmp_path, capsys):
    # FlashAttention-3 has no float8_e5m2 kernel; flash has no kernel for a sliding window, which a note above the
    # table says for every row already; the backward of flash-swapped's own kernel takes square tiles alone
    path = tmp_path / "rows.json"
    assert main(["sweep", "--gpu", "h100", "--N", "1024", "--d", "64", "--algo", "flash-swapped", "--kernel", "fa3",
                 "--dtype", "float8_e5m2", "--json", str(path)]) == 0
    (row,) = json.loads(path.read_text())
    assert row["dram_read_bytes"] is None and row["dram_note"].startswith(
        "kernel fa3 refuses flash-swapped here: dtype='float8_e5m2': FlashAttention-3 takes")
    assert "DRAM B — (flash-swapped): kernel fa3 refuses flash-swapped here" in capsys.readouterr().out
    run_path = tmp_path / "run.json"
    assert main(["run", "--gpu", "h100", "--N", "100", "--d", "64", "--algo", "flash-swapped", "--kernel", "fa3",
                 "--dtype", "float32", "--json", str(run_path)]) == 0
    record = json.loads(run_path.read_text())
    assert record["dram_read_bytes"] is None and "dtype='float32': FlashAttention-3 takes" in record["dram_note"]
    assert "no DRAM bytes: kernel fa3 refuses flash-swapped here" in capsys.readouterr().out
    window = tmp_path / "window.json"
    assert main(["sweep", "--gpu", "h100", "--N", "1024", "--d", "64", "--algo", "flash", "--window", "128", "0",
                 "--json", str(window)]) == 0
    (row,) = json.loads(window.read_text())
    assert row["dram_read_bytes"] is None and row["dram_note"].startswith("window=(128, 0): no GPU kernel of iosim")
    out = " ".join(capsys.readouterr().out.split())
    assert "window=(128, 0): no GPU kernel of iosim" in out and "DRAM B —" not in out  # said once, above the table
    square = tmp_path / "square.json"
    assert main(["sweep", "--gpu", "h100", "--N", "4096", "--d", "64", "--algo", "flash-swapped", "--heads", "16",
                 "--pass", "bwd", "--schedule", "timed", "--json", str(square)]) == 0
    (row,) = json.loads(square.read_text())
    assert row["dram_read_bytes"] is None and row["dram_note"] == (
        f"Br={row['Br']}, Bc={row['Bc']}: the backward kernel's tile is square; allowed: Br == Bc")
    assert "DRAM B — (flash-swapped): Br=" in capsys.readouterr().out


@pytest.mark.parametrize("flags, why", [
    (["--algo", "flash-swapped", "--dtype", "float8_e4m3"], "dtype='float8_e4m3': this kernel has no FP8 build"),
    (["--algo", "flash-swapped", "--dtype", "bfloat16"], "dtype='bfloat16': kernel='flash-swapped' is built for"),
    (["--algo", "flash", "--window", "16"], "window=(16, 0): no GPU kernel of iosim takes a sliding window"),
    (["--algo", "standard"], "algorithm 'standard' has no GPU kernel"),
    (["--algo", "flash-swapped", "--pass", "bwd"], "run gives the DRAM bytes of a forward pass only; `iosim sweep "
                                                   "--pass bwd` with the same options gives the backward kernels' "
                                                   "DRAM bytes"),
    (["--algo", "flash-swapped", "--pass", "fwd+bwd"], "run gives the DRAM bytes of a forward pass only; `iosim "
                                                       "sweep --pass fwd+bwd` with the same options gives both "
                                                       "passes' DRAM bytes"),
])
def test_a_run_without_dram_bytes_says_why_where_its_one_algorithm_has_no_grid(tmp_path, capsys, flags, why):
    # a run of one algorithm says why, as a sweep's records do (the test above), and why it has no grid at all
    path = tmp_path / "run.json"
    assert main(["run", "--gpu", "h100", "--N", "48", "--d", "16", *flags, "--json", str(path)]) == 0
    record = json.loads(path.read_text())
    assert record["dram_read_bytes"] is None and record["dram_note"].startswith(why), record["dram_note"]
    assert "no DRAM bytes: " + why[:40] in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("flags, message", [
    (["--l2-bytes", "1"], "l2_bytes=1 is outside the allowed range [32, 52,428,800]"),
    (["--l2-bytes", "1GB"], "l2_bytes=1,000,000,000 is outside the allowed range [32, 52,428,800]"),
    (["--blocks-per-sm", "1e9"],
     "blocks_per_sm=1000000000 is more than an SM of the H100 holds (compute capability 9.0); allowed: 1 to 32"),
    (["--blocks-per-sm", "30"], "blocks_per_sm=30: the kernel's registers, shared memory and threads fit at most"),
])
def test_an_l2_override_out_of_range_is_refused_in_one_line(flags, message, capsys):
    assert main(["sweep", "--gpu", "h100", "--algo", "flash-swapped", "--N", "1024", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("given, message", [
    (dict(budget_s="x"), "budget_s='x' is not a number of seconds; allowed: a finite number > 0, or None"),
    (dict(budget_s=float("nan")), "budget_s=nan is not a number of seconds"),
    (dict(budget_s=-1), "budget_s=-1 is not a number of seconds"),
    (dict(budget_s=True), "budget_s=True is not a number of seconds"),
    (dict(sawtooth=1), "sawtooth=1 must be True or False"),
    (dict(sawtooth="no"), "sawtooth='no' must be True or False"),
    (dict(l2_bytes="1xB"), "l2_bytes='1xB' is not a count"),
])
def test_the_api_refuses_by_name_what_the_command_line_refuses(given, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        iosim.dram("flash-swapped", N=64, d=64, M="100k", gpu="h100", **given)


def test_the_api_takes_the_l2_bytes_with_their_unit_as_the_command_line_does(monkeypatch):
    from iosim.cli.common import bytes_arg
    from iosim.gpu import dram

    for text, value in (("25MB", 25 * 10**6), ("32MiB", 2**25), ("4096B", 4096), ("25M", 25 * 10**6)):
        assert hardware("h100", l2_bytes=text).l2_bytes == value == bytes_arg(text)
    seen = []  # the capacity iosim.dram's count runs under
    at_spreads = dram.at_spreads
    monkeypatch.setattr(dram, "at_spreads", lambda plans, hw, *rest: seen.append(hw.l2_bytes) or at_spreads(
        plans, hw, *rest))
    iosim.dram("flash-swapped", N=64, d=64, M="100k", gpu="h100", l2_bytes="25MB")
    assert seen == [25 * 10**6]


def test_the_sweep_counts_the_backward_s_dram_bytes_and_run_the_forward_s(tmp_path):
    # d = 128 at the H100's M: the backward's tiling is square (105 × 105), which flash-swapped's kernels launch
    path = tmp_path / "rows.json"
    assert main(["sweep", "--gpu", "h100", "--algo", "flash-swapped", "--N", "1000", "--d", "128", "--pass", "bwd",
                 "--json", str(path)]) == 0
    (row,) = json.loads(path.read_text())
    want = iosim.dram("flash-swapped", N=1000, d=128, M=row["M"], pass_="bwd").dram
    assert (row["dram_read_bytes"], row["dram_write_bytes"]) == (want.reads, want.writes) and want.reads > 0
    run_path = tmp_path / "run.json"
    assert main(["run", "--gpu", "h100", "--algo", "flash-swapped", "--N", "100", "--d", "64", "--pass", "bwd",
                 "--json", str(run_path)]) == 0
    assert json.loads(run_path.read_text())["dram_read_bytes"] is None
