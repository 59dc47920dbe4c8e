"""The L2 model (iosim.gpu.l2) of the backward passes: flash's one kernel, flash-swapped's three, by hand and against
iosim's two-level count at the same tiling."""

from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import iosim
from iosim.core.errors import InputError
from iosim.core.problem import AttentionShape, Problem
from iosim.core.tiling import Tiling
from iosim.gpu import call1
from iosim.gpu.dram import kernel_counts, pass_counts
from iosim.gpu.grids import _device
from iosim.gpu.hardware import hardware
from iosim.gpu.kernel import Kernel, Launch
from iosim.gpu.kernels import KERNELS
from iosim.gpu.l2 import SECTOR, Grid, L2Config, in_sequence, sectors
from iosim.gpu.lockstep import lockstep
from iosim.gpu.schedule import simulate

# call 1's kernels (iosim.gpu.call1): the backward grids at the occupancy these tests were written at; today's
# kernels (KERNELS["flash"], KERNELS["flash-swapped"]) launch the same grids at the resource report's blocks per SM
FLASH_BW, SWAPPED_BW = call1.FLASH, call1.FLASH_SWAPPED
MAIN = 2  # flash-swapped's backward launches row_dot, fill, the main kernel (and a cast of dQ below float32)


def problem(bh=1, n_q=64, n_k=64, d=8, causal=False):
    return Problem(AttentionShape(1, bh, n_q, n_k, d), tau=1.0, dtype="float32", causal=causal)


def launches(kernel: Kernel, pb: Problem, tiling: Tiling) -> tuple[Grid, ...]:
    """The grids of every kernel ``kernel``'s backward launches, in order."""
    return kernel.grids(Launch(pb, tiling, backward=True))


def flash_backward(pb: Problem, tiling: Tiling) -> Grid:
    """flash's backward: one kernel."""
    (g,) = launches(FLASH_BW, pb, tiling)
    return g


def swapped_backward(pb: Problem, tiling: Tiling) -> Grid:
    """flash-swapped's backward main kernel (key blocks outer, dQ by atomics)."""
    return launches(SWAPPED_BW, pb, tiling)[MAIN]


def summed(kernel, pb, tiling, config):
    """Per tensor (reads, writes + dirty at end) over every kernel of the pass, each from a cold L2."""
    total = {}
    for g in launches(kernel, pb, tiling):
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
    dram = simulate(flash_backward(pb, Tiling(B, B)), L2Config(10**6, 4))
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
    for kernel, name in ((FLASH_BW, "flash"), (SWAPPED_BW, "flash-swapped")):
        assert kernel.algorithm == name
        dram = summed(kernel, pb, Tiling(B, B), L2Config(capacity, concurrent))
        counted = iosim.count(name, N=n_q, N_k=n_k, d=d, heads=bh, causal=causal, dtype="float32",
                              tiling=Tiling(B, B), M=10**6, pass_="bwd").traffic
        for x in ("Q", "K", "V", "O", "dO", "dQ"):
            assert dram[x][0] <= counted.tensor(x).read_bytes, (name, x, dram[x], counted.tensor(x))


def test_the_swapped_backward_grid_is_key_block_fastest_and_its_tile_square():
    # block bh·T_c + j: block 1 is head 0's second key block; its first step loads K_1, V_1 with Q_0
    pb = problem(2, 64, 96, 8)
    g = swapped_backward(pb, Tiling(32, 32))
    assert g.blocks == 2 * 3
    first = next(iter(g.steps(1)))
    tiles = {g.tiles.tensors[key % len(g.tiles.tensors)]: key // len(g.tiles.tensors) for key, _, _ in first}
    assert (tiles["K"], tiles["V"], tiles["Q"]) == (1, 1, 0), tiles
    for swapped, flash in ((SWAPPED_BW, FLASH_BW), (KERNELS["flash-swapped"], KERNELS["flash"])):
        with pytest.raises(InputError, match="Br == Bc"):
            launches(swapped, pb, Tiling(32, 16))
        with pytest.raises(InputError, match="Br == Bc"):
            launches(flash, pb, Tiling(16, 32))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_swapped_backward_in_a_narrow_dtype_ends_with_the_cast_of_dQ(dtype):
    pb = Problem(AttentionShape(1, 3, 100, 64, 8), tau=1.0, dtype=dtype)
    # flash-swapped's kernels are built for float16 (and float32), the tensor-core ones for bfloat16 too
    kernels = (SWAPPED_BW, KERNELS["flash-swapped"]) if dtype == "float16" else (KERNELS["flash-swapped-tc"],)
    for kernel in kernels:
        assert len(launches(kernel, pb, Tiling(16, 16))) == 4
        assert len(launches(kernel, replace(pb, dtype="float32"), Tiling(16, 16))) == 3
    grids = launches(kernels[0], pb, Tiling(16, 16))
    cast = simulate(grids[-1], hardware("h100", l2_bytes=10**8).config(grids[-1]))
    # from a cold L2: dq_acc read once in float32 (3·100·8·4 = 9600 B, 300 sectors), dQ written once in 2 bytes
    assert cast.tensor("dQ").reads == 3 * 100 * 8 * 4 and cast.reads == cast.tensor("dQ").reads, cast
    assert cast.tensor("dQ_cast").dirty_at_end == 3 * 100 * 8 * 2 and cast.writes == 0, cast


def test_a_pass_of_several_kernels_is_their_sum_each_from_a_cold_l2():
    pb, tiling = Problem(AttentionShape(1, 3, 200, 150, 16), tau=1.0, dtype="float32"), Tiling(32, 32)
    launch, hw = Launch(pb, tiling, backward=True), hardware("h100", l2_bytes=20_000)
    parts = [simulate(g, hw.config(g)) for g in SWAPPED_BW.grids(launch)]
    assert len(parts) == 3
    assert kernel_counts(SWAPPED_BW, launch, hw) == parts  # kernel by kernel, each at its own blocks per SM
    total = in_sequence(parts)
    assert total == pass_counts(SWAPPED_BW, launch, hw)
    assert total.reads == sum(p.reads for p in parts) and total.dirty_at_end == sum(p.dirty_at_end for p in parts)


@given(bh=st.integers(1, 9), n_q=st.integers(1, 130), n_k=st.integers(1, 130), d=st.sampled_from([8, 12, 16]),
       B=st.sampled_from([8, 16, 32]), causal=st.booleans(), dtype=st.sampled_from(["float32", "float16"]),
       concurrent=st.integers(1, 12), capacity=st.integers(100, 60_000))
def test_lockstep_equals_the_simulation_on_the_flash_backward_grid(bh, n_q, n_k, d, B, causal, dtype, concurrent,
                                                                  capacity):
    # one block per head on its own head's tiles: uniform, so iosim.gpu.dram.kernel_counts takes lockstep (tens of
    # times faster)
    g = flash_backward(Problem(AttentionShape(1, bh, n_q, n_k, d), tau=1.0, dtype=dtype, causal=causal),
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
    per_sm = call1.GRID_STRIDE
    for g in (_device.row_dot(pb, per_sm), _device.fill(pb, per_sm), _device.cast(pb, per_sm)):
        got = lockstep(g, config) if g.uniform else None
        if got is not None:
            assert got == simulate(g, config), got
