"""Bad input gets an exception that names the parameter, the value and the allowed range."""

import numpy as np
import pytest
from helpers import ALGORITHM_NAMES, random_qkv

import iosim
from iosim.api import new_memory
from iosim.core.memory import Memory
from iosim.core.units import parse_size
from iosim.plans import Plan


@pytest.mark.parametrize("text, dtype, elements", [
    ("100k", "float16", 100_000), ("64Ki", "float16", 65_536), ("1M", "float32", 1_000_000),
    ("1Mi", "float16", 1_048_576), ("192KiB", "float16", 98_304), ("192KiB", "float32", 49_152),
    ("4096", "float16", 4096), (5000, "float16", 5000), ("2G", "float16", 2 * 10**9),
])
def test_parse_size(text, dtype, elements):
    assert parse_size(text, dtype) == elements


@pytest.mark.parametrize("text", ["100q", "", "k", "-5", "1.5", "3B", "0", "12 KiBB"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="M="):
        parse_size(text, "float16")


@pytest.mark.parametrize("field", ["N", "d", "batch", "heads", "N_k"])
@pytest.mark.parametrize("value", [0, -3])
def test_nonpositive_sizes(field, value):
    kwargs = dict(N=64, d=16, M=10_000)
    kwargs[field] = value
    with pytest.raises(ValueError, match=f"{field}={value}.*allowed range"):
        iosim.count("flash", **kwargs)


def test_a_tiling_takes_its_blocks_as_counts_are_taken_and_holds_ints():
    # Tiling("4", 4) and Tiling(4.0, 4) were kept as given, and count failed on them with a bare TypeError
    plain = iosim.count("flash", N=100, d=8, M=10_000, tiling=iosim.Tiling(4, 8))
    for tiling in (iosim.Tiling("4", 8), iosim.Tiling(4.0, "8"), iosim.Tiling(4, 8, 1.0)):
        assert tiling == iosim.Tiling(4, 8) and all(type(x) is int for x in (tiling.Br, tiling.Bc, tiling.splits))
        assert iosim.count("flash", N=100, d=8, M=10_000, tiling=tiling).traffic == plain.traffic
    with pytest.raises(iosim.InputError, match="Br='4.5' is not a whole number"):
        iosim.Tiling("4.5", 8)


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
def test_M_below_smallest_working_set(algorithm):
    with pytest.raises(iosim.BlockSizeError, match="M=4 is below the smallest working set.*allowed range M >="):
        iosim.count(algorithm, N=128, d=64, M=4)


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5, float("nan")])
def test_dropout_out_of_range(p):
    q, k, v = random_qkv(np.random.default_rng(0), 1, 1, 8, 8, 4)
    with pytest.raises(ValueError, match=r"dropout_p=.*\[0, 1\)"):
        iosim.simulate("flash", q, k, v, M=1000, dropout_p=p)


def test_a_ragged_nested_list_is_refused_by_name():
    k = np.ones((1, 1, 2, 2))
    with pytest.raises(iosim.InputTypeError, match="q is a nested list whose rows differ in length"):
        iosim.simulate("flash", [[[[1.0, 2.0], [1.0]]]], k, k, M="100k")  # a bare ValueError of numpy's before
    assert iosim.simulate("flash", [[[[1.0, 2.0], [1.0, 0.5]]]], k, k, M="100k").out.shape == (1, 1, 2, 2)


def test_mismatched_shapes():
    rng = np.random.default_rng(0)
    q, k, v = random_qkv(rng, 1, 2, 8, 8, 4)
    with pytest.raises(ValueError, match="k and v must agree in batch, kv_heads and N_k"):
        iosim.simulate("flash", q, k, v[:, :, :5], M=1000)
    with pytest.raises(ValueError, match="must agree in batch and d"):
        iosim.simulate("flash", q[..., :3], k, v, M=1000)
    q3 = rng.standard_normal((1, 3, 8, 4))  # k's 2 heads do not divide q's 3
    with pytest.raises(ValueError, match="kv_heads.*must divide q's heads"):
        iosim.simulate("flash", q3, k, v, M=1000)
    with pytest.raises(ValueError, match="4 dimensions"):
        iosim.simulate("flash", q[0], k, v, M=1000)
    with pytest.raises(ValueError, match="does not broadcast"):
        iosim.simulate("flash", q, k, v, M=1000, mask=np.ones((3, 8), dtype=bool))
    with pytest.raises(TypeError, match="mask must be boolean"):
        iosim.simulate("flash", q, k, v, M=1000, mask=np.ones((8, 8)))


def test_unknown_algorithm_and_policy():
    with pytest.raises(ValueError, match="algorithm='flash3' is not one of"):
        iosim.count("flash3", N=8, d=4, M=1000)
    with pytest.raises(ValueError, match="block_policy='huge'"):
        iosim.count("flash", N=8, d=4, M=1000, block_policy="huge")


def test_paper_policy_overflow_is_reported_not_exceeded():
    # d = 128, M = 100k: B_c = ⌈M/4d⌉ = 196, B_r = 128, and 4·B·d leaves no room for the 128 × 196 S tile
    with pytest.raises(iosim.BlockSizeError, match="working set of 108800 elements exceeds M=100000"):
        iosim.count("flash", N=1024, d=128, M="100k", block_policy="paper")
    r = iosim.count("flash", N=1024, d=64, M="100k", block_policy="paper")
    assert r.tiling == iosim.Tiling(64, 391) and r.traffic.peak_sram <= r.M


def test_capacity_error_names_the_resident_buffers():
    mem = Memory(100, bh=1, numeric=False)
    mem.alloc("K_j", 4, 10)
    mem.alloc("V_j", 4, 10)
    with pytest.raises(iosim.CapacityError, match=r"allocating S_ij \(30 elements\).*K_j=40, V_j=40.*needs 110"):
        mem.alloc("S_ij", 3, 10)


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
def test_algorithm_raises_capacity_error_when_blocks_do_not_fit(algorithm):
    from helpers import problem
    pb = problem(64, 64, 16)
    algo = iosim.ALGORITHMS[algorithm]
    tiling = iosim.Tiling(32, 16)
    # the largest M below which 32 × 16 blocks overflow (a working set may grow with M: rows of S in step 2)
    M = next(m for m in range(algo.working_set(pb, tiling, 1000), 0, -1) if algo.working_set(pb, tiling, m) > m)
    mem = new_memory(Plan(algo, pb, M, tiling))
    with pytest.raises(iosim.CapacityError, match=f"M={M} elements exceeded"):
        algo.run(mem, pb, tiling)


def test_bad_scale_and_seed():
    q, k, v = random_qkv(np.random.default_rng(0), 1, 1, 8, 8, 4)
    with pytest.raises(ValueError, match="scale=inf"):
        iosim.simulate("flash", q, k, v, M=1000, scale=float("inf"))
    with pytest.raises(ValueError, match="seed=-1"):
        iosim.simulate("flash", q, k, v, M=1000, seed=-1)
