"""experiments/kernel_static_model.py reads nvdisasm listings and shared-memory layouts correctly.

The listing below is written by hand in nvdisasm's sm_90 format (the forms the model meets
in the kernels' real listings), so the test needs neither a compiler nor a GPU: a
runtime helper, a kernel whose outer loop has a run-time bound and holds two nested
loops, one an up-counter (4 trips) and one a 64-bit down-counter unrolled twice
(⌈(7 + 1)/2⌉ = 4 trips), and a second, FMA-free loop.
"""

from __future__ import annotations

import pytest

from experiments import kernel_static_model as model

LISTING = """\
\t.target\tsm_90

//--------------------- .text.__cuda_sm20_div_s64 --------------------------
\t.section\t.text.__cuda_sm20_div_s64,"ax",@progbits
.text.__cuda_sm20_div_s64:
        /*0000*/                   I2F.U64.RP R0, R8 ;
        /*0010*/                   FFMA R1, R2, R3, R4 ;
        /*0020*/                   RET.ABS.NODEC R20 0x0 ;
//--------------------- .text._Z6kernelPf --------------------------
\t.section\t.text._Z6kernelPf,"ax",@progbits
.text._Z6kernelPf:
        /*0000*/                   CALL.ABS.NOINC `(__cuda_sm20_div_s64) ;
        /*0010*/                   MOV R9, RZ ;
.L_x_0:
        /*0020*/                   MOV R4, RZ ;
        /*0030*/                   LDG.E R6, desc[UR4][R2.64] ;
        /*0040*/                   STS [R13], R6 ;
        /*0050*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
.L_x_1:
        /*0060*/                   LDS.128 R20, [R12+0x10] ;
        /*0070*/                   FFMA R30, R20, R21, R30 ;
        /*0080*/                   FFMA R31, R22, R23, R31 ;
        /*0090*/                   IADD3 R4, R4, 0x1, RZ ;
        /*00a0*/                   ISETP.GE.AND P0, PT, R4, 0x4, PT ;
        /*00b0*/              @!P0 BRA `(.L_x_1) ;
        /*00c0*/                   IMAD.MOV.U32 R15, RZ, RZ, 0x7 ;
        /*00d0*/                   SEL R10, RZ, 0xffffffff, P1 ;
.L_x_2:
        /*00e0*/                   LDS R24, [R12] ;
        /*00f0*/                   LDS.64 R26, [R12+0x8] ;
        /*0100*/                   FFMA R32, R24, R26, R32 ;
        /*0110*/                   IADD3 R15, P2, R15, R10, RZ ;
        /*0120*/                   FFMA R33, R24, R27, R33 ;
        /*0130*/                   IADD3 R15, P2, R15, R10, RZ ;
        /*0140*/                   ISETP.NE.U32.AND P1, PT, R15, RZ, PT ;
        /*0150*/               @P1 BRA `(.L_x_2) ;
        /*0160*/                   SHFL.BFLY PT, R7, R30, 0x1, 0x1f ;
        /*0170*/                   MUFU.EX2 R8, R7 ;
        /*0180*/                   I2F.U32.RP R0, UR36 ;
        /*0190*/                   DADD R16, R16, R18 ;
        /*01a0*/                   STL [R1], R8 ;
        /*01b0*/                   NOP ;
        /*01c0*/                   IADD3 R9, R9, 0x1, RZ ;
        /*01d0*/                   ISETP.GE.AND P3, PT, R9, R40, PT ;
        /*01e0*/              @!P3 BRA `(.L_x_0) ;
.L_x_3:
        /*01f0*/                   LDS R5, [R12] ;
        /*0200*/                   IADD3 R11, R11, 0x1, RZ ;
        /*0210*/                   ISETP.GE.AND P4, PT, R11, R41, PT ;
        /*0220*/              @!P4 BRA `(.L_x_3) ;
        /*0230*/                   EXIT ;
"""

