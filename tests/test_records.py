"""Records that can be trusted: resume keyed by every option, every output whole, nothing finished lost."""

import csv
import json

import pytest

from iosim.cli import build_parser, main, run
from iosim.reports.records import RecordWriter
from iosim.reports.sweep import RECORD_REVISION


def parse(*argv):
    return build_parser().parse_args(list(argv))


def records(path):
    if path.suffix == ".json":
        return json.loads(path.read_text())
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("first, second", [
    (["--algo", "split-kv", "--splits", "2"], ["--algo", "split-kv", "--splits", "8"]),
    (["--algo", "block-sparse", "--sparsity", "0.5", "--sparsity-seed", "1"],
     ["--algo", "block-sparse", "--sparsity", "0.5", "--sparsity-seed", "2"]),
    (["--algo", "flash"], ["--algo", "flash", "--gpu", "h100"]),
    (["--algo", "flash", "--dtype", "float32"], ["--algo", "flash"]),
])
def test_resume_recomputes_a_configuration_whose_options_differ(tmp_path, first, second):
    path = tmp_path / "rows.json"
    grid = ["sweep", "--N", "4096", "--d", "128", "--json", str(path)]
    one = run(parse(*grid, *first)).rows[0]
    two = run(parse(*grid, *second, "--resume"))
    assert two.skipped == 0 and len(two.rows) == 1
    saved = records(path)
    assert len(saved) == 2 and saved[0] == one.record() and saved[1] == two.rows[0].record()
    again = run(parse(*grid, *second, "--resume"))
    assert again.skipped == 1 and again.rows == []


def test_split_kv_rows_that_differ_in_splits_keep_their_own_traffic(tmp_path):
    path = tmp_path / "sp.json"
    grid = ["sweep", "--N", "4096", "--d", "128", "--algo", "split-kv", "--json", str(path)]
    two = run(parse(*grid, "--splits", "2")).rows[0]
    eight = run(parse(*grid, "--splits", "8", "--resume")).rows[0]
    assert two.total != eight.total
    assert {r["requested_splits"]: r["total"] for r in records(path)} == {2: two.total, 8: eight.total}


def test_a_resume_that_adds_an_output_writes_every_record_to_both(tmp_path):
    js, cs = tmp_path / "rows.json", tmp_path / "rows.csv"
    run(parse("sweep", "--N", "256", "--d", "64", "--json", str(js)))
    run(parse("sweep", "--N", "256", "512", "--d", "64", "--json", str(js), "--csv", str(cs), "--resume"))
    by_json, by_csv = records(js), records(cs)
    assert len(by_json) == len(by_csv) and sorted(int(r["N"]) for r in by_csv) == sorted(r["N"] for r in by_json)
    assert {256, 512} == {r["N"] for r in by_json}
    # the CSV resumes by itself, with its types restored: nothing is counted twice
    again = run(parse("sweep", "--N", "256", "512", "--d", "64", "--csv", str(cs), "--resume"))
    assert again.rows == [] and again.skipped == len(by_csv)


def test_the_summary_after_a_resume_ranks_every_row_of_the_grid(tmp_path, capsys):
    path = tmp_path / "rows.json"
    assert main(["sweep", "--N", "256", "--d", "64", "--algo", "flash", "--json", str(path)]) == 0
    capsys.readouterr()
    assert main(["sweep", "--N", "256", "--d", "64", "--algo", "flash", "standard", "--json", str(path),
                 "--resume"]) == 0
    out = capsys.readouterr().out
    assert "1 configurations were already in the file" in out
    summary = out[out.index("least traffic at each"):]
    assert "flash" in summary and "standard" in summary


def test_resume_counts_again_a_record_an_earlier_release_made(tmp_path, capsys):
    # a sweep file of 2026-11-27: its DRAM reads hold no kernel code, and its records no revision
    path = tmp_path / "rows.json"
    grid = ["sweep", "--N", "256", "--d", "64", "--algo", "flash-swapped", "--gpu", "h100", "--json", str(path)]
    assert main(grid) == 0
    fresh = records(path)
    assert [r["revision"] for r in fresh] == [RECORD_REVISION]
    old = [{k: v for k, v in r.items() if k != "revision"} | {"dram_read_bytes": 1} for r in fresh]
    path.write_text(json.dumps(old))
    capsys.readouterr()
    assert main([*grid, "--resume"]) == 0
    out = capsys.readouterr().out
    assert "1 records in the file were made at another revision" in out and "were skipped" not in out
    assert records(path) == fresh  # counted again, as this release counts it
    assert main([*grid, "--resume"]) == 0  # now current: kept
    assert "1 configurations were already in the file" in capsys.readouterr().out
    # an old record outside the grid resumed stays as it was, and the sweep says so; in a CSV too
    csv_path = tmp_path / "rows.csv"
    other = [*grid[:2], "512", *grid[3:-2], "--csv", str(csv_path)]
    assert main(other) == 0
    old_512 = records(csv_path)[0] | {"revision": "1"}
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(old_512))
        writer.writeheader()
        writer.writerow(old_512)
    capsys.readouterr()
    assert main([*grid[:-2], "--csv", str(csv_path), "--resume"]) == 0
    out = capsys.readouterr().out
    assert "1 records in the file of another revision than 2 are outside this grid" in out
    kept = records(csv_path)
    assert [(r["N"], r["revision"]) for r in kept] == [("512", "1"), ("256", str(RECORD_REVISION))]


