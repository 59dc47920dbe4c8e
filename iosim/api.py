"""The Python API: ``simulate`` (numeric), ``count`` (count-only) and ``predict`` (closed form).

``algorithm`` is a registered name (``iosim.ALGORITHMS``) or an ``iosim.Algorithm``.
The tiling is chosen by ``block_policy`` (``iosim.tiling.POLICIES``) unless an
explicit ``tiling=iosim.Tiling(Br, Bc)`` is given. ``count`` and ``predict`` take
``pass_="bwd"`` for an algorithm's backward pass (``iosim.gradients`` runs it
numerically) and ``pass_="fwd+bwd"`` for both, a training step; each pass chooses its
own tiling, except that a block-sparse algorithm runs both on the backward's.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from iosim.algorithm import Algorithm
from iosim.counts import Counts, combined
from iosim.errors import InputError, InputTypeError
from iosim.flops import Flops
from iosim.inputs import AttentionShape, check_flag, check_mask, check_positive_int, check_qkv, check_scale
from iosim.memory import Memory
from iosim.problem import Problem
from iosim.registry import get_algorithm
from iosim.tiling import Tiling, choose_tiling
from iosim.units import parse_size


@dataclass(frozen=True)
class SimResult:
    """One simulated run. Arrays are None in count-only mode and for outputs the algorithm lacks."""

    algorithm: str
    problem: Problem
    M: int
    tiling: Tiling
    traffic: Counts
    out: np.ndarray | None = None  # (batch, heads, N_q, d)
    l: np.ndarray | None = None  # (batch, heads, N_q): softmax normalizer ℓ
    m: np.ndarray | None = None  # (batch, heads, N_q): row max m
    flops: Flops | None = None  # the arithmetic the run counted
    forward_tiling: Tiling | None = None  # with pass "fwd+bwd", the forward pass's (``tiling`` is the backward's)

    @property
    def lse(self) -> np.ndarray | None:
        """log Σ_j exp(S_ij) = m + log ℓ; −inf on rows that see no key."""
        if self.l is None:
            return None
        with np.errstate(divide="ignore"):
            return np.where(self.l == 0, -np.inf, self.m + np.log(np.where(self.l == 0, 1.0, self.l)))


@dataclass(frozen=True)
class PredictResult:
    algorithm: str
    problem: Problem
    M: int
    tiling: Tiling
    exact: Counts  # equal to what count() and simulate() measure
    paper: float  # the paper's asymptotic form, in elements
    paper_label: str
    flops: Flops | None = None  # exact arithmetic; None for an algorithm that declares no closed form for it
    forward_tiling: Tiling | None = None  # with pass "fwd+bwd", the forward pass's (``tiling`` is the backward's)


PASSES = ("fwd", "bwd")  # the forward pass, and the backward pass that reads what it saved
TRAINING = "fwd+bwd"  # both passes, one after the other: what count and predict also take


def pass_of(algorithm, pass_: str) -> Algorithm:
    """The algorithm that runs pass ``pass_`` of ``algorithm``: itself, or its backward pass."""
    algo = get_algorithm(algorithm)
    if pass_ not in PASSES:
        raise InputError(f"pass_={pass_!r} is not one of {list(PASSES)}")
    if pass_ == "fwd":
        return algo
    if algo.backward is None:
        raise InputError(f"algorithm={algo.name!r} has no backward pass; allowed with pass 'bwd': "
                         f"algorithms whose backward is set")
    return algo.backward


def step_tilings(algorithm, pb: Problem, M, block_policy: str, tiling: Tiling | None = None
                 ) -> tuple[Algorithm, Algorithm, int, Tiling, Tiling]:
    """A training step's forward and backward algorithms, M in elements, and the two passes' tilings.

    Each pass chooses its own tiling, except that a block-sparse algorithm runs both on
    the backward's (its block mask is defined on the tiles), which fits the forward too.
    An explicit ``tiling`` is used for both passes.
    """
    forward = get_algorithm(algorithm)
    backward, M, backward_tiling, _ = _tiled(pass_of(forward, "bwd"), pb, M, block_policy, tiling)
    shared = tiling if tiling is not None else backward_tiling if forward.block_sparse else None
    return forward, backward, M, choose_tiling(forward, pb, M, block_policy, shared), backward_tiling


def _check_pass(pass_) -> None:
    if pass_ not in (*PASSES, TRAINING):
        raise InputError(f"pass_={pass_!r} is not one of {[*PASSES, TRAINING]}")


def _count_problem(N, d, N_k, batch, heads, *, causal, mask, dropout_p, seed, dtype, block_sparsity=None,
                   kv_heads=None) -> Problem:
    """The problem of a count or a prediction: sizes only, no data."""
    shape = AttentionShape(
        batch=check_positive_int("batch", batch), heads=check_positive_int("heads", heads),
        n_q=check_positive_int("N", N), n_k=check_positive_int("N_k", N if N_k is None else N_k),
        d=check_positive_int("d", d), kv_heads=None if kv_heads is None else check_positive_int("kv_heads", kv_heads),
    )
    if not isinstance(mask, (bool, np.bool_)):
        raise InputTypeError(f"mask={type(mask).__name__}: count and predict take mask=True or False (whether an "
                             f"explicit mask is read); simulate takes the boolean mask array")
    return Problem(shape, tau=check_scale(None, shape.d), causal=check_flag("causal", causal), has_mask=bool(mask),
                   dropout_p=dropout_p, seed=seed, dtype=dtype, block_sparsity=block_sparsity)


def simulation_bytes(algorithm, *, N, d, N_k=None, batch=1, heads=1, mask=False, kv_heads=None) -> int:
    """Bytes a numeric simulation holds for its HBM tensors: float64 data, one byte per mask element."""
    pb = _count_problem(N, d, N_k, batch, heads, causal=False, mask=mask, dropout_p=0.0, seed=0, dtype="float64",
                        kv_heads=kv_heads)
    return sum(_heads(t, pb) * rows * cols * (1 if t.element == "mask" else 8)
               for t in get_algorithm(algorithm).hbm_tensors(pb) for rows, cols in [t.shape(pb)])


def _heads(t, pb: Problem) -> int:
    """How many (batch·)heads of tensor ``t`` HBM holds: batch·kv_heads for K and V, else batch·heads."""
    return pb.shape.bkv if t.kv else pb.shape.bh


def run_problem(algorithm, pb: Problem) -> Problem:
    """The problem as ``algorithm`` runs it: packed by GQA group when it serves a group from one K/V load."""
    return pb.packed_by_group() if get_algorithm(algorithm).packs_groups else pb


def new_memory(algo: Algorithm, pb: Problem, M: int, data: dict | None = None, tiling: Tiling | None = None
               ) -> Memory:
    """A run's memory: every HBM tensor the algorithm declares, inputs filled from ``data``.

    ``data`` maps tensor names to arrays for a numeric run; None makes it count-only.
    ``pb`` is the problem as the algorithm runs it (``run_problem``); ``tiling`` sizes the
    tensors that have one block per K/V split.
    """
    mem = Memory(M, bh=pb.shape.bh, numeric=data is not None)
    for t in algo.hbm_tensors(pb):
        mem.add_tensor(t.name, *t.shape(pb, tiling), pb.itemsize(t.element), data=(data or {}).get(t.name),
                       heads=_heads(t, pb))
    return mem


def check_grouped_pass(pb: Problem, pass_: str) -> None:
    if pass_ != "fwd" and pb.shape.kv_heads != pb.shape.heads:
        raise InputError(f"kv_heads={pb.shape.kv_heads} with pass {pass_!r}: the backward passes take "
                         f"kv_heads == heads={pb.shape.heads} (grouped-query attention is forward only)")


def _tiled(algorithm, pb: Problem, M, block_policy: str, tiling: Tiling | None, splits=None
           ) -> tuple[Algorithm, int, Tiling, Problem]:
    """The algorithm, M in elements, the tiling of the run and the problem as the algorithm runs it."""
    algo = get_algorithm(algorithm)
    M = parse_size(M, pb.dtype)
    pb = run_problem(algo, pb)
    return algo, M, choose_tiling(algo, pb, M, block_policy, tiling, splits), pb


def _execute(algorithm, pb: Problem, M, block_policy: str, tiling: Tiling | None, data: dict | None,
             splits=None) -> SimResult:
    algo, M, tiling, run_pb = _tiled(algorithm, pb, M, block_policy, tiling, splits)
    mem = new_memory(algo, run_pb, M, data, tiling)
    algo.run(mem, run_pb, tiling)
    result = dict(algorithm=algo.name, problem=pb, M=M, tiling=tiling, traffic=mem.counts(), flops=mem.flops())
    if mem.numeric:
        s = pb.shape
        result["out"] = mem.tensor("O").reshape(s.batch, s.heads, s.n_q, s.d)
        if {"l", "m"} <= set(algo.outputs()):
            result["l"] = mem.tensor("l").reshape(s.batch, s.heads, s.n_q)
            result["m"] = mem.tensor("m").reshape(s.batch, s.heads, s.n_q)
    return SimResult(**result)


def numeric_inputs(q, k, v, *, causal, mask, scale, dropout_p, seed, dtype, block_sparsity=None
                   ) -> tuple[Problem, dict]:
    """The problem of a numeric run, and its HBM inputs by tensor name (Q, K, V and the mask)."""
    q, k, v = (np.asarray(x) if isinstance(x, (list, tuple)) else x for x in (q, k, v))
    shape = check_qkv(q, k, v)
    if isinstance(mask, (bool, np.bool_)):
        raise InputTypeError(f"mask={mask!r}: simulate takes a boolean array (True = attend) or None; count and "
                             f"predict take mask=True or False")
    full_mask = check_mask(mask, shape)
    pb = Problem(shape, tau=check_scale(scale, shape.d), causal=check_flag("causal", causal),
                 has_mask=full_mask is not None,
                 dropout_p=dropout_p, seed=seed, dtype=dtype, block_sparsity=block_sparsity)
    data = {"Q": np.asarray(q), "K": np.asarray(k), "V": np.asarray(v)}
    if full_mask is not None:
        data["mask"] = full_mask
    return pb, data


def simulate(algorithm, q, k, v, *, M, causal=False, mask=None, scale=None, dropout_p=0.0, seed=0,
             block_policy="fit", tiling=None, dtype="float16", block_sparsity=None, splits=None) -> SimResult:
    """Run ``algorithm`` numerically on q (batch, heads, N_q, d) and k, v (batch, kv_heads, N_k, d).

    kv_heads divides heads (grouped-query attention; kv_heads = heads is multi-head
    attention). ``splits`` sets the K/V splits of an algorithm that splits K/V
    (``split-kv``), whose default policy chooses them otherwise.
    Computation is in float64; ``dtype`` sets the bytes per element of the traffic
    report and how a byte-sized M (e.g. "192KiB") converts to elements.
    ``block_sparsity`` (an ``iosim.BlockSparsity``) is the block mask of the
    block-sparse algorithms; the others ignore it.
    """
    pb, data = numeric_inputs(q, k, v, causal=causal, mask=mask, scale=scale, dropout_p=dropout_p, seed=seed,
                              dtype=dtype, block_sparsity=block_sparsity)
    result = _execute(algorithm, pb, M, block_policy, tiling, data, splits)
    if not np.isfinite(result.out).all() and all(np.isfinite(data[n]).all() for n in ("Q", "K", "V")):
        warnings.warn(f"scale={pb.tau!r}: tau·QKᵀ overflowed float64 (finite inputs gave a non-finite output); "
                      f"float64 holds magnitudes below 1.8e308", RuntimeWarning, stacklevel=2)
    return result


def count(algorithm, *, N, d, M, N_k=None, batch=1, heads=1, causal=False, mask=False, dropout_p=0.0,
          seed=0, block_policy="fit", tiling=None, dtype="float16", pass_="fwd", block_sparsity=None,
          kv_heads=None, splits=None) -> SimResult:
    """Run ``algorithm`` count-only: tiles carry shapes, nothing is computed.

    N is N_q; N_k defaults to N. ``mask=True`` counts the reads of an explicit mask.
    ``pass_="bwd"`` counts the backward pass alone; ``pass_="fwd+bwd"`` both, their
    traffic and arithmetic added (``tiling`` is then the backward's, ``forward_tiling``
    the forward's, and the peak the larger pass's).
    """
    _check_pass(pass_)
    pb = _count_problem(N, d, N_k, batch, heads, causal=causal, mask=mask, dropout_p=dropout_p, seed=seed,
                        dtype=dtype, block_sparsity=block_sparsity, kv_heads=kv_heads)
    check_grouped_pass(pb, pass_)
    if pass_ != TRAINING:
        return _execute(pass_of(algorithm, pass_), pb, M, block_policy, tiling, None, splits)
    forward, backward, M, forward_tiling, backward_tiling = step_tilings(algorithm, pb, M, block_policy, tiling)
    fwd = _execute(forward, pb, M, block_policy, forward_tiling, None)
    bwd = _execute(backward, pb, M, block_policy, backward_tiling, None)
    return SimResult(forward.name, pb, M, backward_tiling, combined(fwd.traffic, bwd.traffic),
                     flops=fwd.flops + bwd.flops, forward_tiling=forward_tiling)


def predict(algorithm, *, N, d, M, N_k=None, batch=1, heads=1, causal=False, mask=False, dropout_p=0.0,
            block_policy="fit", tiling=None, dtype="float16", pass_="fwd", block_sparsity=None,
            kv_heads=None, splits=None) -> PredictResult:
    """The exact closed-form traffic of ``algorithm``, and the paper's asymptotic form beside it.

    ``pass_="bwd"`` predicts the backward pass alone; ``pass_="fwd+bwd"`` both, as ``count``
    adds them (the paper's forms added too).
    """
    _check_pass(pass_)
    pb = _count_problem(N, d, N_k, batch, heads, causal=causal, mask=mask, dropout_p=dropout_p, seed=0, dtype=dtype,
                        block_sparsity=block_sparsity, kv_heads=kv_heads)
    check_grouped_pass(pb, pass_)
    if pass_ != TRAINING:
        algo, M, tiling, run_pb = _tiled(pass_of(algorithm, pass_), pb, M, block_policy, tiling, splits)
        return PredictResult(algo.name, pb, M, tiling, algo.traffic(run_pb, tiling, M), algo.paper_form(run_pb, M),
                             algo.paper_label, algo.flops(run_pb, tiling, M) if algo.flops else None)
    forward, backward, M, forward_tiling, backward_tiling = step_tilings(algorithm, pb, M, block_policy, tiling)
    passes = ((forward, forward_tiling), (backward, backward_tiling))
    flops = [a.flops(pb, t, M) for a, t in passes if a.flops]
    return PredictResult(forward.name, pb, M, backward_tiling, combined(*(a.traffic(pb, t, M) for a, t in passes)),
                         sum(a.paper_form(pb, M) for a, _ in passes), " + ".join(a.paper_label for a, _ in passes),
                         flops[0] + flops[1] if len(flops) == 2 else None, forward_tiling=forward_tiling)
