"""Block policy `optimal` and `iosim optimize`: the fewest exact HBM accesses that fit M, confirmed by the simulator."""

import io
import json

import numpy as np
import pytest
from helpers import ALGORITHM_NAMES, random_qkv, relative_error
from hypothesis import assume, given, reject, settings
from hypothesis import strategies as st
from rich.console import Console

import iosim
from iosim.cli import OptimizeOutcome, build_parser, main, optimize_cmd, run
from iosim.core.problem import AttentionShape, Problem
from iosim.registry import ALGORITHMS
from iosim.reports.optimize import evaluate, optimize, ranked
from iosim.tilings.search import MAX_EXHAUSTIVE
from iosim.variants.sparsity import PATTERNS


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
@settings(max_examples=30, deadline=None)
@given(n_q=st.integers(1, 36), n_k=st.integers(1, 36), d=st.integers(1, 9), causal=st.booleans(),
       mask=st.booleans(), slack=st.floats(0, 1))
def test_optimal_is_the_best_of_every_tiling(algorithm, n_q, n_k, d, causal, mask, slack):
    algo = ALGORITHMS[algorithm]
    pb = Problem(AttentionShape(1, 1, n_q, n_k, d), tau=1.0, causal=causal, has_mask=mask)
    lo = algo.working_set(pb, iosim.Tiling(1, 1), 10**9)
    hi = algo.working_set(pb, iosim.Tiling(n_q, n_k), 10**9)
    M = lo + int(slack * (hi - lo))
    assume(algo.working_set(pb, iosim.Tiling(1, 1), M) <= M)  # a working set may grow with M (standard's rows)
    every = [evaluate(algo, pb, M, iosim.Tiling(Br, Bc)) for Br in range(1, n_q + 1) for Bc in range(1, n_k + 1)
             if algo.working_set(pb, iosim.Tiling(Br, Bc), M) <= M]
    least = min(x.traffic for x in every)
    best = ranked(algo, pb, M)[0]
    assert best.traffic == least, f"searched {best}, but some tiling moves {least}"


SPARSE = [name for name, a in ALGORITHMS.items() if a.accepts("block_sparsity")]


@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
@pytest.mark.parametrize("algorithm", SPARSE)
@settings(max_examples=25, deadline=None)
@given(n_q=st.integers(1, 40), n_k=st.integers(1, 40), d=st.integers(1, 9), causal=st.booleans(),
       mask=st.booleans(), slack=st.floats(0, 1), sparsity=st.sampled_from([0.1, 0.25, 0.5, 0.8]),
       pattern=st.sampled_from(PATTERNS), seed=st.integers(0, 99))
def test_optimal_with_a_block_mask_is_the_best_of_every_tiling(algorithm, pass_, n_q, n_k, d, causal, mask, slack,
                                                                sparsity, pattern, seed):
    # The mask is redrawn on each tiling's tiles, so traffic is not monotone in a block: the search must try them all.
    forward = ALGORITHMS[algorithm]
    algo = forward if pass_ == "fwd" else forward.backward
    pb = Problem(AttentionShape(1, 1, n_q, n_k, d), tau=1.0, causal=causal, has_mask=mask,
                 block_sparsity=iosim.BlockSparsity(sparsity, pattern, seed))
    lo = algo.working_set(pb, iosim.Tiling(1, 1), 10**9)
    M = lo + int(slack * (algo.working_set(pb, iosim.Tiling(n_q, n_k), 10**9) - lo))
    every = [evaluate(algo, pb, M, iosim.Tiling(Br, Bc)) for Br in range(1, n_q + 1) for Bc in range(1, n_k + 1)
             if algo.working_set(pb, iosim.Tiling(Br, Bc), M) <= M]
    least = min(every, key=lambda x: x.traffic)
    best = ranked(algo, pb, M)[0]
    assert best.traffic == least.traffic, f"searched {best.tiling}: {best.traffic}, {least.tiling}: {least.traffic}"
    assert iosim.count(algorithm, N=n_q, N_k=n_k, d=d, M=M, causal=causal, mask=mask, pass_=pass_,
                       block_sparsity=pb.block_sparsity, block_policy="optimal").traffic.total == best.traffic


