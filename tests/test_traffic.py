"""Measured HBM traffic equals the exact closed form, in both modes, within the paper's bounds."""

import numpy as np
import pytest
from helpers import ALGORITHM_NAMES, M_for_block, problem, random_qkv
from hypothesis import assume, given, reject, settings
from hypothesis import strategies as st

import iosim


def assert_matches_prediction(algorithm, result, **shape):
    pred = iosim.predict(algorithm, M=result.M, dtype=result.problem.dtype, **shape)
    assert pred.tiling == result.tiling
    # every tensor's reads, writes and bytes, and the peak SRAM
    assert result.traffic == pred.exact, f"{algorithm} {shape} M={result.M}: {result.traffic} != {pred.exact}"
    assert result.traffic.peak_sram <= result.M


@st.composite
def count_cases(draw):
    d = draw(st.integers(1, 256))
    d_v = draw(st.one_of(st.just(d), st.integers(1, 256)))  # V's head size, apart from Q's and K's (MLA)
    n_q = draw(st.integers(1, 70000))
    n_k = draw(st.one_of(st.just(n_q), st.integers(1, 70000)))
    M = draw(st.integers(2 * (d + d_v) + 10, 2_000_000))
    return dict(N=n_q, N_k=n_k, d=d, d_v=d_v, M=M, batch=draw(st.integers(1, 4)), heads=draw(st.integers(1, 16)),
                causal=draw(st.booleans()), mask=draw(st.booleans()),
                dtype=draw(st.sampled_from(["float16", "float32"])))


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
@settings(max_examples=200, deadline=None)
@given(c=count_cases())
def test_count_only_equals_exact_prediction(algorithm, c):
    try:
        r = iosim.count(algorithm, **c)
    except iosim.BlockSizeError:  # M below this shape's smallest working set: covered by test_inputs
        reject()
    shape = {k: c[k] for k in ("N", "N_k", "d", "d_v", "batch", "heads", "causal", "mask")}
    assert_matches_prediction(algorithm, r, **shape)


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
@settings(max_examples=25, deadline=None)
@given(n_q=st.sampled_from([1, 31, 113, 239]), n_k=st.sampled_from([1, 64, 113, 239]),
       d=st.sampled_from([3, 8, 20]), B=st.integers(1, 80), masked=st.booleans(), causal=st.booleans())
def test_numeric_and_count_only_modes_move_the_same_traffic(algorithm, n_q, n_k, d, B, masked, causal):
    M = M_for_block(algorithm, n_q, n_k, d, B, has_mask=masked)
    rng = np.random.default_rng(B)
    q, k, v = random_qkv(rng, 2, 1, n_q, n_k, d)
    mask = rng.random((n_q, n_k)) > 0.5 if masked else None
    numeric = iosim.simulate(algorithm, q, k, v, M=M, mask=mask, causal=causal, dropout_p=0.1)
    counted = iosim.count(algorithm, N=n_q, N_k=n_k, d=d, M=M, batch=2, mask=masked, causal=causal, dropout_p=0.1)
    assert numeric.tiling == counted.tiling
    assert numeric.traffic == counted.traffic, f"{algorithm} blocks {numeric.tiling}"
    assert_matches_prediction(algorithm, numeric, N=n_q, N_k=n_k, d=d, batch=2, mask=masked, causal=causal,
                              dropout_p=0.1)


def test_flash_counts_by_hand():
    # N = 239, d = 16 and blocks B_r = 16, B_c = 50 (the 'fit' choice below), so
    # T_c = ⌈239/50⌉ = 5. K and V are read once each (2·N·d); Q, O, ℓ and m are read
    # once per KV block (T_c·(2·N·d + 2·N)); O, ℓ, m are written once per KV block and
    # once more by the initialization of line 3 ((T_c + 1)·(N·d + 2·N)).
    N, d = 239, 16
    M = 2 * 50 * d + 2 * 16 * d + 16 * 50 + 6 * 16  # working set of B_r = 16, B_c = 50
    r = iosim.count("flash", N=N, d=d, M=M)
    assert r.tiling == iosim.Tiling(16, 50)
    assert r.traffic.reads == 2 * N * d + 5 * (2 * N * d + 2 * N)
    assert r.traffic.writes == 6 * (N * d + 2 * N)


def test_swapped_counts_by_hand():
    # N_q = 113, N_k = 239, d = 8, B_r = 40 → T_r = 3. Q read once (N_q·d), K and V
    # once per query block (2·T_r·N_k·d); O, ℓ, m written once (N_q·d + 2·N_q).
    n_q, n_k, d = 113, 239, 8
    Bc = min(40, d)
    M = 2 * 40 * d + 2 * Bc * d + 40 * Bc + 4 * 40
    r = iosim.count("flash-swapped", N=n_q, N_k=n_k, d=d, M=M)
    assert r.tiling == iosim.Tiling(40, 8)
    assert r.traffic.reads == n_q * d + 2 * 3 * n_k * d
    assert r.traffic.writes == n_q * d + 2 * n_q


