"""The grids of torch's ``scaled_dot_product_attention`` on its flash backend: FlashAttention-2's kernels as torch
builds them (``aten/src/ATen/native/transformers/cuda/flash_attn/``, the sources of github.com/Dao-AILab/
flash-attention, ``csrc/flash_attn/src/``), read from their source, not run here.

What this description takes from the source (file names are flash-attention's):

- **Forward** (``flash_fwd_kernel``, ``flash_fwd_launch_template.h``): ``grid (⌈N_q/kBlockM⌉, batch, heads)``, so
  blocks launch query block fastest, then batch, then head. Block (i, b, h) loads Q_i, then visits the key blocks it
  sees from the last down to the first (``n_block = n_block_max − 1`` downwards; a causal mask, bottom-right
  aligned, ends the run at ⌈((i+1)·kBlockM + N_k − N_q)/kBlockN⌉), reading K_j and V_j at each, and writes O_i (in
  the input dtype) and lse_i (float32) at the end. Tiles (kBlockM × kBlockN): 128 × 128 at d = 64, 128 × 64 at
  d = 128, float16 or bfloat16, no dropout, on sm_80 and sm_90 (``run_mha_fwd_hdim64``, ``run_mha_fwd_hdim128``).
- **Which forward runs**: torch's ``mha_fwd`` lets ``num_splits_heuristic`` choose K/V splits (``flash_api.cpp``,
  ``forward_splits``); where it chooses more than one, the split-KV kernels run instead (``run_flash_splitkv_fwd``,
  ``run_mha_fwd_splitkv_dispatch``), at tiles of kBlockM = 64 by kBlockN = 256 (d = 64) or 128 (d = 128):
  1. ``flash_fwd_splitkv_kernel``, ``grid (⌈N_q/64⌉, num_splits, batch·heads)``: block (i, s, bh) sees key blocks
     s·n, …, (s + 1)·n − 1 (n = ⌈⌈N_k/kBlockN⌉/num_splits⌉, cut by a causal mask as above), reads Q_i and them from
     the last down to the first, and writes its rows of the float32 partial outputs O_accum and their lse_accum; a
     block that sees no key exits before reading Q_i, writing zeros and −inf (``compute_attn_1rowblock_splitkv``);
  2. ``flash_fwd_splitkv_combine_kernel``, one block per kBlockM (4 at d = 128, 8 at d = 64) rows of the flattened
     (batch, heads, N_q): it reads every split's lse_accum and O_accum of its rows and writes O (the dtype) and lse
     (``combine_attn_seqk_parallel``).
  O_accum is held row by row (d float32, whole sectors), lse_accum and lse sector by sector, as the L2 sees them.
  Decoding with grouped heads (N_q = 1, heads > kv_heads) runs as one head of G query rows, and torch runs no flash
  kernel for a causal mask with N_q ≠ N_k: both refused by name.
- **Backward** (``run_flash_bwd_seqk_parallel``, ``flash_bwd_launch_template.h``, at 144 KB of shared memory per block
  or more, which an H100 allows): three kernels.
  1. ``flash_bwd_dot_do_o_kernel``, ``grid (⌈N_q/kBlockM⌉, batch, heads)``: reads dO_i and O_i, writes
     D_i = rowsum(dO_i ∘ O_i) (float32) and zeroes dQ_i's float32 accumulator, both over all kBlockM rows (the
     buffers are rounded up to 128 rows).
  2. ``flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel``, ``grid (⌈N_k/kBlockN⌉, batch, heads)``: block (j, b, h)
     loads K_j, V_j, then visits the query blocks that see them from the last down to the first (``m_block`` from
     ``m_block_max − 1`` down to ``m_block_min``), reading Q_i, dO_i, lse_i and D_i and adding into the float32
     accumulator of dQ_i with atomics (a read-modify-write in the L2, over all kBlockM rows), and writes dK_j, dV_j.
  3. ``flash_bwd_convert_dq_kernel``, the dot kernel's grid: reads dQ_i's accumulator (all kBlockM rows), writes dQ_i
     in the dtype.
  Tiles (kBlockM × kBlockN): 128 × 128 at d = 64, 64 × 128 at d = 128.

Within a step the kernels prefetch the next tile (K_(j−1) during step j; Q_(i−1), dO_(i−1) in the backward); this
description puts each read in the step that computes on it, one step later than the copy starts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from pathlib import Path

import numpy as np

from iosim.core.errors import InputError
from iosim.core.problem import AttentionShape, Problem
from iosim.core.tiling import Tiling
from iosim.core.visits import visits
from iosim.gpu import head_waves
from iosim.gpu.grids import flash_swapped
from iosim.gpu.grids._device import TILES
from iosim.gpu.l2 import (
    READ,
    READ_WRITE,
    SECTOR,
    WRITE,
    DramForm,
    Grid,
    ResourceBound,
    Step,
    Tiles,
    shared_run,
)

FORWARD_TILE = {64: (128, 128), 128: (128, 64)}  # d -> (kBlockM, kBlockN), Flash_fwd_kernel_traits
SPLIT_TILE = {64: (64, 256), 128: (64, 128)}  # d -> (kBlockM, kBlockN) of run_mha_fwd_splitkv_dispatch
COMBINE_ROWS = {64: 8, 128: 4}  # d -> the combine's kBlockM: 4 where d % 128 == 0, else 8 where d % 64 == 0
SPLIT_TILES = Tiles(("Q", "K", "V", "O", "lse", "O_accum", "lse_accum"))
BACKWARD_TILE = {64: (128, 128), 128: (64, 128)}  # d -> (kBlockM, kBlockN), Flash_bwd_kernel_traits
DTYPES = ("float16", "bfloat16")
ROUND_ROWS = 128  # softmax_d and dq_accum have N_q rounded up to 128 rows (flash_api.cpp's seqlen_q_rounded)

# Occupancy: registers per thread from torch's shipped sm_90 binary (``RESOURCES``, read by
# experiments/sdpa_resources.py with cuobjdump from torch 2.14.1+cu130's libtorch_cuda.so), for the instantiation each
# pass launches; shared memory from the tiles. The kernels declare no __launch_bounds__: the forward and the main
# backward kernel take 255 registers in every instantiation here, so the forward runs 2 blocks of 128 threads per SM,
# which its shared memory (48 KB at d = 64, 64 KB at d = 128) allows on an H100, and the main backward kernel 1 by its
# 144 KB of shared memory; dot_do_o (34 to 51) and convert_dq (64, 72) at 256 threads.
RESOURCES = Path(__file__).resolve().parent.parent / "sdpa_resources_sm90.json"
FORWARD_THREADS, BACKWARD_THREADS = 128, 256


def check(pb: Problem) -> None:
    """Refuse, by name, what the description does not cover: a dtype, head dim or option it has no launch for."""
    if pb.dtype not in DTYPES:
        raise InputError(f"dtype={pb.dtype!r}: SDPA's flash backend takes 16-bit inputs; allowed: {list(DTYPES)}")
    if pb.shape.d not in FORWARD_TILE:
        raise InputError(f"d={pb.shape.d}: the description of SDPA's flash kernels is read for d = 64 and 128; "
                         f"allowed: {sorted(FORWARD_TILE)}")
    if pb.dropout_p > 0:
        raise InputError(f"dropout_p={pb.dropout_p}: with dropout FlashAttention-2 launches other tiles, which the "
                         "description does not cover; allowed: 0")
    s = pb.shape
    if pb.causal and s.n_q != s.n_k:
        raise InputError(f"causal with N_q={s.n_q:,} ≠ N_k={s.n_k:,}: torch does not run its flash backend for a "
                         "non-square causal mask (check_flash_causal_non_square_seqlens); allowed: N_q == N_k, or "
                         "causal=False")
    if s.n_q == 1 and s.heads > s.kv_heads:
        raise InputError(f"N_q=1 with heads={s.heads} over kv_heads={s.kv_heads}: FlashAttention-2 runs decoding with "
                         "grouped heads as one head of G query rows (seqlenq_ngroups_swapped), which the description "
                         "does not cover; allowed: N_q > 1, or kv_heads == heads")


def tile(pb: Problem, backward: bool, sms: int | None = None) -> Tiling:
    """The kernel's own tile for the pass (kBlockM × kBlockN): the split-KV kernel's where torch splits K/V on a GPU
    of ``sms`` SMs (None: the unsplit kernel's)."""
    check(pb)
    if not backward and sms is not None and forward_splits(pb.shape, sms) > 1:
        return Tiling(*SPLIT_TILE[pb.shape.d])
    return Tiling(*(BACKWARD_TILE if backward else FORWARD_TILE)[pb.shape.d])


def forward_splits(s: AttentionShape, sms: int) -> int:
    """The K/V splits torch's ``mha_fwd`` chooses (flash-attention's ``num_splits_heuristic`` with blocks of 64
    queries and of 256 (d ≤ 64) or 128 keys, on 2 × the GPU's SMs): 1 runs ``flash_fwd_kernel``, more its split-KV
    kernels. Its efficiencies are float32 and compared with 0.85 of the best in double, as C++ computes them."""
    f32 = np.float32
    blocks = s.bh * -(-s.n_q // 64)
    slots = 2 * sms
    n_blocks = -(-s.n_k // (256 if s.d <= 64 else 128))
    if f32(blocks) >= f32(0.8) * f32(slots):
        return 1
    most = min(128, slots, n_blocks)
    eligible = [n == 1 or -(-n_blocks // n) != -(-n_blocks // (n - 1)) for n in range(1, most + 1)]
    waves = [f32(blocks * n) / f32(slots) for n in range(1, most + 1)]
    efficiency = [w / np.ceil(w) if ok else f32(0) for w, ok in zip(waves, eligible)]
    best = max(efficiency, default=f32(0))
    return next((n for n, (e, ok) in enumerate(zip(efficiency, eligible), 1) if ok and float(e) >= 0.85 * float(best)),
                1)


def launch_order(s: AttentionShape):
    """The batch·head (batch-major, as the problem numbers them) of the n-th (batch, head) pair the grid launches:
    batch fastest, then head (blockIdx.y, blockIdx.z)."""
    return lambda n: (n % s.batch) * s.heads + n // s.batch


def forward(pb: Problem, tiling: Tiling, per_sm: int | ResourceBound) -> Grid:
    """``flash_fwd_kernel``'s blocks in launch order: block n·T_r + i is query block i of the n-th (batch, head)
    pair; each reads Q_i with its first (the last) key block, the key blocks it sees downwards, and writes O_i, lse_i
    with the last (``flash_swapped.downward_forward``; its run of key blocks is never empty: torch runs no flash
    kernel for a causal mask with N_q ≠ N_k, ``check``)."""
    Tr = -(-pb.shape.n_q // tiling.Br)
    pair = launch_order(pb.shape)
    return flash_swapped.downward_forward(pb, tiling, per_sm, lambda b: (pair(b // Tr), b % Tr))


def _sectors_of(name: str, first: int, count: int, mode: int) -> Step:
    """Float32 entries ``first`` … ``first + count − 1`` of a flat tensor as the 32-byte sectors they lie in, each
    with the bytes of them it holds."""
    per = SECTOR // 4
    return tuple(SPLIT_TILES.access(name, k, 4 * (min(first + count, (k + 1) * per) - max(first, k * per)), mode)
                 for k in range(first // per, (first + count - 1) // per + 1))


def split_forward(pb: Problem, tiling: Tiling, splits: int, per_sm: int | ResourceBound) -> Grid:
    """``flash_fwd_splitkv_kernel``'s blocks in launch order: block (bh·S + s)·T_r + i is query block i of split s of
    batch·head bh (batch-major); it reads Q_i and its split's key blocks from the last down to the first and writes
    its rows of O_accum and lse_accum, or writes them alone where it sees no key."""
    s, Br, Bc = pb.shape, tiling.Br, tiling.Bc
    Tr, Tc = -(-s.n_q // Br), -(-s.n_k // Bc)
    per_split, rows_total, data = -(-Tc // splits), s.bh * s.n_q, pb.itemsize("data")
    upwards = flash_swapped.kv_step_cache(SPLIT_TILES, pb, tiling)
    downwards: dict[int, list] = {}
    met = visits(pb, tiling, skips_hidden=True)

    def steps(b: int):
        i, rest = b % Tr, b // Tr
        split, bh = rest % splits, rest // splits
        rows, first_row = min(Br, s.n_q - i * Br), split * rows_total + bh * s.n_q + i * Br
        out = tuple(SPLIT_TILES.access("O_accum", first_row + r, s.d * 4, WRITE) for r in range(rows)) + _sectors_of(
            "lse_accum", first_row, rows, WRITE)
        run = met.key_run(i)
        lo, hi = max(run.start, split * per_split), min(run.stop, (split + 1) * per_split)
        if lo >= hi:
            return iter((out,))
        q = (SPLIT_TILES.access("Q", bh * Tr + i, rows * s.d * data, READ),)
        kvh = s.kv_head(bh)
        kv = downwards.get(kvh)
        if kv is None:
            kv = downwards[kvh] = upwards(kvh)[::-1]  # kv[k] is key block T_c − 1 − k
        return shared_run(q, kv, Tc - hi, hi - lo, out)

    return Grid(s.bh * splits * Tr, steps, SPLIT_TILES, per_sm)


def combine(pb: Problem, splits: int, per_sm: int | ResourceBound) -> Grid:
    """``flash_fwd_splitkv_combine_kernel``: block c takes rows c·k … c·k + k − 1 of the flattened (batch, heads, N_q),
    k = ``COMBINE_ROWS``; it reads every split's lse_accum and O_accum of them and writes their O and lse."""
    s, data = pb.shape, pb.itemsize("data")
    k, rows_total = COMBINE_ROWS[s.d], s.bh * s.n_q

    def steps(c: int):
        first, rows = c * k, min(k, rows_total - c * k)
        reads: Step = ()
        for split in range(splits):
            at = split * rows_total + first
            reads += _sectors_of("lse_accum", at, rows, READ) + tuple(
                SPLIT_TILES.access("O_accum", at + r, s.d * 4, READ) for r in range(rows))
        return iter((reads + (SPLIT_TILES.access("O", c, rows * s.d * data, WRITE),)
                     + _sectors_of("lse", first, rows, WRITE),))

    return Grid(-(-rows_total // k), steps, SPLIT_TILES, per_sm)


def forward_dram(pb: Problem, tiling: Tiling, capacity: int, concurrent: int) -> DramForm | None:
    """Closed form of the forward grid's lockstep count where it equals flash-swapped's: full attention without
    grouped heads, and key blocks all whole (or one). Every head's blocks then make the same steps on their own
    tiles, so the order of the heads (batch fastest here, head fastest there) changes no count, and the key blocks,
    all of one size, make the downward scan's count the upward one's. None elsewhere (the grid is simulated)."""
    s, Bc = pb.shape, tiling.Bc
    if s.n_k % Bc and s.n_k > Bc:
        return None
    return flash_swapped.forward_dram(pb, tiling, capacity, concurrent)


def _rows(pb: Problem, Br: int) -> tuple[int, list[int], int]:
    """(T_r, the query rows of each block, the rows of each block of the buffers rounded up to 128 rows: kBlockM)."""
    Tr = -(-pb.shape.n_q // Br)
    return Tr, [min(Br, pb.shape.n_q - i * Br) for i in range(Tr)], Br


def per_query_block(pb: Problem, tiling: Tiling, per_sm: int | ResourceBound, step: Callable[[int, int, int], Step],
                    tiles: Tiles = TILES, pair: Callable[[int], int] | None = None) -> Grid:
    """A grid of one step per (query block, batch, head) in launch order: ``step(tile, rows, full)`` for query block
    tile ``tile`` of ``rows`` rows, in buffers of ``full`` (kBlockM) rows a block; ``pair`` gives the batch·head of
    the n-th pair the grid launches (default this kernel's ``launch_order``)."""
    s = pb.shape
    Tr, rows, full = _rows(pb, tiling.Br)
    pair = pair or launch_order(s)

    def steps(b: int):
        n, i = divmod(b, Tr)
        return iter((step(pair(n) * Tr + i, rows[i], full),))

    def form(capacity: int, concurrent: int) -> DramForm | None:
        """Every block one step on tiles of its own, its reads before its writes: heads in waves of one step with no
        shared tile (``iosim.gpu.head_waves``), each tile moving once."""
        own = [step(0, rows[0], full)] * (Tr - 1) + [step(Tr - 1, rows[-1], full)]
        reads = [tuple(a for a in st if a[2] == READ) for st in own]
        writes = [st[len(r):] for st, r in zip(own, reads)]
        if any(r + w != st for r, w, st in zip(reads, writes, own)):
            return None
        return head_waves.dram(head_waves.of_accesses(tiles, s.bh, reads, [()], writes), capacity, concurrent)

    return Grid(s.bh * Tr, steps, tiles, per_sm, uniform=s.n_q % tiling.Br == 0, form=form)


def dot_do_o(pb: Problem, tiling: Tiling, per_sm: int | ResourceBound) -> Grid:
    """``flash_bwd_dot_do_o_kernel``: one step per (query block, batch, head) in launch order, reading dO_i and O_i
    and writing D_i and the zeroed accumulator of dQ_i over all kBlockM rows."""
    d, data = pb.shape.d, pb.itemsize("data")
    return per_query_block(pb, tiling, per_sm, lambda t, rows, full: (
        TILES.access("dO", t, rows * d * data, READ), TILES.access("O", t, rows * d * data, READ),
        TILES.access("D", t, full * 4, WRITE), TILES.access("dQ", t, full * d * 4, WRITE)))


def backward_main(pb: Problem, tiling: Tiling, per_sm: int | ResourceBound) -> Grid:
    """``flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel``: block n·T_c + j is key block j of the n-th (batch, head)
    pair; it reads K_j, V_j, then for each query block that sees them, last first, Q_i, dO_i, lse_i, D_i and the
    accumulator of dQ_i (read and written), and writes dK_j, dV_j with the last."""
    s, Bc, data = pb.shape, tiling.Bc, pb.itemsize("data")
    Tr, rows, full = _rows(pb, tiling.Br)
    Tc = -(-s.n_k // Bc)
    met = visits(pb, tiling, skips_hidden=True)
    pair = launch_order(s)
    shared: dict[int, list] = {}  # batch·head -> its query-block steps, last first, one object per i

    def downwards(bh: int) -> list:
        if bh not in shared:
            shared[bh] = [(TILES.access("Q", t, r * s.d * data, READ), TILES.access("dO", t, r * s.d * data, READ),
                           TILES.access("lse", t, r * 4, READ), TILES.access("D", t, full * 4, READ),
                           TILES.access("dQ", t, full * s.d * 4, READ_WRITE))
                          for t, r in reversed(list(enumerate(rows, bh * Tr)))]  # [k] is query block T_r − 1 − k
        return shared[bh]

    def own(bh: int, j: int) -> tuple[Step, Step]:  # K_j, V_j read first, dK_j, dV_j written last
        cols = min(Bc, s.n_k - j * Bc)
        return (tuple(TILES.access(x, s.kv_head(bh) * Tc + j, cols * s.d * data, READ) for x in ("K", "V")),
                tuple(TILES.access(x, bh * Tc + j, cols * s.d * data, WRITE) for x in ("dK", "dV")))

    def steps(b: int):
        n, j = divmod(b, Tc)
        bh = pair(n)
        kv, out = own(bh, j)
        run = met.query_run(j)
        if not run:
            return iter((kv + out,))
        seen = downwards(bh)
        return shared_run(kv, seen, Tr - run.stop, len(run), out)

    def form(capacity: int, concurrent: int) -> DramForm | None:
        """The closed form where every key block sees every query block (``iosim.gpu.head_waves``)."""
        if (s.kv_heads != s.heads or Tr + Tc > head_waves.MOST_LISTED
                or any(len(met.query_run(j)) != Tr for j in range(Tc))):
            return None
        mine = [own(0, j) for j in range(Tc)]
        return head_waves.dram(head_waves.of_accesses(TILES, s.bh, [m[0] for m in mine], downwards(0),
                                                      [m[1] for m in mine]), capacity, concurrent)

    return Grid(s.bh * Tc, steps, TILES, per_sm, form=form)


def convert_dq(pb: Problem, tiling: Tiling, per_sm: int | ResourceBound) -> Grid:
    """``flash_bwd_convert_dq_kernel``: one step per (query block, batch, head), reading dQ_i's accumulator over all
    kBlockM rows (its copy is not predicated on the rows) and writing dQ_i in the dtype over the block's rows."""
    d, data = pb.shape.d, pb.itemsize("data")
    return per_query_block(pb, tiling, per_sm, lambda t, rows, full: (
        TILES.access("dQ", t, full * d * 4, READ), TILES.access("dQ_cast", t, rows * d * data, WRITE)))


@cache
def _binary() -> tuple[dict, ...]:
    return tuple(json.loads(RESOURCES.read_text())["rows"])


def built(kernel: str, pb: Problem, tiling: Tiling, **flags: bool | int) -> dict:
    """The row of ``kernel``'s sm_90 instantiation (its registers, code, …) at the problem's head size and dtype, the
    tile and ``flags`` (its template flags as torch's source names them, and the combine's ``log_max_splits``), from
    torch's binary (``RESOURCES``)."""
    for r in _binary():
        if (r["kernel"], r["head_dim"], r["dtype"]) == (kernel, pb.shape.d, pb.dtype) and all(
                r["flags"].get(name, r.get(name, False)) == value for name, value in flags.items()) and (
                r["block_m"], r["block_n"]) == (tiling.Br, tiling.Bc):
            return r
    raise ValueError(f"{RESOURCES.name} has no {kernel} at d={pb.shape.d}, {pb.dtype}, tile {tiling.Br}×{tiling.Bc}, "
                     f"{flags}: the description launches one that the file does not hold")


def _even(pb: Problem, tiling: Tiling) -> bool:
    """Is_even_MN as torch's launch templates set it: no ragged query or key block (d = kHeadDim here)."""
    return pb.shape.n_q % tiling.Br == 0 and pb.shape.n_k % tiling.Bc == 0


def forward_builds(pb: Problem, tiling: Tiling) -> tuple[tuple[str, dict], ...]:
    """The unsplit forward's kernel and its template flags, as torch's launch template instantiates it here: no
    dropout, window, ALiBi or softcap, K's head size whole."""
    return (("flash_fwd_kernel", dict(Is_dropout=False, Is_causal=pb.causal, Is_local=False, Has_alibi=False,
                                      Is_even_MN=_even(pb, tiling), Is_even_K=True, Is_softcap=False,
                                      Return_softmax=False)),)


def split_builds(pb: Problem, tiling: Tiling, splits: int) -> tuple[tuple[str, dict], ...]:
    """The split-KV forward's two kernels and their flags; the combine built for up to 2, 4, 8, … splits."""
    log_max = max(1, (splits - 1).bit_length())
    return (("flash_fwd_splitkv_kernel", dict(Is_causal=pb.causal, Is_local=False, Has_alibi=False,
                                              Is_even_MN=_even(pb, tiling), Is_even_K=True, Is_softcap=False,
                                              Split=True, Append_KV=False)),
            ("flash_fwd_splitkv_combine_kernel", dict(Is_even_K=True, log_max_splits=log_max)))


def backward_builds(pb: Problem, tiling: Tiling) -> tuple[tuple[str, dict], ...]:
    """The backward's three kernels and their flags, in launch order."""
    return (("flash_bwd_dot_do_o_kernel", dict(Clear_dQaccum=True)),
            ("flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel",
             dict(Is_dropout=False, Is_causal=pb.causal, Is_local=False, Has_alibi=False,
                  Is_even_MN=_even(pb, tiling), Is_even_K=True, Is_softcap=False)),
            ("flash_bwd_convert_dq_kernel", {}))


def code(pb: Problem, tiling: Tiling, builds: tuple[tuple[str, dict], ...]) -> tuple[int, ...]:
    """The machine code and constant bank 0 of each of ``builds``, from torch's binary: what each launch reads from
    DRAM once from a cold L2 (``iosim.gpu.l2.Grid.code_bytes``)."""
    return tuple(built(kernel, pb, tiling, **flags)["code_bytes"] for kernel, flags in builds)


def forward_bound(pb: Problem, tiling: Tiling) -> ResourceBound:
    """The forward's occupancy: Q_i, K_j, V_j in shared memory (16-bit), 128 threads of its registers."""
    Br, Bc, d = tiling.Br, tiling.Bc, pb.shape.d
    (kernel, flags), = forward_builds(pb, tiling)
    return ResourceBound(2 * (Br + 2 * Bc) * d, FORWARD_THREADS, built(kernel, pb, tiling, **flags)["registers"])


def split_bounds(pb: Problem, tiling: Tiling, splits: int) -> tuple[ResourceBound, ResourceBound]:
    """The split-KV kernels' occupancy: the split kernel's Q_i, K_j, V_j in shared memory (16-bit) at 128 threads;
    the combine's lse of every split (its kMaxSplits = 2^⌈log2 S⌉ by kBlockM + 1 float32) at 128 threads."""
    Br, Bc, d = tiling.Br, tiling.Bc, pb.shape.d
    (split, split_flags), (merge, merge_flags) = split_builds(pb, tiling, splits)
    return (ResourceBound(2 * (Br + 2 * Bc) * d, FORWARD_THREADS, built(split, pb, tiling, **split_flags)["registers"]),
            ResourceBound((1 << merge_flags["log_max_splits"]) * (COMBINE_ROWS[d] + 1) * 4, FORWARD_THREADS,
                          built(merge, pb, tiling, **merge_flags)["registers"]))


def backward_bounds(pb: Problem, tiling: Tiling) -> tuple[ResourceBound, ResourceBound, ResourceBound]:
    """The backward kernels' occupancy, in launch order: dot_do_o (no shared memory; it clears the dQ accumulator),
    the main kernel (Q_i twice and dO_i, K_j, V_j, P and dS, 16-bit: 144 KB at both tiles) and convert_dq (dQ_i,
    16-bit), each at 256 threads of its registers."""
    Br, Bc, d = tiling.Br, tiling.Bc, pb.shape.d
    shared = (0, 2 * (3 * Br * d + 2 * Bc * d + 2 * Br * Bc), 2 * Br * d)
    return tuple(ResourceBound(smem, BACKWARD_THREADS, built(kernel, pb, tiling, **flags)["registers"])
                 for smem, (kernel, flags) in zip(shared, backward_builds(pb, tiling), strict=True))
