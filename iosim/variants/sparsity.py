"""Block sparsity (Dao et al. 2022, section 3.3): a block mask M̃ over a run's tiles, and the tiles it visits.

A block mask marks which (query block i, key block j) tiles are nonzero; every element
of a zero tile is masked out (−∞), and block-sparse FlashAttention never computes it.
The mask is defined on the run's own tiles (B_r × B_c): ``BlockSparsity`` either draws
one for whatever tiling the run has, from a pattern and a fraction s of nonzero tiles
(reproducibly, from a seed), or holds an explicit (⌈N_q/B_r⌉, ⌈N_k/B_c⌉) mask, which
must match the tiling. ``reduce_element_mask`` turns an element mask into one.

Patterns, each with exactly n = max(1, round(s·T_r·T_c)) nonzero tiles:

- ``random``: n tiles drawn uniformly without replacement;
- ``local`` (banded, sliding window): the n tiles nearest the diagonal, tile (i, j)
  at distance |(i + ½)/T_r − (j + ½)/T_c|, ties broken by position;
- ``strided``: the diagonals j − i ≡ 0 (mod k), k = round(1/s), nearest first, then the
  tiles nearest them: the strided pattern of sparse transformers.

``SparseVisits`` offers the interface of ``iosim.core.visits.Visits`` over the nonzero
tiles (and, with a causal mask, only those it leaves partly visible), so the algorithms
loop over it unchanged and count-only mode groups it by size the same way.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from iosim.core.errors import InputError, InputTypeError
from iosim.core.rng import check_seed
from iosim.core.tiling import Tiling, ceil_div
from iosim.core.visits import Axis, Blocks, PairCounts, Visits, visits

if TYPE_CHECKING:
    from iosim.core.problem import Problem

PATTERNS = ("random", "local", "strided")
CACHED_TILES = 10**5  # a drawn mask of at most this many tiles is kept (_drawn: at most 256 of them, 25 MB)


def check_sparsity(sparsity) -> float:
    """The fraction of nonzero blocks, a number in (0, 1]."""
    if isinstance(sparsity, (bool, np.bool_)) or not isinstance(sparsity, (int, float, np.integer, np.floating)):
        raise InputTypeError(f"sparsity={sparsity!r} must be a number in (0, 1]")
    if not 0.0 < float(sparsity) <= 1.0:
        raise InputError(f"sparsity={sparsity!r} is outside the allowed range (0, 1]")
    return float(sparsity)


def check_block_sparsity(value) -> BlockSparsity | None:
    """A run's block mask as it enters the API: a ``BlockSparsity`` or None."""
    if value is not None and not isinstance(value, BlockSparsity):
        raise InputTypeError(f"block_sparsity={value!r} must be an iosim.BlockSparsity or None")
    return value


