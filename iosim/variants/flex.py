"""FlexAttention's block masks: a mask function of (batch, head, query index, key index) made into full, partial
and empty blocks, as ``torch.nn.attention.flex_attention.create_block_mask`` makes them.

``block_mask(mask_mod, N_q, N_k, block=(128, 128))`` evaluates ``mask_mod(b, h, q_idx, kv_idx)`` (True = attend) on
every (query, key) pair, a block row at a time, with numpy arrays of indices broadcast against each other, and sorts
each B_r × B_c block: **full** (every pair attends: the kernel applies no mask), **partial** (some do: the kernel
evaluates the mask function on it) or **empty** (none: the kernel never visits it). As torch pads the mask with
False to whole blocks, a ragged last block (or a block longer than the sequence) is never full. Without ``B`` and
``H`` (FlexAttention's ``B=None, H=None``) the mask is one for every batch entry and head: it is evaluated at
b = h = 0. With them (``block_mask(..., B=2, H=8)``, either may stay None) it is evaluated for every batch entry
and head, as torch's ``create_block_mask(mask_mod, B, H, ...)`` does: ``kinds`` is then (B, H, T_r, T_c) (1 for a
None), and a run splits its heads into groups of equal blocks (``groups``), each run as a problem of its own heads,
as packed documents are run by length.

The kernel reads the block mask's index tensors from HBM (``iosim.algorithms.algorithm.FLEX_INDICES``, int32): for
each query block the number of partial and of full key blocks, and one index per key block it visits. A mask
function that reads a tensor (a document id per token, say) declares it in ``reads``: on a partial block the kernel
reads its entry for each query row and each key row of the block, from a tensor of max(N_q, N_k) int32 entries.

A ``score_mod`` beside a block mask is ``iosim.variants.score_mods``' to make.

Named masks (``MASKS``), each aligned as iosim's bands are (bottom-right: query i of N_q stands at position i + N_k −
N_q among the keys): ``causal``; ``window`` W (a query sees itself and the W − 1 keys before it, Hugging Face's
sliding window); ``document`` (packed documents of the given lengths, each causal within itself); ``prefix_lm`` P
(every query sees the first P keys, and causally beyond them); ``sinks_window`` K W (StreamingLLM: the first K keys
beside a window of W).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from iosim.core.errors import InputError, InputTypeError
from iosim.core.tiling import Tiling, ceil_div
from iosim.core.units import parse_count
from iosim.core.visits import Axis, Blocks
from iosim.variants.sparsity import SparseVisits

EMPTY, PARTIAL, FULL = 0, 1, 2
MAX_PAIRS = 2 * 10**9  # (query, key) pairs a block mask evaluates: about a minute of numpy on one core
ROWS_AT_ONCE = 2**22  # pairs evaluated at once: a block row of queries against every key, a few MB


@dataclass(frozen=True, eq=False)
class FlexBlockMask:
    """A mask function's blocks: ``kinds`` (T_r, T_c) of EMPTY, PARTIAL or FULL over blocks of Br × Bc; a mask of
    each batch entry and head, (B, H, T_r, T_c). ``heads``: the (batch entry, head) pairs a group of a per-head
    mask (``groups``) stands for, in the order a run of the group holds them; None for a mask of every head."""

    name: str  # what records and tables call it: a named mask with its sizes, or the function's module:name
    n_q: int
    n_k: int
    Br: int
    Bc: int
    kinds: np.ndarray = field(repr=False)
    mask_mod: Callable = field(repr=False)
    # tensors the mask function reads, each of max(N_q, N_k) int32 entries read for every query row and key row of
    # a partial block
    reads: tuple[str, ...] = ()
    heads: tuple[tuple[int, int], ...] | None = None
    # the (batch entry, head) the mask function is evaluated at for each pair of ``heads``: 0 along a B or H made None
    evaluated_at: tuple[tuple[int, int], ...] | None = None

    @property
    def T_r(self) -> int:
        return self.kinds.shape[-2]

    @property
    def T_c(self) -> int:
        return self.kinds.shape[-1]

    @property
    def per_head(self) -> bool:
        """Whether it holds a mask of each batch entry and head, (B, H, T_r, T_c)."""
        return self.kinds.ndim == 4

    @property
    def label(self) -> str:
        """The name with the blocks: what records and titles carry, so that two masks of one name stay apart."""
        each = f", each of {self.kinds.shape[0]}×{self.kinds.shape[1]} (batch, head)" if self.per_head else ""
        return f"{self.name}, blocks {self.Br}x{self.Bc}{each}"

    def groups(self, batch: int, heads: int) -> tuple[FlexBlockMask, ...]:
        """A per-head mask on ``batch`` × ``heads`` as groups of the (batch entry, head) pairs whose blocks are equal,
        in the order their first pair comes: each a mask of (T_r, T_c) with its pairs in ``heads`` (a B or H of 1
        stands for every batch entry or head); ``(self,)`` for a mask of every head."""
        if not self.per_head:
            return (self,)
        found: dict[bytes, list[tuple[tuple[int, int], tuple[int, int]]]] = {}
        kinds: dict[bytes, np.ndarray] = {}
        B, H = self.kinds.shape[:2]
        for b in range(batch):
            for h in range(heads):
                at = (b if B > 1 else 0, h if H > 1 else 0)
                tile = self.kinds[at]
                key = tile.tobytes()
                found.setdefault(key, []).append(((b, h), at))
                kinds.setdefault(key, tile)
        return tuple(FlexBlockMask(self.name, self.n_q, self.n_k, self.Br, self.Bc, kinds[key], self.mask_mod,
                                   self.reads, tuple(p for p, _ in pairs), tuple(a for _, a in pairs))
                     for key, pairs in found.items())

    def counts(self) -> dict[str, int]:
        """How many blocks are full, partial and empty."""
        return {name: int(np.count_nonzero(self.kinds == kind))
                for name, kind in (("full", FULL), ("partial", PARTIAL), ("empty", EMPTY))}

    def keep(self, rows: slice, cols: slice) -> np.ndarray:
        """The mask function on one tile: (rows, cols) booleans, True = attend; for a group of a per-head mask,
        (its pairs, rows, cols), each pair's own (at 0 along a B or H made None, as its blocks were made)."""
        q_idx, kv_idx = np.arange(rows.start, rows.stop), np.arange(cols.start, cols.stop)
        if self.heads is None:
            return evaluate(self.mask_mod, q_idx, kv_idx)
        return np.stack([evaluate(self.mask_mod, q_idx, kv_idx, b, h) for b, h in self.evaluated_at])

    def element_mask(self) -> np.ndarray:
        """The whole (N_q, N_k) mask, for a reference to compare with (small problems); of a per-head mask,
        (B, H, N_q, N_k)."""
        if not self.per_head:
            return self.keep(slice(0, self.n_q), slice(0, self.n_k))
        B, H = self.kinds.shape[:2]
        q_idx, kv_idx = np.arange(self.n_q), np.arange(self.n_k)
        return np.stack([np.stack([evaluate(self.mask_mod, q_idx, kv_idx, b, h) for h in range(H)])
                         for b in range(B)])


