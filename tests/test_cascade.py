"""Cascade attention over a shared prefix (iosim.serving.cascade, iosim cascade): exact outputs, exact counts, the
shared K/V read once."""

import json
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import iosim
from iosim.cli import build_parser, main, run
from iosim.serving.cascade import merge_rows, merging_algorithms

MERGING = [name for name, a in iosim.ALGORITHMS.items()
           if {"l", "m"} <= set(a.outputs()) and a.listed_by_default(("block_sparsity",))]  # flex needs a block mask
PAGED = [name for name, a in iosim.ALGORITHMS.items() if a.accepts("page_size")]


def shared_qkv(rng, batch, heads, kv_heads, n_q, prefix, suffix, d):
    """q (batch, heads, N_q, d) and k, v (batch, kv_heads, P + U, d) whose first P keys and values are the same in
    every request."""
    q = rng.standard_normal((batch, heads, n_q, d))
    k, v = (rng.standard_normal((batch, kv_heads, prefix + suffix, d)) for _ in range(2))
    k[:, :, :prefix], v[:, :, :prefix] = k[0, :, :prefix], v[0, :, :prefix]
    return q, k, v


def without_peak(counts):
    return {t.name: (t.reads, t.writes) for t in counts.tensors}


@pytest.mark.parametrize("algorithm", MERGING)
@pytest.mark.parametrize("n_q, prefix, suffix, causal", [(1, 113, 7, False), (3, 113, 7, True), (2, 1, 0, False),
                                                         (1, 239, 0, True), (3, 37, 2, True)])
def test_outputs_equal_the_reference(algorithm, n_q, prefix, suffix, causal):
    rng = np.random.default_rng(prefix + 10 * n_q)
    q, k, v = shared_qkv(rng, 3, 4, 2, n_q, prefix, suffix, 17)
    r = iosim.simulate_cascade(algorithm, q, k, v, prefix=prefix, M=1500, causal=causal)
    ref = iosim.attention_ref(q, k, v, causal=causal)
    assert np.abs(r.out - ref.out).max() < 1e-12, np.abs(r.out - ref.out).max()
    assert np.abs(r.lse - ref.lse).max() < 1e-12, np.abs(r.lse - ref.lse).max()
    assert r.traffic == r.predicted, (without_peak(r.traffic), without_peak(r.predicted))
    count = iosim.cascade(algorithm, batch=3, prefix=prefix, suffix=suffix, d=17, M=1500, N=n_q, heads=4, kv_heads=2,
                          causal=causal)
    assert count.traffic == r.traffic and count.flops == r.flops


@pytest.mark.parametrize("algorithm", PAGED)
def test_paged_outputs_equal_the_reference(algorithm):
    rng = np.random.default_rng(5)
    q, k, v = shared_qkv(rng, 2, 3, 3, 1, 48, 13, 9)
    r = iosim.simulate_cascade(algorithm, q, k, v, prefix=48, M=900, page_size=16)
    assert np.abs(r.out - iosim.attention_ref(q, k, v).out).max() < 1e-12
    assert r.traffic == r.predicted
    # the prefix level reads the prefix's own table, 48/16 = 3 pages, per K/V head of batch 1; the separate decode
    # reads every request's, prefix pages included
    prefix_table = r.levels[0].result.traffic.tensor("block_table").reads
    assert prefix_table > 0 and r.separate.traffic.tensor("block_table").reads > prefix_table


