"""The description of FlashAttention-3 (``kernel="fa3"``, iosim/gpu/grids/fa3.py and fa3_backward.py): its tiles and
its schedulers' orders against FlashAttention-3's source worked by hand, its static order held equal to the persistent
CTAs it stands for, its closed forms to the simulation, its compulsory bytes (FP8, two head sizes, the backward's
padded buffers) to sizes worked by hand, and its refusals."""

from __future__ import annotations

import json
from itertools import chain

import pytest

import iosim
from iosim.cli import main
from iosim.core.errors import InputError
from iosim.core.problem import AttentionShape, Problem
from iosim.core.tiling import Tiling
from iosim.gpu.grids import fa3, fa3_backward
from iosim.gpu.kernel import Launch
from iosim.gpu.kernels import KERNELS
from iosim.gpu.l2 import Grid, L2Config, sectors
from iosim.gpu.schedule import simulate

FA3 = KERNELS["fa3"]
MB = 1024 * 1024


def problem(batch=1, heads=1, n=256, n_k=None, d=64, d_v=None, causal=False, kv_heads=None, dtype="float16"):
    return Problem(AttentionShape(batch, heads, n, n if n_k is None else n_k, d, kv_heads=kv_heads, d_v=d_v),
                   tau=1.0, dtype=dtype, causal=causal)


@pytest.mark.parametrize("d, d_v, dtype, causal, tile", [
    (64, None, "float16", False, (192, 192)), (64, None, "float16", True, (192, 128)),
    (128, None, "bfloat16", False, (128, 176)), (128, None, "float16", True, (128, 128)),
    (80, None, "float16", False, (192, 144)),  # rounded to 96
    (192, 128, "bfloat16", False, (128, 128)), (256, None, "float16", False, (128, 80)),
    (64, 512, "float16", False, (64, 64)),
    (64, None, "float8_e4m3", False, (192, 160)), (128, None, "float8_e4m3", True, (128, 224)),
    (192, 128, "float8_e4m3", False, (128, 160)),
])
def test_the_tile_is_tile_size_fwd_sm90_s_at_the_rounded_head_sizes(d, d_v, dtype, causal, tile):
    t = fa3.tile(problem(d=d, d_v=d_v, dtype=dtype, causal=causal), backward=False)
    assert (t.Br, t.Bc) == tile


def persistent_ctas(grid: Grid, ctas: int) -> Grid:
    """The static scheduler as FlashAttention-3 runs it: CTA c takes tiles c, c + ctas, … of ``grid``'s order."""
    return Grid(min(ctas, grid.blocks), lambda c: chain.from_iterable(grid.steps(t) for t in range(c, grid.blocks,
                                                                                                   ctas)),
                grid.tiles, 1)


@pytest.mark.parametrize("pb", [problem(heads=3, n=300, d=16), problem(batch=2, heads=4, kv_heads=2, n=384, d=32),
                                problem(heads=2, n=130, n_k=400, d=16, dtype="float8_e4m3"),
                                problem(heads=3, n=250, d=24, d_v=16)], ids=["ragged", "gqa", "fp8", "d_v"])
@pytest.mark.parametrize("capacity", [20_000, 200_000, 10**9])
def test_without_a_mask_the_dispatched_order_moves_what_the_static_persistent_ctas_move(pb, capacity):
    tiling, ctas = Tiling(32, 48), 5
    (grid,) = FA3.launches(Launch(pb, tiling, sms=ctas))
    config = L2Config(capacity, ctas)
    assert simulate(persistent_ctas(grid, ctas), config) == simulate(grid, config)


def test_the_causal_order_takes_sections_of_swizzle_heads_head_fastest_and_query_blocks_last_first():
    # 3 batch·heads of 2 query blocks with sections of 2: section 0 holds heads 0, 1, section 1 (the remainder) head 2
    pb = problem(batch=1, heads=3, n=256, causal=True)
    order = fa3.causal_order(pb, Tiling(128, 128))
    assert fa3.swizzle(pb) > 3  # one head's K and V are 64 KB: every head fits in one section of 32 MB
    assert [order(t) for t in range(6)] == [(0, 1), (1, 1), (2, 1), (0, 0), (1, 0), (2, 0)]
    many = problem(batch=2, heads=2, n=8192, d=128, causal=True)  # 4 MB of K and V a head: sections of 8
    assert fa3.swizzle(many) == 8
    big = problem(batch=1, heads=3, n=65536 * 3, d=128, causal=True)  # 96 MB a head: sections of one head
    assert fa3.swizzle(big) == 1
    order = fa3.causal_order(big, Tiling(128, 128))
    assert [order(t) for t in (0, 1, 1535, 1536)] == [(0, 1535), (0, 1534), (0, 0), (1, 1535)]
    grouped = problem(heads=8, kv_heads=2, n=65536, d=128, causal=True)  # 32 MB a K/V head, 4 query heads each
    assert fa3.swizzle(grouped) == 4


