"""FlexAttention's block masks: a mask function of (batch, head, query index, key index) made into full, partial
and empty blocks, as ``torch.nn.attention.flex_attention.create_block_mask`` makes them.

``block_mask(mask_mod, N_q, N_k, block=(128, 128))`` evaluates ``mask_mod(b, h, q_idx, kv_idx)`` (True = attend) on
every (query, key) pair, a block row at a time, with numpy arrays of indices broadcast against each other, and sorts
each B_r × B_c block: **full** (every pair attends: the kernel applies no mask), **partial** (some do: the kernel
evaluates the mask function on it) or **empty** (none: the kernel never visits it). The mask is one for every batch
entry and head (FlexAttention's ``B=None, H=None``): it is evaluated at b = h = 0.

The kernel reads the block mask's index tensors from HBM (``FLEX_TENSORS``, int32): for each query block the number of
partial and of full key blocks, and one index per key block it visits. A mask function that reads a tensor (a
document id per token, say) declares it in ``reads``: on a partial block the kernel reads its entry for each query
row and each key row of the block, from a tensor of max(N_q, N_k) int32 entries.

Named masks (``MASKS``), each aligned as iosim's bands are (bottom-right: query i of N_q stands at position i + N_k −
N_q among the keys): ``causal``; ``window`` W (a query sees itself and the W − 1 keys before it, Hugging Face's
sliding window); ``document`` (packed documents of the given lengths, each causal within itself); ``prefix_lm`` P
(every query sees the first P keys, and causally beyond them); ``sinks_window`` K W (StreamingLLM: the first K keys
beside a window of W).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from iosim.core.errors import InputError, InputTypeError
from iosim.core.tiling import ceil_div
from iosim.core.units import parse_count

EMPTY, PARTIAL, FULL = 0, 1, 2
MAX_PAIRS = 2 * 10**9  # (query, key) pairs a block mask evaluates: about a minute of numpy on one core
ROWS_AT_ONCE = 2**22  # pairs evaluated at once: a block row of queries against every key, a few MB


@dataclass(frozen=True, eq=False)
class FlexBlockMask:
    """A mask function's blocks: ``kinds`` (T_r, T_c) of EMPTY, PARTIAL or FULL over blocks of Br × Bc."""

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

    @property
    def T_r(self) -> int:
        return self.kinds.shape[0]

    @property
    def T_c(self) -> int:
        return self.kinds.shape[1]

    def counts(self) -> dict[str, int]:
        """How many blocks are full, partial and empty."""
        return {name: int(np.count_nonzero(self.kinds == kind))
                for name, kind in (("full", FULL), ("partial", PARTIAL), ("empty", EMPTY))}

    def keep(self, rows: slice, cols: slice) -> np.ndarray:
        """The mask function on one tile: (rows, cols) booleans, True = attend."""
        return evaluate(self.mask_mod, np.arange(rows.start, rows.stop), np.arange(cols.start, cols.stop))

    def element_mask(self) -> np.ndarray:
        """The whole (N_q, N_k) mask, for a reference to compare with (small problems)."""
        return self.keep(slice(0, self.n_q), slice(0, self.n_k))


def evaluate(mask_mod: Callable, q_idx: np.ndarray, kv_idx: np.ndarray) -> np.ndarray:
    """``mask_mod`` on every pair of ``q_idx`` × ``kv_idx``: (len(q_idx), len(kv_idx)) booleans."""
    out = np.asarray(mask_mod(np.int64(0), np.int64(0), q_idx[:, None], kv_idx[None, :]))
    if out.dtype != np.bool_:
        raise InputTypeError(f"mask_mod returned {out.dtype}: it must return booleans (True = attend)")
    try:
        return np.broadcast_to(out, (q_idx.size, kv_idx.size))
    except ValueError:
        raise InputError(f"mask_mod returned shape {out.shape}, which does not broadcast to the pairs "
                         f"({q_idx.size}, {kv_idx.size}) of its q_idx and kv_idx") from None