@dataclass(frozen=True)
class BlockSparsity:
    """A block mask: drawn from ``pattern`` with a fraction ``sparsity`` of nonzero tiles, or ``blocks`` itself."""

    sparsity: float = 1.0
    pattern: str = "random"
    seed: int = 0
    blocks: tuple[tuple[bool, ...], ...] | None = None  # an explicit (T_r, T_c) mask, True = nonzero

    def __post_init__(self):
        check_sparsity(self.sparsity)
        if self.pattern not in PATTERNS:
            raise InputError(f"pattern={self.pattern!r} is not one of {list(PATTERNS)}")
        check_seed(self.seed)

    @classmethod
    def from_array(cls, mask) -> BlockSparsity:
        """An explicit block mask: a 2-D boolean array of shape (⌈N_q/B_r⌉, ⌈N_k/B_c⌉)."""
        m = np.asarray(mask)
        if m.dtype != np.bool_:
            raise InputTypeError(f"block mask must be boolean (True = nonzero tile); got dtype {m.dtype}")
        if m.ndim != 2 or 0 in m.shape:
            raise InputError(f"block mask must be a non-empty 2-D array (T_r, T_c); got shape {m.shape}")
        return cls(sparsity=max(float(m.mean()), 1e-300), blocks=tuple(tuple(bool(x) for x in row) for row in m))

    @classmethod
    def from_block_mask(cls, block_mask) -> BlockSparsity:
        """The blocks a FlexAttention block mask (``iosim.block_mask``) leaves, full or partial, as a block mask of
        the block-sparse algorithms, on the same blocks (their tiling must be the mask's). They compute every element
        of such a block: exact where the mask is block-aligned; a partial block's element mask is the explicit
        ``mask=`` of a run (``block_mask.element_mask()``)."""
        kinds = getattr(block_mask, "kinds", None)
        if kinds is None:
            raise InputTypeError(f"block_mask={block_mask!r} must be an iosim.block_mask(...)")
        if kinds.ndim != 2:
            raise InputError(f"block_mask {block_mask.label}: a mask of each batch entry and head; the block-sparse "
                             f"algorithms take one block mask for every head; allowed: a block mask made with B=H=None")
        return cls.from_array(kinds != 0)

    def mask(self, T_r: int, T_c: int) -> np.ndarray:
        """The (T_r, T_c) block mask of a run with that many query and key blocks.

        A small drawn mask is drawn once and shared, read-only, by every tiling with as
        many blocks: the exhaustive search (``iosim.tilings.search``) evaluates thousands of them.
        """
        if self.blocks is None and T_r * T_c <= CACHED_TILES:
            return _drawn(self, T_r, T_c)
        return self._draw(T_r, T_c)

    def _draw(self, T_r: int, T_c: int) -> np.ndarray:
        if self.blocks is not None:
            m = np.array(self.blocks, dtype=bool)
            if m.shape != (T_r, T_c):
                raise InputError(f"block mask of shape {m.shape} does not match the run's tiles: allowed shape "
                                 f"(⌈N_q/B_r⌉, ⌈N_k/B_c⌉) = {(T_r, T_c)}")
            return m
        n = max(1, round(self.sparsity * T_r * T_c))
        i, j = np.divmod(np.arange(T_r * T_c), T_c)
        distance = np.abs((i + 0.5) / T_r - (j + 0.5) / T_c)
        if self.pattern == "random":
            chosen = np.random.default_rng(self.seed).choice(T_r * T_c, size=n, replace=False)
        elif self.pattern == "local":
            chosen = np.argsort(distance, kind="stable")[:n]
        else:
            stride = max(1, round(1 / self.sparsity))
            diagonal = np.rint((i + 0.5) * T_c / T_r - 0.5).astype(int)  # key block on the diagonal of row i
            off = (j - diagonal) % stride
            chosen = np.lexsort((distance, np.minimum(off, stride - off)))[:n]
        out = np.zeros(T_r * T_c, dtype=bool)
        out[chosen] = True
        return out.reshape(T_r, T_c)


@functools.lru_cache(maxsize=256)
def _drawn(spec: BlockSparsity, T_r: int, T_c: int) -> np.ndarray:
    """``spec``'s mask on T_r × T_c tiles, drawn once."""
    mask = spec._draw(T_r, T_c)
    mask.flags.writeable = False
    return mask


def element_mask(spec: BlockSparsity, tiling: Tiling, n_q: int, n_k: int) -> np.ndarray:
    """(N_q, N_k) booleans: the elements of the nonzero tiles of ``spec`` on ``tiling``."""
    blocks = spec.mask(ceil_div(n_q, tiling.Br), ceil_div(n_k, tiling.Bc))
    return np.repeat(np.repeat(blocks, tiling.Br, axis=0), tiling.Bc, axis=1)[:n_q, :n_k]


def reduce_element_mask(mask, tiling: Tiling) -> BlockSparsity:
    """The block mask of a boolean (N_q, N_k) element mask: a tile is nonzero where any element is True."""
    m = np.asarray(mask)
    if m.dtype != np.bool_ or m.ndim != 2:
        raise InputError(f"element mask must be a 2-D boolean array (N_q, N_k); got {m.dtype} of shape {m.shape}")
    T_r, T_c = ceil_div(m.shape[0], tiling.Br), ceil_div(m.shape[1], tiling.Bc)
    padded = np.zeros((T_r * tiling.Br, T_c * tiling.Bc), dtype=bool)
    padded[:m.shape[0], :m.shape[1]] = m
    return BlockSparsity.from_array(padded.reshape(T_r, tiling.Br, T_c, tiling.Bc).any(axis=(1, 3)))


def _runs(indices: np.ndarray) -> tuple[range, ...]:
    """Consecutive runs of sorted indices, as ranges."""
    if indices.size == 0:
        return ()
    breaks = np.flatnonzero(indices[1:] != indices[:-1] + 1)  # a run ends at each break and at the last index
    starts = [int(indices[0])] + indices[breaks + 1].tolist()
    ends = indices[breaks].tolist() + [int(indices[-1])]
    return tuple(range(a, b + 1) for a, b in zip(starts, ends))


