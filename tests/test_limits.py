"""Every size the parsers accept is one the counts can take; what they cannot take is refused in one line."""

import pytest

import iosim
from iosim.cli import main
from iosim.core.units import MAX_COUNT
from iosim.registry import ALGORITHMS
from iosim.reports.optimize import optimize
from iosim.tilings.search import MAX_BLOCK_SIZES


@pytest.mark.parametrize("name", [n for n, a in ALGORITHMS.items() if a.listed_by_default(())])
def test_counts_are_exact_at_the_largest_accepted_size(name):
    for N, N_k in ((MAX_COUNT, MAX_COUNT), (1, MAX_COUNT), (MAX_COUNT, 1)):
        problem = dict(N=N, N_k=N_k, d=64, M=100_000, causal=True)
        assert iosim.count(name, **problem).traffic == iosim.predict(name, **problem).exact


@pytest.mark.parametrize("kwargs", [dict(N=MAX_COUNT + 1), dict(N_k=10**30), dict(M=10**400), dict(d=2.0**70)])
def test_api_refuses_sizes_past_the_range_by_name(kwargs):
    problem = dict(N=4096, d=64, M=100_000) | kwargs
    name = next(iter(kwargs))
    with pytest.raises(iosim.InputError, match=rf"{name}=.* outside the allowed range \[1, 2\*\*62\]"):
        iosim.count("flash", **problem)


@pytest.mark.parametrize("argv, message", [
    (["sweep", "--N", "1e30"], "argument --N: 1e30 is outside the allowed range [1, 2**62]"),
    (["sweep", "--M", "1e400"], "M='1e400' is outside the allowed range [1, 2**62]"),
    (["bound", "--N", "1024", "--d", "64", "--out", "plot.txt"], "'.txt', which matplotlib cannot write"),
    (["bound", "--N", "1024", "--d", "64", "--out", "plot"], "'(none)', which matplotlib cannot write"),
    (["bound", "--N", "4e18", "--d", "64"], "allowed range: N_q, N_k <= 10,000,000,000"),
    (["bound", "--N", "300000", "--d", "64", "--causal"], "allowed range: N_q, N_k <= 200,000"),
    (["optimize", "--N", "4e18", "--d", "1", "--M", "1e15"], f"would try more than {MAX_BLOCK_SIZES:,} sizes of B_r"),
    (["optimize", "--N", "4e18", "--d", "64", "--M", "1e12", "--causal"], "sizes of B_r"),
])
def test_sizes_past_what_a_command_can_do_are_refused_at_once(capsys, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert captured.out == "" and list(tmp_path.iterdir()) == []


def test_optimize_at_the_largest_size_answers():
    [found] = optimize(["flash-swapped"], N=MAX_COUNT, d=64, M=100_000)
    assert found.measured.total == found.best[0].traffic


def test_a_search_too_large_takes_its_algorithms_place_and_the_others_answer():
    results = optimize(["flash-swapped", "small-cache"], N=10**12, d=256, M=10**6, causal=True)
    assert results[0].measured.total == results[0].best[0].traffic
    assert isinstance(results[1], iosim.SearchTooLargeError) and "search of small-cache" in str(results[1])
    with pytest.raises(iosim.SearchTooLargeError, match="search of small-cache"):
        optimize(["small-cache"], N=10**12, d=256, M=10**6, causal=True)
