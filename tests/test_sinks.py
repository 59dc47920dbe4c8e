"""Learned attention sinks (gpt-oss): one logit per query head, one more score of every row, with no value.

flash, flash-swapped and split-kv take them in their forward pass (``Problem.sinks``): each query block reads its
head's sink once (split-kv's, of a GQA group's packed rows, its group's; with K/V splits its combine does) and starts
its running max and sum at (sink, 1). flash's and flash-swapped's backward passes take them too, and write their
gradient.
Held here: the outputs and the log-sum-exp against float64 on awkward shapes, rows that see no key included; the
gradients, the sinks' against central differences; every count equal to its closed form, and the sinks' reads (and
their gradient's writes) the only bytes they add; everything else refused by name.
"""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest
from helpers import random_qkv
from hypothesis import given, settings
from hypothesis import strategies as st

import iosim
from iosim.core.errors import InputError
from iosim.reference import attention_ref

TAKERS = ("flash", "flash-swapped", "split-kv")
STAT_BYTES = 4  # the sinks are statistics: float32 beside float16 data


def check_run(algo: str, rng, batch: int, heads: int, n_q: int, n_k: int, d: int, M: int, kv_heads=None,
              **options):
    """One numeric run with sinks against float64, and its counts against the closed form and the sink-less run."""
    q, k, v = random_qkv(rng, batch, heads, n_q, n_k, d)
    if kv_heads is not None:
        k, v = k[:, :kv_heads], v[:, :kv_heads]
    sinks = 3 * rng.standard_normal(heads)
    got = iosim.simulate(algo, q, k, v, M=M, sinks=sinks, **options)
    ref = attention_ref(q, k, v, sinks=sinks, **options)
    np.testing.assert_allclose(got.out, ref.out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got.m + np.log(got.l), ref.lse, rtol=0, atol=1e-12)
    sizes = dict(N=n_q, N_k=n_k, d=d, batch=batch, heads=heads, kv_heads=kv_heads, M=M, **options)
    counted = iosim.count(algo, sinks=True, **sizes)
    assert got.traffic == counted.traffic == iosim.predict(algo, sinks=True, **sizes).exact
    plain = iosim.count(algo, tiling=got.tiling, **sizes).traffic
    # each query block reads its head's sink; split-kv's blocks are of a K/V head's G·N_q packed query rows, and each
    # reads its group's G sinks
    group = heads // (kv_heads or heads) if algo == "split-kv" else 1
    query_blocks = -(-group * n_q // got.tiling.Br)
    assert counted.traffic.tensor("sinks").read_bytes == batch * heads // group * query_blocks * group * STAT_BYTES
    assert counted.traffic.tensor("sinks").write_bytes == 0
    assert counted.traffic.peak_sram == plain.peak_sram
    for t in plain.tensors:  # the sinks add their own reads and nothing else
        assert counted.traffic.tensor(t.name) == t, t.name
    return got, ref, sinks


@pytest.mark.parametrize("algo", TAKERS)
@pytest.mark.parametrize("shape", [
    dict(batch=1, heads=1, n_q=1, n_k=1, d=3, M=40),
    dict(batch=2, heads=3, n_q=113, n_k=239, d=5, M=400, causal=True),
    dict(batch=1, heads=2, n_q=239, n_k=113, d=7, M=500, window=(16, 3)),
    dict(batch=1, heads=4, n_q=70, n_k=134, d=4, M=300, kv_heads=2, causal=True),
    dict(batch=1, heads=2, n_q=64, n_k=64, d=1, M=60, window=(0, 0)),
], ids=["N=1", "Nq<Nk,causal", "Nq>Nk,window", "GQA,causal", "d=1,diagonal"])
def test_sinks_match_float64_and_their_closed_form(algo, shape):
    check_run(algo, np.random.default_rng(len(shape) + shape["n_q"]), **shape)


@pytest.mark.parametrize("splits", [1, 3])
def test_split_kv_decoding_takes_the_sinks_once_in_the_split_or_the_combine(splits):
    # a decoding step of 8 query heads on 2 K/V heads: each K/V head's query block holds its group's 4 rows
    rng = np.random.default_rng(splits)
    q, k, v = random_qkv(rng, 2, 8, 1, 257, 16)
    k, v = k[:, :2], v[:, :2]
    sinks = 3 * rng.standard_normal(8)
    got = iosim.simulate("split-kv", q, k, v, M=4000, splits=splits, sinks=sinks)
    ref = attention_ref(q, k, v, sinks=sinks)
    np.testing.assert_allclose(got.out, ref.out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got.m + np.log(got.l), ref.lse, rtol=0, atol=1e-12)
    sizes = dict(N=1, N_k=257, d=16, batch=2, heads=8, kv_heads=2, M=4000, splits=splits)
    counted = iosim.count("split-kv", sinks=True, **sizes).traffic
    assert got.traffic == counted == iosim.predict("split-kv", sinks=True, **sizes).exact
    assert got.tiling.splits == splits and counted.tensor("sinks").reads == 2 * 8  # one query block per K/V head
    plain = iosim.count("split-kv", **sizes).traffic
    assert counted.total - plain.total == 16 and counted.peak_sram == plain.peak_sram


@pytest.mark.parametrize("algo", TAKERS)
def test_a_row_that_sees_no_key_puts_all_its_weight_on_the_sink(algo):
    # causal with N_q > N_k, bottom-right aligned: the first N_q − N_k rows see no key
    got, ref, sinks = check_run(algo, np.random.default_rng(5), 1, 2, 100, 30, 2, 64, causal=True)
    assert np.all(got.out[:, :, :70] == 0)
    np.testing.assert_array_equal(got.m[0, :, :70], np.broadcast_to(sinks[:, None], (2, 70)))
    np.testing.assert_array_equal(got.l[0, :, :70], 1.0)


def test_the_reference_s_sink_is_one_more_score_with_no_value():
    q, k, v = (np.array(x, dtype=float).reshape(1, 1, 1, -1) for x in ([1.0, 2.0], [0.5, -1.0], [3.0, 4.0]))
    s, sink = (1.0 * 0.5 + 2.0 * -1.0) / np.sqrt(2), 0.7
    ref = attention_ref(q, k, v, sinks=[sink])
    np.testing.assert_allclose(ref.out[0, 0, 0], np.array([3.0, 4.0]) * np.exp(s) / (np.exp(s) + np.exp(sink)))
    np.testing.assert_allclose(ref.lse[0, 0, 0], np.log(np.exp(s) + np.exp(sink)))
    # a sink far below every score changes nothing
    q, k, v = random_qkv(np.random.default_rng(1), 1, 2, 9, 11, 3)
    np.testing.assert_allclose(attention_ref(q, k, v, sinks=[-800.0, -900.0]).out, attention_ref(q, k, v).out,
                               rtol=0, atol=1e-15)


@settings(max_examples=30, deadline=None)
@given(n_q=st.integers(1, 90), n_k=st.integers(1, 90), d=st.integers(1, 9), heads=st.integers(1, 3),
       causal=st.booleans(), algo=st.sampled_from(TAKERS), M_extra=st.integers(0, 400),
       window=st.none() | st.tuples(st.integers(-1, 40), st.integers(-1, 8)))
def test_sinks_count_their_closed_form_on_any_shape(n_q, n_k, d, heads, causal, algo, M_extra, window):
    sizes = dict(N=n_q, N_k=n_k, d=d, heads=heads, causal=causal, M=4 * d + 8 + M_extra, window=window)
    try:
        counted = iosim.count(algo, sinks=True, **sizes)
    except InputError:  # M too small for any tiling: the same refusal as without sinks
        with pytest.raises(InputError):
            iosim.count(algo, **sizes)
        return
    assert counted.traffic == iosim.predict(algo, sinks=True, **sizes).exact
    plain = iosim.count(algo, tiling=counted.tiling, **sizes).traffic
    assert counted.traffic.total_bytes - plain.total_bytes == heads * -(-n_q // counted.tiling.Br) * STAT_BYTES


@pytest.mark.parametrize("algo", [name for name, a in iosim.ALGORITHMS.items() if not a.accepts("sinks")])
def test_every_other_algorithm_refuses_sinks_by_name(algo):
    with pytest.raises(InputError, match=re.escape(f"sinks for {algo}, pass 'fwd': it takes no attention sinks")):
        iosim.count(algo, N=64, d=8, M="20k", sinks=True)


@pytest.mark.parametrize("call, pass_", [("count", "fwd+bwd"), ("predict", "bwd")])
def test_a_backward_pass_without_sinks_refuses_them_by_name(call, pass_):
    # an algorithm whose forward takes sinks and whose backward does not: flash with its backward's sinks taken away
    flash = iosim.ALGORITHMS["flash"]
    algo = dataclasses.replace(flash, name="flash-no-sink-gradient", backward=dataclasses.replace(
        flash.backward, needs=dataclasses.replace(flash.backward.needs, sinks=False)))
    words = (f"sinks for {algo.name}, pass {pass_!r}: its backward pass takes no attention sinks; allowed: "
             f"sinks=False, or one that takes them in that pass: ['flash', 'flash-swapped']")
    with pytest.raises(InputError, match=re.escape(words)):
        getattr(iosim, call)(algo, N=64, d=8, M="20k", sinks=True, pass_=pass_)


@pytest.mark.parametrize("shape", [
    dict(batch=2, heads=3, n_q=113, n_k=239, d=5, M=600, causal=True),
    dict(batch=1, heads=2, n_q=100, n_k=30, d=2, M=300, causal=True),
    dict(batch=1, heads=2, n_q=70, n_k=70, d=4, M=500, window=(10, 3)),
    dict(batch=1, heads=1, n_q=1, n_k=1, d=3, M=100),
], ids=["Nq<Nk,causal", "rows that see no key", "window", "N=1"])
@pytest.mark.parametrize("algo", ["flash", "flash-swapped"])
def test_a_backward_pass_gives_the_sinks_gradient_and_its_closed_form(algo, shape):
    shape = dict(shape)
    batch, heads, n_q, n_k, d, M = (shape.pop(k) for k in ("batch", "heads", "n_q", "n_k", "d", "M"))
    rng = np.random.default_rng(n_q)
    q, k, v = random_qkv(rng, batch, heads, n_q, n_k, d)
    do, sinks = rng.standard_normal(q.shape), 2 * rng.standard_normal(heads)
    got = iosim.gradients(algo, q, k, v, do, M=M, sinks=sinks, **shape)
    for g, r in zip((got.dq, got.dk, got.dv), iosim.attention_backward_ref(q, k, v, do, sinks=sinks, **shape)):
        np.testing.assert_allclose(g, r, rtol=0, atol=1e-12)
    want = iosim.sinks_gradient_ref(q, k, v, do, sinks, **shape)
    np.testing.assert_allclose(got.dsinks, want, rtol=0, atol=1e-12)
    # the reference against central differences of Σ dO·O
    def loss(s):
        return float((do * attention_ref(q, k, v, sinks=s, **shape).out).sum())
    step = 1e-6
    diffs = [(loss(sinks + step * e) - loss(sinks - step * e)) / (2 * step) for e in np.eye(heads)]
    np.testing.assert_allclose(want, diffs, rtol=0, atol=1e-7)
    sizes = dict(N=n_q, N_k=n_k, d=d, batch=batch, heads=heads, M=M, **shape)
    step_counts = iosim.count(algo, sinks=True, pass_="fwd+bwd", **sizes)
    assert step_counts.traffic == iosim.predict(algo, sinks=True, pass_="fwd+bwd", **sizes).exact
    backward = iosim.count(algo, sinks=True, pass_="bwd", tiling=got.backward_tiling, **sizes).traffic
    assert got.traffic == backward
    assert (backward.tensor("sinks").reads, backward.tensor("dsinks").writes) == (
        batch * heads * -(-n_q // got.backward_tiling.Br), batch * heads)


def test_bad_sinks_are_refused_naming_what_is_allowed():
    q, k, v = random_qkv(np.random.default_rng(0), 1, 2, 4, 4, 3)
    for sinks, error, words in (([1.0], InputError, "shape (2,)"), ([1.0, np.nan], InputError, "non-finite"),
                                (True, iosim.InputTypeError, "count and predict take sinks=True or False")):
        with pytest.raises(error, match=re.escape(words)):
            iosim.simulate("flash", q, k, v, M=100, sinks=sinks)
    with pytest.raises(iosim.InputTypeError, match="sinks='yes' must be True or False"):
        iosim.count("flash", N=4, d=3, M=100, sinks="yes")
    with pytest.raises(InputError, match="sinks with seqlens"):
        iosim.count("flash", seqlens=[3, 5], d=8, M=1000, sinks=True)


def test_the_dram_level_describes_no_kernel_with_sinks():
    from iosim.core.problem import AttentionShape, Problem
    from iosim.gpu.kernel import check_launchable

    with pytest.raises(InputError, match="sinks: no kernel the L2 model describes reads attention sinks"):
        check_launchable(Problem(AttentionShape(1, 2, 64, 64, 8), tau=1.0, sinks=True))


def test_run_draws_sinks_from_its_seed_and_checks_them_against_float64(tmp_path, capsys):
    from iosim.cli import main

    out = tmp_path / "run.json"
    assert main(["run", "--algo", "flash-swapped", "--N", "113", "--N-k", "239", "--d", "8", "--heads", "2",
                 "--causal", "--sinks", "--M", "2k", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["sinks"] is True and record["max_abs_error"] < 1e-12
    assert {t["name"]: t["reads"] for t in record["tensors"]}["sinks"] == 2 * -(-record["N"] // record["Br"])
    for argv, words in ((["--algo", "standard"], "sinks for standard, pass 'fwd': it takes no attention sinks"),
                        (["--algo", "split-kv", "--pass", "bwd"], "algorithm='split-kv' has no backward pass")):
        capsys.readouterr()
        assert main(["run", "--N", "64", "--d", "8", "--sinks", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err


def test_a_sweep_with_sinks_counts_the_algorithms_that_take_them_and_says_which_it_left_out(tmp_path):
    from iosim.cli import build_parser, run

    out = tmp_path / "sweep.json"
    outcome = run(build_parser().parse_args(["sweep", "--N", "256", "--d", "16", "--sinks", "--json", str(out)]))
    assert sorted(r.algorithm for r in outcome.rows) == list(TAKERS)
    assert outcome.notes == ("--sinks leaves out standard, standard-eager, small-cache: they take no attention sinks",)
    records = json.loads(out.read_text())
    assert all(r["sinks"] is True and r["status"] == "ok" and r["ratio"] == 1.0 for r in records)
    plain = iosim.count("flash", N=256, d=16, M="100k").traffic
    assert records[0]["total_bytes"] - plain.total_bytes == -(-256 // records[0]["Br"]) * STAT_BYTES


def test_a_sweep_on_a_gpu_says_its_sinks_rows_have_no_dram_bytes():
    from iosim.cli import build_parser, run

    outcome = run(build_parser().parse_args(["sweep", "--N", "256", "--d", "16", "--sinks", "--gpu", "h100",
                                             "--algo", "flash-swapped"]))
    assert outcome.notes == ("--gpu h100: the rows counted with this option have no DRAM bytes, their time is from HBM "
                             "bytes (sinks: no kernel the L2 model describes reads attention sinks; allowed: "
                             "sinks=False)",)
    (row,) = outcome.rows
    assert row.dram is None and row.roofline is not None


def test_a_backward_sweep_with_sinks_lists_the_algorithms_whose_backward_takes_them():
    from iosim.cli import build_parser, run

    outcome = run(build_parser().parse_args(["sweep", "--N", "256", "--d", "16", "--sinks", "--pass", "fwd+bwd"]))
    assert [r.algorithm for r in outcome.rows] == ["flash", "flash-swapped"]
    assert outcome.notes[0] == "--sinks leaves out standard, standard-eager: they take no attention sinks in that pass"
    with pytest.raises(InputError, match=re.escape("sinks for split-kv, pass 'fwd+bwd': it has no backward pass")):
        iosim.count("split-kv", N=1, N_k=64, d=8, M="20k", sinks=True, pass_="fwd+bwd")


def test_run_checks_the_sinks_gradient_too(tmp_path, monkeypatch):
    from iosim.cli import main, run_cmd

    argv = ["run", "--algo", "flash-swapped", "--N", "40", "--d", "4", "--heads", "2", "--causal", "--sinks",
            "--pass", "bwd", "--dropout", "0.2", "--M", "2k", "--json", str(tmp_path / "good.json")]
    assert main(argv) == 0
    assert json.loads((tmp_path / "good.json").read_text())["max_abs_error"] < 1e-12
    # a reference gradient off by one shows in the error: the check reads dsinks
    monkeypatch.setattr(run_cmd, "sinks_gradient_ref", lambda *a, **k: iosim.sinks_gradient_ref(*a, **k) + 1.0)
    argv[-1] = str(tmp_path / "bad.json")
    assert main(argv) == 0
    assert json.loads((tmp_path / "bad.json").read_text())["max_abs_error"] == pytest.approx(1.0)


def test_split_kv_s_working_set_holds_a_group_s_sinks_beside_a_tiny_block():
    # 8 query heads on one K/V head at d = 1: a query block of one row takes 8 sinks beside ℓ_i, m_i
    rng = np.random.default_rng(8)
    q, k, v = rng.standard_normal((1, 8, 1, 1)), rng.standard_normal((1, 1, 5, 1)), rng.standard_normal((1, 1, 5, 1))
    for M in (11, 12, 20):
        got = iosim.simulate("split-kv", q, k, v, M=M, sinks=rng.standard_normal(8))
        counted = iosim.predict("split-kv", N=1, N_k=5, d=1, heads=8, kv_heads=1, M=M, sinks=True).exact
        assert got.traffic == counted and got.traffic.peak_sram <= M, (M, got.tiling)
