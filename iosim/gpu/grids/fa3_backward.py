"""FlashAttention-3's backward on Hopper (``kernel="fa3"``, pass "bwd"): the kernels of github.com/Dao-AILab/
flash-attention's ``hopper/`` at commit 0251105 (2026-08-15), read from its source, not run here.

What this description takes from the source (``flash_api.cpp`` ``mha_bwd``, ``flash_bwd_launch_template.h``
``run_flash_bwd``, the kernels' headers):

- **Three kernels, in order** (``run_flash_bwd``), every buffer padded to ``seqlen_q_rounded`` (N_q rounded up to
  kBlockM) rows and D = ``round_up_headdim(max(d, d_v))`` columns where the source pads it:
  1. ``FlashAttnBwdPreprocess``: grid (query block, head, batch), query block fastest. Block i reads O_i and dO_i
     (its rows, d_v columns) and lse_i (float32, its rows), and writes D_i = rowsum(dO_i ∘ O_i) and lse_i·log2 e
     (``lse_log2``; kBlockM float32 each, padded) and zeros dQ_i's float32 accumulator (kBlockM × D). It also zeros
     a 4-byte semaphore per block, which this description leaves out (under 0.1 % of the bytes).
  2. ``FlashAttnBwdSm90``: one CTA per (key block j, head, batch). It reads K_j and V_j, then for each query block i
     that sees them, in ascending order (``block.h``: from ``m_block_min`` under a causal mask, aligned at the
     bottom right), Q_i, lse_log2_i, dO_i and D_i, and adds into dQ_i's accumulator (``SM90_BULK_REDUCE_ADD``, or
     at D = 256 ``atomicAdd`` from the MMA warps: a read-modify-write in the L2 either way); it writes dV_j then dK_j
     (its columns, d_v and d) with the last. The producer loads Q_(i+1) during step i; this description loads it at
     step i + 1, and K_j, V_j before Q at the first step (the order within a step moves no tile out of the L2 that
     the step itself does not).
     Without a causal mask ``SingleTileScheduler``: grid (key block, head, batch), key block fastest. With one
     ``SingleTileBwdLPTScheduler``: a 1-D grid in sections of ``swizzle`` batch·heads (the power of two of heads
     whose Q, dO and dQ's accumulator fit in 40 MB), within a section the batch·head fastest, then the key block
     ascending (the longest tiles first).
  3. ``FlashAttnBwdPostprocessConvertdQ``: grid (query block, head, batch); block i reads dQ_i's accumulator
     (kBlockM × D float32) and writes dQ_i (its rows, d columns, in the data type).
- **Tiles** (``run_mha_bwd_hdim*``, mirrored by ``mha_bwd``'s kBlockM_sm90 and kBlockN_sm90): ``tile_size``.
- **Occupancy**: the main kernel one CTA per SM (``MinBlocksPerMultiprocessor = 1``; 155 to 227 KB of shared
  memory); pre- and postprocess 2 blocks per SM, their launch bound (``MinBlocksPerMultiprocessor = 2``), the fewest
  they run: each block touches tiles no other block of its kernel touches, so their DRAM bytes do not depend on it.
- **Refused by name**: data other than float16 or bfloat16 (``mha_bwd``'s dtype check), grouped K/V heads (two
  more fills of dK's and dV's float32 accumulators and two more postprocess kernels, not described), dropout (FA3
  has none), softcap's tiles (no score_mod reaches them here: the tiles are those without softcap).
"""

from __future__ import annotations

from collections.abc import Callable

from iosim.core.errors import InputError
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.core.visits import visits
from iosim.gpu import head_waves
from iosim.gpu.grids import sdpa_flash
from iosim.gpu.grids._device import BACKWARD_TENSORS
from iosim.gpu.l2 import READ, READ_WRITE, WRITE, DramForm, Grid, Step, Tiles, shared_run

DTYPES = ("float16", "bfloat16")  # mha_bwd: "FlashAttention only support fp16 and bf16 data type"
HEAD_SIZES = (64, 96, 128, 192, 256)  # round_up_headdim of max(d, d_v); the kernels instantiated
MAIN_CTAS_PER_SM = 1  # FlashAttnBwdSm90::MinBlocksPerMultiprocessor
PROCESS_BLOCKS_PER_SM = 2  # the pre- and postprocess kernels' MinBlocksPerMultiprocessor
SCHEDULER_L2 = 40 * 1024 * 1024  # SingleTileBwdLPTScheduler: "40 MB for Q, dO, and dQaccum"
TILES = Tiles(BACKWARD_TENSORS + ("lse_log2",))  # lse_log2: softmax_lse_log2, the preprocess kernel's lse·log2 e


