"""`small-cache` (Saha and Ye's N²d/√M algorithm) in its own regime, M < d², and where it stops paying."""

import numpy as np
import pytest
from helpers import random_qkv, relative_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import iosim
from iosim.core.problem import AttentionShape, Problem
from iosim.registry import ALGORITHMS
from iosim.reports.optimize import ranked

TOL = 1e-10  # float64 on both sides; only the order of summation differs


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n_q=st.sampled_from([1, 113, 239]), n_k=st.sampled_from([1, 17, 113]), d=st.sampled_from([7, 20]),
       fraction=st.floats(0, 1), policy=st.sampled_from(["fit", "optimal"]), causal=st.booleans(),
       masked=st.booleans(), dropout_p=st.sampled_from([0.0, 0.3]), seed=st.integers(0, 2**32 - 1))
def test_exact_below_d_squared_and_counts_equal_closed_form(n_q, n_k, d, fraction, policy, causal, masked, dropout_p,
                                                            seed):
    # M from d²/4 to d²: tiles of a few rows, the numeric run streams d and N_k one column at a time
    M = d * d // 4 + int(fraction * (d * d - d * d // 4))
    rng = np.random.default_rng(seed)
    q, k, v = random_qkv(rng, 2, 1, n_q, n_k, d)
    mask = rng.random((n_q, n_k)) > 0.3 if masked else None
    opts = dict(causal=causal, dropout_p=dropout_p, seed=seed)
    r = iosim.simulate("small-cache", q, k, v, M=M, mask=mask, block_policy=policy, **opts)
    ref = iosim.attention_ref(q, k, v, mask=mask, **opts)
    assert relative_error(r.out, ref.out) <= TOL, (r.tiling, M)
    shape = dict(N=n_q, N_k=n_k, d=d, M=M, batch=2, mask=masked, block_policy=policy, causal=causal,
                 dropout_p=dropout_p)
    counted, predicted = iosim.count("small-cache", **shape, seed=seed), iosim.predict("small-cache", **shape)
    assert r.traffic == counted.traffic == predicted.exact, (r.tiling, M)
    assert r.traffic.peak_sram <= M


def best_traffic(algorithm: str, M: int, N: int = 4096, d: int = 64) -> int:
    return ranked(ALGORITHMS[algorithm], Problem(AttentionShape(1, 1, N, N, d), tau=1.0), M)[0].traffic


@pytest.mark.parametrize("M, wins", [(263, True), (527, True), (1000, True), (2048, False), (4096, False),
                                     (16_384, False)])
def test_beats_both_flash_loops_only_well_below_d_squared(M, wins):
    # N = 4096, d = 64 (d² = 4096), every algorithm at its optimal blocks (exact counts):
    # small-cache 12.72·N² at M = 1000 against the swapped loop's 21.38·N², but 10.30·N²
    # against 9.19·N² at M = 2048
    small = best_traffic("small-cache", M)
    flash = min(best_traffic("flash", M), best_traffic("flash-swapped", M))
    assert (small < flash) == wins, f"M={M}: small-cache {small}, best flash loop {flash}"


def test_runs_where_no_flash_loop_fits():
    # M = 100 < 4d + 5: neither FlashAttention loop fits one row of Q, K, V, O at d = 64
    r = iosim.count("small-cache", N=4096, d=64, M=100, block_policy="optimal")
    assert r.traffic == iosim.predict("small-cache", N=4096, d=64, M=100, block_policy="optimal").exact
    for algorithm in ("flash", "flash-swapped"):
        with pytest.raises(iosim.BlockSizeError):
            iosim.count(algorithm, N=4096, d=64, M=100)


@pytest.mark.parametrize("M", [100, 400, 1600])
def test_traffic_is_order_N2d_over_root_M(M):
    # B_r ≈ B_c ≈ √M: Q, K, V move about 3·N²d/√M and P T_d = ⌈d/B_c⌉ times N², S and P 4·N²;
    # below d² that is at most a small constant times N²d/√M
    N, d = 4096, 64
    traffic = best_traffic("small-cache", M, N, d)
    assert traffic <= 7 * N * N * d / M**0.5, traffic / (N * N * d / M**0.5)
