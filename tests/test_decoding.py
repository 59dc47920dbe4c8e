"""Decoding: grouped-query attention (kv_heads < heads) for every algorithm, and split-KV."""

import json

import numpy as np
import pytest
from helpers import relative_error
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

import iosim
from iosim.cli import build_parser, main, run

TOL = 1e-10  # both sides compute in float64; only the order of summation differs
PER_HEAD = [
    name for name, a in iosim.ALGORITHMS.items() if a.listed_by_default(()) and not a.needs.packs_groups
]


def grouped_qkv(rng, batch, heads, kv_heads, n_q, n_k, d):
    return (rng.standard_normal((batch, heads, n_q, d)), rng.standard_normal((batch, kv_heads, n_k, d)),
            rng.standard_normal((batch, kv_heads, n_k, d)))


@st.composite
def grouped_cases(draw):
    kv_heads, group = draw(st.integers(1, 2)), draw(st.sampled_from([1, 2, 3]))
    d = draw(st.sampled_from([1, 5, 16]))
    return dict(batch=draw(st.integers(1, 2)), heads=kv_heads * group, kv_heads=kv_heads,
                n_q=draw(st.sampled_from([1, 3, 17, 113])), n_k=draw(st.sampled_from([1, 3, 64, 239])), d=d,
                M=draw(st.integers(40 * d + 200, 4000)), causal=draw(st.booleans()), masked=draw(st.booleans()),
                dropout_p=draw(st.sampled_from([0.0, 0.25])), seed=draw(st.integers(0, 2**32 - 1)))


def test_reference_repeats_each_kv_head_for_its_group():
    rng = np.random.default_rng(3)
    q, k, v = grouped_qkv(rng, 2, 6, 2, 5, 7, 4)
    grouped = iosim.attention_ref(q, k, v, causal=True)
    # query heads 0-2 use K/V head 0 and heads 3-5 K/V head 1: the same as multi-head attention with K/V repeated
    k_full, v_full = k[:, [0, 0, 0, 1, 1, 1]], v[:, [0, 0, 0, 1, 1, 1]]
    full = iosim.attention_ref(q, k_full, v_full, causal=True)
    assert np.array_equal(grouped.out, full.out) and np.array_equal(grouped.lse, full.lse)


@pytest.mark.parametrize("algorithm", PER_HEAD)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=grouped_cases())
def test_grouped_output_matches_reference_and_counts(algorithm, c):
    rng = np.random.default_rng(c["seed"])
    q, k, v = grouped_qkv(rng, c["batch"], c["heads"], c["kv_heads"], c["n_q"], c["n_k"], c["d"])
    mask = rng.random((c["heads"], c["n_q"], c["n_k"])) > 0.3 if c["masked"] else None
    opts = dict(causal=c["causal"], dropout_p=c["dropout_p"], seed=c["seed"])
    r = iosim.simulate(algorithm, q, k, v, M=c["M"], mask=mask, **opts)
    ref = iosim.attention_ref(q, k, v, mask=mask, **opts)
    err = relative_error(r.out, ref.out)
    assert err <= TOL, f"{algorithm} {c} {r.tiling}: relative error {err:.3e}"
    shape = dict(N=c["n_q"], N_k=c["n_k"], d=c["d"], batch=c["batch"], heads=c["heads"], mask=c["masked"], **opts)
    counted = iosim.count(algorithm, M=c["M"], kv_heads=c["kv_heads"], **shape)
    assert counted.traffic == r.traffic
    no_seed = {k: x for k, x in shape.items() if k != "seed"}
    assert iosim.predict(algorithm, M=c["M"], kv_heads=c["kv_heads"], **no_seed).exact == counted.traffic
    # each query head reads its group's K/V as its own: the counts are those of multi-head attention
    assert counted.traffic == iosim.count(algorithm, M=c["M"], **shape).traffic


