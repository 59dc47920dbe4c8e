"""On-chip arithmetic: masking, safe exponentials, the online softmax's steps, dropout.

Shared by iosim's algorithms and public for one written outside iosim
(docs/examples/kv_resident.py). Every function works on (bh, rows, cols) arrays that
live in SRAM tiles.
"""

from __future__ import annotations

import numpy as np

from iosim.core.memory import Memory, Tile
from iosim.core.problem import Problem
from iosim.core.rng import dropout_tile
from iosim.variants.paging import pages_read


def exp_diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """exp(a − b) for a running max b of a, with 0 where both are −inf.

    b may be −inf only where a is too (a row that has seen no key yet), so only
    the small b needs guarding: exp(−inf − 0) = 0 there, and no NaN arises.
    """
    return np.exp(a - np.where(np.isneginf(b), 0.0, b))


def band_tile(pb: Problem, rows: slice, cols: slice) -> np.ndarray:
    """The band (a sliding window, or causal) of one tile, (Br, Bc); on a problem packed by GQA group
    (``Problem.packed_by_group``) row r is query r mod N_q of its head."""
    band = pb.band
    if pb.packed == 1:
        return band.keep(pb.shape.n_q, pb.shape.n_k, rows, cols)
    n = pb.queries
    return np.tile(band.keep(n, pb.shape.n_k, slice(0, n), cols), (pb.packed, 1))[rows]  # (G·N_q, Bc) → rows


def scores(pb: Problem, Q_i: Tile, K_j: Tile, rows: slice, cols: slice, mask_ij: Tile | None) -> np.ndarray:
    """S_ij = MASK(tau · Q_i K_jᵀ): (bh, Br, Bc), −inf where a key is hidden."""
    return masked(pb, pb.tau * (Q_i.data @ np.swapaxes(K_j.data, -1, -2)), rows, cols, mask_ij)  # (bh, Br, Bc)


def masked(pb: Problem, S: np.ndarray, rows: slice, cols: slice, mask_ij: Tile | None) -> np.ndarray:
    """MASK(S) of the scaled scores of one tile: −inf where the band or the explicit mask hides a key."""
    if not pb.band.full:
        S = np.where(band_tile(pb, rows, cols), S, -np.inf)
    if mask_ij is not None:
        S = np.where(mask_ij.data > 0.5, S, -np.inf)
    return S


def visible(pb: Problem, rows: slice, cols: slice, mask_ij: Tile | None) -> np.ndarray:
    """(bh, Br, Bc) booleans, True = attend: the band and the explicit mask's tile, combined."""
    keep = np.ones((pb.shape.bh, rows.stop - rows.start, cols.stop - cols.start), dtype=bool)
    if not pb.band.full:
        keep &= band_tile(pb, rows, cols)
    if mask_ij is not None:
        keep &= mask_ij.data > 0.5
    return keep


def apply_dropout(pb: Problem, P: np.ndarray, rows: slice, cols: slice) -> np.ndarray:
    """P ∘ Z: zero the dropped entries and scale the kept ones by 1/(1 − p)."""
    if pb.dropout_p == 0.0:
        return P
    if pb.packed == 1:
        keep = dropout_tile(pb.seed, pb.dropout_p, pb.dropout_streams(), rows, cols)
    else:  # packed by GQA group: the stream of each query head's own rows, (bkv, G·N_q, Bc) → rows
        n = pb.queries
        keep = dropout_tile(pb.seed, pb.dropout_p, pb.dropout_streams(), slice(0, n), cols)
        keep = keep.reshape(pb.shape.bh, pb.packed * n, -1)[:, rows]
    return np.where(keep, P / (1.0 - pb.dropout_p), 0.0)


