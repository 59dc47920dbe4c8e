"""A toy attention algorithm defined outside iosim: K and V stay on chip whole.

docs/architecture.md walks through this file; tests/test_architecture_example.py
registers it and holds it to the same checks as the built-in algorithms.

Each query block Q_i is loaded once, its whole row of scores S_i (B_r × N_k) is
computed against the resident K, softmaxed in one pass and multiplied by the
resident V. HBM sees Q, K, V read once and O written once; the price is SRAM:
2·N_k·d for K and V plus the S_i row block. B_c plays no part. It supports the
scale, a causal mask and dropout; an explicit mask is refused.
"""

from __future__ import annotations

import iosim
from iosim.algorithms.algorithm import OUTPUT, Algorithm, exact_counts
from iosim.algorithms.tile_ops import apply_dropout, exp_diff, safe_divide, scores
from iosim.core.counts import Counts
from iosim.core.memory import Memory
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.core.visits import visits

TENSORS = (OUTPUT,)  # what it writes beside the inputs Q, K, V


def run(mem: Memory, pb: Problem, tiling: Tiling) -> None:
    """Attention with K and V resident; leaves O in HBM."""
    if pb.has_mask:
        raise iosim.InputError("mask: the kv-resident example supports no explicit mask; allowed: mask=None")
    n_k = pb.shape.n_k
    every_key = slice(0, n_k)
    K, V = mem.load("K", every_key), mem.load("V", every_key)  # (bh, N_k, d) each, read once
    for _, rows in mem.loop(visits(pb, tiling, skips_hidden=False).q.all()):
        br = rows.stop - rows.start
        Q_i = mem.load("Q", rows)
        S_i = mem.alloc("S_i", br, n_k)
        O_i = mem.alloc("O_i", br, pb.shape.d)
        if mem.numeric:
            S_i.data = scores(pb, Q_i, K, rows, every_key, None)  # (bh, Br, N_k), causal applied
            m = S_i.data.max(axis=-1, keepdims=True)
            P = exp_diff(S_i.data, m)
            P = apply_dropout(pb, safe_divide(P, P.sum(axis=-1, keepdims=True)), rows, every_key)
            O_i.data = P @ V.data  # (bh, Br, d)
        mem.store(O_i, "O", rows)
        mem.free(Q_i, S_i, O_i)
    mem.free(K, V)


def working_set(pb: Problem, tiling: Tiling, M: int) -> int:
    n_k, d, Br = pb.shape.n_k, pb.shape.d, tiling.Br
    return 2 * n_k * d + Br * d + Br * n_k + Br * d  # K, V + Q_i + S_i + O_i


def traffic(pb: Problem, tiling: Tiling, M: int) -> Counts:
    n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d
    reads = {"Q": n_q * d, "K": n_k * d, "V": n_k * d}  # each read once
    writes = {"O": n_q * d}  # written once
    return exact_counts(TENSORS, pb, reads, writes, working_set(pb, tiling, M))


def paper_form(pb: Problem, M: int) -> float:
    """No paper analyses it: its exact count, Θ(Nd), stands in."""
    return pb.shape.bh * (pb.shape.n_q + 2 * pb.shape.n_k + pb.shape.n_q) * pb.shape.d


KV_RESIDENT = Algorithm(
    name="kv-resident", run=run, tensors=TENSORS, outer="Br", working_set=working_set, traffic=traffic,
    paper_form=paper_form, paper_label="2N_q·d + 2N_k·d",
)
