"""What a new user hit (issue 7): large runs, the table at 80 columns, records, files, resume, inputs."""

import csv
import io
import json
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from helpers import random_qkv
from rich.console import Console

import iosim
from iosim.cli import COMMANDS, build_parser, main, run, run_cmd, sweep_cmd
from iosim.cli.render import eng, nbytes, seconds
from iosim.cli.run_cmd import check_against_reference
from iosim.core.units import parse_size


def parse(*argv):
    return build_parser().parse_args(list(argv))


def render(outcome, width, wide=False):
    console = Console(width=width, file=io.StringIO(), record=True)
    sweep_cmd.render(console, outcome, wide)
    return console.export_text()


# --- 1. run at large N --------------------------------------------------------------------
def test_reference_check_in_row_slices_matches_the_dense_check():
    rng = np.random.default_rng(1)
    q, k, v = random_qkv(rng, 2, 1, 77, 50, 8)
    opts = dict(causal=True, scale=0.3, dropout_p=0.2, seed=4)
    dense = iosim.attention_ref(q, k, v, **opts)
    for rows in (slice(0, 3), slice(40, 77), slice(76, 77)):
        part = iosim.attention_ref(q, k, v, rows=rows, **opts)
        assert np.allclose(part.out, dense.out[:, :, rows], rtol=1e-13, atol=1e-15)
        assert np.array_equal(np.isneginf(part.lse), np.isneginf(dense.lse[:, :, rows]))
    # an output off by 1e-3 in one element of the last slice is found
    wrong = iosim.simulate("flash", q, k, v, M=2000, **opts).out
    wrong[1, 0, 76, 5] += 1e-3
    err, _ = check_against_reference(wrong, q, k, v, chunk=2 * 50 * 3, **opts)  # 3 query rows a slice
    assert abs(err - 1e-3) < 1e-12


def test_reference_check_memory_grows_with_the_slice_not_with_N_squared():
    # N_q = N_k = 2048: one dense float64 N × N matrix is 32 MiB, and the reference
    # builds several. Slices of 2^16 elements (32 rows) keep the check to a few MiB.
    n, d = 2048, 4
    rng = np.random.default_rng(0)
    q, k, v = random_qkv(rng, 1, 1, n, n, d)
    out = np.zeros_like(q)
    tracemalloc.start()
    check_against_reference(out, q, k, v, chunk=2**16, causal=True)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    dense_matrix = n * n * 8
    assert peak < dense_matrix / 4, f"peak {peak} bytes against one dense matrix of {dense_matrix}"


def test_run_prints_traffic_before_checking(capsys, monkeypatch):
    order = []
    monkeypatch.setattr(run_cmd, "check_against_reference", lambda *a, **k: order.append("check") or (0.0, 0.0))
    monkeypatch.setattr(run_cmd, "render_traffic", lambda console, result, pass_: order.append("traffic"))
    assert main(["run", "--N", "50", "--d", "8", "--M", "5k"]) == 0
    assert order == ["traffic", "check"]


def test_run_s_title_says_what_was_counted(capsys):
    # the mask, the dtype and the variants: the title gave the sizes alone
    assert main(["run", "--N", "64", "--d", "8", "--algo", "flash", "--causal", "--window", "10", "--dropout", "0.1",
                 "--sinks", "--dtype", "float32", "--heads", "2", "--kv-heads", "1", "--no-check"]) == 0
    title = " ".join(capsys.readouterr().out.split())
    assert "causal, window (10, 0), float32, dropout 0.1, sinks, 1 K/V heads" in title, title


def test_no_check_skips_the_reference(capsys, monkeypatch):
    monkeypatch.setattr(run_cmd, "check_against_reference", lambda *a, **k: pytest.fail("the check ran"))
    out = run(parse("run", "--N", "50", "--d", "8", "--M", "5k", "--no-check"))
    assert out.max_abs_error is None
    assert main(["run", "--N", "50", "--d", "8", "--M", "5k", "--no-check"]) == 0
    assert "--no-check" in capsys.readouterr().out


