"""FlexAttention's score_mod as iosim counts it: ``score_mod(fn, flops=, reads=, grad=, grad_flops=)``.

FlexAttention's ``score_mod(score, b, h, q_idx, kv_idx)`` is applied to each scaled score before the mask. iosim
counts it by what its user declares of it: its elementwise FLOPs per score (``Flops.score``) and the tensors it reads,
one entry per query row and key row of every block visited; a backward pass needs its derivative in the score,
``grad``, with its ``grad_flops``. Named ones: ``softcap`` T (Gemma 2's T·tanh(s/T)) and ``relative_bias`` w
(s − w·|i − j|, ALiBi's with one slope); ``named_score_mod`` reads a command line's ``--score-mod``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from iosim.core.errors import InputError, InputTypeError
from iosim.variants.flex import function_name, import_named


@dataclass(frozen=True, eq=False)
class ScoreMod:
    """FlexAttention's score_mod: ``fn(score, b, h, q_idx, kv_idx)`` on each scaled score, with what it costs; ``grad``,
    its derivative in the score (a function of the same arguments), is what a backward pass needs."""

    name: str
    fn: Callable = field(repr=False)
    flops: int  # elementwise FLOPs per score, as its user counts them
    reads: tuple[str, ...] = ()  # tensors it reads: one float32 entry per query row and key row of a visited block
    grad: Callable | None = field(default=None, repr=False)  # d fn / d score; None: no backward pass
    grad_flops: int = 0  # elementwise FLOPs per score of ``grad``

    def apply(self, S: np.ndarray, rows: slice, cols: slice, b=0, h=0) -> np.ndarray:
        """The function on one tile's scores (heads…, rows, cols) of batch entries ``b`` and heads ``h`` (arrays that
        broadcast against them, ``head_indices``), where a score is finite; −inf (a hidden key) stays."""
        return np.where(np.isneginf(S), -np.inf, self._call(self.fn, S, rows, cols, b, h))

    def derivative(self, S: np.ndarray, rows: slice, cols: slice, b=0, h=0) -> np.ndarray:
        """``grad`` on one tile's scores, as ``apply`` takes them, where a score is finite; 0 where it is −inf."""
        return np.where(np.isneginf(S), 0.0, self._call(self.grad, np.where(np.isneginf(S), 0.0, S), rows, cols, b, h))

    def _call(self, fn: Callable, S: np.ndarray, rows: slice, cols: slice, b, h) -> np.ndarray:
        q_idx, kv_idx = np.arange(rows.start, rows.stop)[:, None], np.arange(cols.start, cols.stop)[None, :]
        try:
            out = np.asarray(fn(S, b, h, q_idx, kv_idx), dtype=np.float64)
        except TypeError as err:
            raise InputTypeError(f"score_mod {self.name} must be a function of (score, b, h, q_idx, kv_idx) on numpy "
                                 f"arrays: {err}") from None
        out = np.broadcast_to(out, S.shape) if out.ndim < S.ndim and fn is self.grad else out
        if out.shape != S.shape:
            raise InputError(f"score_mod {self.name} returned shape {out.shape} for scores of shape {S.shape}")
        return out


def head_indices(pb) -> tuple[np.ndarray, np.ndarray]:
    """The batch entry and the head of each of a run's heads, as (heads, 1, 1) arrays that broadcast against a tile's
    scores: batch-major, or a group's (batch entry, head) pairs of a mask of each head (``FlexBlockMask.heads``)."""
    pairs = getattr(pb.flex, "heads", None)
    if pairs is not None:
        b, h = (np.array(x, dtype=np.int64) for x in zip(*pairs))
    else:
        b, h = np.divmod(np.arange(pb.shape.bh, dtype=np.int64), pb.shape.heads)
    return b[:, None, None], h[:, None, None]


