"""--window on the command line: W is (W, 0), records carry it, --resume tells windowed rows apart."""

import json

import pytest

from iosim.cli import build_parser, main, run


def parse(*argv):
    return build_parser().parse_args(list(argv))


def test_one_number_is_a_window_back_from_the_diagonal_and_rows_record_it(tmp_path):
    path = tmp_path / "rows.json"
    rows = run(parse("sweep", "--N", "4096", "--d", "64", "--algo", "flash-swapped", "--window", "256",
                     "--json", str(path))).rows
    two = run(parse("sweep", "--N", "4096", "--d", "64", "--algo", "flash-swapped", "--window", "256", "0")).rows
    assert rows[0].record() == two[0].record()
    saved = json.loads(path.read_text())[0]
    assert (saved["window_left"], saved["window_right"], saved["status"]) == (256, 0, "ok")
    assert saved["total"] == saved["predicted"]


def test_resume_recomputes_a_row_whose_window_differs(tmp_path):
    path = tmp_path / "rows.csv"
    grid = ["sweep", "--N", "4096", "--d", "64", "--algo", "flash", "--csv", str(path)]
    run(parse(*grid, "--window", "256"))
    other = run(parse(*grid, "--window", "512", "--resume"))
    assert other.skipped == 0 and len(other.rows) == 1
    again = run(parse(*grid, "--window", "512", "--resume"))
    assert again.skipped == 1 and again.rows == []
    full = run(parse(*grid, "--resume"))
    assert full.skipped == 0 and len(full.rows) == 1


def test_a_sweep_with_a_window_lists_only_the_algorithms_that_take_one():
    names = {r.algorithm for r in run(parse("sweep", "--N", "1024", "--d", "64", "--window", "64")).rows}
    assert names == {"standard", "flash", "flash-swapped", "standard-eager", "split-kv"}


def test_run_checks_a_windowed_training_step_against_the_reference(tmp_path):
    path = tmp_path / "run.json"
    out = run(parse("run", "--algo", "flash", "--N", "239", "--N-k", "100", "--d", "24", "--M", "20k",
                    "--window", "7", "2", "--pass", "fwd+bwd", "--json", str(path)))
    assert out.max_abs_error < 1e-12
    saved = json.loads(path.read_text())
    assert (saved["window_left"], saved["window_right"]) == (7, 2)


def test_optimize_searches_windowed_tilings_and_reports_the_refusals():
    out = run(parse("optimize", "--N", "2048", "--d", "64", "--M", "100k", "--window", "128", "--algo", "flash",
                    "flash-swapped"))
    assert all(r.problem.window is not None for r in out.results)
    assert {rec["window_left"] for rec in out.records()} == {128}


@pytest.mark.parametrize("argv, message", [
    (["--window", "1", "2", "3"], "--window 1 2 3: takes W (for W 0) or L R; got 3 numbers"),
    (["--window", "-2"], "window left=-2 must be an integer >= -1"),
    (["--window", "8", "--algo", "small-cache"], "for small-cache: it takes no sliding window"),
])
def test_bad_windows_exit_2_in_one_line(capsys, argv, message):
    assert main(["sweep", "--N", "256", "--d", "64", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_bound_takes_no_window():
    with pytest.raises(Exception, match="unrecognized arguments: --window"):
        parse("bound", "--N", "1024", "--d", "64", "--window", "64")
