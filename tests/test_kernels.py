"""The GPU kernels, run under Numba's CUDA simulator, against float64 attention and the simulator.

Every implementation in kernels.IMPLS runs forward and backward on awkward shapes (N = 1,
33, 113; N_q ≠ N_k; d not a power of two; causal with fully masked rows; dropout) and
must match iosim.reference in float64 and iosim.simulate's numeric output, with the same
dropout mask. Sizes stay small: the simulator runs each GPU thread as a Python thread.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass

import numpy as np
import pytest
import warp_probes
from numba import cuda

import iosim
from iosim import kernels
from iosim.core.inputs import check_qkv, check_scale
from iosim.core.problem import causal_keep
from iosim.core.rng import dropout_tile, philox_word
from iosim.kernels import MatmulConfig, TileConfig
from iosim.kernels import _device as dev
from iosim.reference import attention_backward_ref, attention_ref, dropout_scale_matrix

IMPLS = list(kernels.IMPLS)

# Simulator-sized tilings: 32 threads per block, 16 × 16 tiles, so N = 33 and 113 leave
# ragged last blocks in both directions.
SIM_CONFIGS = {
    "standard": MatmulConfig(BM=16, BN=16, BK=16, TM=4, TN=2, row_threads=16),
    "flash": TileConfig(Br=16, Bc=16, TM=2, TN=4),
    "flash-swapped": TileConfig(Br=16, Bc=16, TM=2, TN=4),
    "flash-swapped-tc": TileConfig(Br=16, Bc=16, TM=2, TN=4),  # its float32 forward and its backward
    "split-kv": TileConfig(Br=16, Bc=16, TM=2, TN=4),  # forward only
}

# SRAM size (elements) handed to the simulator; any size that fits the shapes below will
# do, since its numeric output does not depend on the tiling.
SIM_M = 4096


@dataclass(frozen=True)
class Case:
    batch: int
    heads: int
    n_q: int
    n_k: int
    d: int
    causal: bool = False
    dropout_p: float = 0.0
    scale: float | None = None
    seed: int = 0

    def options(self) -> dict:
        return dict(causal=self.causal, scale=self.scale, dropout_p=self.dropout_p, seed=self.seed)


CASES = {
    "N=1": Case(1, 1, 1, 1, 8),
    "N=33,bh=2": Case(1, 2, 33, 33, 12),
    "N=113,causal": Case(1, 1, 113, 113, 6, causal=True),
    "Nq>Nk,causal,dropout,scale": Case(1, 1, 40, 23, 12, causal=True, dropout_p=0.25, scale=0.3, seed=2**40 + 7),
    "Nq<Nk,causal,batch=2": Case(2, 1, 17, 50, 5, causal=True),
}


def make_inputs(case: Case, dtype) -> tuple[np.ndarray, ...]:
    """q, k, v, dout for `case`, drawn from a generator seeded by the shape."""
    rng = np.random.default_rng([case.batch, case.heads, case.n_q, case.n_k, case.d])
    shapes = [(case.n_q,), (case.n_k,), (case.n_k,), (case.n_q,)]
    return tuple(rng.standard_normal((case.batch, case.heads, n[0], case.d)).astype(dtype) for n in shapes)


def attention_in_dtype(dtype, q, k, v, dout, *, causal=False, scale=None, dropout_p=0.0, seed=0):
    """The reference's algebra run in `dtype`: every array and every intermediate rounded to it.

    Backward uses D = rowsum(dO ∘ O) (Alg. 4 line 19), as the kernels do. Its distance
    from float64 sets how far a kernel computing in that precision may be from float64.
    """
    dt = np.dtype(dtype)
    shape = check_qkv(q, k, v)
    tau = dt.type(check_scale(scale, shape.d))
    q, k, v, do = (np.asarray(x).astype(dt) for x in (q, k, v, dout))

    def t(x):
        return np.swapaxes(x, -1, -2)

    s = (q @ t(k)) * tau  # (b, h, N_q, N_k)
    if causal:
        keep = causal_keep(shape.n_q, shape.n_k, slice(0, shape.n_q), slice(0, shape.n_k))
        s = np.where(keep, s, dt.type(-np.inf))
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), dt.type(0), m)
    e = np.exp(s - m)
    l = e.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(l > 0, e / np.where(l > 0, l, dt.type(1)), dt.type(0)).astype(dt)
        lse = np.where(l[..., 0] > 0, m[..., 0] + np.log(l[..., 0]), -np.inf)
    z = np.asarray(dropout_scale_matrix(shape, dropout_p, seed)).astype(dt)
    out = (p * z) @ v
    dv = t(p * z) @ do
    dp = (do @ t(v)) * z
    ds = p * (dp - (do * out).sum(axis=-1, keepdims=True))
    return out, lse, (ds @ k) * tau, (t(ds) @ q) * tau, dv


BFLOAT16 = "bfloat16"  # numpy has no bfloat16 dtype; the kernels hold it as uint16 bit patterns
BFLOAT16_EPS = 2.0**-7  # 8 significand bits: the gap between 1 and the next bfloat16


def eps(dtype) -> float:
    return BFLOAT16_EPS if isinstance(dtype, str) and dtype == BFLOAT16 else float(np.finfo(dtype).eps)


def dtype_name(dtype) -> str:
    return dtype if isinstance(dtype, str) else np.dtype(dtype).name


def round_bfloat16(x) -> np.ndarray:
    """x rounded to the nearest bfloat16 (ties to even), held in float32."""
    return kernels.from_bfloat16(kernels.to_bfloat16(np.asarray(x, dtype=np.float32)))


def attention_in_bfloat16(q, k, v, dout=None, *, causal=False, scale=None, dropout_p=0.0, seed=0):
    """The reference's algebra in bfloat16: float32 arithmetic, every array and intermediate rounded.

    numpy cannot compute in bfloat16, so each operation runs in float32 and its result is
    rounded to bfloat16, as bfloat16 storage between operations would. Returns (out, lse),
    and with dout also (dq, dk, dv), with D = rowsum(dO ∘ O) as the kernels take it.
    """
    r = round_bfloat16
    shape = check_qkv(q, k, v)
    tau = r(check_scale(scale, shape.d))
    q, k, v = (r(x) for x in (q, k, v))
    s = r(r(q @ np.swapaxes(k, -1, -2)) * tau)  # (b, h, N_q, N_k)
    if causal:
        keep = causal_keep(shape.n_q, shape.n_k, slice(0, shape.n_q), slice(0, shape.n_k))
        s = np.where(keep, s, np.float32(-np.inf))
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), np.float32(0), m)
    e = r(np.exp(s - m))
    l = r(e.sum(axis=-1, keepdims=True))
    with np.errstate(divide="ignore", invalid="ignore"):
        p = r(np.where(l > 0, e / np.where(l > 0, l, np.float32(1)), np.float32(0)))
        lse = r(np.where(l[..., 0] > 0, m[..., 0] + np.log(l[..., 0]), -np.inf))
    z = r(np.asarray(dropout_scale_matrix(shape, dropout_p, seed)))
    out = r(r(p * z) @ v)
    if dout is None:
        return out, lse
    do = r(dout)
    dv = r(np.swapaxes(r(p * z), -1, -2) @ do)
    dp = r(r(do @ np.swapaxes(v, -1, -2)) * z)
    ds = r(p * r(dp - r((do * out).sum(axis=-1, keepdims=True))))
    return out, lse, r(r(ds @ k) * tau), r(r(np.swapaxes(ds, -1, -2) @ q) * tau), dv


def assert_close(name: str, got, ref, lowp, dtype) -> None:
    """|got − ref| <= 4 × |lowp − ref| + 2 eps(dtype) · max|ref|, and identical non-finite entries.

    A kernel sums in another order than numpy (and folds tau into Q, and forms P as
    exp(S − lse)), so it may round differently, but it should be about as accurate as the
    same algebra in its precision: 4× that run's error. The 2-ulp term covers outputs the
    low-precision run gets exactly (N = 1, where P = 1).
    """
    got = np.asarray(got, dtype=np.float64)
    finite = np.isfinite(ref)
    assert np.array_equal(got[~finite], ref[~finite]), (
        f"{name}: non-finite entries differ at {np.argwhere(got[~finite] != ref[~finite])[:5].tolist()}"
    )
    err = float(np.max(np.abs(got[finite] - ref[finite]), initial=0.0))
    err_lowp = float(np.max(np.abs(np.asarray(lowp, dtype=np.float64)[finite] - ref[finite]), initial=0.0))
    magnitude = float(np.max(np.abs(ref[finite]), initial=0.0))
    tol = 4 * err_lowp + 2 * eps(dtype) * magnitude
    assert err <= tol, (
        f"{name}: max |kernel − float64| = {err:.3g} > {tol:.3g} "
        f"(4 × {dtype_name(dtype)} reference error {err_lowp:.3g} + 2 eps × max|ref| {magnitude:.3g})"
    )


def has_backward(impl: str) -> bool:
    return kernels.IMPLS[impl].ALGORITHM.backward is not None


def check_against_float64(impl: str, case: Case, dtype) -> None:
    """Forward (and backward, where the impl has one; else its refusal) against float64 and iosim.simulate."""
    q, k, v, do = make_inputs(case, dtype)
    opts = case.options()
    config = SIM_CONFIGS[impl]
    fwd = kernels.attention(q, k, v, impl=impl, config=config, **opts)
    if has_backward(impl):
        grads = kernels.attention_backward(q, k, v, fwd.out, fwd.lse, do, impl=impl, config=config, **opts)
        ref_grads = attention_backward_ref(q, k, v, do, **opts)
    else:
        with pytest.raises(iosim.InputError, match=f"impl='{impl}' is forward only"):
            kernels.attention_backward(q, k, v, fwd.out, fwd.lse, do, impl=impl, **opts)
        grads = ref_grads = ()

    ref = attention_ref(q, k, v, **opts)
    lowp = attention_in_dtype(dtype, q, k, v, do, **opts)
    assert fwd.out.dtype == dtype and all(g.dtype == dtype for g in grads)
    assert fwd.lse.dtype == np.float32
    for name, got, want, low in zip(
        ("out", "lse", "dq", "dk", "dv"), (fwd.out, fwd.lse, *grads), (ref.out, ref.lse, *ref_grads), lowp
    ):
        assert_close(f"{impl} {name}", got, want, low, dtype)

    sim = iosim.simulate(
        kernels.IMPLS[impl].ALGORITHM, q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), M=SIM_M, **opts
    )
    assert_close(f"{impl} out vs iosim.simulate", fwd.out, sim.out, lowp[0], dtype)
    if sim.lse is not None:  # the simulated standard algorithm keeps P, not ℓ and m
        assert_close(f"{impl} lse vs iosim.simulate", fwd.lse, sim.lse, lowp[1], dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_grouped_query_forward_reads_each_group_s_kv_head(dtype):
    # 4 query heads over 2 K/V heads, batch 2, N_q ≠ N_k, neither a multiple of the tile: flash-swapped's forward
    # reads K/V head h // 2 for query head h, as repeating K and V per query head would give. Causal with dropout:
    # the dropout mask is drawn per query head (its own head map) beside the K/V head map every case shares.
    rng = np.random.default_rng(7)
    q = rng.standard_normal((2, 4, 33, 16)).astype(dtype)
    k, v = (rng.standard_normal((2, 2, 47, 16)).astype(dtype) for _ in range(2))
    opts = dict(causal=True, dropout_p=0.2, seed=3)
    fwd = kernels.attention(q, k, v, impl="flash-swapped", config=SIM_CONFIGS["flash-swapped"], **opts)
    ref = attention_ref(q, k, v, **opts)
    lowp = attention_in_dtype(dtype, q, np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1), np.zeros_like(q), **opts)
    assert fwd.out.shape == q.shape and fwd.lse.shape == q.shape[:3]
    assert_close("grouped out", fwd.out, ref.out, lowp[0], dtype)
    assert_close("grouped lse", fwd.lse, ref.lse, lowp[1], dtype)
    sim = iosim.simulate("flash-swapped", *(x.astype(np.float64) for x in (q, k, v)), M=SIM_M, **opts)
    assert_close("grouped out vs iosim.simulate", fwd.out, sim.out, lowp[0], dtype)


@pytest.mark.usefixtures("no_launch")
def test_grouped_query_attention_is_refused_where_a_kernel_indexes_kv_by_query_head():
    q, k = np.zeros((1, 4, 8, 8), np.float32), np.zeros((1, 2, 8, 8), np.float32)
    with pytest.raises(
        iosim.InputError,
        match=r"kv_heads=2: flash take k and v with heads=4 heads, as many as q; "
        r"grouped-query attention runs on the forward of \['flash-swapped', 'split-kv'\]",
    ):
        kernels.attention(q, k, k, impl="flash")
    with pytest.raises(iosim.InputError, match="kv_heads=2: the backward kernels take k and v with heads=4"):
        kernels.attention_backward(q, k, k, q, q[..., 0], q, impl="flash-swapped")


def test_every_impl_names_the_registered_iosim_algorithm_it_implements():
    for impl, module in kernels.IMPLS.items():
        algorithm = module.ALGORITHM
        assert isinstance(algorithm, iosim.Algorithm), f"kernels.IMPLS[{impl!r}].ALGORITHM = {algorithm!r}"
        assert iosim.ALGORITHMS.get(algorithm.name) is algorithm, (
            f"kernels.IMPLS[{impl!r}] implements {algorithm.name!r}, which is not the object registered "
            f"in iosim.ALGORITHMS ({sorted(iosim.ALGORITHMS)})"
        )


def test_every_impl_is_an_implementation_and_those_taking_bfloat16_say_at_which_d():
    from iosim.kernels.api import Implementation, TakesBfloat16

    for impl, module in kernels.IMPLS.items():
        assert isinstance(module, Implementation), f"kernels.IMPLS[{impl!r}] lacks part of kernels.api.Implementation"
        assert isinstance(module.BFLOAT16, bool), f"kernels.IMPLS[{impl!r}].BFLOAT16 = {module.BFLOAT16!r}"
        if module.BFLOAT16:
            assert isinstance(module, TakesBfloat16), f"kernels.IMPLS[{impl!r}] takes bfloat16 without check_bfloat16"
    assert [name for name, m in kernels.IMPLS.items() if m.BFLOAT16] == ["flash-swapped-tc"]


# flash-swapped-tc's float32 forward and backward are flash-swapped's kernels at the same tiles (its tensor cores take
# 16-bit types): one case checks that it hands them over; the others would only run the same kernels again
FLOAT32_CASES = [(impl, name) for impl in IMPLS for name in CASES
                 if impl != "flash-swapped-tc" or name == "Nq>Nk,causal,dropout,scale"]


@pytest.mark.parametrize("impl, case_name", FLOAT32_CASES)
def test_float32_matches_float64_and_simulator(impl, case_name):
    check_against_float64(impl, CASES[case_name], np.float32)


@pytest.mark.parametrize("impl", IMPLS)
def test_float16_inputs_accumulate_in_float32(impl):
    case = Case(1, 2, 37, 29, 12, causal=True, dropout_p=0.2, seed=5)
    check_against_float64(impl, case, np.float16)


# Batch 2, N_q > N_k causal (query rows 0-7 see no key), dropout, a scale, d odd: K and V as words joined from
# halves, where bfloat16 differs from float16 (64-bit word pairs copy bits whatever the type; bfloat16 takes them at
# d = 16 in test_tensor_core_forward_over_several_key_blocks, and runs more than one query block in the backward's).
BFLOAT16_CASES = {
    "Nq>Nk,causal,dropout,scale,batch=2,d=5": Case(2, 1, 37, 29, 5, causal=True, dropout_p=0.2, scale=0.3, seed=5),
}


@pytest.mark.parametrize("case_name", list(BFLOAT16_CASES))
def test_bfloat16_matches_float64(case_name):
    """flash-swapped-tc in bfloat16 (float32 inputs rounded on the host) against float64 on the unrounded inputs.

    The tolerance is the error of the reference's algebra run in bfloat16 (rounded inputs
    included), as for float16. Inputs given as bit patterns give O's bit patterns.
    """
    case = BFLOAT16_CASES[case_name]
    q, k, v, _ = make_inputs(case, np.float32)
    opts = case.options()
    fwd = kernels.attention(q, k, v, impl="flash-swapped-tc", dtype=BFLOAT16, **opts)
    assert fwd.out.dtype == np.float32 and fwd.lse.dtype == np.float32, (fwd.out.dtype, fwd.lse.dtype)
    assert np.array_equal(round_bfloat16(fwd.out), fwd.out), "O holds values that are not bfloat16"
    ref = attention_ref(q, k, v, **opts)
    lowp = attention_in_bfloat16(q, k, v, **opts)
    for name, got, want, low in zip(("out", "lse"), fwd, (ref.out, ref.lse), lowp):
        assert_close(f"flash-swapped-tc bfloat16 {name}", got, want, low, BFLOAT16)

    bits = kernels.attention(*(kernels.to_bfloat16(x) for x in (q, k, v)), impl="flash-swapped-tc", dtype=BFLOAT16,
                             **opts)
    assert bits.out.dtype == np.uint16, bits.out.dtype
    assert np.array_equal(kernels.from_bfloat16(bits.out), fwd.out) and np.array_equal(bits.lse, fwd.lse)


# Shapes that take flash-swapped-tc through several key blocks: B_c = 64 keys per step at these d, so N_k ≥ 128 runs
# steps without the mask test before the masked ones, and N_q > 64 gives query blocks whose causal edge lies in
# different key blocks: at N_q = 130, N_k = 140 (query i sees keys up to i + 10) query block 0 masks key blocks 0
# and 1, block 1 runs key block 0 without the mask test and masks 1 and 2, block 2 (two rows) runs 0 and 1 without
# it and masks 2. d covers two of the ways K and V reach shared memory: words joined from halves (d odd; 2 mod 4 in
# the backward's test, whose forward passes also take bfloat16 through several key blocks) and 64-bit word pairs
# with every copy pass whole (d = 16). The third, word pairs with padding words (d a multiple of 4, not of 16), runs in
# test_float16_inputs_accumulate_in_float32 (d = 12), and pairs with a last copy pass partly past the row in the
# backward's test (d = 112). One batch·head each: test_float16_inputs_accumulate_in_float32 and
# test_bfloat16_matches_float64 run the tensor-core kernels at batch·heads = 2.
TENSOR_CORE_CASES = {
    "fp16,Nq=130,causal,dropout,scale<0,d=7": (np.float16, Case(1, 1, 130, 140, 7, causal=True, dropout_p=0.1,
                                                                     scale=-0.4, seed=3)),
    "bf16,Nk=129,dropout,d=16": (BFLOAT16, Case(1, 1, 64, 129, 16, dropout_p=0.2, seed=11)),
}


@pytest.mark.parametrize("case_name", list(TENSOR_CORE_CASES))
def test_tensor_core_forward_over_several_key_blocks(case_name):
    """flash-swapped-tc's forward against float64 where its steps with and without the mask test both run."""
    dtype, case = TENSOR_CORE_CASES[case_name]
    opts = case.options()
    if dtype is BFLOAT16:
        q, k, v, _ = make_inputs(case, np.float32)
        fwd = kernels.attention(q, k, v, impl="flash-swapped-tc", dtype=BFLOAT16, **opts)
        lowp = attention_in_bfloat16(q, k, v, **opts)
    else:
        q, k, v, do = make_inputs(case, dtype)
        fwd = kernels.attention(q, k, v, impl="flash-swapped-tc", **opts)
        lowp = attention_in_dtype(dtype, q, k, v, do, **opts)[:2]
    ref = attention_ref(q, k, v, **opts)
    for name, got, want, low in zip(("out", "lse"), fwd, (ref.out, ref.lse), lowp):
        assert_close(f"flash-swapped-tc {case_name} {name}", got, want, low, dtype)