def rounded(pb: Problem) -> int:
    """D: ``round_up_headdim(max(d, d_v))``, the head size every padded buffer and the kernel's tile take."""
    d = max(pb.shape.d, pb.shape.d_v)
    return next(x for x in HEAD_SIZES if d <= x)


def tile_size(D: int, causal: bool) -> tuple[int, int]:
    """(kBlockM, kBlockN) of the sm90 backward at head size D, without softcap or a local window."""
    if D <= 64:
        return 128, 128
    if D <= 96:
        return 64, 128
    if D <= 128:
        return (64, 128) if causal else (80, 128)
    if D <= 192:
        return 64, 96
    return 64, 80


def check_data(pb: Problem, dtypes: tuple[str, ...], passes: str) -> None:
    """Refuse, by name, data FA3's ``passes`` ("mha_fwd" or "mha_bwd", whose dtype check it is) do not take, and
    dropout, which FA3 has none of."""
    if pb.dtype not in dtypes:
        raise InputError(f"dtype={pb.dtype!r}: FlashAttention-3 takes {list(dtypes)} ({passes}'s dtype check); "
                         f"allowed: one of those")
    if pb.dropout_p > 0:
        raise InputError(f"dropout_p={pb.dropout_p}: FlashAttention-3 has no dropout; allowed: 0")


def check(pb: Problem) -> None:
    """Refuse, by name, what FA3's backward does not take or this description does not hold."""
    s = pb.shape
    check_data(pb, DTYPES, "mha_bwd")
    for name, size in (("d", s.d), ("d_v", s.d_v)):
        if size % 8 or size > HEAD_SIZES[-1]:
            raise InputError(f"{name}={size}: FlashAttention-3's backward takes head sizes that are multiples of 8 "
                             f"up to {HEAD_SIZES[-1]} (mha_bwd); allowed: such a size")
    if s.kv_heads != s.heads:
        raise InputError(f"kv_heads={s.kv_heads} < heads={s.heads} in the backward: FlashAttention-3 then adds dK and "
                         f"dV into float32 accumulators that two more kernels convert, which kernel='fa3' does not "
                         f"describe; allowed: kv_heads == heads")


def tile(pb: Problem) -> Tiling:
    """The backward's tile: kBlockM query rows by kBlockN keys."""
    check(pb)
    return Tiling(*tile_size(rounded(pb), pb.causal))


def grids(pb: Problem, tiling: Tiling) -> tuple[Grid, ...]:
    """The three kernels of the backward, in launch order."""
    check(pb)
    return preprocess(pb, tiling), main(pb, tiling), postprocess(pb, tiling)


def preprocess(pb: Problem, tiling: Tiling) -> Grid:
    """``FlashAttnBwdPreprocess``: block i of (head, batch) reads O_i, dO_i and lse_i, and writes D_i, lse_log2_i and
    dQ_i's zeroed accumulator over all kBlockM rows."""
    s, data, D = pb.shape, pb.itemsize("data"), rounded(pb)
    # its grid is (query block, head, batch): the n-th pair is batch·head n, as the problem numbers them
    return sdpa_flash.per_query_block(pb, tiling, PROCESS_BLOCKS_PER_SM, lambda t, rows, full: (
        TILES.access("O", t, rows * s.d_v * data, READ), TILES.access("dO", t, rows * s.d_v * data, READ),
        TILES.access("lse", t, rows * 4, READ), TILES.access("D", t, full * 4, WRITE),
        TILES.access("lse_log2", t, full * 4, WRITE), TILES.access("dQ", t, full * D * 4, WRITE)), TILES, lambda n: n)


def postprocess(pb: Problem, tiling: Tiling) -> Grid:
    """``FlashAttnBwdPostprocessConvertdQ``: block i reads dQ_i's accumulator and writes dQ_i in the data type."""
    s, data, D = pb.shape, pb.itemsize("data"), rounded(pb)
    return sdpa_flash.per_query_block(pb, tiling, PROCESS_BLOCKS_PER_SM, lambda t, rows, full: (
        TILES.access("dQ", t, full * D * 4, READ), TILES.access("dQ_cast", t, rows * s.d * data, WRITE)), TILES,
        lambda n: n)


