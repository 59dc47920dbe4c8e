"""split-kv: split-KV decoding (Flash-Decoding) on the GPU, forward only, as iosim.algorithms.split_kv.

Two kernels, as flash-attn's ``flash_fwd_splitkv_kernel`` and its combine:

1. The split kernel is flash-swapped's forward kernel compiled with ``splits`` and ``packed``
   (kernels/flash_swapped.py): on the problem packed by GQA group, the G = heads/kv_heads query heads
   of a K/V head are G·N_q rows of one head (q (batch·heads, N_q, d) is that (batch·kv_heads, G·N_q, d)
   already, with no copy), so that a K_j, V_j loaded once serves the group. One thread block per
   (query block i, split s, K/V head), i fastest: block (h·S + s)·T_r + i, as
   ``iosim.gpu.grids.split_kv.split`` declares. Split s runs the swapped loop over its share of the key
   blocks (``split_kv.deal``) and writes its partial output, normalised by its own ℓ, and its logsumexp,
   both float32 whatever the dtype (flash-attn's ``oaccum`` and ``softmax_lseaccum``).
2. The combine kernel (one thread block per (query block, K/V head)) reads the S partials of its rows,
   split by split, and writes O = Σ_s e^(lse_s − lse) O_s in the input dtype and lse = log Σ_s e^(lse_s).

With S = 1 the first kernel writes O and lse itself and there is no combine. Causal masking and dropout
apply to each packed row as to the query it holds (row g·N_q + r is query r of head h·G + g); as in
iosim's split-kv, causal blocks are not skipped (a decoding query sees the whole cache). There is no
backward pass: decoding has no gradients, and iosim's split-kv has none (``ALGORITHM.backward`` is None).

The splits default to iosim's (``split_kv.default_splits``: enough (query block, split) units to fill the
device's SMs, none shorter than a K/V block), at most the number of K/V blocks; ``kernels.attention(...,
splits=S)`` sets them, 1 to ⌈N_k/B_c⌉.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda

from iosim.algorithms import split_kv as simulated
from iosim.core.errors import InputError
from iosim.core.gpus import GPUS
from iosim.core.problem import AttentionShape, Problem
from iosim.core.tiling import Tiling, ceil_div
from iosim.kernels import _device as dev
from iosim.kernels import flash_swapped
from iosim.kernels.config import TileConfig

ALGORITHM = simulated.ALGORITHM
BFLOAT16 = False  # float32 or float16, as flash-swapped's kernel
GROUPED_FORWARD = True  # the point of it: a group's query heads are rows of one head
SPLITS = True  # kernels.attention(..., splits=S) is for it
SAWTOOTH = False  # one K/V order (kernels.api: sawtooth= is for flash-swapped)
FORWARD_TILES = flash_swapped.FORWARD_TILES
BACKWARD_TILES = ()  # no backward pass
COMBINE_THREADS = 128
# Under Numba's CUDA simulator, which has no SMs, the default splits fill an H100 (iosim.core.gpus).
SIMULATOR_SMS = int(GPUS["h100"].sms.value)

NEG_INF = dev.NEG_INF
ZERO = dev.ZERO


def no_backward() -> InputError:
    return InputError("impl='split-kv' is decode-only: it has no backward pass (nor has iosim's split-kv); "
                      "take the gradients of flash-swapped, which computes the same attention")


def check_config(config, d: int, backward: bool) -> None:
    """flash-swapped's forward check: the split kernel is its forward kernel."""
    if backward:
        raise no_backward()
    flash_swapped.check_config(config, d, False)


def shared_bytes(config: TileConfig, d: int, backward: bool) -> int:
    return flash_swapped.shared_bytes(config, d, backward)


def device_sms() -> int:
    """The SMs of the current device; ``SIMULATOR_SMS`` under the simulator."""
    return getattr(cuda.get_current_device(), "MULTIPROCESSOR_COUNT", SIMULATOR_SMS)


def packed_problem(shape: AttentionShape, causal: bool) -> Problem:
    """The problem as the split kernel runs it: each K/V head with its group's G·N_q query rows."""
    return Problem(shape, tau=1.0, causal=causal).packed_by_group()  # tau does not change the blocks


