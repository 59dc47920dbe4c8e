"""The L2 model (iosim.gpu.l2) of the backward passes: flash's one kernel, flash-swapped's three, by hand and against
iosim's two-level count at the same tiling."""

from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import iosim
from iosim.core.errors import InputError
from iosim.gpu.l2 import SECTOR, L2Config, in_sequence, kernels, l2_config, sectors
from iosim.gpu.schedule import dram_traffic, simulate
from iosim.gpu.lockstep import dram_counts, lockstep
from iosim.core.problem import AttentionShape, Problem
from iosim.registry import ALGORITHMS
from iosim.algorithms.flash_swapped_backward import cast_grid, fill_grid, row_dot_grid
from iosim.core.tiling import Tiling

FLASH_BW, SWAPPED_BW = ALGORITHMS["flash"].backward, ALGORITHMS["flash-swapped"].backward


def problem(bh=1, n_q=64, n_k=64, d=8, causal=False):
    return Problem(AttentionShape(1, bh, n_q, n_k, d), tau=1.0, dtype="float32", causal=causal)


def launches(algo, pb, tiling):
    return algo.launches(pb, tiling) if algo.launches is not None else (algo.grid(pb, tiling),)


def summed(algo, pb, tiling, config):
    """Per tensor (reads, writes + dirty at end) over every kernel of the pass, each from a cold L2."""
    total = {}
    for g in launches(algo, pb, tiling):
        for t in simulate(g, config).tensors:
            r, w = total.get(t.name, (0, 0))
            total[t.name] = (r + t.reads, w + t.writes + t.dirty_at_end)
    return total


def stat_bytes(n, B):
    """A float32 statistic of n rows in tiles of B rows, each tile rounded up to sectors."""
    return sum(sectors(min(B, n - i) * 4) for i in range(0, n, B))


@pytest.mark.parametrize("causal", [False, True])
def test_flash_backward_that_fits_reads_each_input_once_and_writes_nothing_during_the_kernel(causal):
    # d = 8 float32: a row is one 32-byte sector. 2 heads, N_q = 113, N_k = 239, B = 16: everything fits in 1 MB.
    bh, n_q, n_k, d, B = 2, 113, 239, 8, 16
    pb = problem(bh, n_q, n_k, d, causal)
    dram = simulate(FLASH_BW.grid(pb, Tiling(B, B)), L2Config(10**6, 4))
    for name, n in (("Q", n_q), ("O", n_q), ("dO", n_q), ("K", n_k), ("V", n_k)):
        assert dram.tensor(name).reads == bh * n * d * 4, (name, dram)  # once each
    assert dram.tensor("lse").reads == bh * stat_bytes(n_q, B), dram  # once, each tile rounded to sectors
    assert dram.tensor("dQ").reads == 0, dram  # line 5 wrote its zeros into the L2: every read-modify-write hits
    assert dram.writes == 0, dram
    # dQ (the float32 accumulator), dK, dV stay dirty: written after the kernel
    assert {t.name: t.dirty_at_end for t in dram.tensors if t.dirty_at_end} == {
        "dQ": bh * n_q * d * 4, "dK": bh * n_k * d * 4, "dV": bh * n_k * d * 4}, dram


def test_flash_swapped_backward_that_fits_reads_each_input_once_per_kernel():
    # row_dot, fill, main kernel, each from a cold L2 (ncu flushes between kernels). bh·N_q = 200 rows, so the
    # last 256-row chunk of D (200·4 B) and of dq_acc (200·8·4 B) are whole sectors.
    bh, n_q, n_k, d, B = 2, 100, 239, 8, 16
    pb, tiling = problem(bh, n_q, n_k, d), Tiling(B, B)
    row_dot, fill, main = (simulate(g, L2Config(10**6, 4)) for g in launches(SWAPPED_BW, pb, tiling))
    data = bh * n_q * d * 4
    assert {t.name: t.reads for t in row_dot.tensors if t.reads} == {"O": data, "dO": data}, row_dot
    assert row_dot.tensor("D").dirty_at_end == bh * n_q * 4, row_dot
    assert (fill.reads, fill.writes, fill.tensor("dQ").dirty_at_end) == (0, 0, data), fill
    # the main kernel reads dQ (zeros in DRAM after the flush), Q, dO, lse, D once; K, V once
    assert {t.name: t.reads for t in main.tensors if t.reads} == {
        "Q": data, "dO": data, "dQ": data, "lse": bh * stat_bytes(n_q, B), "D": bh * stat_bytes(n_q, B),
        "K": bh * n_k * d * 4, "V": bh * n_k * d * 4}, main
    assert main.writes == 0, main
    assert {t.name for t in main.tensors if t.dirty_at_end} == {"dQ", "dK", "dV"}, main