def main(pb: Problem, tiling: Tiling) -> Grid:
    """``FlashAttnBwdSm90``: block (key block j, batch·head) reads K_j, V_j, then at each query block i that sees
    them, ascending, Q_i, lse_log2_i, dO_i, D_i and dQ_i's accumulator (read and written), and writes dV_j, dK_j with
    the last; in the static order (key block fastest) without a causal mask, the LPT scheduler's with one."""
    s, Br, Bc = pb.shape, tiling.Br, tiling.Bc
    Tr, Tc = -(-s.n_q // Br), -(-s.n_k // Bc)
    data, D = pb.itemsize("data"), rounded(pb)
    met = visits(pb, tiling, skips_hidden=True)
    order = lpt_order(pb, tiling) if pb.causal else lambda b: divmod(b, Tc)
    shared: dict[int, list] = {}  # batch·head -> its query-block steps, one object per i for all its blocks

    def upwards(bh: int) -> list[Step]:
        if bh not in shared:
            shared[bh] = [(TILES.access("Q", t, min(Br, s.n_q - i * Br) * s.d * data, READ),
                           TILES.access("lse_log2", t, Br * 4, READ),
                           TILES.access("dO", t, min(Br, s.n_q - i * Br) * s.d_v * data, READ),
                           TILES.access("D", t, Br * 4, READ), TILES.access("dQ", t, Br * D * 4, READ_WRITE))
                          for i, t in enumerate(range(bh * Tr, (bh + 1) * Tr))]
        return shared[bh]

    def own(bh: int, j: int) -> tuple[Step, Step]:  # K_j, V_j (of the K/V head) read first, dV_j, dK_j written last
        cols, t, kv = min(Bc, s.n_k - j * Bc), bh * Tc + j, s.kv_head(bh) * Tc + j
        return ((TILES.access("K", kv, cols * s.d * data, READ), TILES.access("V", kv, cols * s.d_v * data, READ)),
                (TILES.access("dV", t, cols * s.d_v * data, WRITE), TILES.access("dK", t, cols * s.d * data, WRITE)))

    def steps(b: int):
        bh, j = order(b)
        kv, out = own(bh, j)
        run, seen = met.query_run(j), upwards(bh)
        if not run:  # no query sees the block: zeros for dK_j, dV_j (store_zero), nothing read
            return iter((out,))
        return shared_run(kv, seen, run.start, len(run), out)

    def form(capacity: int, concurrent: int) -> DramForm | None:
        """The closed form without a causal mask, where no two heads share K and V (``iosim.gpu.head_waves``)."""
        if pb.causal or s.kv_heads != s.heads or Tr + Tc > head_waves.MOST_LISTED:
            return None
        mine = [own(0, j) for j in range(Tc)]
        return head_waves.dram(head_waves.of_accesses(TILES, s.bh, [m[0] for m in mine], upwards(0),
                                                      [m[1] for m in mine]), capacity, concurrent)

    return Grid(s.bh * Tc, steps, TILES, MAIN_CTAS_PER_SM, form=form)


def swizzle(pb: Problem) -> int:
    """``SingleTileBwdLPTScheduler``'s section: the largest power of two of batch·heads whose Q, dO (the data type)
    and dQ's accumulator (float32, d columns) fit in 40 MB, at least one."""
    s = pb.shape
    head = s.n_q * (s.d + s.d_v) * pb.itemsize("data") + s.n_q * s.d * 4
    return 1 if SCHEDULER_L2 < head else 1 << (SCHEDULER_L2 // head).bit_length() - 1


def lpt_order(pb: Problem, tiling: Tiling) -> Callable[[int], tuple[int, int]]:
    """``SingleTileBwdLPTScheduler::get_initial_work``: CTA b -> (batch·head, key block), in sections of ``swizzle``
    batch·heads, the batch·head fastest within one, key blocks ascending."""
    return section_order(pb.shape.bh, -(-pb.shape.n_k // tiling.Bc), swizzle(pb))


def section_order(bh: int, blocks: int, sw: int) -> Callable[[int], tuple[int, int]]:
    """FlashAttention-3's L2-aware order of (batch·head, block) tiles, forward and backward: tile t -> (batch·head,
    block), the batch·heads in sections of ``sw`` (the last of the remainder), the batch·head fastest within one,
    then the block (numbered as ``head_divmod`` splits the batch·head: batch-major)."""
    quotient, remainder = divmod(bh, sw)

    def tile_at(t: int) -> tuple[int, int]:
        section, offset = divmod(t, sw * blocks)
        block, head = divmod(offset, sw if section < quotient else remainder)
        return section * sw + head, block

    return tile_at