class SparseVisits(PairCounts):
    """The tiles a block-sparse run visits: nonzero in the block mask and, when causal, partly visible.

    ``skips_empty_columns``: the outer loop skips a key block whose tiles are all zero
    (``block-sparse-skip``); otherwise it visits every key block (the paper's variant).
    """

    def __init__(self, q: Axis, k: Axis, nonzero: np.ndarray, skips_empty_columns: bool):
        self.q, self.k, self.nonzero, self.skips_empty_columns = q, k, nonzero, skips_empty_columns
        self._pairs = self._count_pairs()
        # the key blocks of the outer loop: those with a visited tile, or all of them
        self._columns = _runs(np.flatnonzero(nonzero.any(axis=0))) if skips_empty_columns else (range(k.T),)

    def queries_seeing(self, j: int) -> Blocks:
        """The query blocks whose tile with key block j is visited."""
        return Blocks(self.q, _runs(np.flatnonzero(self.nonzero[:, j])))

    def keys_seen_by(self, i: int) -> Blocks:
        """The key blocks whose tile with query block i is visited."""
        return Blocks(self.k, _runs(np.flatnonzero(self.nonzero[i])))

    def key_blocks(self) -> Blocks:
        """The key blocks of the outer loop, each nesting the query blocks of its visited tiles."""
        return Blocks(self.k, self._columns, self.queries_seeing, self._transposed_pair_counts)

    def query_blocks(self) -> Blocks:
        """Every query block, each nesting the key blocks of its visited tiles."""
        return Blocks(self.q, (range(self.q.T),), self.keys_seen_by, self._pair_counts)

    def _pair_counts(self) -> dict[tuple[int, int], int]:
        return dict(self._pairs)

    def _count_pairs(self) -> dict[tuple[int, int], int]:
        """Only a ragged last block differs in size: the visited tiles of the last row and column of blocks apart."""
        q, k, nonzero = self.q, self.k, self.nonzero
        ragged_q, ragged_k = q.full < q.T, k.full < k.T
        last_row = int(np.count_nonzero(nonzero[-1])) if ragged_q else 0
        last_col = int(np.count_nonzero(nonzero[:, -1])) if ragged_k else 0
        corner = int(nonzero[-1, -1]) if ragged_q and ragged_k else 0
        b_i, b_j = q.size(q.T - 1), k.size(k.T - 1)  # B_r and B_c unless ragged
        out: dict[tuple[int, int], int] = {}
        for size, n in (((q.B, k.B), int(np.count_nonzero(nonzero)) - last_row - last_col + corner),
                        ((b_i, k.B), last_row - corner), ((q.B, b_j), last_col - corner), ((b_i, b_j), corner)):
            if n:
                out[size] = out.get(size, 0) + n
        return out


MAX_TILES = 10**8  # a block mask is held whole: T_r·T_c booleans


def sparse_visits(pb: Problem, tiling: Tiling, skips_empty_columns: bool) -> SparseVisits | Visits:
    """The tiles of a block-sparse run on ``pb`` with ``tiling``: its block mask's, those its band hides skipped.

    Without a block mask every tile is nonzero: the dense tiles (``iosim.core.visits``), in
    time independent of N. A block mask costs time and memory O(T_r·T_c).
    """
    if pb.block_sparsity is None:
        return visits(pb, tiling, skips_hidden=True)
    q, k = Axis(pb.shape.n_q, tiling.Br), Axis(pb.shape.n_k, tiling.Bc)
    if q.T * k.T > MAX_TILES:
        raise InputError(f"a block mask over T_r × T_c = {q.T} × {k.T} tiles (B_r={tiling.Br}, B_c={tiling.Bc}) "
                         f"is above the {MAX_TILES:.0e} tiles it may hold; allowed: larger blocks (a larger M) or "
                         f"shorter sequences")
    nonzero = pb.block_sparsity.mask(q.T, k.T)
    dense = visits(pb, tiling, skips_hidden=True)
    if dense.band is not None:  # a band (causal, or a window): tile (i, j) is visited when j is in i's run
        runs = [dense.key_run(i) for i in range(q.T)]
        first, stop = np.array([r.start for r in runs]), np.array([r.stop for r in runs])
        j = np.arange(k.T)[None, :]
        nonzero = nonzero & (j >= first[:, None]) & (j < stop[:, None])
    return SparseVisits(q, k, nonzero, skips_empty_columns)
