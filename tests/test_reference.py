"""The float64 reference against matrices and outputs written by hand.

Every fast path is held to ``iosim.attention_ref``, so the reference's own mask
semantics are pinned here to hand-written visibility matrices rather than to any
helper the simulator shares: causal attention is aligned bottom-right (query i sees
key j exactly when j ≤ i + N_k − N_q) and an explicit mask means True = attend.

Visibility is read off the output: with Q = 0 every score is 0, so a row spreads its
weight evenly over the keys it sees, and with V = I (d = N_k) output row i is that
weight vector itself: out[i, j] = 1/(keys row i sees) where j is visible, else 0.
"""

import math

import numpy as np
import pytest

import iosim
from iosim.core.rng import dropout_tile


def visibility(n_q, n_k, *, causal=False, mask=None, batch=1, heads=1):
    """(batch, heads, N_q, N_k) booleans: which keys each query row of attention_ref attends to."""
    q = np.zeros((batch, heads, n_q, n_k))
    k = np.zeros((batch, heads, n_k, n_k))
    v = np.broadcast_to(np.eye(n_k), (batch, heads, n_k, n_k))
    ref = iosim.attention_ref(q, k, v, causal=causal, mask=mask)
    seen = ref.out > 0
    counts = seen.sum(axis=-1)
    with np.errstate(divide="ignore"):
        want_lse = np.log(counts.astype(np.float64))  # all scores 0: lse = log(keys seen), −inf for none
    np.testing.assert_allclose(ref.out.sum(axis=-1), (counts > 0).astype(np.float64), rtol=0, atol=1e-15,
                               err_msg="a row that sees a key must put weight 1 on the keys it sees, else 0")
    np.testing.assert_allclose(ref.lse, want_lse, rtol=0, atol=1e-15)
    return seen


def matrix(rows):
    return np.array([[c == "1" for c in row] for row in rows.split()])


CAUSAL = [
    # N_q < N_k: offset N_k − N_q = 2, so row 0 already sees keys 0, 1, 2
    (3, 5, """
        11100
        11110
        11111"""),
    # N_q > N_k: offset −2, rows 0 and 1 see no key at all; row 2 sees key 0
    (5, 3, """
        000
        000
        100
        110
        111"""),
    # N_q = N_k: the lower triangle, diagonal included (≤, not <)
    (4, 4, """
        1000
        1100
        1110
        1111"""),
    # decoding: one query, the last, sees every key
    (1, 4, """
        1111"""),
    # one key: only the last query sees it
    (4, 1, """
        0
        0
        0
        1"""),
]


@pytest.mark.parametrize("n_q, n_k, expected", CAUSAL, ids=[f"Nq{c[0]}-Nk{c[1]}" for c in CAUSAL])
def test_causal_visibility_is_bottom_right_aligned(n_q, n_k, expected):
    want = matrix(expected)
    seen = visibility(n_q, n_k, causal=True)[0, 0]
    assert np.array_equal(seen, want), f"N_q={n_q} N_k={n_k}: attends\n{seen.astype(int)}\nexpected\n{want.astype(int)}"


def test_no_mask_sees_everything():
    seen = visibility(3, 5)
    assert seen.all(), f"without a mask every key is visible; got\n{seen[0, 0].astype(int)}"


def test_explicit_mask_true_means_attend_and_broadcasts():
    # a (N_q, N_k) mask broadcasts over batch and heads
    mask = matrix("""
        10110
        01001
        11111""")
    seen = visibility(3, 5, mask=mask, batch=2, heads=3)
    assert np.array_equal(seen, np.broadcast_to(mask, (2, 3, 3, 5))), f"got\n{seen[0, 0].astype(int)}"
    # a (N_k,) mask hides the same keys from every row
    seen = visibility(3, 5, mask=np.array([True, False, True, False, False]))
    assert np.array_equal(seen[0, 0], matrix("10100 10100 10100")), f"got\n{seen[0, 0].astype(int)}"


def test_mask_per_head_and_causal_combine_by_and():
    # heads = 2, mask (heads, N_q, N_k); causal with N_q = 5 > N_k = 3 hides rows 0, 1 entirely
    mask = np.stack([matrix("111 111 011 101 110"), matrix("000 111 111 111 111")])
    seen = visibility(5, 3, causal=True, mask=mask, heads=2)
    want = np.stack([matrix("000 000 000 100 110"), matrix("000 000 100 110 111")])
    assert np.array_equal(seen[0], want), f"got\n{seen[0].astype(int)}\nexpected\n{want.astype(int)}"


