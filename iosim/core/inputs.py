"""Validation of attention inputs shared by the simulator, the reference and the kernels.

Arrays follow the paper's (batch, heads, N, d) layout: q is (batch, heads, N_q, d), k is
(batch, kv_heads, N_k, d) and v (batch, kv_heads, N_k, d_v), d_v = d unless V's heads are
sized apart (``iosim.core.problem.AttentionShape`` holds the sizes, and the causal rule).
A boolean ``mask`` broadcasts to (batch, heads, N_q, N_k); True means "attend".
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable

import numpy as np

from iosim.core.errors import InputError, InputTypeError
from iosim.core.problem import AttentionShape
from iosim.core.units import MAX_COUNT, parse_count


def check_positive_int(name: str, value) -> int:
    """Return value as an int ≥ 1 (``4096``, ``4096.0`` or ``"4Ki"``), or raise naming the parameter."""
    return parse_count(name, value)


def check_tokens(name: str, value) -> int:
    """A whole number of tokens >= 0: 0, "0", 4096, 4096.0 or "4Ki"."""
    zero = value.strip() == "0" if isinstance(value, str) else (
        isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value == 0)
    if zero:
        return 0
    try:
        return parse_count(name, value)
    except InputError as err:
        if "outside the allowed range" in str(err):  # a whole number, too large
            raise InputError(f"{name}={value!r} is outside the allowed range [0, 2**62] (about 4.6e18)") from None
        raise InputError(f"{name}={value!r} must be a whole number of tokens >= 0, such as 0, 256 or 4Ki") from None


def check_keys_after(prefix: int, rest: int, rest_name: str) -> None:
    """Refuse a cached ``prefix`` whose keys, with the ``rest`` after it, pass the largest count (2**62), naming
    both, where the problem it makes would name only their sum, N_k."""
    if prefix + rest > MAX_COUNT:
        raise InputError(f"prefix={prefix:,} with {rest_name}={rest:,}: their keys, {prefix + rest:,}, pass the "
                         f"allowed 2**62 (about 4.6e18); allowed: prefix + {rest_name} <= 2**62")


def check_flag(name: str, value) -> bool:
    """Return value as a bool, or raise unless it is True or False (``causal='no'`` is not False)."""
    if not isinstance(value, (bool, np.bool_)):
        raise InputTypeError(f"{name}={value!r} must be True or False; got {type(value).__name__}")
    return bool(value)


def check_scale(scale, d: int) -> float:
    """The softmax scale tau: 1/sqrt(d) by default, else any finite non-zero float."""
    if scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise InputTypeError(f"scale={scale!r} must be a real number; got {type(scale).__name__}")
    tau = float(scale)
    if not math.isfinite(tau) or tau == 0.0:
        raise InputError(f"scale={scale!r} must be a finite non-zero number")
    return tau


def check_sinks(sinks, heads: int) -> np.ndarray:
    """Learned attention sinks as float64, one finite logit per query head (gpt-oss): an array of shape (heads,)."""
    if isinstance(sinks, (bool, np.bool_)) or not hasattr(sinks, "__len__") and not isinstance(sinks, np.ndarray):
        raise InputTypeError(f"sinks={sinks!r} must be an array of one logit per query head, shape ({heads},); "
                             f"count and predict take sinks=True or False")
    try:
        arr = np.asarray(sinks)
    except ValueError:  # a ragged nesting
        raise InputError(f"sinks={sinks!r}: one real logit per query head, shape ({heads},)") from None
    if arr.shape != (heads,) or not np.issubdtype(arr.dtype, np.number) or np.iscomplexobj(arr):
        raise InputError(f"sinks of shape {arr.shape} and dtype {arr.dtype}: one real logit per query head, shape "
                         f"({heads},)")
    arr = arr.astype(np.float64)
    if not np.isfinite(arr).all():
        raise InputError(f"sinks hold {int((~np.isfinite(arr)).sum())} non-finite values; allowed: finite logits")
    return arr


def listed_array(name: str, x):
    """``x`` as an array where it is a (nested) list or tuple, refused by name where its rows are ragged; else as
    given."""
    if not isinstance(x, (list, tuple)):
        return x
    try:
        return np.asarray(x)
    except ValueError as err:
        raise InputTypeError(f"{name} is a nested list whose rows differ in length, not an array: {err}") from None


def check_qkv(q, k, v) -> AttentionShape:
    """Check that q, k, v are (batch, heads, N, d) arrays that fit together: q and k of one head size d, v of its
    own, d_v."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not hasattr(x, "shape"):
            raise InputTypeError(f"{name} must be an array (numpy, or with __cuda_array_interface__); "
                                 f"got {type(x).__name__}")
        if getattr(x, "ndim", None) != 4:
            raise InputError(
                f"{name} must have 4 dimensions (batch, heads, N, d); got shape {getattr(x, 'shape', None)}"
            )
        if 0 in x.shape:
            raise InputError(f"{name} has shape {tuple(x.shape)}; every dimension must be >= 1")
    if k.shape[:3] != v.shape[:3]:
        raise InputError(f"k and v must agree in batch, kv_heads and N_k (their head sizes d and d_v may differ); got "
                         f"k {tuple(k.shape)} and v {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] or q.shape[1] % k.shape[1]:
        raise InputError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree in batch and d, and k's heads (kv_heads) "
            f"must divide q's heads"
        )
    b, h, n_q, d = q.shape
    return AttentionShape(int(b), int(h), int(n_q), int(k.shape[2]), int(d), kv_heads=int(k.shape[1]),
                          d_v=int(v.shape[3]))


