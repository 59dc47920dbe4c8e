"""A numeric run reports its work as it goes; a long one says so first, with the command that answers at once."""

import io
import shlex

import numpy as np
import pytest
from helpers import random_qkv
from rich.console import Console

import iosim
from iosim.cli import build_parser, main, run_cmd
from iosim.cli import progress as progress_module
from iosim.cli.progress import PatientBar, duration


def recorder():
    seen = []
    return seen, lambda done, total: seen.append((done, total))


@pytest.mark.parametrize("algorithm", ["flash", "flash-swapped", "standard", "small-cache", "split-kv"])
def test_simulate_reports_its_work_up_to_the_closed_form_total(algorithm):
    q, k, v = random_qkv(np.random.default_rng(0), 1, 2, 45, 37, 8)
    seen, on_progress = recorder()
    iosim.simulate(algorithm, q, k, v, M=2000, causal=True, on_progress=on_progress)
    done = [d for d, _ in seen]
    assert done == sorted(done) and done[0] > 0
    flops = iosim.predict(algorithm, N=45, N_k=37, d=8, heads=2, M=2000, causal=True).flops
    assert {t for _, t in seen} == {flops.matmul + flops.exp} == {done[-1]}


def test_gradients_report_both_passes_as_one_piece_of_work():
    q, k, v = random_qkv(np.random.default_rng(1), 1, 1, 30, 30, 8)
    seen, on_progress = recorder()
    iosim.gradients("flash", q, k, v, np.ones_like(q), M=2000, on_progress=on_progress)
    flops = iosim.predict("flash", N=30, d=8, M=2000, pass_="fwd+bwd").flops
    assert seen[-1] == (flops.matmul + flops.exp,) * 2
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_on_progress_must_be_callable():
    with pytest.raises(iosim.InputTypeError, match="on_progress=3 must be a function"):
        iosim.simulate("flash", *random_qkv(np.random.default_rng(0), 1, 1, 4, 4, 2), M=100, on_progress=3)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.mark.parametrize("rate, says", [(1000, False), (10, True)])
def test_a_long_run_says_so_once_with_its_estimate_and_the_hint(monkeypatch, rate, says):
    clock = Clock()
    monkeypatch.setattr(progress_module.time, "monotonic", clock)
    console = Console(file=io.StringIO(), width=200)
    with PatientBar(console, "numeric run", "`iosim sweep` answers at once") as bar:
        for step in range(0, 1001, 10):  # work units at `rate` per second, 1000 in all
            bar(step, 1000)
            clock.now += 10 / rate
    out = console.file.getvalue()
    assert ("will take about 100 s" in out and "`iosim sweep` answers at once" in out) == says
    assert out.count("will take") == says


@pytest.mark.parametrize("seconds, text", [(5, "5 s"), (119, "119 s"), (150, "2.5 min"), (3600, "60 min"),
                                           (5 * 3600, "5 h"), (40 * 86400, "40 days")])
def test_durations_read_naturally(seconds, text):
    assert duration(seconds) == text


def test_the_hint_is_a_command_that_answers_at_once(capsys):
    args = build_parser().parse_args(["run", "--algo", "flash-swapped", "--N", "100000", "--N-k", "3000", "--d", "64",
                                      "--heads", "4", "--M", "50k", "--causal", "--pass", "fwd+bwd"])
    command = run_cmd.count_only_hint(args).split("`")[1]
    assert main(shlex.split(command)[3:]) == 0
    assert "flash-swapped" in capsys.readouterr().out


@pytest.mark.parametrize("options", [
    "--algo flash-swapped --N 4096 --d 128 --heads 8 --kv-heads 2 --dtype float32 --gpu h100 --schedule timed "
    "--l2-bytes 25MB --blocks-per-sm 2 --causal --window 64 0 --sinks --pass fwd+bwd --M 50k",
    "--algo flex --seqlens 100 2000 37 --d 64 --flex-mask document --flex-block 64 64 --score-mod softcap 30",
    "--algo block-sparse --N 1000 --N-k 300 --d 32 --batch 2 --sparsity 0.5 --sparsity-pattern local "
    "--sparsity-seed 3 --block-policy paper",
    "--algo split-kv --N 1 --N-k 8192 --d 192 --d-v 128 --latent --splits 4 --page-size 64",
])
def test_the_hint_carries_every_option_run_shares_with_sweep(options):
    """The sweep the hint gives counts the run's problem: every option the two share parses to the run's value."""
    run_args = build_parser().parse_args(["run", *shlex.split(options)])
    sweep_args = build_parser().parse_args(shlex.split(run_cmd.count_only_hint(run_args).split("`")[1])[3:])
    for name, value in vars(run_args).items():
        if name in ("command", "json", "csv") or not hasattr(sweep_args, name):
            continue
        swept = getattr(sweep_args, name)
        assert swept == ([value] if name in ("algo", "N", "d") and value is not None else value), name
