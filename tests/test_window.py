"""Sliding-window attention (issue 18, item 1): the band's visited tiles, exactness, closed forms, refusals.

A window (left, right) is flash-attn's ``window_size``: query r sees key c exactly when
r + off − left ≤ c ≤ r + off + right, off = N_k − N_q, −1 unbounded; causal is (−1, 0).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import iosim
from experiments import window
from iosim.api import count_problem
from iosim.core.counts import combined
from iosim.core.problem import Band
from iosim.core.visits import visits
from iosim.registry import ALGORITHMS

WINDOWED = [name for name, a in ALGORITHMS.items() if a.accepts("window")]
WINDOWED_BACKWARD = [name for name in WINDOWED if ALGORITHMS[name].backward is not None]  # split-kv decodes only
SKIPPING = ["flash", "flash-swapped", "block-sparse", "block-sparse-skip"]  # skip the tiles outside the band
SHAPES = [(1, 1), (113, 113), (239, 100), (100, 239), (1, 239)]  # (N_q, N_k)
WINDOWS = [(0, 0), (1, 0), (0, 1), (3, -1), (-1, 2), (17, 5), (500, 500), (-1, 0)]  # 0, 1, one-sided, > N


def inputs(n_q, n_k, d=12, heads=2, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((1, heads, n, d)) for n in (n_q, n_k, n_k))
    return q, k, v, rng.standard_normal(q.shape)


def brute_tiles(pb, Br, Bc) -> set[tuple[int, int]]:
    """The tiles that hold a visible (query, key) pair, from the band's whole N_q × N_k mask."""
    n_q, n_k = pb.shape.n_q, pb.shape.n_k
    keep = pb.band.keep(n_q, n_k, slice(0, n_q), slice(0, n_k))
    return {(i, j) for i in range(-(-n_q // Br)) for j in range(-(-n_k // Bc))
            if keep[i * Br:(i + 1) * Br, j * Bc:(j + 1) * Bc].any()}


sides = st.one_of(st.just(-1), st.integers(0, 4), st.integers(0, 90))


@settings(max_examples=300, deadline=None)
@given(n_q=st.integers(1, 70), n_k=st.integers(1, 70), Br=st.integers(1, 16), Bc=st.integers(1, 16),
       left=sides, right=sides, causal=st.booleans())
def test_visited_tiles_are_the_band_and_the_closed_form_counts_them(n_q, n_k, Br, Bc, left, right, causal):
    pb = count_problem(n_q, 8, n_k, causal=causal, window=(left, right))
    tiles = visits(pb, iosim.Tiling(min(Br, n_q), min(Bc, n_k)), skips_hidden=True)
    want = brute_tiles(pb, tiles.q.B, tiles.k.B)
    by_query = {(i, j) for i in tiles.query_blocks() for j in tiles.keys_seen_by(i)}
    by_key = {(i, j) for j in tiles.key_blocks() for i in tiles.queries_seeing(j)}
    assert by_query == want == by_key, (n_q, n_k, left, right, causal)
    sizes: dict[tuple[int, int], int] = {}
    for i, j in want:
        b = (tiles.q.size(i), tiles.k.size(j))
        sizes[b] = sizes.get(b, 0) + 1
    assert {(b_i, b_j): n for b_i, b_j, n in tiles.pairs()} == sizes
    assert set(tiles.key_blocks()) | set(tiles.blind_key_blocks()) == set(range(tiles.k.T))
    assert not set(tiles.key_blocks()) & set(tiles.blind_key_blocks())


@pytest.mark.parametrize("algo", WINDOWED)
@pytest.mark.parametrize("n_q, n_k", SHAPES)
@pytest.mark.parametrize("window", WINDOWS)
def test_forward_matches_the_reference_and_its_closed_form(algo, n_q, n_k, window):
    q, k, v, _ = inputs(n_q, n_k)
    r = iosim.simulate(algo, q, k, v, M="2k", window=window)
    ref = iosim.attention_ref(q, k, v, window=window)
    err = np.abs(r.out - ref.out).max()
    assert err < 1e-12, f"{algo} {n_q}x{n_k} window {window}: max error {err:.3g}"
    options = dict(N=n_q, N_k=n_k, d=12, heads=2, M="2k", window=window)
    c, p = iosim.count(algo, **options), iosim.predict(algo, **options)
    assert c.traffic == r.traffic == p.exact, (c.traffic, r.traffic, p.exact)
    assert c.flops == r.flops == p.flops


@pytest.mark.parametrize("algo", WINDOWED_BACKWARD)
@pytest.mark.parametrize("n_q, n_k", SHAPES)
@pytest.mark.parametrize("window, causal, dropout_p", [((0, 0), False, 0.0), ((1, 0), False, 0.1),
                                                       ((3, -1), False, 0.0), ((17, 5), True, 0.1),
                                                       ((500, 500), False, 0.0), ((-1, 2), False, 0.0)])
def test_backward_matches_the_reference_and_its_closed_form(algo, n_q, n_k, window, causal, dropout_p):
    q, k, v, do = inputs(n_q, n_k, seed=1)
    options = dict(window=window, causal=causal, dropout_p=dropout_p, seed=5)
    g = iosim.gradients(algo, q, k, v, do, M="4k", **options)
    ref = iosim.attention_backward_ref(q, k, v, do, **options)
    for name, x, want in zip(("dq", "dk", "dv"), (g.dq, g.dk, g.dv), ref):
        err = np.abs(x - want).max()
        assert err < 1e-12, f"{algo} {n_q}x{n_k} window {window}: {name} max error {err:.3g}"
    shape = dict(N=n_q, N_k=n_k, d=12, heads=2, M="4k", pass_="fwd+bwd", window=window, causal=causal,
                 dropout_p=dropout_p)
    c, p = iosim.count(algo, **shape), iosim.predict(algo, **shape)
    assert c.traffic == p.exact == combined(g.forward_traffic, g.traffic)


def reads_writes(counts: iosim.Counts) -> dict[str, tuple[int, int]]:
    return {t.name: (t.reads, t.writes) for t in counts.tensors if t.reads or t.writes}


def test_flash_and_flash_swapped_by_hand_on_a_window_of_two():
    # N = 8, d = 2, B_r = B_c = 2, window (2, 0): row r sees keys r−2 … r. Query block i (rows 2i, 2i+1)
    # sees keys 2i−2 … 2i+1, key blocks i−1 and i: block 0 meets 1, blocks 1-3 meet 2, so 7 tiles of 2 × 2.
    options = dict(N=8, d=2, M="1k", tiling=iosim.Tiling(2, 2), window=(2, 0))
    swapped = iosim.count("flash-swapped", **options).traffic
    # Q read once (8·2), K_j and V_j once per tile (7·2·2), O written once (8·2), ℓ and m once (8)
    assert reads_writes(swapped) == {"Q": (16, 0), "K": (28, 0), "V": (28, 0), "O": (0, 16), "l": (0, 8),
                                     "m": (0, 8)}
    flash = iosim.count("flash", **options).traffic
    # K, V read once (8·2); per tile Q_i, O_i read (7·2·2) and O_i written, ℓ_i, m_i read and written (7·2);
    # line 3 writes zeros to O (8·2), ℓ and m (8)
    assert reads_writes(flash) == {"Q": (28, 0), "K": (16, 0), "V": (16, 0), "O": (28, 28 + 16),
                                   "l": (14, 14 + 8), "m": (14, 14 + 8)}


def test_key_blocks_no_query_sees_are_neither_loaded_nor_left_without_gradients():
    # N_q = 2, N_k = 8, d = 2, B_r = B_c = 2, window (1, 0): off = 6, row 0 sees keys 5-6, row 1 keys 6-7, so
    # query block 0 meets key blocks 2 and 3 (2 tiles); key blocks 0 and 1 are seen by no query.
    options = dict(N=2, N_k=8, d=2, M="1k", tiling=iosim.Tiling(2, 2), window=(1, 0))
    flash = iosim.count("flash", **options).traffic
    # K_j, V_j of blocks 2, 3 only (4·2); per tile Q_0, O_0 (2·2), ℓ_0, m_0 (2); line 3's zeros (2·2, 2)
    assert reads_writes(flash) == {"Q": (8, 0), "K": (8, 0), "V": (8, 0), "O": (8, 8 + 4), "l": (4, 4 + 2),
                                   "m": (4, 4 + 2)}
    backward = iosim.count("flash-swapped", pass_="bwd", **options).traffic
    # K, V of blocks 2, 3 read once (4·2); dK, dV written whole (8·2): line 24 for blocks 2, 3, zeros for 0, 1
    assert backward.tensor("K").reads == backward.tensor("V").reads == 8
    assert backward.tensor("dK").writes == backward.tensor("dV").writes == 16
    q, k, v, do = inputs(2, 8, d=2)
    g = iosim.gradients("flash-swapped", q, k, v, do, M="1k", window=(1, 0))
    assert np.all(g.dk[:, :, :4] == 0) and np.all(g.dv[:, :, :4] == 0)


@settings(max_examples=40, deadline=None)
@given(n_q=st.integers(1, 60), n_k=st.integers(1, 60), extra=st.integers(0, 5), causal=st.booleans(),
       algo=st.sampled_from(WINDOWED), pass_=st.sampled_from(["fwd", "bwd"]))
def test_a_window_as_wide_as_the_sequences_is_full_attention(n_q, n_k, extra, causal, algo, pass_):
    assume(ALGORITHMS[algo].backward is not None or pass_ == "fwd")
    wide = max(n_q, n_k) + extra
    window = (wide, 0 if causal else wide)
    options = dict(N=n_q, N_k=n_k, d=8, M="2k", causal=causal, pass_=pass_)
    # standard-eager masks S in a pass of its own whenever a band is given; split-kv skips a band's causal side only
    # under a window (without one it skips nothing, tests/test_split_kv_window.py)
    if algo != "standard-eager" and not (algo == "split-kv" and causal):
        assert iosim.count(algo, window=window, **options).traffic == iosim.count(algo, **options).traffic
    q, k, v, do = inputs(n_q, n_k, d=8, heads=1)
    if pass_ == "fwd":
        a = iosim.simulate(algo, q, k, v, M="2k", causal=causal, window=window).out
        b = iosim.simulate(algo, q, k, v, M="2k", causal=causal).out
        assert np.abs(a - b).max() < 1e-12
    else:
        a = iosim.gradients(algo, q, k, v, do, M="2k", causal=causal, window=window)
        b = iosim.gradients(algo, q, k, v, do, M="2k", causal=causal)
        assert max(np.abs(x - y).max() for x, y in ((a.dq, b.dq), (a.dk, b.dk), (a.dv, b.dv))) < 1e-12


@settings(max_examples=40, deadline=None)
@given(n_q=st.integers(1, 60), n_k=st.integers(1, 60), algo=st.sampled_from(WINDOWED),
       pass_=st.sampled_from(["fwd", "bwd", "fwd+bwd"]), left=st.integers(-1, 70))
def test_window_minus_one_zero_is_causal_and_causal_clips_the_right_side(n_q, n_k, algo, pass_, left):
    assume(ALGORITHMS[algo].backward is not None or pass_ == "fwd")
    options = dict(N=n_q, N_k=n_k, d=8, M="2k", pass_=pass_)
    assert iosim.count(algo, window=(-1, 0), **options).traffic == iosim.count(algo, causal=True, **options).traffic
    assert (iosim.count(algo, window=(left, 7), causal=True, **options).traffic
            == iosim.count(algo, window=(left, 0), **options).traffic)
    q, k, v, _ = inputs(n_q, n_k, d=8, heads=1)
    a = iosim.simulate(algo, q, k, v, M="2k", window=(-1, 0)).out
    assert np.abs(a - iosim.attention_ref(q, k, v, causal=True).out).max() < 1e-12


@pytest.mark.parametrize("algo, pass_", [(a, "fwd") for a in WINDOWED] + [(a, "fwd+bwd") for a in WINDOWED_BACKWARD])
def test_counts_take_constant_time_in_N(algo, pass_):
    start = time.perf_counter()
    options = dict(N=10**9, N_k=10**9 + 7, d=128, M="100k", window=(4096, 3), heads=8, pass_=pass_)
    c = iosim.count(algo, **options)
    assert c.traffic == iosim.predict(algo, **options).exact
    assert time.perf_counter() - start < 2.0, f"{algo} at N = 1e9 took {time.perf_counter() - start:.2f} s"


def test_windowed_flash_swapped_moves_less_the_narrower_the_window():
    totals = [iosim.count("flash-swapped", N=16384, d=128, M="192KiB", window=(w, 0)).traffic.total
              for w in (128, 1024, 8192)]
    causal = iosim.count("flash-swapped", N=16384, d=128, M="192KiB", causal=True).traffic.total
    assert totals == sorted(totals) and totals[-1] < causal, (totals, causal)


def test_a_window_s_sides_are_spelled_as_counts_are():
    # N="4Ki" and N=4096.0 were taken while window=("4Ki", 0) and (3.0, 0) were refused
    want = iosim.count("flash", N=8192, d=64, M="100k", window=(4096, 0)).traffic.total
    for spelled in (("4Ki", 0), (4096.0, "0"), ("4096", 0.0)):
        assert iosim.count("flash", N=8192, d=64, M="100k", window=spelled).traffic.total == want
    window = iosim.count("flash", N=8192, d=64, M="100k", window=("-1", "0")).problem.window
    assert (window.left, window.right) == (-1, 0)


@pytest.mark.parametrize("window, message", [
    ((-2, 0), "window left=-2 must be an integer >= -1"),
    ((0, 1.5), "window right=1.5 must be a whole number of keys >= -1"), (("-3", 0), "window left='-3' must be a"),
    (("4Kx", 0), "window left='4Kx' must be a whole number of keys >= -1 (-1: unbounded on that side)"),
    ((True, 0), "window left=True"), ((1, 2, 3), "window=(1, 2, 3) must be a pair"), ("4096", "must be a pair"),
])
def test_bad_windows_are_refused_by_name(window, message):
    with pytest.raises(iosim.InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        iosim.count("flash", N=64, d=8, M="10k", window=window)


@pytest.mark.parametrize("algo", [name for name in ALGORITHMS if name not in WINDOWED])
def test_an_algorithm_without_windows_refuses_one_and_lists_those_that_take_it(algo):
    with pytest.raises(iosim.InputError, match=f"for {algo}: it takes no sliding window.*'flash-swapped'"):
        iosim.count(algo, N=64, d=8, M="10k", window=(8, 0))


def test_the_gpu_model_refuses_a_sliding_window_but_takes_causal_spelled_as_one():
    with pytest.raises(iosim.InputError, match=r"window=\(64, 0\): no GPU kernel of iosim takes a sliding window"):
        iosim.dram("flash-swapped", N=1024, d=64, M="100k", window=(64, 0))
    options = dict(N=1024, d=64, M="100k", batch=2, heads=2)
    assert (iosim.dram("flash-swapped", window=(-1, 0), **options).dram
            == iosim.dram("flash-swapped", causal=True, **options).dram)


def test_the_band_is_one_frozen_value():
    assert Band(-1, 0) == count_problem(10, 4, causal=True).band
    assert count_problem(10, 4, window=(5, 9), causal=True).band == Band(5, 0)
    assert count_problem(10, 4).band.full and not Band(3, 0).full
    assert Band(-1, 0).keep(3, 3, slice(0, 3), slice(0, 3)).tolist() == [[True, False, False], [True, True, False],
                                                                         [True, True, True]]


@pytest.mark.parametrize("n_q, n_k, window", [(113, 113, (17, 0)), (100, 239, (3, -1)), (239, 100, (0, 5))])
def test_forward_matches_torch_sdpa_with_the_band_as_an_explicit_mask(n_q, n_k, window):
    torch = pytest.importorskip("torch", reason="torch is optional: SDPA is the comparison where it is installed")
    q, k, v, _ = inputs(n_q, n_k)
    keep = Band(*window).keep(n_q, n_k, slice(0, n_q), slice(0, n_k))
    seen = keep.any(axis=1)  # SDPA gives NaN on a row that sees no key; iosim and the reference give 0
    want = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(x) for x in (q, k, v)), attn_mask=torch.from_numpy(keep)).numpy()
    out = iosim.simulate("flash-swapped", q, k, v, M="2k", window=window).out
    assert np.abs(out[:, :, seen] - want[:, :, seen]).max() < 1e-12


@pytest.mark.parametrize("algo", WINDOWED_BACKWARD)
@pytest.mark.parametrize("n_q, n_k, window", [(113, 113, (17, 0)), (100, 239, (3, 8))])
def test_backward_matches_torch_autograd_through_sdpa_with_the_band_as_a_mask(algo, n_q, n_k, window):
    torch = pytest.importorskip("torch", reason="torch is optional: SDPA is the comparison where it is installed")
    q, k, v, do = inputs(n_q, n_k)
    keep = torch.from_numpy(Band(*window).keep(n_q, n_k, slice(0, n_q), slice(0, n_k)))  # every row sees a key
    leaves = [torch.from_numpy(x).requires_grad_() for x in (q, k, v)]
    torch.nn.functional.scaled_dot_product_attention(*leaves, attn_mask=keep).backward(torch.from_numpy(do))
    g = iosim.gradients(algo, q, k, v, do, M="4k", window=window)
    for name, mine, theirs in zip(("dq", "dk", "dv"), (g.dq, g.dk, g.dv), leaves):
        assert np.abs(mine - theirs.grad.numpy()).max() < 1e-12, name


def test_the_window_figure_s_counts_grow_with_the_window_up_to_causal():
    rows = window.records()
    for algorithm in ("flash", "flash-swapped"):
        mine = {r["window"]: r["hbm_elements"] for r in rows if r["algorithm"] == algorithm}
        windowed = [mine[w] for w in sorted(w for w in mine if isinstance(w, int))]
        assert windowed == sorted(windowed) and windowed[-1] == mine["causal"] < mine[None], mine