def test_two_keys_by_hand():
    # d = 1, so tau = 1/√1 = 1. Scores s = q·k = (0, ln 3); softmax = (1/4, 3/4);
    # O = 2·1/4 + 6·3/4 = 5; lse = ln(e⁰ + e^{ln 3}) = ln 4
    q = np.array([1.0]).reshape(1, 1, 1, 1)
    k = np.array([0.0, math.log(3.0)]).reshape(1, 1, 2, 1)
    v = np.array([2.0, 6.0]).reshape(1, 1, 2, 1)
    ref = iosim.attention_ref(q, k, v)
    assert math.isclose(ref.out.item(), 5.0, rel_tol=1e-15), f"O = {ref.out.item()}, expected 5"
    assert math.isclose(ref.lse.item(), math.log(4.0), rel_tol=1e-15), f"lse = {ref.lse.item()}, expected ln 4"


def test_default_scale_by_hand():
    # d = 4, so tau = 1/√4 = 1/2. q = (2, 0, 0, 0), k_0 = 0, k_1 = (ln 9, 0, 0, 0):
    # s = (0, ½·2·ln 9) = (0, ln 9); softmax = (1/10, 9/10); O = 10·1/10 + 20·9/10 = 19 in every
    # column; lse = ln 10
    q = np.array([2.0, 0, 0, 0]).reshape(1, 1, 1, 4)
    k = np.array([[0.0, 0, 0, 0], [math.log(9.0), 0, 0, 0]]).reshape(1, 1, 2, 4)
    v = np.array([[10.0] * 4, [20.0] * 4]).reshape(1, 1, 2, 4)
    ref = iosim.attention_ref(q, k, v)
    np.testing.assert_allclose(ref.out, np.full((1, 1, 1, 4), 19.0), rtol=1e-14, atol=0)
    assert math.isclose(ref.lse.item(), math.log(10.0), rel_tol=1e-15), f"lse = {ref.lse.item()}, expected ln 10"


def test_causal_outputs_by_hand():
    # N_q = N_k = 2, d = 1, q = (1, 1), k = (0, ln 3), v = (2, 6):
    # row 0 sees key 0 only: O = 2, lse = 0; row 1 sees both: O = 5, lse = ln 4 (as above)
    q = np.ones((1, 1, 2, 1))
    k = np.array([0.0, math.log(3.0)]).reshape(1, 1, 2, 1)
    v = np.array([2.0, 6.0]).reshape(1, 1, 2, 1)
    ref = iosim.attention_ref(q, k, v, causal=True)
    np.testing.assert_allclose(ref.out[0, 0, :, 0], [2.0, 5.0], rtol=1e-15, atol=0)
    np.testing.assert_allclose(ref.lse[0, 0], [0.0, math.log(4.0)], rtol=1e-15, atol=0)
    # N_q = 2 > N_k = 1: row 0 sees no key (O = 0, lse = −inf, no NaN); row 1 sees key 0: O = v_0 = 2
    ref = iosim.attention_ref(q, k[:, :, :1], v[:, :, :1], causal=True)
    assert ref.out[0, 0, :, 0].tolist() == [0.0, 2.0], f"O = {ref.out[0, 0, :, 0].tolist()}, expected [0, 2]"
    assert ref.lse[0, 0, 0] == -np.inf and ref.lse[0, 0, 1] == 0.0, f"lse = {ref.lse[0, 0].tolist()}"


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5, 6, 7])
def test_dropout_by_hand(seed):
    # The two-key case above with p = 1/2: each kept probability is scaled by 1/(1 − p) = 2, so
    # O = 2·(z_0·1/4·2 + z_1·3/4·6) = z_0 + 9·z_1 with z the keep decisions of iosim.core.rng
    q = np.array([1.0]).reshape(1, 1, 1, 1)
    k = np.array([0.0, math.log(3.0)]).reshape(1, 1, 2, 1)
    v = np.array([2.0, 6.0]).reshape(1, 1, 2, 1)
    z = dropout_tile(seed, 0.5, 1, slice(0, 1), slice(0, 2)).reshape(2)
    want = 1.0 * z[0] + 9.0 * z[1]
    out = iosim.attention_ref(q, k, v, dropout_p=0.5, seed=seed).out.item()
    assert math.isclose(out, want, rel_tol=1e-15, abs_tol=1e-15), f"seed {seed}: O = {out}, keep {z}, expected {want}"


@pytest.mark.parametrize("first_batch", [-1, 1.5, "2", True])
def test_first_batch_is_a_whole_number(first_batch):
    q = np.ones((1, 1, 2, 3))
    with pytest.raises(iosim.InputError, match="first_batch=.* must be an integer >= 0"):
        iosim.attention_ref(q, q, q, dropout_p=0.5, first_batch=first_batch)
