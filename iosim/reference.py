"""Plain float64 attention, forward and backward: the yardstick every fast path is held to.

O = dropout(softmax(MASK(tau · Q Kᵀ))) V, computed with whole N_q × N_k matrices.
Rows with no visible key give O = 0 and logsumexp = -inf. NaN in the inputs
propagates to every output that depends on it, as plain arithmetic does.

MASK is spelled out here rather than taken from the simulator's helpers, so that a
mistake in those cannot be repeated in the yardstick: causal attention is aligned
bottom-right (query i sees key j exactly when j ≤ i + N_k − N_q), a sliding window
(left, right) likewise (i + N_k − N_q − left ≤ j ≤ i + N_k − N_q + right, −1 unbounded;
with causal, right is 0, as flash-attn has it), and an explicit boolean mask broadcasts
to (batch, heads, N_q, N_k) with True meaning "attend".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from iosim.core.errors import InputError
from iosim.core.inputs import check_dout, check_mask, check_qkv, check_scale, check_sinks, check_values
from iosim.core.problem import AttentionShape, check_window
from iosim.core.rng import check_dropout_p, dropout_tile


@dataclass(frozen=True)
class ReferenceOutput:
    out: np.ndarray  # (batch, heads, N_q, d_v), float64
    lse: np.ndarray  # (batch, heads, N_q), float64: log Σ_j exp(S_ij), -inf on fully masked rows


def _causal_visibility(n_q: int, n_k: int, rows: slice) -> np.ndarray:
    """(rows, N_k) booleans: query i sees key j exactly when j ≤ i + (N_k − N_q).

    Row i sees a prefix of the keys, j = 0 … i + N_k − N_q: that is
    i + N_k − N_q + 1 keys, clipped to [0, N_k]. The last row sees all N_k keys;
    with N_q > N_k the first N_q − N_k rows see none.
    """
    seen = np.clip(np.arange(rows.start, rows.stop) + (n_k - n_q) + 1, 0, n_k)  # keys seen by each row
    return np.arange(n_k)[None, :] < seen[:, None]  # (rows, N_k)


def _window_visibility(n_q: int, n_k: int, rows: slice, left: int, right: int) -> np.ndarray:
    """(rows, N_k) booleans: query i sees key j exactly when the distance j − (i + N_k − N_q) lies in
    [−left, right], a side of −1 having no bound."""
    distance = np.arange(n_k)[None, :] - (np.arange(rows.start, rows.stop)[:, None] + (n_k - n_q))  # (rows, N_k)
    keep = np.ones(distance.shape, dtype=bool)
    if left != -1:
        keep &= distance >= -left
    if right != -1:
        keep &= distance <= right
    return keep


def _keep_matrix(shape: AttentionShape, causal: bool, mask, rows: slice, window=None) -> np.ndarray:
    """Visibility of every (query, key) pair of the query rows ``rows``: (batch, heads, rows, N_k) booleans."""
    full = (shape.batch, shape.heads, shape.n_q, shape.n_k)
    keep = np.ones((shape.batch, shape.heads, rows.stop - rows.start, shape.n_k), dtype=bool)
    if causal:
        keep &= _causal_visibility(shape.n_q, shape.n_k, rows)
    band = check_window(window)
    if band is not None:
        keep &= _window_visibility(shape.n_q, shape.n_k, rows, band.left, band.right)
    if mask is not None:
        check_mask(mask, shape)  # raises on a non-boolean mask or one that does not broadcast
        keep &= np.broadcast_to(np.asarray(mask), full)[:, :, rows]  # True = attend
    return keep


def _check_rows(rows: slice | None, n_q: int) -> slice:
    if rows is None:
        return slice(0, n_q)
    if rows.step not in (None, 1) or not 0 <= rows.start < rows.stop <= n_q:
        raise InputError(f"rows={rows!r} must be a contiguous, non-empty slice within [0, N_q={n_q})")
    return rows


def repeat_kv(x: np.ndarray, heads: int) -> np.ndarray:
    """K or V of (b, kv_heads, N_k, d) as (b, heads, N_k, d): each K/V head repeated for its group.

    Grouped-query attention: query head h attends with K/V head h // (heads / kv_heads).
    """
    return np.repeat(x, heads // x.shape[1], axis=1)


def _batch_heads(shape: AttentionShape) -> tuple[np.ndarray, np.ndarray]:
    """Each batch entry's and each head's index, (b, 1, 1, 1) and (1, h, 1, 1): a score_mod's b and h."""
    return np.arange(shape.batch)[:, None, None, None], np.arange(shape.heads)[None, :, None, None]


