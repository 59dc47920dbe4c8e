"""``optimize`` with objective "dram": the shortlist of least HBM traffic, ranked by the DRAM bytes behind an L2."""

import json

import pytest

import iosim
from iosim.cli import build_parser, main, run
from iosim.gpu.dram import pass_counts
from iosim.gpu.hardware import hardware
from iosim.gpu.kernel import Launch
from iosim.gpu.kernels import default_kernel
from iosim.registry import ALGORITHMS
from iosim.reports.optimize import DRAM_CANDIDATES, Optimum, optimize
from iosim.tilings.search import ranked

SHAPE = dict(N=600, N_k=900, d=32, M="40k", heads=6, dtype="float32")


@pytest.mark.parametrize("algorithm", ["flash", "flash-swapped", "split-kv"])
@pytest.mark.parametrize("causal", [False, True])
def test_the_winner_moves_the_fewest_dram_bytes_of_the_shortlist(algorithm, causal):
    result, = optimize([algorithm], objective="dram", gpu="a100", causal=causal, top=3, **SHAPE)
    algo = ALGORITHMS[algorithm]
    pb = algo.run_problem(iosim.count(algorithm, causal=causal, **SHAPE).problem)
    shortlist = ranked(algo, pb, result.M)[:DRAM_CANDIDATES]
    kernel, hw = default_kernel(algorithm), hardware("a100")
    moved = {x.tiling: pass_counts(kernel, Launch(pb, x.tiling), hw).moved for x in shortlist}
    assert result.dram[0].moved == min(moved.values()), (result.best, moved)
    shown = [d.moved for d in result.dram]
    assert shown == sorted(set(shown)) and shown == [moved[x.tiling] for x in result.best], shown
    assert result.best[0].tiling in moved and result.searched == len(shortlist)


def test_the_hbm_objective_stays_as_it_was():
    hbm, = optimize(["flash-swapped"], **SHAPE)
    assert hbm.dram is None and hbm.best[0].tiling == ranked(ALGORITHMS["flash-swapped"],
                                                              hbm.problem, hbm.M)[0].tiling


def test_algorithms_without_a_grid_are_refused_in_their_place_and_a_gpu_is_required():
    out = optimize(["standard", "flash"], objective="dram", gpu="h100", **SHAPE)
    assert isinstance(out[0], iosim.InputError) and "the algorithms with a GPU kernel" in str(out[0])
    assert isinstance(out[1], Optimum)
    with pytest.raises(iosim.InputError, match="needs a GPU preset"):
        optimize(["flash"], objective="dram", **SHAPE)
    with pytest.raises(iosim.InputError, match="objective='l2'"):
        optimize(["flash"], objective="l2", gpu="h100", **SHAPE)
    with pytest.raises(iosim.InputError, match="the algorithms with a GPU kernel"):  # nothing left: the error itself
        optimize(["standard"], objective="dram", gpu="h100", **SHAPE)


def test_the_command_shows_and_saves_the_dram_bytes(tmp_path, capsys):
    out = tmp_path / "o.json"
    argv = ["optimize", "--N", "600", "--d", "32", "--M", "40k", "--heads", "6", "--gpu", "h100", "--objective",
            "dram", "--algo", "flash", "flash-swapped", "--top", "2", "--json", str(out)]
    outcome = run(build_parser().parse_args(argv))
    records = json.loads(out.read_text())
    assert len(records) == sum(len(r.best) for r in outcome.results), records  # ties in DRAM bytes shown once
    assert all(r["dram_read_bytes"] > 0 and r["dram_write_bytes"] is not None for r in records), records
    first = next(r for r in outcome.results if r.algorithm == "flash")
    assert records[0]["dram_read_bytes"] == first.dram[0].reads
    assert main(["optimize", "--N", "600", "--d", "32", "--objective", "dram"]) == 2
    assert "--objective dram without --gpu" in capsys.readouterr().err


def test_the_records_say_what_they_were_searched_under(tmp_path):
    # two searches that differ only in the L2 capacity move different DRAM bytes: their records tell them apart
    saved = {}
    for l2 in (None, "100KB"):
        out = tmp_path / f"{l2}.json"
        argv = ["optimize", "--N", "600", "--d", "32", "--M", "40k", "--gpu", "h100", "--objective", "dram",
                "--algo", "flash", "--top", "1", "--json", str(out)] + (["--l2-bytes", l2] if l2 else [])
        run(build_parser().parse_args(argv))
        (saved[l2],) = json.loads(out.read_text())
    for l2, record in saved.items():
        assert (record["objective"], record["pass"], record["gpu"], record["kernel"]) == ("dram", "fwd", "H100", None)
        assert record["l2_bytes"] == (None if l2 is None else 100_000)
    out = tmp_path / "hbm.json"
    run(build_parser().parse_args(["optimize", "--N", "600", "--d", "32", "--M", "40k", "--algo", "flash",
                                   "--pass", "bwd", "--top", "1", "--json", str(out)]))
    (record,) = json.loads(out.read_text())
    assert (record["objective"], record["pass"], record["gpu"]) == ("hbm", "bwd", None)
