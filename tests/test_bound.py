"""`iosim bound`: the least simulated traffic of any algorithm at its optimal tiling against the IO lower bound."""

import json
import math

import pytest

import iosim
from iosim.cli import build_parser, main, run
from iosim.reports.bound import M_grid, bound, lower_bound, same_curves


def test_ratio_comes_from_simulated_counts_at_the_optimal_tilings():
    sweep = bound(1000, 32, N_k=777, points=8)
    Ms = [p.M for p in sweep.points]
    assert Ms == sorted(Ms) and Ms[-1] == 1000 * 32 and len(Ms) == 8
    for p in sweep.points:
        for name, traffic in p.traffic.items():
            if traffic is None:
                with pytest.raises(iosim.BlockSizeError):
                    iosim.count(name, N=1000, N_k=777, d=32, M=p.M)
                continue
            counted = iosim.count(name, N=1000, N_k=777, d=32, M=p.M, block_policy="optimal")
            assert (counted.traffic.total, counted.tiling) == (traffic, p.tiling[name])
        # the bound per head: min(N_q·N_k·d/√M, N_q·N_k·d²/M)
        assert p.lower_bound == min(1000 * 777 * 32 / math.sqrt(p.M), 1000 * 777 * 32 * 32 / p.M)
        assert p.ratio == min(t for t in p.traffic.values() if t is not None) / p.lower_bound >= 1
    assert sweep.worst.ratio == max(p.ratio for p in sweep.points)


def test_first_M_is_the_smallest_working_set_of_any_algorithm():
    sweep = bound(4096, 64, points=3)
    first = sweep.points[0]
    assert first.M == 5 and first.best == "small-cache"  # S tile, the two-pass m, ℓ, m̃, ℓ̃ of one row
    assert {name for name, t in first.traffic.items() if t is None} == set(first.traffic) - {"small-cache"}


def test_ratio_stays_within_a_small_constant_at_every_M():
    # N = 4096, d = 64, 40 values of M: the constant docs/bound.md states
    sweep = bound(4096, 64)
    assert len(sweep.points) == 40 and sweep.worst.ratio < 9.1, (sweep.worst.M, sweep.worst.ratio)


def test_grid_and_bound_helpers():
    assert M_grid(5, 5, 40) == [5]
    assert M_grid(10, 1000, 3) == [10, 100, 1000]
    pb = iosim.predict("flash", N=64, d=8, M=1000).problem
    assert lower_bound(pb, 64) == 64 * 64 * 8 / 8 == lower_bound(pb, 64)  # the two terms meet at M = d²


def test_bound_command_saves_records_and_plot(tmp_path):
    js, png = tmp_path / "b.json", tmp_path / "b.png"
    sweep = run(build_parser().parse_args(["bound", "--N", "512", "--d", "16", "--points", "5", "--causal",
                                           "--json", str(js), "--out", str(png)]))
    records = json.loads(js.read_text())
    # no block mask: dense ones
    dense = [name for name, a in iosim.ALGORITHMS.items() if a.listed_by_default(())]
    assert len(records) == 5 * len(dense) and png.stat().st_size > 10_000
    best = [r for r in records if r["best"]]
    assert [r["ratio"] for r in best] == [p.ratio for p in sweep.points]


def test_the_plot_draws_one_line_per_curve_and_names_every_algorithm_on_it():
    sweep = bound(512, 16, points=6)
    groups = same_curves(sweep)
    assert sorted(name for names in groups for name in names) == sorted(sweep.points[0].traffic)
    curve = {names: [p.traffic[names[0]] for p in sweep.points] for names in groups}
    for names in groups:
        assert all([p.traffic[name] for p in sweep.points] == curve[names] for name in names)
    assert len(set(map(tuple, curve.values()))) == len(groups)
    assert ("flash-swapped", "split-kv") in groups  # one split of split-kv is flash-swapped: the same line


@pytest.mark.parametrize("argv, message", [
    (["--N", "2", "--d", "1"], "N·d = 2 is below the smallest working set of every algorithm"),
    (["--N", "64", "--d", "8", "--points", "0"], "--points: 0"),
])
def test_bound_bad_input_exits_2_with_one_line(capsys, argv, message):
    assert main(["bound", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_an_fp8_bound_names_the_algorithms_it_leaves_out(capsys):
    assert main(["bound", "--N", "256", "--d", "32", "--points", "3", "--dtype", "float8_e4m3"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--dtype float8_e4m3 leaves out standard, flash, standard-eager, small-cache: no FP8 path" in out
    sweep = run(build_parser().parse_args(["bound", "--N", "256", "--d", "32", "--points", "3", "--dtype",
                                           "float8_e4m3"]))
    assert "flash" not in sweep.points[0].traffic and "flash-swapped" in sweep.points[0].traffic
