"""FlashAttention-3's forward on Hopper (``kernel="fa3"``; its backward: ``iosim.gpu.grids.fa3_backward``): the
kernel of github.com/Dao-AILab/flash-attention's ``hopper/`` directory, read from its source at commit 0251105
(2026-08-15), not run here.

What this description takes from the source:

- **Tiles** (``tile_size.h``, ``tile_size_fwd_sm90``): kBlockM × kBlockN by the head sizes as ``flash_api.cpp``
  rounds them (``round_up_headdim``: 64, 96, 128, 192, 256; V's by ``round_up_headdimv``), the element size and the
  causal mask; ``tile_size`` below transcribes the branches without a window, paged K/V, column-major V or softcap.
- **Which kernel runs** (``flash_api.cpp``, ``heuristics.h``): ``get_num_splits`` may split K/V
  (``num_splits_heuristic``: when batch·K/V heads·query blocks fill less than 0.8 of the SMs, or when one head's K
  and V exceed 50 MB, its query blocks are at least twice the SMs and no mask is causal), and ``get_pack_gqa`` may
  pack a group's query heads into one (``should_pack_gqa``). Either then launches a kernel this description does not
  hold, so both are refused by name (``check_launch``).
- **The persistent grid** (``flash_fwd_launch_template.h``, ``tile_scheduler.hpp``, ``flash_fwd_kernel_sm90.h``): as
  many CTAs as the GPU has SMs (``get_grid_shape`` returns ``num_sm``, the device's ``multiProcessorCount``), one per
  SM (``MinBlocksPerMultiprocessor = 1``), each taking tile after tile. A tile is query block i of one (batch, head).
  - Without a causal mask, ``StaticPersistentTileScheduler``: CTA c takes tiles c, c + SMs, c + 2·SMs, …, tile t
    being query block t mod T_m of batch·head ⌊t / T_m⌋ (query block fastest, then head, then batch). Every tile then
    visits every key block, so under the lockstep schedule the CTAs run tiles in waves and this is the order of a grid
    whose freed slots take the next tile in order (tests/test_fa3.py holds the two equal); it is described that way.
  - With a causal mask, ``DynamicPersistentTileScheduler``: a CTA that finishes a tile takes the next from an atomic
    counter, the dynamic dispatch of ``iosim.gpu.schedule``, in an L2-aware order: the batch·heads are cut into
    sections of ``swizzle`` (``swizzle``: the power of two of heads whose K and V fit in 32 MB, times the query heads
    per K/V head), and within a section the head runs fastest, then the query block, last first (longest processing
    time first). The CTAs prefetch their next tile while computing the current one; this description hands it out
    when the current one ends.
- **Within a tile** (``mainloop_fwd_sm90_tma_gmma_ws.hpp``): ``n_block`` runs from ``n_block_max − 1`` down to
  ``n_block_min`` (``flash_swapped.downward_forward``: Q_i and its first key block in one step, then the key blocks
  downwards, O_i and lse_i written with the last). FP8 (e4m3 only, ``mha_fwd``'s dtype check) reads the per (batch,
  K/V head) float32 ``q_descale``, ``k_descale`` and ``v_descale`` (held here as one 12-byte tile) and writes O in
  bfloat16. Two CTAs of a cluster (``ClusterM = 2`` for 16-bit data at d ≥ 128 without a mask) share K/V loads by
  TMA multicast: one L2 read for two, which moves no DRAM byte that the LRU's hit on the second read does not.
- **Not described**, refused by name: split K/V, PackGQA, dropout (FA3 has none), and what
  ``iosim.gpu.kernel.check_launchable`` refuses for every kernel (windows, paged K/V, packed documents, sinks). The
  backward is ``iosim.gpu.grids.fa3_backward``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from iosim.core.errors import InputError
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.gpu.grids import fa3_backward, flash_swapped, sdpa_flash
from iosim.gpu.l2 import DramForm, Grid

DTYPES = ("float16", "bfloat16", "float8_e4m3")  # mha_fwd: "fp16, bf16, and fp8_e4m3"
HEAD_SIZES = (64, 96, 128, 192, 256)  # round_up_headdim; V's adds 512 (round_up_headdimv)
SCHEDULER_L2 = 32 * 1024 * 1024  # DynamicPersistentTileScheduler: "32 MB for K & V"
SPLIT_L2 = 50 * 1024 * 1024  # num_splits_heuristic: "we assume that L2 size is 50MB"
MAX_SPLITS = 128  # get_num_splits' max_splits
CTAS_PER_SM = 1  # FlashAttnFwdSm90::MinBlocksPerMultiprocessor; the grid is num_sm CTAs


def rounded(d: int, v: bool = False) -> int:
    """A head size as ``round_up_headdim`` (``v``: ``round_up_headdimv``) rounds it."""
    return next((x for x in HEAD_SIZES if d <= x), 512 if v else HEAD_SIZES[-1])


def tile_size(d: int, d_v: int, causal: bool, element_size: int) -> tuple[int, int]:
    """(kBlockM, kBlockN) of ``tile_size_fwd_sm90`` at the rounded head sizes, without a window, paged K/V,
    column-major V or softcap."""
    if element_size == 2:
        if d <= 64:
            if d_v == 512:
                return 64, 64
            if d_v == 256:
                return 128, 96
            return 192, 128 if causal else 192
        if d <= 96:
            return 192, 144
        if d <= 128:
            return 128, 128 if causal else 176
        if d <= 192:
            return 128, 128 if d_v <= 128 else 112
        return 128, 80
    if d <= 64:
        return 192, 160
    if d <= 96:
        return 192, 128
    if d <= 128:
        return 128, 224
    if d <= 192:
        return 128, 160
    return 128, 128


def causal_mask(pb: Problem) -> bool:
    """Whether FA3 runs the causal kernel: ``mha_fwd`` drops a causal mask of one query row (N_q = 1)."""
    return pb.causal and pb.shape.n_q > 1


def check(pb: Problem) -> None:
    """Refuse, by name, what FA3's forward does not take."""
    s = pb.shape
    fa3_backward.check_data(pb, DTYPES, "mha_fwd")
    if s.d > HEAD_SIZES[-1]:
        raise InputError(f"d={s.d}: FlashAttention-3 takes head sizes up to {HEAD_SIZES[-1]}; allowed: d <= 256")
    if s.d_v != s.d and not (128 < s.d <= 192 and 96 < s.d_v <= 128 or s.d <= 64 and s.d_v <= 512):
        raise InputError(f"d={s.d}, d_v={s.d_v}: FlashAttention-3 takes a V head size apart from Q's and K's only "
                         f"for d in (128, 192] with d_v in (96, 128], or d <= 64 with d_v <= 512")
    if pb.fp8 and s.d_v != s.d and not (128 < s.d <= 192 and s.d_v <= 128):
        raise InputError(f"d={s.d}, d_v={s.d_v} with dtype={pb.dtype!r}: FlashAttention-3's FP8 build has a kernel "
                         f"with a V head size apart only for d in (128, 192] with d_v <= 128 (run_mha_fwd); allowed: "
                         f"float16, bfloat16, or d_v = d")
    alignment = 16 if pb.fp8 else 8  # mha_fwd: "head_size should be a multiple of" 8, 16 for FP8
    for name, size in (("d", s.d), ("d_v", s.d_v)):
        if size % alignment:
            raise InputError(f"{name}={size} with dtype={pb.dtype!r}: FlashAttention-3 takes head sizes that are "
                             f"multiples of {alignment}; allowed: a multiple of {alignment}")