class FlexVisits:
    """The tiles a run over a block mask visits, in FlexAttention's two orders: every query block nesting its
    partial key blocks and then its full ones (the forward, and the backward's dQ), and every key block nesting its
    partial query blocks and then its full ones (the backward's dK, dV, over the transposed mask), each loop with its
    own pair counts (``SparseVisits`` over each kind)."""

    def __init__(self, kinds: np.ndarray, n_q: int, n_k: int, tiling: Tiling):
        self.q, self.k = Axis(n_q, tiling.Br), Axis(n_k, tiling.Bc)
        self.partial = SparseVisits(self.q, self.k, kinds == PARTIAL, skips_empty_columns=True)
        self.full = SparseVisits(self.q, self.k, kinds == FULL, skips_empty_columns=True)
        self.partial_t = SparseVisits(self.k, self.q, (kinds == PARTIAL).T, skips_empty_columns=True)
        self.full_t = SparseVisits(self.k, self.q, (kinds == FULL).T, skips_empty_columns=True)
        self.kinds = kinds

    def query_blocks(self) -> Blocks:
        """Every query block, nesting its partial key blocks, then its full ones."""
        return Blocks(self.q, (range(self.q.T),), self.partial.keys_seen_by, self.partial._pair_counts,
                      ((self.full.keys_seen_by, self.full._pair_counts),))

    def key_blocks(self) -> Blocks:
        """Every key block, nesting the query blocks of its partial tiles, then of its full ones."""
        return Blocks(self.k, (range(self.k.T),), self.partial_t.keys_seen_by, self.partial_t._pair_counts,
                      ((self.full_t.keys_seen_by, self.full_t._pair_counts),))

    def visited(self) -> SparseVisits:
        """Every tile visited, partial or full."""
        return SparseVisits(self.q, self.k, self.kinds != EMPTY, skips_empty_columns=True)