def check_values(arrays: dict[str, np.ndarray], allow_nonfinite=False) -> None:
    """Host arrays must be real numeric, and finite unless ``allow_nonfinite`` asks to propagate inf and NaN."""
    for name, x in arrays.items():
        if x.dtype.kind not in "biuf":
            raise InputTypeError(f"{name} has dtype {x.dtype}: it must be real numeric (bool, integer or floating); "
                                 f"complex, object and string arrays are refused")
    if check_flag("allow_nonfinite", allow_nonfinite):
        return
    for name, x in arrays.items():
        if x.dtype.kind == "f" and (bad := x.size - int(np.count_nonzero(np.isfinite(x)))):
            raise InputError(f"{name} contains {bad:,} non-finite value{'s' * (bad > 1)} (inf or NaN); pass "
                             f"allow_nonfinite=True to propagate them to the output")


def check_mask(mask, shape: AttentionShape) -> np.ndarray | None:
    """Broadcast a boolean mask to (batch, heads, N_q, N_k) as a read-only view."""
    if mask is None:
        return None
    m = np.asarray(mask)
    if m.dtype != np.bool_:
        raise InputTypeError(f"mask must be boolean (True = attend); got dtype {m.dtype}")
    full = (shape.batch, shape.heads, shape.n_q, shape.n_k)
    try:
        return np.broadcast_to(m, full)
    except ValueError:
        raise InputError(f"mask of shape {m.shape} does not broadcast to (batch, heads, N_q, N_k) = {full}") from None


def check_dout(dout, shape: AttentionShape, name: str = "dout") -> None:
    """dO must have the shape of the output, (batch, heads, N_q, d_v)."""
    want = (shape.batch, shape.heads, shape.n_q, shape.d_v)
    if tuple(getattr(dout, "shape", ())) != want:
        raise InputError(f"{name} must have shape {want} (batch, heads, N_q, d_v), the output's; "
                         f"got {tuple(getattr(dout, 'shape', ()))}")


def name_list(what: str, given, allowed: Collection[str]) -> list[str]:
    """``given`` names as a list, each once in the order given: one name alone is a list of it; anything but names,
    none, or a name not ``allowed`` (each named as ``what`` without its plural s), is refused by name."""
    names = [given] if isinstance(given, str) else given
    if isinstance(names, Iterable):
        names = list(names)
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise InputError(f"{what}={given!r}: give one name or a non-empty list of names")
    for name in names:
        if name not in allowed:
            raise InputError(f"{what.removesuffix('s')}={name!r} is not one of {sorted(allowed)}")
    return list(dict.fromkeys(names))