def tile(pb: Problem, backward: bool, sms: int | None = None) -> Tiling:
    """The kernel's own tile (kBlockM × kBlockN), on any number of SMs: the backward's is
    ``iosim.gpu.grids.fa3_backward``'s."""
    if backward:
        return fa3_backward.tile(pb)
    check(pb)
    s = pb.shape
    d = rounded(s.d)
    d_v = d  # run_mha_fwd's instantiations: (64, 512), (64, 256) and (192, 128) beside one head size
    if s.d_v != s.d and d == 64 and not pb.fp8:
        d_v = 512 if s.d_v > 256 else 256 if s.d_v > 64 else 64
    elif s.d_v != s.d and d == 192:
        d_v = 128 if s.d_v <= 128 else 192
    return Tiling(*tile_size(d, d_v, causal_mask(pb), pb.itemsize("data")))


def host_tile(pb: Problem) -> Tiling:
    """The tile ``get_num_splits`` and ``get_pack_gqa`` reason with: ``tile_size_fwd_sm90`` at the head sizes as the
    host rounds them (``round_up_headdim``, ``round_up_headdimv``), which may not be the launched kernel's."""
    s = pb.shape
    d = rounded(s.d)
    d_v = d if s.d_v == s.d else rounded(s.d_v, v=True)
    return Tiling(*tile_size(d, d_v, causal_mask(pb), pb.itemsize("data")))


