"""One attention problem as the algorithms see it: its sizes, its options and its element sizes.

Q has N_q rows and K, V have N_k rows; N_q may differ from N_k (decoding has N_q = 1).
Grouped-query attention: K and V may have fewer heads than Q, ``kv_heads`` dividing
``heads``; query head h reads K/V head h // (heads / kv_heads). MQA is kv_heads = 1.

Which keys a query sees is one concept, the ``Band``: a sliding window (left, right) as
flash-attn's ``window_size`` (−1: unbounded on that side), aligned bottom-right as in
FlashAttention-2 and PyTorch's ``causal_lower_right``: query i sees key j exactly when
i + off − left ≤ j ≤ i + off + right, off = N_k − N_q. Causal masking is the band
(−1, 0): j ≤ i + N_k − N_q. The last query row then sees every key, and with N_q > N_k
the first N_q − N_k query rows see no key at all (fully masked rows, whose output is
defined as 0). A window with ``causal=True`` has its right side clipped to 0, as
flash-attn does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from iosim.core.errors import InputError, InputTypeError
from iosim.core.rng import check_dropout_p, check_seed
from iosim.core.units import DTYPE_ITEMSIZE, FP8_DTYPES, check_dtype, parse_count

# Bytes per element of the tensors an algorithm moves, by element class: "data" is
# the problem's dtype; "stat" (the softmax statistics ℓ and m) is kept in float32 when
# the data is narrower, as FlashAttention's kernels do; "mask" is one byte a boolean; "index" is an int32 (a
# paged KV cache's block table, as vLLM and flash-attn keep it); "out" is what attention returns (O, and split-kv's
# partial outputs): the data's dtype, but bfloat16 for FP8 data, as FlashAttention-3's FP8 forward returns O
# (flash-attn's float32 partial outputs are kept in the data's dtype at every dtype: a deviation, see split_kv).
MASK_ITEMSIZE = 1
STAT_MIN_ITEMSIZE = 4
INDEX_ITEMSIZE = 4
FP8_OUT_ITEMSIZE = 2
ELEMENTS = ("data", "stat", "mask", "index", "out")


class BlockMask(Protocol):
    """What a problem holds of a block mask: ``iosim.variants.sparsity.BlockSparsity``, which defines it on a run's
    tiles (the variant layer reads it; the problem only carries it)."""

    sparsity: float
    pattern: str
    seed: int

    def mask(self, T_r: int, T_c: int) -> np.ndarray: ...


class ScoreModLike(Protocol):
    """What a problem holds of a FlexAttention score_mod: ``iosim.variants.score_mods.ScoreMod``."""

    name: str
    flops: int
    reads: tuple[str, ...]


class FlexMask(Protocol):
    """What a problem holds of a FlexAttention block mask: ``iosim.variants.flex.FlexBlockMask`` (full, partial and
    empty blocks of a mask function; the flex algorithm reads it, the problem only carries it)."""

    name: str
    label: str
    Br: int
    Bc: int
    reads: tuple[str, ...]
    T_r: int
    T_c: int


UNBOUNDED = -1  # a side of a window that hides nothing, as flash-attn's window_size spells it


@dataclass(frozen=True)
class Band:
    """The keys each query sees: query i sees key j exactly when i + off − left ≤ j ≤ i + off + right.

    off = N_k − N_q (bottom-right aligned); a side of −1 (``UNBOUNDED``) has no bound. Full
    attention is (−1, −1), causal (−1, 0), a sliding window of W keys back (W, 0).
    """

    left: int = UNBOUNDED
    right: int = UNBOUNDED

    def __post_init__(self):
        for side in ("left", "right"):
            value = getattr(self, side)
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < UNBOUNDED:
                raise InputError(f"window {side}={value!r} must be an integer >= -1 (-1: unbounded on that side)")
            object.__setattr__(self, side, int(value))

    @property
    def full(self) -> bool:
        """Whether it hides nothing: unbounded on both sides."""
        return self.left == UNBOUNDED and self.right == UNBOUNDED

    @property
    def sliding(self) -> bool:
        """Whether it is a window proper: neither full attention nor causal (−1, 0)."""
        return self.left != UNBOUNDED or self.right not in (UNBOUNDED, 0)

    def keys(self, first_row: int, last_row: int, n_q: int, n_k: int) -> tuple[int, int]:
        """The keys (first, last) that the query rows first_row … last_row see together, clipped to [0, N_k);
        first > last when they see none. Each row sees a run of keys one further on than the row before,
        so together they see one run."""
        off = n_k - n_q
        first = 0 if self.left == UNBOUNDED else max(0, first_row + off - self.left)
        last = n_k - 1 if self.right == UNBOUNDED else min(n_k - 1, last_row + off + self.right)
        return first, last

    def queries(self, first_col: int, last_col: int, n_q: int, n_k: int) -> tuple[int, int]:
        """The query rows (first, last) that see some key of first_col … last_col, clipped to [0, N_q)."""
        return Band(self.right, self.left).keys(first_col, last_col, n_k, n_q)  # c sees r in the mirrored band

    def keep(self, n_q: int, n_k: int, rows: slice, cols: slice) -> np.ndarray:
        """The band of one tile: (rows, cols) booleans, True = attend."""
        i = np.arange(rows.start, rows.stop)[:, None] + (n_k - n_q)
        j = np.arange(cols.start, cols.stop)[None, :]
        keep = np.ones((i.shape[0], j.shape[1]), dtype=bool)
        if self.right != UNBOUNDED:
            keep &= j <= i + self.right
        if self.left != UNBOUNDED:
            keep &= j >= i - self.left
        return keep


CAUSAL = Band(UNBOUNDED, 0)
FULL = Band()


def check_window(window) -> Band | None:
    """A window (left, right) as flash-attn's ``window_size``, or None; -1 is unbounded on that side."""
    if window is None or isinstance(window, Band):
        return window
    if isinstance(window, (str, bytes)) or not hasattr(window, "__len__") or len(window) != 2:
        raise InputTypeError(f"window={window!r} must be a pair (left, right) of integers >= -1, or None")
    return Band(*(_window_side(side, value) for side, value in zip(("left", "right"), window)))


