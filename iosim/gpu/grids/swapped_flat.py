"""flash-swapped's forward grid (``iosim.gpu.grids.flash_swapped.ordered_forward``) as the arrays the compiled loops
run (``iosim.gpu.timed_engine.FlatGrid``), built with numpy from the shape instead of by walking every block in
Python: the same steps, tiles, bytes and modes, and the same step objects shared, so the same counts
(tests/test_timed.py holds both equal, block by block and count by count). On 32,768 blocks of one N = 65,536 row
the walk took about 1 s of the row's 2 to 5 s.

Block b = bh·T_r + i has one own first step and, where it sees two key blocks or more, a run of its K/V head's
shared (K_j, V_j) steps and one own last step, as ``shared_run`` gives them:

- no key block: Q_i, O_i, lse_i in one step; one key block j: Q_i, K_j, V_j, O_i, lse_i in one step;
- more: Q_i with the first key block's K, V; the steps between, shared by the head's blocks; the last key block's
  K, V with O_i and lse_i. Blocks that visit their key blocks downwards share the same steps, last first.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.core.visits import visits
from iosim.gpu.l2 import READ, READ_WRITE, SECTOR, WRITE, sectors
from iosim.gpu.timed_engine import FlatGrid


def _written(nbytes: np.ndarray) -> np.ndarray:
    """The mode of a write of ``nbytes``: a write of part of a sector reads it first (``iosim.gpu.l2.Tiles``)."""
    return np.where(nbytes % SECTOR != 0, READ_WRITE, WRITE)


def forward_flat(pb: Problem, tiling: Tiling, downwards: Callable[[int], bool], tensors: tuple[str, ...]) -> FlatGrid:
    """``ordered_forward(pb, tiling, _, downwards)``'s grid, whose tiles' ``tensors`` are Q, K, V, O and lse in some
    order, as ``timed_engine.flatten`` would give it."""
    s, Br, Bc = pb.shape, tiling.Br, tiling.Bc
    Tr, Tc, n = -(-s.n_q // Br), -(-s.n_k // Bc), len(tensors)
    Q, K, V, O, LSE = (tensors.index(name) for name in ("Q", "K", "V", "O", "lse"))
    data, stat = pb.itemsize("data"), pb.itemsize("stat")
    met = visits(pb, tiling, skips_hidden=True)
    runs = [met.key_run(i) for i in range(Tr)]
    first_j = np.array([r.start for r in runs], dtype=np.int64)
    count_j = np.array([len(r) for r in runs], dtype=np.int64)
    kvh_of = np.array([s.kv_head(bh) for bh in range(s.bh)], dtype=np.int64)
    kv_heads = int(kvh_of.max()) + 1

    blocks = s.bh * Tr
    b = np.arange(blocks, dtype=np.int64)
    i, kvh = b % Tr, kvh_of[b // Tr]
    rows = np.minimum(Br, s.n_q - i * Br)
    cnt = count_j[i]
    down = np.fromiter((downwards(int(x)) for x in b), dtype=bool, count=blocks) & (cnt > 1)
    lo, hi = first_j[i], first_j[i] + cnt - 1  # the key blocks met, first and last, upwards
    jf, jl = np.where(down, hi, lo), np.where(down, lo, hi)  # the first and last in the block's order

    # the shared steps: (K_j, V_j) of K/V head h is step h·T_c + j; the keys of a tile: index·n + tensor
    j = np.arange(Tc, dtype=np.int64)
    cols = np.minimum(Bc, s.n_k - j * Bc)
    k_bytes, v_bytes = sectors(cols * s.d * data), sectors(cols * s.d_v * data)
    kv_index = (np.arange(kv_heads, dtype=np.int64)[:, None] * Tc + j).ravel()
    body_keys = np.stack((kv_index * n + K, kv_index * n + V), axis=1).ravel()
    body_bytes = np.stack((np.tile(k_bytes, kv_heads), np.tile(v_bytes, kv_heads)), axis=1).ravel()
    body_modes = np.full(body_keys.shape[0], READ, dtype=np.int64)
    shared = kv_heads * Tc

    # each block's own first step: Q, then K, V of its first key block, then O, lse where it has no other step
    q_bytes, o_bytes, l_bytes = sectors(rows * s.d * data), rows * s.d * data, rows * stat
    first_kv = kvh * Tc + jf
    one = cnt <= 1  # the block's only step
    head = np.stack((b * n + Q, first_kv * n + K, first_kv * n + V, b * n + O, b * n + LSE), axis=1)
    head_bytes = np.stack((q_bytes, k_bytes[jf], v_bytes[jf], sectors(o_bytes), sectors(l_bytes)), axis=1)
    head_modes = np.stack((np.full(blocks, READ), np.full(blocks, READ), np.full(blocks, READ), _written(o_bytes),
                           _written(l_bytes)), axis=1)
    head_use = np.stack((np.ones(blocks, bool), cnt > 0, cnt > 0, one, one), axis=1)

    # the own last step of a block that has one: K, V of its last key block, O, lse
    tailed = np.flatnonzero(~one)
    last_kv = kvh[tailed] * Tc + jl[tailed]
    bt = b[tailed]
    tail = np.stack((last_kv * n + K, last_kv * n + V, bt * n + O, bt * n + LSE), axis=1)
    tail_bytes = np.stack((k_bytes[jl[tailed]], v_bytes[jl[tailed]], sectors(o_bytes[tailed]),
                           sectors(l_bytes[tailed])), axis=1)
    tail_modes = np.stack((np.full(tailed.size, READ), np.full(tailed.size, READ), _written(o_bytes[tailed]),
                           _written(l_bytes[tailed])), axis=1)

    keys = np.concatenate((body_keys, head[head_use], tail.ravel()))
    nbytes = np.concatenate((body_bytes, head_bytes[head_use], tail_bytes.ravel()))
    modes = np.concatenate((body_modes, head_modes[head_use], tail_modes.ravel())).astype(np.int64)
    sizes = np.concatenate((np.full(shared, 2), head_use.sum(axis=1), np.full(tailed.size, 4)))
    dense, inverse = np.unique(keys, return_inverse=True)
    key_tensor = (dense % n).astype(np.int64)

    # the shared runs: body 2h upwards, 2h + 1 downwards (the same steps, last first)
    ups = kv_index.reshape(kv_heads, Tc)
    body_ids = np.stack((ups, ups[:, ::-1]), axis=1).ravel()
    start = np.where(down, Tc - 1 - jf, jf) + 1  # the step after the first, in the body's order
    runs_of = ~one
    post_counts = runs_of.astype(np.int64)
    return FlatGrid(
        pre_offsets=np.arange(blocks + 1, dtype=np.int64), pre_ids=shared + b,
        body=np.where(runs_of, 2 * kvh + down, -1), start=np.where(runs_of, start, 0),
        stop=np.where(runs_of, start + cnt - 2, 0), body_offsets=np.arange(0, 2 * shared + 1, Tc, dtype=np.int64),
        body_ids=body_ids.astype(np.int64), post_offsets=np.concatenate(([0], np.cumsum(post_counts))),
        post_ids=shared + blocks + np.arange(tailed.size, dtype=np.int64),
        step_offsets=np.concatenate(([0], np.cumsum(sizes))).astype(np.int64), keys=inverse.astype(np.int64),
        nbytes=nbytes.astype(np.int64), modes=modes, key_tensor=key_tensor, partner_bytes=np.zeros_like(nbytes),
        partner_tensor=key_tensor.copy())
