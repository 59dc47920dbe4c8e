"""What a pass reads beyond its tensors: its kernels' code, once per launch (``iosim.gpu.dram.code_reads``).

The resource report records each build's machine code and constant banks from its sm_90 cubin
(``experiments.kernel_resources.code_sizes``); the DRAM level adds the code of every kernel a pass launches, as ncu
measures it from a cold L2 (experiments/results/code_bytes.md sets it beside calls 1 and 4). The expected bytes here
are read from the report's rows by their labels, not through the lookup the model uses.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import iosim
from iosim.core.problem import AttentionShape, Problem
from iosim.core.tiling import Tiling
from iosim.gpu.dram import code_reads, pass_counts
from iosim.gpu.grids import sdpa_flash
from iosim.gpu.hardware import hardware
from iosim.gpu.kernel import Launch
from iosim.gpu.kernels import KERNELS
from iosim.gpu.l2 import CODE, dram_record
from iosim.gpu.occupancy import RESOURCE_REPORT


def report_code(label: str) -> int:
    """The code bytes of the report's row named ``label``."""
    rows = {row["kernel"]: row for row in json.loads(RESOURCE_REPORT.read_text())["kernels"]}
    return rows[label]["code_bytes"]


def test_a_backward_pass_reads_the_code_of_each_of_its_four_kernels_once():
    # flash-swapped's float16 backward: row_dot, fill, the main kernel and the cast of dQ, one build of each
    pb = Problem(AttentionShape(1, 2, 256, 256, 64), tau=1.0, dtype="float16")
    launch = Launch(pb, Tiling(32, 32), backward=True)
    want = [report_code("D = rowsum(dO o O) fp16"), report_code("fill fp32"),
            report_code("flash-swapped backward d=64 fp16 TileConfig(Br=32, Bc=32, TM=4, TN=4)"),
            report_code("cast fp32 -> fp16")]
    assert min(want) > 10_000  # tens of kilobytes each: the grid-stride kernels' index arithmetic is unrolled
    assert [g.code_bytes for g in KERNELS["flash-swapped"].grids(launch)] == want
    assert code_reads(KERNELS["flash-swapped"], launch) == sum(want)
    # float32 launches no cast, and its own row_dot (the fill is of the float32 accumulator in every dtype)
    float32 = Launch(replace(launch.problem, dtype="float32"), launch.tiling, backward=True)
    assert code_reads(KERNELS["flash-swapped"], float32) == report_code("D = rowsum(dO o O) fp32") + report_code(
        "fill fp32") + report_code("flash-swapped backward d=64 fp32 TileConfig(Br=32, Bc=32, TM=4, TN=4)")


def test_only_the_build_a_pass_runs_counts_no_other_stands_in():
    kernel = KERNELS["flash-swapped"]
    pb = Problem(AttentionShape(1, 2, 256, 256, 64), tau=1.0, dtype="float16")
    forward = Launch(pb, Tiling(64, 32))
    assert code_reads(kernel, forward) == report_code("flash-swapped forward d=64 fp16 TileConfig(Br=64, Bc=32, "
                                                      "TM=4, TN=4)")
    # causal with dropout is the report's masked build; causal alone was not compiled, and dropout's random numbers
    # are most of the masked build's extra code: no stand-in
    masked = replace(pb, causal=True, dropout_p=0.1)
    assert code_reads(kernel, Launch(masked, forward.tiling)) == report_code(
        "flash-swapped forward d=64 fp16 causal+dropout TileConfig(Br=64, Bc=32, TM=4, TN=4)")
    assert code_reads(kernel, Launch(replace(pb, causal=True), forward.tiling)) is None
    # the sawtooth order is its own build, unmasked only
    assert code_reads(kernel, Launch(pb, forward.tiling, sawtooth=True)) == report_code(
        "sawtooth flash-swapped forward d=64 fp16 TileConfig(Br=64, Bc=32, TM=4, TN=4)")
    assert code_reads(kernel, Launch(masked, forward.tiling, sawtooth=True)) is None
    # split-kv's split kernel is compiled per split count: 4 was, 6 was not
    decode = Problem(AttentionShape(1, 4, 1, 4096, 128), tau=1.0, dtype="float16")
    split = KERNELS["split-kv"]
    assert code_reads(split, Launch(decode, Tiling(32, 16, 4))) == report_code(
        "split-kv split d=128 fp16 S=4 TileConfig(Br=32, Bc=16, TM=4, TN=2)") + report_code(
        "split-kv combine d=128 fp16 (B_r=32)")
    assert code_reads(split, Launch(decode, Tiling(32, 16, 6))) is None


def test_a_request_reads_its_passes_code_beside_their_tensors_and_the_record_says_how_much():
    kernel, hw = KERNELS["flash-swapped"], hardware("h100")
    for pass_, tile in (("fwd", iosim.Tiling(64, 32)), ("bwd", iosim.Tiling(32, 32))):  # the kernel's own tiles
        r = iosim.dram("flash-swapped", N=300, d=64, M="228KiB", heads=2, dtype="float16", pass_=pass_, tiling=tile)
        launch = Launch(r.problem, tile, backward=pass_ == "bwd", sms=132)
        code = code_reads(kernel, launch)
        assert [t.reads for t in r.dram.tensors if t.name == CODE] == [code]
        assert r.dram.reads == pass_counts(kernel, launch, hw).reads + code
        record = dram_record(r.dram)
        assert (record["dram_code_bytes"], record["dram_read_bytes"]) == (code, r.dram.reads)
    # a tile the report holds no build of: its code is not known, and not counted
    r = iosim.dram("flash-swapped", N=300, d=64, M="228KiB", heads=2, dtype="float16", tiling=iosim.Tiling(32, 32))
    assert dram_record(r.dram)["dram_code_bytes"] is None


def test_sdpa_reads_the_code_of_the_instantiation_torch_launches_and_fa3_none():
    # torch's forward at 16 heads of N = 1,024, d = 64, float16: flash_fwd_kernel<64, 128, 128, 4> without a mask,
    # Is_even_MN and Is_even_K, whose .text and constant bank 0 in torch's binary are read here by their flags
    rows = json.loads(Path(sdpa_flash.RESOURCES).read_text())["rows"]
    want = [r["code_bytes"] for r in rows if r["kernel"] == "flash_fwd_kernel" and r["head_dim"] == 64
            and r["dtype"] == "float16" and (r["block_m"], r["block_n"]) == (128, 128) and r["flags"] == dict(
                Is_dropout=False, Is_causal=False, Is_local=False, Has_alibi=False, Is_even_MN=True, Is_even_K=True,
                Is_softcap=False, Return_softmax=False)]
    r = iosim.dram("flash-swapped", N=1024, d=64, M="228KiB", heads=16, kernel="sdpa-flash")
    assert len(want) == 1 and [t.reads for t in r.dram.tensors if t.name == CODE] == want
    # FlashAttention-3's binary is not read: its tensors alone
    r = iosim.dram("flash-swapped", N=4096, d=128, M="100k", heads=16, kernel="fa3")
    assert CODE not in [t.name for t in r.dram.tensors]
    assert dram_record(r.dram)["dram_code_bytes"] is None
    assert code_reads(KERNELS["fa3"], Launch(r.problem, r.tiling, sms=132)) is None
