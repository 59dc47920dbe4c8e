"""The command line: run() returns data; main() prints and exits 2 on bad input, in one line."""

import csv
import json

import pytest

import iosim
from iosim.cli import RunOutcome, SweepOutcome, build_parser, main, run

JSON_KEYS = {"algorithm", "N", "d", "M", "Br", "Bc", "reads", "writes", "total", "predicted", "peak_sram"}


def parse(*argv):
    return build_parser().parse_args(list(argv))


def test_default_sweep_grid_counts_every_algorithm():
    out = run(parse("sweep", "--M", "100k"))
    assert isinstance(out, SweepOutcome)
    # no --sparsity, no --flex-mask: those that need no block mask
    dense = [name for name, a in iosim.ALGORITHMS.items() if a.listed_by_default(())]
    assert [r.algorithm for r in out.rows[::18]] == dense and len(out.rows) == len(dense) * 9 * 2
    assert {r.N for r in out.rows} == {2**e for e in range(8, 17)} and {r.d for r in out.rows} == {64, 128}
    for r in out.rows:
        assert r.status == "ok" and r.total == r.predicted and r.ratio == 1.0, r
        assert r.peak_sram <= r.M == 100_000


def test_sweep_writes_json_and_csv(tmp_path):
    js, cs = tmp_path / "s.json", tmp_path / "s.csv"
    run(parse("sweep", "--M", "192KiB", "--N", "1000", "4096", "--d", "64", "--algo", "flash", "standard",
              "--heads", "2", "--causal", "--json", str(js), "--csv", str(cs)))
    records = json.loads(js.read_text())
    assert len(records) == 4 and JSON_KEYS <= set(records[0])
    assert all(r["M"] == 98_304 for r in records)
    with cs.open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["total"]) for r in rows] == [r["total"] for r in records]


def test_sweep_records_paper_overflow_instead_of_failing():
    out = run(parse("sweep", "--N", "512", "--d", "128", "--block-policy", "paper", "--algo", "flash"))
    (row,) = out.rows
    assert row.total is None and row.status.startswith("does not fit")


def test_run_reports_error_against_reference():
    out = run(parse("run", "--algo", "flash", "--N", "100", "--N-k", "77", "--d", "16", "--M", "5k", "--causal",
                    "--dropout", "0.2"))
    assert isinstance(out, RunOutcome)
    assert out.max_rel_error < 1e-12
    assert out.result.traffic.peak_sram <= 5000


def test_main_prints_a_table(capsys):
    assert main(["sweep", "--N", "256", "--d", "64"]) == 0
    text = capsys.readouterr().out
    assert "flash-swapped" in text and "least traffic at each (N, d)" in text


@pytest.mark.parametrize("argv, message", [
    (["sweep", "--M", "100q"], "M='100q' is not a size"),
    (["sweep", "--N", "0"], "argument --N: 0 is outside the allowed range"),
    (["sweep", "--algo", "nope"], "invalid choice"),
    (["run", "--M", "20"], "below the smallest working set"),
    (["run", "--dropout", "1.5"], "dropout_p=1.5 is outside the allowed range"),
    (["run", "--d", "-4"], "argument --d"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_exits_2_with_one_line(capsys, argv, message):
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], captured.err
    assert "Traceback" not in captured.err + captured.out