def safe_divide(x: np.ndarray, l: np.ndarray) -> np.ndarray:
    """x / l by rows, and 0 on rows whose normalizer is 0 (rows that see no key).

    A NaN normalizer stays NaN: NaN inputs are never turned into zeros.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(l == 0, 0.0, x / np.where(l == 0, 1.0, l))


def load_mask(mem: Memory, pb: Problem, rows: slice, cols: slice) -> Tile | None:
    """Read the mask tile from HBM when the problem has an explicit mask."""
    return mem.load("mask", rows, cols, tile="mask_ij") if pb.has_mask else None


def load_kv(mem: Memory, pb: Problem, cols: slice) -> tuple[Tile, Tile]:
    """K_j and V_j of the key rows ``cols``: two loads, or from MLA's latent cache (``Problem.latent``) one, V_j being
    the first d_v columns of K_j, already on chip."""
    K_j = mem.load("K", cols)
    return K_j, (mem.view(K_j, "V", slice(0, pb.shape.d_v)) if pb.latent else mem.load("V", cols))


def kv_width(pb: Problem) -> int:
    """The elements ``load_kv`` holds on chip per key row: d + d_v, or from MLA's latent cache d."""
    return pb.shape.d + (not pb.latent) * pb.shape.d_v


def read_descales(mem: Memory, pb: Problem) -> None:
    """Read the head's three FP8 descales (Q's, K's and V's) once, as a thread block of FP8 data does; nothing for
    other dtypes. Numeric runs compute in float64: the descales scale nothing here."""
    if pb.fp8:
        mem.free(mem.load("descale", slice(0, 1)))


def read_block_table(mem: Memory, pb: Problem, cols: slice) -> None:
    """Read the block-table entries of the pages key rows ``cols`` lie in, before loading them (a paged cache)."""
    if pb.page_size:
        mem.free(mem.load("block_table", pages_read(pb, cols), tile="pages_j"))


