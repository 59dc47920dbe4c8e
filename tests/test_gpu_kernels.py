"""The kernel descriptions of the DRAM level (iosim.gpu.kernels): their occupancy held to the committed resource
report, today's kernel beside call 1's, the GQA head map their grids read K/V by, and ``iosim kernels``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.ncu_traffic import LaunchConfig
from experiments.predict_next_call import blocks_per_sm, predict
from iosim.cli import main
from iosim.core.gpus import GPUS
from iosim.core.problem import AttentionShape, Problem
from iosim.core.tiling import Tiling
from iosim.gpu import call1
from iosim.gpu.grids import flash_swapped
from iosim.gpu.kernel import Launch
from iosim.gpu.kernels import KERNELS, default_kernel
from iosim.gpu.l2 import SharedMemoryBound
from iosim.gpu.occupancy import RESOURCE_REPORT, parse, report

REPO = Path(__file__).resolve().parents[1]
H100 = GPUS["h100"]


# --- the occupancy lookup against the report ---

def test_the_lookup_finds_every_row_of_the_resource_report_at_its_blocks_per_sm():
    rows = json.loads(RESOURCE_REPORT.read_text())["kernels"]
    parsed = [(row, parse(row)) for row in rows]
    # only standard's kernels (matmuls, softmax, ...) have no grid: nothing else is silently skipped
    for row, found in parsed:
        assert (found is None) == row["kernel"].startswith("standard"), row["kernel"]
    found = [r for _, r in parsed if r is not None]
    assert len(found) == sum(not row["kernel"].startswith("standard") for row in rows) > 0
    assert report().rows == tuple(found)
    for r in found:
        got = report().lookup(r.kernel, r.part, r.dtype, r.d, causal=r.build == "causal+dropout",
                              sawtooth=r.build == "sawtooth", tile=r.tile)
        assert got is not None and got.blocks_per_sm == r.blocks_per_sm, (r.label, got)


# --- today's flash-swapped beside call 1's ---

def swapped_problem(d: int, causal: bool = False) -> Problem:
    return Problem(AttentionShape(1, 2, 256, 256, d), tau=1.0, dtype="float16", causal=causal)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_swapped_at_its_report_tile_launches_as_the_report_says_and_call_1_as_its_report_said(causal):
    # float16, d = 64, 64 x 32: the report's 2 blocks per SM (255 registers x 128 threads; its causal+dropout build
    # too); call 1's kernels held 4 (128 registers x 128 threads)
    launch = Launch(swapped_problem(64, causal), Tiling(64, 32))
    assert default_kernel("flash-swapped") is KERNELS["flash-swapped"]
    assert KERNELS["flash-swapped"].grids(launch)[0].per_sm(H100) == 2
    assert call1.FLASH_SWAPPED.grids(launch)[0].per_sm(H100) == call1.SWAPPED_FORWARD[(64, 64, 32)] == 4
    assert call1.FLASH_SWAPPED is KERNELS["flash-swapped@d4169c1"]
    # d = 128, 32 x 16: 4 now (245 registers x 64 threads), 6 in call 1
    launch = Launch(swapped_problem(128, causal), Tiling(32, 16))
    assert KERNELS["flash-swapped"].grids(launch)[0].per_sm(H100) == 4
    assert call1.FLASH_SWAPPED.grids(launch)[0].per_sm(H100) == 6


def test_a_tiling_the_report_has_no_row_for_gets_the_shared_memory_bound():
    pb, tiling = swapped_problem(64), Tiling(32, 32)
    assert report().lookup("flash-swapped", "forward", "float16", 64, tile=(32, 32)) is None
    (g,) = KERNELS["flash-swapped"].grids(Launch(pb, tiling))
    # float32 Q_i, K_j, V_j: (32 + 2·32)·64·4 = 24,576 B; S_ij: 32·33·4 = 4,224 B; 28,800 B a block, and the
    # driver's 1 KiB: 228 KiB = 233,472 B of an H100 SM hold 7 (8 · 29,824 = 238,592 B do not fit)
    assert g.blocks_per_sm == SharedMemoryBound(28_800) == flash_swapped.forward_smem(pb, tiling)
    assert g.per_sm(H100) == 7


# --- the GQA head map the DRAM grids read K/V by ---

# batch 2, heads 8, kv_heads 2 (groups of 4): query heads 0-3 read K/V head 0, 4-7 head 1; batch 1's heads
# (batch·heads 8-15) the K/V heads 2 and 3 of its own batch entry
GQA = AttentionShape(2, 8, 64, 64, 8, kv_heads=2)
KV_HEAD_BY_HAND = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]


def test_the_gqa_head_map_is_the_hand_derived_one():
    assert [GQA.kv_head(bh) for bh in range(GQA.bh)] == KV_HEAD_BY_HAND


def test_a_gqa_forward_grid_reads_the_kv_tiles_of_the_hand_derived_head():
    pb, tiling = Problem(GQA, tau=1.0, dtype="float16"), Tiling(16, 16)
    (g,) = KERNELS["flash-swapped"].grids(Launch(pb, tiling))
    # key = tile index · (number of tensors) + tensor id (iosim.gpu.l2.Tiles.access); K/V tile index kvh·T_c + j
    assert g.tiles.tensors == ("Q", "K", "V", "O", "lse")
    n, K, V = 5, 1, 2
    Tr = Tc = 64 // 16
    assert g.blocks == GQA.bh * Tr
    for b in range(g.blocks):  # block bh·T_r + i: not causal, every block reads all T_c blocks of its K/V head
        kvh = KV_HEAD_BY_HAND[b // Tr]
        read = {key for step in g.steps(b) for key, _, _ in step if key % n in (K, V)}
        assert read == {(kvh * Tc + j) * n + x for j in range(Tc) for x in (K, V)}, b


PREDICTIONS = REPO / "experiments/results/gpu/predictions-bda8144.json"
PREDICTED = ("reads", "writes", "dirty_at_end", "capacity", "concurrent", "by_tensor")


def test_a_committed_gqa_prediction_recomputes_identically():
    rows = json.loads(PREDICTIONS.read_text())["rows"]
    gqa = [r for r in rows if r["kv_heads"] not in (None, r["heads"])]
    # row 0, the smallest (N = 4096, d = 64, not causal; row 3 is as small but MQA, kv_heads = 1, where every head
    # map gives K/V head 0): 32 query heads in groups of 4 over 8 K/V heads
    (row,) = [r for r in gqa if r["index"] == 0]
    size = lambda r: r["batch"] * r["heads"] * r["n_q"] * r["n_k"] * r["d"]  # noqa: E731
    assert size(row) == min(size(r) for r in gqa) and (row["heads"], row["kv_heads"], row["causal"]) == (32, 8, False)
    cfg = LaunchConfig(row["impl"], row["direction"], row["batch"], row["heads"], row["n_q"], row["n_k"], row["d"],
                       row["dtype"], causal=row["causal"], dropout_p=row["dropout_p"], kv_heads=row["kv_heads"])
    assert cfg.tile() == row["tiling"] and blocks_per_sm(cfg) == row["blocks_per_sm"] == 2
    got, want = predict(cfg), row["predicted"]
    effective = {k: got["effective"][k] for k in ("reads", "writes", "dirty_at_end")}
    assert effective == {k: want["effective"][k] for k in ("reads", "writes", "dirty_at_end")}, effective
    for label in ("effective", "0.5x", "0.75x", "1x"):  # per tensor, and at every capacity recorded
        assert {k: got[label][k] for k in PREDICTED} == {k: want[label][k] for k in PREDICTED}, label


# --- iosim kernels, and --kernel ---

def test_iosim_kernels_writes_one_record_per_kernel_and_marks_the_defaults(tmp_path):
    path = tmp_path / "kernels.json"
    done = subprocess.run([sys.executable, "-m", "iosim", "kernels", "--json", str(path)], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    records = json.loads(path.read_text())
    assert sorted(r["kernel"] for r in records) == sorted(KERNELS)  # each once
    for r in records:
        kernel = KERNELS[r["kernel"]]
        assert r["algorithm"] == kernel.algorithm, r
        assert r["default"] is (default_kernel(kernel.algorithm) is kernel), r
    assert {r["kernel"] for r in records if r["default"]} == {"flash", "flash-swapped", "split-kv"}
    assert {r["algorithm"] for r in records} == {"flash", "flash-swapped", "split-kv"}
    assert [r["kernel"] for r in records if r["own_tile"]] == ["fa3", "sdpa-flash"]
    assert {r["kernel"]: r["takes"] for r in records if r["takes"]} == {"fa3": ["fp8", "d_v"]}
    for r in records:  # lists, as every command's records hold them
        kernel = KERNELS[r["kernel"]]
        assert r["passes"] == (["fwd", "bwd"] if kernel.backward else ["fwd"]), r
        assert r["dtypes"] == (list(kernel.dtypes) if kernel.dtypes else None), r
        assert r["options"] == list(kernel.options), r
    assert {r["kernel"] for r in records if r["timed"]} == {"flash-swapped", "flash-swapped-tc", "sdpa-flash"}
    assert {r["kernel"]: r["runs_on"] for r in records if r["runs_on"]} == {
        "fa3": ["H100", "H200"], "flash@d4169c1": ["H100", "H200"], "flash-swapped@d4169c1": ["H100", "H200"],
        "flash-swapped-tc": ["A100", "H100", "H200", "B200", "GB10"], "sdpa-flash": ["A100", "H100", "H200", "B200",
                                                                                   "GB10"]}


@pytest.mark.parametrize("argv", [["sweep"], ["run"], ["optimize", "--N", "1024", "--d", "64"]])
def test_kernel_without_gpu_exits_2_with_one_line(capsys, argv):
    assert main(argv + ["--kernel", "flash-swapped@d4169c1"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--kernel flash-swapped@d4169c1 without --gpu" in lines[0], lines


def test_the_kernels_of_this_repository_are_described_with_the_dtypes_their_api_takes():
    from kernels import api

    described = [name for name in api.IMPLS if name in KERNELS]
    assert described == ["flash", "flash-swapped", "flash-swapped-tc", "split-kv"]
    for name in described:
        bf16 = ("bfloat16",) if api.IMPLS[name].BFLOAT16 else ()
        assert set(KERNELS[name].dtypes) == {str(t) for t in api.DTYPES} | set(bf16), name


@pytest.mark.parametrize("algorithm, kernel, dtype, gpu, refusal", [
    ("flash-swapped", None, "float64", "h100", "dtype='float64': kernel='flash-swapped' is built for float32, float16"),
    ("flash", None, "bfloat16", "h100", "dtype='bfloat16': kernel='flash' is built for float32, float16 only"),
    ("flash-swapped", "flash-swapped-tc", "float64", "h100", "kernel='flash-swapped-tc' is built for float32, float16,"
                                                              " bfloat16 only"),
    ("flash-swapped", "flash-swapped-tc", "bfloat16", "t4", "the T4 preset: kernel='flash-swapped-tc' is built for the "
                                                            "A100, H100, H200, B200, GB10 only"),
])
def test_no_dram_bytes_are_given_for_a_build_that_does_not_exist(algorithm, kernel, dtype, gpu, refusal):
    import iosim
    from iosim.core.errors import InputError

    with pytest.raises(InputError, match=refusal.replace("(", r"\(").replace(")", r"\)")):
        iosim.dram(algorithm, kernel=kernel, N=64, d=64, M="100k", gpu=gpu, dtype=dtype)
    built = dict(dtype="float16") if dtype != "bfloat16" or gpu == "t4" else dict(kernel="flash-swapped-tc")
    assert iosim.dram("flash-swapped", N=64, d=64, M="100k", gpu=gpu, **built).dram.reads > 0


def test_a_bfloat16_build_is_refused_on_a_preset_without_bfloat16_tensor_cores():
    # every kernel of KERNELS with a bfloat16 build needs sm_80, so the T4 refuses it by its architecture first; a
    # description that says nothing of its architecture still meets the T4's missing bfloat16 tensor cores
    from dataclasses import replace

    from iosim.core.errors import InputError
    from iosim.core.problem import AttentionShape, Problem
    from iosim.core.tiling import Tiling
    from iosim.gpu.dram import kernel_counts
    from iosim.gpu.hardware import hardware
    from iosim.gpu.kernel import Launch

    anywhere = replace(KERNELS["flash-swapped-tc"], runs_on=None)
    launch = Launch(Problem(AttentionShape(1, 1, 64, 64, 64), tau=1.0, dtype="bfloat16"), Tiling(64, 64))
    with pytest.raises(InputError, match="dtype='bfloat16' on the T4 preset: it has no bfloat16 tensor cores"):
        kernel_counts(anywhere, launch, hardware("t4"))
    assert kernel_counts(anywhere, launch, hardware("a100"))[0].reads > 0


def test_a_sweep_in_a_dtype_a_kernel_lacks_says_which_rows_have_no_dram_bytes(capsys):
    from iosim.cli import build_parser, run

    outcome = run(build_parser().parse_args(["sweep", "--gpu", "h100", "--N", "64", "--d", "64", "--dtype",
                                             "bfloat16", "--algo", "flash", "flash-swapped"]))
    assert [r.dram for r in outcome.rows] == [None, None]
    assert ("--dtype bfloat16: the kernels of flash, flash-swapped have no bfloat16 build, so their rows have no DRAM "
            "bytes and their times are from HBM bytes; --kernel flash-swapped-tc has one") in outcome.notes
    tc = run(build_parser().parse_args(["sweep", "--gpu", "h100", "--N", "64", "--d", "64", "--dtype", "bfloat16",
                                        "--algo", "flash-swapped", "--kernel", "flash-swapped-tc"]))
    assert tc.rows[0].dram is not None and not any("build" in note for note in tc.notes)
