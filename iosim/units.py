"""Parsing SRAM sizes such as ``100k``, ``64Ki`` or ``192KiB``."""

from __future__ import annotations

import re

from iosim.errors import InputError, InputTypeError
from iosim.problem import DTYPE_ITEMSIZE, check_dtype

_MULTIPLIERS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(k|M|G|Ki|Mi|Gi)?(B)?\s*$")


def parse_size(text: str | int, dtype: str = "float16") -> int:
    """SRAM capacity in elements from an integer or a string with a suffix.

    k, M, G multiply by 1000; Ki, Mi, Gi by 1024. Both count elements, unless a
    trailing B marks bytes, which are divided by the size of ``dtype``:
    ``parse_size("192KiB", "float16") == 98304``.
    """
    if isinstance(text, bool):
        raise InputTypeError(f"M={text!r} must be an integer or a size such as 100k or 192KiB")
    if isinstance(text, int):
        value = text
    else:
        match = _PATTERN.match(str(text))
        if match is None:
            raise InputError(
                f"M={text!r} is not a size: use an integer with an optional suffix k, M, G (×1000) "
                f"or Ki, Mi, Gi (×1024), and a trailing B for bytes, e.g. 100k or 192KiB"
            )
        number, suffix, in_bytes = match.groups()
        scaled = float(number) * _MULTIPLIERS[suffix or ""]
        if in_bytes:
            scaled /= DTYPE_ITEMSIZE[check_dtype(dtype)]
        if scaled != int(scaled):
            raise InputError(f"M={text!r} is {scaled} elements, not a whole number")
        value = int(scaled)
    if value < 1:
        raise InputError(f"M={text!r} is outside the allowed range [1, inf) elements")
    return value