def test_the_causal_order_is_every_tile_once():
    pb = problem(batch=3, heads=5, kv_heads=1, n=700, d=64, causal=True)
    tiling = fa3.tile(pb, backward=False)
    Tm = -(-700 // tiling.Br)
    order = fa3.causal_order(pb, tiling)
    assert sorted(order(t) for t in range(15 * Tm)) == [(bh, i) for bh in range(15) for i in range(Tm)]


@pytest.mark.parametrize("n, heads", [(768, 3), (1536, 200), (384, 1)])
def test_the_closed_form_equals_the_simulation_where_it_applies(n, heads):
    pb = problem(heads=heads, n=n, d=64)  # tiles of 192 × 192: key blocks all whole
    tiling = fa3.tile(pb, backward=False)
    (grid,) = FA3.launches(Launch(pb, tiling, sms=132))
    for capacity in (100_000, 2 * MB, 37 * MB):
        config = L2Config(capacity, 132)
        form = FA3.closed_form(Launch(pb, tiling))(pb, tiling, capacity, 132)
        assert form is not None
        assert form.counts(grid.tiles, config) == simulate(grid, config)


@pytest.mark.parametrize("dtype, d, d_v, causal", [("float8_e4m3", 128, None, False), ("float8_e4m3", 64, None, True),
                                                   ("bfloat16", 192, 128, False), ("float8_e4m3", 192, 128, True)])
def test_where_the_l2_holds_everything_dram_reads_the_inputs_once_and_writes_o_in_its_dtype(dtype, d, d_v, causal):
    batch, heads, n = 2, 66, 1000
    r = iosim.dram("flash-swapped", N=n, d=d, d_v=d_v, M="100k", batch=batch, heads=heads, dtype=dtype,
                   causal=causal, kernel="fa3", l2_bytes=10**9)
    d_v = d if d_v is None else d_v
    element = 1 if dtype.startswith("float8") else 2
    out = 2  # FP8's O is bfloat16
    Br = r.forward_tiling.Br
    bh, Tm = batch * heads, -(-n // Br)
    reads = {t.name: t.reads for t in r.dram.tensors}
    written = {t.name: t.writes + t.dirty_at_end for t in r.dram.tensors}
    blocks = [min(Br, n - i * Br) for i in range(Tm)]
    assert reads["Q"] == bh * sum(sectors(rows * d * element) for rows in blocks)
    kv_blocks = [min(r.forward_tiling.Bc, n - j * r.forward_tiling.Bc) for j in range(-(-n // r.forward_tiling.Bc))]
    assert reads["K"] == bh * sum(sectors(cols * d * element) for cols in kv_blocks)
    assert reads["V"] == bh * sum(sectors(cols * d_v * element) for cols in kv_blocks)
    assert reads.get("descale", 0) == (bh * 32 if element == 1 else 0)  # one sector of 3 float32 per K/V head
    assert written["O"] == bh * sum(sectors(rows * d_v * out) for rows in blocks)
    assert written["lse"] == bh * sum(sectors(rows * 4) for rows in blocks)


def test_splits_follow_num_splits_heuristic():
    t128 = Tiling(128, 176)
    # 8 query blocks < 0.8 × 132: split, 6 key blocks
    assert fa3.splits(problem(n=1024, d=128), t128, 132) > 1
    # 32 heads × 8 query blocks fill the SMs; one head's K and V are 0.5 MB: one split
    assert fa3.splits(problem(heads=32, n=1024, d=128), t128, 132) == 1
    # one head of N = 131,072 at d = 128: 64 MB of K and V > 50 MB, 1,024 query blocks >= 264: ⌈64 / 50⌉ = 2 splits,
    # but not under a causal mask
    long = problem(n=131072, d=128)
    assert fa3.splits(long, t128, 132) == 2
    assert fa3.splits(problem(n=131072, d=128, causal=True), Tiling(128, 128), 132) == 1
    with pytest.raises(InputError, match=r"splits K/V here \(2 splits"):
        iosim.dram("flash-swapped", N=131072, d=128, M="100k", kernel="fa3")


def test_what_it_does_not_describe_is_refused_by_name():
    kw = dict(N=4096, d=128, M="100k", heads=32, kernel="fa3")
    with pytest.raises(InputError, match=r"dtype='float32': FlashAttention-3 takes \['float16', 'bfloat16'\] \(mha_b"):
        iosim.dram("flash-swapped", pass_="bwd", dtype="float32", **kw)
    with pytest.raises(InputError, match=r"kv_heads=8 < heads=32 in the backward: FlashAttention-3 then adds dK"):
        fa3_backward.check(problem(heads=32, kv_heads=8))  # the algorithms' backward refuses it first
    with pytest.raises(InputError, match=r"d_v=260: FlashAttention-3's backward takes head sizes that are multiples"):
        iosim.dram("flash-swapped", pass_="bwd", d_v=260, **kw)
    with pytest.raises(InputError, match=r"dropout_p=0.1: FlashAttention-3 has no dropout"):
        fa3_backward.check(Problem(AttentionShape(1, 1, 64, 64, 64), tau=1.0, dtype="float16", dropout_p=0.1))
    with pytest.raises(InputError, match=r"dtype='float8_e5m2': FlashAttention-3 takes"):
        iosim.dram("flash-swapped", dtype="float8_e5m2", **kw)
    with pytest.raises(InputError, match=r"dtype='float32'"):
        iosim.dram("flash-swapped", dtype="float32", **kw)
    with pytest.raises(InputError, match=r"d=160, d_v=64"):
        iosim.dram("flash-swapped", **{**kw, "d": 160}, d_v=64)
    # 200 rows fill 78 % of two blocks of 128; a group of 4 heads packed, 800 rows, 89 % of 7
    with pytest.raises(InputError, match="PackGQA"):
        iosim.dram("flash-swapped", **{**kw, "N": 200}, kv_heads=8)
    with pytest.raises(InputError, match="sawtooth"):
        iosim.dram("flash-swapped", sawtooth=True, **kw)
    with pytest.raises(InputError, match=r"the A100 preset: kernel='fa3' is built for the H100, H200 only"):
        iosim.dram("flash-swapped", gpu="a100", **kw)
    with pytest.raises(InputError, match="schedule='timed'"):
        iosim.dram("flash-swapped", schedule="timed", **kw)


def test_fp8_and_two_head_sizes_are_taken_by_fa3_alone():
    for kernel, fp8 in (("flash-swapped", "this kernel has no FP8 build"), ("sdpa-flash", "takes 16-bit inputs")):
        with pytest.raises(InputError, match=fp8):
            iosim.dram("flash-swapped", N=4096, d=128, M="100k", heads=32, dtype="float8_e4m3", kernel=kernel)
        with pytest.raises(InputError, match="takes one head size"):
            iosim.dram("flash-swapped", N=4096, d=128, d_v=64, M="100k", heads=32, kernel=kernel)


def test_the_command_line_counts_fp8_on_it_and_refuses_a_gpu_it_is_not_built_for(tmp_path, capsys):
    path = tmp_path / "rows.json"
    argv = ["sweep", "--algo", "flash-swapped", "--N", "8192", "--d", "128", "--heads", "16", "--gpu", "h100",
            "--kernel", "fa3", "--dtype", "float8_e4m3", "--json", str(path)]
    assert main(argv) == 0
    (record,) = json.loads(path.read_text())
    # one head's K and V are 2 MB of FP8: the L2 holds them, so Q, K and V are read once, with one sector of
    # descales per head
    assert record["dram_read_bytes"] == 3 * 16 * 8192 * 128 + 16 * 32
    capsys.readouterr()
    assert main(argv[:10] + ["a100", "--kernel", "fa3"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "the A100 preset: kernel='fa3' is built for the H100, H200 only" in line


def test_the_kernel_s_tile_is_its_instantiation_s_and_the_host_s_rules_compare_as_c_plus_plus_does():
    # d = 64 with d_v = 128 runs run_mha_fwd's (64, 256) kernel: tile_size_fwd_sm90(64, 256) = 128 × 96, while the
    # host's split and PackGQA rules reason at the rounded (64, 128): 192 × 192
    pb = problem(d=64, d_v=128, dtype="bfloat16")
    assert (fa3.tile(pb, False).Br, fa3.tile(pb, False).Bc) == (128, 96)
    assert (fa3.host_tile(pb).Br, fa3.host_tile(pb).Bc) == (192, 192)
    # N_q = 576 in blocks of 128: 576/640 = 0.9 exactly of a group of 2 packed (1,152/1,280); in float32 against a
    # double 0.9 the plain efficiency is below: FA3 packs, and the description refuses
    with pytest.raises(InputError, match="PackGQA"):
        iosim.dram("flash-swapped", N=576, d=128, heads=24, kv_heads=12, M="100k", kernel="fa3", dtype="bfloat16")
    for kw, words in ((dict(d=100), "multiples of 8"), (dict(d=72, dtype="float8_e4m3"), "multiples of 16"),
                      (dict(d=64, d_v=128, dtype="float8_e4m3"), "FP8 build has a kernel with a V head size apart")):
        with pytest.raises(InputError, match=words):
            iosim.dram("flash-swapped", N=1024, heads=128, M="100k", kernel="fa3", **{"dtype": "bfloat16", **kw})


@pytest.mark.parametrize("d, d_v, causal, tile", [
    (64, None, False, (128, 128)), (64, None, True, (128, 128)), (96, None, True, (64, 128)),
    (128, None, False, (80, 128)), (128, None, True, (64, 128)), (192, None, False, (64, 96)),
    (256, None, True, (64, 80)), (64, 128, False, (80, 128)),  # max(d, d_v) rounds to 128
])
def test_the_backward_s_tile_is_run_mha_bwd_s_at_the_rounded_head_size(d, d_v, causal, tile):
    t = fa3.tile(problem(d=d, d_v=d_v, causal=causal), backward=True)
    assert (t.Br, t.Bc) == tile


def test_the_backward_s_causal_order_takes_sections_of_swizzle_heads_head_fastest_and_key_blocks_ascending():
    # Q, dO and dQ's accumulator of a head: 8,192 × 128 × (2 + 2 + 4) B = 8.4 MB: 4 heads to a section of 40 MB;
    # 2 batches of 3 heads: a section of 4, then one of the other 2; 3 key blocks of 128
    pb = problem(batch=2, heads=3, n=8192, n_k=384, d=128, causal=True)
    assert fa3_backward.swizzle(pb) == 4
    order = fa3_backward.lpt_order(pb, Tiling(64, 128))
    want = [(bh, j) for j in range(3) for bh in range(4)] + [(bh, j) for j in range(3) for bh in (4, 5)]
    assert [order(b) for b in range(18)] == want
    assert fa3_backward.swizzle(problem(n=131072, d=256, causal=True)) == 1  # one head over 40 MB


@pytest.mark.parametrize("causal", [False, True])
def test_where_the_l2_holds_everything_the_backward_moves_each_buffer_once_per_kernel(causal):
    # 2 heads of N = 1000 at d = 128: tiles of 80 (64 causal) rows by 128 keys; buffers padded to whole query blocks
    s = iosim.dram("flash-swapped", N=1000, d=128, heads=2, M="228KiB", kernel="fa3", pass_="bwd", causal=causal,
                   l2_bytes=10**9)
    Br = 64 if causal else 80
    rows = -(-1000 // Br) * Br
    data = 2 * 1000 * 128 * 2  # Q (or K, V, O, dO, dK, dV, dQ) of the two heads in float16
    got = {t.name: (t.reads, t.writes + t.dirty_at_end) for t in s.dram.tensors}
    # preprocess: O, dO, lse read; D, lse_log2, dQ's accumulator written over whole blocks; the main kernel reads Q,
    # K, V, dO, D, lse_log2 and adds into the accumulator; the postprocess reads it and writes dQ
    assert got["O"] == (data, 0) and got["K"] == got["V"] == (data, 0) and got["Q"] == (data, 0)
    assert got["dO"] == (2 * data, 0) and got["lse"] == (sectors(1000 * 4) * 2, 0)
    acc = 2 * rows * 128 * 4
    assert got["dQ"] == (2 * acc, 2 * acc)  # main kernel and postprocess read it; preprocess and main write it
    assert got["D"] == got["lse_log2"] == (2 * rows * 4, 2 * rows * 4)
    assert got["dK"] == got["dV"] == got["dQ_cast"] == (0, data)


def test_the_backward_main_kernel_s_grid_reads_k_v_once_then_each_query_block_it_sees():
    pb = problem(heads=1, n=300, n_k=256, d=64, causal=True)
    tiling = fa3.tile(pb, backward=True)
    pre, main_kernel, post = FA3.grids(Launch(pb, tiling, backward=True, sms=132))
    assert (pre.blocks, main_kernel.blocks, post.blocks) == (3, 2, 3) and main_kernel.per_sm(None) == 1
    # bottom-right causal: key block 0 (keys 0-127) is seen from query 44 (block 0) on, key block 1 from 172 (block 1)
    first = [list(main_kernel.steps(b)) for b in range(2)]
    assert [len(steps) for steps in first] == [3, 2]
    tensors = [[main_kernel.tiles.tensor(k) for k, _, _ in step] for step in first[1]]
    assert tensors == [["K", "V", "Q", "lse_log2", "dO", "D", "dQ"], ["Q", "lse_log2", "dO", "D", "dQ", "dV", "dK"]]
