"""The worked example of docs/architecture.md: an algorithm written outside iosim, registered and checked."""


import numpy as np
import pytest
from helpers import kv_resident_example, random_qkv, relative_error
from hypothesis import given, settings
from hypothesis import strategies as st

import iosim
from iosim.cli import build_parser, run


@pytest.fixture
def toy():
    algo = iosim.register(kv_resident_example())
    yield algo
    del iosim.ALGORITHMS[algo.name]


@settings(max_examples=15, deadline=None)
@given(n_q=st.sampled_from([1, 17, 113]), n_k=st.sampled_from([1, 64, 239]), d=st.sampled_from([3, 16]),
       causal=st.booleans(), dropout_p=st.sampled_from([0.0, 0.3]), spare=st.integers(0, 5000))
def test_example_is_exact_and_its_counts_are_predicted(n_q, n_k, d, causal, dropout_p, spare):
    algo = kv_resident_example()
    M = 2 * n_k * d + 2 * d + n_k + spare  # K, V and one query row's Q_i, S_i, O_i, and room to spare
    q, k, v = random_qkv(np.random.default_rng(n_q + n_k), 2, 1, n_q, n_k, d)
    opts = dict(causal=causal, dropout_p=dropout_p, seed=9)
    r = iosim.simulate(algo, q, k, v, M=M, **opts)
    assert relative_error(r.out, iosim.attention_ref(q, k, v, **opts).out) <= 1e-10
    counted = iosim.count(algo, N=n_q, N_k=n_k, d=d, M=M, batch=2, **opts)
    predicted = iosim.predict(algo, N=n_q, N_k=n_k, d=d, M=M, batch=2, causal=causal, dropout_p=dropout_p)
    assert counted.traffic == r.traffic == predicted.exact
    # Q, K, V read once and O written once, over 2 batch·heads
    assert counted.traffic.total == 2 * (2 * n_q * d + 2 * n_k * d)


def test_registered_example_runs_from_the_cli(toy):
    out = run(build_parser().parse_args(["run", "--algo", toy.name, "--N", "40", "--d", "8", "--M", "2000"]))
    assert out.result.algorithm == toy.name and out.max_rel_error < 1e-12
    rows = run(build_parser().parse_args(["sweep", "--algo", toy.name, "--N", "100", "--d", "8", "--M", "5k"])).rows
    assert rows[0].total == rows[0].predicted == 2 * 100 * 8 + 2 * 100 * 8


def test_example_refuses_an_explicit_mask():
    q, k, v = random_qkv(np.random.default_rng(0), 1, 1, 4, 4, 2)
    with pytest.raises(iosim.InputError, match="supports no explicit mask"):
        iosim.simulate(kv_resident_example(), q, k, v, M=1000, mask=np.ones((4, 4), dtype=bool))