def test_a_configuration_held_by_a_current_record_is_not_stale_beside_an_old_one(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps([{"algorithm": "a", "N": 1, "d": 1, "M": 1, "status": "ok"}]))
    (tmp_path / "r.csv").write_text("algorithm,N,d,M,status,revision\na,1,1,1,ok,2\n")
    writer = RecordWriter(str(tmp_path / "r.json"), str(tmp_path / "r.csv"), resume=True,
                          key=lambda r: (r["algorithm"], r["N"]),
                          current=lambda r: str(r.get("revision")) == "2")
    assert (list(writer.done), writer.stale, writer.recounted, writer.left_stale) == ([("a", 1)], {}, 0, 0)


def test_resume_with_a_preset_onto_a_file_without_one_is_no_traceback(tmp_path, capsys):
    path = tmp_path / "rows.csv"
    assert main(["sweep", "--N", "256", "--d", "64", "--csv", str(path)]) == 0
    assert main(["sweep", "--N", "256", "--d", "64", "--csv", str(path), "--resume", "--gpu", "h100"]) == 0
    rows = records(path)
    assert {r["gpu"] for r in rows} == {"", "H100"} and len({r["algorithm"] for r in rows}) * 2 == len(rows)


def test_outputs_that_name_one_file_two_ways_are_refused(tmp_path, capsys):
    (tmp_path / "w").mkdir()
    spelled = f"{tmp_path}/w/../w/x.json"
    assert main(["sweep", "--N", "256", "--d", "64", "--json", f"{tmp_path}/w/x.json", "--csv", spelled]) == 2
    assert "json and csv name the same file" in capsys.readouterr().err
    assert list((tmp_path / "w").iterdir()) == []


def test_a_bad_path_leaves_the_good_output_as_it_was(tmp_path, capsys):
    good = tmp_path / "old.csv"
    good.write_text("precious\n")
    for command in (["sweep", "--N", "256", "--d", "64"], ["optimize", "--N", "256", "--d", "64"],
                    ["run", "--N", "32", "--d", "8"], ["bound", "--N", "256", "--d", "16", "--points", "2"]):
        assert main([*command, "--json", f"{tmp_path}/no/such/x.json", "--csv", str(good)]) == 2
        assert good.read_text() == "precious\n", command
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.csv"]


@pytest.mark.parametrize("argv, key", [
    (["sweep", "--d", "64", "--algo", "flash", "--N", "256", "512", "1024"], "N"),
    (["prefill", "--N", "512", "--d", "16", "--algo", "flash", "--chunk", "64", "128", "256"], "chunk"),
    (["cascade", "--batch", "2", "--d", "16", "--algo", "flash", "--prefix", "256", "512", "1024"], "prefix"),
])
def test_an_interrupt_keeps_the_rows_that_finished(tmp_path, argv, key):
    path = tmp_path / "rows.json"
    path.write_text("[]\n")
    seen = []

    def stop_after_two(row):
        seen.append(row)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(parse(*argv, "--json", str(path)), on_row=stop_after_two)
    assert [r[key] for r in records(path)] == [int(x) for x in argv[-3:-1]]  # the first two of the three
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.json"]


def test_an_interrupted_bound_keeps_the_values_of_M_that_finished(tmp_path):
    # a reviewer's Ctrl-C 12 s into 2,000 values of M left neither file: every record was written at the end
    json_path, csv_path = tmp_path / "bound.json", tmp_path / "bound.csv"
    seen = []

    def stop_after_three(point):
        seen.append(point.M)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(parse("bound", "--N", "512", "--d", "16", "--points", "10", "--algo", "flash", "standard",
                  "--json", str(json_path), "--csv", str(csv_path)), on_row=stop_after_three)
    for path in (json_path, csv_path):
        saved = records(path)
        assert [int(r["M"]) for r in saved] == [M for M in seen for _ in range(2)]
        assert [r["algorithm"] for r in saved] == ["flash", "standard"] * 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bound.csv", "bound.json"]
    whole = tmp_path / "whole.json"
    sweep = run(parse("bound", "--N", "512", "--d", "16", "--points", "10", "--algo", "flash", "standard",
                      "--json", str(whole)))
    assert records(whole)[:6] == records(json_path) and len(records(whole)) == 2 * len(sweep.points)