def _window_side(side: str, value):
    """A side of a window as a count is given elsewhere ("4Ki", 128.0, "0"), or -1; an int is left to ``Band``."""
    if not isinstance(value, (str, float, np.floating)):
        return value
    text = value.strip() if isinstance(value, str) else None
    if text in ("-1", "0") or value in (-1.0, 0.0):
        return int(float(value))
    try:
        return parse_count(f"window {side}", value)
    except InputError:
        raise InputError(f"window {side}={value!r} must be a whole number of keys >= -1 (-1: unbounded on that "
                         f"side), such as 128 or 4Ki") from None


def band_of(causal: bool, window: Band | None) -> Band:
    """The band of a problem: its window, or full; causal clips the right side to 0, as flash-attn does."""
    band = FULL if window is None else window
    return Band(band.left, 0) if causal else band


def causal_keep(n_q: int, n_k: int, rows: slice, cols: slice) -> np.ndarray:
    """Bottom-right aligned causal mask of one tile: (Br, Bc) booleans, True = attend."""
    return CAUSAL.keep(n_q, n_k, rows, cols)


@dataclass(frozen=True)
class AttentionShape:
    """The sizes of one attention problem; each must be an integer >= 1.

    ``kv_heads`` (default: ``heads``) is how many K/V heads the query heads share, a
    divisor of ``heads``: query head h reads K/V head h // group. ``d`` is the head size of Q and K (d_qk) and
    ``d_v`` (default: ``d``) that of V and of what attention returns, O (MLA's heads, DeepSeek's d_qk = 192 and
    d_v = 128, differ).
    """

    batch: int
    heads: int
    n_q: int
    n_k: int
    d: int
    kv_heads: int | None = None
    d_v: int | None = None

    def __post_init__(self):
        for name in ("batch", "heads", "n_q", "n_k", "d"):
            parse_count(name, getattr(self, name))
        for name, default in (("kv_heads", self.heads), ("d_v", self.d)):
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)
            parse_count(name, getattr(self, name))
        if self.heads % self.kv_heads:
            divisors = [g for g in range(1, self.heads + 1) if self.heads % g == 0]
            raise InputError(f"kv_heads={self.kv_heads} must divide heads={self.heads}; allowed: {divisors}")

    @property
    def bh(self) -> int:
        return self.batch * self.heads

    @property
    def group(self) -> int:
        """Query heads per K/V head: 1 for multi-head attention, ``heads`` for MQA."""
        return self.heads // self.kv_heads

    @property
    def bkv(self) -> int:
        """batch · kv_heads: how many K/V heads there are."""
        return self.batch * self.kv_heads

    def kv_head(self, bh: int) -> int:
        """The K/V head (of the batch·kv_heads) that batch·head ``bh`` reads: its query head h reads h // group."""
        return (bh // self.heads) * self.kv_heads + (bh % self.heads) // self.group


@dataclass(frozen=True)
class Problem:
    """Sizes and options of one run, checked when built. ``has_mask``: a boolean mask is read from HBM."""

    shape: AttentionShape
    tau: float
    causal: bool = False
    has_mask: bool = False
    dropout_p: float = 0.0
    seed: int = 0
    dtype: str = "float16"
    # the block mask of an algorithm that takes one (checked where it enters the API); others ignore it
    block_sparsity: BlockMask | None = None
    # the sliding window (``Band``) as the caller gave it, None without one; ``band`` combines it with causal
    window: Band | None = None
    # query heads packed into the query rows (``packed()``): 1, or the GQA group of an algorithm that serves
    # a whole group from one K/V load; row r is then query r mod N_q/packed of the group's head r // (N_q/packed)
    packed: int = 1
    # K and V in a paged cache of pages of this many tokens, found through a block table (iosim.variants.paging);
    # None: one contiguous K/V per head. Checked where it enters the API; algorithms that do not read pages refuse it
    page_size: int | None = None
    # documents packed end to end, each attending only to itself (iosim.variants.varlen): their lengths, the shape
    # then the longest's (batch 1, N_q = N_k = the longest); None: one sequence per batch entry. Checked by
    # iosim.variants.varlen
    seqlens: tuple[int, ...] | None = None
    # one length's documents of a varlen problem (iosim.variants.varlen.documents): the place of each batch entry among
    # all the documents, whose dropout stream it draws (``dropout_streams``); None: batch entry b is stream b
    batch_ids: tuple[int, ...] | None = None
    # learned attention sinks (gpt-oss): one logit per query head, a column of the softmax with no value, so it adds
    # exp(sink − m) to each row's denominator; read from HBM by the algorithms that take it (Needs.sinks)
    sinks: bool = False
    # multi-head latent attention's cache with the projections absorbed (DeepSeek-V2/V3, FlashMLA): K is one latent
    # (and RoPE key) per token, shared by every query head, and V is its first d_v columns; no V tensor is read, an
    # algorithm that takes it (Needs.latent) uses the columns of K_j already on chip
    latent: bool = False
    # a FlexAttention block mask (iosim.block_mask) of the problem's N_q and N_k, which the algorithms that take one
    # (Needs.flex) run over; checked where it enters the API
    flex: FlexMask | None = None
    # a FlexAttention score_mod (iosim.variants.score_mods.ScoreMod) that flex applies to every score it computes
    score_mod: ScoreModLike | None = None

    def __post_init__(self):
        if not isinstance(self.shape, AttentionShape):
            raise InputTypeError(f"shape={self.shape!r} must be an AttentionShape")
        if isinstance(self.tau, bool) or not isinstance(self.tau, (int, float)) or not math.isfinite(self.tau) \
                or self.tau == 0:
            raise InputError(f"tau={self.tau!r} must be a finite non-zero number")
        for name in ("causal", "has_mask", "sinks", "latent"):
            if not isinstance(getattr(self, name), bool):
                raise InputTypeError(f"{name}={getattr(self, name)!r} must be True or False")
        if self.window is not None and not isinstance(self.window, Band):
            raise InputTypeError(f"window={self.window!r} must be an iosim.Band or None")
        if self.seqlens is not None and (self.shape.batch != 1 or not self.shape.n_q == self.shape.n_k
                                         == max(self.seqlens)):
            raise ValueError(f"a problem with seqlens is shaped as its longest document, batch 1: {self.shape}")
        if self.batch_ids is not None and len(self.batch_ids) != self.shape.batch:
            raise ValueError(f"batch_ids {self.batch_ids} must name each of the {self.shape.batch} batch entries")
        if self.latent and self.shape.d_v > self.shape.d:
            raise InputError(f"latent with d_v={self.shape.d_v} > d={self.shape.d}: V is the first d_v columns of the "
                             f"latent K; allowed: d_v <= d")
        check_dropout_p(self.dropout_p)
        check_seed(self.seed)
        check_dtype(self.dtype)

    def packed_by_group(self) -> Problem:
        """The problem as an algorithm that serves each GQA group from one K/V load sees it.

        The group's G = heads/kv_heads query heads become G·N_q query rows of one K/V head
        (Flash-Decoding's packing): batch·kv_heads heads run in lockstep and Q, O (and a mask)
        are the same HBM bytes reshaped, (batch, kv_heads, G·N_q, ·).
        """
        s = self.shape
        if self.packed != 1:
            raise ValueError("the problem is packed already")
        shape = replace(s, heads=s.kv_heads, n_q=s.group * s.n_q)
        return replace(self, shape=shape, packed=s.group)

    @property
    def band(self) -> Band:
        """The keys each query sees: the window, clipped to causal when causal; full attention without either."""
        return band_of(self.causal, self.window)

    @property
    def fp8(self) -> bool:
        """FP8 data (``FP8_DTYPES``): Q, K, V of one byte an element with their float32 descales (FlashAttention-3's
        FP8 forward), O returned in bfloat16."""
        return self.dtype in FP8_DTYPES

    @property
    def hides_keys(self) -> bool:
        """Whether a band or an explicit mask hides some scores: what an algorithm that masks S must apply."""
        return not self.band.full or self.has_mask

    def dropout_streams(self) -> np.ndarray:
        """The Philox batch·head index of each query head of the run, in order (iosim.core.rng): 0 … batch·heads − 1 of
        the caller's heads (a GQA group's heads in its packed rows), and for one length's documents of a varlen
        problem, document b's heads at b·heads + h, as flash-attn's varlen kernels index it: the mask of a
        document does not depend on which documents share its length."""
        heads = self.shape.heads * self.packed
        ids = np.arange(self.shape.batch) if self.batch_ids is None else np.asarray(self.batch_ids)
        return (ids[:, None] * heads + np.arange(heads)[None, :]).ravel()

    @property
    def queries(self) -> int:
        """N_q of one head before packing."""
        return self.shape.n_q // self.packed

    def dim(self, name: str) -> int:
        """A size by the name tensors use for it: N_q, N_k, d (of Q and K), d_v (of V and O), 1, the pages of a paged
        K/V cache, the query heads packed into one head's rows (``packed``: 1, or a GQA group), QKV (3: one FP8
        descale each for Q, K and V), N (max(N_q, N_k)), or a FlexAttention block mask's T_r and T_c."""
        if name == "pages":
            return -(-self.shape.n_k // self.page_size) if self.page_size else 1
        s = self.shape
        if name in ("T_r", "T_c"):  # a FlexAttention block mask's query and key blocks
            return getattr(self.flex, name)
        return {"N_q": s.n_q, "N_k": s.n_k, "d": s.d, "d_v": s.d_v, "1": 1, "packed": self.packed, "QKV": 3,
                "N": max(s.n_q, s.n_k)}[name]

    def record(self) -> dict:
        """The problem as the records of every command carry it: sizes, options and dtype, None for an option not
        set (``kv_heads`` None when equal to ``heads``, ``d_v`` when equal to ``d``; ``seqlens`` space-separated)."""
        s, w = self.shape, self.window
        return {"N": s.n_q, "N_k": s.n_k, "d": s.d, "d_v": None if s.d_v == s.d else s.d_v, "batch": s.batch,
                "heads": s.heads, "kv_heads": None if s.kv_heads == s.heads else s.kv_heads, "causal": self.causal,
                "mask": self.has_mask, "dropout_p": self.dropout_p, "dtype": self.dtype,
                "window_left": getattr(w, "left", None), "window_right": getattr(w, "right", None),
                "page_size": self.page_size,
                "seqlens": None if self.seqlens is None else " ".join(map(str, self.seqlens)), "sinks": self.sinks,
                "latent": self.latent, "flex_mask": None if self.flex is None else self.flex.label,
                "score_mod": getattr(self.score_mod, "name", None)}

    def itemsize(self, element: str = "data") -> int:
        """Bytes per element of the element class ``element`` (one of ELEMENTS)."""
        if element == "mask":
            return MASK_ITEMSIZE
        if element == "index":
            return INDEX_ITEMSIZE
        if element == "out" and self.fp8:
            return FP8_OUT_ITEMSIZE
        data = DTYPE_ITEMSIZE[self.dtype]
        return max(STAT_MIN_ITEMSIZE, data) if element == "stat" else data