OUTER = model.Loop(0x20, 0x1E0)
UP = model.Loop(0x60, 0xB0)
DOWN = model.Loop(0xE0, 0x150)
FLAT = model.Loop(0x1F0, 0x220)


@pytest.fixture(scope="module")
def kernel():
    return model.kernel_function(model.parse_sass(LISTING))


def test_parse_finds_functions_labels_predicates_and_modifiers():
    functions = model.parse_sass(LISTING)
    assert [f.name for f in functions] == ["__cuda_sm20_div_s64", "_Z6kernelPf"]
    assert [len(f.instructions) for f in functions] == [3, 36]
    fn = functions[1]
    assert fn.labels == {".L_x_0": 0x20, ".L_x_1": 0x60, ".L_x_2": 0xE0, ".L_x_3": 0x1F0}
    branch = next(i for i in fn.instructions if i.address == 0xB0)
    assert (branch.predicate, branch.opcode, branch.base, branch.operands) == ("@!P0", "BRA", "BRA", "`(.L_x_1)")
    lds = next(i for i in fn.instructions if i.address == 0x60)
    assert (lds.opcode, lds.base, lds.operands) == ("LDS.128", "LDS", "R20, [R12+0x10]")


def test_kernel_function_skips_runtime_helpers():
    only_helper = model.parse_sass(LISTING.split("//--------------------- .text._Z6")[0])
    with pytest.raises(RuntimeError, match="expected one kernel"):
        model.kernel_function(only_helper)


def test_loops_are_backward_branches(kernel):
    assert model.loops(kernel) == [OUTER, UP, DOWN, FLAT]
    assert OUTER.contains(UP) and OUTER.contains(DOWN) and not OUTER.contains(FLAT)
    assert not UP.contains(UP)


def test_trip_counts_from_up_and_down_counters(kernel):
    # up: R4 = 0, += 1 per pass, until R4 >= 4: 4 passes
    assert model.trip_count(kernel, UP) == 4
    # down: R15 = 7 iterations left after the first, stepped by −1 twice per pass: ⌈8/2⌉ = 4 passes
    assert model.trip_count(kernel, DOWN) == 4
    # bounds held in registers (R40, R41) are known only at run time
    assert model.trip_count(kernel, OUTER) is None
    assert model.trip_count(kernel, FLAT) is None


def test_step_mix_weights_nested_loops_by_their_trips(kernel):
    hot, mix = model.step_mix(kernel)
    assert hot == OUTER, "the hot loop is the outer loop with the most FMAs, not the FMA-free one"
    # outer body outside the nested loops: 4 before UP, 2 between, 9 after DOWN, one of them
    # a NOP (not issued); UP: 6 instructions × 4 trips, DOWN: 8 instructions × 4 trips
    assert mix.instructions == 14 + 6 * 4 + 8 * 4, mix
    assert mix.ffma == 2 * 4 + 2 * 4, mix
    assert (mix.lds_32, mix.lds_64, mix.lds_128) == (4, 4, 4), mix
    assert (mix.sts, mix.shuffles, mix.barriers, mix.mufu) == (1, 1, 1, 1), mix
    assert (mix.global_loads, mix.local_memory, mix.int_divisions, mix.float64) == (1, 1, 1, 1), mix
    assert mix.unresolved_loops == 0
    assert mix.fma_share == pytest.approx(16 / 70)
    assert mix.lds_per_fma == pytest.approx(12 / 16)