def block_mask(mask_mod: Callable, N_q, N_k=None, *, block=(128, 128), name: str | None = None,
               reads: Sequence[str] = ()) -> FlexBlockMask:
    """The block mask of ``mask_mod`` over N_q queries and N_k keys (default N_q) in blocks ``block`` = (B_r, B_c).

    ``reads`` names the tensors the mask function reads (one entry per query row and key row of a partial block, an
    int32 each), which the kernel reads from HBM.
    """
    if not callable(mask_mod):
        raise InputTypeError(f"mask_mod={mask_mod!r} must be a function of (b, h, q_idx, kv_idx)")
    n_q = parse_count("N_q", N_q)
    n_k = n_q if N_k is None else parse_count("N_k", N_k)
    if isinstance(block, (str, bytes)) or not hasattr(block, "__len__") or len(block) != 2:
        raise InputTypeError(f"block={block!r} must be a pair (B_r, B_c) of whole numbers >= 1")
    Br, Bc = parse_count("block B_r", block[0]), parse_count("block B_c", block[1])
    Br, Bc = min(Br, n_q), min(Bc, n_k)
    if n_q * n_k > MAX_PAIRS:
        raise InputError(f"a block mask over N_q × N_k = {n_q:,} × {n_k:,} pairs evaluates more than {MAX_PAIRS:.0e} "
                         f"of them; allowed: N_q·N_k <= {MAX_PAIRS:.0e}")
    if isinstance(reads, str) or not all(isinstance(r, str) and r.isidentifier() for r in reads):
        raise InputTypeError(f"reads={reads!r} must be a sequence of tensor names (identifiers)")
    T_r, T_c = ceil_div(n_q, Br), ceil_div(n_k, Bc)
    kinds = np.empty((T_r, T_c), dtype=np.int8)
    kv_idx = np.arange(n_k)
    rows_per_step = max(1, ROWS_AT_ONCE // max(1, n_k * Br)) * Br  # whole block rows at a time
    for start in range(0, n_q, rows_per_step):
        stop = min(n_q, start + rows_per_step)
        keep = evaluate(mask_mod, np.arange(start, stop), kv_idx)
        padded = np.zeros((ceil_div(stop - start, Br) * Br, T_c * Bc), dtype=np.int8)
        padded[:stop - start, :n_k] = keep
        seen = np.ones_like(padded)
        seen[stop - start:] = 0
        seen[:, n_k:] = 0
        tiles = padded.reshape(-1, Br, T_c, Bc).sum(axis=(1, 3))
        sizes = seen.reshape(-1, Br, T_c, Bc).sum(axis=(1, 3))
        kinds[start // Br:ceil_div(stop, Br)] = np.where(tiles == 0, EMPTY, np.where(tiles == sizes, FULL, PARTIAL))
    return FlexBlockMask(name or _name_of(mask_mod), n_q, n_k, Br, Bc, kinds, mask_mod, tuple(reads))


def _name_of(mask_mod: Callable) -> str:
    return f"{getattr(mask_mod, '__module__', '?')}:{getattr(mask_mod, '__qualname__', repr(mask_mod))}"


def check_flex_mask(value, n_q: int, n_k: int) -> FlexBlockMask | None:
    """A run's FlexAttention block mask as it enters the API: None, or one made for its N_q and N_k."""
    if value is None:
        return None
    if not isinstance(value, FlexBlockMask):
        raise InputTypeError(f"block_mask={value!r} must be an iosim.block_mask(...) or None")
    if (value.n_q, value.n_k) != (n_q, n_k):
        raise InputError(f"block_mask made for N_q={value.n_q}, N_k={value.n_k} on a problem of N_q={n_q}, "
                         f"N_k={n_k}; allowed: a block mask of the problem's lengths")
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


def named_mask(spec: Sequence[str], n_q: int, n_k: int, block=(128, 128), seqlens: Sequence[int] | None = None
               ) -> FlexBlockMask:
    """The block mask of a command line's ``--flex-mask NAME [ARG ...]``: a name of ``MASKS`` and its integer
    arguments (``document`` takes ``--seqlens``), or ``module:function``, a user's mask function of (b, h, q_idx,
    kv_idx) (or a factory of one: a function of (N_q, N_k) returning it)."""
    name, args = spec[0], list(spec[1:])
    if name in MASKS:
        factory, params, reads = MASKS[name]
        if name == "document":
            if seqlens is None or args:
                raise InputError("--flex-mask document takes no arguments and needs --seqlens (the documents' lengths)")
            return block_mask(factory(n_q, n_k, seqlens), n_q, n_k, block=block, name="document", reads=reads)
        if len(args) != len(params):
            raise InputError(f"--flex-mask {name} takes {len(params)} argument{'s' * (len(params) != 1)} "
                             f"({' '.join(params) or 'none'}); got {args}")
        values = [parse_count(p, a) for p, a in zip(params, args)]
        label = " ".join([name, *map(str, values)])
        return block_mask(factory(n_q, n_k, *values), n_q, n_k, block=block, name=label, reads=reads)
    if ":" not in name or args:
        raise InputError(f"--flex-mask {' '.join(spec)}: allowed: one of {sorted(MASKS)} with its arguments, or "
                         f"module:function")
    module, _, attr = name.partition(":")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise InputError(f"--flex-mask {name}: {err}") from None
    return block_mask(user_mask(fn, n_q, n_k), n_q, n_k, block=block, name=name)


def user_mask(fn: Callable, n_q: int, n_k: int) -> Callable:
    """A user's mask function, or what a factory of (N_q, N_k) returns."""
    code = getattr(fn, "__code__", None)
    if code is not None and code.co_argcount == 2:
        return fn(n_q, n_k)
    return fn