def score_mod(fn: Callable, *, flops: int, reads: Sequence[str] = (), name: str | None = None,
              grad: Callable | None = None, grad_flops: int = 0) -> ScoreMod:
    """A score_mod as iosim counts it: ``flops`` elementwise FLOPs per score (an integer >= 0) and the tensors it
    ``reads``; ``grad``, its derivative in the score, and its ``grad_flops``, for a backward pass (FlexAttention's
    autograd derives it; here its user gives it)."""
    if not callable(fn):
        raise InputTypeError(f"score_mod={fn!r} must be a function of (score, b, h, q_idx, kv_idx)")
    if grad is not None and not callable(grad):
        raise InputTypeError(f"grad={grad!r} must be a function of (score, b, h, q_idx, kv_idx), or None")
    for label, value in (("flops", flops), ("grad_flops", grad_flops)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError(f"{label}={value!r} must be a whole number >= 0 (FLOPs per score)")
    if isinstance(reads, str) or not all(isinstance(r, str) and r.isidentifier() for r in reads):
        raise InputTypeError(f"reads={reads!r} must be a sequence of tensor names (identifiers)")
    return ScoreMod(name or function_name(fn), fn, flops, tuple(reads), grad, grad_flops)


def softcap(T: float) -> ScoreMod:
    """Gemma 2's attention logit softcapping, T·tanh(s/T): a division, a tanh and a product per score; its derivative
    1 − tanh²(s/T), a division, a tanh, a square and a difference."""
    if isinstance(T, bool) or not isinstance(T, (int, float)) or not 0 < T < math.inf:
        raise InputError(f"softcap T={T!r} must be a finite number > 0")
    return score_mod(lambda s, b, h, q, kv: T * np.tanh(s / T), flops=3, name=f"softcap {T:g}",
                     grad=lambda s, b, h, q, kv: 1.0 - np.tanh(s / T) ** 2, grad_flops=4)


def relative_bias(w: float) -> ScoreMod:
    """s − w·|i − j|, ALiBi's bias with one slope: a difference, an absolute value, a product and a sum per score; its
    derivative is 1, no FLOP."""
    if isinstance(w, bool) or not isinstance(w, (int, float)):
        raise InputTypeError(f"relative_bias w={w!r} must be a number")
    if not math.isfinite(w):
        raise InputError(f"relative_bias w={w!r} must be a finite number")
    return score_mod(lambda s, b, h, q, kv: s - w * np.abs(q - kv), flops=4, name=f"relative_bias {w:g}",
                     grad=lambda s, b, h, q, kv: np.ones_like(s), grad_flops=0)


SCORE_MODS = {"softcap": (softcap, "T"), "relative_bias": (relative_bias, "w")}  # name → (factory, its argument)


def named_score_mod(spec: Sequence[str]) -> ScoreMod:
    """The score_mod of a command line's ``--score-mod NAME [ARG]``: a name of ``SCORE_MODS`` and its number, or
    ``module:name``, a ``score_mod(...)`` object there or a function of no arguments that returns one."""
    name, args = spec[0], list(spec[1:])
    if name in SCORE_MODS:
        factory, param = SCORE_MODS[name]
        if len(args) != 1:
            raise InputError(f"--score-mod {name} takes one argument ({param}); got {args}")
        try:
            value = float(args[0])
        except ValueError:
            raise InputError(f"--score-mod {name} {args[0]}: {param} must be a number") from None
        return factory(value)
    if ":" not in name or args:
        raise InputError(f"--score-mod {' '.join(spec)}: allowed: one of {sorted(SCORE_MODS)} with its number, or "
                         f"module:name of an iosim.variants.score_mods.score_mod(...)")
    found = import_named("--score-mod", name)
    if callable(found) and not isinstance(found, ScoreMod) and needs_arguments(found):
        raise InputTypeError(f"--score-mod {name}: {found!r} takes arguments; allowed: an iosim.variants."
                             f"score_mods.score_mod(...), or a function of no arguments that returns one")
    made = found if isinstance(found, ScoreMod) else found() if callable(found) else found
    if not isinstance(made, ScoreMod):
        raise InputTypeError(f"--score-mod {name}: {made!r} is not an iosim.variants.score_mods.score_mod(...), nor a "
                             f"function of no arguments that returns one")
    return made


def needs_arguments(f) -> bool:
    """Whether calling ``f`` with no arguments would lack one it requires (False where its signature is not known)."""
    try:
        return any(p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                   for p in inspect.signature(f).parameters.values())
    except (TypeError, ValueError):
        return False


def check_score_mod(value) -> ScoreMod | None:
    if value is not None and not isinstance(value, ScoreMod):
        raise InputTypeError(f"score_mod={value!r} must be an iosim.variants.score_mods.score_mod(...) or None")
    return value
