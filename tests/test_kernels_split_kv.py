"""split-kv's kernels (kernels/split_kv.py) under Numba's CUDA simulator: exact against float64 and iosim.simulate
with every K/V split count, grouped query heads packed into one head's rows, and the launches iosim's grids declare.

The cases of tests/test_kernels.py run it too (one split or the default); here the splits are set, so that the
combine runs over uneven shares of the key blocks.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_kernels import SIM_M, assert_close, attention_in_dtype

import iosim
from iosim import kernels
from iosim.algorithms import split_kv as simulated
from iosim.core.problem import AttentionShape
from iosim.core.tiling import Tiling
from iosim.gpu.kernel import Launch
from iosim.gpu.kernels import KERNELS
from iosim.kernels import TileConfig, split_kv
from iosim.reference import attention_ref

CONFIG = TileConfig(Br=16, Bc=16, TM=2, TN=4)


def grouped_inputs(batch, heads, kv_heads, n_q, n_k, d, dtype, seed=0):
    rng = np.random.default_rng([batch, heads, kv_heads, n_q, n_k, d, seed])
    q = rng.standard_normal((batch, heads, n_q, d)).astype(dtype)
    k, v = (rng.standard_normal((batch, kv_heads, n_k, d)).astype(dtype) for _ in range(2))
    return q, k, v


# (batch, heads, kv_heads, N_q, N_k, d, causal, dropout_p, splits): decoding (N_q = 1) over 4 and 1 K/V heads, a few
# speculative tokens (N_q = 3, causal), N_k not a multiple of B_c = 16, splits from 1 to every K/V block
CASES = {
    "decode,G=4,S=3": (1, 8, 2, 1, 113, 8, False, 0.0, 3),
    "decode,MQA,S=8,every block": (2, 4, 1, 1, 113, 12, False, 0.0, 8),
    "Nq=3,causal,dropout,G=2,S=2": (1, 4, 2, 3, 50, 8, True, 0.25, 2),
    "Nq=20>Br,G=2,S=4,causal": (1, 2, 1, 20, 61, 6, True, 0.0, 4),
    "one split": (1, 2, 2, 1, 40, 8, False, 0.0, 1),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("name", list(CASES))
def test_split_kv_matches_float64_and_the_simulator_at_every_split_count(name, dtype):
    batch, heads, kv_heads, n_q, n_k, d, causal, p, splits = CASES[name]
    q, k, v = grouped_inputs(batch, heads, kv_heads, n_q, n_k, d, dtype)
    opts = dict(causal=causal, dropout_p=p, seed=7)
    fwd = kernels.attention(q, k, v, impl="split-kv", config=CONFIG, splits=splits, **opts)
    assert fwd.out.dtype == dtype and fwd.lse.dtype == np.float32
    group = heads // kv_heads
    ref = attention_ref(q, k, v, **opts)
    lowp = attention_in_dtype(dtype, q, np.repeat(k, group, axis=1), np.repeat(v, group, axis=1), np.zeros_like(q),
                              **opts)
    assert_close(f"{name} out", fwd.out, ref.out, lowp[0], dtype)
    assert_close(f"{name} lse", fwd.lse, ref.lse, lowp[1], dtype)
    sim = iosim.simulate("split-kv", *(x.astype(np.float64) for x in (q, k, v)), M=SIM_M, splits=splits, **opts)
    assert_close(f"{name} out vs iosim.simulate", fwd.out, sim.out, lowp[0], dtype)
    assert_close(f"{name} lse vs iosim.simulate", fwd.lse, sim.lse, lowp[1], dtype)


@pytest.mark.parametrize("splits", [1, 2, 3, 8])
@pytest.mark.parametrize("batch, heads, kv_heads, n_q, n_k", [(1, 8, 2, 1, 113), (2, 4, 1, 20, 200)])
def test_the_kernels_launch_the_blocks_iosim_s_grids_declare(batch, heads, kv_heads, n_q, n_k, splits):
    # the L2 model's split and combine grids (the split-kv kernel description's grids on the packed problem) are
    # these launches; the blocks do not depend on d, taken at 64, where the resource report gives the combine's
    # blocks per SM (float16)
    shape = AttentionShape(batch, heads, n_q, n_k, 64, kv_heads=kv_heads)
    pb = split_kv.packed_problem(shape, causal=False)
    grids = KERNELS["split-kv"].grids(Launch(pb, Tiling(CONFIG.Br, CONFIG.Bc, splits)))
    launched = split_kv.launch_blocks(batch * kv_heads, pb.shape.n_q, CONFIG, splits)
    assert launched == tuple(g.blocks for g in grids)


def test_default_splits_are_iosim_s_for_the_device_s_sms_and_at_most_the_kv_blocks():
    shape = AttentionShape(1, 8, 1, 113, 8, kv_heads=2)  # 2 packed heads of 4 rows: 1 query block each
    pb = split_kv.packed_problem(shape, causal=False)
    want = simulated.default_splits(pb, Tiling(4, 16), split_kv.SIMULATOR_SMS)
    assert want > 8  # the H100's 132 SMs ask for more than the 8 K/V blocks of 16 keys
    assert split_kv.resolve_splits(None, shape, False, CONFIG) == 8
    small = AttentionShape(64, 8, 1, 4096, 8, kv_heads=8)  # 512 (query block, head) units already fill the SMs
    assert split_kv.resolve_splits(None, small, False, CONFIG) == 1


@pytest.mark.parametrize("splits, match", [
    (0, r"splits=0 for split-kv at N_k=40; allowed: 1 to 3 \(the number of K/V blocks of B_c=16\)"),
    (4, r"splits=4 for split-kv at N_k=40; allowed: 1 to 3"),
    (2.5, r"splits=2.5 is not a whole number"),
    (True, r"splits=True must be a whole number"),
])
def test_bad_splits_are_refused_naming_the_range(splits, match):
    q, k, v = grouped_inputs(1, 2, 1, 1, 40, 8, np.float32)
    with pytest.raises(iosim.InputError, match=match):
        kernels.attention(q, k, v, impl="split-kv", config=CONFIG, splits=splits)


def test_splits_are_taken_as_iosim_takes_counts_and_launched_as_an_int():
    shape = AttentionShape(1, 2, 1, 40, 8, kv_heads=1)
    for spelled in (2, 2.0, "2"):
        found = split_kv.resolve_splits(spelled, shape, False, CONFIG)
        assert found == 2 and type(found) is int


def test_splits_are_refused_where_the_impl_does_not_split_and_backward_where_there_is_none():
    q, k, v = grouped_inputs(1, 2, 2, 1, 40, 8, np.float32)
    with pytest.raises(iosim.InputError, match=r"splits=2: impl='flash-swapped' does not split K/V; splits= is for "
                                               r"\['split-kv'\]"):
        kernels.attention(q, k, v, impl="flash-swapped", splits=2)
    with pytest.raises(iosim.InputError, match=r"impl='split-kv' is forward only .* backward passes: \['standard', "
                                               r"'flash', 'flash-swapped', 'flash-swapped-tc'\]"):
        kernels.attention_backward(q, k, v, q, q[..., 0], q, impl="split-kv")
    with pytest.raises(iosim.InputError, match="impl='split-kv' is forward only"):
        kernels.max_head_dim("split-kv", backward=True)
    with pytest.raises(ValueError, match=r"dtype='bfloat16' needs impl in \['flash-swapped-tc'\]"):
        kernels.attention(q, k, v, impl="split-kv", dtype="bfloat16")
