"""Block-sparse FlashAttention: exact against float64 attention with the block mask spelled out, counts predicted."""

import json
import re

import numpy as np
import pytest
from helpers import problem, random_qkv, relative_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import iosim
from iosim.cli import build_parser, main, run
from iosim.variants.sparsity import PATTERNS

VARIANTS = ["block-sparse", "block-sparse-skip"]
TOL = 1e-10


def element_mask(blocks: np.ndarray, tiling: iosim.Tiling, n_q: int, n_k: int) -> np.ndarray:
    """Element (r, c) is kept exactly when its tile (r // B_r, c // B_c) is nonzero."""
    rows, cols = np.arange(n_q) // tiling.Br, np.arange(n_k) // tiling.Bc
    return blocks[rows[:, None], cols[None, :]]


sparsities = st.builds(iosim.BlockSparsity, sparsity=st.floats(0.01, 1.0), pattern=st.sampled_from(PATTERNS),
                       seed=st.integers(0, 2**32))


@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
@pytest.mark.parametrize("algorithm", VARIANTS)
@settings(max_examples=80, deadline=None)
@given(n_q=st.integers(1, 3000), n_k=st.integers(1, 3000), d=st.integers(1, 64), spare=st.integers(0, 200_000),
       causal=st.booleans(), mask=st.booleans(), sparsity=sparsities)
def test_count_equals_exact_prediction(algorithm, pass_, n_q, n_k, d, spare, causal, mask, sparsity):
    smallest = iosim.ALGORITHMS[algorithm].backward.working_set(problem(n_q, n_k, d, has_mask=mask),
                                                                iosim.Tiling(1, 1), 0)
    shape = dict(N=n_q, N_k=n_k, d=d, M=smallest + spare, causal=causal, mask=mask, block_sparsity=sparsity, batch=2)
    r = iosim.count(algorithm, pass_=pass_, **shape)
    p = iosim.predict(algorithm, pass_=pass_, **shape)
    assert (
        (r.forward_tiling, r.backward_tiling) == (p.forward_tiling, p.backward_tiling)
        and r.traffic == p.exact
        and r.flops == p.flops
    ), f"{algorithm} {pass_} {shape}"
    assert r.traffic.peak_sram <= r.M


@pytest.mark.parametrize("algorithm", VARIANTS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n_q=st.sampled_from([1, 17, 113, 239]), n_k=st.sampled_from([1, 64, 113, 239]), d=st.sampled_from([3, 8]),
       spare=st.integers(0, 8000), causal=st.booleans(), dropout_p=st.sampled_from([0.0, 0.3]), sparsity=sparsities)
