"""Training on the simulator: ``gradients`` runs an algorithm's forward pass and then its backward pass.

The backward pass is an ``Algorithm`` of its own (``Algorithm.backward``). It reads
Q, K, V (and the mask) and dO, and what it declares of the forward's HBM (O, ℓ, m, or
P) is taken from the forward run, as a training step hands it over. Each pass chooses
its own tiling: the backward pass holds more per tile, so its blocks are smaller.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from iosim.api import Progress, execute, numeric_inputs, plan, work
from iosim.counts import Counts
from iosim.flops import Flops
from iosim.inputs import check_dout, check_values
from iosim.problem import Problem
from iosim.tiling import Tiling


@dataclass(frozen=True)
class GradResult:
    """The gradients of one training step's attention, and the traffic of each pass."""

    algorithm: str
    problem: Problem
    M: int
    forward_tiling: Tiling
    backward_tiling: Tiling
    traffic: Counts  # the backward pass alone
    forward_traffic: Counts
    dq: np.ndarray  # (batch, heads, N_q, d)
    dk: np.ndarray  # (batch, heads, N_k, d)
    dv: np.ndarray  # (batch, heads, N_k, d)
    flops: Flops  # the backward pass alone
    forward_flops: Flops


def gradients(algorithm, q, k, v, do, *, M, causal=False, mask=None, scale=None, dropout_p=0.0, seed=0,
              block_policy="fit", dtype="float16", block_sparsity=None, splits=None, window=None,
              allow_nonfinite=False, on_progress: Progress | None = None) -> GradResult:
    """dQ, dK, dV of attention for the upstream gradient ``do`` (batch, heads, N_q, d), on the simulator.

    Runs ``algorithm``'s forward pass and then its backward pass, numerically in
    float64; the dropout mask of the backward pass is regenerated from ``seed``.
    Rows that see no key get zero gradients. An algorithm whose backward pass must run on
    the forward's tiles (``Algorithm.step_shares_tiling``, block-sparse) runs both passes
    on the backward's tiling. ``splits`` is refused unless 1: no backward pass splits K/V.
    ``window=(left, right)`` is a sliding window, as ``iosim.simulate`` takes it.
    Q, K, V and dO must be real and finite unless ``allow_nonfinite`` asks to propagate inf and NaN.
    ``on_progress(done, total)`` sees the work of both passes (FLOPs and exponentials) after each step.
    """
    pb, data = numeric_inputs(q, k, v, causal=causal, mask=mask, scale=scale, dropout_p=dropout_p, seed=seed,
                              dtype=dtype, block_sparsity=block_sparsity, window=window,
                              allow_nonfinite=allow_nonfinite)
    do = np.asarray(do) if isinstance(do, (list, tuple)) else do
    check_dout(do, pb.shape, "do")
    do = np.asarray(do)
    check_values({"do": do}, allow_nonfinite)
    request = plan(algorithm, pb, M, pass_="fwd+bwd", block_policy=block_policy, splits=splits)
    forward, backward = request.forward, request.backward
    first = work(forward) if on_progress else 0
    total = first + work(backward) if on_progress else 0
    fwd = execute(forward, data, on_progress, total=total)
    saved = {name: fwd.tensor(name) for name in backward.algorithm.saved_inputs() if name != "dO"}
    bwd = execute(backward, {**data, **saved, "dO": do}, on_progress, first, total)
    s = pb.shape
    return GradResult(
        request.name, pb, request.M, forward.tiling, backward.tiling, bwd.counts(), fwd.counts(),
        dq=bwd.tensor("dQ").reshape(s.batch, s.heads, s.n_q, s.d),
        dk=bwd.tensor("dK").reshape(s.batch, s.heads, s.n_k, s.d),
        dv=bwd.tensor("dV").reshape(s.batch, s.heads, s.n_k, s.d), flops=bwd.flops(), forward_flops=fwd.flops(),
    )