def test_standard_counts_by_hand():
    # N = 113, d = 8, M = 1000: R = ⌊1000/115⌋ = 8 rows of S fit, so S is read once.
    # Steps: Q once, K and V once per query block (T_r·N·d each), S written and
    # read once (2·N²), P written and read once (2·N²), O written once (N·d).
    N, d = 113, 8
    r = iosim.count("standard", N=N, d=d, M=1000)
    Tr = -(-N // r.tiling.Br)
    assert r.traffic.reads == N * d + 2 * Tr * N * d + 2 * N * N
    assert r.traffic.writes == 2 * N * N + N * d


def test_standard_falls_back_to_two_pass_softmax_when_no_row_fits():
    N, d, M = 300, 4, 250  # a row of S (300 + 2) does not fit in 250
    r = iosim.count("standard", N=N, d=d, M=M)
    assert r.traffic.tensor("S").reads == 2 * N * N, "S must be read twice by the two-pass softmax"
    assert_matches_prediction("standard", r, N=N, d=d)


@settings(max_examples=100, deadline=None)
@given(N=st.integers(1, 20000), d=st.integers(1, 256), data=st.data())
def test_standard_writes_at_least_N_squared(N, d, data):
    # smallest working set: Q_i, K_j, S_ij of one row and column (2d + 1), or the
    # two-pass softmax's S_ij and four statistics (5)
    M = data.draw(st.integers(max(2 * d + 1, 5), 1_000_000))
    r = iosim.count("standard", N=N, d=d, M=M)
    assert r.traffic.writes >= N * N


# FlashAttention's bound (docs/derivations.md, "A bound that holds for every M"):
# traffic ≤ C·N²d²/M + C'·N·d for every M from the smallest working set up to N·d.
C_QUADRATIC, C_LINEAR = 154, 12


@settings(max_examples=300, deadline=None)
@given(N=st.integers(5, 100000), d=st.integers(1, 256), data=st.data())
def test_flash_traffic_within_the_paper_bound(N, d, data):
    smallest = iosim.ALGORITHMS["flash"].working_set(problem(N, N, d), iosim.Tiling(1, 1), 0)  # B_r = B_c = 1
    assume(N * d >= smallest)
    M = data.draw(st.integers(smallest, N * d))
    total = iosim.count("flash", N=N, d=d, M=M).traffic.total
    bound = C_QUADRATIC * N * N * d * d / M + C_LINEAR * N * d
    assert total <= bound, f"N={N} d={d} M={M}: {total} > {bound:.0f}"


@pytest.mark.parametrize("d", [64, 128])
def test_flash_traffic_falls_as_M_grows(d):
    totals = [iosim.count("flash", N=8192, d=d, M=M).traffic.total for M in (20_000, 50_000, 100_000, 400_000)]
    assert totals == sorted(totals, reverse=True) and totals[0] > 2 * totals[-1], totals


def test_causal_skip_by_hand():
    # N = 32, d = 8, blocks 8 × 8: T_r = T_c = 4. Causal (N_q = N_k) hides block (i, j)
    # exactly when j > i, leaving 4 + 3 + 2 + 1 = 10 of the 16 pairs.
    N, d, B, pairs = 32, 8, 8, 10
    flash = iosim.count("flash", N=N, d=d, M=2 * B * d + 2 * B * d + B * B + 6 * B, causal=True)
    assert flash.tiling == iosim.Tiling(B, B)
    # K, V read once; Q_i, O_i, ℓ_i, m_i read per visible pair; O, ℓ, m written per pair plus line 3
    assert flash.traffic.reads == 2 * N * d + pairs * (2 * B * d + 2 * B)
    assert flash.traffic.writes == pairs * (B * d + 2 * B) + N * d + 2 * N
    swapped = iosim.count("flash-swapped", N=N, d=d, M=2 * B * d + 2 * B * d + B * B + 4 * B, causal=True)
    assert swapped.tiling == iosim.Tiling(B, B)
    # Q read once, K_j and V_j once per visible pair, O, ℓ, m written once
    assert swapped.traffic.reads == N * d + pairs * 2 * B * d
    assert swapped.traffic.writes == N * d + 2 * N


@pytest.mark.parametrize("algorithm", ["flash", "flash-swapped"])
@pytest.mark.parametrize("n_q, n_k", [(4096, 4096), (1000, 3000), (3000, 1000)])
def test_causal_skip_moves_less_and_standard_does_not_skip(algorithm, n_q, n_k):
    full = iosim.count(algorithm, N=n_q, N_k=n_k, d=64, M="100k").traffic.total
    causal = iosim.count(algorithm, N=n_q, N_k=n_k, d=64, M="100k", causal=True).traffic.total
    assert causal < full, f"{algorithm} N_q={n_q} N_k={n_k}: causal {causal} >= full {full}"
    standard = [iosim.count("standard", N=n_q, N_k=n_k, d=64, M="100k", causal=c).traffic.total for c in (False, True)]
    assert standard[0] == standard[1], "Algorithm 0 materializes all of S and P, masked or not"
