"""Parsing counts and sizes one way everywhere: ``4096``, ``4Ki``, ``1e5``, ``100k``, ``192KiB``.

A count is a whole number ≥ 1: an int, a float with no fraction (``1024.0``), or a
string with an optional suffix, read exactly (no rounding through a float). Suffixes,
in either case: k, M, G, T multiply by 1000; Ki, Mi, Gi, Ti by 1024. Where bytes are
allowed (the SRAM size M), a trailing B marks bytes, divided by the size of the dtype.
"""

from __future__ import annotations

import re
from decimal import Decimal

import numpy as np

from iosim.core.errors import InputError, InputTypeError

# Bytes per element of each dtype a run may be counted in. The two FP8 formats (OCP's, as FlashAttention-3's FP8
# forward takes e4m3) are counted, never computed in: numeric runs are in float64 at every dtype.
DTYPE_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "float8_e4m3": 1, "float8_e5m2": 1}
FP8_DTYPES = ("float8_e4m3", "float8_e5m2")

_POWERS = {"k": 1, "m": 2, "g": 3, "t": 4}
_PATTERN = re.compile(r"^\s*([+-]?\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)\s*(?:([kKmMgGtT])([iI])?)?\s*([bB])?\s*$")
MAX_COUNT = 2**62  # Python's ranges, over which the tiles are counted, hold at most 2**63 - 1 elements
_RANGE = "[1, 2**62]"
_FORMS = "an integer with an optional suffix k, M, G, T (×1000) or Ki, Mi, Gi, Ti (×1024)"


def parse_count(name: str, value, *, dtype: str | None = None) -> int:
    """``value`` as a whole number ≥ 1, or an InputError naming ``name``.

    With ``dtype`` given, a trailing B (bytes) is allowed and converted to elements.
    """
    if type(value) is int and 1 <= value <= MAX_COUNT:  # the common case, kept cheap: searches build many Tilings
        return value
    if isinstance(value, (bool, np.bool_)):
        raise InputTypeError(f"{name}={value!r} must be a whole number >= 1, such as 4096 or 4Ki")
    if isinstance(value, (int, np.integer)):
        number = Decimal(int(value))
    elif isinstance(value, (float, np.floating)):
        if not np.isfinite(value):
            raise InputError(f"{name}={value!r} is outside the allowed range {_RANGE}")
        number = Decimal(float(value))
    elif isinstance(value, str):
        number = _parse_text(name, value, dtype)
    else:
        raise InputTypeError(f"{name}={value!r} must be a whole number >= 1 or a string such as 4Ki; "
                             f"got {type(value).__name__}")
    if number != number.to_integral_value():
        shown = f"{number.normalize():f}"
        if isinstance(value, str) and _PATTERN.match(value).group(4):  # bytes, in elements of the dtype
            shown = f"{shown} elements of {dtype} ({DTYPE_ITEMSIZE[dtype]} bytes each)"
        raise InputError(f"{name}={value!r} is not a whole number" if shown == str(value).strip() else
                         f"{name}={value!r} is {shown}, not a whole number")
    if not 1 <= number <= MAX_COUNT:
        raise InputError(f"{name}={value!r} is outside the allowed range {_RANGE} (about 4.6e18)")
    return int(number)


def _parse_text(name: str, text: str, dtype: str | None) -> Decimal:
    match = _PATTERN.match(text)
    bytes_allowed = dtype is not None
    if match is None or (match.group(4) and not bytes_allowed):
        unit = ", and a trailing B for bytes, e.g. 100k or 192KiB" if bytes_allowed else ", e.g. 4096 or 4Ki"
        raise InputError(f"{name}={text!r} is not a {'size' if bytes_allowed else 'count'}: use {_FORMS}{unit}")
    digits, prefix, binary, in_bytes = match.groups()
    number = Decimal(digits)
    if prefix:
        number *= (1024 if binary else 1000) ** _POWERS[prefix.lower()]
    if in_bytes:
        number /= DTYPE_ITEMSIZE[check_dtype(dtype)]
    return number


def check_dtype(dtype: str) -> str:
    if not isinstance(dtype, str) or dtype not in DTYPE_ITEMSIZE:
        raise InputError(f"dtype={dtype!r} is not one of {sorted(DTYPE_ITEMSIZE)}")
    return dtype


def parse_bytes(name: str, value) -> int:
    """A byte count ≥ 1 as ``parse_count`` reads a count, with an optional trailing B: 37M, 37MB, 32MiB."""
    if not (isinstance(value, str) and value.strip()[-1:] in ("b", "B") and value.strip()[:-1]):
        return parse_count(name, value)
    try:
        return parse_count(name, value.strip()[:-1])
    except InputError as err:  # named as given, with its B
        raise type(err)(str(err).replace(f"{name}={value.strip()[:-1]!r}", f"{name}={value!r}", 1)) from None


def parse_size(text, dtype: str = "float16") -> int:
    """SRAM capacity M in elements: ``parse_size("192KiB", "float16") == 98304``."""
    return parse_count("M", text, dtype=dtype)
