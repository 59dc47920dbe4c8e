"""Training on the simulator: ``gradients`` runs an algorithm's forward pass and then its backward pass.

The backward pass is an ``Algorithm`` of its own (``Algorithm.backward``). It reads
Q, K, V (and the mask) and dO, and what it declares of the forward's HBM (O, ℓ, m, or
P) is taken from the forward run, as a training step hands it over. Each pass chooses
its own tiling: the backward pass holds more per tile, so its blocks are smaller.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from iosim.api import check_grouped_pass, new_memory, numeric_inputs, step_tilings
from iosim.counts import Counts
from iosim.flops import Flops
from iosim.inputs import check_dout
from iosim.problem import Problem
from iosim.tiling import Tiling


@dataclass(frozen=True)
class GradResult:
    """The gradients of one training step's attention, and the traffic of each pass."""

    algorithm: str
    problem: Problem
    M: int
    tiling: Tiling  # the backward pass's
    forward_tiling: Tiling
    traffic: Counts  # the backward pass alone
    forward_traffic: Counts
    dq: np.ndarray  # (batch, heads, N_q, d)
    dk: np.ndarray  # (batch, heads, N_k, d)
    dv: np.ndarray  # (batch, heads, N_k, d)
    flops: Flops  # the backward pass alone
    forward_flops: Flops


def gradients(algorithm, q, k, v, do, *, M, causal=False, mask=None, scale=None, dropout_p=0.0, seed=0,
              block_policy="fit", dtype="float16", block_sparsity=None) -> GradResult:
    """dQ, dK, dV of attention for the upstream gradient ``do`` (batch, heads, N_q, d), on the simulator.

    Runs ``algorithm``'s forward pass and then its backward pass, numerically in
    float64; the dropout mask of the backward pass is regenerated from ``seed``.
    Rows that see no key get zero gradients. An algorithm whose backward pass must run on
    the forward's tiles (``Algorithm.block_sparse``, block-sparse) runs both passes on
    the backward's tiling.
    """
    pb, data = numeric_inputs(q, k, v, causal=causal, mask=mask, scale=scale, dropout_p=dropout_p, seed=seed,
                              dtype=dtype, block_sparsity=block_sparsity)
    do = np.asarray(do) if isinstance(do, (list, tuple)) else do
    check_dout(do, pb.shape, "do")
    check_grouped_pass(pb, "bwd")

    forward, backward, M, forward_tiling, tiling = step_tilings(algorithm, pb, M, block_policy)
    fwd = new_memory(forward, pb, M, data)
    forward.run(fwd, pb, forward_tiling)
    forward_traffic = fwd.counts()
    saved = {name: fwd.tensor(name) for name in backward.saved_inputs() if name != "dO"}
    bwd = new_memory(backward, pb, M, {**data, **saved, "dO": np.asarray(do)})
    backward.run(bwd, pb, tiling)
    s = pb.shape
    return GradResult(
        forward.name, pb, M, tiling, forward_tiling, bwd.counts(), forward_traffic,
        dq=bwd.tensor("dQ").reshape(s.batch, s.heads, s.n_q, s.d),
        dk=bwd.tensor("dK").reshape(s.batch, s.heads, s.n_k, s.d),
        dv=bwd.tensor("dV").reshape(s.batch, s.heads, s.n_k, s.d), flops=bwd.flops(), forward_flops=fwd.flops(),
    )