# The tensor-core backward: 64 keys per block and, at d ≤ 64, 64 queries per step. N_q = 70, N_k = 134, causal (query
# i sees keys up to i + 64) runs every kind of step: key block 0 runs query block 0 without the mask test, then the
# ragged block 1 (6 queries) masked; key block 1 masks block 0, through which its causal edge passes, and block 1;
# key block 2 (6 keys, ragged: all its steps masked) skips block 0, which sees none of it, and masks block 1. Its
# forward passes go through several key blocks too (query block 0: key block 0 without the mask test, 1 masked;
# block 1: 0 and 1 without it, 2 masked). At d = 112 (one key block: the cost is in the d-wide products) a step takes
# 16 queries, dQ's 7 pairs of column tiles are split over 4 warps (the last one's second pair a repeat, not added),
# and a row's 28 word pairs take two copy passes of 16 lanes, the second partly past the row. (float16 at d ≤ 64:
# test_float16_inputs_accumulate_in_float32.)
TENSOR_CORE_BACKWARD_CASES = {
    "bf16,Nq=70,Nk=134,causal,dropout,scale<0,d=10": (BFLOAT16, Case(1, 1, 70, 134, 10, causal=True, dropout_p=0.15,
                                                                         scale=-0.5, seed=7)),
    "fp16,Nq=20,Nk=64,causal,d=112": (np.float16, Case(1, 1, 20, 64, 112, causal=True)),
}