def test_optimal_refuses_a_block_mask_search_too_large_to_try_every_tiling():
    # 2000 × 2000 tilings nearly all fit M = 10⁷ at d = 8. Causal, the hidden tiles move with the block sizes and
    # every tiling that fits is evaluated: far above the bound on tilings tried one by one
    with pytest.raises(iosim.InputError, match=f"MAX_EXHAUSTIVE={MAX_EXHAUSTIVE}"):
        iosim.count("block-sparse", N=2000, d=8, M=10**7, block_policy="optimal", causal=True,
                    block_sparsity=iosim.BlockSparsity(0.5))
    # without a band only the corners of each pair of block counts are evaluated: 15,625 at N = 2,000, answered;
    # at N = 8,192 they hold 2.4 billion mask tiles, refused with the estimate
    iosim.count("block-sparse", N=2000, d=8, M=10**7, block_policy="optimal", block_sparsity=iosim.BlockSparsity(0.5))
    with pytest.raises(iosim.SearchTooLargeError, match="MAX_MASK_CELLS"):
        iosim.count("block-sparse", N=8192, d=8, M=10**7, block_policy="optimal",
                    block_sparsity=iosim.BlockSparsity(0.5))
    dense = iosim.count("block-sparse", N=2000, d=8, M=10**7, block_policy="optimal")  # no mask: the staircase
    assert dense.traffic == iosim.count("flash", N=2000, d=8, M=10**7, block_policy="optimal").traffic


@pytest.mark.parametrize("algorithm", SPARSE)
@settings(max_examples=6, deadline=None)
@given(n_q=st.integers(40, 110), n_k=st.integers(40, 110), d=st.integers(1, 9), mask=st.booleans(),
       slack=st.floats(0, 1), sparsity=st.sampled_from([0.1, 0.3, 0.6]), pattern=st.sampled_from(PATTERNS),
       seed=st.integers(0, 99))
def test_the_corners_of_the_block_counts_hold_the_best_tiling_under_a_block_mask(algorithm, n_q, n_k, d, mask, slack,
                                                                               sparsity, pattern, seed):
    # no band: the search evaluates only the corners of each pair of block counts; brute force never beats it
    algo = ALGORITHMS[algorithm]
    pb = Problem(AttentionShape(1, 1, n_q, n_k, d), tau=1.0, has_mask=mask,
                 block_sparsity=iosim.BlockSparsity(sparsity, pattern, seed))
    lo = algo.working_set(pb, iosim.Tiling(1, 1), 10**9)
    M = lo + int(slack * (algo.working_set(pb, iosim.Tiling(n_q, n_k), 10**9) - lo))
    least = min(evaluate(algo, pb, M, iosim.Tiling(Br, Bc)).traffic for Br in range(1, n_q + 1)
                for Bc in range(1, n_k + 1) if algo.working_set(pb, iosim.Tiling(Br, Bc), M) <= M)
    assert ranked(algo, pb, M)[0].traffic == least


def test_the_optimizer_answers_under_a_block_mask_at_n_in_the_thousands():
    # issue 30: refused at N = 1,000 before. No tiling of a random sample of those that fit, nor the fit policy's,
    # moves less than the optimum
    shape = dict(N=1000, d=64, M="100k", block_sparsity=iosim.BlockSparsity(0.3, "random", 0))
    best = iosim.count("block-sparse", block_policy="optimal", **shape)
    algo, pb = ALGORITHMS["block-sparse"], best.problem
    rng = np.random.default_rng(0)
    sample = [iosim.Tiling(int(a), int(b)) for a, b in rng.integers(1, 1001, size=(400, 2))]
    fitting = [t for t in sample if algo.working_set(pb, t, best.M) <= best.M]
    assert len(fitting) > 20
    assert all(evaluate(algo, pb, best.M, t).traffic >= best.traffic.total for t in fitting)
    assert iosim.count("block-sparse", **shape).traffic.total >= best.traffic.total


