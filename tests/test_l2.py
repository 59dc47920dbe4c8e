"""The L2 model (iosim.gpu.l2): the LRU by hand, the schedule, the grids against iosim's counts, the closed form."""

import dataclasses

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import iosim
from iosim.cli import main
from iosim.core.errors import InputError
from iosim.core.gpus import GPUS
from iosim.core.problem import AttentionShape, Problem
from iosim.core.tiling import Tiling
from iosim.gpu import call1
from iosim.gpu.dram import pass_counts
from iosim.gpu.hardware import hardware
from iosim.gpu.kernel import Kernel, Launch
from iosim.gpu.kernels import KERNELS, default_kernel
from iosim.gpu.l2 import READ, WRITE, Grid, L2Config, ResourceBound, SharedMemoryBound, Tiles, in_sequence, sectors
from iosim.gpu.lockstep import lockstep, lockstep_hits
from iosim.gpu.occupancy import report
from iosim.gpu.schedule import simulate

# call 1's kernels (iosim.gpu.call1): the grids of flash and flash-swapped at the occupancy these tests were written
# at (today's kernels differ from them only in blocks per SM, read from the resource report)
FLASH, SWAPPED = call1.FLASH, call1.FLASH_SWAPPED
H100, A100 = GPUS["h100"], GPUS["a100"]
TILES = Tiles(("A", "B", "C"))


def grid(kernel: Kernel, pb: Problem, tiling: Tiling) -> Grid:
    """The forward's one grid of ``kernel``."""
    (g,) = kernel.grids(Launch(pb, tiling))
    return g


def simulated(kernel: Kernel, pb: Problem, tiling: Tiling, hw):
    """Every kernel of the forward simulated on ``hw``, one after another from a cold L2."""
    return in_sequence([simulate(g, hw.config(g)) for g in kernel.grids(Launch(pb, tiling))])


def one_block_grid(steps, per_sm=1):
    return Grid(1, lambda b: iter(steps), TILES, per_sm)


def problem(bh=1, n_q=64, n_k=64, d=8, dtype="float32", causal=False, kv_heads=None):
    return Problem(AttentionShape(1, bh, n_q, n_k, d, kv_heads=kv_heads), tau=1.0, dtype=dtype, causal=causal)


def test_sectors_round_up():
    assert [sectors(n) for n in (1, 32, 33, 100)] == [32, 32, 64, 128]


def test_a_trace_that_fits_reads_each_tile_once_and_leaves_its_writes_dirty():
    # A: 4 tiles of 64 B read 5 times over; C: 2 tiles of 32 B written each pass; 4·64 + 2·32 = 320 B <= 512
    steps = [(TILES.access("A", t, 64, READ), TILES.access("C", t % 2, 32, WRITE)) for _ in range(5) for t in range(4)]
    dram = simulate(one_block_grid(steps), L2Config(capacity=512, concurrent=1))
    assert dram.tensor("A").reads == 4 * 64, dram  # each tile once
    assert (dram.tensor("C").reads, dram.tensor("C").writes, dram.tensor("C").dirty_at_end) == (0, 0, 2 * 32), dram


def test_a_cyclic_trace_just_over_capacity_misses_every_access():
    # 5 tiles of 64 B = 320 B in a cycle, capacity 319 B: LRU evicts each tile just before its next use
    steps = [(TILES.access("A", t, 64, READ),) for _ in range(7) for t in range(5)]
    dram = simulate(one_block_grid(steps), L2Config(capacity=319, concurrent=1))
    assert dram.tensor("A").reads == 7 * 5 * 64, dram
    assert simulate(one_block_grid(steps), L2Config(capacity=320, concurrent=1)).reads == 5 * 64  # fits: once


def test_dirty_tiles_go_to_dram_when_evicted_and_partial_writes_fetch_first():
    # B0 written (dirty), then 3 reads of 64 B push it out of 128 B; C0 is 40 B: not whole sectors, read first
    steps = [(TILES.access("B", 0, 64, WRITE),)] + [(TILES.access("A", t, 64, READ),) for t in range(3)]
    steps.append((TILES.access("C", 0, 40, WRITE),))
    dram = simulate(one_block_grid(steps), L2Config(capacity=128, concurrent=1))
    assert (dram.tensor("B").writes, dram.tensor("B").dirty_at_end) == (64, 0), dram
    assert (dram.tensor("C").reads, dram.tensor("C").dirty_at_end) == (64, 64), dram  # 40 B -> 2 sectors


