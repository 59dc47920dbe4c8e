"""Arithmetic: the FLOPs and exponentials a run counts equal each algorithm's closed form."""

import numpy as np
import pytest
from helpers import ALGORITHM_NAMES, BACKWARD_NAMES, random_qkv
from hypothesis import given, reject, settings
from hypothesis import strategies as st

import iosim
from iosim.core.flops import Flops


@st.composite
def cases(draw):
    d = draw(st.integers(1, 256))
    d_v = draw(st.one_of(st.just(d), st.integers(1, 256)))  # V's head size, apart from Q's and K's (MLA)
    n_q = draw(st.integers(1, 70000))
    n_k = draw(st.one_of(st.just(n_q), st.integers(1, 70000)))
    return dict(N=n_q, N_k=n_k, d=d, d_v=d_v, M=draw(st.integers(4 * (d + d_v) + 10, 4_000_000)),
                batch=draw(st.integers(1, 4)),
                heads=draw(st.integers(1, 16)), causal=draw(st.booleans()), mask=draw(st.booleans()))


@pytest.mark.parametrize("algorithm, pass_", [(name, "fwd") for name in ALGORITHM_NAMES] +
                         [(name, "bwd") for name in BACKWARD_NAMES])
@settings(max_examples=150, deadline=None)
@given(c=cases())
def test_counted_flops_equal_the_closed_form(algorithm, pass_, c):
    try:
        r = iosim.count(algorithm, pass_=pass_, **c)
    except iosim.BlockSizeError:  # M below the smallest working set: covered elsewhere
        reject()
    assert r.flops == iosim.predict(algorithm, pass_=pass_, **c).flops, f"{algorithm} {pass_} {c} {r.tiling}"


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
def test_numeric_forward_counts_the_same_flops(algorithm):
    rng = np.random.default_rng(2)
    q, k, v = random_qkv(rng, 2, 1, 37, 29, 5)
    r = iosim.simulate(algorithm, q, k, v, M=1500, causal=True, dropout_p=0.2)
    shape = dict(N=37, N_k=29, d=5, M=1500, batch=2, causal=True, dropout_p=0.2, tiling=r.tiling)
    assert r.flops == iosim.count(algorithm, **shape).flops == iosim.predict(algorithm, **shape).flops


@pytest.mark.parametrize("algorithm", BACKWARD_NAMES)
def test_numeric_runs_count_the_same_flops(algorithm):
    rng = np.random.default_rng(1)
    q, k, v = random_qkv(rng, 2, 1, 113, 61, 5)
    g = iosim.gradients(algorithm, q, k, v, rng.standard_normal(q.shape), M=1500, causal=True)
    shape = dict(N=113, N_k=61, d=5, M=1500, batch=2, causal=True)
    forward = dict(shape, tiling=g.forward_tiling)
    assert g.forward_flops == iosim.count(algorithm, **forward).flops == iosim.predict(algorithm, **forward).flops
    assert g.flops == iosim.count(algorithm, pass_="bwd", **shape).flops


# N = 10, d = 4, no mask, blocks 4 × 3 for flash (T_c = 4 key blocks, so every query row
# meets 4 tiles: 40 row-tiles) and M large enough that standard's softmax holds whole rows.
HAND = [
    # forward: QKᵀ and PV, 2·N²·d each; one exp per element of S, plus flash's two
    # rescalings per row and tile (2·40)
    ("flash", "fwd", iosim.Tiling(4, 3), Flops(matmul=2 * (2 * 10 * 10 * 4), exp=10 * 10 + 2 * 40)),
    ("standard", "fwd", iosim.Tiling(4, 3), Flops(matmul=2 * (2 * 10 * 10 * 4), exp=10 * 10)),
    # backward: flash recomputes S (1 product) and does dV, dP, dQ, dK (4): 5·2·N²·d, and
    # recomputes P (N² exps); standard reads P back: 4·2·N²·d and no exp
    ("flash", "bwd", iosim.Tiling(4, 3), Flops(matmul=5 * (2 * 10 * 10 * 4), exp=10 * 10)),
    ("standard", "bwd", iosim.Tiling(4, 3), Flops(matmul=4 * (2 * 10 * 10 * 4))),
    # flash-swapped's backward adds one log per row for L = m + log ℓ
    ("flash-swapped", "bwd", iosim.Tiling(4, 3), Flops(matmul=5 * (2 * 10 * 10 * 4), exp=10 * 10 + 10)),
]


@pytest.mark.parametrize("algorithm, pass_, tiling, want", HAND)
def test_flops_by_hand(algorithm, pass_, tiling, want):
    r = iosim.count(algorithm, N=10, d=4, M=10**6, tiling=tiling, pass_=pass_)
    assert r.flops == want, f"{algorithm} {pass_}: {r.flops}, by hand {want}"


def test_recomputation_makes_flash_do_more_matmul_flops_than_standard():
    # a training step: standard 4 + 8 = 12·N²·d per head, flash 4 + 10 = 14·N²·d (S recomputed)
    shape = dict(N=1024, d=64, M="100k", batch=2, heads=3)
    step = {a: iosim.predict(a, **shape).flops.matmul + iosim.predict(a, pass_="bwd", **shape).flops.matmul
            for a in ("standard", "flash")}
    assert step["flash"] * 12 == step["standard"] * 14, step