# Two run-time loops with one HMMA each, as flash-swapped-tc's steps without and with the
# mask test: the first in the listing is the hot loop, and ldmatrix counts as a shared load.
TENSOR_CORE_LISTING = """\
//--------------------- .text._Z2tcPf --------------------------
\t.section\t.text._Z2tcPf,"ax",@progbits
.text._Z2tcPf:
        /*0000*/                   MOV R9, RZ ;
.L_x_0:
        /*0010*/                   LDSM.16.M88.4 R20, [R12+0x200] ;
        /*0020*/                   LDSM.16.MT88.4 R24, [R13] ;
        /*0030*/                   HMMA.16816.F32 R32, R20, R24, R32 ;
        /*0040*/                   IADD3 R9, R9, 0x1, RZ ;
        /*0050*/                   ISETP.GE.AND P0, PT, R9, R40, PT ;
        /*0060*/              @!P0 BRA `(.L_x_0) ;
.L_x_1:
        /*0070*/                   FSETP.GT.AND P1, PT, R30, RZ, PT ;
        /*0080*/                   LDSM.16.MT88.4 R24, [R13] ;
        /*0090*/                   HMMA.16816.F32 R32, R20, R24, R32 ;
        /*00a0*/                   IADD3 R9, R9, 0x1, RZ ;
        /*00b0*/                   ISETP.GE.AND P0, PT, R9, R41, PT ;
        /*00c0*/              @!P0 BRA `(.L_x_1) ;
        /*00d0*/                   EXIT ;
"""


def test_the_first_of_equally_hot_loops_is_the_step_and_ldmatrix_is_a_shared_load():
    hot, mix = model.step_mix(model.kernel_function(model.parse_sass(TENSOR_CORE_LISTING)))
    assert hot == model.Loop(0x10, 0x60)
    assert (mix.instructions, mix.hmma, mix.ldsm, mix.lds) == (6, 1, 2, 2), mix
    assert mix.lds_per_fma == 2


def test_divisions_in_loops_ignore_the_prologue_call(kernel):
    # the CALL at 0x0 is before every loop; the I2F.U32.RP at 0x180 is inside the outer loop
    assert model.loop_divisions(kernel) == 1


def test_ceilings():
    fp32 = model.StepMix(instructions=100, ffma=60, hmma=0, lds_32=0, lds_64=0, lds_128=0, ldsm=0, sts=0, shuffles=0,
                         barriers=0, mufu=0, global_loads=0, local_memory=0, int_divisions=0, float64=0,
                         unresolved_loops=0)
    assert model.ceiling_tflops(fp32) == pytest.approx(0.6 * model.PEAK_TFLOPS["FFMA"])
    # HMMA: a tenth of the instructions keeps the tensor cores 40 % busy; a quarter or more saturates them
    tc = model.StepMix(**{**fp32.__dict__, "ffma": 0, "hmma": 10})
    assert model.ceiling_tflops(tc) == pytest.approx(0.4 * model.PEAK_TFLOPS["HMMA"])
    saturated = model.StepMix(**{**fp32.__dict__, "ffma": 0, "hmma": 50})
    assert model.ceiling_tflops(saturated) == pytest.approx(model.PEAK_TFLOPS["HMMA"])


def test_bank_ways():
    # 32 lanes reading 32 consecutive words: conflict-free
    assert model.bank_ways(list(range(32)), 1) == 1
    # a stride of 2 words folds 32 lanes onto 16 banks: 2-way
    assert model.bank_ways([2 * lane for lane in range(32)], 1) == 2
    # every lane reading the same word is a broadcast
    assert model.bank_ways([5] * 32, 1) == 1
    # 128-bit loads: 8 lanes per phase; rows 64 words apart put all 8 on banks 0-3: 8-way
    assert model.bank_ways([64 * lane for lane in range(32)], 4) == 8
    # rows 68 = 4·17 words apart (an odd number of 4-word groups): conflict-free
    assert model.bank_ways([68 * lane for lane in range(32)], 4) == 1
    with pytest.raises(ValueError, match="width=3"):
        model.bank_ways([0], 3)


def test_layout_patterns_of_the_default_forward_tiling_are_conflict_free():
    from iosim.kernels import flash_swapped

    config = flash_swapped.FORWARD_TILES[0]
    ways = model.bank_report(flash_swapped.layout(config, 64, False))
    loads = {name: n for name, n in ways.items() if "LDS" in name}
    assert set(loads.values()) == {1}, ways
