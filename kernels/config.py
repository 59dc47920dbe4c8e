"""Launch-time settings shared by the kernels: tile sizes and the dropout generator's key.

Both are frozen dataclasses built and checked on the host before any launch, so a bad
value raises here, naming the parameter and its allowed range, instead of failing inside
a kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from iosim.core.rng import MASK32, check_dropout_p, check_seed, keep_threshold

# Statically allocated shared memory per thread block (cuda.shared.array). Kernels that
# need more must use dynamic shared memory and an opt-in attribute, which these do not.
STATIC_SHARED_LIMIT = 48 * 1024
MAX_THREADS_PER_BLOCK = 1024
FLOAT32_BYTES = 4


@dataclass(frozen=True)
class TileConfig:
    """Tile sizes of the fused kernels (flash, flash-swapped).

    A thread block covers a Br × Bc score tile (Bc × Br in the backward pass, where the
    rows are keys) with (rows/TM)·(cols/TN) threads; each thread owns a TM × TN
    micro-tile of scores and a TM × ceil(d/TC) slice of the d-wide accumulators.
    """

    Br: int  # query rows per tile (the paper's B_r)
    Bc: int  # key rows per tile (the paper's B_c)
    TM: int  # tile rows per thread
    TN: int  # tile columns per thread

    def tile_rows_cols(self, backward: bool) -> tuple[int, int]:
        """(rows, cols) of the thread grid's tile: (Br, Bc) forward, (Bc, Br) backward."""
        return (self.Bc, self.Br) if backward else (self.Br, self.Bc)

    def threads_per_row(self, backward: bool = False) -> int:
        """TC: the threads that share one tile row."""
        return self.tile_rows_cols(backward)[1] // self.TN

    def threads(self, backward: bool = False) -> int:
        rows, cols = self.tile_rows_cols(backward)
        return (rows // self.TM) * (cols // self.TN)

    def acc_cols(self, d: int, backward: bool = False) -> int:
        """FD = ceil(d / TC): accumulator columns per thread."""
        return -(-d // self.threads_per_row(backward))

    def row_width(self, d: int, backward: bool = False) -> int:
        """Width of a d-wide shared tile: d + 1 (odd stride, no bank conflicts), at least TC·FD."""
        tc = self.threads_per_row(backward)
        return max(d + 1, tc * self.acc_cols(d, backward))

    def check(self, d: int, backward: bool, shared_bytes: int) -> None:
        """Raise ValueError naming `config` (or `d`) when this tiling cannot run for head dim d."""
        for name in ("Br", "Bc", "TM", "TN"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"config.{name}={value!r} must be an integer >= 1")
        rows, cols = self.tile_rows_cols(backward)
        if rows % self.TM:
            raise ValueError(f"config.TM={self.TM} must divide the tile's {rows} rows")
        if cols % self.TN:
            raise ValueError(f"config.TN={self.TN} must divide the tile's {cols} columns")
        if backward and self.Br != self.Bc:
            raise ValueError(f"backward kernels need config.Br == config.Bc; got Br={self.Br}, Bc={self.Bc}")
        n = self.threads(backward)
        if n > MAX_THREADS_PER_BLOCK:
            raise ValueError(f"config {self} gives {n} threads per block; allowed range [1, {MAX_THREADS_PER_BLOCK}]")
        if shared_bytes > STATIC_SHARED_LIMIT:
            raise ValueError(
                f"d={d} with config {self} needs {shared_bytes} bytes of shared memory; "
                f"allowed range [0, {STATIC_SHARED_LIMIT}] (use a smaller d or smaller tiles)"
            )


@dataclass(frozen=True)
class Dropout:
    """Host-side dropout parameters in the form the kernels take them.

    The key is the 64-bit seed split into two 32-bit words (iosim.core.rng); an element is
    kept when its Philox word is >= threshold, and kept values are scaled by inv_keep.
    """

    p: float
    seed: int

    @classmethod
    def checked(cls, dropout_p, seed) -> Dropout:
        return cls(check_dropout_p(dropout_p), check_seed(seed))

    @property
    def enabled(self) -> bool:
        return keep_threshold(self.p) > 0

    def kernel_args(self) -> tuple:
        """(seed_lo, seed_hi, threshold, inv_keep) typed as the kernels expect them."""
        return (
            np.uint64(self.seed & MASK32),
            np.uint64(self.seed >> 32),
            np.uint64(keep_threshold(self.p)),
            np.float32(1.0 / (1.0 - self.p)),
        )