def test_gradients_match_attention_with_the_block_mask_spelled_out(algorithm, n_q, n_k, d, spare, causal, dropout_p,
                                                                   sparsity):
    rng = np.random.default_rng(n_q * n_k + d)
    q, k, v = random_qkv(rng, 2, 1, n_q, n_k, d)
    do = rng.standard_normal(q.shape)
    M = 4 * 3 * d + 20 + spare  # a few rows and columns' worth: many tiles
    opts = dict(causal=causal, dropout_p=dropout_p, seed=3)
    g = iosim.gradients(algorithm, q, k, v, do, M=M, block_sparsity=sparsity, **opts)
    t = g.backward_tiling  # both passes run on it
    blocks = sparsity.mask(-(-n_q // t.Br), -(-n_k // t.Bc))
    keep = element_mask(blocks, t, n_q, n_k)
    out = iosim.simulate(algorithm, q, k, v, M=M, block_sparsity=sparsity, tiling=t, **opts).out
    assert relative_error(out, iosim.attention_ref(q, k, v, mask=keep, **opts).out) <= TOL
    ref = iosim.attention_backward_ref(q, k, v, do, mask=keep, **opts)
    for name, x, r in zip(("dq", "dk", "dv"), (g.dq, g.dk, g.dv), ref):
        assert relative_error(x, r) <= TOL, f"{algorithm} {name} blocks {t}"


@pytest.mark.parametrize("algorithm", VARIANTS)
@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
def test_without_a_block_mask_the_counts_are_flash(algorithm, pass_):
    shape = dict(N=2000, N_k=1500, d=64, M="100k", causal=True, pass_=pass_)
    dense = iosim.count("flash", **shape).traffic.total
    assert iosim.count(algorithm, **shape).traffic.total == dense
    full = iosim.BlockSparsity(1.0)  # every tile nonzero, drawn
    assert iosim.count(algorithm, block_sparsity=full, **shape).traffic.total == dense


@pytest.mark.parametrize("pattern", PATTERNS)
def test_skipping_empty_columns_moves_less_and_sparsity_scales_the_inner_steps(pattern):
    shape = dict(N=4096, d=64, M="100k")
    flash = iosim.count("flash", **shape).traffic.total
    totals = {}
    for s in (0.1, 0.5):
        sp = iosim.BlockSparsity(s, pattern, seed=1)
        paper = iosim.count("block-sparse", block_sparsity=sp, **shape).traffic.total
        skip = iosim.count("block-sparse-skip", block_sparsity=sp, **shape).traffic.total
        assert skip <= paper < flash
        totals[s] = paper
    assert totals[0.1] < totals[0.5]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_patterns_hold_exactly_the_fraction_asked_and_are_reproducible(pattern):
    sp = iosim.BlockSparsity(0.3, pattern, seed=7)
    m = sp.mask(13, 21)
    assert m.shape == (13, 21) and m.sum() == round(0.3 * 13 * 21)
    assert np.array_equal(m, iosim.BlockSparsity(0.3, pattern, seed=7).mask(13, 21))
    assert iosim.BlockSparsity(0.001, pattern).mask(5, 5).sum() == 1  # never empty


def test_local_pattern_is_a_band():
    m = iosim.BlockSparsity(0.2, "local").mask(20, 20)
    i, j = np.nonzero(m)
    assert np.abs(i - j).max() <= 2 and np.all(np.diag(m))


def test_paper_form_scales_the_quadratic_terms_by_s():
    N, d, M, s = 4096, 64, 100_000, 0.25
    p = iosim.predict("block-sparse", N=N, d=d, M=M, block_sparsity=iosim.BlockSparsity(s))
    assert p.paper == pytest.approx(s * (12 * N * N * d * d / M + 16 * N * N * d / M) + 3 * N * d)


def test_an_element_mask_reduces_to_its_block_mask():
    mask = np.zeros((10, 10), dtype=bool)
    mask[0, 9] = mask[5, 4] = True
    blocks = np.array(iosim.variants.sparsity.reduce_element_mask(mask, iosim.Tiling(4, 3)).blocks)
    assert blocks.shape == (3, 4) and sorted(zip(*np.nonzero(blocks))) == [(0, 3), (1, 1)]


@pytest.mark.parametrize("make, message", [
    (lambda: iosim.BlockSparsity(0.0), r"sparsity=0.0 is outside the allowed range \(0, 1\]"),
    (lambda: iosim.BlockSparsity(1.5), r"sparsity=1.5 is outside the allowed range \(0, 1\]"),
    (lambda: iosim.BlockSparsity(0.5, "diagonal"), "pattern='diagonal' is not one of"),  # its keyword
    (lambda: iosim.BlockSparsity.from_array(np.ones((2, 2))), "block mask must be boolean"),
    (lambda: iosim.count("block-sparse", N=100, d=8, M=2000, tiling=iosim.Tiling(10, 10),
                         block_sparsity=iosim.BlockSparsity.from_array(np.ones((3, 3), dtype=bool))),
     r"block mask of shape \(3, 3\) does not match the run's tiles: allowed shape .* = \(10, 10\)"),
])
def test_bad_block_masks_are_refused(make, message):
    with pytest.raises(iosim.InputError, match=message):
        make()


def parse(*argv):
    return build_parser().parse_args(list(argv))


def test_sweep_sparsity_applies_to_block_sparse_rows_and_is_recorded(tmp_path):
    path = tmp_path / "s.json"
    argv = ["sweep", "--N", "4096", "--d", "64", "--algo", "flash", "block-sparse", "--sparsity", "0.25",
            "--sparsity-pattern", "strided", "--json", str(path)]
    rows = run(parse(*argv)).rows
    flash, sparse = rows
    assert flash.sparsity is None and flash.total == iosim.count("flash", N=4096, d=64, M="100k").traffic.total
    spec = iosim.BlockSparsity(0.25, "strided")
    assert sparse.total == iosim.count("block-sparse", N=4096, d=64, M="100k", block_sparsity=spec).traffic.total
    records = json.loads(path.read_text())
    assert [(r["sparsity"], r["sparsity_pattern"]) for r in records] == [(None, None), (0.25, "strided")]
    again = run(parse(*argv[:-2], "--sparsity", "0.5", "--json", str(path), "--resume")).rows
    assert [r.algorithm for r in again] == ["block-sparse"], "another sparsity is another configuration"


def test_run_checks_block_sparse_gradients_against_the_masked_reference():
    out = run(parse("run", "--algo", "block-sparse-skip", "--N", "150", "--N-k", "90", "--d", "8", "--M", "3k",
                    "--sparsity", "0.4", "--sparsity-pattern", "local", "--pass", "fwd+bwd", "--causal"))
    assert out.max_rel_error < 1e-12


@pytest.mark.parametrize("argv, message", [
    (["sweep", "--sparsity", "0"], r"sparsity=0.0 is outside the allowed range \(0, 1\]"),
    (["sweep", "--sparsity", "1.5"], r"sparsity=1.5 is outside the allowed range \(0, 1\]"),
    (["run", "--algo", "flash", "--sparsity", "0.5"], "block_sparsity for flash: it has no block mask; allowed: "),
    (["sweep", "--sparsity-pattern", "diagonal"], "argument --sparsity-pattern: invalid choice"),
])
def test_bad_sparsity_exits_2_with_one_line(capsys, argv, message):
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and re.search(message, lines[0]), lines
