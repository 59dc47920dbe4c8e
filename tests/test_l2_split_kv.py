"""split-kv on the L2 model (iosim.gpu.l2): Flash-Decoding's split kernel and its combine, as flash-attn launches
them."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

import iosim
from iosim.core.gpus import GPUS
from iosim.core.problem import AttentionShape, Problem
from iosim.core.tiling import Tiling
from iosim.gpu.dram import pass_counts
from iosim.gpu.grids import split_kv as grids
from iosim.gpu.grids.split_kv import GRID_TENSORS
from iosim.gpu.hardware import hardware
from iosim.gpu.kernel import Kernel, Launch
from iosim.gpu.kernels import KERNELS
from iosim.gpu.l2 import L2Config, in_sequence, sectors
from iosim.gpu.schedule import simulate
from iosim.registry import ALGORITHMS

SPLIT_KV = ALGORITHMS["split-kv"]
# kernels/split_kv.py's combine: 10 blocks per SM in the resource report (48 registers x 128 threads, float16 at
# d = 64 and 128, where the report has its rows); the small float32 problems here take it at every d
COMBINE_BLOCKS_PER_SM = 10


def launches(launch: Launch):
    """split-kv's kernels as ``iosim.gpu.kernels`` launches them, at any d and dtype: the split kernel at the blocks
    per SM its shared memory allows (the kernel description's fallback where the report has no row), then the
    combine where S > 1."""
    pb, t = launch.problem, launch.tiling
    split = grids.split(pb, t, grids.split_smem(pb, t))
    return (split,) if t.splits == 1 else (split, grids.combine(pb, t, COMBINE_BLOCKS_PER_SM))


# the split-kv kernel description at the small d and float32 of these tests, which the resource report has no row for
SMALL = Kernel("split-kv@small-d", "split-kv", "tests/test_l2_split_kv.py", launches, backward=False)


def dram_traffic(pb, tiling, gpu="h100", capacity=None, blocks_per_sm=None, schedule="lockstep"):
    """The simulation of every kernel of the pass, each from a cold L2 (``in_sequence``)."""
    hw = hardware(gpu, l2_bytes=capacity, blocks_per_sm=blocks_per_sm, schedule=schedule)
    return in_sequence([simulate(g, hw.config(g)) for g in SMALL.grids(Launch(pb, tiling))])


def packed(batch=1, heads=4, kv_heads=2, n_q=1, n_k=100, d=8, dtype="float32"):
    """The problem as split-kv runs it: each GQA group's query heads packed into the rows of one K/V head."""
    pb = Problem(AttentionShape(batch, heads, n_q, n_k, d, kv_heads=kv_heads), tau=1.0, dtype=dtype)
    return SPLIT_KV.run_problem(pb)


def test_blocks_are_query_block_fastest_then_split_then_kv_head():
    # 2 K/V heads × 3 splits × 2 query blocks: block (kvh·S + s)·T_r + i reads Q of (kvh, i) and split s's K/V
    pb, tiling = packed(heads=4, kv_heads=2, n_q=3, n_k=96), Tiling(4, 16, splits=3)  # packed rows: 2·3 = 6, T_r 2
    g = grids.split(pb, tiling, grids.split_smem(pb, tiling))
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
    hw = hardware("h100", l2_bytes=10**8)
    split, combine = (simulate(g, hw.config(g)) for g in SMALL.grids(Launch(pb, tiling)))
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
    assert len(KERNELS["split-kv"].grids(Launch(pb, Tiling(2, 16, splits=1)))) == 1
    assert len(SMALL.grids(Launch(pb, Tiling(2, 16, splits=1)))) == 1
    dram = dram_traffic(pb, Tiling(2, 16, splits=1), capacity=10**8)
    assert dram.tensor("O_split").dirty_at_end == 0 and dram.tensor("O").dirty_at_end == 2 * sectors(2 * 8 * 4)


def test_an_L2_of_one_step_reads_K_V_as_the_two_level_count_does():
    # room for one step only: every K/V tile comes from DRAM each time it is read, as iosim.count counts
    pb, tiling = packed(batch=1, heads=2, kv_heads=1, n_q=5, n_k=96, d=8), Tiling(4, 16, splits=2)
    counted = iosim.count("split-kv", N=5, N_k=96, d=8, heads=2, kv_heads=1, dtype="float32", tiling=tiling,
                          M=10**6).traffic
    dram = simulate(grids.split(pb, tiling, 1), L2Config(capacity=4 * (2 * 16 * 8 + 4 * 8), concurrent=1))
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
    got = pass_counts(SMALL, Launch(pb, tiling), hardware("a100", l2_bytes=capacity, blocks_per_sm=per_sm))
    assert got == dram_traffic(pb, tiling, "a100", capacity=capacity, blocks_per_sm=per_sm), got


@pytest.mark.parametrize("kv_heads", [8, 2])
def test_the_api_gives_split_kv_decode_its_dram_bytes(kv_heads):
    r = iosim.dram("split-kv", N=1, N_k=4096, d=128, M="100k", batch=4, heads=8, kv_heads=kv_heads)
    # K and V of each K/V head read once: the L2 holds nothing twice in decoding, so DRAM reads what HBM counts
    kv = 4 * kv_heads * 4096 * 128 * 2
    assert r.dram.tensor("K").reads == r.dram.tensor("V").reads == kv, r.dram
    assert r.forward_tiling.splits > 1 and r.dram.tensor("O").dirty_at_end > 0, r
    assert r.kernel == "split-kv"  # today's kernels, at the report's blocks per SM (float16, d = 128)


def test_the_partials_are_float32_in_a_16_bit_run_as_flash_attn_keeps_them():
    # float16, one decoding query of 2 heads packed into one K/V head (2 rows of d = 8), 2 splits: each split
    # writes O_split in float32, 2 · 8 · 4 = 64 B, where O itself is float16 (2 · 8 · 2 = 32 B); the combine
    # reads the partials back at that size
    pb, tiling = packed(heads=2, kv_heads=1, d=8, dtype="float16"), Tiling(2, 50, splits=2)
    hw = hardware("h100", l2_bytes=10**8)
    split, combine = (simulate(g, hw.config(g)) for g in SMALL.grids(Launch(pb, tiling)))
    assert split.tensor("O_split").dirty_at_end == 2 * 64 and combine.tensor("O_split").reads == 2 * 64
    assert combine.tensor("O").dirty_at_end == 32


@pytest.mark.parametrize("splits", [1, 3])
def test_the_small_d_launches_are_the_kernel_description_s_where_the_report_has_its_rows(splits):
    # float16 at d = 64, tile 64 x 32: iosim.gpu.kernels' split-kv launches the same grids, block by block, at the
    # report's blocks per SM (split 2, combine 10)
    pb, tiling = packed(batch=1, heads=8, kv_heads=2, n_q=1, n_k=200, d=64, dtype="float16"), Tiling(64, 32, splits)
    want, got = KERNELS["split-kv"].grids(Launch(pb, tiling)), SMALL.grids(Launch(pb, tiling))
    assert [g.blocks for g in got] == [g.blocks for g in want] and len(want) == 1 + (splits > 1)
    for g, w in zip(got, want):
        assert all(list(g.steps(b)) == list(w.steps(b)) for b in range(g.blocks))
    h100 = GPUS["h100"]
    assert [g.per_sm(h100) for g in want] == [2, COMBINE_BLOCKS_PER_SM][:len(want)]
