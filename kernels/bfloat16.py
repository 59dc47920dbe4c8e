"""bfloat16 on the host: numpy has no bfloat16 dtype, so the kernels hold it as uint16 bit patterns.

A bfloat16 is the top 16 bits of a float32 (sign, 8 exponent bits, 7 mantissa bits), so
widening is exact: shift the 16 bits up. Narrowing rounds to nearest, ties to even, as
PTX's cvt.rn.bf16x2.f32 does: values past the largest bfloat16 become ±inf, ±inf stay,
and a NaN stays a NaN (its top 16 bits with the quiet bit set, so a payload held only in
the low bits cannot turn it into an infinity).

    bits = to_bfloat16(x)          # float32 array -> uint16 array
    x16 = from_bfloat16(bits)      # uint16 array -> float32 array, exact
"""

from __future__ import annotations

import numpy as np

BITS = np.dtype(np.uint16)  # how a bfloat16 array is stored
QUIET_BIT = 0x0040  # the top mantissa bit of a bfloat16


def to_bfloat16(x) -> np.ndarray:
    """The uint16 bfloat16 bit patterns of float32 `x`, rounded to nearest, ties to even."""
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"x has dtype {x.dtype}; to_bfloat16 takes float32 (round other types to float32 first)")
    bits = np.ascontiguousarray(x).view(np.uint32).astype(np.uint64)
    lsb = (bits >> 16) & 1  # the last kept bit: a tie rounds up only when it is 1
    rounded = (bits + 0x7FFF + lsb) >> 16
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (bits >> 16) | QUIET_BIT, rounded).astype(BITS)


def from_bfloat16(bits) -> np.ndarray:
    """float32 values of uint16 bfloat16 bit patterns (exact)."""
    bits = np.asarray(bits)
    if bits.dtype != BITS:
        raise TypeError(f"bits has dtype {bits.dtype}; from_bfloat16 takes uint16 bfloat16 bit patterns")
    return (bits.astype(np.uint32) << 16).view(np.float32)
