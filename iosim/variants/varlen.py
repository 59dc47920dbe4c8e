"""Ragged batches packed end to end ("varlen", flash-attn's ``cu_seqlens``): documents that attend only to themselves.

A batch of documents of lengths L_1 … L_b is packed into one sequence of Σ L_b tokens,
Q, K and V of the same lengths (self-attention packing, flash-attn's varlen with
cu_seqlens_q = cu_seqlens_k), and each document attends only to itself: causally, with a
window, or fully, as the problem asks. Its tiles are laid as flash-attn's varlen kernels
lay them: each document's query and key blocks start at the document's first token, so
no block straddles two documents, and one tiling serves the whole batch, chosen for the
longest document (the kernel is picked by max_seqlen). The traffic is therefore exactly

    Σ_b count(algorithm, N=L_b, tiling=T)    T: the tiling chosen at N = max_b L_b

and the documents of one length L, m of them, are one count at batch = m: a count costs
one plain count per distinct length, never one per token or per document.

A varlen problem is a ``Problem`` whose ``seqlens`` are the documents, whose shape is the
longest document's (batch 1, N_q = N_k = max L_b), and which ``documents`` splits into one
plain problem per distinct length. Numeric runs take Q, K, V packed as (1, heads, Σ L_b, d)
(iosim's layout with the documents end to end on the sequence axis; flash-attn's is
(Σ L_b, heads, d)): ``gather`` cuts one length's documents out as (m, heads, L, d) and
``scatter`` puts their outputs back.

Dropout draws document b's mask from the Philox streams of batch·heads b·heads + h at the
document's own positions (``Problem.dropout_streams``), as flash-attn's varlen kernels index
it: the mask of a document is that of batch entry b of the documents padded to the longest,
whichever documents share its length.

Deviations: an explicit mask, a block mask, a paged K/V cache and a batch other than 1 are
refused with ``seqlens`` (the documents are the batch).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from iosim.core.errors import InputError, InputTypeError
from iosim.core.problem import Problem
from iosim.core.units import parse_count


def check_seqlens(seqlens=None, cu_seqlens=None) -> tuple[int, ...] | None:
    """The document lengths from ``seqlens`` (L_1, …) or ``cu_seqlens`` (0, L_1, L_1 + L_2, …), never both;
    None when neither is given."""
    if seqlens is not None and cu_seqlens is not None:
        raise InputError(f"seqlens={_show(seqlens)} and cu_seqlens={_show(cu_seqlens)}: give one of them, the "
                         f"lengths or their cumulative sums, not both")
    if cu_seqlens is not None:
        cu = _ints("cu_seqlens", cu_seqlens)
        if len(cu) < 2 or cu[0] != 0:
            raise InputError(f"cu_seqlens={_show(cu_seqlens)} must start at 0 and hold at least one document "
                             f"(0, L_1, L_1 + L_2, …)")
        lengths = tuple(b - a for a, b in zip(cu, cu[1:]))
        bad = next((i for i, L in enumerate(lengths) if L < 1), None)
        if bad is not None:
            raise InputError(f"cu_seqlens={_show(cu_seqlens)} must increase strictly: document {bad} has length "
                             f"{lengths[bad]}; allowed: lengths >= 1")
        return lengths
    if seqlens is None:
        return None
    lengths = _ints("seqlens", seqlens)
    if not lengths:
        raise InputError("seqlens=[] must hold at least one document length")
    bad = next((i for i, L in enumerate(lengths) if L < 1), None)
    if bad is not None:
        raise InputError(f"seqlens[{bad}]={lengths[bad]} must be a length >= 1")
    return lengths


def _ints(name: str, values) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise InputTypeError(f"{name}={values!r} must be a list of integers")
    out = []
    for i, x in enumerate(values):
        if isinstance(x, (str, float, np.floating)):  # spelled as counts are elsewhere: "1Ki", 1024.0 (0 for cu's)
            out.append(0 if (x.strip() if isinstance(x, str) else x) in ("0", 0.0) else parse_count(f"{name}[{i}]", x))
            continue
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
            raise InputTypeError(f"{name}[{i}]={x!r} must be an integer")
        out.append(int(x))
    return tuple(out)


def _show(values) -> str:
    values = list(values) if hasattr(values, "__iter__") and not isinstance(values, (str, bytes)) else values
    text = repr(values)
    return text if len(text) <= 60 else text[:57] + "…]"


def cu_seqlens(seqlens: tuple[int, ...]) -> tuple[int, ...]:
    """The documents' first tokens and the end: (0, L_1, L_1 + L_2, …, Σ L_b), flash-attn's cu_seqlens."""
    return (0, *np.cumsum(seqlens, dtype=np.int64).tolist())


def packed(pb: Problem, seqlens: tuple[int, ...] | None) -> Problem:
    """``pb`` with its documents: the varlen problem, shaped as the longest document; ``pb`` itself when None.

    ``pb`` holds the options; its batch must be 1, and it must have no explicit mask, block
    mask or paged cache, which are defined on one sequence, not on documents.
    """
    if seqlens is None:
        return pb
    for name, value, allowed in (("batch", pb.shape.batch, 1), ("mask", pb.has_mask, False),
                                 ("block_sparsity", pb.block_sparsity, None), ("page_size", pb.page_size, None)):
        if value != allowed:
            raise InputError(f"{name}={value!r} with seqlens: the documents are the batch, each attending only to "
                             f"itself; allowed with seqlens: {name}={allowed!r}")
    longest = max(seqlens)
    return replace(pb, shape=replace(pb.shape, n_q=longest, n_k=longest), seqlens=seqlens)


def documents(pb: Problem) -> tuple[Problem, ...]:
    """One plain problem per distinct document length, ascending, its batch the documents of that length;
    ``(pb,)`` for a problem without documents."""
    if pb.seqlens is None:
        return (pb,)
    places: dict[int, list[int]] = {}  # each length's documents, in one pass over them
    for b, length in enumerate(pb.seqlens):
        places.setdefault(length, []).append(b)
    return tuple(replace(pb, shape=replace(pb.shape, batch=len(ids), n_q=L, n_k=L), seqlens=None,
                         batch_ids=tuple(ids)) for L, ids in sorted(places.items()))


def padded(pb: Problem) -> Problem:
    """Every document padded to the longest: the plain problem of len(seqlens) sequences of max L_b tokens."""
    if pb.seqlens is None:
        return pb
    return replace(pb, shape=replace(pb.shape, batch=len(pb.seqlens)), seqlens=None)


def tokens(pb: Problem) -> int:
    """Query rows per head as the caller's arrays hold them: Σ L_b packed, else N_q."""
    return pb.shape.n_q if pb.seqlens is None else sum(pb.seqlens)


