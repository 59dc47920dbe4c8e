"""Every algorithm's numeric output equals float64 attention, on awkward shapes."""

import numpy as np
import pytest
from helpers import ALGORITHM_NAMES, random_qkv, relative_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import iosim

TOL = 1e-10  # both sides compute in float64; only the order of summation differs


@st.composite
def cases(draw):
    n_q = draw(st.sampled_from([1, 2, 17, 113, 239]))
    n_k = draw(st.sampled_from([1, 3, 64, 113, 239]))
    d = draw(st.sampled_from([1, 5, 16, 33]))
    d_v = draw(st.sampled_from([d, d, 1, 7, 24]))  # V's head size, apart from Q's and K's half the time (MLA)
    # M from a few blocks' worth up to everything on chip: blocks from 1 to N
    M = draw(st.integers(min_value=40 * max(d, d_v) + 200, max_value=20 * (n_q + n_k) * max(d, d_v) + 5000))
    return dict(
        n_q=n_q, n_k=n_k, d=d, d_v=d_v, M=M, batch=draw(st.integers(1, 2)), heads=draw(st.integers(1, 3)),
        causal=draw(st.booleans()), masked=draw(st.booleans()),
        scale=draw(st.sampled_from([None, 0.37, -1.5])),
        dropout_p=draw(st.sampled_from([0.0, 0.0, 0.25, 0.9])), seed=draw(st.integers(0, 2**64 - 1)),
    )


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=cases())
def test_output_matches_float64_reference(algorithm, c):
    rng = np.random.default_rng(c["seed"] % 2**32)
    q, k, v = random_qkv(rng, c["batch"], c["heads"], c["n_q"], c["n_k"], c["d"], c["d_v"])
    mask = rng.random((c["heads"], c["n_q"], c["n_k"])) > 0.3 if c["masked"] else None
    opts = dict(causal=c["causal"], mask=mask, scale=c["scale"], dropout_p=c["dropout_p"], seed=c["seed"])
    r = iosim.simulate(algorithm, q, k, v, M=c["M"], **opts)
    ref = iosim.attention_ref(q, k, v, **opts)
    assert r.out.shape == q.shape[:3] + (c["d_v"],)
    err = relative_error(r.out, ref.out)
    assert err <= TOL, f"{algorithm} {c} {r.tiling}: relative error {err:.3e} > {TOL}"
    if r.lse is not None:
        assert np.array_equal(np.isneginf(r.lse), np.isneginf(ref.lse)), "fully masked rows differ"
        finite = np.isfinite(ref.lse)
        lse_err = relative_error(r.lse[finite], ref.lse[finite]) if finite.any() else 0.0
        assert lse_err <= TOL, f"{algorithm} {c}: logsumexp error {lse_err:.3e}"


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
@pytest.mark.parametrize("n_q, n_k", [(1, 1), (113, 239), (239, 113), (1, 1023)])
def test_awkward_shapes_causal(algorithm, n_q, n_k):
    rng = np.random.default_rng(n_q * 1000 + n_k)
    q, k, v = random_qkv(rng, 1, 2, n_q, n_k, 7)
    r = iosim.simulate(algorithm, q, k, v, M=2000, causal=True)
    ref = iosim.attention_ref(q, k, v, causal=True)
    err = relative_error(r.out, ref.out)
    assert err <= TOL, f"{algorithm} N_q={n_q} N_k={n_k}: error {err:.3e}, blocks {r.tiling}"
    assert r.tiling.Br < n_q or r.tiling.Bc < n_k or n_q == n_k == 1, "the case should tile, not fit whole"


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
def test_fully_masked_rows_give_zero_output(algorithm):
    # N_q > N_k with causal: the first N_q − N_k query rows see no key (bottom-right alignment)
    rng = np.random.default_rng(7)
    q, k, v = random_qkv(rng, 1, 1, 40, 10, 8)
    r = iosim.simulate(algorithm, q, k, v, M=1000, causal=True)
    assert np.all(r.out[..., :30, :] == 0.0), "rows that see no key must be exactly 0"
    assert not np.isnan(r.out).any()
    if r.lse is not None:
        assert np.all(np.isneginf(r.lse[..., :30])) and np.all(np.isfinite(r.lse[..., 30:]))


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
def test_nan_propagates_only_to_rows_that_depend_on_it(algorithm):
    rng = np.random.default_rng(3)
    q, k, v = random_qkv(rng, 1, 1, 50, 50, 8)
    q[0, 0, 17, 3] = np.nan  # poisons query row 17 only
    r = iosim.simulate(algorithm, q, k, v, M=2000, allow_nonfinite=True)
    nan_rows = np.isnan(r.out[0, 0]).any(axis=-1)
    assert np.flatnonzero(nan_rows).tolist() == [17]
    ref = iosim.attention_ref(q, k, v, allow_nonfinite=True)
    assert np.array_equal(np.isnan(r.out), np.isnan(ref.out))
