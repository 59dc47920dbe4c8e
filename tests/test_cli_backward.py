"""The command line's --pass: the backward pass and a whole training step, counted and run."""

import json

import pytest
from helpers import BACKWARD_NAMES, kv_resident_example

import iosim
from iosim.cli import build_parser, main, run


def parse(*argv):
    return build_parser().parse_args(list(argv))


@pytest.fixture
def no_backward():
    """The architecture example, registered: an algorithm with no backward pass."""
    algo = iosim.register(kv_resident_example())
    yield algo
    del iosim.ALGORITHMS[algo.name]


@pytest.mark.parametrize("algorithm", BACKWARD_NAMES)
def test_sweep_fwd_plus_bwd_adds_the_two_passes(algorithm):
    rows = {p: run(parse("sweep", "--algo", algorithm, "--N", "1000", "--d", "48", "--causal", "--pass", p)).rows[0]
            for p in ("fwd", "bwd", "fwd+bwd")}
    both = rows["fwd+bwd"]
    forward = rows["fwd"].counts
    if iosim.ALGORITHMS[algorithm].step_shares_tiling:  # both passes on the backward's tiles
        assert both.forward_tiling == rows["bwd"].backward_tiling
        forward = iosim.count(algorithm, N=1000, d=48, M="100k", causal=True, tiling=both.forward_tiling).traffic
    else:
        assert both.forward_tiling == rows["fwd"].forward_tiling
    assert both.backward_tiling == rows["bwd"].backward_tiling
    assert both.total == forward.total + rows["bwd"].total == both.predicted
    assert both.counts.total_bytes == forward.total_bytes + rows["bwd"].counts.total_bytes
    assert rows["bwd"].total == iosim.predict(algorithm, N=1000, d=48, M="100k", causal=True, pass_="bwd").exact.total


def test_sweep_records_the_pass_and_resume_tells_passes_apart(tmp_path):
    path = tmp_path / "s.json"
    run(parse("sweep", "--algo", "flash", "--N", "512", "--d", "64", "--json", str(path)))
    out = run(parse("sweep", "--algo", "flash", "--N", "512", "--d", "64", "--pass", "bwd", "--json", str(path),
                    "--resume"))
    assert len(out.rows) == 1, "a backward row is a new configuration, not one already in the file"
    records = json.loads(path.read_text())
    assert [r["pass"] for r in records] == ["fwd", "bwd"]
    assert records[1]["total"] == iosim.count("flash", N=512, d=64, M="100k", pass_="bwd").traffic.total


@pytest.mark.parametrize("pass_", ["bwd", "fwd+bwd"])
def test_run_checks_gradients_against_the_reference(pass_, tmp_path):
    path = tmp_path / "r.json"
    out = run(parse("run", "--algo", "flash-swapped", "--N", "90", "--N-k", "61", "--d", "12", "--M", "6k",
                    "--causal", "--dropout", "0.2", "--pass", pass_, "--json", str(path)))
    assert out.max_rel_error < 1e-12
    record = json.loads(path.read_text())
    assert record["pass"] == pass_ and record["total"] == out.traffic.total
    predicted = iosim.predict("flash-swapped", N=90, N_k=61, d=12, M="6k", causal=True, pass_="bwd").exact
    if pass_ == "fwd+bwd":
        predicted = iosim.core.counts.combined(
            iosim.predict("flash-swapped", N=90, N_k=61, d=12, M="6k", causal=True).exact, predicted)
        assert (record["bwd_Br"], record["bwd_Bc"]) == (out.result.backward_tiling.Br, out.result.backward_tiling.Bc)
    assert out.traffic == predicted


@pytest.mark.parametrize("command", ["sweep", "run"])
@pytest.mark.parametrize("pass_", ["bwd", "fwd+bwd"])
def test_a_pass_the_algorithm_lacks_exits_2_with_one_line(capsys, no_backward, command, pass_):
    assert main([command, "--algo", no_backward.name, "--N", "64", "--d", "8", "--M", "5k", "--pass", pass_]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and f"algorithm={no_backward.name!r} has no backward pass" in lines[0], captured.err
    assert "allowed with pass 'bwd' or 'fwd+bwd': standard, flash, flash-swapped" in lines[0]
    assert "Traceback" not in captured.err + captured.out


def test_an_unknown_pass_exits_2_with_one_line(capsys):
    assert main(["sweep", "--pass", "backward"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "argument --pass: invalid choice: 'backward'" in lines[0]


def test_a_sweep_over_a_flex_mask_names_no_algorithm_it_would_not_have_counted(capsys):
    # with --flex-mask a sweep lists flex alone, which has a backward pass: small-cache and split-kv were never asked
    argv = ["sweep", "--N", "256", "--d", "64", "--pass", "fwd+bwd"]
    assert main([*argv, "--flex-mask", "window", "64", "--score-mod", "softcap", "30"]) == 0
    assert "no backward pass" not in capsys.readouterr().out
    assert main(argv) == 0
    assert "small-cache, split-kv have no backward pass and are not counted" in capsys.readouterr().out