def _positions(pb: Problem, length: int) -> np.ndarray:
    """The first tokens of the documents of one length, in packed order."""
    starts = cu_seqlens(pb.seqlens)[:-1]
    return np.array([s for s, L in zip(starts, pb.seqlens) if L == length], dtype=np.int64)


def gather(data: dict[str, np.ndarray], pb: Problem, part: Problem) -> dict[str, np.ndarray]:
    """The inputs of one length's documents: every packed (1, heads, Σ L_b, cols) array cut to
    (m, heads, L, cols), the documents in packed order; ``data`` itself for a problem without documents."""
    if pb.seqlens is None:
        return data
    L = part.shape.n_q
    rows = _positions(pb, L)[:, None] + np.arange(L)[None, :]  # (m, L)
    return {name: np.ascontiguousarray(np.moveaxis(x[0][:, rows], 0, 1)) for name, x in data.items()}


def scatter(pb: Problem, parts: list[tuple[Problem, np.ndarray]], cols: int) -> np.ndarray:
    """Outputs of every length's documents, each (m·heads, L, cols) as a memory holds it, packed back to
    (1, heads, Σ L_b, cols); a problem without documents has one part, reshaped to (batch, heads, N, cols)."""
    heads = pb.shape.heads
    if pb.seqlens is None:
        (part, x), = parts
        return x.reshape(pb.shape.batch, heads, -1, cols)
    out = np.empty((1, heads, tokens(pb), cols), dtype=parts[0][1].dtype)
    for part, x in parts:
        L = part.shape.n_q
        rows = _positions(pb, L)[:, None] + np.arange(L)[None, :]  # (m, L)
        out[0][:, rows] = np.moveaxis(x.reshape(-1, heads, L, cols), 1, 0)
    return out