def start_at_sinks(mem: Memory, pb: Problem, rows: slice, l_i: Tile, m_i: Tile) -> None:
    """Start the running sum and max of ``rows`` at (1, their heads' sink logits) (``Problem.sinks``): each row's
    sink is one more score, with no value, taken in before any key. Reads the head's sinks once, a GQA group's on a
    problem packed by group (row r is query r mod N_q of the group's head r // N_q)."""
    sinks = mem.load("sinks", slice(0, pb.packed))
    if mem.numeric:
        l_i.data[...], m_i.data[...] = 1.0, sinks.data[:, np.arange(rows.start, rows.stop) // pb.queries]
    mem.free(sinks)


def absorb_sink_gradient(mem: Memory, pb: Problem, rows: slice, D_i: Tile, L_i: Tile, dsinks: Tile) -> None:
    """Add a query block's part of the sinks' gradient into ``dsinks``: −Σ over its rows of P_sink·D, P_sink =
    exp(sink − L) the row's weight on its head's sink (the sink's score has no value, so dO·∂O/∂sink = −P_sink·D).
    Reads the head's sinks (a GQA group's on a packed problem) once."""
    sinks = mem.load("sinks", slice(0, pb.packed))
    mem.compute(exp=rows.stop - rows.start)  # P_sink of each row
    if mem.numeric:
        heads = np.arange(rows.start, rows.stop) // pb.queries  # each row's head within the packed group
        weight = np.exp(sinks.data[:, heads] - L_i.data) * D_i.data  # (bh, rows, 1)
        np.subtract.at(dsinks.data, (slice(None), heads), weight)
    mem.free(sinks)


def probabilities(S: np.ndarray, l: np.ndarray, m: np.ndarray) -> np.ndarray:
    """P = diag(ℓ)⁻¹ exp(S − m) from the forward's statistics (Alg. 4 line 13); 0 on rows that see no key."""
    return safe_divide(exp_diff(S, m), l)


def row_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """rowsum(a ∘ b): (bh, rows, 1), as D_i = rowsum(dO_i ∘ O_i) (Alg. 4 line 19)."""
    return (a * b).sum(axis=-1, keepdims=True)


def logsumexp(l: np.ndarray, m: np.ndarray) -> np.ndarray:
    """lse = m + log ℓ from the online softmax's statistics; −inf on rows that see no key (ℓ = 0)."""
    with np.errstate(divide="ignore"):
        return np.where(l == 0, -np.inf, m + np.log(np.where(l == 0, 1.0, l)))


def gradient_statistics(mem: Memory, rows: slice) -> tuple[Tile, Tile, tuple[Tile, ...]]:
    """A backward pass's statistics of the query rows ``rows``: loads O_i, dO_i, ℓ_i, m_i and computes D_i =
    rowsum(dO_i ∘ O_i) (Alg. 4 line 19) and L_i = m_i + log ℓ_i, one log a row. Returns D_i, L_i and the loaded tiles,
    all resident: the caller frees them."""
    br = rows.stop - rows.start
    O_i, dO_i = mem.load("O", rows), mem.load("dO", rows)
    l_i, m_i = mem.load("l", rows), mem.load("m", rows)
    D_i, L_i = mem.alloc("D_i", br), mem.alloc("L_i", br)
    mem.compute(exp=br)  # the log of L_i
    if mem.numeric:
        D_i.data, L_i.data = row_dot(dO_i.data, O_i.data), logsumexp(l_i.data, m_i.data)
    return D_i, L_i, (O_i, dO_i, l_i, m_i)


def transpose(x: np.ndarray) -> np.ndarray:
    """xᵀ of every head's tile: (bh, a, b) → (bh, b, a)."""
    return np.swapaxes(x, -1, -2)


def absorb_block(pb: Problem, S_ij: Tile, V_j: Tile, m_i: Tile, l_i: Tile, O_i: Tile, m_new: Tile, l_tilde: Tile,
                 rows: slice, cols: slice) -> None:
    """One K/V block of a loop that keeps O_i on chip unnormalized (Alg. 2 lines 12-15, as FlashAttention-2).

    S_ij holds the block's scores; it becomes P̃_ij against the new row max m_new, and
    m_i, ℓ_i and O_i absorb the block: O_i ← α·O_i + dropout(P̃_ij) V_j with
    α = exp(m_i − m_new). O_i is divided by ℓ_i once, after the last block.
    """
    m_new.data = np.maximum(m_i.data, S_ij.data.max(axis=-1, keepdims=True))
    S_ij.data = exp_diff(S_ij.data, m_new.data)
    l_tilde.data = S_ij.data.sum(axis=-1, keepdims=True)
    alpha = exp_diff(m_i.data, m_new.data)
    l_i.data = alpha * l_i.data + l_tilde.data
    O_i.data = alpha * O_i.data + apply_dropout(pb, S_ij.data, rows, cols) @ V_j.data  # (bh, Br, d)
    m_i.data = m_new.data


def absorb_gradients(pb: Problem, P_ij: Tile, dO_i: Tile, Q_i: Tile, K_j: Tile, V_j: Tile, D_i: Tile, dP_ij: Tile,
                     dQ_i: Tile, dK_j: Tile, dV_j: Tile, rows: slice, cols: slice) -> None:
    """One tile of a backward pass that recomputes P (Alg. 4 lines 14-22, FlashAttention-2's too).

    From P_ij and D_i = rowsum(dO_i ∘ O_i): dV_j += (P_ij ∘ Z_ij)ᵀ dO_i; dP_ij = (dO_i V_jᵀ) ∘ Z_ij,
    then dS_ij = P_ij ∘ (dP_ij − D_i) in place of dP_ij; dQ_i += τ dS_ij K_j and dK_j += τ dS_ijᵀ Q_i.
    """
    dV_j.data += transpose(score_gradient(pb, P_ij, dO_i, V_j, D_i, dP_ij, rows, cols)) @ dO_i.data  # (bh, Bc, d_v)
    dQ_i.data = dQ_i.data + pb.tau * (dP_ij.data @ K_j.data)  # (bh, Br, d)
    dK_j.data += pb.tau * (transpose(dP_ij.data) @ Q_i.data)  # (bh, Bc, d)


def score_gradient(pb: Problem, P_ij: Tile, dO_i: Tile, V_j: Tile, D_i: Tile, dP_ij: Tile, rows: slice,
                   cols: slice) -> np.ndarray:
    """dS_ij = P_ij ∘ (dP_ij − D_i) into dP_ij, dP_ij = (dO_i V_jᵀ) ∘ Z_ij; returns P_ij ∘ Z_ij, what dV_j takes."""
    dP_ij.data = apply_dropout(pb, dO_i.data @ transpose(V_j.data), rows, cols)  # (bh, Br, Bc)
    dP_ij.data = P_ij.data * (dP_ij.data - D_i.data)
    return apply_dropout(pb, P_ij.data, rows, cols)

