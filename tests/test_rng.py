"""The Philox generator and the dropout masks it defines."""

import numpy as np
import pytest
from helpers import ALGORITHM_NAMES, M_for_block, random_qkv
from hypothesis import given, settings
from hypothesis import strategies as st

import iosim
from iosim.core.rng import dropout_keep, dropout_tile, keep_threshold, philox4x32


@pytest.mark.parametrize("counter, key, expected", [
    # Known-answer vectors of Philox4x32-10 from Random123's kat_vectors
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_philox_known_answers(counter, key, expected):
    assert tuple(int(w) for w in philox4x32(counter, key)) == expected


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**64 - 1), p=st.floats(0.01, 0.99), bh=st.integers(1, 3),
       n_q=st.integers(1, 70), n_k=st.integers(1, 70), Br=st.integers(1, 70), Bc=st.integers(1, 70))
def test_mask_assembled_from_any_tiling_equals_the_whole(seed, p, bh, n_q, n_k, Br, Bc):
    whole = dropout_tile(seed, p, bh, slice(0, n_q), slice(0, n_k))
    tiled = np.empty_like(whole)
    for i0 in range(0, n_q, Br):
        for j0 in range(0, n_k, Bc):
            rows, cols = slice(i0, min(n_q, i0 + Br)), slice(j0, min(n_k, j0 + Bc))
            tiled[:, rows, cols] = dropout_tile(seed, p, bh, rows, cols)
    assert np.array_equal(whole, tiled)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_matches_one_minus_p(p):
    n = 400_000
    keep = dropout_keep(1234, p, 0, np.arange(n) // 1000, np.arange(n) % 1000)
    sigma = np.sqrt(p * (1 - p) / n)
    assert abs(keep.mean() - (1 - p)) < 5 * sigma, f"keep rate {keep.mean():.5f}, expected {1 - p}"


def test_threshold_edges():
    assert keep_threshold(0.0) == 0
    assert keep_threshold(0.5) == 2**31
    with pytest.raises(ValueError, match="dropout_p"):
        keep_threshold(1.0)


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
def test_dropout_output_independent_of_block_sizes(algorithm):
    rng = np.random.default_rng(0)
    q, k, v = random_qkv(rng, 1, 2, 113, 97, 8)
    outs = [iosim.simulate(algorithm, q, k, v, M=M_for_block(algorithm, 113, 97, 8, B), dropout_p=0.3, seed=99).out
            for B in (5, 32, 113)]
    assert np.max(np.abs(outs[0] - outs[1])) < 1e-12 and np.max(np.abs(outs[0] - outs[2])) < 1e-12
    no_dropout = iosim.simulate(algorithm, q, k, v, M=M_for_block(algorithm, 113, 97, 8, 32)).out
    assert np.max(np.abs(outs[0] - no_dropout)) > 1e-3, "dropout had no effect"