def splits(pb: Problem, tiling: Tiling, sms: int) -> int:
    """The K/V splits ``get_num_splits`` chooses at the host's ``tiling`` (``num_splits_heuristic``: its efficiencies
    in float32, compared with 0.85 of the best in double, as C++ does; its count of query blocks packs each group's
    heads, as the function does)."""
    s, f32 = pb.shape, np.float32
    group = s.heads // s.kv_heads
    n_blocks = -(-s.n_k // tiling.Bc)
    m_blocks = -(-s.n_q * group // tiling.Br)
    total = s.batch * s.kv_heads * m_blocks
    kv_head_bytes = s.n_k * (s.d + s.d_v) * pb.itemsize("data")
    if f32(total) >= f32(0.8) * f32(sms):
        if kv_head_bytes > SPLIT_L2 and m_blocks >= 2 * sms and not causal_mask(pb):
            return min(-(-kv_head_bytes // SPLIT_L2), MAX_SPLITS)
        return 1
    if n_blocks <= 4:
        return 1
    most = min(MAX_SPLITS, sms, n_blocks)
    efficiency = [(w := f32(total * n) / f32(sms)) / np.ceil(w) for n in range(1, most + 1)]
    best = max(efficiency)
    return next(n for n, e in enumerate(efficiency, 1) if float(e) >= 0.85 * float(best))


def packs_groups(pb: Problem, tiling: Tiling) -> bool:
    """Whether ``get_pack_gqa`` packs each group's query heads into one at the host's ``tiling`` (``should_pack_gqa``,
    without varlen: the efficiencies in float32, 0.9 of one in double, as C++ compares them)."""
    s = pb.shape
    group = s.heads // s.kv_heads
    if group == 1:
        return False
    Br = tiling.Br
    plain = np.float32(s.n_q) / np.float32(-(-s.n_q // Br) * Br)
    packed = np.float32(s.n_q * group) / np.float32(-(-s.n_q * group // Br) * Br)
    return float(plain) < 0.9 * float(packed)


def check_launch(pb: Problem, sms: int | None) -> None:
    """Refuse, by name, a launch FA3 runs with kernels this description does not hold: K/V splits, PackGQA."""
    if sms is None:
        raise ValueError("fa3's forward needs the GPU's SMs (Launch.sms): its grid is one CTA per SM")
    tiling = host_tile(pb)
    n = splits(pb, tiling, sms)
    if n > 1:
        raise InputError(f"batch·heads={pb.shape.bh}, N_q={pb.shape.n_q:,}, N_k={pb.shape.n_k:,}: FlashAttention-3 "
                         f"splits K/V here ({n} splits, then a combine kernel), which kernel='fa3' does not describe; "
                         f"allowed: a shape whose query blocks fill the {sms} SMs, with one head's K and V under 50 MB "
                         f"or a causal mask")
    if packs_groups(pb, tiling):
        raise InputError(f"N_q={pb.shape.n_q:,} with {pb.shape.heads // pb.shape.kv_heads} query heads per K/V head: "
                         f"FlashAttention-3 packs each group's heads into one here (PackGQA), which kernel='fa3' does "
                         f"not describe; allowed: kv_heads == heads, or N_q whose blocks of {tiling.Br} rows are as "
                         f"full as the group's packed")


def swizzle(pb: Problem) -> int:
    """The batch·heads of one section of the causal scheduler's order: the largest power of two of heads whose K and
    V fit in 32 MB (at least one), times the query heads per K/V head."""
    s = pb.shape
    kv_head_bytes = s.n_k * (s.d + s.d_v) * pb.itemsize("data")
    fit = 1 if SCHEDULER_L2 < kv_head_bytes else 1 << (SCHEDULER_L2 // kv_head_bytes).bit_length() - 1
    return fit * (s.heads // s.kv_heads)


def causal_order(pb: Problem, tiling: Tiling) -> Callable[[int], tuple[int, int]]:
    """``DynamicPersistentTileScheduler::get_block_coord``: tile t -> (batch·head, query block), numbering batch·head
    batch-major as ``head_divmod`` splits it."""
    Tm = -(-pb.shape.n_q // tiling.Br)
    order = fa3_backward.section_order(pb.shape.bh, Tm, swizzle(pb))

    def tile_at(t: int) -> tuple[int, int]:  # query blocks last first (longest processing time first)
        bh, block = order(t)
        return bh, Tm - 1 - block

    return tile_at


def forward(pb: Problem, tiling: Tiling) -> Grid:
    """The forward's tiles in the order the CTAs take them, one CTA per SM: the static scheduler's order without a
    causal mask, the dynamic scheduler's with one."""
    Tm = -(-pb.shape.n_q // tiling.Br)
    order = causal_order(pb, tiling) if causal_mask(pb) else lambda t: divmod(t, Tm)
    return flash_swapped.downward_forward(pb, tiling, CTAS_PER_SM, order)


def forward_dram(pb: Problem, tiling: Tiling, capacity: int, concurrent: int) -> DramForm | None:
    """The closed form of the grid without a mask where FlashAttention-2's applies (``sdpa_flash.forward_dram``: one
    head size, data of two bytes or more, key blocks all whole): the static order is flash-swapped's. None
    elsewhere (the grid is simulated)."""
    if pb.fp8 or pb.shape.d_v != pb.shape.d or causal_mask(pb):
        return None
    return sdpa_flash.forward_dram(pb, tiling, capacity, concurrent)