def resolve_splits(splits, shape: AttentionShape, causal: bool, config: TileConfig, sms: int | None = None) -> int:
    """``splits`` checked (1 to the K/V blocks of B_c, InputError naming it otherwise), or by default iosim's
    count for ``sms`` SMs (None: this device's), at most the K/V blocks."""
    pb = packed_problem(shape, causal)
    tiling = Tiling(config.Br, config.Bc)
    if splits is None:
        blocks = ceil_div(shape.n_k, config.Bc)
        splits = min(simulated.default_splits(pb, tiling.capped(pb), device_sms() if sms is None else sms), blocks)
    return ALGORITHM.with_splits(pb, tiling, splits, default=False, sms=0, fixed=True).splits


@functools.cache
def combine_kernel(d: int, Br: int):
    """The combine: grid (batch·kv_heads · T_r,), block COMBINE_THREADS; block h·T_r + i reduces rows i·B_r … of
    packed head h over its S splits, online (running max and sum, as iosim's ``split_kv.combine``)."""

    @cuda.jit
    def kernel(o_split, lse_split, out, lse, rows, splits):
        Tr = (rows + Br - 1) // Br
        h = cuda.blockIdx.x // Tr
        row0 = (cuda.blockIdx.x - h * Tr) * Br
        for e in range(cuda.threadIdx.x, Br * d, cuda.blockDim.x):  # consecutive threads, consecutive columns
            r = e // d
            c = e - r * d
            row = row0 + r
            if row < rows:
                m = NEG_INF
                l = ZERO
                acc = ZERO
                for s in range(splits):
                    part = (h * splits + s) * rows + row
                    x = lse_split[part]
                    m_new = max(m, x)
                    if m_new > NEG_INF:  # an empty split (lse_s = −inf) adds nothing
                        alpha = dev.rescale(m, m_new)
                        beta = math.exp(x - m_new)
                        acc = alpha * acc + beta * o_split[part * d + c]
                        l = alpha * l + beta
                        m = m_new
                out[(h * rows + row) * d + c] = acc / l if l > ZERO else ZERO
                if c == 0:
                    lse[h * rows + row] = dev.log_sum_exp(m, l)

    return kernel


def launch_blocks(heads: int, rows: int, config: TileConfig, splits: int) -> tuple[int, ...]:
    """Thread blocks of each kernel ``forward`` launches on ``heads`` packed heads of ``rows`` query rows: the split
    kernel's heads·S·T_r, then, with S > 1, the combine's heads·T_r."""
    Tr = ceil_div(rows, config.Br)
    return (heads * splits * Tr, heads * Tr) if splits > 1 else (heads * Tr,)


def forward(q, k, v, *, tau: float, causal: bool, dropout, config: TileConfig, splits: int):
    """O and lse on device arrays q (bh, N_q, d), k, v (b·kv_heads, N_k, d), with ``splits`` K/V splits (checked by
    kernels.api with ``resolve_splits``). Returns (out (bh, N_q, d) in q's dtype, lse (bh, N_q) float32)."""
    n_bh, n_q, d = q.shape
    heads, n_k = k.shape[0], k.shape[1]
    group = n_bh // heads
    rows = group * n_q  # of a packed head: the same memory as the group's heads one after another
    out = cuda.device_array((n_bh, n_q, d), dtype=q.dtype)
    lse = cuda.device_array((n_bh, n_q), dtype=np.float32)
    blocks = launch_blocks(heads, rows, config, splits)
    if splits > 1:
        part_out = cuda.device_array((heads * splits, rows, d), dtype=np.float32)
        part_lse = cuda.device_array((heads * splits, rows), dtype=np.float32)
    else:
        part_out, part_lse = out, lse
    kernel = flash_swapped.forward_kernel(d, config, bool(causal), dropout.enabled, splits, True)
    kernel[blocks[0], config.threads()](
        flat(q), flat(k), flat(v), flat(part_out), flat(part_lse), n_q, n_k, group, np.float32(tau),
        *dropout.kernel_args()
    )
    if splits > 1:
        combine_kernel(d, config.Br)[blocks[1], COMBINE_THREADS](
            flat(part_out), flat(part_lse), flat(out), flat(lse), rows, splits)
    return out, lse


flat = flash_swapped.flat


def backward(q, k, v, out, lse, dout, *, tau: float, causal: bool, dropout, config):
    raise no_backward()