@pytest.mark.parametrize("kwargs, message", [
    (dict(heads=6, kv_heads=4), r"kv_heads=4 must divide heads=6; allowed: \[1, 2, 3, 6\]"),
    (dict(heads=4, kv_heads=0), r"kv_heads"),
])
def test_kv_heads_must_divide_heads(kwargs, message):
    with pytest.raises(iosim.InputError, match=message):
        iosim.count("flash", N=8, d=4, M=1000, **kwargs)


@pytest.mark.parametrize("pass_", ["bwd", "fwd+bwd"])
def test_backward_passes_refuse_grouped_heads(pass_):
    with pytest.raises(iosim.InputError, match=r"kv_heads=1 with pass .*kv_heads == heads=4"):
        iosim.count("flash", N=8, d=4, M=1000, heads=4, kv_heads=1, pass_=pass_)
    q, k, v = grouped_qkv(np.random.default_rng(0), 1, 4, 1, 8, 8, 4)
    with pytest.raises(iosim.InputError, match=r"kv_heads=1"):
        iosim.gradients("flash", q, k, v, np.ones_like(q), M=1000)


@st.composite
def split_cases(draw):
    kv_heads, group = draw(st.integers(1, 2)), draw(st.sampled_from([1, 2, 4]))
    n_k, d = draw(st.sampled_from([1, 239, 1023])), draw(st.sampled_from([3, 8]))
    M = draw(st.integers(40 * d + 200, 3000))
    return dict(batch=draw(st.integers(1, 2)), heads=kv_heads * group, kv_heads=kv_heads,
                n_q=draw(st.sampled_from([1, 3, 113])), n_k=n_k, d=d, M=M,
                splits=draw(st.one_of(st.none(), st.integers(1, 40))), causal=draw(st.booleans()),
                masked=draw(st.booleans()), dropout_p=draw(st.sampled_from([0.0, 0.3])),
                seed=draw(st.integers(0, 2**32 - 1)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=split_cases())
def test_split_kv_matches_reference_and_its_closed_form(c):
    rng = np.random.default_rng(c["seed"])
    q, k, v = grouped_qkv(rng, c["batch"], c["heads"], c["kv_heads"], c["n_q"], c["n_k"], c["d"])
    mask = rng.random((c["heads"], c["n_q"], c["n_k"])) > 0.3 if c["masked"] else None
    opts = dict(causal=c["causal"], dropout_p=c["dropout_p"])
    shape = dict(N=c["n_q"], N_k=c["n_k"], d=c["d"], batch=c["batch"], heads=c["heads"], kv_heads=c["kv_heads"],
                 mask=c["masked"], M=c["M"], **opts)
    try:
        counted = iosim.count("split-kv", splits=c["splits"], **shape)
    except iosim.InputError as e:  # more splits than K/V blocks
        assert "splits=" in str(e) and c["splits"] is not None, str(e)
        reject()
    r = iosim.simulate("split-kv", q, k, v, M=c["M"], mask=mask, seed=c["seed"], splits=c["splits"], **opts)
    ref = iosim.attention_ref(q, k, v, mask=mask, seed=c["seed"], **opts)
    err = relative_error(r.out, ref.out)
    assert err <= TOL, f"{c} {r.tiling}: relative error {err:.3e}"
    assert np.array_equal(np.isneginf(r.lse), np.isneginf(ref.lse)), "fully masked rows differ"
    finite = np.isfinite(ref.lse)
    if finite.any():
        assert relative_error(r.lse[finite], ref.lse[finite]) <= TOL, f"{c}: logsumexp"
    predicted = iosim.predict("split-kv", splits=c["splits"], **shape)
    assert r.tiling == counted.tiling == predicted.tiling
    assert r.traffic == counted.traffic == predicted.exact, f"{c} {r.tiling}"
    assert r.flops == counted.flops == predicted.flops


def test_split_kv_reads_the_cache_once_per_kv_head():
    # decoding, 32 query heads sharing 8 K/V heads (G = 4), N_k = 4096, d = 128: every algorithm that runs per
    # query head reads each K/V head 4 times, split-kv once (its query block holds the group's G·N_q = 4 rows)
    shape = dict(N=1, N_k=4096, d=128, M="100k", batch=1, heads=32, kv_heads=8)
    cache = 8 * 4096 * 128  # elements of K (and of V) in HBM
    split = iosim.count("split-kv", **shape).traffic
    flash = iosim.count("flash-swapped", **shape).traffic
    assert split.tensor("K").reads == split.tensor("V").reads == cache
    assert flash.tensor("K").reads == flash.tensor("V").reads == 4 * cache


def test_default_splits_fill_the_sms_and_stop_at_the_blocks():
    # batch·kv_heads·T_r = 8 work units: ⌈132 / 8⌉ = 17 splits fill an H100's 132 SMs
    r = iosim.count("split-kv", N=1, N_k=4096, d=128, M="100k", heads=32, kv_heads=8, tiling=None)
    assert r.tiling.splits == 17, r.tiling
    # 132 work units or more: no split
    assert iosim.count("split-kv", N=1, N_k=4096, d=128, M="100k", batch=132, heads=8).tiling.splits == 1
    # a cache of 3 keys has at most 3 key blocks
    assert iosim.count("split-kv", N=1, N_k=3, d=8, M="100k").tiling.splits <= 3


def test_splits_cost_only_the_partials():
    # S splits add S·n·d + S·n partial writes and as many reads, and S − 1 more reads of the query block
    one = iosim.count("split-kv", N=1, N_k=4096, d=128, M="100k", heads=8, splits=1).traffic
    many = iosim.count("split-kv", N=1, N_k=4096, d=128, M="100k", heads=8, splits=16).traffic
    per_head = 2 * 16 * 128 + 2 * 16 + 15 * 128  # partials written and read back, Q read by 15 more splits
    assert many.total - one.total == 8 * per_head, (many.total, one.total)


@pytest.mark.parametrize("kwargs, message", [
    (dict(algorithm="split-kv", splits=0), r"splits=0"),
    (dict(algorithm="split-kv", splits=-2), r"splits=-2"),
    (dict(algorithm="split-kv", splits=9), r"splits=9 for split-kv at N_k=64; allowed: 1 to 8"),
    (dict(algorithm="flash", splits=2), r"splits=2 for flash at N_k=64; allowed: 1"),
    (dict(algorithm="split-kv", splits=2.5), r"splits=2.5 is not a whole number"),  # not "allowed: 1 to 8"
    (dict(algorithm="split-kv", splits=True), r"splits=True must be a whole number"),
    (dict(algorithm="split-kv", splits=1e30), r"splits=1e\+30 for split-kv at N_k=64; allowed: 1 to 8"),
])
def test_bad_splits_are_refused(kwargs, message):
    with pytest.raises(iosim.InputError, match=message):
        iosim.count(kwargs.pop("algorithm"), N=1, N_k=64, d=8, M=10**5, tiling=iosim.Tiling(1, 8), **kwargs)


def test_splits_and_a_tiling_s_own_splits_that_differ_are_refused_in_count_predict_and_simulate():
    # splits= silently won over the tiling's: a user who asked for both got one without a word
    q = k = v = np.ones((1, 1, 64, 8))
    for call in (lambda **kw: iosim.count("split-kv", N=1, N_k=64, d=8, M="2k", **kw),
                 lambda **kw: iosim.predict("split-kv", N=1, N_k=64, d=8, M="2k", **kw),
                 lambda **kw: iosim.simulate("split-kv", q[:, :, :1], k, v, M="2k", **kw)):
        for splits in (1, 2, "2"):
            with pytest.raises(iosim.InputError, match=rf"splits={splits!r} with tiling=Tiling\(Br=1, Bc=8, "
                                                       rf"splits=4\): two K/V splits"):
                call(splits=splits, tiling=iosim.Tiling(1, 8, splits=4))
        assert call(splits=4, tiling=iosim.Tiling(1, 8, splits=4)).tiling.splits == 4


def test_splits_are_taken_as_counts_are():
    one = iosim.count("split-kv", N=1, N_k=64, d=8, M=10**5, tiling=iosim.Tiling(1, 8), splits=4)
    for spelled in (4.0, "4"):
        other = iosim.count("split-kv", N=1, N_k=64, d=8, M=10**5, tiling=iosim.Tiling(1, 8), splits=spelled)
        assert other.tiling == one.tiling and other.traffic == one.traffic


def test_split_kv_has_no_backward_pass():
    with pytest.raises(iosim.InputError, match="has no backward pass"):
        iosim.count("split-kv", N=1, N_k=64, d=8, M=10**5, pass_="bwd")


@pytest.mark.parametrize("argv, message", [
    (["sweep", "--N", "64", "--d", "8", "--heads", "6", "--kv-heads", "4"], "kv_heads=4 must divide heads=6"),
    (["run", "--algo", "split-kv", "--N", "1", "--N-k", "100", "--d", "8", "--splits", "0"],
     "splits=0 for split-kv at N_k=100; allowed: 1 to"),
    (["run", "--algo", "split-kv", "--N", "1", "--N-k", "3", "--d", "8", "--splits", "4"],
     "splits=4 for split-kv at N_k=3; allowed: 1 to"),
    (["sweep", "--N", "64", "--d", "8", "--heads", "4", "--kv-heads", "2", "--pass", "bwd"],
     "kv_heads=2 with pass 'bwd'"),
])
def test_bad_decoding_input_exits_2_with_one_line(capsys, argv, message):
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], captured.err
    assert "Traceback" not in captured.err + captured.out


