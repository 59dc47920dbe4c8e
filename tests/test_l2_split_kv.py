"""split-kv on the L2 model (iosim.gpu.l2): Flash-Decoding's split kernel and its combine, as flash-attn launches them."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

import iosim
from iosim.algorithms.split_kv import GRID_TENSORS
from iosim.gpu.l2 import L2Config, kernels, l2_config, sectors
from iosim.gpu.schedule import dram_traffic, simulate
from iosim.gpu.lockstep import dram_counts
from iosim.core.problem import AttentionShape, Problem
from iosim.registry import ALGORITHMS
from iosim.core.tiling import Tiling

SPLIT_KV = ALGORITHMS["split-kv"]


def packed(batch=1, heads=4, kv_heads=2, n_q=1, n_k=100, d=8, dtype="float32"):
    """The problem as split-kv runs it: each GQA group's query heads packed into the rows of one K/V head."""
    pb = Problem(AttentionShape(batch, heads, n_q, n_k, d, kv_heads=kv_heads), tau=1.0, dtype=dtype)
    return SPLIT_KV.run_problem(pb)


def test_blocks_are_query_block_fastest_then_split_then_kv_head():
    # 2 K/V heads × 3 splits × 2 query blocks: block (kvh·S + s)·T_r + i reads Q of (kvh, i) and split s's K/V
    pb, tiling = packed(heads=4, kv_heads=2, n_q=3, n_k=96), Tiling(4, 16, splits=3)  # packed rows: 2·3 = 6, T_r 2
    g = SPLIT_KV.grid(pb, tiling)
    assert g.blocks == 2 * 3 * 2
    k = len(GRID_TENSORS)
    first = [next(g.steps(b)) for b in range(g.blocks)]
    q_tiles = [step[0][0] // k for step in first]  # tile index of the Q access
    assert q_tiles == [0, 1] * 3 + [2, 3] * 3, q_tiles
    kv_tiles = [step[1][0] // k for step in first]  # the first K tile: split s of 6 blocks starts at 2·s
    assert kv_tiles == [0, 0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10], kv_tiles


def test_decode_that_fits_reads_K_V_once_and_the_combine_reads_the_partials_back_from_a_cold_L2():
    # batch 2, 8 query heads in 2 groups of 4, one decoding query, N_k = 100 in 4 splits of B_c = 25
    pb, tiling = packed(batch=2, heads=8, kv_heads=2, n_k=100), Tiling(4, 25, splits=4)
    split, combine = (simulate(g, l2_config(g, "h100", 10**8)) for g in kernels(SPLIT_KV, pb, tiling))
    kv_heads, rows, d = 2 * 2, 4, 8
    # K and V of every K/V head once: 25 rows · 8 · 4 B = 800 B = 25 sectors a tile
    assert split.tensor("K").reads == split.tensor("V").reads == kv_heads * 100 * d * 4, split
    assert split.tensor("Q").reads == kv_heads * rows * d * 4, split  # Q_i once for all 4 splits of its head
    # each split's O_split (4 · 8 · 4 = 128 B) and lse_split (16 B: half a sector, fetched before it is written)
    assert split.tensor("O_split").dirty_at_end == kv_heads * 4 * 128, split
    assert split.tensor("lse_split").reads == split.tensor("lse_split").dirty_at_end == kv_heads * 4 * 32, split
    assert split.writes == 0 and split.tensor("O").dirty_at_end == 0, split
    # the combine, after ncu's flush: every partial read once, O and lse written
    assert combine.tensor("O_split").reads == kv_heads * 4 * 128, combine
    assert combine.tensor("O").dirty_at_end == kv_heads * 128 and combine.tensor("K").reads == 0, combine


def test_one_split_writes_O_and_lse_in_one_kernel():
    pb = packed(n_k=64)
    assert len(kernels(SPLIT_KV, pb, Tiling(2, 16, splits=1))) == 1
    dram = dram_traffic(SPLIT_KV, pb, Tiling(2, 16, splits=1), capacity=10**8)
    assert dram.tensor("O_split").dirty_at_end == 0 and dram.tensor("O").dirty_at_end == 2 * sectors(2 * 8 * 4)


def test_an_L2_of_one_step_reads_K_V_as_the_two_level_count_does():
    # room for one step only: every K/V tile comes from DRAM each time it is read, as iosim.count counts
    pb, tiling = packed(batch=1, heads=2, kv_heads=1, n_q=5, n_k=96, d=8), Tiling(4, 16, splits=2)
    counted = iosim.count("split-kv", N=5, N_k=96, d=8, heads=2, kv_heads=1, dtype="float32", tiling=tiling,
                          M=10**6).traffic
    dram = simulate(SPLIT_KV.grid(pb, tiling), L2Config(capacity=4 * (2 * 16 * 8 + 4 * 8), concurrent=1))
    for name in ("K", "V"):
        assert dram.tensor(name).reads == counted.tensor(name).read_bytes, (name, dram, counted)


@given(batch=st.integers(1, 3), group=st.sampled_from([1, 2, 4]), kv_heads=st.integers(1, 3),
       n_q=st.integers(1, 3), n_k=st.integers(1, 300), d=st.sampled_from([8, 12]), Br=st.sampled_from([2, 4, 8]),
       Bc=st.sampled_from([8, 16, 32]), splits=st.integers(1, 6), capacity=st.integers(200, 20_000),
       per_sm=st.integers(1, 3))
def test_dram_counts_equals_the_simulation_for_split_kv(batch, group, kv_heads, n_q, n_k, d, Br, Bc, splits,
                                                        capacity, per_sm):
    pb = packed(batch, group * kv_heads, kv_heads, n_q, n_k, d)
    splits = min(splits, -(-n_k // Bc))
    tiling = Tiling(Br, Bc, splits=splits)
    got = dram_counts(SPLIT_KV, pb, tiling, "a100", capacity=capacity, blocks_per_sm=per_sm)
    assert got == dram_traffic(SPLIT_KV, pb, tiling, "a100", capacity=capacity, blocks_per_sm=per_sm), got


@pytest.mark.parametrize("kv_heads", [8, 2])
def test_the_api_gives_split_kv_decode_its_dram_bytes(kv_heads):
    r = iosim.dram("split-kv", N=1, N_k=4096, d=128, M="100k", batch=4, heads=8, kv_heads=kv_heads)
    # K and V of each K/V head read once: the L2 holds nothing twice in decoding, so DRAM reads what HBM counts
    kv = 4 * kv_heads * 4096 * 128 * 2
    assert r.dram.tensor("K").reads == r.dram.tensor("V").reads == kv, r.dram
    assert r.forward_tiling.splits > 1 and r.dram.tensor("O").dirty_at_end > 0, r


def test_the_partials_are_float32_in_a_16_bit_run_as_flash_attn_keeps_them():
    # float16, one decoding query of 2 heads packed into one K/V head (2 rows of d = 8), 2 splits: each split
    # writes O_split in float32, 2 · 8 · 4 = 64 B, where O itself is float16 (2 · 8 · 2 = 32 B); the combine
    # reads the partials back at that size
    pb, tiling = packed(heads=2, kv_heads=1, d=8, dtype="float16"), Tiling(2, 50, splits=2)
    split, combine = (simulate(g, l2_config(g, "h100", 10**8)) for g in kernels(SPLIT_KV, pb, tiling))
    assert split.tensor("O_split").dirty_at_end == 2 * 64 and combine.tensor("O_split").reads == 2 * 64
    assert combine.tensor("O").dirty_at_end == 32