@pytest.mark.parametrize("case_name", list(TENSOR_CORE_BACKWARD_CASES))
def test_tensor_core_backward_matches_float64(case_name):
    """flash-swapped-tc's outputs and gradients against float64, within the error of the reference's algebra in
    the 16-bit type."""
    dtype, case = TENSOR_CORE_BACKWARD_CASES[case_name]
    opts = case.options()
    q, k, v, do = make_inputs(case, np.float32 if dtype is BFLOAT16 else dtype)
    extra = dict(dtype=BFLOAT16) if dtype is BFLOAT16 else {}
    fwd = kernels.attention(q, k, v, impl="flash-swapped-tc", **extra, **opts)
    grads = kernels.attention_backward(q, k, v, fwd.out, fwd.lse, do, impl="flash-swapped-tc", **extra, **opts)
    if dtype is BFLOAT16:
        lowp = attention_in_bfloat16(q, k, v, do, **opts)
        assert all(np.array_equal(round_bfloat16(g), g) for g in grads), "gradients hold values that are not bfloat16"
    else:
        lowp = attention_in_dtype(dtype, q, k, v, do, **opts)
    ref = attention_ref(q, k, v, **opts)
    ref_grads = attention_backward_ref(q, k, v, do, **opts)
    for name, got, want, low in zip(("out", "lse", "dq", "dk", "dv"), (*fwd, *grads), (ref.out, ref.lse, *ref_grads),
                                    lowp):
        assert_close(f"flash-swapped-tc {case_name} {name}", got, want, low, dtype)


