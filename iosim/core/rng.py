"""Counter-based dropout: Philox4x32-10 keyed by the seed, indexed by position.

Every dropout decision is a pure function of (seed, batch·head, row, column), so
the mask does not depend on block sizes, loop order or the device: the backward
pass and the GPU kernels regenerate it bit for bit.

Philox4x32-10 is the generator of Salmon et al., "Parallel random numbers: as easy
as 1, 2, 3" (SC'11). The counter is (column, row, batch·head, 0) and the key is
the seed split into two 32-bit words. The first output word r decides: the element
is kept when r >= threshold(p), where threshold(p) = floor(p · 2^32).
"""

from __future__ import annotations

import numpy as np

from iosim.core.errors import InputError, InputTypeError

PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
PHILOX_ROUNDS = 10
MASK32 = 0xFFFFFFFF


def check_dropout_p(dropout_p: float) -> float:
    """Return dropout_p as a float, or raise when it is not a number in [0, 1)."""
    if isinstance(dropout_p, (bool, np.bool_)) or not isinstance(dropout_p, (int, float, np.integer, np.floating)):
        raise InputTypeError(f"dropout_p={dropout_p!r} must be a number in [0, 1); got {type(dropout_p).__name__}")
    p = float(dropout_p)
    if not (0.0 <= p < 1.0):
        raise InputError(f"dropout_p={dropout_p!r} is outside the allowed range [0, 1)")
    return p


def check_seed(seed: int) -> int:
    """Return seed as an int, or raise when it does not fit in 64 unsigned bits."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise InputTypeError(f"seed={seed!r} must be an integer in [0, 2**64)")
    s = int(seed)
    if not (0 <= s < 2**64):
        raise InputError(f"seed={seed!r} is outside the allowed range [0, 2**64)")
    return s


def keep_threshold(dropout_p: float) -> int:
    """The uint32 threshold: an element is kept when its Philox word is >= this."""
    return min(int(check_dropout_p(dropout_p) * 2**32), MASK32)


def philox4x32(counter, key: tuple[int, int]) -> tuple[np.ndarray, ...]:
    """Philox4x32-10 on a counter of four broadcastable uint32 arrays; returns four words.

    Values are held in uint64 so that the 32x32-bit products stay exact.
    """
    c0, c1, c2, c3 = (a.copy() for a in np.broadcast_arrays(*(np.asarray(c, dtype=np.uint64) for c in counter)))
    k0, k1 = key
    m0, m1, mask, shift = np.uint64(PHILOX_M0), np.uint64(PHILOX_M1), np.uint64(MASK32), np.uint64(32)
    for _ in range(PHILOX_ROUNDS):
        p0 = m0 * c0  # < 2^64: both factors are below 2^32
        p1 = m1 * c2
        hi0, lo0 = p0 >> shift, p0 & mask
        hi1, lo1 = p1 >> shift, p1 & mask
        c0, c1, c2, c3 = hi1 ^ c1 ^ np.uint64(k0), lo1, hi0 ^ c3 ^ np.uint64(k1), lo0
        k0 = (k0 + PHILOX_W0) & MASK32
        k1 = (k1 + PHILOX_W1) & MASK32
    return c0, c1, c2, c3


def philox_word(seed: int, bh, row, col) -> np.ndarray:
    """First output word of Philox4x32-10 at counter (col, row, bh, 0), as uint64.

    bh, row and col broadcast against each other; the result has their broadcast
    shape and holds values in [0, 2^32).
    """
    seed = check_seed(seed)
    return philox4x32((col, row, bh, 0), (seed & MASK32, seed >> 32))[0]


def dropout_keep(seed: int, dropout_p: float, bh, row, col) -> np.ndarray:
    """Boolean keep-mask for the elements at (bh, row, col), broadcast together."""
    threshold = keep_threshold(dropout_p)
    if threshold == 0:
        return np.ones(np.broadcast_shapes(np.shape(bh), np.shape(row), np.shape(col)), dtype=bool)
    return philox_word(seed, bh, row, col) >= np.uint64(threshold)


def dropout_tile(seed: int, dropout_p: float, n_bh, rows: slice, cols: slice) -> np.ndarray:
    """The keep-mask of one (rows, cols) tile for all batch·heads: shape (bh, Br, Bc). ``n_bh`` is how many
    batch·heads there are (streams 0 … n_bh − 1), or the stream index of each, in order, as an array."""
    bh = (np.arange(n_bh) if np.ndim(n_bh) == 0 else np.asarray(n_bh))[:, None, None]
    r = np.arange(rows.start, rows.stop)[None, :, None]
    c = np.arange(cols.start, cols.stop)[None, None, :]
    return dropout_keep(seed, dropout_p, bh, r, c)
