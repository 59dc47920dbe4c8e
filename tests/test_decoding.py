"""Decoding: grouped-query attention (kv_heads < heads) for every algorithm, and split-KV."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import iosim
from helpers import relative_error

TOL = 1e-10  # both sides compute in float64; only the order of summation differs
PER_HEAD = [name for name, a in iosim.ALGORITHMS.items() if not a.block_sparse and not a.packs_groups]


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
