"""GPU presets: M from the SM's shared memory, the roofline time, and the sweep columns they add."""

import dataclasses
import json

import pytest
from rich.console import Console

import iosim
from iosim.cli import build_parser, gpus_cmd, main, run
from iosim.core.flops import Flops
from iosim.core.gpus import GPU, GPUS, SMLimits, Spec, roofline
from iosim.gpu.kernels import KERNELS


def parse(*argv):
    return build_parser().parse_args(list(argv))


@pytest.mark.parametrize("name", sorted(GPUS))
def test_every_number_of_a_preset_names_its_source(name):
    gpu = GPUS[name]
    specs = [getattr(gpu, f.name) for f in dataclasses.fields(gpu) if f.name not in ("name", "sm")]
    for spec in specs:
        assert spec is None or (isinstance(spec, Spec) and spec.value > 0 and len(spec.source) > 10), (name, spec)
    sm = gpu.sm
    assert isinstance(sm, SMLimits) and sm.blocks > 0 and sm.threads > 0 and len(sm.source) > 10, (name, sm)
    # the driver's reserve is what one block cannot take of the SM's shared memory, which the source quotes
    per_block_kb = (gpu.smem_per_sm.value - sm.reserved_per_block) / 1024
    assert f"{per_block_kb:g} KB per block" in sm.source or f"{per_block_kb:g} KB of shared memory per SM and per " \
        f"block" in sm.source, (name, per_block_kb, sm.source)
    assert f"allocated in {sm.smem_unit} B units" in sm.source, (name, sm.smem_unit, sm.source)
    with pytest.raises(dataclasses.FrozenInstanceError):
        gpu.name = "other"


