"""Training on the simulator: ``gradients`` runs an algorithm's forward pass and then its backward pass.

The backward pass is an ``Algorithm`` of its own (``Algorithm.backward``). It reads
Q, K, V (and the mask) and dO, and what it declares of the forward's HBM (O, ℓ, m, or
P) is taken from the forward run, as a training step hands it over. Each pass chooses
its own tiling: the backward pass holds more per tile, so its blocks are smaller.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from iosim.api import Progress, execute_parts, numeric_inputs, part_inputs, plan, unpacked, work
from iosim.core.counts import Counts, combined
from iosim.core.flops import Flops
from iosim.core.inputs import check_dout, check_values
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.variants.varlen import tokens


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
    dv: np.ndarray  # (batch, heads, N_k, d_v)
    flops: Flops  # the backward pass alone
    forward_flops: Flops
    dsinks: np.ndarray | None = None  # (heads,): the gradient of each head's attention sink, its batch summed; or None


def gradients(algorithm, q, k, v, do, *, M, causal=False, mask=None, scale=None, dropout_p=0.0, seed=0,
              block_policy="fit", dtype="float16", block_sparsity=None, splits=None, window=None,
              allow_nonfinite=False, on_progress: Progress | None = None, seqlens=None, cu_seqlens=None,
              sinks=None, block_mask=None, score_mod=None, tiling=None) -> GradResult:
    """dQ, dK, dV of attention for the upstream gradient ``do`` (batch, heads, N_q, d_v), on the simulator.

    Runs ``algorithm``'s forward pass and then its backward pass, numerically in
    float64; the dropout mask of the backward pass is regenerated from ``seed``.
    Rows that see no key get zero gradients. An algorithm whose backward pass must run on
    the forward's tiles (``Algorithm.step_shares_tiling``, block-sparse) runs both passes
    on the backward's tiling. ``splits`` is refused unless 1: no backward pass splits K/V.
    ``window=(left, right)`` is a sliding window, as ``iosim.simulate`` takes it.
    Q, K, V and dO must be real and finite unless ``allow_nonfinite`` asks to propagate inf and NaN.
    ``on_progress(done, total)`` sees the work of both passes (FLOPs and exponentials) after each step.
    ``seqlens`` (or ``cu_seqlens``) packs documents end to end, as ``iosim.simulate`` takes them.
    ``sinks``, one logit per query head, are learned attention sinks as ``iosim.simulate`` takes them; the result's
    ``dsinks`` is their gradient (an algorithm whose backward pass takes none refuses them). ``block_mask`` is the
    FlexAttention block mask flex runs both passes over (``iosim.block_mask``). ``tiling`` (an ``iosim.Tiling``)
    runs both passes, as ``iosim.count(..., pass_="fwd+bwd", tiling=...)`` counts them.
    """
    pb, data = numeric_inputs(q, k, v, causal=causal, mask=mask, scale=scale, dropout_p=dropout_p, seed=seed,
                              dtype=dtype, block_sparsity=block_sparsity, window=window,
                              allow_nonfinite=allow_nonfinite, seqlens=seqlens, cu_seqlens=cu_seqlens, sinks=sinks,
                              block_mask=block_mask, score_mod=score_mod)
    do = np.asarray(do) if isinstance(do, (list, tuple)) else do
    check_dout(do, replace(pb.shape, n_q=tokens(pb)), "do")  # packed documents: (1, heads, Σ L_b, d)
    do = np.asarray(do)
    check_values({"do": do}, allow_nonfinite)
    request = plan(algorithm, pb, M, pass_="fwd+bwd", block_policy=block_policy, splits=splits, tiling=tiling)
    forward, backward = request.forward, request.backward
    first = work(forward) if on_progress else 0
    total = first + work(backward) if on_progress else 0
    fwd = execute_parts(forward, data, on_progress, total=total)
    bwd = []  # each document length's backward pass, on what its forward saved
    for (part, mem), back in zip(fwd, backward.parts()):
        saved = {name: mem.tensor(name) for name in backward.algorithm.saved_inputs() if name != "dO"}
        bwd += execute_parts(back, {**part_inputs({**data, "dO": do}, pb, part.problem), **saved}, on_progress, first,
                             total)
        first += sum(f.matmul + f.exp for f in (m.flops() for _, m in bwd[-1:]))
    d, d_v = pb.shape.d, pb.shape.d_v
    return GradResult(
        request.name, pb, request.M, forward.tiling, backward.tiling, combined(*(m.counts() for _, m in bwd)),
        combined(*(m.counts() for _, m in fwd)), dq=unpacked(pb, bwd, "dQ", d), dk=unpacked(pb, bwd, "dK", d),
        dv=unpacked(pb, bwd, "dV", d_v), flops=_added(bwd), forward_flops=_added(fwd),
        dsinks=None if not pb.sinks else sum(mem.tensor("dsinks") for _, mem in bwd).reshape(
            pb.shape.batch, pb.shape.heads).sum(axis=0),
    )


def _added(runs) -> Flops:
    flops = [mem.flops() for _, mem in runs]
    return sum(flops[1:], flops[0])