def test_by_hand_four_requests():
    # B = 4 requests of one query, P = 64 shared keys, U = 16 of their own, d = 8, one head, flash-swapped with the
    # whole problem in one block per level (M large): the prefix level reads Q once per request (4·8), K and V once
    # (64·8 = 512 each) and writes O_prefix (4·8), ℓ, m (4); the suffix level reads Q again, each request's 16 keys
    # (4·16·8 = 512 of K and of V) and writes O_suffix, ℓ, m likewise; the merge reads both states and writes O,
    # ℓ, m. Separately, each request reads its 80 keys: 4·80·8 = 2560 of K and of V.
    r = iosim.cascade("flash-swapped", batch=4, prefix=64, suffix=16, d=8, M=100_000)
    assert [lv.result.tiling for lv in r.levels] == [iosim.Tiling(4, 64), iosim.Tiling(1, 16)]
    state = {"O": 32, "l": 4, "m": 4}
    expected = {"Q": (64, 0), "K": (1024, 0), "V": (1024, 0),
                **{f"{t}_{level}": (n, n) for level in ("prefix", "suffix") for t, n in state.items()},
                **{t: (0, n) for t, n in state.items()}}
    assert without_peak(r.traffic) == expected
    assert without_peak(r.separate.traffic) == {"Q": (32, 0), "K": (2560, 0), "V": (2560, 0), "O": (0, 32),
                                                "l": (0, 4), "m": (0, 4)}
    # the merge holds O_i, O_s (2·8) and five statistics for its one row of each head: 21 elements
    assert r.merge.peak_sram == 21 and r.merge == r.merge_predicted


def test_the_merge_takes_as_many_rows_as_fit_where_m_binds():
    # Kills the mutant of merge_rows' per-row working set 2·d + 5 → 2·d + 3, which survives wherever all N_q rows of a
    # head fit (every other test): B = 3 requests of N = 20 queries, d = 8, one head, M = 200 elements. A merge row
    # holds O_i and O_s (2·8) and ℓ_i, m_i, ℓ_s, m_s, m_new (5): 21 elements, so ⌊200/21⌋ = 9 rows fit (189 ≤ 200 <
    # 210) of the 20: M binds, and the merge runs blocks of 9, 9 and 2 rows, its peak 9·21 = 189. (With 2·d + 3 = 19 it
    # would take ⌊200/19⌋ = 10 rows, 210 elements.) Each of the 3·20 = 60 rows reads both levels' O (8), ℓ and m once
    # and writes O, ℓ, m once, whatever the block.
    r = iosim.cascade("split-kv", batch=3, prefix=64, suffix=32, N=20, d=8, M=200)
    assert merge_rows(r.problem, r.M) == 9
    state = {"O": 60 * 8, "l": 60, "m": 60}
    expected = {**{f"{t}_{level}": (n, 0) for level in ("prefix", "suffix") for t, n in state.items()},
                **{t: (0, n) for t, n in state.items()}}
    assert without_peak(r.merge) == expected and r.merge.peak_sram == 189, (without_peak(r.merge), r.merge.peak_sram)
    assert r.merge == r.merge_predicted, (r.merge.peak_sram, r.merge_predicted.peak_sram)
    assert r.traffic == r.predicted, (without_peak(r.traffic), without_peak(r.predicted))


@st.composite
def batches(draw):
    page_size = draw(st.sampled_from([None, 1, 16]))
    prefix = draw(st.integers(1, 300)) * (page_size or 1)
    n_q = draw(st.integers(1, 4))
    causal = draw(st.booleans())
    kv_heads, group = draw(st.integers(1, 2)), draw(st.sampled_from([1, 4]))
    d = draw(st.sampled_from([3, 16, 64]))
    return dict(algorithm=draw(st.sampled_from(PAGED if page_size else MERGING)), batch=draw(st.integers(1, 70)),
                prefix=prefix, suffix=draw(st.integers(n_q - 1 if causal else 0, 400)), N=n_q, causal=causal, d=d,
                heads=kv_heads * group, kv_heads=kv_heads, page_size=page_size,
                M=draw(st.integers(40 * d + 400, 200_000)))


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_counts_equal_closed_forms(case):
    r = iosim.cascade(**case)
    assert r.traffic == r.predicted, (case, without_peak(r.traffic), without_peak(r.predicted))
    # each level is the algorithm's own count of its problem
    options = dict(d=case["d"], M=case["M"], heads=case["heads"], kv_heads=case["kv_heads"],
                   page_size=case["page_size"])
    prefix_level = iosim.count(case["algorithm"], N=case["batch"] * case["N"], N_k=case["prefix"], **options)
    assert r.levels[0].result.traffic == prefix_level.traffic
    if case["suffix"]:
        suffix_level = iosim.count(case["algorithm"], N=case["N"], N_k=case["suffix"], batch=case["batch"],
                                   causal=case["causal"], **options)
        assert r.levels[1].result.traffic == suffix_level.traffic