@st.composite
def large_cases(draw):
    d = draw(st.integers(8, 160))
    n_q = draw(st.integers(1, 70000))
    return dict(N=n_q, N_k=draw(st.one_of(st.just(n_q), st.integers(1, 70000))), d=d,
                M=draw(st.integers(4 * d + 10, 60_000)), heads=draw(st.integers(1, 3)),
                causal=draw(st.booleans()), mask=draw(st.booleans()))


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
@settings(max_examples=15, deadline=None)
@given(c=large_cases())
def test_optimal_fits_is_simulated_exactly_and_beats_fit_and_paper(algorithm, c):
    try:
        measured = iosim.count(algorithm, **c, block_policy="optimal")
    except iosim.BlockSizeError:  # below the smallest working set: test_optimize_rejects_M_below_every_working_set
        reject()
    predicted = iosim.predict(algorithm, **c, block_policy="optimal")
    assert measured.tiling == predicted.tiling
    assert measured.traffic == predicted.exact
    assert ALGORITHMS[algorithm].working_set(measured.problem, measured.tiling, measured.M) <= measured.M
    for policy in ("fit", "paper"):
        try:
            other = iosim.predict(algorithm, **c, block_policy=policy)
        except iosim.BlockSizeError:  # 'paper' overflows for larger d
            continue
        assert measured.traffic.total <= other.exact.total, f"{policy} {other.tiling} beats {measured.tiling}"


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
def test_optimal_tiling_computes_attention_exactly(algorithm):
    rng = np.random.default_rng(113)
    q, k, v = random_qkv(rng, 2, 1, 113, 239, 7)
    for causal in (False, True):
        r = iosim.simulate(algorithm, q, k, v, M=900, causal=causal, block_policy="optimal", dropout_p=0.1, seed=3)
        ref = iosim.attention_ref(q, k, v, causal=causal, dropout_p=0.1, seed=3)
        assert relative_error(r.out, ref.out) < 1e-12, (algorithm, causal, r.tiling)
        assert r.traffic == iosim.count(algorithm, N=113, N_k=239, d=7, M=900, batch=2, causal=causal,
                                        dropout_p=0.1, block_policy="optimal").traffic


# The audit of issue 9 (N = 4096, d = 64): c = traffic·M/(N²d²) of the best flash and swapped blocks.
AUDIT = [(1000, "flash", 7.99), (1000, "flash-swapped", 5.22), (16_384, "flash", 6.51),
         (16_384, "flash-swapped", 4.38), (100_000, "flash", 8.17), (100_000, "flash-swapped", 5.35)]


@pytest.mark.parametrize("M, algorithm, c", AUDIT)
def test_optimum_reaches_the_audited_constants(M, algorithm, c):
    best = ranked(ALGORITHMS[algorithm], Problem(AttentionShape(1, 1, 4096, 4096, 64), tau=1.0), M)[0]
    assert round(best.c, 2) == c, best
    # the block that its traffic depends on is as large as fits; the other is 1
    assert (best.tiling.Br if algorithm == "flash" else best.tiling.Bc) == 1, best


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("M", [10**4, 10**5, 10**6])
def test_swapped_constant_tends_to_four(d, M):
    # B_c = 1 and the largest B_r: W = B_r·(2d + 5) + 2d <= M. K and V are read ⌈N/B_r⌉ times and
    # Q, O, ℓ, m once: 2Nd·⌈N/B_r⌉ + 2Nd + 2N >= 2N²d(2d + 5)/M, so c >= 4 + 10/d; B_r >= (M − 4d − 5)/(2d + 5)
    # and ⌈N/B_r⌉ <= N/B_r + 1 bound it above.
    N = 2**20
    best = ranked(ALGORITHMS["flash-swapped"], Problem(AttentionShape(1, 1, N, N, d), tau=1.0), M)[0]
    low = 4 + 10 / d
    assert best.tiling.Bc == 1 and low <= best.c <= low * M / (M - 4 * d - 5) + 4 * M / (N * d), best


def test_optimize_confirms_and_compares():
    results = optimize(N=1000, N_k=777, d=40, M=5000, causal=True, top=2)
    # every algorithm whose tiling is searched: flex's is its block mask's
    assert [r.algorithm for r in results] == [name for name, a in ALGORITHMS.items() if not a.accepts("block_mask")]
    for r in results:
        assert r.measured == ALGORITHMS[r.algorithm].traffic(r.problem, r.best[0].tiling, r.M)
        assert r.best[0].traffic < r.best[1].traffic and len(r.best) == 2
        assert r.best[0].traffic <= r.fit.traffic and r.best[0].working_set <= 5000


def test_optimize_rejects_M_below_every_working_set():
    with pytest.raises(iosim.BlockSizeError, match=r"M=4 is below the smallest working set of every algorithm asked "
                                                   r"for \(.*flash: 263.*\); allowed range M >= "):
        optimize(N=4096, d=64, M=4)