def test_a_failure_before_any_row_leaves_the_file_as_it_was(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text("[]\n")
    with pytest.raises(RuntimeError):
        with RecordWriter(str(path)):
            raise RuntimeError("a bug before the first record")
    assert path.read_text() == "[]\n" and sorted(p.name for p in tmp_path.iterdir()) == ["rows.json"]


def test_an_interrupt_before_any_row_leaves_the_file_as_it_was(tmp_path):
    # a command that adds its records at its end (model) interrupted before it: its old file is not emptied
    path = tmp_path / "rows.json"
    path.write_text('[{"kept": 1}]\n')
    with pytest.raises(KeyboardInterrupt):
        with RecordWriter(str(path)):
            raise KeyboardInterrupt
    assert path.read_text() == '[{"kept": 1}]\n' and sorted(p.name for p in tmp_path.iterdir()) == ["rows.json"]


def test_a_killed_run_leaves_a_journal_that_resume_reads(tmp_path):
    path = tmp_path / "rows.json"
    first = run(parse("sweep", "--N", "256", "--d", "64", "--algo", "flash", "standard", "--json", str(path)))
    journal = tmp_path / "rows.json.partial"
    lines = [json.dumps(r.record()) for r in first.rows]
    path.unlink()
    journal.write_text(lines[0] + "\n" + lines[1][:40])  # killed while writing the second line
    again = run(parse("sweep", "--N", "256", "--d", "64", "--algo", "flash", "standard", "--json", str(path),
                      "--resume"))
    assert again.skipped == 1 and [r.algorithm for r in again.rows] == ["standard"]
    assert [r["algorithm"] for r in records(path)] == ["flash", "standard"] and not journal.exists()


SWEEP = ["sweep", "--N", "1024", "--d", "64", "--algo", "flash"]


def test_a_fifo_is_written_through_and_stays_a_fifo(tmp_path):
    import os
    import stat
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    assert main([*SWEEP, "--csv", str(fifo)]) == 0
    reader.join(timeout=30)
    assert stat.S_ISFIFO(fifo.stat().st_mode) and got[0].startswith("algorithm,N,")
    assert not (tmp_path / "pipe.partial").exists() and not (tmp_path / "pipe.tmp").exists()


def test_a_character_device_is_written_through_never_replaced(capsys):
    import os
    import stat

    assert main([*SWEEP, "--json", "/dev/null"]) == 0
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert main([*SWEEP, "--json", "/dev/null", "--resume"]) == 2
    assert "character device or a FIFO" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    [*SWEEP, "--json", "/dev/stdout"], [*SWEEP, "--csv", "/dev/stdout"],
    ["run", "--algo", "flash", "--N", "64", "--d", "16", "--json", "/dev/stdout"], ["gpus", "--json", "/dev/stdout"],
])
def test_records_streamed_to_standard_output_stay_a_clean_stream_and_the_table_goes_to_stderr(argv):
    # a reviewer piped --json /dev/stdout into a JSON reader, which met the table after the records
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "iosim", *argv], capture_output=True, text=True, timeout=120,
                          check=True)
    if "--json" in argv:
        assert json.loads(done.stdout)
    else:
        assert done.stdout.startswith("algorithm,N,") and len(done.stdout.splitlines()) == 2
    assert "─" in done.stderr  # the table


def test_a_symlink_keeps_its_link_and_its_target_gets_the_records(tmp_path):
    target = tmp_path / "target.json"
    target.write_text("[]\n")
    link = tmp_path / "link.json"
    link.symlink_to(target.name)
    assert main([*SWEEP, "--json", str(link)]) == 0
    assert link.is_symlink() and records(target)[0]["algorithm"] == "flash"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "target.json"]


def test_a_socket_is_refused_by_name_before_any_work(tmp_path, capsys):
    import socket

    path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        assert main([*SWEEP, "--csv", str(path)]) == 2
    err = capsys.readouterr().err
    assert "is a socket, not a regular file" in err and "Traceback" not in err


def test_resume_refuses_a_file_that_is_not_iosims_records(tmp_path, capsys):
    junk = tmp_path / "c.csv"
    junk.write_text('algorithm,N\nflash,"unterminated\n')
    assert main([*SWEEP, "--csv", str(junk), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "its records lack ['M', 'd', 'status']" in err and "Traceback" not in err
    assert junk.read_text() == 'algorithm,N\nflash,"unterminated\n'  # left as it was


@pytest.mark.parametrize("command", [
    ["sweep", "--N", "256", "--d", "64", "--algo", "flash"],
    ["run", "--N", "64", "--d", "16", "--algo", "flash"],
    ["optimize", "--N", "256", "--d", "64", "--algo", "flash"],
    ["prefill", "--N", "256", "--chunk", "128", "--d", "64"],
    ["cascade", "--prefix", "256", "--suffix", "16", "--batch", "2", "--d", "64"],
    ["model", "llama-3-8b", "--N", "256", "--algo", "flash"],
])
def test_every_command_names_the_gpu_preset_in_its_records_as_the_others_do(command, tmp_path, capsys):
    path = tmp_path / "r.json"
    assert main([*command, "--gpu", "h100", "--json", str(path)]) == 0
    saved = json.loads(path.read_text())
    assert {r["gpu"] for r in ([saved] if isinstance(saved, dict) else saved)} == {"H100"}
