"""The structure the algorithms share: visited tiles, count-only grouping, the registry, the error contract."""

import numpy as np
import pytest
from helpers import ALGORITHM_NAMES, problem
from hypothesis import given, settings
from hypothesis import strategies as st

import iosim
from iosim.cli import main
from iosim.core.memory import Memory
from iosim.core.problem import AttentionShape, Problem
from iosim.core.visits import floor_sum, visits


def visible_pairs_by_elements(n_q, n_k, Br, Bc, causal):
    """Tile pairs holding at least one visible (query, key) element, found element by element.

    Bottom-right causal: query r sees key c exactly when c <= r + n_k - n_q.
    """
    pairs = set()
    for r in range(n_q):
        for c in range(n_k):
            if not causal or c <= r + n_k - n_q:
                pairs.add((r // Br, c // Bc))
    return pairs


@settings(max_examples=150, deadline=None)
@given(n_q=st.integers(1, 40), n_k=st.integers(1, 40), Br=st.integers(1, 12), Bc=st.integers(1, 12),
       causal=st.booleans())
def test_visited_tiles_are_the_tiles_with_a_visible_element(n_q, n_k, Br, Bc, causal):
    pb = Problem(AttentionShape(1, 1, n_q, n_k, 4), tau=1.0, causal=causal)
    tiles = visits(pb, iosim.Tiling(Br, Bc).capped(pb), skips_hidden=True)
    expected = visible_pairs_by_elements(n_q, n_k, tiles.q.B, tiles.k.B, causal)
    by_query = {(i, j) for i in tiles.query_blocks() for j in tiles.keys_seen_by(i)}
    by_key = {(i, j) for j in tiles.key_blocks() for i in tiles.queries_seeing(j)}
    assert by_query == expected and by_key == expected
    # the grouped pair sizes add up to the same tiles
    sizes = {}
    for i, j in expected:
        key = (tiles.q.size(i), tiles.k.size(j))
        sizes[key] = sizes.get(key, 0) + 1
    assert {(b_i, b_j): n for b_i, b_j, n in tiles.pairs()} == sizes


@settings(max_examples=150, deadline=None)
@given(n_q=st.integers(1, 60), n_k=st.integers(1, 60), Br=st.integers(1, 16), Bc=st.integers(1, 16),
       causal=st.booleans())
def test_count_only_grouping_matches_the_blocks_it_stands_for(n_q, n_k, Br, Bc, causal):
    pb = Problem(AttentionShape(1, 1, n_q, n_k, 4), tau=1.0, causal=causal)
    tiles = visits(pb, iosim.Tiling(Br, Bc).capped(pb), skips_hidden=True)
    for outer in (tiles.query_blocks(), tiles.key_blocks()):
        by_size = {}
        nested_by_size = {}
        for t in outer:
            size = outer.axis.size(t)
            by_size[size] = by_size.get(size, 0) + 1
            for u in outer.nested(t):
                key = (size, outer.nested(t).axis.size(u))
                nested_by_size[key] = nested_by_size.get(key, 0) + 1
        assert dict((outer.axis.size(t), n) for t, n in outer.classes()) == by_size
        assert outer.pairs() == nested_by_size
    blind = {tiles.q.size(i) for i in tiles.query_blocks() if not list(tiles.keys_seen_by(i))}
    seeing = {tiles.q.size(i) for i in tiles.query_blocks() if list(tiles.keys_seen_by(i))}
    assert tiles.blind_query_sizes() == blind - seeing


@pytest.mark.parametrize("n, m, a, b", [(0, 3, 2, 1), (1, 1, 0, 0), (7, 3, 5, 2), (100, 7, 13, 40), (50, 64, 3, 0)])
def test_floor_sum_by_brute_force(n, m, a, b):
    assert floor_sum(n, m, a, b) == sum((a * i + b) // m for i in range(n))


def test_count_only_visits_one_block_per_size():
    # N = 65536 in blocks of 64 × 476: a count-only run visits the full and the ragged
    # key block, each with one full query block, not all 138 × 1024 tiles.
    pb = problem(65536, 65536, 64)
    tiles = visits(pb, iosim.Tiling(64, 476), skips_hidden=True)
    assert tiles.key_blocks().classes() == [(0, 65536 // 476), (65536 // 476, 1)]
    assert tiles.queries_seeing(0).classes() == [(0, 1024)]


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
def test_explicit_tiling_is_used_and_must_fit(algorithm):
    r = iosim.count(algorithm, N=100, N_k=70, d=8, M=10**6, tiling=iosim.Tiling(7, 9))
    assert r.tiling == iosim.Tiling(7, 9)
    assert r.traffic == iosim.predict(algorithm, N=100, N_k=70, d=8, M=10**6, tiling=iosim.Tiling(7, 9)).exact
    assert iosim.count(algorithm, N=5, d=8, M=10**6, tiling=iosim.Tiling(64, 64)).tiling == iosim.Tiling(5, 5)
    with pytest.raises(iosim.BlockSizeError, match="tiling B_r=7, B_c=9 needs a working set of .* above M=50"):
        iosim.count(algorithm, N=100, N_k=70, d=8, M=50, tiling=iosim.Tiling(7, 9))


@pytest.mark.parametrize("kwargs, message", [
    (dict(Br=0, Bc=4), "Br=0 is outside the allowed range"),
    (dict(Br=4, Bc=2.5), "Bc=2.5 is not a whole number"),
])
def test_tiling_validates_itself(kwargs, message):
    with pytest.raises(iosim.InputError, match=message):
        iosim.Tiling(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(tau=float("inf")), "tau=inf must be a finite non-zero number"),
    (dict(tau=0.0), "tau=0.0 must be a finite non-zero number"),
    (dict(tau=1.0, dropout_p=1.0), r"dropout_p=1.0 is outside the allowed range \[0, 1\)"),
    (dict(tau=1.0, dtype="int8"), "dtype='int8' is not one of"),
    (dict(tau=1.0, causal=1), "causal=1 must be True or False"),
    (dict(tau=1.0, seed=-1), "seed=-1 is outside the allowed range"),
])
def test_problem_validates_itself_when_built_directly(kwargs, message):
    with pytest.raises(iosim.InputError, match=message):
        Problem(AttentionShape(1, 1, 8, 8, 4), **kwargs)


def test_shape_validates_itself():
    with pytest.raises(iosim.InputError, match=r"n_k=0 is outside the allowed range \[1, 2\*\*62\]"):
        AttentionShape(1, 1, 8, 0, 4)


@pytest.mark.parametrize("rows, cols, message", [
    (slice(0, 9), None, r"rows 0:9 of tensor 'Q' are outside its 8 x 4 elements"),
    (slice(-1, 2), None, r"rows -1:2 of tensor 'Q'"),
    (slice(3, 3), None, r"rows 3:3 of tensor 'Q'"),
    (slice(0, 2), slice(2, 5), r"cols 2:5 of tensor 'Q' are outside its 8 x 4 elements"),
])
def test_memory_rejects_blocks_outside_the_tensor(rows, cols, message):
    mem = Memory(1000, bh=1, numeric=False)
    mem.add_tensor("Q", 8, 4, 2)
    with pytest.raises(IndexError, match=message):
        mem.load("Q", rows, cols)
    tile = mem.alloc("Q_i", rows.stop - rows.start if rows.stop > rows.start else 1, 4)
    with pytest.raises(IndexError, match=message):
        mem.store(tile, "Q", rows, cols)


def test_validators_raise_input_error_subclasses():
    # callers that catch ValueError or TypeError keep working; the CLI catches InputError alone
    with pytest.raises(iosim.InputError):
        iosim.count("flash", N=0, d=4, M=1000)
    with pytest.raises(iosim.InputTypeError) as err:
        iosim.count("flash", N=[8], d=4, M=1000)
    assert isinstance(err.value, TypeError) and isinstance(err.value, ValueError)
    assert issubclass(iosim.BlockSizeError, iosim.InputError)


def test_a_bug_in_the_core_keeps_its_traceback(monkeypatch):
    # Bad input exits 2 in one line; an exception that is not an InputError must escape main().
    algo = iosim.ALGORITHMS["flash"]

    def broken(mem, pb, tiling):
        raise ValueError("an invariant broke inside the algorithm")

    monkeypatch.setitem(iosim.ALGORITHMS, "flash", type(algo)(**{**algo.__dict__, "run": broken}))
    with pytest.raises(ValueError, match="an invariant broke"):
        main(["run", "--algo", "flash", "--N", "8", "--d", "4"])


def test_algorithm_accepts_a_registered_name_or_the_algorithm_itself():
    algo = iosim.ALGORITHMS["flash-swapped"]
    by_name = iosim.count("flash-swapped", N=50, d=8, M=5000)
    assert iosim.count(algo, N=50, d=8, M=5000) == by_name
    with pytest.raises(iosim.InputError, match=r"algorithm=\['flash'\] is not one of"):
        iosim.count(["flash"], N=50, d=8, M=5000)
    with pytest.raises(iosim.InputError, match="name 'flash' is taken"):
        iosim.register(iosim.ALGORITHMS["flash"])


def test_every_hbm_tensor_is_declared_once_and_counted():
    for algo in iosim.ALGORITHMS.values():
        if algo.accepts("block_mask"):  # flex: its block mask is its only mask, tests/test_flex.py counts it
            continue
        pb = Problem(AttentionShape(1, 1, 8, 8, 4), tau=1.0, has_mask=True)
        names = [t.name for t in algo.hbm_tensors(pb)]
        assert len(names) == len(set(names)), f"{algo.name}: {names}"
        counts = iosim.count(algo, N=8, d=4, M=10**5, mask=True).traffic
        assert [t.name for t in counts.tensors] == names
        assert np.all([t.itemsize >= 1 for t in counts.tensors])