def test_to_bfloat16_rounds_to_nearest_even():
    def f32(word):
        return np.array([word], np.uint32).view(np.float32)[0]

    one = 0x3F800000  # 1.0; a bfloat16 keeps the top 16 bits, so its last bit is 2^-7 here
    cases = {
        "1": (one, 0x3F80),
        "1 + 2^-8, a tie: down to even": (one | 0x8000, 0x3F80),
        "1 + 3·2^-8, a tie: up to even": (one | 0x18000, 0x3F82),
        "just above the tie": (one | 0x8001, 0x3F81),
        "just below the tie": (one | 0x7FFF, 0x3F80),
        "−(1 + 2^-8 + 2^-23)": (0xBF808001, 0xBF81),
        "−0": (0x80000000, 0x8000),
        "largest bfloat16": (0x7F7F0000, 0x7F7F),
        "largest float32 overflows": (0x7F7FFFFF, 0x7F80),
        "+inf": (0x7F800000, 0x7F80),
        "−inf": (0xFF800000, 0xFF80),
        "smallest subnormal, down to 0": (0x00000001, 0x0000),
        "subnormal tie, down to even": (0x00008000, 0x0000),
        "subnormal tie, up to even": (0x00018000, 0x0002),
        "quiet NaN": (0x7FC00000, 0x7FC0),
        "NaN with a low payload stays NaN": (0x7F800001, 0x7FC0),
        "negative NaN": (0xFF800001, 0xFFC0),
    }
    x = np.array([f32(word) for word, _ in cases.values()], np.float32)
    got = kernels.to_bfloat16(x)
    want = np.array([bits for _, bits in cases.values()], np.uint16)
    bad = [(name, hex(g), hex(w)) for name, g, w in zip(cases, got, want) if g != w]
    assert not bad, f"(value, got, want): {bad}"

    # every bfloat16 widens exactly and rounds back to itself; NaNs stay NaNs
    every = np.arange(2**16, dtype=np.uint16)
    wide = kernels.from_bfloat16(every)
    nan = np.isnan(wide)
    assert nan.sum() == 2 * (2**7 - 1), nan.sum()
    assert np.array_equal(kernels.to_bfloat16(wide)[~nan], every[~nan])
    assert np.all(np.isnan(kernels.from_bfloat16(kernels.to_bfloat16(wide[nan]))))

    # random finite floats: the nearer of the two bfloat16 neighbours, the even one on a tie
    rng = np.random.default_rng(7)
    words = rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32)
    words = words[(words & 0x7F800000) != 0x7F800000]  # finite
    words = words[(words & 0x7FFFFFFF) < 0x7F7F0000]  # both neighbours finite
    x = words.view(np.float32)
    below = (words >> 16).astype(np.uint16)  # truncation: the neighbour nearer zero
    above = below + np.uint16(1)
    gap_below = np.abs(x.astype(np.float64) - kernels.from_bfloat16(below))
    gap_above = np.abs(x.astype(np.float64) - kernels.from_bfloat16(above))
    even = np.where(below % 2 == 0, below, above)
    want = np.where(gap_below < gap_above, below, np.where(gap_above < gap_below, above, even))
    got = kernels.to_bfloat16(x)
    bad = np.flatnonzero(got != want)
    first = [(hex(words[i]), hex(got[i]), hex(want[i])) for i in bad[:3]]
    assert bad.size == 0, f"{bad.size} of {x.size} differ, first (float32, got, want) {first}"