# The kernels' tensors against the two-level count's (Alg. 4 and FlashAttention-2's backward as iosim counts
# them): the kernels read lse where the count reads ℓ (one statistic per row either way) and L; flash's kernel
# does not zero dK, dV in HBM (line 5 as printed does). d = 8 and B = 32 keep every tile whole sectors (a ragged
# block of 24 rows: 96 B of a statistic), so bytes are elements × 4.
SHAPES = [(120, 88, 8, False), (120, 88, 8, True), (88, 120, 16, True)]


def two_level(algo_name, n_q, n_k, d, causal, B):
    counted = iosim.count(algo_name, N=n_q, N_k=n_k, d=d, causal=causal, dtype="float32", tiling=Tiling(B, B),
                          M=10**6, pass_="bwd").traffic
    return lambda name, way: getattr(counted.tensor(name), f"{way}_bytes")


@pytest.mark.parametrize("n_q, n_k, d, causal", SHAPES)
def test_flash_backward_with_an_L2_of_one_sector_moves_what_the_two_level_count_moves(n_q, n_k, d, causal):
    # One block, an L2 of one sector: every tile goes straight through, so DRAM sees every load and store.
    B = 32
    dram = summed(FLASH_BW, problem(1, n_q, n_k, d, causal), Tiling(B, B), L2Config(SECTOR, 1))
    count = two_level("flash", n_q, n_k, d, causal, B)
    for name in ("Q", "K", "V", "O", "dO", "dQ"):
        assert dram[name][0] == count(name, "read"), (name, dram[name], count(name, "read"))
    assert dram["lse"][0] == count("l", "read"), (dram["lse"], count("l", "read"))
    assert dram["dQ"][1] == count("dQ", "write"), (dram["dQ"], count("dQ", "write"))  # line 5's zeros + line 21
    for name in ("dK", "dV"):  # line 24 only: the count's line 5 also writes N_k·d zeros
        assert dram[name][1] == count(name, "write") - n_k * d * 4, (name, dram[name], count(name, "write"))


@pytest.mark.parametrize("n_q, n_k, d, causal", SHAPES)
def test_flash_swapped_backward_with_an_L2_of_one_sector_moves_what_the_two_level_count_moves(n_q, n_k, d, causal):
    # Its three kernels together: row_dot is the count's first pass (O, dO read, D written), fill its dQ zeros.
    B = 32
    dram = summed(SWAPPED_BW, problem(1, n_q, n_k, d, causal), Tiling(B, B), L2Config(SECTOR, 1))
    count = two_level("flash-swapped", n_q, n_k, d, causal, B)
    for name in ("Q", "K", "V", "O", "dO", "dQ", "D"):
        assert dram[name][0] == count(name, "read"), (name, dram[name], count(name, "read"))
    assert dram["lse"][0] == count("L", "read"), (dram["lse"], count("L", "read"))
    for name in ("dQ", "dK", "dV", "D"):
        assert dram[name][1] == count(name, "write"), (name, dram[name], count(name, "write"))


@settings(max_examples=40, deadline=None)
@given(bh=st.integers(1, 4), n_q=st.integers(1, 150), n_k=st.integers(1, 150), d=st.sampled_from([8, 16]),
       B=st.sampled_from([16, 32]), causal=st.booleans(), concurrent=st.integers(1, 12),
       capacity=st.integers(SECTOR, 40_000))
def test_DRAM_reads_never_exceed_the_two_level_count(bh, n_q, n_k, d, B, causal, concurrent, capacity):
    # An L2 can only turn loads into hits: per data tensor (rows of whole sectors), DRAM reads <= iosim's count.
    pb = Problem(AttentionShape(1, bh, n_q, n_k, d), tau=1.0, dtype="float32", causal=causal)
    for algo, name in ((FLASH_BW, "flash"), (SWAPPED_BW, "flash-swapped")):
        dram = summed(algo, pb, Tiling(B, B), L2Config(capacity, concurrent))
        counted = iosim.count(name, N=n_q, N_k=n_k, d=d, heads=bh, causal=causal, dtype="float32",
                              tiling=Tiling(B, B), M=10**6, pass_="bwd").traffic
        for x in ("Q", "K", "V", "O", "dO", "dQ"):
            assert dram[x][0] <= counted.tensor(x).read_bytes, (name, x, dram[x], counted.tensor(x))