def test_cli_counts_grouped_heads_and_splits(tmp_path):
    out = tmp_path / "sweep.json"
    rows = run(build_parser().parse_args(["sweep", "--N", "256", "--d", "16", "--heads", "8", "--kv-heads", "2",
                                          "--splits", "4", "--algo", "flash", "split-kv", "--json", str(out)])).rows
    flash, split = rows
    assert split.tiling.splits == 4 and flash.tiling.splits == 1
    assert split.total == iosim.predict("split-kv", N=256, d=16, M="100k", heads=8, kv_heads=2, splits=4).exact.total
    records = json.loads(out.read_text())
    assert [r["kv_heads"] for r in records] == [2, 2] and [r["splits"] for r in records] == [1, 4]
    one = run(build_parser().parse_args(["run", "--algo", "split-kv", "--N", "2", "--N-k", "300", "--d", "8",
                                         "--heads", "4", "--kv-heads", "1", "--splits", "3"]))
    assert one.result.tiling.splits == 3 and one.result.problem.shape.kv_heads == 1


@pytest.mark.parametrize("impl", ["standard", "flash", "flash-swapped-tc"])
def test_kernels_that_index_kv_by_query_head_refuse_grouped_heads(impl):
    pytest.importorskip("numba")
    from kernels.api import attention

    q, k = np.zeros((1, 4, 8, 16), np.float16), np.zeros((1, 2, 8, 16), np.float16)
    with pytest.raises(iosim.InputError, match=f"kv_heads=2: {impl} take k and v with heads=4"):
        attention(q, k, k, impl=impl)  # refused on the host, before any device work


def test_the_optimal_policy_does_not_split():
    # splits only add traffic (the partials), so the fewest-traffic policy keeps S = 1 unless told otherwise
    shape = dict(N=1, N_k=4096, d=128, M="100k", heads=32, kv_heads=8)
    best = iosim.count("split-kv", block_policy="optimal", **shape)
    assert best.tiling.splits == 1
    assert best.traffic.total < iosim.count("split-kv", **shape).traffic.total
    assert iosim.count("split-kv", block_policy="optimal", splits=4, **shape).tiling.splits == 4