def head_groups(pb) -> tuple:
    """A problem with a per-head block mask as one problem per group of its (batch entry, head) pairs of equal blocks
    (``FlexBlockMask.groups``): one batch entry of the group's heads, each with its own copy of its K/V head (flex
    reads K and V for every query head, grouped or not, so the counts are the same), and the group's mask."""
    return tuple(replace(pb, shape=replace(pb.shape, batch=1, heads=len(g.heads), kv_heads=len(g.heads)), flex=g)
                 for g in pb.flex.groups(pb.shape.batch, pb.shape.heads))


KV_INPUTS = ("K", "V")  # inputs with one head per K/V head


def gather_heads(data: dict[str, np.ndarray], pb, part) -> dict[str, np.ndarray]:
    """The inputs of a group of heads (``head_groups``) of ``pb``: every (batch, heads, rows, cols) array cut to the
    group's (batch entry, head) pairs, (1, pairs, rows, cols), K and V at each head's K/V head."""
    b, h = (np.array(x) for x in zip(*part.flex.heads))
    group = pb.shape.heads // pb.shape.kv_heads
    return {name: np.ascontiguousarray(x[b, h // group if name in KV_INPUTS else h][None]) for name, x in data.items()}


def scatter_heads(pb, parts: list[tuple[object, np.ndarray]], cols: int) -> np.ndarray:
    """Outputs of every group of heads, each (pairs, rows, cols) as a memory holds it (rows N_q for O and dQ, N_k for dK
    and dV), put back at their (batch entry, head), (batch, heads, rows, cols)."""
    first, x0 = parts[0]
    rows = x0.size // (len(first.flex.heads) * cols)
    out = np.empty((pb.shape.batch, pb.shape.heads, rows, cols), dtype=x0.dtype)
    for part, x in parts:
        b, h = (np.array(y) for y in zip(*part.flex.heads))
        out[b, h] = x.reshape(len(part.flex.heads), rows, cols)
    return out


def flex_visits(pb, tiling: Tiling) -> FlexVisits:
    """The tiles a run on ``pb`` (``Problem.flex`` set) visits."""
    return FlexVisits(pb.flex.kinds, pb.shape.n_q, pb.shape.n_k, tiling)


def evaluate(mask_mod: Callable, q_idx: np.ndarray, kv_idx: np.ndarray, b: int = 0, h: int = 0) -> np.ndarray:
    """``mask_mod`` of batch entry ``b`` and head ``h`` on every pair of ``q_idx`` × ``kv_idx``: (len(q_idx),
    len(kv_idx)) booleans."""
    try:
        out = np.asarray(mask_mod(np.int64(b), np.int64(h), q_idx[:, None], kv_idx[None, :]))
    except TypeError as err:  # a user's function that does not take (b, h, q_idx, kv_idx) as numpy arrays
        raise InputTypeError(f"mask_mod {function_name(mask_mod)} must be a function of (b, h, q_idx, kv_idx) on numpy "
                             f"index arrays: {err}") from None
    if out.dtype != np.bool_:
        raise InputTypeError(f"mask_mod returned {out.dtype}: it must return booleans (True = attend)")
    try:
        return np.broadcast_to(out, (q_idx.size, kv_idx.size))
    except ValueError:
        raise InputError(f"mask_mod returned shape {out.shape}, which does not broadcast to the pairs "
                         f"({q_idx.size}, {kv_idx.size}) of its q_idx and kv_idx") from None


def block_mask(mask_mod: Callable, N_q, N_k=None, *, block=(128, 128), name: str | None = None,
               reads: Sequence[str] = (), B=None, H=None) -> FlexBlockMask:
    """The block mask of ``mask_mod`` over N_q queries and N_k keys (default N_q) in blocks ``block`` = (B_r, B_c).

    ``reads`` names the tensors the mask function reads (one entry per query row and key row of a partial block, an
    int32 each), which the kernel reads from HBM. ``B`` and ``H``, as torch's ``create_block_mask`` takes them: the
    mask is evaluated for every batch entry b < B and head h < H (None: once, at 0, for all), and ``kinds`` is
    (B, H, T_r, T_c) when either is given.
    """
    if not callable(mask_mod):
        raise InputTypeError(f"mask_mod={mask_mod!r} must be a function of (b, h, q_idx, kv_idx)")
    n_q = parse_count("N_q", N_q)
    n_k = n_q if N_k is None else parse_count("N_k", N_k)
    if isinstance(block, (str, bytes)) or not hasattr(block, "__len__") or len(block) != 2:
        raise InputTypeError(f"block={block!r} must be a pair (B_r, B_c) of whole numbers >= 1")
    Br, Bc = parse_count("block B_r", block[0]), parse_count("block B_c", block[1])
    per_head = B is not None or H is not None
    nb = 1 if B is None else parse_count("B", B)
    nh = 1 if H is None else parse_count("H", H)
    if nb * nh * n_q * n_k > MAX_PAIRS:
        raise InputError(f"a block mask over B·H × N_q × N_k = {nb * nh:,} × {n_q:,} × {n_k:,} pairs evaluates more "
                         f"than {MAX_PAIRS:.0e} of them; allowed: B·H·N_q·N_k <= {MAX_PAIRS:.0e}")
    if isinstance(reads, str) or not all(isinstance(r, str) and r.isidentifier() for r in reads):
        raise InputTypeError(f"reads={reads!r} must be a sequence of tensor names (identifiers)")
    kinds = np.stack([np.stack([_kinds(mask_mod, n_q, n_k, Br, Bc, b, h) for h in range(nh)]) for b in range(nb)])
    return FlexBlockMask(name or function_name(mask_mod), n_q, n_k, Br, Bc, kinds if per_head else kinds[0, 0],
                         mask_mod, tuple(reads))


def _kinds(mask_mod: Callable, n_q: int, n_k: int, Br: int, Bc: int, b: int, h: int) -> np.ndarray:
    """(T_r, T_c) of EMPTY, PARTIAL, FULL: ``mask_mod`` of (b, h) evaluated a few block rows at a time."""
    T_r, T_c = ceil_div(n_q, Br), ceil_div(n_k, Bc)
    kinds = np.empty((T_r, T_c), dtype=np.int8)
    kv_idx = np.arange(n_k)
    rows_per_step = max(1, ROWS_AT_ONCE // max(1, n_k * Br)) * Br  # whole block rows at a time
    for start in range(0, n_q, rows_per_step):
        stop = min(n_q, start + rows_per_step)
        keep = evaluate(mask_mod, np.arange(start, stop), kv_idx, b, h)
        padded = np.zeros((ceil_div(stop - start, Br) * Br, T_c * Bc), dtype=np.int8)  # False beyond the sequences
        padded[:stop - start, :n_k] = keep
        tiles = padded.reshape(-1, Br, T_c, Bc).sum(axis=(1, 3), dtype=np.int64)
        kinds[start // Br:ceil_div(stop, Br)] = np.where(tiles == 0, EMPTY, np.where(tiles == Br * Bc, FULL, PARTIAL))
    return kinds


def function_name(mask_mod: Callable) -> str:
    """What records call a user's function: module:qualified name."""
    return f"{getattr(mask_mod, '__module__', '?')}:{getattr(mask_mod, '__qualname__', repr(mask_mod))}"


def check_flex_mask(value, shape) -> FlexBlockMask | None:
    """A run's FlexAttention block mask as it enters the API: None, or one made for its N_q and N_k; a per-head one
    for its batch and heads (a B or H of 1 broadcasts)."""
    if value is None:
        return None
    if not isinstance(value, FlexBlockMask):
        raise InputTypeError(f"block_mask={value!r} must be an iosim.block_mask(...) or None")
    if (value.n_q, value.n_k) != (shape.n_q, shape.n_k):
        raise InputError(f"block_mask made for N_q={value.n_q}, N_k={value.n_k} on a problem of N_q={shape.n_q}, "
                         f"N_k={shape.n_k}; allowed: a block mask of the problem's lengths")
    if value.per_head:
        B, H = value.kinds.shape[:2]
        for label, made, run in (("B", B, shape.batch), ("H", H, shape.heads)):
            if made not in (1, run):
                raise InputError(f"block_mask made with {label}={made} on a problem of {run} "
                                 f"{'batch entries' if label == 'B' else 'heads'}; allowed: {label}=None, 1 or {run}")
    return value


# --- named masks: factories of mask functions, bottom-right aligned as iosim's bands --------------------------------

def causal(n_q: int, n_k: int) -> Callable:
    off = n_k - n_q
    return lambda b, h, q, kv: kv <= q + off


def window(n_q: int, n_k: int, W: int) -> Callable:
    off, W = n_k - n_q, parse_count("window W", W)
    return lambda b, h, q, kv: (kv <= q + off) & (kv > q + off - W)


def document(n_q: int, n_k: int, seqlens: Sequence[int]) -> Callable:
    """Packed documents, each causal within itself; N_q = N_k = Σ seqlens."""
    lengths = [parse_count("seqlens", L) for L in seqlens]
    if not n_q == n_k == sum(lengths):
        raise InputError(f"document mask of lengths summing to {sum(lengths)} on N_q={n_q}, N_k={n_k}; allowed: "
                         f"N_q = N_k = Σ seqlens")
    doc_ids = np.repeat(np.arange(len(lengths)), lengths)
    return lambda b, h, q, kv: (doc_ids[q] == doc_ids[kv]) & (kv <= q)


def prefix_lm(n_q: int, n_k: int, P: int) -> Callable:
    off, P = n_k - n_q, parse_count("prefix P", P)
    return lambda b, h, q, kv: (kv < P) | (kv <= q + off)


def sinks_window(n_q: int, n_k: int, K: int, W: int) -> Callable:
    """StreamingLLM: the first K keys (attention sinks) and a window of W, causally."""
    off, K, W = n_k - n_q, parse_count("sink tokens K", K), parse_count("window W", W)
    return lambda b, h, q, kv: (kv <= q + off) & ((kv < K) | (kv > q + off - W))


# name → (factory, the names of its integer arguments, tensors its function reads)
MASKS: dict[str, tuple[Callable, tuple[str, ...], tuple[str, ...]]] = {
    "causal": (causal, (), ()),
    "window": (window, ("W",), ()),
    "document": (document, ("seqlens",), ("doc_ids",)),
    "prefix_lm": (prefix_lm, ("P",), ()),
    "sinks_window": (sinks_window, ("K", "W"), ()),
}


def named_mask(spec: Sequence[str], n_q: int, n_k: int, block=(128, 128), seqlens: Sequence[int] | None = None,
               per_head: tuple[int, int] | None = None) -> FlexBlockMask:
    """The block mask of a command line's ``--flex-mask NAME [ARG ...]``: a name of ``MASKS`` and its integer
    arguments (``document`` takes ``--seqlens``), or ``module:function``, a user's mask function of (b, h, q_idx,
    kv_idx) (or a factory of one: a function of (N_q, N_k) returning it); ``per_head`` (batch, heads): a user's
    function evaluated for every batch entry and head (``--flex-heads``)."""
    name, args = spec[0], list(spec[1:])
    if name in MASKS:
        if per_head is not None:
            raise InputError(f"--flex-heads with --flex-mask {name}: a named mask is one for every head; allowed: "
                             f"--flex-heads with a mask function of your own, --flex-mask module:function")
        factory, params, reads = MASKS[name]
        if name == "document":
            if seqlens is None or args:
                raise InputError("--flex-mask document takes no arguments and needs --seqlens (the documents' lengths)")
            return block_mask(factory(n_q, n_k, seqlens), n_q, n_k, block=block,
                              name=" ".join(["document", *map(str, seqlens)]), reads=reads)
        if len(args) != len(params):
            raise InputError(f"--flex-mask {name} takes {len(params)} argument{'s' * (len(params) != 1)} "
                             f"({' '.join(params) or 'none'}); got {args}")
        values = [parse_count(p, a) for p, a in zip(params, args)]
        label = " ".join([name, *map(str, values)])
        return block_mask(factory(n_q, n_k, *values), n_q, n_k, block=block, name=label, reads=reads)
    if ":" not in name or args:
        raise InputError(f"--flex-mask {' '.join(spec)}: allowed: one of {sorted(MASKS)} with its arguments, or "
                         f"module:function")
    fn = import_named("--flex-mask", name)
    B, H = per_head if per_head is not None else (None, None)
    return block_mask(user_mask(fn, n_q, n_k), n_q, n_k, block=block, name=name, B=B, H=H)


def import_named(flag: str, name: str):
    """What ``module:attr`` names, for a command line's ``flag``; refused by name where it does not import."""
    module, _, attr = name.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise InputError(f"{flag} {name}: {err}") from None


def user_mask(fn: Callable, n_q: int, n_k: int) -> Callable:
    """A user's mask function, or what a factory of (N_q, N_k) returns."""
    code = getattr(fn, "__code__", None)
    if code is not None and code.co_argcount == 2:
        return fn(n_q, n_k)
    return fn