def test_fully_masked_rows_give_zero_and_minus_inf():
    # causal with N_q = 9 > N_k = 4: query rows 0..4 see no key (j <= i + 4 − 9)
    q, k, v, _ = make_inputs(Case(1, 1, 9, 4, 4), np.float32)
    for impl in IMPLS:
        out, lse = kernels.attention(q, k, v, impl=impl, causal=True, config=SIM_CONFIGS[impl])
        assert np.array_equal(out[0, 0, :5], np.zeros((5, 4), np.float32)), f"{impl}: {out[0, 0, :5]}"
        assert np.all(np.isneginf(lse[0, 0, :5])), f"{impl}: lse {lse[0, 0, :5]}"
        assert np.all(np.isfinite(lse[0, 0, 5:])), f"{impl}: lse {lse[0, 0, 5:]}"


# ---------------------------------------------------------------------------------------
# Dropout: the device generator reproduces iosim.core.rng bit for bit.
# ---------------------------------------------------------------------------------------


@cuda.jit
def _philox_words_kernel(seed_lo, seed_hi, bh, row, col, out):
    start = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    for i in range(start, out.shape[0], cuda.gridDim.x * cuda.blockDim.x):
        out[i] = dev.philox_word(seed_lo, seed_hi, bh[i], row[i], col[i])


@pytest.mark.parametrize("seed", [0, 1, 2**32 - 1, 2**32, 0xDEADBEEFCAFEBABE, 2**64 - 1])
def test_device_philox_equals_host_philox(seed):
    rng = np.random.default_rng(seed % 2**32)
    n = 96
    # counters from small to the top of the 32-bit range, where a signed or float
    # conversion would go wrong
    bh = np.concatenate([np.arange(8), rng.integers(0, 2**32, n - 8)]).astype(np.int64)
    row = np.concatenate([np.arange(8)[::-1], rng.integers(0, 2**32, n - 8)]).astype(np.int64)
    col = np.concatenate([[0, 1, 2**31 - 1, 2**31, 2**32 - 1, 5, 6, 7], rng.integers(0, 2**32, n - 8)]).astype(np.int64)
    out = np.zeros(n, dtype=np.uint64)
    _philox_words_kernel[1, 32](np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32), bh, row, col, out)
    want = philox_word(seed, bh, row, col)
    bad = np.flatnonzero(out != want)
    assert bad.size == 0, f"seed {seed}: {bad.size} words differ, first at (bh, row, col) = " + str(
        [(int(bh[i]), int(row[i]), int(col[i]), int(out[i]), int(want[i])) for i in bad[:3]]
    )


@pytest.mark.parametrize("impl", IMPLS)
def test_dropout_mask_is_the_simulators_bit_for_bit(impl):
    """Recover Z from the kernels' own outputs and compare it with iosim.core.rng's mask.

    With Q = 0 every visible P_ij = 1/N_k. With V = I (one-hot rows) O_ij = P_ij Z_ij, and
    with dO = I, dV_ji = P_ij Z_ij: the kept entries are exactly the non-zero ones.
    """
    batch, heads, n_q, n_k, d = 1, 2, 20, 24, 24
    p, seed = 0.37, 2**40 + 12345
    q = np.zeros((batch, heads, n_q, d), np.float32)
    k = np.random.default_rng(0).standard_normal((batch, heads, n_k, d)).astype(np.float32)
    v = np.broadcast_to(np.eye(n_k, d, dtype=np.float32), (batch, heads, n_k, d)).copy()
    do = np.broadcast_to(np.eye(n_q, d, dtype=np.float32), (batch, heads, n_q, d)).copy()
    config = SIM_CONFIGS[impl]
    fwd = kernels.attention(q, k, v, impl=impl, dropout_p=p, seed=seed, config=config)

    want = dropout_tile(seed, p, batch * heads, slice(0, n_q), slice(0, n_k))  # (bh, N_q, N_k)
    kept_by_pass = {"forward": fwd.out.reshape(batch * heads, n_q, d)[:, :, :n_k] > 0}
    if has_backward(impl):
        _, _, dv = kernels.attention_backward(q, k, v, fwd.out, fwd.lse, do, impl=impl, dropout_p=p, seed=seed,
                                              config=config)
        kept_by_pass["backward"] = np.swapaxes(dv.reshape(batch * heads, n_k, d)[:, :, :n_q], 1, 2) > 0
    assert 0 < want.mean() < 1
    for name, kept in kept_by_pass.items():
        bad = np.argwhere(kept != want)
        assert bad.size == 0, (
            f"{impl} {name}: {len(bad)} of {want.size} keep decisions differ, first {bad[:3].tolist()}"
        )


