"""The Python API: ``simulate`` (numeric), ``count`` (count-only) and ``predict`` (closed form)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from iosim.blocks import choose_blocks
from iosim.inputs import AttentionShape, check_mask, check_positive_int, check_qkv, check_scale
from iosim.memory import Memory, Traffic
from iosim.predict import Prediction
from iosim.problem import Problem, check_dtype
from iosim.registry import Algorithm, get_algorithm
from iosim.rng import check_dropout_p, check_seed
from iosim.units import parse_size


@dataclass(frozen=True)
class RNGState:
    """What the backward pass needs to regenerate the dropout mask (Alg. 2's R)."""

    seed: int
    dropout_p: float


@dataclass(frozen=True)
class SimResult:
    """One simulated run. Arrays are None in count-only mode and for outputs the algorithm lacks."""

    algorithm: str
    problem: Problem
    M: int
    Br: int
    Bc: int
    traffic: Traffic
    out: np.ndarray | None = None  # (batch, heads, N_q, d)
    l: np.ndarray | None = None  # (batch, heads, N_q): softmax normalizer ℓ
    m: np.ndarray | None = None  # (batch, heads, N_q): row max m
    rng_state: RNGState | None = None

    @property
    def lse(self) -> np.ndarray | None:
        """log Σ_j exp(S_ij) = m + log ℓ; −inf on rows that see no key."""
        if self.l is None:
            return None
        with np.errstate(divide="ignore"):
            return np.where(self.l == 0, -np.inf, self.m + np.log(np.where(self.l == 0, 1.0, self.l)))


def _problem(shape: AttentionShape, *, scale, causal, has_mask, dropout_p, seed, dtype) -> Problem:
    return Problem(shape=shape, tau=check_scale(scale, shape.d), causal=bool(causal), has_mask=has_mask,
                   dropout_p=check_dropout_p(dropout_p), seed=check_seed(seed), dtype=check_dtype(dtype))


def _count_problem(N, d, N_k, batch, heads, *, causal, mask, dropout_p, seed, dtype) -> Problem:
    """The problem of a count or a prediction: sizes only, no data."""
    shape = AttentionShape(
        batch=check_positive_int("batch", batch), heads=check_positive_int("heads", heads),
        n_q=check_positive_int("N", N), n_k=check_positive_int("N_k", N if N_k is None else N_k),
        d=check_positive_int("d", d),
    )
    return _problem(shape, scale=None, causal=causal, has_mask=bool(mask), dropout_p=dropout_p, seed=seed,
                    dtype=dtype)


def new_memory(algo: Algorithm, pb: Problem, M: int, data: dict | None = None) -> Memory:
    """A run's memory: Q, K, V (and the mask) in HBM, and room there for the algorithm's outputs.

    ``data`` maps tensor names to arrays for a numeric run; None makes it count-only.
    """
    s = pb.shape
    mem = Memory(M, bh=s.bh, numeric=data is not None)
    data = data or {}
    inputs = [("Q", s.n_q, s.d), ("K", s.n_k, s.d), ("V", s.n_k, s.d)] + ([("mask", s.n_q, s.n_k)] if pb.has_mask else [])
    outputs = [(name, s.n_q, {"O": s.d, "l": 1, "m": 1}.get(name, s.n_k)) for name in algo.outputs]  # S, P: N_q × N_k
    for name, rows, cols in inputs + outputs:
        mem.add_tensor(name, rows, cols, pb.itemsize_of(name), data=data.get(name))
    return mem


def _blocked(algorithm: str, pb: Problem, M, block_policy: str) -> tuple[Algorithm, int, int, int]:
    """The algorithm, M in elements and the block sizes (B_r, B_c) of its policy."""
    algo = get_algorithm(algorithm)
    M = parse_size(M, pb.dtype)
    return (algo, M, *choose_blocks(algo, pb, M, block_policy))


def _execute(algorithm: str, pb: Problem, M, block_policy: str, data: dict | None) -> SimResult:
    algo, M, Br, Bc = _blocked(algorithm, pb, M, block_policy)
    s = pb.shape
    mem = new_memory(algo, pb, M, data)
    algo.run(mem, pb, Br, Bc)
    result = dict(algorithm=algorithm, problem=pb, M=M, Br=Br, Bc=Bc, traffic=mem.traffic())
    if mem.numeric:
        result["out"] = mem.tensor("O").reshape(s.batch, s.heads, s.n_q, s.d)
        if "l" in algo.outputs:
            result["l"] = mem.tensor("l").reshape(s.batch, s.heads, s.n_q)
            result["m"] = mem.tensor("m").reshape(s.batch, s.heads, s.n_q)
            result["rng_state"] = RNGState(pb.seed, pb.dropout_p)
    return SimResult(**result)


def simulate(algorithm: str, q, k, v, *, M, causal=False, mask=None, scale=None, dropout_p=0.0, seed=0,
             block_policy="fit", dtype="float16") -> SimResult:
    """Run ``algorithm`` numerically on q (batch, heads, N_q, d) and k, v (batch, heads, N_k, d).

    Computation is in float64; ``dtype`` sets the bytes per element of the traffic
    report and how a byte-sized M (e.g. "192KiB") converts to elements.
    """
    shape = check_qkv(q, k, v)
    full_mask = check_mask(mask, shape)
    pb = _problem(shape, scale=scale, causal=causal, has_mask=full_mask is not None, dropout_p=dropout_p,
                  seed=seed, dtype=dtype)
    data = {"Q": np.asarray(q), "K": np.asarray(k), "V": np.asarray(v)}
    if full_mask is not None:
        data["mask"] = full_mask
    return _execute(algorithm, pb, M, block_policy, data)


def count(algorithm: str, *, N, d, M, N_k=None, batch=1, heads=1, causal=False, mask=False, dropout_p=0.0,
          seed=0, block_policy="fit", dtype="float16") -> SimResult:
    """Run ``algorithm`` count-only: tiles carry shapes, nothing is computed.

    N is N_q; N_k defaults to N. ``mask=True`` counts the reads of an explicit mask.
    """
    pb = _count_problem(N, d, N_k, batch, heads, causal=causal, mask=mask, dropout_p=dropout_p, seed=seed,
                        dtype=dtype)
    return _execute(algorithm, pb, M, block_policy, None)


@dataclass(frozen=True)
class PredictResult:
    algorithm: str
    problem: Problem
    M: int
    Br: int
    Bc: int
    exact: Prediction
    paper: float  # the paper's or seed's asymptotic form, in elements
    paper_label: str


def predict(algorithm: str, *, N, d, M, N_k=None, batch=1, heads=1, causal=False, mask=False, dropout_p=0.0,
            block_policy="fit", dtype="float16") -> PredictResult:
    """The exact closed-form traffic of ``algorithm``, and the paper's asymptotic form beside it."""
    pb = _count_problem(N, d, N_k, batch, heads, causal=causal, mask=mask, dropout_p=dropout_p, seed=0, dtype=dtype)
    algo, M, Br, Bc = _blocked(algorithm, pb, M, block_policy)
    return PredictResult(algorithm, pb, M, Br, Bc, algo.traffic(pb, Br, Bc, M), algo.paper_form(pb, M),
                         algo.paper_label)
