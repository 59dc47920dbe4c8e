"""FP8 attention counted as FlashAttention-3's FP8 forward runs it: Q, K and V of one byte an element, three float32
descales per K/V head that every thread block reads, O returned in bfloat16.

flash-swapped and split-kv take ``dtype="float8_e4m3"`` (or e5m2) in their forward pass. Held here: every count equal
to its closed form (Hypothesis); the elements moved and the tiling those of the same run in float16 at the same M in
elements, the bytes different only by the data's width, O's bfloat16 and the descales; numeric runs in float64 equal
to the reference (the simulator never computes in FP8); FP8 peaks where the datasheets give them; everything else
refused by name.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

import iosim
from iosim.cli import build_parser, run
from iosim.core.gpus import GPUS, roofline
from iosim.core.units import FP8_DTYPES

TAKERS = ("flash-swapped", "split-kv")


@settings(max_examples=120, deadline=None)
@given(algo=st.sampled_from(TAKERS), dtype=st.sampled_from(FP8_DTYPES), n_q=st.integers(1, 3000),
       n_k=st.integers(1, 70000), d=st.integers(1, 256), heads=st.sampled_from([1, 4, 32]), kv=st.sampled_from([1, 4]),
       causal=st.booleans(), page=st.sampled_from([None, 16]), sinks=st.booleans(), M=st.integers(300, 600_000))
def test_fp8_counts_equal_their_closed_form(algo, dtype, n_q, n_k, d, heads, kv, causal, page, sinks, M):
    sizes = dict(N=n_q, N_k=n_k, d=d, heads=heads, kv_heads=min(kv, heads), M=M, causal=causal, page_size=page,
                 sinks=sinks, dtype=dtype)
    try:
        counted = iosim.count(algo, **sizes)
    except iosim.BlockSizeError:
        reject()
    assert counted.traffic == iosim.predict(algo, **sizes).exact, f"{algo} {sizes} {counted.tiling}"


@pytest.mark.parametrize("algo, splits", [("flash-swapped", None), ("split-kv", 1), ("split-kv", 4)])
def test_fp8_moves_the_elements_of_float16_in_fewer_bytes_and_reads_its_descales(algo, splits):
    # N_q = 239 queries of 4 heads on 2 K/V heads, N_k = 1000, d = 64, M = 20,000 elements in both dtypes
    sizes = dict(N=239, N_k=1000, d=64, heads=4, kv_heads=2, M=20_000, causal=True, splits=splits)
    fp8 = iosim.count(algo, dtype="float8_e4m3", **sizes)
    half = iosim.count(algo, dtype="float16", **sizes)
    assert fp8.tiling == half.tiling and fp8.traffic.peak_sram == half.traffic.peak_sram
    t8, t16 = ({t.name: t for t in r.traffic.tensors} for r in (fp8, half))
    assert set(t8) == set(t16) | {"descale"}
    for name, t in t16.items():
        assert (t8[name].reads, t8[name].writes) == (t.reads, t.writes), name  # the same elements
        want = {"Q": 1, "K": 1, "V": 1, "O": 2, "O_split": 2, "l": 4, "m": 4, "lse_split": 4}[name]
        assert t8[name].itemsize == want, name
    # each thread block reads its K/V head's three float32 descales once: flash-swapped's per query head and query
    # block, split-kv's per K/V head (its 2 query heads packed into one head's rows), query block and split
    if algo == "flash-swapped":
        blocks = 4 * -(-239 // fp8.tiling.Br)
    else:
        blocks = 2 * -(-2 * 239 // fp8.tiling.Br) * fp8.tiling.splits
    assert t8["descale"].reads == 3 * blocks and t8["descale"].read_bytes == 12 * blocks


def test_a_numeric_fp8_run_computes_in_float64():
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 2, n, 16)) for n in (113, 239, 239))
    for dtype in FP8_DTYPES:
        r = iosim.simulate("split-kv", q, k, v, M=3000, dtype=dtype, causal=True)
        np.testing.assert_allclose(r.out, iosim.attention_ref(q, k, v, causal=True).out, rtol=0, atol=1e-12)
        assert r.traffic == iosim.count("split-kv", N=113, N_k=239, d=16, heads=2, M=3000, dtype=dtype,
                                        causal=True).traffic


def test_what_has_no_fp8_path_refuses_it_by_name():
    with pytest.raises(iosim.InputError, match=r"dtype='float8_e4m3' for flash, pass 'fwd': it has no FP8 path"):
        iosim.count("flash", N=64, d=8, M=4000, dtype="float8_e4m3")
    with pytest.raises(iosim.InputError, match=r"for flash-swapped, pass 'fwd\+bwd'"):
        iosim.count("flash-swapped", N=64, d=8, M=4000, dtype="float8_e5m2", pass_="fwd+bwd")
    with pytest.raises(iosim.InputError, match=r"dtype='float8_e4m3' has no peak FLOP/s in the A100 preset"):
        GPUS["a100"].peak("float8_e4m3")
    outcome = run(build_parser().parse_args(["sweep", "--N", "1", "--N-k", "4096", "--d", "128", "--heads", "32",
                                             "--kv-heads", "8", "--dtype", "float8_e4m3", "--gpu", "h100"]))
    assert sorted(r.algorithm for r in outcome.rows) == sorted(TAKERS)
    assert outcome.notes[0] == ("--dtype float8_e4m3 leaves out standard, flash, standard-eager, small-cache: they "
                                "take no FP8 path")
    assert "this kernel has no FP8 build" in outcome.notes[1]
    assert all(r.dram is None for r in outcome.rows)


def test_the_roofline_takes_the_fp8_peak_of_the_datasheets():
    # H100 and H200: 3,958 TFLOPS of FP8 with sparsity, dense 1,978.9 (132 SMs × 1,830 MHz × 8,192 FLOPs a clock)
    flops = iosim.count("split-kv", N=4096, N_k=4096, d=128, heads=64, M="228KiB", dtype="float8_e4m3").flops
    for gpu in ("h100", "h200"):
        assert GPUS[gpu].peak("float8_e4m3") == 1978.9e12 == pytest.approx(132 * 1830e6 * 8192, rel=1e-4)
        assert roofline(GPUS[gpu], "float8_e4m3", 1, flops).seconds == flops.matmul / 1978.9e12
    assert GPUS["b200"].peak("float8_e5m2") == 4.5e15


def test_a_model_in_fp8_counts_its_forward_passes_and_halves_its_kv_cache():
    report = iosim.model("llama-3-8b", N=2048, dtype="float8_e4m3", algorithms=["flash-swapped", "split-kv", "flash"])
    training, prefill, decode = report.phases
    assert training.ran == () and "it has no FP8 path" in training.algorithms[0].skipped
    assert [a.algorithm for a in prefill.ran] == ["flash-swapped", "split-kv"]
    assert all(layer.exact for a in prefill.ran + decode.ran for layer in a.layers)
    assert any(note.startswith("float8_e4m3: Q, K and V one byte an element") for note in report.notes)
    half = report.model.kv_cache_bytes("float16")["per_token"]
    assert report.model.kv_cache_bytes("float8_e4m3")["per_token"] * 2 == half == 32 * 2 * 8 * 128 * 2
