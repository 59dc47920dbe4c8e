"""The description of torch SDPA's flash backend (``kernel="sdpa-flash"``, iosim/gpu/grids/sdpa_flash.py): its grids
read tile by tile against the order FlashAttention-2's source gives, its closed form held equal to the simulation,
its split rule against hand-worked cases, its compulsory bytes against sizes worked by hand, and its refusals."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_l2_cohorts import block_by_block

import iosim
from iosim.core.errors import InputError
from iosim.core.gpus import GPUS
from iosim.core.problem import AttentionShape, Problem
from iosim.core.tiling import Tiling
from iosim.gpu.dram import code_reads
from iosim.gpu.grids import sdpa_flash
from iosim.gpu.kernel import Launch
from iosim.gpu.kernels import KERNELS
from iosim.gpu.l2 import CODE, L2Config
from iosim.gpu.lockstep import lockstep
from iosim.gpu.schedule import simulate

SDPA = KERNELS["sdpa-flash"]


def problem(batch=1, heads=1, n=256, n_k=None, d=64, causal=False, kv_heads=None, dtype="float16") -> Problem:
    return Problem(AttentionShape(batch, heads, n, n if n_k is None else n_k, d, kv_heads=kv_heads), tau=1.0,
                   dtype=dtype, causal=causal)


def readable(grid, b: int) -> list[list[tuple[str, int, int]]]:
    """Block b's steps as (tensor, tile index, bytes rounded up to 32-byte sectors) per access."""
    names = grid.tiles.tensors
    return [[(names[key % len(names)], key // len(names), nbytes) for key, nbytes, _ in step] for step in grid.steps(b)]


def test_the_forward_launches_query_blocks_fastest_then_batch_then_head_and_scans_keys_downwards():
    # N = 300 at d = 64: tiles of 128 × 128, so query blocks of 128, 128, 44 rows and key blocks likewise; causal
    pb = problem(batch=2, heads=2, n=300, causal=True)
    (g,) = SDPA.grids(Launch(pb, Tiling(1, 1), sms=1))  # its own tile whatever it is asked; sms=1: no split
    assert g.blocks == 2 * 2 * 3
    q, kv, o = 128 * 64 * 2, 128 * 64 * 2, 128 * 64 * 2
    # block 5 is query block 2 of the second (batch, head) pair launched: batch 1, head 0, batch·head 2 (tile 2·3 + 2)
    assert readable(g, 5) == [
        [("Q", 8, 44 * 64 * 2), ("K", 2 * 3 + 2, 44 * 64 * 2), ("V", 2 * 3 + 2, 44 * 64 * 2)],
        [("K", 7, kv), ("V", 7, kv)],
        [("K", 6, kv), ("V", 6, kv), ("O", 8, 44 * 64 * 2), ("lse", 8, 192)]]  # 176 B in sectors
    # block 6 is query block 0 of batch 0, head 1 (batch·head 1): it sees key block 0 only
    assert readable(g, 6) == [[("Q", 3, q), ("K", 3, kv), ("V", 3, kv), ("O", 3, o), ("lse", 3, 128 * 4)]]


def test_grouped_heads_read_their_group_s_kv_head_in_launch_order():
    # heads 4 over 2 K/V heads, batch 2: the pair launched n-th is (batch n mod 2, head n // 2), K/V head head // 2
    pb = problem(batch=2, heads=4, n=128, kv_heads=2)
    (g,) = SDPA.grids(Launch(pb, Tiling(128, 128), sms=1))
    kv_of = [readable(g, n)[0][1][1] for n in range(8)]
    assert kv_of == [0, 2, 0, 2, 1, 3, 1, 3]


def test_the_backward_launches_three_kernels_with_key_blocks_scanning_query_blocks_downwards():
    # d = 128: backward tile 64 queries × 128 keys; N = 200 → query blocks 64, 64, 64, 8; key blocks 128, 72; causal
    pb = problem(n=200, d=128, causal=True)
    dot, main, convert = SDPA.grids(Launch(pb, Tiling(7, 7), backward=True, sms=1))
    assert (dot.blocks, main.blocks, convert.blocks) == (4, 2, 4)
    full = 64  # D and dQ's accumulator are read and written over all kBlockM rows
    assert readable(dot, 3) == [[("dO", 3, 8 * 128 * 2), ("O", 3, 8 * 128 * 2), ("D", 3, full * 4),
                                 ("dQ", 3, full * 128 * 4)]]
    assert readable(convert, 3) == [[("dQ", 3, full * 128 * 4), ("dQ_cast", 3, 8 * 128 * 2)]]

    def query(i, rows):
        return [("Q", i, rows * 256), ("dO", i, rows * 256), ("lse", i, rows * 4), ("D", i, full * 4),
                ("dQ", i, full * 128 * 4)]

    # key block 1 (keys 128 to 199) is seen by queries 128 on: query blocks 2 and 3, last first
    assert readable(main, 1) == [
        [("K", 1, 72 * 256), ("V", 1, 72 * 256)] + query(3, 8),
        query(2, 64) + [("dK", 1, 72 * 256), ("dV", 1, 72 * 256)]]
    assert [step[2][1] for step in readable(main, 0)] == [3, 2, 1, 0]  # key block 0: every query block, downwards


@pytest.mark.parametrize("batch, heads, n, n_k, d, capacity, concurrent", [
    (1, 8, 1024, 1024, 64, 1_000_000, 16), (2, 5, 700, 512, 64, 400_000, 9), (1, 3, 300, 128, 128, 100_000, 4),
    (3, 4, 2048, 1024, 128, 2_000_000, 33), (1, 2, 129, 64, 128, 120_000, 1)])
def test_the_forward_closed_form_equals_the_simulation(batch, heads, n, n_k, d, capacity, concurrent):
    pb = problem(batch=batch, heads=heads, n=n, n_k=n_k, d=d)
    tiling = sdpa_flash.tile(pb, False)
    (g,) = SDPA.grids(Launch(pb, tiling, sms=1))
    config = L2Config(capacity, concurrent)
    form = sdpa_flash.forward_dram(pb, tiling, capacity, concurrent)
    assert form is not None
    assert form.counts(g.tiles, config) == simulate(g, config)


def test_the_forward_has_no_closed_form_where_the_downward_scan_meets_a_ragged_key_block():
    pb = problem(n=256, n_k=300)
    assert sdpa_flash.forward_dram(pb, sdpa_flash.tile(pb, False), 10**6, 8) is None


@pytest.mark.parametrize("causal", [False, True])
def test_the_grids_count_the_same_as_cohorts_and_block_by_block(causal):
    pb = problem(batch=2, heads=3, n=600, n_k=600 if causal else 500, d=64, causal=causal)
    for backward in (False, True):
        for g in SDPA.grids(Launch(pb, Tiling(1, 1), backward=backward, sms=1)):
            for config in (L2Config(300_000, 5), L2Config(900_000, 12)):
                assert simulate(g, config) == simulate(block_by_block(g), config)
            if g.uniform:
                assert lockstep(g, L2Config(300_000, 5)) == simulate(g, L2Config(300_000, 5))


def test_an_l2_that_holds_everything_reads_each_tile_once_per_kernel():
    # batch·heads 256, N = 4096, d = 64, float16: every K/V and Q tile read once in the forward; the backward's dot
    # kernel reads dO and O, its main kernel Q, dO, lse, D and dQ's accumulator, its convert the accumulator, once
    r = iosim.dram("flash-swapped", N=4096, d=64, M="228KiB", heads=256, kernel="sdpa-flash", pass_="fwd+bwd",
                   l2_bytes=10**12)
    x = 256 * 4096 * 64 * 2  # one 16-bit N × d tensor of every batch·head
    stat = 256 * 4096 * 4
    reads = {t.name: t.reads for t in r.dram.tensors}
    code = reads.pop(CODE)  # the four kernels' code, once per launch
    assert reads == {"Q": 2 * x, "K": 2 * x, "V": 2 * x, "O": x, "dO": 2 * x, "lse": stat, "D": stat,
                     "dQ": 2 * 2 * x, "dK": 0, "dV": 0, "dQ_cast": 0}
    assert code == code_reads(SDPA, Launch(r.problem, r.forward_tiling, sms=132)) + code_reads(
        SDPA, Launch(r.problem, r.backward_tiling, backward=True, sms=132))
    assert (r.forward_tiling, r.backward_tiling) == (Tiling(128, 128), Tiling(128, 128))


@pytest.mark.parametrize("bh, n, d, splits", [
    # ⌈N/64⌉·bh ≥ 0.8 · 2 · 132 = 211.2: one split
    (4, 4096, 64, 1), (256, 4096, 128, 1),
    # 16 query blocks of 64, 4 key blocks of 256: splits 1, 2, 4 eligible (3 gives 2 blocks a split, as 2 does);
    # waves 16·s/264 are all under one, so efficiency grows with s: 4 (0.242) is best and the first ≥ 0.85 of it
    (1, 1024, 64, 4),
    # 192 query blocks, 16 key blocks of 256: efficiency 0.727 at s = 1 to 3, 0.970 at 4 (and at 8 and 16; 11 splits
    # would fill 8 waves exactly, but give 2 key blocks a split as 8 do: not eligible); 4 is the first within 0.85
    (3, 4096, 64, 4),
    # one key block: at most one split
    (1, 64, 64, 1),
])
def test_torch_s_split_choice_follows_the_heuristic(bh, n, d, splits):
    assert sdpa_flash.forward_splits(AttentionShape(1, bh, n, n, d), 132) == splits


def test_refusals_name_what_the_description_does_not_cover():
    def ask(**kw):
        args = dict(N=4096, d=64, M="228KiB", heads=256, kernel="sdpa-flash") | kw
        return iosim.dram("flash-swapped", **args)

    with pytest.raises(InputError, match="dtype='float32'"):
        ask(dtype="float32")
    with pytest.raises(InputError, match="d=96"):
        ask(d=96)
    with pytest.raises(InputError, match=r"tiling=\(64, 64\).*\(128, 128\)"):
        ask(tiling=iosim.Tiling(64, 64))
    with pytest.raises(InputError, match="dropout_p=0.1"):
        SDPA.grids(Launch(Problem(AttentionShape(1, 1, 128, 128, 64), tau=1.0, dropout_p=0.1), Tiling(1, 1), sms=1))
    with pytest.raises(InputError, match="implements 'flash-swapped'"):
        iosim.dram("flash", N=4096, d=64, M="228KiB", heads=256, kernel="sdpa-flash")
    # torch runs no flash kernel for a non-square causal mask, and decodes grouped heads as one head of G rows
    with pytest.raises(InputError, match="causal with N_q=4,096 ≠ N_k=8,192"):
        ask(N_k=8192, causal=True)
    with pytest.raises(InputError, match="N_q=1 with heads=32 over kv_heads=8"):
        ask(N=1, N_k=8192, heads=32, kv_heads=8, batch=64)
    # torch sums dK, dV over each group after the kernels: a grouped backward is not this description's
    with pytest.raises(InputError, match="kv_heads=2 < heads=4 in the backward"):
        SDPA.grids(Launch(problem(heads=4, kv_heads=2), Tiling(1, 1), backward=True, sms=1))


def test_the_command_line_takes_the_kernel_and_refuses_a_tiling_search_for_it(capsys):
    from iosim.cli import main

    assert main(["sweep", "--gpu", "h100", "--N", "4096", "--d", "64", "--heads", "256", "--algo", "flash-swapped",
                 "--kernel", "sdpa-flash"]) == 0
    assert "sdpa-flash's DRAM bytes at the tiles the kernel launches" in " ".join(capsys.readouterr().out.split())
    assert main(["optimize", "--gpu", "h100", "--N", "4096", "--d", "64", "--algo", "flash-swapped",
                 "--kernel", "sdpa-flash", "--objective", "dram"]) == 2
    assert "launches its own tile" in capsys.readouterr().err


def test_the_sdpa_ncu_grid_asks_only_shapes_torch_runs_unsplit_at_the_description_s_tiles():
    from experiments import ncu_traffic

    rows = ncu_traffic.call3_sdpa_grid()
    forward = [c for c in rows if c.direction == "forward"]
    assert forward and all(sdpa_flash.forward_splits(AttentionShape(c.batch, c.heads, c.n_q, c.n_k, c.d), 132) == 1
                           for c in forward)
    for c in rows:
        pb = problem(c.batch, c.heads, c.n_q, c.n_k, c.d, c.causal, dtype=c.dtype)
        own = sdpa_flash.tile(pb, c.direction == "backward")
        assert c.tile() == {"Br": own.Br, "Bc": own.Bc}
    # torch's kernels come built: one profiled process per direction, not per build
    assert [len(g) for g in ncu_traffic.kernel_groups(rows)] == [len(forward), len(rows) - len(forward)]


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 3), heads=st.integers(1, 4), q_blocks=st.integers(1, 9), k_blocks=st.integers(1, 6),
       q_ragged=st.integers(0, 127), d=st.sampled_from([64, 128]), capacity=st.integers(40_000, 3_000_000),
       concurrent=st.integers(1, 40))
def test_the_forward_closed_form_equals_the_simulation_over_random_shapes(batch, heads, q_blocks, k_blocks, q_ragged,
                                                                          d, capacity, concurrent):
    # key blocks whole (the closed form's domain); query blocks may end ragged
    Br, Bc = sdpa_flash.FORWARD_TILE[d]
    n, n_k = max(1, q_blocks * Br - q_ragged), k_blocks * Bc
    pb = problem(batch=batch, heads=heads, n=n, n_k=n_k, d=d)
    tiling = sdpa_flash.tile(pb, False)
    g = sdpa_flash.forward(pb, tiling, 2)  # the grid itself: whether torch would split K/V here is beside the point
    config = L2Config(capacity, concurrent)
    form = sdpa_flash.forward_dram(pb, tiling, capacity, concurrent)
    assume(form is not None)  # a tile larger than the L2 goes around it: no closed form
    assert form.counts(g.tiles, config) == simulate(g, config)


def test_the_occupancy_is_that_of_torch_s_sm90_binary():
    # every instantiation the description launches is in the file read from torch's libtorch_cuda.so
    for dtype in ("float16", "bfloat16"):
        for d in (64, 128):
            for causal in (False, True):
                for n in (4096, 4096 + 1):  # key and query blocks even, and ragged
                    pb = problem(n=n, d=d, causal=causal, dtype=dtype)
                    assert sdpa_flash.forward_bound(pb, sdpa_flash.tile(pb, False)).registers == 255
                    dot, main, convert = sdpa_flash.backward_bounds(pb, sdpa_flash.tile(pb, True))
                    assert main.registers == 255 and 32 <= dot.registers <= 64 and convert.registers in (64, 72)
    pb = problem(n=4096, d=128)
    dot, main, convert = sdpa_flash.backward_bounds(pb, sdpa_flash.tile(pb, True))
    h100 = GPUS["h100"]
    # 51 registers (dot_do_o clearing dQ's accumulator, float16, d = 128) × 256 threads: 14,336 of 65,536 a block, 4
    # blocks; convert_dq's 72: 18,432, 3 blocks; the forward's 255 × 128 threads, 2
    assert (dot.registers, dot.on(h100), convert.registers, convert.on(h100)) == (51, 4, 72, 3)
    assert sdpa_flash.forward_bound(pb, sdpa_flash.tile(pb, False)).on(h100) == 2
    with pytest.raises(ValueError, match="has no flash_fwd_kernel at d=96"):
        sdpa_flash.built("flash_fwd_kernel", problem(d=96), Tiling(128, 64))


def test_where_torch_splits_k_v_its_split_kernel_and_combine_run_at_their_own_tile():
    # 1 head of N_q = 300 against N_k = 1,200 at d = 64: 5 query blocks of 64 < 211, so torch splits; key blocks of
    # 256: 5, in splits of ⌈5/S⌉
    pb = problem(n=300, n_k=1200, d=64)
    splits = sdpa_flash.forward_splits(pb.shape, 132)
    assert splits == 5
    assert (sdpa_flash.tile(pb, False, 132).Br, sdpa_flash.tile(pb, False, 132).Bc) == (64, 256)
    split, merge = SDPA.grids(Launch(pb, Tiling(1, 1), sms=132))
    assert split.blocks == 5 * splits and merge.blocks == 300 // 8 + 1
    # block (i, s) = (2, 3): query block 2 of split 3, whose one key block is 3 (keys 768 … 1,023)
    steps = readable(split, 3 * 5 + 2)
    assert [(name, index) for name, index, _ in steps[0][:3]] == [("Q", 2), ("K", 3), ("V", 3)]
    rows = [x for x in steps[-1] if x[0] == "O_accum"]
    assert [index for _, index, _ in rows] == [3 * 300 + 128 + r for r in range(64)]  # its 64 rows of split 3
    assert all(nbytes == 64 * 4 for _, _, nbytes in rows)
    # the combine's block 0 reads rows 0 … 7 of every split and writes their O and lse
    (combine_step,) = readable(merge, 0)
    assert sorted({index // 300 for name, index, _ in combine_step if name == "O_accum"}) == list(range(splits))
    assert ("O", 0, 8 * 64 * 2) in combine_step and ("lse", 0, 32) in combine_step


@pytest.mark.parametrize("n_q, n_k, d, heads, causal", [(300, 1200, 64, 1, False), (1, 8192, 128, 32, False),
                                                         (1024, 1024, 64, 4, True), (200, 200, 128, 2, True)])
def test_the_split_kernels_read_their_inputs_once_where_the_l2_holds_them_and_pass_the_partials_through_it(
        n_q, n_k, d, heads, causal):
    pb = problem(heads=heads, n=n_q, n_k=n_k, d=d, causal=causal)
    splits = sdpa_flash.forward_splits(pb.shape, 132)
    assert splits > 1
    r = iosim.dram("flash-swapped", N=n_q, N_k=n_k, d=d, heads=heads, causal=causal, M="228KiB", kernel="sdpa-flash",
                   l2_bytes=10**9)
    by = {t.name: t for t in r.dram.tensors}
    assert by["Q"].reads == heads * n_q * d * 2 and by["K"].reads == by["V"].reads == heads * n_k * d * 2
    # every split's partial rows written by the split kernel, and read back by the combine (from a cold L2)
    partial = splits * heads * n_q * d * 4
    assert by["O_accum"].writes + by["O_accum"].dirty_at_end == by["O_accum"].reads == partial
    assert by["O"].writes + by["O"].dirty_at_end == heads * n_q * d * 2
    # the grids count what the schedule run block by block counts: the cohorts change nothing
    for grid in SDPA.grids(Launch(pb, sdpa_flash.tile(pb, False, 132), sms=132)):
        config = L2Config(2_000_000, 264)
        assert simulate(grid, config) == simulate(block_by_block(grid), config)


def test_the_split_kernels_occupancy_is_that_of_torch_s_binary():
    pb = problem(n=1, n_k=8192, d=128)
    split, merge = sdpa_flash.split_bounds(pb, Tiling(64, 128), 7)
    assert split.registers == 246 and split.on(GPUS["h100"]) == 2  # the unmasked, even-K, ragged-M split build
    assert merge.registers == 52 and merge.block_bytes == 8 * 5 * 4  # built for up to 8 splits, 4 rows


def test_the_split_rule_compares_float32_efficiencies_with_a_double_0_85_of_the_best():
    # 11 heads of one query against 12,800 keys of d = 128: 100 key blocks of 128. The efficiency at 17 splits,
    # 0.70833331 in float32, is just under 0.85 × the best (0.70833332 in double), so C++ skips it and takes 20
    assert sdpa_flash.forward_splits(AttentionShape(1, 11, 1, 12800, 128), 132) == 20