@settings(max_examples=40)
@given(batches())
def test_one_request_with_all_shared_is_the_plain_decode(case):
    # batch 1 and U = 0: the prefix level is the plain problem and there is nothing to merge
    r = iosim.cascade(**{**case, "batch": 1, "suffix": 0, "causal": False})
    assert r.merge is None and len(r.levels) == 1 and r.traffic == r.separate.traffic


@settings(max_examples=40)
@given(batches())
def test_the_shared_keys_are_read_once_per_query_block(case):
    # the prefix level reads the P shared keys once per query block of its packed rows (flash-swapped, split-kv: all
    # splits of a block together) and no more; the separate decode reads them once per request at least
    case = {**case, "algorithm": case["algorithm"] if case["algorithm"] in PAGED else "split-kv"}
    r = iosim.cascade(**case)
    top = r.levels[0].result
    groups = 1 if case["algorithm"] == "flash-swapped" else case["heads"] // case["kv_heads"]
    rows = groups * case["batch"] * case["N"]  # query rows of one head as the level runs it
    heads = case["heads"] // groups
    assert top.traffic.tensor("K").reads == -(-rows // top.tiling.Br) * case["prefix"] * case["d"] * heads
    assert r.separate.traffic.tensor("K").reads >= case["batch"] * (case["prefix"] + case["suffix"]) * case["d"] * (
        case["kv_heads"] if case["algorithm"] == "split-kv" else case["heads"])


@pytest.mark.parametrize("kwargs, message", [
    (dict(prefix=0), "prefix=0"),
    (dict(prefix=100, page_size=16), "only whole pages are shared; allowed: a multiple of 16"),
    (dict(suffix=1, N=4, causal=True), "allowed: suffix >= 3"),
    (dict(suffix=-1), "suffix=-1 is outside the allowed range [0, 2**62]"),
    (dict(prefix=2**62 - 1, suffix=16), "prefix=4,611,686,018,427,387,903 with suffix=16: their keys, "
                                        "4,611,686,018,427,387,919, pass the allowed 2**62"),
    (dict(algorithm="standard"), "writes no softmax statistics"),
    (dict(algorithm="flash", page_size=16), "reads no paged K/V cache"),
])
def test_refusals_name_the_parameter(kwargs, message):
    args = dict(algorithm="split-kv", batch=2, prefix=64, suffix=8, d=8, M=2000) | kwargs
    with pytest.raises(iosim.InputError, match=re.escape(message)):
        iosim.cascade(args.pop("algorithm"), **args)


def test_every_algorithm_a_refusal_offers_runs_a_cascade_and_the_command_offers_those(capsys):
    # the refusal's allowed list, and --algo's choices, are what runs: flex, which takes a block mask a cascade's
    # levels do not, was offered by the refusal and then refused
    with pytest.raises(iosim.InputError, match="allowed: ") as refused:
        iosim.cascade("standard", batch=2, prefix=64, suffix=8, d=8, M=2000)
    offered = re.search(r"allowed: \[(.*)\]", str(refused.value)).group(1).replace("'", "").split(", ")
    assert offered == merging_algorithms() and "flex" not in offered
    for name in offered:
        assert iosim.cascade(name, batch=2, prefix=64, suffix=8, d=8, M=2000).traffic.total > 0
    assert main(["cascade", "--prefix", "64", "--batch", "2", "--d", "8", "--algo", "standard"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'standard'" in err and all(f"'{name}'" in err for name in offered) and "flex" not in err


def test_numeric_run_refuses_prefixes_that_differ():
    rng = np.random.default_rng(0)
    q, k, v = shared_qkv(rng, 2, 1, 1, 1, 10, 3, 4)
    v[1, 0, 9, 0] += 1.0
    with pytest.raises(iosim.InputError, match=r"v\[1, :, :10\] differs from v\[0, :, :10\]"):
        iosim.simulate_cascade("split-kv", q, k, v, prefix=10, M=500)
    with pytest.raises(iosim.InputError, match="prefix=14 of k, v with N_k=13 keys; allowed: 1 to 13"):
        iosim.simulate_cascade("split-kv", q, k, v, prefix=14, M=500)


def test_numeric_run_takes_the_values_simulate_takes(recwarn):
    # complex values are refused as simulate refuses them, not cast with a warning; NaN is refused by name unless
    # allow_nonfinite asks to propagate it, when the prefix's NaN matches in every request
    rng = np.random.default_rng(0)
    q, k, v = shared_qkv(rng, 2, 1, 1, 1, 10, 3, 4)
    with pytest.raises(iosim.InputError, match="complex, object and string arrays are refused"):
        iosim.simulate_cascade("split-kv", q.astype(complex), k, v, prefix=10, M=500)
    assert not [w for w in recwarn if "ComplexWarning" in str(w.category)]
    k[:, 0, 2, 1] = np.nan  # in the shared prefix of both requests
    with pytest.raises(iosim.InputError, match="allow_nonfinite=True to propagate them"):
        iosim.simulate_cascade("split-kv", q, k, v, prefix=10, M=500)
    r = iosim.simulate_cascade("split-kv", q, k, v, prefix=10, M=500, allow_nonfinite=True)
    assert np.isnan(r.out).any()


def test_cli_table_and_records(tmp_path, capsys):
    path = tmp_path / "c.json"
    args = build_parser().parse_args(["cascade", "--prefix", "4Ki", "--suffix", "256", "--batch", "1", "8", "--d",
                                      "128", "--heads", "32", "--kv-heads", "8", "--page-size", "16", "--gpu", "h100",
                                      "--json", str(path)])
    outcome = run(args)
    records = json.loads(path.read_text())
    assert [(r["batch"], r["prefix"]) for r in records] == [(1, 4096), (8, 4096)]
    assert {(r["gpu"], r["block_policy"]) for r in records} == {("H100", "fit")}  # what else sets the counts
    for rec, r in zip(records, outcome.results):
        api = iosim.cascade(batch=rec["batch"], prefix=4096, suffix=256, d=128, M=r.M, heads=32, kv_heads=8,
                            page_size=16, gpu="h100")
        assert rec["total"] == api.traffic.total and rec["separate_total"] == api.separate.traffic.total
    # one request gains nothing from sharing (a little lost to the merge); eight read the prefix once, not 8 times
    assert records[0]["ratio"] > 1 > 0.5 > records[1]["ratio"]
    assert main(["cascade", "--prefix", "4Ki", "--batch", "1", "8", "--d", "64"]) == 0
    assert "÷ separate" in capsys.readouterr().out


def test_cli_bad_input_is_one_line(capsys):
    assert main(["cascade", "--prefix", "100", "--page-size", "16", "--d", "64"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "only whole pages are shared" in err


def test_sizes_take_units_as_everywhere():
    plain = iosim.cascade(batch=4, prefix=4096, suffix=1024, N=2, d=16, M="20k")
    units = iosim.cascade(batch="4", prefix="4Ki", suffix="1Ki", N=2.0, d=16, M="20k")
    assert units.traffic == plain.traffic and units.suffix == 1024


def test_a_causal_numeric_run_names_the_largest_prefix_it_takes():
    rng = np.random.default_rng(1)
    q, k, v = shared_qkv(rng, 2, 1, 1, 3, 10, 2, 4)
    with pytest.raises(iosim.InputError, match="prefix=11 of k, v with N_k=12 keys, causal N_q=3; allowed: 1 to 10"):
        iosim.simulate_cascade("split-kv", q, k, v, prefix=11, M=500, causal=True)
    assert iosim.simulate_cascade("split-kv", q, k, v, prefix=10, M=500, causal=True).merge is not None