def test_blocks_start_in_grid_order_and_a_new_one_takes_a_finished_ones_slot():
    # 3 blocks, 2 at once: block 0 (1 step) and 1 (3 steps) start at round 0; block 0 ends there, so block 2
    # takes slot 0 from round 1 and runs before block 1 in each round. The simulator asks a block for its next
    # step right after running one, so the order steps are asked for is the order they run.
    order = []

    def steps(b):
        for k in range((1, 3, 2)[b]):
            order.append((b, k))
            yield (TILES.access("A", 10 * b + k, 32, READ),)

    simulate(Grid(3, steps, TILES, 1), L2Config(capacity=1024, concurrent=2))
    rounds = [(0, 0), (1, 0), (2, 0), (1, 1), (2, 1), (1, 2)]  # rounds 0, 1, 2: two (block, step) each
    assert order == rounds, order


def test_the_preset_gives_capacity_and_concurrency_and_the_user_overrides_them():
    g = grid(SWAPPED, problem(), Tiling(16, 16))
    h100 = hardware().config(g)
    assert (h100.capacity, h100.concurrent) == (int(H100.l2_effective.value), 132 * g.per_sm(H100))
    assert g.per_sm(H100) == g.per_sm(A100) == 32  # 3,648 B blocks: the 32-block limit binds on both
    # no measured occupancy for these tiles: as many blocks as each preset's shared memory holds
    big = grid(SWAPPED, problem(d=64), Tiling(64, 64))
    block = 4 * ((64 + 2 * 64) * 64 + 64 * 65) + 1024  # float32 Q_i, K_j, V_j, S_ij and the driver's 1 KiB: 66,816 B
    assert (big.per_sm(H100), big.per_sm(A100)) == (228 * 1024 // block, 164 * 1024 // block) == (3, 2)
    assert hardware("a100").config(big).concurrent == 108 * 2
    assert hardware("a100", l2_bytes=1000, blocks_per_sm=2).config(g) == L2Config(1000, 216)
    with pytest.raises(InputError, match="blocks_per_sm"):
        hardware(blocks_per_sm=0)
    # an algorithm without a GPU kernel: refused by name, by the kernel lookup and by the entry point
    with pytest.raises(InputError, match="algorithm 'standard' has no GPU kernel"):
        default_kernel("standard")
    with pytest.raises(InputError, match="algorithm 'standard' has no GPU kernel"):
        iosim.dram("standard", N=64, d=8, M=10**6, dtype="float32", tiling=Tiling(16, 16))


@pytest.mark.parametrize("name, tiny, threads_bound, registers_bound, shared_bound", [
    # a block of one warp without shared memory or registers: the compute capability's block limit alone binds;
    # 256 threads: 2,048 / 1,536 / 1,024 threads an SM over 256; 64 registers × 8 warps of 32 lanes: 65,536 / 16,384;
    # 57,000 B of shared memory and the 1 KB reserve (none on the T4), allocated in 128 B units (256 B on the T4):
    # 233,472 // 58,112 = 4 on the H100 (5 without the reserve), 167,936 // 58,112 = 2 on the A100, 102,400 // 58,112
    # = 1 on the GB10, 65,536 // 57,088 = 1
    ("h100", 32, 8, 4, 4), ("a100", 32, 8, 4, 2), ("b200", 32, 8, 4, 4), ("gb10", 24, 6, 4, 1), ("t4", 16, 4, 4, 1)])
def test_occupancy_bounds_take_each_compute_capabilitys_limits(name, tiny, threads_bound, registers_bound,
                                                                shared_bound):
    gpu = GPUS[name]
    assert SharedMemoryBound(0).on(gpu) == ResourceBound(0, 32, 0).on(gpu) == tiny
    assert ResourceBound(0, 256, 0).on(gpu) == threads_bound
    assert ResourceBound(0, 256, 64).on(gpu) == min(threads_bound, registers_bound)
    # 100 threads take 4 whole warps: 2,048 / 128 = 16 blocks, not 2,048 // 100 = 20
    assert ResourceBound(0, 100, 0).on(gpu) == min(tiny, gpu.sm.threads // 128)
    # 255 registers round to 8,192 a warp: 2 blocks of 4 warps on every preset
    assert ResourceBound(0, 128, 255).on(gpu) == 2
    assert SharedMemoryBound(57_000).on(gpu) == ResourceBound(57_000, 128, 0).on(gpu) == shared_bound
    # the largest block one SM gives launches; a byte or a warp more is refused by name
    most = int(gpu.smem_per_sm.value) - gpu.sm.reserved_per_block
    assert ResourceBound(most, 32, 0).on(gpu) == 1 and ResourceBound(0, gpu.sm.threads, 0).on(gpu) == 1
    with pytest.raises(InputError, match=f"gives one block at most {most:,} B"):
        ResourceBound(most + 1, 32, 0).on(gpu)
    with pytest.raises(InputError, match=f"holds at most {gpu.sm.threads:,}"):
        ResourceBound(0, gpu.sm.threads + 32, 0).on(gpu)
    with pytest.raises(InputError, match=f"allowed: 1 to {tiny}"):
        hardware(name, blocks_per_sm=tiny + 1)


@pytest.mark.parametrize("name, block_bytes, blocks", [
    # a block's shared memory and the reserve are allocated together in units of 128 B (256 B at 7.5:
    # cuda_occupancy.h's cudaOccSMemAllocationGranularity): 24,917 B + 1 KiB = 25,941 B would fit 9 times in the
    # H100's 233,472 B, but it takes 25,984 B, 8 times; 21,845 B would fit 3 times in the T4's 65,536 B, but take
    # 22,016 B, 2 times; a block already of whole units is not moved (24,832 B + 1 KiB = 25,856 B: 9 blocks)
    ("h100", 24_917, 8), ("t4", 21_845, 2), ("h100", 24_832, 9)])
def test_shared_memory_is_allocated_in_the_compute_capabilitys_units(name, block_bytes, blocks):
    gpu = GPUS[name]
    assert SharedMemoryBound(block_bytes).on(gpu) == ResourceBound(block_bytes, 32, 0).on(gpu) == blocks
    assert gpu.sm.smem_unit == (256 if name == "t4" else 128)


@pytest.mark.parametrize("threads, registers, blocks", [
    # registers go to warps within a sub-partition of 16,384 (cuda_occupancy.h's cudaOccMaxBlocksPerSMRegsLimit):
    # 196 registers round to 6,400 a warp, 2 warps a sub-partition, 8 an SM: 4 blocks of 2 warps (65,536 / 12,800
    # over the whole file would give 5); 188 -> 6,144, also 2 a sub-partition, 4 blocks (5 over the whole file)
    (64, 196, 4), (64, 188, 4),
    # a block of a multiple of 4 warps comes out the same either way: 153 -> 4,992 rounded to 5,120, 3 warps a
    # sub-partition, 12 an SM, 3 blocks of 4; 48 -> 1,536, 10 a sub-partition, 40 warps, 5 blocks of 8
    (128, 153, 3), (256, 48, 5),
    # one warp of 255 registers: 8,192, 2 a sub-partition, 8 blocks; three warps of 200 registers: 6,400, 2 a
    # sub-partition, 8 warps, 2 blocks of 3 (65,536 / 19,200 over the whole file would give 3)
    (32, 255, 8), (96, 200, 2)])
def test_registers_are_allocated_per_sub_partition(threads, registers, blocks):
    assert ResourceBound(0, threads, registers).on(H100) == blocks


def test_the_resource_reports_builds_hold_their_h100_occupancy_and_each_presets_own():
    # the report's blocks per SM (computed for the H100 by experiments/kernel_resources.py) from the registers, shared
    # memory and threads each build records, under the H100's limits; the A100's 164 KB binds where 228 KB did not
    rows = report().rows
    assert [r.bound().on(H100) for r in rows] == [r.blocks_per_sm for r in rows]
    row = next(r for r in rows if r.shared_bytes and 164 * 1024 // r.shared_bytes < r.blocks_per_sm)
    assert row.bound().on(A100) == 164 * 1024 // row.shared_bytes < row.bound().on(H100), row
    # ptxas's 32,256 B for sm_90 hold the 1 KiB reserve, which the T4 does not keep: 65,536 // 31,232 = 2 blocks
    # (counting the reserve twice would give 65,536 // 33,280 = 1; registers allow 3)
    row = next(r for r in rows if r.label == "flash forward d=64 fp32 TileConfig(Br=32, Bc=32, TM=2, TN=4)")
    assert (row.shared_bytes, row.blocks_per_sm, row.bound().on(GPUS["t4"])) == (32_256, 3, 2), row


def test_every_preset_has_an_effective_L2_no_larger_than_its_nominal():
    for gpu in GPUS.values():
        assert 0 < gpu.l2_effective.value <= gpu.l2.value, gpu.name


@pytest.mark.parametrize("algo", [FLASH, SWAPPED])
@pytest.mark.parametrize("bh, n_q, n_k, d, Br, Bc, causal", [
    (1, 113, 239, 8, 16, 32, False), (3, 64, 64, 12, 16, 16, True), (2, 113, 239, 8, 32, 16, True)])
def test_an_L2_holding_everything_reads_Q_K_V_once_and_writes_nothing_during_the_kernel(algo, bh, n_q, n_k, d, Br,
                                                                                     Bc, causal):
    pb = problem(bh, n_q, n_k, d, causal=causal)
    dram = simulated(algo, pb, Tiling(Br, Bc), hardware("h100", l2_bytes=10**9))
    # Q, K, V once: bh·(N_q + 2·N_k)·d·4 B, every row a whole number of sectors (d·4 a multiple of 32)
    assert sum(dram.tensor(x).reads for x in "QKV") == bh * (n_q + 2 * n_k) * d * 4, dram
    # the rest: statistics of a ragged last query block (B_r·4 B not whole sectors), read before written
    ragged = n_q % Br
    stats = ("l", "m", "lse") if algo is FLASH else ("lse",)
    assert dram.reads - sum(dram.tensor(x).reads for x in "QKV") == bh * len(stats) * sectors(ragged * 4) * (
        ragged % 8 != 0), dram
    assert dram.writes == 0, dram
    outputs = {"O", "lse"} | ({"l", "m"} if algo is FLASH else set())
    assert {t.name for t in dram.tensors if t.dirty_at_end} == outputs, dram


@pytest.mark.parametrize("algo", [FLASH, SWAPPED])
@pytest.mark.parametrize("n_q, n_k, d, Br, Bc", [(128, 64, 8, 16, 16), (96, 160, 16, 32, 16)])
def test_an_L2_of_one_step_reads_what_the_two_level_count_reads(algo, n_q, n_k, d, Br, Bc):
    # One block at a time and room for one step only: every tile is evicted before its next use, so DRAM
    # reads what iosim.count counts (flash: Q, O, ℓ, m re-read per K/V block; flash-swapped: K, V per query
    # block). Sizes whole sectors: ℓ_i, m_i of B_r = 16 rows are 64 B.
    pb = problem(1, n_q, n_k, d)
    tiling = Tiling(Br, Bc)
    step = 4 * (2 * Bc * d + 2 * Br * d + 3 * Br)
    dram = simulate(grid(algo, pb, tiling), L2Config(capacity=step, concurrent=1))
    counted = iosim.count(algo.algorithm, N=n_q, N_k=n_k, d=d, heads=1, dtype="float32", tiling=tiling, M=10**6).traffic
    for name in ("Q", "K", "V"):
        assert dram.tensor(name).reads == counted.tensor(name).read_bytes, (name, dram, counted)
    if algo is FLASH:  # O, ℓ, m read at every step but the first (line 3 wrote zeros: no fetch)
        assert dram.tensor("O").reads == counted.tensor("O").read_bytes, (dram, counted)


def test_the_closed_form_counts_rereads_when_a_head_crosses_waves_and_its_copy_is_evicted():
    # 2 heads of T_r = 8 query blocks, 5 blocks at once: heads cross waves 0|1 and 1|2 (blocks 5, 10 of 16).
    pb, tiling = problem(2, 128, 256, 8), Tiling(16, 16)
    kv = 2 * 256 * 8 * 4  # K and V of one head
    roomy, tight = SWAPPED.forward_dram(pb, tiling, 10**7, 5), SWAPPED.forward_dram(pb, tiling, 2304, 5)
    assert roomy.reads["K"] + roomy.reads["V"] == 2 * kv  # once per head
    # head 0 is in waves 0, 1 (blocks 0-4, 5-7), head 1 in waves 1, 2, 3 (8-9, 10-14, 15): at 2,304 B no K_j
    # survives a wave, so K and V are read 2 + 3 times
    assert tight.reads["K"] + tight.reads["V"] == 5 * kv
    dram = simulate(grid(SWAPPED, pb, tiling), L2Config(2304, 5))
    assert dram.tensor("K").reads == tight.reads["K"], (dram, tight)


def test_the_closed_form_is_none_off_its_domain():
    assert SWAPPED.forward_dram(problem(causal=True), Tiling(16, 16), 10**6, 4) is None
    assert SWAPPED.forward_dram(problem(), Tiling(16, 16), 1000, 4) is None  # K_j, V_j and two Q_i over the capacity


def test_lockstep_hits_counts_the_positions_whose_distance_fits():
    # a + b·p <= 10 for p in 0..4: b = 3, a = 1 -> p <= 3 (4 hits); b = −3, a = 16 -> p >= 2 (3); b = 0: all or none
    got = lockstep_hits([1, 16, 10, 11, 20], [3, -3, 0, 0, 5], 5, 10)
    assert got.tolist() == [4, 3, 5, 0, 0], got


@pytest.mark.parametrize("algo", [SWAPPED, FLASH], ids=lambda k: k.name)
@given(bh=st.integers(1, 9), n_q=st.integers(1, 200), n_k=st.integers(1, 200), d=st.sampled_from([8, 12, 16]),
       Br=st.sampled_from([8, 16, 32]), Bc=st.sampled_from([8, 16, 32]), concurrent=st.integers(1, 12),
       capacity=st.integers(100, 60_000), dtype=st.sampled_from(["float32", "float16"]))
def test_the_closed_form_equals_the_simulated_L2_on_its_domain(algo, bh, n_q, n_k, d, Br, Bc, concurrent, capacity,
                                                                dtype):
    # reads, writes during the kernel and dirty bytes at the end, per tensor; float16 adds flash's cast output
    pb, tiling = problem(bh, n_q, n_k, d, dtype), Tiling(Br, Bc)
    form = algo.forward_dram(pb, tiling, capacity, concurrent)
    assume(form is not None)  # None: a tile larger than the L2, outside the domain
    config = L2Config(capacity, concurrent)
    g = grid(algo, pb, tiling)
    assert form.counts(g.tiles, config) == simulate(g, config)


def test_flash_closed_form_rereads_Q_O_l_m_per_KV_block_when_the_heads_outgrow_the_L2():
    # 4 heads at once, T_r = 4 query blocks of 16 rows, T_c = 4, d = 8, float32: a head's Q, O, ℓ, m are
    # S = 4·(512 + 512 + 64 + 64) = 4,608 B and K_j + V_j 1,024 B, so Q_i's reuse at (j, i) lies 4 heads ×
    # (S + 1,024 B) = 22,528 B after its use at (j−1, i): every tile moves once at 10 MB, and at 8 KB Q_i and
    # O_i are read at each of the 4 K/V blocks (O_i: not at line 3, whose zeros are whole sectors).
    pb, tiling = problem(4, 64, 64, 8), Tiling(16, 16)
    roomy, tight = FLASH.forward_dram(pb, tiling, 10**7, 4), FLASH.forward_dram(pb, tiling, 8192, 4)
    q = 4 * 64 * 8 * 4  # Q (= O) of the 4 heads
    assert (roomy.reads["Q"], roomy.reads.get("O", 0), roomy.written["O"]) == (q, 0, q), roomy
    assert (tight.reads["Q"], tight.reads["O"]) == (4 * q, 4 * q), tight
    # O written by line 3 and by each of the 4 steps, evicted in between; at the end, less than the L2 stays
    assert tight.written["O"] == 5 * q and tight.dirty_at_end["O"] < 8192, tight
    assert tight.written["lse"] == 2 * 4 * 64 * 4, tight  # line 3 and the last K/V block, evicted in between


def test_flash_closed_form_is_none_off_its_domain():
    assert FLASH.forward_dram(problem(causal=True), Tiling(16, 16), 10**6, 4) is None
    assert FLASH.forward_dram(problem(2, kv_heads=1), Tiling(16, 16), 10**6, 4) is None  # GQA: heads share K_j, V_j
    assert FLASH.forward_dram(problem(), Tiling(16, 16), 500, 4) is None  # O_i of 512 B over the L2


# call 1's kernels and today's (the defaults): the same grids, today's blocks per SM from the resource report
@pytest.mark.parametrize("algo", [FLASH, SWAPPED, KERNELS["flash"], KERNELS["flash-swapped"]], ids=lambda k: k.name)
@pytest.mark.parametrize("bh, n_q, n_k, d, Br, Bc, dtype, causal, kv_heads, capacity, blocks_per_sm", [
    (5, 113, 239, 8, 16, 32, "float32", False, None, 9_000, 1),  # both closed forms apply (flash: waves of 1, 4)
    (5, 113, 239, 8, 16, 32, "float16", False, None, 30_000, 2),
    (6, 64, 96, 12, 16, 16, "float32", True, None, 9_000, 1),  # causal: the simulation
    (4, 96, 64, 8, 32, 16, "float32", False, 2, 9_000, 1),  # GQA: the simulation
])
def test_dram_counts_equals_the_simulation_whichever_path_it_takes(algo, bh, n_q, n_k, d, Br, Bc, dtype, causal,
                                                                   kv_heads, capacity, blocks_per_sm):
    pb, tiling = problem(bh, n_q, n_k, d, dtype, causal, kv_heads), Tiling(Br, Bc)
    # a tiny problem: the h100 preset's 132 SMs (call 1's kernels run on it alone) hold all 5 blocks at once; the
    # capacity override makes them contend
    hw = hardware("h100", l2_bytes=capacity, blocks_per_sm=blocks_per_sm)
    got = pass_counts(algo, Launch(pb, tiling), hw)
    assert got == simulated(algo, pb, tiling, hw), got


@pytest.mark.parametrize("gpu", ["a100", "t4", "gb10"])
def test_call_1s_kernels_run_on_the_h100_alone_whose_blocks_per_sm_they_hold(gpu):
    # call 1's kernels carry an H100 SM's blocks per SM (call1.py), which another compute capability does not give
    for kernel in (FLASH, SWAPPED):
        with pytest.raises(InputError, match="is built for the H100, H200 only"):
            pass_counts(kernel, Launch(problem(), Tiling(16, 16)), hardware(gpu))


def test_the_tensor_core_kernels_and_sdpa_s_flash_backend_are_refused_on_a_gpu_before_sm_80(capsys):
    # mma.sync.m16n8k16 on 16-bit data needs sm_80, and torch runs its flash backend on sm_80 to sm_121: the T4
    # (sm_75) runs neither, the A100 (sm_80) and the GB10 (sm_121) both
    for kernel in ("flash-swapped-tc", "sdpa-flash"):
        kw = dict(N=1024, d=64, M="100k", heads=4, kernel=kernel)
        with pytest.raises(InputError, match=rf"the T4 preset: kernel='{kernel}' is built for the A100, H100, H200, "
                                             rf"B200, GB10 only"):
            iosim.dram("flash-swapped", gpu="t4", **kw)
        for gpu in ("a100", "gb10"):
            assert iosim.dram("flash-swapped", gpu=gpu, **kw).dram.reads > 0
        assert main(["sweep", "--gpu", "t4", "--kernel", kernel, "--N", "1024", "--d", "64",
                     "--algo", "flash-swapped"]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert f"kernel='{kernel}' is built for the A100" in line


@given(bh=st.integers(1, 9), n_q=st.integers(1, 160), n_k=st.integers(1, 160), d=st.sampled_from([8, 12, 16]),
       Br=st.sampled_from([8, 16, 32]), Bc=st.sampled_from([8, 16, 32]), concurrent=st.integers(1, 12),
       capacity=st.integers(100, 60_000), dtype=st.sampled_from(["float32", "float16"]), causal=st.booleans())
def test_lockstep_equals_the_simulated_L2_on_a_uniform_grid(bh, n_q, n_k, d, Br, Bc, concurrent, capacity, dtype,
                                                            causal):
    # flash's blocks, causal or not, make the same steps on their own head's tiles
    g = grid(FLASH, problem(bh, n_q, n_k, d, dtype, causal), Tiling(Br, Bc))
    config = L2Config(capacity, concurrent)
    got = lockstep(g, config)
    assume(got is not None)  # None: a tile larger than the L2
    assert got == simulate(g, config), got


# one block's steps: each of up to three accesses to distinct tiles of its own (tensor, index), each tile of its own
# whole sectors; some steps empty, at the start, between and at the end, as a block that skips a masked tile makes none
OWN_STEPS = st.lists(st.lists(st.tuples(st.sampled_from("ABC"), st.integers(0, 5),
                                        st.sampled_from([READ, WRITE, READ | WRITE])),
                              max_size=3, unique_by=lambda a: a[:2]), max_size=12)
TILE_SECTORS = st.lists(st.integers(1, 8), min_size=18, max_size=18)  # by (tensor, index)


@given(OWN_STEPS, TILE_SECTORS, st.integers(1, 9), st.integers(1, 6), st.integers(1, 40))
def test_lockstep_equals_the_simulated_L2_on_equal_blocks_with_empty_steps(steps, tile_sectors, blocks, concurrent,
                                                                          sectors):
    # the stack distances are taken step by step: a step without accesses still takes its round in the schedule
    def block(b):
        return iter([tuple(TILES.access(t, b * 6 + i, 32 * tile_sectors[6 * "ABC".index(t) + i], mode)
                           for t, i, mode in step) for step in steps])

    g = Grid(blocks, block, TILES, 1, uniform=True)
    config = L2Config(32 * sectors, concurrent)
    got = lockstep(g, config)
    assume(got is not None)  # a tile larger than the L2, or one written and later only read
    assert got == simulate(g, config), got


def test_lockstep_declines_a_step_that_touches_a_tile_twice_or_a_tile_at_two_sizes():
    # the stack distances hold one size per tile and one touch per step; the simulation answers the others
    twice = [(TILES.access("A", 0, 64, READ), TILES.access("A", 0, 64, READ))]
    resized = [(TILES.access("A", 0, 64, READ),), (TILES.access("A", 0, 32, READ),)]
    for steps in (twice, resized):
        assert lockstep(Grid(2, lambda b: iter(steps), TILES, 1, uniform=True), L2Config(1024, 2)) is None


def test_lockstep_declines_what_it_cannot_count_and_grids_declare_uniformity():
    assert lockstep(grid(FLASH, problem(), Tiling(16, 16)), L2Config(500, 4)) is None  # O_i of 512 B over 500 B
    # a tile written, then only read: its dirty copy outlives the access, which the counting does not follow
    steps = [(TILES.access("A", 0, 64, WRITE),), (TILES.access("A", 0, 64, READ),)]
    assert lockstep(Grid(2, lambda b: iter(steps), TILES, 1, uniform=True), L2Config(1024, 2)) is None
    assert grid(FLASH, problem(4), Tiling(16, 16)).uniform
    assert not grid(FLASH, problem(4, kv_heads=2), Tiling(16, 16)).uniform  # GQA: heads share K_j, V_j
    assert not grid(SWAPPED, problem(4), Tiling(16, 16)).uniform  # the query blocks of a head share K_j, V_j


@pytest.mark.parametrize("option, message", [
    (dict(has_mask=True), "explicit, block-sparse or FlexAttention block mask"),
    (dict(window=iosim.Band(16, 0)), r"window=\(16, 0\)"),
    (dict(page_size=16), "page_size=16"),
    (dict(seqlens=(64, 30)), "seqlens"),
])
def test_options_no_kernel_takes_are_refused_by_name_before_any_grid(option, message):
    pb = dataclasses.replace(problem(), **option)
    # every kernel described (the defaults of flash, flash-swapped and split-kv among them), each pass it has
    runs = [(k, backward) for k in KERNELS.values() for backward in ((False, True) if k.backward else (False,))]
    assert {(k.name, b) for k, b in runs} >= {("flash", False), ("flash-swapped", False), ("split-kv", False),
                                              ("flash", True), ("flash-swapped", True)}
    for kernel, backward in runs:
        with pytest.raises(InputError, match=message):
            kernel.grids(Launch(pb, Tiling(16, 16), backward))