def test_run_too_large_for_memory_is_refused_in_one_line(capsys, monkeypatch):
    monkeypatch.setattr(run_cmd, "available_memory", lambda: 10**9)
    # standard holds S and P, 2 · 100000² float64 = 160 GB, besides Q, K, V, O
    assert main(["run", "--algo", "standard", "--N", "100000", "--d", "64"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds 160GB in float64, more than the 1GB available" in err[0], err
    assert "iosim sweep" in err[0]


# --- 3. the sweep table at 80 and 132 columns -----------------------------------------------
@pytest.mark.parametrize("width, wide", [(80, False), (132, True)])
def test_sweep_table_fits_without_cutting_anything(width, wide):
    out = run(parse("sweep", "--N", "256", "65536", "1000000000", "--causal"))
    text = render(out, width, wide)
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= width
    for r in out.rows:  # every total, in compact units, is in the table in full
        assert eng(r.total) in text
    assert "1G" in text and "65536" in text


@pytest.mark.parametrize("options", [("--pass", "fwd+bwd", "--sparsity", "0.5"), ("--gpu", "h100", "--pass", "bwd"),
                                     ("--gpu", "a100", "--pass", "fwd+bwd", "--sparsity", "0.25", "--causal")])
def test_sweep_table_fits_80_columns_with_every_option(options):
    out = run(parse("sweep", "--N", "1024", "65536", "--d", "64", "128", *options))
    text = render(out, 80)
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= 80


@pytest.mark.parametrize("width", [40, 60])
@pytest.mark.parametrize("argv", [
    ["sweep", "--N", "4096", "--d", "64"], ["sweep", "--N", "4096", "--d", "64", "--gpu", "h100"],
    ["run", "--algo", "flash-swapped", "--N", "2048", "--d", "64", "--gpu", "h100", "--heads", "32", "--no-check"],
    ["optimize", "--N", "4096", "--d", "64", "--M", "100k"], ["gpus"], ["kernels"],
])
def test_a_narrow_terminal_wraps_a_table_s_lines_and_never_cuts_a_number(argv, width):
    # at COLUMNS=60 a reviewer read N=4096 as "40…" and 4,194,304 bytes as "4,194,3…": a table too wide for the
    # terminal is printed whole, each line as wide as its cells need, and the terminal wraps it
    console = Console(width=width, file=io.StringIO(), record=True)
    args = parse(*argv)
    COMMANDS[args.command].main(args, console)
    text = console.export_text()
    assert "…" not in text, text
    if argv[0] == "sweep":
        assert " 4096 " in text


@pytest.mark.parametrize("x, text", [(0, "0"), (999, "999"), (1000, "1k"), (999_960, "1M"), (1.79e9, "1.79G"),
                                     (3.8e18, "3.8E"), (3.8e24, "3.80e+24"), (65536, "65.5k")])
def test_compact_units_never_overflow(x, text):
    assert eng(x) == text and len(text) <= 8


@pytest.mark.parametrize("t, text", [(41.7e-3, "41.7ms"), (730e-6, "730µs"), (3e-9, "3ns"), (157, "157s"),
                                     (999, "999s"), (5000, "1.39h"), (1.73e7, "200d"), (2.63e9, "83.3y")])
def test_times_past_a_thousand_seconds_are_told_in_hours_days_or_years(t, text):
    assert seconds(t) == text


def test_bytes_past_an_exabyte_keep_a_prefix():
    assert nbytes(8.8e21) == "8.8ZB" and nbytes(3e24) == "3YB" and nbytes(275e18) == "275EB"


# --- 4, 5. records -------------------------------------------------------------------------
def test_records_tell_configurations_apart_and_carry_every_tensor(tmp_path):
    records = {}
    for causal in (False, True):
        path = tmp_path / f"{causal}.json"
        run(parse("sweep", "--N", "1000", "--d", "64", "--algo", "flash", "--json", str(path),
                  *(["--causal"] if causal else [])))
        (records[causal],) = json.loads(path.read_text())
    assert records[False]["causal"] is False and records[True]["causal"] is True
    for key in ("N_k", "block_policy", "dropout_p", "scale", "mask", "dtype", "total_bytes", "tensors"):
        assert key in records[True], key
    tensors = {t["name"]: t for t in records[True]["tensors"]}
    assert sum(t["reads"] + t["writes"] for t in tensors.values()) == records[True]["total"]
    assert tensors["l"]["itemsize"] == 4 and tensors["Q"]["read_bytes"] == 2 * tensors["Q"]["reads"]


def test_run_json_and_csv(tmp_path):
    js, cs = tmp_path / "run.json", tmp_path / "run.csv"
    out = run(parse("run", "--N", "40", "--N-k", "30", "--d", "8", "--M", "5k", "--causal", "--json", str(js),
                    "--csv", str(cs)))
    record = json.loads(js.read_text())
    assert record["N_k"] == 30 and record["causal"] is True and record["max_rel_error"] == out.max_rel_error
    assert record["total"] == out.result.traffic.total
    with cs.open() as f:
        rows = list(csv.DictReader(f))
    assert [r["tensor"] for r in rows] == [t.name for t in out.result.traffic.tensors]


def test_run_total_row_puts_read_and_write_bytes_in_their_columns(capsys):
    assert main(["run", "--N", "40", "--d", "8", "--M", "5k"]) == 0
    total = next(line for line in capsys.readouterr().out.splitlines() if "total" in line)
    r = iosim.simulate("flash", *random_qkv(np.random.default_rng(0), 1, 1, 40, 40, 8), M=5000)
    assert nbytes(r.traffic.read_bytes) in total and nbytes(r.traffic.write_bytes) in total


# --- 7. output files ----------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--json", ""], "json='' is an empty path"),
    (["--json", "same.out", "--csv", "same.out"], "json and csv name the same file"),
    (["--json", "no/such/dir/x.json"], "the directory 'no/such/dir' does not exist"),
    (["--resume"], "--resume needs --json PATH or --csv PATH"),
])
def test_output_file_mistakes_are_one_line(capsys, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "--N", "256", "--d", "64", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


RUN = ["run", "--N", "40", "--d", "8"]
BOUND = ["bound", "--N", "256", "--d", "32"]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc, where no file can be made")
@pytest.mark.parametrize("argv, option, name", [(RUN, "--json", "json"), (RUN, "--csv", "csv"),
                                                (["kernels"], "--json", "json"), (BOUND, "--out", "out")])
def test_an_output_in_a_folder_where_no_file_can_be_made_is_refused_before_any_work(capsys, argv, option, name):
    path = f"/proc/iosim-{argv[0]}.png"  # refused even to root, whom access() lets write anywhere
    assert main([*argv, option, path]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and f"{name}={path!r}: cannot create a file in '/proc'" in err[0], err
    assert captured.out == ""  # nothing simulated, nothing drawn


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full, a device every write to fails")
@pytest.mark.parametrize("argv, option", [(["sweep", "--N", "256", "--d", "64", "--algo", "flash"], "--json"),
                                          (RUN, "--csv")])
def test_a_write_that_fails_names_the_option_and_the_path(capsys, argv, option):
    assert main([*argv, option, "/dev/full"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot write the {option} records to /dev/full: No space left on device" in err[0], err


def test_a_link_is_probed_beside_itself_too_where_the_journal_goes(tmp_path, monkeypatch, capsys):
    import tempfile

    from iosim.reports import records

    (tmp_path / "rw").mkdir()
    (tmp_path / "ro").mkdir()
    link = tmp_path / "ro" / "link.json"
    link.symlink_to(tmp_path / "rw" / "out.json")
    make = tempfile.mkstemp

    def read_only(*args, dir=None, **kwargs):  # the link's folder refuses new files, as a read-only mount does
        if Path(dir) == tmp_path / "ro":
            raise OSError(30, "Read-only file system")
        return make(*args, dir=dir, **kwargs)

    monkeypatch.setattr(records.tempfile, "mkstemp", read_only)
    assert main(["sweep", "--N", "256", "--d", "64", "--algo", "flash", "--json", str(link)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot create a file in {str(tmp_path / 'ro')!r} (Read-only file system)" in err[0]


def test_a_long_file_name_the_outputs_can_take_is_not_refused_by_the_probe(tmp_path):
    path = tmp_path / ("b" * 240 + ".json")  # 245 characters: the journal's name (.partial) still fits in 255
    run(parse("sweep", "--N", "256", "--d", "64", "--algo", "flash", "--json", str(path)))
    assert json.loads(path.read_text())[0]["algorithm"] == "flash"


def test_a_plot_that_cannot_be_written_names_its_option(capsys, tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full)
    path = tmp_path / "bound.png"
    assert main([*BOUND, "--out", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot write the --out plot to {path}: No space left on device" in err[0], err


def test_a_failed_write_keeps_the_finished_rows_for_resume(tmp_path, monkeypatch, capsys):
    path = tmp_path / "rows.json"

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(os, "replace", refuse)
        assert main(["sweep", "--N", "256", "--d", "64", "--json", str(path)]) == 2
    err = capsys.readouterr().err
    journal = tmp_path / "rows.json.partial"
    assert f"cannot write the --json records to {path}: No space left on device; the " in err and ".tmp" not in err
    assert f"are kept in {journal}, which --resume reads" in err
    assert list(tmp_path.iterdir()) == [journal]  # no temporary file, no half-written output
    again = run(parse("sweep", "--N", "256", "--d", "64", "--json", str(path), "--resume"))
    assert again.rows == [] and again.skipped == len(json.loads(path.read_text())) > 2
    assert list(tmp_path.iterdir()) == [path]


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_resume_skips_what_the_file_holds(tmp_path, fmt):
    path = tmp_path / f"rows.{fmt}"
    first = run(parse("sweep", "--N", "256", "--d", "64", f"--{fmt}", str(path)))
    n = len(first.rows)  # every algorithm a default sweep counts
    assert n >= 3 and first.skipped == 0
    second = run(parse("sweep", "--N", "256", "512", "--d", "64", f"--{fmt}", str(path), "--resume"))
    assert second.skipped == n and {r.N for r in second.rows} == {512}
    if fmt == "json":
        records = json.loads(path.read_text())
    else:
        with path.open() as f:
            records = list(csv.DictReader(f))
    assert sorted(int(r["N"]) for r in records) == [256] * n + [512] * n


# --- 8. inputs parsed one way -------------------------------------------------------------
@pytest.mark.parametrize("text, elements", [("100K", 100_000), ("1e5", 100_000), ("228KB", 114_000),
                                            ("192kib", 98_304), ("4611686018G", 4_611_686_018 * 10**9),
                                            (1.5e5, 150_000)])
def test_common_spellings_of_M(text, elements):
    assert parse_size(text, "float16") == elements


def test_counts_take_units_and_whole_floats_everywhere():
    assert parse("sweep", "--N", "4Ki", "1e3").N == [4096, 1000]
    assert parse("sweep", "--window", "1Ki").window == [1024] and parse("run", "--window", "-1", "4Ki").window == [
        -1, 4096]  # -1 is still unbounded
    assert parse("run", "--splits", "2Ki").splits == 2048 and parse("run", "--splits", "0").splits == 0  # 0: refused
    # by split-kv's own range check, which names it
    a = iosim.count("flash", N=1024.0, d="64", M="100k")
    b = iosim.count("flash", N="1Ki", d=64, M=100_000)
    assert a.traffic == b.traffic
    with pytest.raises(iosim.InputError, match="N=1024.5 is not a whole number"):
        iosim.count("flash", N=1024.5, d=64, M="100k")


@pytest.mark.parametrize("argv, dest, values", [
    (["sweep", "--N", "4Ki", "1024", "4096"], "N", [4096, 1024]),  # one value in two spellings is one row
    (["sweep", "--d", "64", "64", "128"], "d", [64, 128]),
    (["sweep", "--algo", "flash", "standard", "flash"], "algo", ["flash", "standard"]),
    (["optimize", "--N", "4096", "--d", "64", "--algo", "flash", "flash"], "algo", ["flash"]),
    (["bound", "--N", "4096", "--d", "64", "--algo", "flash", "flash"], "algo", ["flash"]),
    (["model", "--N", "1Ki", "1024", "--context", "4Ki", "4096", "--phase", "decode", "decode"], "context", [4096]),
    (["model", "--N", "1Ki", "1024", "--algo", "flash", "flash", "--phase", "decode", "decode"], "phase",
     ["decode"]),
    (["model", "--N", "1Ki", "1024", "--algo", "flash", "flash"], "N", [1024]),
    (["prefill", "--N", "4096", "--d", "64", "--chunk", "256", "256", "--algo", "flash", "flash"], "chunk", [256]),
    (["cascade", "--d", "64", "--prefix", "4Ki", "4096", "--suffix", "16"], "prefix", [4096]),
    (["cascade", "--d", "64", "--prefix", "4096", "--algo", "flash", "flash", "--suffix", "16"], "algo", ["flash"]),
    (["cascade", "--d", "64", "--prefix", "4096", "--suffix", "16", "--batch", "8", "1", "8"], "batch", [8, 1]),
    (["sweep", "--seqlens", "100", "100"], "seqlens", [100, 100]),  # documents of one length are two documents
])
def test_a_value_given_twice_in_a_list_option_counts_once(argv, dest, values):
    assert getattr(parse(*argv), dest) == values


@pytest.mark.parametrize("argv, option", [
    (["sweep", "--N", "256", "--N", "512"], "--N"),
    (["sweep", "--N", "256", "--algo", "flash", "--algo", "standard"], "--algo"),
    (["sweep", "--N", "256", "--window", "4", "--window", "8"], "--window"),
    (["sweep", "--seqlens", "100", "--seqlens", "50"], "--seqlens"),
    (["sweep", "--N", "256", "--flex-mask", "causal", "--flex-block", "64", "64", "--flex-block", "128", "128"],
     "--flex-block"),
    (["model", "--N", "1Ki", "--context", "4Ki", "--context", "8Ki"], "--context"),
    (["cascade", "--d", "64", "--prefix", "4096", "--suffix", "16", "--batch", "8", "--batch", "1"], "--batch"),
])
def test_a_list_option_given_twice_is_refused_where_argparse_kept_only_the_last(capsys, argv, option):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"argument {option}: given twice" in err[0], err
    assert f"allowed: every value after one {option}" in err[0]


@pytest.mark.parametrize("argv, message", [
    (["sweep", "--N", "1024", "--d", "64", "--sparsity-seed", "3"], "--sparsity-seed 3 without --sparsity"),
    (["run", "--algo", "flash", "--N", "256", "--d", "16", "--sparsity-pattern", "local"],
     "--sparsity-pattern local without --sparsity"),
    (["optimize", "--N", "1024", "--d", "64", "--sparsity-seed", "2"], "--sparsity-seed 2 without --sparsity"),
    (["sweep", "--N", "1024", "--d", "64", "--flex-block", "64", "64", "--algo", "flash"],
     "--flex-block 64 64 without --flex-mask"),
    (["run", "--N", "256", "--d", "16", "--algo", "flash", "--flex-block", "64", "64"],
     "--flex-block 64 64 without --flex-mask"),
])
def test_an_option_of_a_mask_not_given_is_refused_not_ignored(capsys, argv, message):
    # each ran before with exit 0, the option without effect
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


@pytest.mark.parametrize("argv", [["model", "llama-3-8b", "--N", "1Ki"], ["bound", "--N", "4096", "--d", "64"],
                                  ["prefill", "--N", "4096", "--d", "64", "--chunk", "256"],
                                  ["cascade", "--d", "64", "--prefix", "4096", "--suffix", "16"],
                                  ["optimize", "--N", "1024", "--d", "64"]])
def test_a_command_without_a_block_mask_option_does_not_offer_flex(capsys, argv):
    # flex runs only over a FlexAttention block mask, which only sweep and run take (--flex-mask)
    assert main([*argv, "--algo", "flex"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "argument --algo: invalid choice: 'flex'" in err[0], err


@pytest.mark.parametrize("argv, message", [
    (["run", "--seed", "-1"], "argument --seed: '-1' is not an integer in [0, 2**64)"),
    (["run", "--scale", "1e308", "--N", "20", "--d", "4"], "--scale 1e+308: tau·QKᵀ overflows float64"),
    (["sweep", "--N", "4KiB"], "argument --N: 4KiB is not a count"),
    # a negative number is a number out of range, as 0 is, not a malformed one
    (["sweep", "--M", "-5"], "M='-5' is outside the allowed range [1, 2**62]"),
    (["sweep", "--N", "-1024"], "argument --N: -1024 is outside the allowed range [1, 2**62]"),
    (["sweep", "--heads", "-3"], "argument --heads: -3 is outside the allowed range [1, 2**62]"),
    (["sweep", "--d", "64.5"], "argument --d: 64.5 is not a whole number"),
    (["sweep", "--M", "3001B"], "M='3001B' is 1500.5 elements of float16 (2 bytes each), not a whole number"),
    (["sweep", "--N", "1.0005k"], "argument --N: 1.0005k is 1000.5, not a whole number"),
])
def test_bad_cli_values_name_their_flag(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("iosim ")


def test_api_takes_flags_and_masks_only_in_their_own_form():
    q, k, v = random_qkv(np.random.default_rng(0), 1, 1, 4, 4, 2)
    with pytest.raises(iosim.InputTypeError, match="causal='no' must be True or False"):
        iosim.count("flash", N=4, d=2, M=1000, causal="no")
    with pytest.raises(iosim.InputTypeError, match="simulate takes a boolean array"):
        iosim.simulate("flash", q, k, v, M=1000, mask=True)
    with pytest.raises(iosim.InputTypeError, match="count and predict take mask=True or False"):
        iosim.count("flash", N=4, d=2, M=1000, mask=np.ones((4, 4), dtype=bool))
    with pytest.raises(iosim.InputTypeError, match="dropout_p='0.1' must be a number"):
        iosim.count("flash", N=4, d=2, M=1000, dropout_p="0.1")
    as_lists = iosim.simulate("flash", q.tolist(), k.tolist(), v.tolist(), M=1000)
    assert np.array_equal(as_lists.out, iosim.simulate("flash", q, k, v, M=1000).out)
    with pytest.raises(iosim.InputTypeError, match="q must be an array"):
        iosim.simulate("flash", "q", k, v, M=1000)


def test_scale_overflow_is_warned_in_the_api():
    q, k, v = random_qkv(np.random.default_rng(0), 1, 1, 8, 8, 4)
    with pytest.warns(RuntimeWarning, match="scale=1e\\+308"):
        iosim.simulate("flash", q, k, v, M=1000, scale=1e308)


# --- 10. the summary ----------------------------------------------------------------------
def test_summary_names_the_least_traffic_without_standard():
    out = run(parse("sweep", "--N", "4096", "--d", "64", "--algo", "flash", "flash-swapped"))
    text = render(out, 80)
    line = next(line for line in text.splitlines() if line.strip().startswith("4096"))
    ratio = out.rows[0].total / out.rows[1].total
    assert "flash-swapped" in line and f"flash {ratio:.2f}×" in line