# ---------------------------------------------------------------------------------------
# The simulator itself: one shared array per cuda.shared.array line and block.
# ---------------------------------------------------------------------------------------


@pytest.mark.skipif(not dev.simulator_enabled(), reason="checks a workaround in Numba's CUDA simulator")
def test_simulator_gives_every_thread_of_a_block_the_same_shared_array():
    """kernels._device locks the simulator's shared-array lookup (docs/kernels.md).

    Unlocked, 32 threads that reach one cuda.shared.array line together get more than one
    array in some blocks at this switch interval (28 of 300 on an idle 2-core machine, 1 of
    100 under load); locked, never.
    """
    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    threads, launches = 32, 100
    split = []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible, to hit the window
    try:
        for _ in range(launches):
            shared = FakeCUDAShared(0)
            start = threading.Barrier(threads)
            got = []

            def thread():
                start.wait()
                got.append(id(shared.array(16, np.float32)))  # one line for every thread

            pool = [threading.Thread(target=thread) for _ in range(threads)]
            for t in pool:
                t.start()
            for t in pool:
                t.join()
            split.append(len(set(got)))
    finally:
        sys.setswitchinterval(interval)
    bad = [n for n in split if n != 1]
    assert not bad, f"{len(bad)} of {launches} blocks got more than one array, up to {max(bad)}"


# ---------------------------------------------------------------------------------------
# The host API: device arrays in and out, and validation before any launch.
# ---------------------------------------------------------------------------------------


def test_device_arrays_in_give_device_arrays_out_equal_to_host_results():
    q, k, v, do = make_inputs(Case(1, 1, 9, 11, 4), np.float32)
    config = SIM_CONFIGS["flash-swapped"]
    host = kernels.attention(q, k, v, config=config)
    dev_in = [cuda.to_device(x) for x in (q, k, v, do)]
    on_dev = kernels.attention(*dev_in[:3], config=config)
    assert hasattr(on_dev.out, "copy_to_host") and hasattr(on_dev.lse, "copy_to_host")
    assert np.array_equal(on_dev.out.copy_to_host(), host.out)
    assert np.array_equal(on_dev.lse.copy_to_host(), host.lse)
    grads_dev = kernels.attention_backward(*dev_in[:3], on_dev.out, on_dev.lse, dev_in[3], config=config)
    grads_host = kernels.attention_backward(q, k, v, host.out, host.lse, do, config=config)
    # Bit-equal dQ too, even on a GPU: N_k = 11 < B_c = 16 gives T_c = 1, so flash-swapped's
    # backward makes exactly one atomic add (onto 0) per dQ element, in no order that matters.
    for name, gd, gh in zip(("dq", "dk", "dv"), grads_dev, grads_host):
        assert np.array_equal(gd.copy_to_host(), gh), f"{name} differs between device and host inputs"


@pytest.fixture
def no_launch(monkeypatch):
    """Make any launch fail loudly, so validation errors are known to come first."""

    def launched(*args, **kwargs):
        raise AssertionError("a kernel was launched before the inputs were validated")

    for module in kernels.IMPLS.values():
        monkeypatch.setattr(module, "forward", launched)
        monkeypatch.setattr(module, "backward", launched)


def _qkv(n_q=4, n_k=4, d=8, dtype=np.float32):
    return (np.zeros((1, 1, n, d), dtype) for n in (n_q, n_k, n_k))


@pytest.mark.usefixtures("no_launch")
@pytest.mark.parametrize(
    "change, error, words",
    [
        (dict(q=np.zeros((1, 4, 8), np.float32)), ValueError, ["q", "4 dimensions"]),
        (dict(q=np.zeros((1, 1, 4, 8), np.float64)), TypeError, ["q", "float64", "float32", "float16"]),
        (dict(k=np.zeros((1, 1, 4, 8), np.float16)), TypeError, ["k", "float16", "float32"]),
        (dict(v=np.zeros((1, 1, 5, 8), np.float32)), ValueError, ["k", "v", "must agree"]),
        (dict(impl="flash3"), ValueError, ["impl='flash3'", "flash-swapped", "standard"]),
        (dict(dropout_p=1.0), ValueError, ["dropout_p=1.0", "[0, 1)"]),
        (dict(seed=-1), ValueError, ["seed=-1", "[0, 2**64)"]),
        (dict(causal="yes"), TypeError, ["causal='yes'", "bool"]),
        (dict(scale=0.0), ValueError, ["scale=0.0"]),
        (dict(config=TileConfig(16, 16, 3, 4)), ValueError, ["config.TM=3", "16"]),
        (dict(config=MatmulConfig()), TypeError, ["config", "TileConfig"]),
        (dict(config=TileConfig(64, 64, 1, 1)), ValueError, ["4096 threads", "[1, 1024]"]),
        (dict(dtype="bf16", impl="flash-swapped-tc"), ValueError, ["dtype='bf16'", "None", "'bfloat16'"]),
        (dict(dtype="bfloat16"), ValueError, ["dtype='bfloat16'", "flash-swapped-tc", "impl='flash-swapped'"]),
        (dict(dtype="bfloat16", impl="flash-swapped-tc", q=np.zeros((1, 1, 4, 8), np.float16)), TypeError,
         ["q", "float16", "float32", "uint16"]),
        (dict(dtype="bfloat16", impl="flash-swapped-tc", k=np.zeros((1, 1, 4, 8), np.uint16)), TypeError,
         ["k", "uint16", "float32"]),
        (dict(impl="flash-swapped-tc", q=np.zeros((1, 1, 4, 8), np.uint16)), TypeError, ["q", "uint16", "float16"]),
    ],
)
def test_bad_forward_input_is_rejected_naming_the_parameter(change, error, words):
    q, k, v = _qkv()
    args = dict(q=q, k=k, v=v, impl="flash-swapped")
    args.update(change)
    with pytest.raises(error) as info:
        kernels.attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)
    for word in words:
        assert word in str(info.value), f"{word!r} missing from: {info.value}"