def test_optimize_command_saves_the_tilings(tmp_path):
    js = tmp_path / "o.json"
    argv = ["optimize", "--N", "4096", "--d", "64", "--M", "16384", "--algo", "flash", "flash-swapped",
            "--json", str(js)]
    out = run(build_parser().parse_args(argv))
    assert isinstance(out, OptimizeOutcome)
    records = json.loads(js.read_text())
    assert [(r["algorithm"], r["rank"]) for r in records] == [("flash", 1), ("flash", 2), ("flash", 3),
                                                             ("flash-swapped", 1), ("flash-swapped", 2),
                                                             ("flash-swapped", 3)]
    first = records[3]
    assert (first["Br"], first["Bc"], round(first["c"], 2)) == (121, 1, 4.38)
    assert first["simulated"] == first["traffic"] and first["working_set"] <= 16384
    assert main(argv[:-2]) == 0


@pytest.mark.parametrize("argv, message", [
    (["--M", "4"], "M=4 is below the smallest working set of every algorithm"),
    (["--M", "1000", "--top", "0"], "--top: 0"),
])
def test_optimize_bad_input_exits_2_with_one_line(capsys, argv, message):
    assert main(["optimize", "--N", "4096", "--d", "64", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_sweep_takes_the_optimal_policy():
    out = run(build_parser().parse_args(["sweep", "--M", "100k", "--N", "4096", "--d", "64", "--block-policy",
                                         "optimal"]))
    assert all(r.status == "ok" and r.total == r.predicted for r in out.rows)
    assert {r.algorithm: (r.tiling.Br, r.tiling.Bc) for r in out.rows}["flash"] == (1, 683)


@pytest.mark.parametrize("pass_, shape", [("fwd", ["--N", "4096"]), ("bwd", ["--N", "4096"]),
                                          ("fwd", ["--N", "1", "--N-k", "65536"])])  # c in the thousands
def test_optimize_table_fits_80_columns(pass_, shape):
    args = build_parser().parse_args(["optimize", *shape, "--d", "64", "--M", "100k", "--pass", pass_])
    console = Console(width=80, file=io.StringIO(), record=True)
    optimize_cmd.render(console, run(args), pass_)
    text = console.export_text()
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_optimize_with_grouped_heads_searches_each_algorithm_as_it_runs():
    # 8 query heads share 2 K/V heads: split-kv packs each group of 4 and reads the cache once per K/V head,
    # the per-head algorithms read it once per query head; every winner is the count of its own tiling
    results = optimize(["flash-swapped", "split-kv"], N=1, N_k=4096, d=64, M="100k", heads=8, kv_heads=2)
    by_name = {r.algorithm: r for r in results}
    for name, r in by_name.items():
        counted = iosim.count(name, N=1, N_k=4096, d=64, M="100k", heads=8, kv_heads=2, tiling=r.best[0].tiling)
        assert counted.traffic == r.measured and counted.traffic.total == r.best[0].traffic, name
    kv_reads = {name: r.measured.tensor("K").reads + r.measured.tensor("V").reads for name, r in by_name.items()}
    assert kv_reads["flash-swapped"] == 8 * 2 * 4096 * 64 and kv_reads["split-kv"] == 2 * 2 * 4096 * 64, kv_reads


def test_optimize_refuses_grouped_heads_for_a_backward_pass(capsys):
    assert main(["optimize", "--N", "64", "--d", "8", "--heads", "4", "--kv-heads", "2", "--pass", "bwd"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--kv-heads 2 with --pass bwd" in err


def test_optimize_takes_a_block_mask_through_the_api_and_the_command_line(tmp_path, capsys):
    spec = iosim.BlockSparsity(0.3, "local", 2)
    (found,) = optimize(["block-sparse"], N=300, d=16, M="20k", block_sparsity=spec)
    assert found.best[0].traffic == iosim.count("block-sparse", N=300, d=16, M="20k", block_sparsity=spec,
                                                block_policy="optimal").traffic.total
    path = tmp_path / "o.json"
    assert main(["optimize", "--N", "300", "--d", "16", "--M", "20k", "--algo", "block-sparse", "--sparsity", "0.3",
                 "--sparsity-pattern", "local", "--sparsity-seed", "2", "--json", str(path)]) == 0
    assert "a local block mask, s = 0.3" in " ".join(capsys.readouterr().out.split())
    record = json.loads(path.read_text())[0]
    assert (record["sparsity"], record["sparsity_pattern"], record["sparsity_seed"]) == (0.3, "local", 2)
    assert (record["Br"], record["Bc"], record["traffic"]) == (found.best[0].tiling.Br, found.best[0].tiling.Bc,
                                                               found.best[0].traffic)
    assert main(["optimize", "--N", "300", "--d", "16", "--algo", "flash", "--sparsity", "0.3"]) == 2
    assert "block_sparsity for flash" in capsys.readouterr().err