def _probabilities(q, k, v, causal, mask, scale, rows=None, allow_nonfinite=False, window=None, sinks=None,
                   score_mod=None):
    q, k, v = (np.asarray(x) for x in (q, k, v))
    shape = check_qkv(q, k, v)
    check_values({"q": q, "k": k, "v": v}, allow_nonfinite)
    k = repeat_kv(k, shape.heads)
    tau = check_scale(scale, shape.d)
    rows = _check_rows(rows, shape.n_q)
    q64, k64 = np.asarray(q[:, :, rows], dtype=np.float64), np.asarray(k, dtype=np.float64)
    s = tau * (q64 @ np.swapaxes(k64, -1, -2))  # (b, h, rows, N_k)
    if score_mod is not None:  # FlexAttention's score_mod, on the scaled scores before the mask
        s = score_mod.apply(s, rows, slice(0, shape.n_k), *_batch_heads(shape))
    keep = _keep_matrix(shape, causal, mask, rows, window)
    s = np.where(keep, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    # a sink is one more score of the row, with no value: it joins the max and the denominator, not the output
    sink = None if sinks is None else check_sinks(sinks, shape.heads)[None, :, None, None]
    if sink is not None:
        m = np.maximum(m, sink)
    m_safe = np.where(np.isneginf(m), 0.0, m)
    e = np.exp(s - m_safe)
    l = e.sum(axis=-1, keepdims=True) + (0.0 if sink is None else np.exp(sink - m_safe))
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(l == 0, 0.0, e / np.where(l == 0, 1.0, l))
        lse = np.where(l[..., 0] == 0, -np.inf, m_safe[..., 0] + np.log(l[..., 0]))
    return shape, tau, p, lse


def dropout_scale_matrix(shape: AttentionShape, dropout_p: float, seed: int, rows: slice | None = None,
                         first_batch: int = 0) -> np.ndarray | float:
    """Z of Alg. 4 line 14: 1/(1-p) where kept and 0 where dropped, (batch, heads, rows, N_k). ``first_batch`` is
    the Philox batch index of the first batch entry: a document's place among packed documents
    (iosim.variants.varlen)."""
    p = check_dropout_p(dropout_p)
    if isinstance(first_batch, bool) or not isinstance(first_batch, (int, np.integer)) or first_batch < 0:
        raise InputError(f"first_batch={first_batch!r} must be an integer >= 0 (the dropout streams' batch index of "
                         f"the first batch entry)")
    if p == 0.0:
        return 1.0
    rows = slice(0, shape.n_q) if rows is None else rows
    streams = np.arange(first_batch * shape.heads, (first_batch + shape.batch) * shape.heads)
    keep = dropout_tile(seed, p, streams, rows, slice(0, shape.n_k))
    return keep.reshape(shape.batch, shape.heads, rows.stop - rows.start, shape.n_k) / (1.0 - p)


def attention_ref(q, k, v, *, causal=False, mask=None, scale=None, dropout_p=0.0, seed=0,
                  rows: slice | None = None, allow_nonfinite=False, window=None, first_batch: int = 0, sinks=None,
                  score_mod=None) -> ReferenceOutput:
    """Float64 attention of q (b, h, N_q, d) against k (b, h_kv, N_k, d) and v (b, h_kv, N_k, d_v), h_kv dividing h.

    ``rows`` computes only those query rows, in memory O(rows·N_k): a check of a long
    sequence goes through it a slice at a time. ``window=(left, right)``: a sliding window.
    ``first_batch``: the dropout streams' batch index of q's first entry (one packed document's place).
    ``sinks``: learned attention sinks, one logit per query head (gpt-oss): the softmax of each row over its
    scores and its head's sink, the sink's share of the weight going to no value. ``score_mod``: a FlexAttention
    score_mod (``iosim.variants.score_mods.score_mod``) applied to the scaled scores before the mask.
    """
    shape, _, p, lse = _probabilities(q, k, v, causal, mask, scale, rows, allow_nonfinite, window, sinks, score_mod)
    z = dropout_scale_matrix(shape, dropout_p, seed, _check_rows(rows, shape.n_q), first_batch)
    out = (p * z) @ repeat_kv(np.asarray(v, dtype=np.float64), shape.heads)
    return ReferenceOutput(out=out, lse=lse)


def attention_backward_ref(q, k, v, dout, *, causal=False, mask=None, scale=None, dropout_p=0.0, seed=0,
                           allow_nonfinite=False, window=None, first_batch: int = 0, sinks=None, score_mod=None):
    """Float64 gradients (dq, dk, dv) of attention_ref with respect to q, k, v (with ``sinks``, of attention_ref's
    with them; ``sinks_gradient_ref`` is theirs; with ``score_mod``, which must carry its derivative, of
    attention_ref's through it).

    Follows Alg. 4's algebra on whole matrices: dV = (P∘Z)ᵀ dO, dP = (dO Vᵀ)∘Z,
    D = rowsum(dP∘P), dS = P∘(dP − D), dQ = tau dS K, dK = tau dSᵀ Q; a score_mod f multiplies dS by f'(S).
    """
    shape, tau, p, _ = _probabilities(q, k, v, causal, mask, scale, allow_nonfinite=allow_nonfinite, window=window,
                                      sinks=sinks, score_mod=score_mod)
    if score_mod is not None and score_mod.grad is None:
        raise InputError(f"score_mod {score_mod.name!r}: its gradient needs its derivative, and it has none; allowed: "
                         f"a score_mod with grad=")
    if shape.kv_heads != shape.heads:
        raise InputError(f"kv_heads={shape.kv_heads}: the backward reference takes kv_heads == heads={shape.heads}")
    check_dout(dout, shape)
    check_values({"dout": np.asarray(dout)}, allow_nonfinite)
    z = dropout_scale_matrix(shape, dropout_p, seed, first_batch=first_batch)
    q64, k64, v64 = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    do64 = np.asarray(dout, dtype=np.float64)
    dv = np.swapaxes(p * z, -1, -2) @ do64
    dp = (do64 @ np.swapaxes(v64, -1, -2)) * z
    big_d = (dp * p).sum(axis=-1, keepdims=True)
    ds = p * (dp - big_d)
    if score_mod is not None:
        scores = tau * (np.asarray(q, dtype=np.float64) @ np.swapaxes(k64, -1, -2))
        ds = ds * score_mod.derivative(scores, slice(0, shape.n_q), slice(0, shape.n_k), *_batch_heads(shape))
    return tau * (ds @ k64), tau * (np.swapaxes(ds, -1, -2) @ q64), dv


def sinks_gradient_ref(q, k, v, dout, sinks, *, causal=False, mask=None, scale=None, window=None, dropout_p=0.0,
                       seed=0) -> np.ndarray:
    """Float64 gradient of Σ dout·attention_ref(..., sinks) with respect to the sinks, shape (heads,): a sink is a
    score with no value, so ∂O_r/∂sink = −P_sink,r·O_r and the gradient is −Σ over the batch and the head's rows of
    P_sink,r·(dout_r·O_r), P_sink,r = exp(sink − lse_r); with dropout, O is the dropped output."""
    ref = attention_ref(q, k, v, causal=causal, mask=mask, scale=scale, window=window, sinks=sinks,
                        dropout_p=dropout_p, seed=seed)
    shape = check_qkv(q, k, v)
    check_dout(dout, shape)
    big_d = (np.asarray(dout, dtype=np.float64) * ref.out).sum(axis=-1)  # (b, h, N_q)
    p_sink = np.exp(check_sinks(sinks, shape.heads)[None, :, None] - ref.lse)
    return -(p_sink * big_d).sum(axis=(0, 2))