@pytest.mark.parametrize("dtype, M", [("float16", 164 * 1024 // 2), ("float32", 164 * 1024 // 4)])
def test_the_preset_sets_M_in_elements_of_the_dtype(dtype, M):
    (row,) = run(parse("sweep", "--gpu", "a100", "--dtype", dtype, "--N", "2048", "--d", "64", "--algo", "flash")).rows
    assert row.M == M  # the A100's 164 KiB of shared memory per SM


def test_an_M_that_fits_the_SM_wins_over_the_preset():
    (row,) = run(parse("sweep", "--gpu", "h100", "--M", "50k", "--N", "2048", "--d", "64", "--algo", "flash")).rows
    assert row.M == 50_000 and row.roofline.gpu == "H100"


@pytest.mark.parametrize("argv, message", [
    (["sweep", "--gpu", "t4", "--M", "100k"], "more than the T4's shared memory per SM (32,768 elements)"),
    (["sweep", "--gpu", "v100"], "argument --gpu: invalid choice: 'v100'"),
    (["sweep", "--gpu", "t4", "--dtype", "bfloat16", "--N", "1024"], "dtype='bfloat16' has no peak FLOP/s in the T4"),
])
def test_bad_preset_input_exits_2_with_one_line(capsys, argv, message):
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


def test_roofline_time_is_the_larger_of_compute_and_memory_time():
    gpu = GPUS["a100"]
    # 312 TFLOP/s and 1,555 GB/s: 312e9 FLOPs take 1 ms, 1,555 MB takes 1 ms
    assert roofline(gpu, "float16", 1555 * 10**6, Flops(matmul=2 * 312 * 10**9)).bound == "compute"
    r = roofline(gpu, "float16", 2 * 1555 * 10**6, Flops(matmul=312 * 10**9))
    assert r.bound == "memory" and r.seconds == pytest.approx(2e-3) and r.intensity == pytest.approx(312e9 / 3110e6)


@pytest.mark.parametrize("pass_", ["fwd", "fwd+bwd"])
def test_sweep_rows_and_records_carry_the_roofline(tmp_path, pass_):
    path = tmp_path / "s.json"
    rows = run(parse("sweep", "--gpu", "a100", "--pass", pass_, "--N", "1024", "--d", "64", "--batch", "4",
                     "--json", str(path))).rows
    with_kernel = {k.algorithm for k in KERNELS.values()}  # the algorithms a GPU kernel implements
    records = json.loads(path.read_text())
    assert len(records) == len(rows)
    assert pass_ != "fwd" or {row.algorithm for row in rows} >= with_kernel  # each kernel's algorithm is swept
    for row, record in zip(rows, records):
        compute = row.flops.matmul / 312e12
        moved = row.counts.total_bytes if row.dram is None else row.dram.reads + row.dram.writes + row.dram.dirty_at_end
        # every pass has DRAM bytes where its kernels launch the row's tiling: the backward ones take square tiles
        square = row.backward_tiling is None or row.backward_tiling.Br == row.backward_tiling.Bc
        assert (row.dram is not None) == (row.algorithm in with_kernel and (pass_ == "fwd" or square))
        assert row.roofline.seconds == max(compute, moved / 1555e9)
        assert (record["dram_read_bytes"], record["dram_write_bytes"], record["dram_dirty_bytes"]) == (
            (None, None, None) if row.dram is None else (row.dram.reads, row.dram.writes, row.dram.dirty_at_end))
        assert record["roofline_s"] == row.roofline.seconds and record["bound"] == row.roofline.bound
        assert record["matmul_flops"] == row.flops.matmul and record["gpu"] == "A100"
        passes = {"fwd": row.forward_tiling, "bwd": row.backward_tiling} if pass_ == "fwd+bwd" else {"fwd": row.tiling}
        shape = dict(N=1024, d=64, M=row.M, batch=4)
        assert row.flops == sum((iosim.predict(row.algorithm, pass_=p, tiling=t, **shape).flops
                                 for p, t in passes.items()), Flops())


def test_preset_bandwidths_are_bus_width_times_data_rate_where_sources_give_both():
    # H100 SXM5: 5,120-bit HBM3 at 2 × 2,619 MHz; GB10: 256-bit LPDDR5X at 8,533 MT/s; T4: 256-bit GDDR6 at
    # 2 × 5,001 MHz. Each lands within 0.1% of the rounded figure its vendor quotes (3.35 TB/s, 273 GB/s, 320 GB/s)
    for name, bits, rate, quoted in (("h100", 5120, 5.238e9, 3.35e12), ("gb10", 256, 8.533e9, 273e9),
                                     ("t4", 256, 10.002e9, 320e9)):
        value = GPUS[name].hbm_bandwidth.value
        assert value == pytest.approx(bits / 8 * rate, rel=1e-12) and abs(value / quoted - 1) < 1e-3, name


def test_the_gb10_and_h200_presets_hold_their_published_numbers():
    gb10, h200 = GPUS["gb10"], GPUS["h200"]
    assert (gb10.sms.value, gb10.l2.value, gb10.smem_per_sm.value) == (48, 25_165_824, 100 * 1024)
    assert gb10.fp32.value == pytest.approx(29.7e12, rel=1e-3)  # 48 SMs × 128 lanes × 2 × 2,418 MHz
    assert h200.l2.value == 62_914_560 and h200.l2_effective.value < h200.l2.value
    assert h200.sms.value == GPUS["h100"].sms.value


@pytest.mark.parametrize("name, compute_capability, blocks, threads", [
    ("t4", "7.5", 16, 1024), ("a100", "8.0", 32, 2048), ("h100", "9.0", 32, 2048), ("h200", "9.0", 32, 2048),
    ("b200", "10.0", 32, 2048), ("gb10", "12.1", 24, 1536)])
def test_each_preset_holds_its_compute_capabilitys_resident_limits(name, compute_capability, blocks, threads):
    # the CUDA Programming Guide's table 30 (CUDA 13): resident blocks and threads per SM by compute capability
    sm = GPUS[name].sm
    assert (sm.compute_capability, sm.blocks, sm.threads) == (compute_capability, blocks, threads), sm


def test_iosim_gpus_saves_every_number_of_every_preset_with_its_source(tmp_path):
    # every field of a preset is a row of the command: a number added to GPU or SMLimits and not to the command fails
    fields = {f.name for f in dataclasses.fields(GPU)} - {"name", "sm"}
    assert fields == {field for field, *_ in gpus_cmd.NUMBERS}, fields
    sm_fields = {f.name for f in dataclasses.fields(SMLimits)} - {"compute_capability", "source"}
    assert sm_fields == {field for field, *_ in gpus_cmd.SM_NUMBERS}, sm_fields
    assert main(["gpus", "--json", str(tmp_path / "g.json"), "--csv", str(tmp_path / "g.csv")]) == 0
    rows = json.loads((tmp_path / "g.json").read_text())
    assert len(rows) == len(GPUS) * (len(gpus_cmd.NUMBERS) + len(gpus_cmd.SM_NUMBERS))
    by = {(r["gpu"], r["number"]): r for r in rows}
    for gpu in GPUS.values():
        name = gpu.name  # as every command's records name the preset
        for field, number, _, _ in gpus_cmd.NUMBERS:
            spec = getattr(gpu, field)
            assert (by[name, number]["value"], by[name, number]["source"]) == (
                (None, None) if spec is None else (spec.value, spec.source)), (name, number)
        assert by[name, "resident blocks per SM"]["value"] == gpu.sm.blocks
        assert by[name, "SMs"]["compute_capability"] == gpu.sm.compute_capability
    assert all(r["value"] is None or isinstance(r["value"], int | float) for r in rows)  # numbers only
    assert (tmp_path / "g.csv").read_text().count("\n") == len(rows) + 1  # a header and a line per record
    # the table fits 80 columns, nothing cut, and the datasheet's digits: 1,555 GB/s, not 1.55 TB/s
    console = Console(width=80, record=True)
    gpus_cmd.main(parse("gpus"), console)
    text = console.export_text()
    assert "…" not in text and "44MB" in text and "1.555TB/s" in text and "12.1" in text, text


def test_iosim_gpus_names_choose_the_presets_shown_saved_and_sourced(tmp_path):
    # each name once, in the order given; the sources of its numbers printed, those of one source together
    console = Console(width=120, record=True)
    gpus_cmd.main(parse("gpus", "h200", "t4", "h200", "--json", str(tmp_path / "g.json")), console)
    rows = json.loads((tmp_path / "g.json").read_text())
    assert list(dict.fromkeys(r["gpu"] for r in rows)) == ["H200", "T4"]
    text = " ".join(console.export_text().split())  # long sources wrap
    assert f"H200 L2, effective: {GPUS['h200'].l2_effective.source}" in text
    assert f"T4 resident blocks per SM, resident threads per SM, shared memory kept back per block, shared memory " \
           f"allocation unit: {GPUS['t4'].sm.source}" in text
    assert text.count("H200 L2, effective:") == 1 and "A100" not in text, text


def test_iosim_gpus_refuses_a_preset_it_does_not_have_in_one_line(capsys):
    assert main(["gpus", "x100"]) == 2
    err = capsys.readouterr().err
    assert "gpu='x100' is not one of ['a100', 'b200', 'gb10', 'h100', 'h200', 't4']" in err and "Traceback" not in err


def test_the_preset_name_a_record_holds_is_taken_back_in_any_case(tmp_path):
    # records and reports name the preset "H100", which every gpu= argument refused (only "h100" was taken)
    import iosim

    kw = dict(N=1024, d=64, M="100k")
    assert iosim.dram("flash-swapped", gpu="H100", **kw).dram == iosim.dram("flash-swapped", gpu="h100", **kw).dram
    report = iosim.model("llama-3-8b", N=256, phases=["prefill"], algorithms=["flash"], gpu="h100")
    assert report.gpu == "H100" and iosim.model("llama-3-8b", N=256, phases=["prefill"], algorithms=["flash"],
                                                gpu=report.gpu).gpu == "H100"
    for argv in (["sweep", "--N", "1024", "--d", "64", "--algo", "flash", "--gpu", "H100"], ["gpus", "H200"]):
        assert main([*argv, "--json", str(tmp_path / "r.json")]) == 0
    with pytest.raises(iosim.InputError, match="gpu='H800' is not one of"):
        iosim.dram("flash-swapped", gpu="H800", **kw)