@pytest.mark.usefixtures("no_launch")
@pytest.mark.parametrize("impl", ["flash", "flash-swapped"])
@pytest.mark.parametrize("backward", [False, True])
def test_head_dim_too_large_for_shared_memory_is_rejected(impl, backward):
    d_max = kernels.max_head_dim(impl, backward)
    assert 64 <= d_max < 1024, f"{impl}: d_max={d_max}"
    kernels.resolve_config(impl, d_max, backward)  # the largest allowed d still resolves
    q, k, v = _qkv(n_q=2, n_k=2, d=d_max + 1)
    with pytest.raises(ValueError) as info:
        if backward:
            out, lse = np.zeros_like(q), np.zeros(q.shape[:3], np.float32)
            kernels.attention_backward(q, k, v, out, lse, np.zeros_like(q), impl=impl)
        else:
            kernels.attention(q, k, v, impl=impl)
    assert f"d={d_max + 1}" in str(info.value) and f"[1, {d_max}]" in str(info.value), str(info.value)


@pytest.mark.usefixtures("no_launch")
@pytest.mark.parametrize(
    "change, error, words",
    [
        (dict(out=np.zeros((1, 1, 4, 8), np.float16)), TypeError, ["out", "float16", "float32"]),
        (dict(lse=np.zeros((1, 1, 5), np.float32)), ValueError, ["lse", "(1, 1, 4)", "(1, 1, 5)"]),
        (dict(dout=np.zeros((1, 1, 4, 7), np.float32)), ValueError, ["dout", "(1, 1, 4, 8)"]),
        (dict(config=TileConfig(32, 16, 2, 2)), ValueError, ["Br == config.Bc", "Br=32", "Bc=16"]),
        (dict(dtype="bfloat16"), ValueError, ["dtype='bfloat16'", "flash-swapped-tc", "impl='flash-swapped'"]),
        (dict(dtype="bfloat16", impl="flash-swapped-tc", dout=np.zeros((1, 1, 4, 8), np.float16)), TypeError,
         ["dout", "float16", "uint16"]),
        (dict(dtype="bfloat16", impl="flash-swapped-tc", d=136), ValueError, ["d=136", "[1, 128]", "bfloat16"]),
    ],
)
def test_bad_backward_input_is_rejected_naming_the_parameter(change, error, words):
    change = dict(change)  # d is the head dim of the inputs, not an argument
    q, k, v = _qkv(d=change.pop("d", 8))
    args = dict(out=np.zeros_like(q), lse=np.zeros((1, 1, 4), np.float32), dout=np.zeros_like(q))
    args.update(change)
    with pytest.raises(error) as info:
        kernels.attention_backward(q, k, v, args.pop("out"), args.pop("lse"), args.pop("dout"), **args)
    for word in words:
        assert word in str(info.value), f"{word!r} missing from: {info.value}"


def test_mma_fragments_follow_the_ptx_isa():
    from iosim.kernels import _mma

    # lane 5: group 1, quad 1 (PTX ISA, mma.m16n8k16 fragments for .f16 A, B and .f32 C)
    assert [_mma.a_element(5, w, h) for w in range(4) for h in range(2)] == [
        (1, 2), (1, 3), (9, 2), (9, 3), (1, 10), (1, 11), (9, 10), (9, 11)
    ]
    assert [_mma.b_element(5, w, h) for w in range(2) for h in range(2)] == [(2, 1), (3, 1), (10, 1), (11, 1)]
    assert [_mma.c_element(5, i) for i in range(4)] == [(1, 2), (1, 3), (9, 2), (9, 3)]
    # every element of A, B and C is held by exactly one (lane, slot)
    for name, cells, size in (
        ("A", [_mma.a_element(la, w, h) for la in range(32) for w in range(4) for h in range(2)], 16 * 16),
        ("B", [_mma.b_element(la, w, h) for la in range(32) for w in range(2) for h in range(2)], 16 * 8),
        ("C", [_mma.c_element(la, i) for la in range(32) for i in range(4)], 16 * 8),
    ):
        assert len(set(cells)) == len(cells) == size, f"{name}: {len(set(cells))} distinct of {len(cells)}"


