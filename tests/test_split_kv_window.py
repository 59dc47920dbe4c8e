"""split-kv (Flash-Decoding) with a sliding window: each query block's splits are dealt over the key blocks its band
meets, so K/V outside the window are never read."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import iosim
from iosim.algorithms.split_kv import deal
from iosim.gpu.grids import split_kv as split_kv_grids
from iosim.gpu.kernel import Launch
from iosim.gpu.kernels import KERNELS

D = 8
# (N_q, heads, kv_heads): decoding, a few speculative tokens, packed GQA groups of 1, 2 and 4, MQA
GROUPS = [(1, 4, 1), (2, 2, 2), (3, 4, 2), (4, 4, 1)]
N_KS = [1, 113, 239, 5000]
WINDOWS = [(0, 0), (1, 0), (100, 0), (6000, 6000), (3, -1), (-1, 2)]  # 0, 1, 100, > N_k, one-sided both ways


def qkv(n_q, n_k, heads, kv_heads, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((1, heads, n_q, D)), rng.standard_normal((1, kv_heads, n_k, D)),
            rng.standard_normal((1, kv_heads, n_k, D)))


def by_tensor(counts) -> dict[str, tuple[int, int]]:
    return {t.name: (t.reads, t.writes) for t in counts.tensors if t.reads or t.writes}


@pytest.mark.parametrize("n_q, heads, kv_heads", GROUPS)
@pytest.mark.parametrize("n_k", N_KS)
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("splits, tiling", [(1, None), (3, None), (None, None), (3, iosim.Tiling(3, 8))])
def test_windowed_split_kv_matches_the_reference_and_its_closed_form(n_q, heads, kv_heads, n_k, window, splits,
                                                                     tiling):
    q, k, v = qkv(n_q, n_k, heads, kv_heads)
    shape = dict(N=n_q, N_k=n_k, d=D, heads=heads, kv_heads=kv_heads, M="4k", window=window, tiling=tiling)
    try:
        counted = iosim.count("split-kv", splits=splits, **shape)
    except iosim.InputError as e:  # more splits than the keys (or key blocks) a query block sees
        assert "splits=3 for split-kv" in str(e) and splits == 3, str(e)
        return
    r = iosim.simulate("split-kv", q, k, v, M="4k", window=window, splits=splits, tiling=tiling)
    ref = iosim.attention_ref(q, k, v, window=window)
    assert np.abs(r.out - ref.out).max() < 1e-12, f"{r.tiling}: {np.abs(r.out - ref.out).max():.3e}"
    assert np.array_equal(np.isneginf(r.lse), np.isneginf(ref.lse)), "rows that see no key differ"
    seen = np.isfinite(ref.lse)
    assert np.abs(r.lse[seen] - ref.lse[seen]).max(initial=0.0) < 1e-12
    predicted = iosim.predict("split-kv", splits=splits, **shape)
    assert r.tiling == counted.tiling == predicted.tiling
    assert r.traffic == counted.traffic == predicted.exact, f"{r.tiling}"
    assert r.flops == counted.flops == predicted.flops


def test_keys_outside_the_window_are_never_read():
    # Decoding, N_k = 5000, window (100, 0): the one query sees keys 4899 … 4999. With B_c = 64 those lie in key blocks
    # 76 (4864 … 4927), 77 and 78 (4992 … 4999, the ragged 8): 64 + 64 + 8 = 136 keys per K/V head, against 5000
    # unwindowed. G = 4 query heads share each of the 2 K/V heads: one packed query block of 4 rows.
    shape = dict(N=1, N_k=5000, d=D, heads=8, kv_heads=2, M="4k", tiling=iosim.Tiling(4, 64), window=(100, 0))
    t = iosim.count("split-kv", splits=2, **shape).traffic
    assert by_tensor(t)["K"] == (2 * 136 * D, 0) and by_tensor(t)["V"] == (2 * 136 * D, 0), by_tensor(t)
    # split 0 takes blocks 76, 77 and split 1 block 78; each loads the 4-row query block and writes its partial
    assert [deal(range(76, 79), 2, s) for s in (0, 1)] == [range(76, 78), range(78, 79)]
    assert by_tensor(t)["Q"] == (2 * 2 * 4 * D, 0) and by_tensor(t)["O_split"] == (2 * 2 * 4 * D, 2 * 2 * 4 * D)
    # a paged cache of 32-token pages reads the entries of those blocks' pages only: 2 + 2 + 1 per K/V head
    paged = iosim.count("split-kv", splits=2, page_size=32, **shape).traffic
    assert by_tensor(paged)["block_table"] == (2 * 5, 0), by_tensor(paged)


def test_a_split_left_without_a_block_writes_an_empty_partial():
    # N_q = 4, N_k = 10, window (8, 0), B_r = B_c = 1: query r sees keys max(0, r − 2) … r + 6, so its run is 7, 8, 9,
    # 9 blocks; dealt to S = 9 splits, query 0 leaves two splits empty and query 1 one. Every split still loads Q_i
    # and writes its partial (O_s = 0, lse_s = −inf, as flash-attn's split kernel with n_block_min ≥ n_block_max),
    # and the combine reads all S: Q, O_split and lse_split count S·N_q rows; K, V the 33 keys of the runs.
    q, k, v = qkv(4, 10, 1, 1, seed=3)
    shape = dict(N=4, N_k=10, d=D, M="4k", window=(8, 0), tiling=iosim.Tiling(1, 1))
    r = iosim.simulate("split-kv", q, k, v, M="4k", window=(8, 0), splits=9, tiling=iosim.Tiling(1, 1))
    assert np.abs(r.out - iosim.attention_ref(q, k, v, window=(8, 0)).out).max() < 1e-12
    t = by_tensor(r.traffic)
    assert t["K"] == (33 * D, 0) and t["Q"] == (9 * 4 * D, 0), t
    assert t["O_split"] == (9 * 4 * D, 9 * 4 * D) and t["lse_split"] == (9 * 4, 9 * 4), t
    assert r.traffic == iosim.predict("split-kv", splits=9, **shape).exact


@settings(max_examples=60, deadline=None)
@given(n_q=st.integers(1, 4), n_k=st.integers(1, 400), group=st.sampled_from([(4, 1), (4, 2), (2, 2), (1, 1)]),
       extra=st.integers(0, 50), splits=st.sampled_from([None, 1, 2, 5]), Br=st.sampled_from([None, 1, 3, 16]))
def test_a_window_as_wide_as_the_sequences_moves_nothing(n_q, n_k, group, extra, splits, Br):
    # both sides past every key: the band hides nothing, so the counts are today's unwindowed ones
    wide = max(n_q, n_k) + extra
    shape = dict(N=n_q, N_k=n_k, d=D, heads=group[0], kv_heads=group[1], M="4k", splits=splits,
                 tiling=None if Br is None else iosim.Tiling(Br, 7))
    try:
        plain = iosim.count("split-kv", **shape)
    except iosim.InputError:  # more splits than key blocks, with or without the window
        with pytest.raises(iosim.InputError):
            iosim.count("split-kv", window=(wide, wide), **shape)
        return
    windowed = iosim.count("split-kv", window=(wide, wide), **shape)
    assert windowed.tiling == plain.tiling and windowed.traffic == plain.traffic and windowed.flops == plain.flops
    if n_q == 1:  # one query sees every key with causal's right side too: (wide, 0) is causal decoding
        causal = iosim.count("split-kv", causal=True, **shape)
        assert iosim.count("split-kv", window=(wide, 0), causal=True, **shape).traffic == causal.traffic


@settings(max_examples=60, deadline=None)
@given(n_q=st.integers(1, 300), n_k=st.integers(1, 300), left=st.integers(-1, 80), right=st.integers(-1, 80),
       causal=st.booleans(), Br=st.integers(1, 40), Bc=st.integers(1, 40), heads=st.integers(1, 3))
def test_one_split_is_flash_swapped_on_an_unpacked_windowed_problem(n_q, n_k, left, right, causal, Br, Bc, heads):
    # kv_heads = heads (G = 1: the packed problem is the problem) and a window: S = 1 reads Q once, the K/V blocks
    # each query block's band meets, and writes O, ℓ, m once, as flash-swapped does with the same blocks. A window
    # that with causal leaves the causal band (−1, 0), or none, is no window proper: split-kv then deals every key
    # block, as it does without one (iosim.algorithms.split_kv), where flash-swapped skips those causal hides
    shape = dict(N=n_q, N_k=n_k, d=D, heads=heads, M="20k", window=(left, right), causal=causal,
                 tiling=iosim.Tiling(Br, Bc))
    split = iosim.count("split-kv", splits=1, **shape)
    swapped = iosim.count("flash-swapped", **shape)
    assume(swapped.problem.band.sliding)
    assert by_tensor(split.traffic) == by_tensor(swapped.traffic)
    assert split.traffic.peak_sram == swapped.traffic.peak_sram and split.flops == swapped.flops


def test_default_splits_and_their_range_follow_the_window():
    # decoding, 8 K/V heads: 132 SMs want ⌈132/8⌉ = 17 splits; a window of 256 keys has only 2 blocks of min(B_c, d)
    shape = dict(N=1, N_k=32768, d=128, heads=32, kv_heads=8, M="192KiB")
    assert iosim.count("split-kv", **shape).tiling.splits == 17
    assert iosim.count("split-kv", window=(4095, 0), **shape).tiling.splits == 17
    assert iosim.count("split-kv", window=(255, 0), **shape).tiling.splits == 2
    assert iosim.count("split-kv", window=(255, 0), splits=256, **shape).tiling.Bc == 1  # one key a split
    with pytest.raises(iosim.InputError, match=r"splits=257 for split-kv at N_k=32768; allowed: 1 to 256 \(the keys"):
        iosim.count("split-kv", window=(255, 0), splits=257, **shape)
    with pytest.raises(iosim.InputError, match=r"allowed: 1 to 4 \(the number of K/V blocks of B_c=64 in the 256"):
        iosim.count("split-kv", window=(255, 0), splits=5, tiling=iosim.Tiling(4, 64), **shape)


@pytest.mark.parametrize("n_q, heads, kv_heads, Br", [(1, 32, 8, None), (4, 32, 8, None), (10**9, 8, 2, 64),
                                                      (10**9, 8, 8, 64)])
def test_windowed_counts_take_constant_time_in_N(n_q, heads, kv_heads, Br):
    start = time.perf_counter()
    options = dict(N=n_q, N_k=10**9 + 7, d=128, M="100k", window=(4095, 0), causal=True, heads=heads,
                   kv_heads=kv_heads, tiling=None if Br is None else iosim.Tiling(Br, 64))
    c = iosim.count("split-kv", **options)
    assert c.traffic == iosim.predict("split-kv", **options).exact
    assert time.perf_counter() - start < 2.0, f"N_q = {n_q} took {time.perf_counter() - start:.2f} s"


@pytest.mark.parametrize("n_q, heads, kv_heads, window, S", itertools.product(
    [1, 3], [4], [1, 4], [(20, 0), (30, 3)], [1, 3]))
def test_the_gpu_grid_deals_the_same_blocks(n_q, heads, kv_heads, window, S):
    # the split kernel's K loads, step by step, are the K blocks the count reads (its grid, iosim.gpu.grids.split_kv;
    # the kernel description itself refuses windows, iosim.gpu.kernel.check_launchable)
    algo = iosim.ALGORITHMS["split-kv"]
    shape = dict(N=n_q, N_k=113, d=D, heads=heads, kv_heads=kv_heads, M="4k", window=window, splits=S,
                 tiling=iosim.Tiling(2, 8), dtype="float32")
    plan = iosim.count("split-kv", **shape)
    pb = algo.run_problem(plan.problem)
    g = split_kv_grids.split(pb, plan.tiling, split_kv_grids.split_smem(pb, plan.tiling))
    k_id = g.tiles.tensors.index("K")
    loads = sum(s for b in range(g.blocks) for step in g.steps(b) for tile, s, _ in step
                if tile % len(g.tiles.tensors) == k_id)
    assert loads == by_tensor(plan.traffic)["K"][0] * 4  # float32 K rows of d = 8: whole 32-byte sectors
    with pytest.raises(iosim.InputError, match="sliding window"):
        KERNELS["split-kv"].grids(Launch(pb, plan.tiling))
