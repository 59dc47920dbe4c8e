"""The closed form of heads in lockstep waves (iosim.gpu.head_waves) equals the simulation (iosim.gpu.schedule): on
random grids of heads, blocks, steps, sizes, modes, capacities and waves, on the backward's main kernels (flash-swapped,
flash-swapped-tc, SDPA's, FlashAttention-3's), and on flash-swapped's forward, where it equals that kernel's own closed
form too; and the DRAM level takes it."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iosim.core.problem import AttentionShape, Problem
from iosim.core.tiling import Tiling
from iosim.gpu import head_waves, schedule
from iosim.gpu.dram import pass_counts
from iosim.gpu.grids import fa3_backward, flash_swapped, flash_swapped_tc, sdpa_flash
from iosim.gpu.hardware import hardware
from iosim.gpu.kernel import Launch
from iosim.gpu.kernels import KERNELS
from iosim.gpu.l2 import READ, READ_WRITE, WRITE, Grid, L2Config, SharedSteps, Tiles
from iosim.gpu.schedule import simulate

TENSORS = ("A1", "A2", "S1", "S2", "S3", "Z1", "Z2")
TILES = Tiles(TENSORS)


def as_grid(hw: head_waves.HeadWaves) -> Grid:
    """The grid a ``HeadWaves`` describes, written out: block h·T + t reads its own head tiles with step 0, its head's
    shared tiles at every step (one object per step for the head's blocks), and its own tail tiles with the last."""
    T, n = hw.per_head, len(hw.shared)

    def keyed(tiles, index):
        return tuple(TILES.access(tensor, index, x, mode)[:1] + (x, mode) for tensor, x, mode in tiles)

    shared = {}

    def steps(b: int):
        h, t = divmod(b, T)
        if h not in shared:
            shared[h] = [keyed(hw.shared[r], h * n + r) for r in range(n)]
        head, tail, S = keyed(hw.head[t], b), keyed(hw.tail[t], b), shared[h]
        if n == 1:
            return iter((head + S[0] + tail,))
        return SharedSteps((head + S[0],), S, 1, n - 1, (S[n - 1] + tail,))

    return Grid(hw.heads * T, steps, TILES, 1)


SIZE = st.integers(1, 8).map(lambda k: 32 * k)


@st.composite
def head_grids(draw):
    T, n = draw(st.integers(1, 8)), draw(st.integers(1, 7))
    mode = st.sampled_from([WRITE, READ_WRITE])
    shared_mode = draw(st.sampled_from([READ, WRITE, READ_WRITE]))
    head = [(("A1", draw(SIZE), READ),) + ((("A2", draw(SIZE), READ),) if draw(st.booleans()) else ())
            for _ in range(T)]
    tail = [(("Z1", draw(SIZE), draw(mode)), ("Z2", draw(SIZE), draw(mode))) for _ in range(T)]
    shared = [(("S1", draw(SIZE), READ), ("S3", draw(SIZE), shared_mode), ("S2", draw(SIZE), READ))
              for _ in range(n)]
    return head_waves.HeadWaves(draw(st.integers(1, 5)), head, shared, tail)


@settings(max_examples=300)
@given(head_grids(), st.integers(1, 20), st.integers(1, 300))
def test_the_closed_form_counts_what_the_simulation_counts(grid, concurrent, sectors):
    capacity = 32 * sectors
    form = head_waves.dram(grid, capacity, concurrent)
    if form is None:  # a step beside a block's own tiles does not fit: no closed form
        a, s, z = (max(sum(x for _, x, _ in tiles) for tiles in part) for part in (grid.head, grid.shared, grid.tail))
        assert a + s + z > capacity
        return
    g, config = as_grid(grid), L2Config(capacity, concurrent)
    assert form.counts(g.tiles, config) == simulate(g, config)


def test_a_step_whose_distance_is_the_capacity_hits_and_one_sector_less_misses():
    # one head of two blocks of two steps, one block at a time: between block 0's and block 1's use of a step come
    # the other step, Z1 of block 0 and A1 of block 1: with the step itself, 4 × 64 bytes
    grid = head_waves.HeadWaves(1, [(("A1", 64, READ),)] * 2, [(("S1", 64, READ),)] * 2, [(("Z1", 64, WRITE),)] * 2)
    for capacity, reads in ((256, 128), (224, 256)):
        form, g, config = head_waves.dram(grid, capacity, 1), as_grid(grid), L2Config(capacity, 1)
        assert form.reads["S1"] == simulate(g, config).tensor("S1").reads == reads


def test_a_written_head_tile_has_no_closed_form():
    grid = head_waves.HeadWaves(2, [(("A1", 32, READ_WRITE),)], [(("S1", 32, READ),)], [(("Z1", 32, WRITE),)])
    assert head_waves.dram(grid, 10**6, 4) is None


SHAPES = st.tuples(st.integers(1, 5), st.integers(1, 300), st.integers(1, 300), st.sampled_from([8, 24, 64]))


def main_kernel(kind: str, pb: Problem) -> Grid:
    if kind == "flash-swapped":
        return flash_swapped.backward(pb, Tiling(32, 32), 1)
    if kind == "flash-swapped-tc":
        return flash_swapped_tc.backward(pb, Tiling(32, 64), 1)
    if kind == "fa3":
        return fa3_backward.main(pb, Tiling(80, 128))
    return sdpa_flash.backward_main(pb, Tiling(64, 128), 1)


@settings(max_examples=60)
@given(st.sampled_from(["flash-swapped", "flash-swapped-tc", "sdpa-flash", "fa3"]), SHAPES,
       st.sampled_from(["float16", "bfloat16"]), st.integers(1, 40), st.integers(200, 20_000))
def test_the_backward_main_kernels_closed_form_equals_their_simulation(kind, shape, dtype, concurrent, sectors):
    bh, n_q, n_k, d = shape
    pb = Problem(AttentionShape(1, bh, n_q, n_k, d), tau=1.0, dtype=dtype)
    g, config = main_kernel(kind, pb), L2Config(32 * sectors, concurrent)
    form = g.form(config.capacity, config.concurrent)
    if form is not None:
        assert form.counts(g.tiles, config) == simulate(g, config)


@pytest.mark.parametrize("kind", ["flash-swapped", "flash-swapped-tc", "sdpa-flash", "fa3"])
def test_a_causal_or_grouped_backward_has_no_closed_form(kind):
    causal = Problem(AttentionShape(1, 2, 200, 200, 64), tau=1.0, dtype="float16", causal=True)
    grouped = Problem(AttentionShape(1, 4, 200, 200, 64, kv_heads=2), tau=1.0, dtype="float16")
    for pb in (causal, grouped):
        assert main_kernel(kind, pb).form(10**7, 8) is None


@settings(max_examples=100)
@given(SHAPES, st.sampled_from([16, 32, 64]), st.sampled_from([16, 32, 64]), st.integers(1, 60),
       st.integers(50, 30_000))
def test_flash_swapped_s_forward_closed_form_equals_its_simulation(shape, Br, Bc, concurrent, sectors):
    bh, n_q, n_k, d = shape
    pb, tiling = Problem(AttentionShape(1, bh, n_q, n_k, d), tau=1.0, dtype="float16"), Tiling(Br, Bc)
    form = flash_swapped.forward_dram(pb, tiling, 32 * sectors, concurrent)
    # the forward's own closed form, worked per wave, and heads in waves over its blocks' accesses: two derivations
    tiles = Tiles(flash_swapped.FORWARD_TENSORS)
    blocks = [flash_swapped.block_accesses(tiles, pb, tiling)(i) for i in range(-(-n_q // Br))]
    grid = head_waves.of_accesses(tiles, bh, [q for q, *_ in blocks], blocks[0][1], [out for *_, out in blocks])
    waves = head_waves.dram(grid, 32 * sectors, concurrent)
    assert (form is None) == (waves is None)
    if form is not None:
        g, config = flash_swapped.forward(pb, tiling, 1), L2Config(32 * sectors, concurrent)
        assert form.counts(g.tiles, config) == waves.counts(g.tiles, config) == simulate(g, config)


@pytest.mark.parametrize("kernel", ["flash-swapped", "sdpa-flash", "fa3"])
def test_the_dram_level_counts_a_full_backward_by_its_main_kernel_s_closed_form(kernel, monkeypatch):
    # 16 heads of N = 2048 at d = 64: the main kernel is counted by its form, the others by lockstep; none simulated
    pb = Problem(AttentionShape(1, 16, 2048, 2048, 64), tau=1.0, dtype="float16")
    launch, hw = Launch(pb, Tiling(64, 64), backward=True, sms=132), hardware("h100", l2_bytes=4_000_000)
    want = pass_counts(KERNELS[kernel], launch, hw)

    def refused(*args):
        raise AssertionError("simulated")

    monkeypatch.setattr(schedule, "simulate", refused)
    monkeypatch.setattr("iosim.gpu.dram.simulate", refused)
    assert pass_counts(KERNELS[kernel], launch, hw) == want
    assert want.reads > 0


@pytest.mark.parametrize("kernel", ["flash-swapped", "sdpa-flash", "fa3"])
def test_a_long_backward_is_counted_at_once_and_not_refused_as_too_long(kernel):
    # 16 heads of N = 131,072: the main kernel by its form, the one-step and grid-stride kernels by lockstep, none
    # refused by an estimate made of the pass's tile visits (the budget, 20 s, applies)
    import iosim

    r = iosim.dram("flash-swapped", N=131072, d=128, heads=16, M="228KiB", kernel=kernel, pass_="bwd")
    assert r.dram.reads > 0


def test_past_the_blocks_it_lists_a_grid_gives_no_form(monkeypatch):
    pb = Problem(AttentionShape(1, 2, 300, 300, 64), tau=1.0, dtype="float16")
    assert all(main_kernel(kind, pb).form(10**7, 8) is not None for kind in ("flash-swapped", "sdpa-flash", "fa3"))
    monkeypatch.setattr(head_waves, "MOST_LISTED", 5)
    assert all(main_kernel(kind, pb).form(10**7, 8) is None for kind in ("flash-swapped", "sdpa-flash", "fa3"))


@settings(max_examples=60)
@given(st.sampled_from(["dot_do_o", "convert_dq", "preprocess", "postprocess"]), SHAPES,
       st.sampled_from([64, 80, 128]), st.integers(1, 40), st.integers(1, 20_000))
def test_the_one_step_kernels_closed_form_equals_their_simulation(kind, shape, Br, concurrent, sectors):
    # SDPA's dot_do_o and convert_dq, FlashAttention-3's pre- and postprocess: every tile once, in launch order
    bh, n_q, n_k, d = shape
    pb, tiling = Problem(AttentionShape(1, bh, n_q, n_k, d), tau=1.0, dtype="float16"), Tiling(Br, 128)
    module = sdpa_flash if kind in ("dot_do_o", "convert_dq") else fa3_backward
    g = getattr(module, kind)(pb, tiling, 1) if module is sdpa_flash else getattr(module, kind)(pb, tiling)
    config = L2Config(32 * sectors, concurrent)
    form = g.form(config.capacity, config.concurrent)
    assert form is None or form.counts(g.tiles, config) == simulate(g, config)


def test_a_backward_of_many_heads_or_a_causal_one_is_priced_as_what_counts_it():
    # 100,000 heads of N = 4096 (ragged at FA3's 80 rows): the pre- and postprocess by their closed form, at once;
    # 160 causal heads of N = 32,768: the compiled lockstep loop, within the budget (it was refused as 21 s)
    import iosim

    many = iosim.dram("flash-swapped", N=4096, d=128, M="228KiB", heads=100_000, pass_="bwd", kernel="fa3")
    assert many.dram.reads > 0
    causal = iosim.dram("flash-swapped", N=32768, d=128, M="228KiB", heads=160, causal=True, pass_="bwd",
                        kernel="fa3")
    assert causal.dram.reads > 0