@pytest.mark.parametrize("dtype", ["float16", BFLOAT16])
def test_mma_16816_computes_a_b_plus_c_from_the_lanes_fragments(dtype):
    from iosim.kernels import _mma

    if dtype == BFLOAT16:
        mma, pack, bits = _mma.mma_16816_bf16, _mma.pack_bfloat162, kernels.to_bfloat16
    else:
        mma, pack = _mma.mma_16816, _mma.pack_half2

        def bits(x):
            return np.asarray(x, np.float32).astype(np.float16).view(np.uint16)

    rng = np.random.default_rng(16816)
    a_bits = bits(rng.standard_normal((16, 16)).astype(np.float32))
    b_bits = bits(rng.standard_normal((16, 8)).astype(np.float32))
    c = rng.standard_normal((16, 8)).astype(np.float32)
    a_words = np.zeros((32, 4), np.uint32)
    b_words = np.zeros((32, 2), np.uint32)
    c_lanes = np.zeros((32, 4), np.float32)
    for lane in range(32):
        for w in range(4):
            a_words[lane, w] = np.array([a_bits[_mma.a_element(lane, w, h)] for h in range(2)]).view(np.uint32)[0]
        for w in range(2):
            b_words[lane, w] = np.array([b_bits[_mma.b_element(lane, w, h)] for h in range(2)]).view(np.uint32)[0]
        for i in range(4):
            c_lanes[lane, i] = c[_mma.c_element(lane, i)]
    packed = np.zeros((32, 2), np.uint32)
    warp_mma = cuda.jit(warp_probes.mma_probe(mma, pack))
    d_lanes = np.zeros((32, 4), np.float32)
    warp_mma[1, 32](a_words, b_words, c_lanes, d_lanes, packed)
    d = np.zeros((16, 8))
    for lane in range(32):
        for i in range(4):
            d[_mma.c_element(lane, i)] = d_lanes[lane, i]
    if dtype == BFLOAT16:
        a, b = kernels.from_bfloat16(a_bits), kernels.from_bfloat16(b_bits)
    else:
        a, b = a_bits.view(np.float16), b_bits.view(np.float16)
    a, b = a.astype(np.float64), b.astype(np.float64)
    want = a @ b + c
    # a tensor core multiplies exactly but adds with its own alignment and truncation (Fasi, Higham, Mikaitis and
    # Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ CS 2021): bound each of the K + 1 additions by
    # one float32 eps of the magnitudes summed; a fragment in the wrong place is off by a term's size
    magnitude = np.abs(a) @ np.abs(b) + np.abs(c)
    err = np.abs(d - want)
    bound = (_mma.K + 1) * np.finfo(np.float32).eps * magnitude
    assert np.all(err <= bound), f"{dtype}: max |D − (A·B + C)| / bound = {np.max(err / bound):.3g}"
    # lo in the low half, each rounded to nearest
    want_packed = [bits(np.array([0.0, 1.5], np.float32)).view(np.uint32)[0],
                   bits(np.array([-2.0, 1.0 / 3.0], np.float32)).view(np.uint32)[0]]
    assert np.array_equal(packed[0], want_packed), (dtype, packed[0], want_packed)


def test_ldmatrix_fills_the_mma_fragments_the_ptx_isa_assigns():
    """ldmatrix.x4 over the four 8 × 8 quarters of a row-major 16 × 16 A gives each lane its A fragment,
    and ldmatrix.x4.trans over the two 8 × 8 halves of a row-major 16 × 8 B (k rows) its B fragment:
    the layouts the kernel's loads rely on, checked against the fragment maps pinned to the PTX ISA above."""
    from iosim.kernels import _mma

    width = warp_probes.LDMATRIX_WIDTH
    halves = np.arange(16 * 2 * width, dtype=np.uint16).reshape(16, 2 * width)  # element (r, c) = its own index
    words = halves.view(np.uint32)  # (16, width)
    load = cuda.jit(warp_probes.ldmatrix_probe())
    a_words = np.zeros((32, 4), np.uint32)
    b_words = np.zeros((32, 4), np.uint32)
    load[1, 32](words, a_words, b_words)
    for lane in range(32):
        got_a = a_words[lane].view(np.uint16).reshape(4, 2)
        got_b = b_words[lane].view(np.uint16).reshape(4, 2)
        for w in range(4):
            for h in range(2):
                assert got_a[w, h] == halves[_mma.a_element(lane, w, h)], (lane, w, h)
        for w in range(2):
            for h in range(2):
                assert got_b[w, h] == halves[_mma.b_element(lane, w, h)], (lane, w, h)
                assert got_b[w + 2, h] == got_b[w, h], "matrices 2 and 3 name the same rows as 0 and 1"


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("launch", [(1, 32), (2, 64)])
def test_row_dot_sums_each_row_over_the_chunks_of_the_grid_stride(dtype, launch):
    # D = rowsum(dO ∘ O) over 2 × 300 rows = 3 chunks of 256 rows, dealt to 1 or 2 blocks of 1 or 2 warps; d = 70
    # leaves lanes with 2 and 3 elements
    rng = np.random.default_rng(3)
    do, o = (rng.standard_normal((2, 300, 70)).astype(dtype) for _ in range(2))
    got = np.zeros((2, 300), np.float32)
    dev.row_dot_kernel[launch](do, o, got)
    want = (do.astype(np.float64) * o.astype(np.float64)).sum(axis=-1)
    assert np.max(np.abs(got - want)) <= 70 * np.finfo(np.float32).eps * np.max(np.abs(want))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", [Case(1, 2, 70, 50, 8, causal=True, dropout_p=0.2, seed=9),  # fully masked rows
                                  Case(2, 1, 50, 70, 12)])
def test_the_sawtooth_order_gives_the_same_attention(case, dtype):
    # odd query blocks scan their key blocks last to first (kernels.attention(..., sawtooth=True)); N_q = 50 and 70
    # give 4 and 5 query blocks of 16, and N_k = 70 (50) a ragged last key block that odd blocks meet first
    q, k, v, do = make_inputs(case, dtype)
    opts = case.options()
    saw = kernels.attention(q, k, v, impl="flash-swapped", config=SIM_CONFIGS["flash-swapped"], sawtooth=True, **opts)
    ref = attention_ref(q, k, v, **opts)
    lowp = attention_in_dtype(dtype, q, k, v, do, **opts)
    for name, got, want, low in zip(("out", "lse"), saw, (ref.out, ref.lse), lowp):
        assert_close(f"sawtooth {name}", got, want, low, dtype)


@pytest.mark.usefixtures("no_launch")
def test_sawtooth_is_refused_where_the_impl_has_one_kv_order():
    q = np.zeros((1, 1, 8, 8), np.float32)
    with pytest.raises(iosim.InputError, match=r"sawtooth=True: impl='flash' has one K/V order; sawtooth= is for "
                                               r"\['flash-swapped'\]"):
        kernels.attention(q, q, q, impl="flash", sawtooth=True)
    with pytest.raises(TypeError, match=r"sawtooth='yes' must be a bool"):
        kernels.attention(q, q, q, sawtooth="yes")