def test_the_swapped_backward_grid_is_key_block_fastest_and_its_tile_square():
    # block bh·T_c + j: block 1 is head 0's second key block; its first step loads K_1, V_1 with Q_0
    pb = problem(2, 64, 96, 8)
    g = SWAPPED_BW.grid(pb, Tiling(32, 32))
    assert g.blocks == 2 * 3
    first = next(iter(g.steps(1)))
    tiles = {g.tiles.tensors[key % len(g.tiles.tensors)]: key // len(g.tiles.tensors) for key, _, _ in first}
    assert (tiles["K"], tiles["V"], tiles["Q"]) == (1, 1, 0), tiles
    with pytest.raises(InputError, match="Br == Bc"):
        SWAPPED_BW.grid(pb, Tiling(32, 16))
    with pytest.raises(InputError, match="Br == Bc"):
        FLASH_BW.grid(pb, Tiling(16, 32))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_swapped_backward_in_a_narrow_dtype_ends_with_the_cast_of_dQ(dtype):
    pb = Problem(AttentionShape(1, 3, 100, 64, 8), tau=1.0, dtype=dtype)
    grids = SWAPPED_BW.launches(pb, Tiling(16, 16))
    assert len(grids) == 4 and len(SWAPPED_BW.launches(replace(pb, dtype="float32"), Tiling(16, 16))) == 3
    cast = simulate(grids[-1], l2_config(grids[-1], "h100", 10**8))
    # from a cold L2: dq_acc read once in float32 (3·100·8·4 = 9600 B, 300 sectors), dQ written once in 2 bytes
    assert cast.tensor("dQ").reads == 3 * 100 * 8 * 4 and cast.reads == cast.tensor("dQ").reads, cast
    assert cast.tensor("dQ_cast").dirty_at_end == 3 * 100 * 8 * 2 and cast.writes == 0, cast


def test_a_pass_of_several_kernels_is_their_sum_each_from_a_cold_l2():
    algo = ALGORITHMS["flash-swapped"].backward
    pb, tiling = Problem(AttentionShape(1, 3, 200, 150, 16), tau=1.0, dtype="float32"), Tiling(32, 32)
    parts = [simulate(g, l2_config(g, "h100", 20_000)) for g in kernels(algo, pb, tiling)]
    assert len(parts) == 3
    total = dram_traffic(algo, pb, tiling, "h100", 20_000)
    assert total == in_sequence(parts) == dram_counts(algo, pb, tiling, "h100", 20_000)
    assert total.reads == sum(p.reads for p in parts) and total.dirty_at_end == sum(p.dirty_at_end for p in parts)


@given(bh=st.integers(1, 9), n_q=st.integers(1, 130), n_k=st.integers(1, 130), d=st.sampled_from([8, 12, 16]),
       B=st.sampled_from([8, 16, 32]), causal=st.booleans(), dtype=st.sampled_from(["float32", "float16"]),
       concurrent=st.integers(1, 12), capacity=st.integers(100, 60_000))
def test_lockstep_equals_the_simulation_on_the_flash_backward_grid(bh, n_q, n_k, d, B, causal, dtype, concurrent,
                                                                  capacity):
    # one block per head on its own head's tiles: uniform, so dram_counts takes lockstep (tens of times faster)
    g = FLASH_BW.grid(Problem(AttentionShape(1, bh, n_q, n_k, d), tau=1.0, dtype=dtype, causal=causal),
                      Tiling(B, B))
    assert g.uniform
    config = L2Config(capacity, concurrent)
    got = lockstep(g, config)
    assume(got is not None)  # None: a tile larger than the L2
    assert got == simulate(g, config), got


@given(bh=st.integers(1, 40), n=st.sampled_from([64, 100, 256, 300, 1024]), d=st.sampled_from([8, 16, 64]),
       dtype=st.sampled_from(["float32", "float16"]), concurrent=st.integers(1, 50),
       capacity=st.integers(100, 200_000))
def test_lockstep_equals_the_simulation_on_the_grid_stride_kernels(bh, n, d, dtype, concurrent, capacity):
    # row_dot, fill and cast: each block its own chunks, every block as many when the chunks divide evenly
    pb = Problem(AttentionShape(1, bh, n, n, d), tau=1.0, dtype=dtype)
    config = L2Config(capacity, concurrent)
    for g in (row_dot_grid(pb), fill_grid(pb), cast_grid(pb)):
        got = lockstep(g, config) if g.uniform else None
        if got is not None:
            assert got == simulate(g, config), got
