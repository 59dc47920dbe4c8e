"""Decoding a batch that shares a prompt prefix: cascade attention reads the shared K/V pages once.

A serving engine with a prefix cache (vLLM's automatic prefix caching, SGLang's
RadixAttention) keeps one copy of a common prompt's K/V and points every request's
block table at it. Each of B requests then has N_k = P + U keys: the P of the shared
prefix, then U of its own. A decode kernel that walks each request on its own
(``split-kv``, ``flash-swapped``) reads the shared pages once per request, B times in
all. Cascade attention (FlashInfer's ``MultiLevelCascadeAttentionWrapper``; Hydragen,
Juravsky et al. 2024) reads them once, in three steps:

1. **prefix level**: the queries of every request attend to the P shared keys as one
   problem: batch 1, B·N_q query rows per head (G·B·N_q per K/V head once an algorithm
   packs the GQA group), no mask, writing a partial output O_prefix with its ℓ_prefix
   and m_prefix;
2. **suffix level**: each request's N_q queries attend to its own U keys, the batch as
   a batch (causal, bottom-right, when asked), writing O_suffix, ℓ_suffix, m_suffix;
3. **merge**: each query row combines its two partials as split-kv's combine combines
   two splits: m = max(m_p, m_s), a = e^(m_p − m)·ℓ_p, b = e^(m_s − m)·ℓ_s, ℓ = a + b,
   O = (a·O_p + b·O_s)/ℓ, written as O, ℓ, m.

Each level is the chosen algorithm's own run, counted and predicted as ``count`` and
``predict`` count it (its tiling from the block policy, its splits filling the GPU's
SMs), so the cascade's traffic is that of the two levels, their outputs renamed
``*_prefix`` and ``*_suffix``, and the merge's. ``separate`` is the same batch decoded
by the algorithm without sharing, each request reading its whole cache.

Deviations: the levels keep the statistics as ℓ and m (two per row, iosim's
convention) where FlashInfer's kernels write one logsumexp per row; the merge
therefore reads four and writes two per row instead of two and one. The prefix is
whole pages (P a multiple of ``page_size``), as only full blocks are shared by vLLM's
prefix cache; each level reads its own block table (the prefix's once, each request's
suffix pages per request). With U = 0 the prefix level is the whole run and writes O,
ℓ, m directly. Causal decoding of N_q > 1 queries (speculative tokens) needs U ≥ N_q − 1,
so that every query sees the whole prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from iosim.algorithms.tile_ops import exp_diff, logsumexp, safe_divide
from iosim.api import count_problem, measure, plan, simulate
from iosim.core.counts import Counts, TensorCounts, combined
from iosim.core.errors import InputError
from iosim.core.flops import Flops
from iosim.core.inputs import check_flag, check_keys_after, check_positive_int, check_qkv, check_tokens, check_values
from iosim.core.memory import Memory
from iosim.core.problem import Problem
from iosim.core.units import parse_size
from iosim.core.visits import Axis
from iosim.registry import ALGORITHMS, get_algorithm
from iosim.results import SimResult
from iosim.variants.paging import check_page_size

LEVELS = ("prefix", "suffix")
STATE = ("O", "l", "m")  # what a level writes and the merge reads: its partial output and statistics


@dataclass(frozen=True)
class Level:
    """One level of the cascade: its run (counts, tiling, arithmetic; outputs when numeric) and its closed form."""

    name: str  # "prefix" or "suffix"
    result: SimResult
    predicted: Counts

    def renamed(self, counts: Counts) -> Counts:
        """``counts`` with the level's O, ℓ, m named as the merge reads them: O_prefix, l_prefix, …"""
        return Counts(tuple(replace(t, name=f"{t.name}_{self.name}") if t.name in STATE else t
                            for t in counts.tensors), counts.peak_sram)


@dataclass(frozen=True)
class Cascade:
    """A batch of B requests of N_q queries each, over a shared prefix of P keys and U keys of its own, decoded by
    cascade attention with ``algorithm`` at each level (``levels``: the prefix's, then the suffix's when U > 0),
    and the same batch decoded without sharing (``separate``). ``merge`` and ``merge_predicted`` are the merge's
    counted and closed-form traffic (None with U = 0); ``out`` and ``lse`` the output and logsumexp of a numeric run."""

    algorithm: str
    problem: Problem  # the whole batch: N_k = P + U keys per request
    prefix: int  # P
    M: int
    levels: tuple[Level, ...]
    merge: Counts | None
    merge_predicted: Counts | None
    separate: SimResult
    out: np.ndarray | None = None
    lse: np.ndarray | None = None  # (batch, heads, N_q): each row's logsumexp m + log ℓ, numeric runs only

    @property
    def suffix(self) -> int:
        return self.problem.shape.n_k - self.prefix

    def _total(self, level_counts: list[Counts], merge: Counts | None) -> Counts:
        if merge is None:
            return level_counts[0]
        return combined(*(lv.renamed(c) for lv, c in zip(self.levels, level_counts)), merge)

    @property
    def traffic(self) -> Counts:
        """Every tensor's traffic, counted: the levels' (outputs renamed) and the merge's."""
        return self._total([lv.result.traffic for lv in self.levels], self.merge)

    @property
    def predicted(self) -> Counts:
        """The same from the closed forms: the levels' and the merge's."""
        return self._total([lv.predicted for lv in self.levels], self.merge_predicted)

    @property
    def flops(self) -> Flops:
        rows = self.problem.shape.bh * self.problem.shape.n_q
        merge = Flops(exp=2 * rows) if self.merge is not None else Flops()  # two rescalings per row
        return sum((lv.result.flops for lv in self.levels), merge)

    @property
    def ratio(self) -> float:
        """Cascade bytes over the separate decode's: what sharing the prefix saves (< 1 saves)."""
        return self.traffic.total_bytes / self.separate.traffic.total_bytes

    def record(self) -> dict:
        """One JSON record: the configuration, the cascade's traffic per tensor, the separate decode's total."""
        s, sep = self.problem.shape, self.separate.traffic
        return {"algorithm": self.algorithm, "batch": s.batch, "prefix": self.prefix, "suffix": self.suffix,
                "N_q": s.n_q, "d": s.d, "heads": s.heads, "kv_heads": s.kv_heads, "page_size": self.problem.page_size,
                "causal": self.problem.causal, "dtype": self.problem.dtype, "M": self.M,
                "tilings": {lv.name: [lv.result.tiling.Br, lv.result.tiling.Bc, lv.result.tiling.splits]
                            for lv in self.levels},
                **self.traffic.as_dict(), "kv_reads": kv_reads(self.traffic), "separate_total": sep.total,
                "separate_bytes": sep.total_bytes, "separate_kv_reads": kv_reads(sep), "ratio": self.ratio}


def kv_reads(counts: Counts) -> int:
    """Elements of K and V read."""
    return counts.tensor("K").reads + counts.tensor("V").reads


def merging_algorithms() -> list[str]:
    """The algorithms a cascade runs: those that write ℓ and m beside O, which the merge needs, and run without a
    FlexAttention block mask, which a cascade's levels do not take."""
    return [a.name for a in ALGORITHMS.values() if {"l", "m"} <= set(a.outputs()) and not a.accepts("block_mask")]


def check_algorithm(algorithm) -> str:
    """A forward algorithm a cascade runs (``merging_algorithms``)."""
    algo = get_algorithm(algorithm)
    merging = merging_algorithms()
    if algo.name not in merging:
        raise InputError(f"algorithm={algo.name!r} for a cascade: it writes no softmax statistics to merge its "
                         f"levels with; allowed: {merging}")
    return algo.name


def check_split(prefix, suffix, n_q: int, causal: bool, page_size: int | None) -> tuple[int, int]:
    """P ≥ 1 shared keys (whole pages when paged) and U ≥ 0 own keys, U ≥ N_q − 1 when causal."""
    P = check_positive_int("prefix", prefix)
    U = check_tokens("suffix", suffix)
    check_keys_after(P, U, "suffix")
    if page_size is not None and P % page_size:
        raise InputError(f"prefix={P} with page_size={page_size}: only whole pages are shared; allowed: a multiple "
                         f"of {page_size}")
    if causal and U < n_q - 1:
        raise InputError(f"suffix={U} with causal N_q={n_q}: its first queries would not see the whole prefix; "
                         f"allowed: suffix >= {n_q - 1}")
    return P, U


def cascade(algorithm="split-kv", *, batch, prefix, suffix=0, d, M, N=1, heads=1, kv_heads=None, causal=False,
            dtype="float16", page_size=None, block_policy="fit", gpu=None) -> Cascade:
    """Count (and predict) cascade decoding of ``batch`` requests of N queries each, sharing ``prefix`` keys and
    each with ``suffix`` keys of its own, against decoding them separately.

    ``algorithm`` runs each level and the separate decode; the other arguments are ``iosim.count``'s
    (``gpu`` names the preset whose SMs the default splits fill).
    """
    name = check_algorithm(algorithm)
    page_size, causal = check_page_size(page_size), check_flag("causal", causal)
    N, B = check_positive_int("N", N), check_positive_int("batch", batch)
    P, U = check_split(prefix, suffix, N, causal, page_size)

    def problem(n_q, n_k, b, causal_):
        return count_problem(n_q, d, n_k, b, heads, causal=causal_, dtype=dtype, kv_heads=kv_heads,
                             page_size=page_size)

    def level(name_, pb):
        request = plan(name, pb, M, block_policy=block_policy, gpu=gpu)
        return Level(name_, measure(request), request.forward.exact())

    levels = [level("prefix", problem(B * N, P, 1, False))]  # every request's queries: one head of B·N rows
    if U:
        levels.append(level("suffix", problem(N, U, B, causal)))
    whole = problem(N, P + U, B, causal)
    separate = measure(plan(name, whole, M, block_policy=block_policy, gpu=gpu))
    M_el = parse_size(M, dtype)
    merged, merge_predicted = (merge_counts(whole, M_el), merge_traffic(whole, M_el)) if U else (None, None)
    return Cascade(name, whole, P, M_el, tuple(levels), merged, merge_predicted, separate)


def simulate_cascade(algorithm, q, k, v, *, prefix, M, causal=False, scale=None, dtype="float16", page_size=None,
                     block_policy="fit", gpu=None, allow_nonfinite=False) -> Cascade:
    """Run cascade decoding numerically on q (batch, heads, N_q, d) and k, v (batch, kv_heads, N_k, d) whose first
    ``prefix`` keys and values are the same in every request (NaN matching NaN where ``allow_nonfinite``); ``out`` is
    the attention output. The other arguments are ``iosim.simulate``'s."""
    name = check_algorithm(algorithm)
    shape = check_qkv(q, k, v)
    check_values({"q": q, "k": k, "v": v}, allow_nonfinite)
    if shape.d_v != shape.d:
        raise InputError(f"v of head size d_v={shape.d_v} beside q, k of d={shape.d}: cascade decoding merges outputs "
                         f"of one head size here; allowed: d_v = d")
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    page_size, causal = check_page_size(page_size), check_flag("causal", causal)
    P = check_positive_int("prefix", prefix)
    last = shape.n_k - (shape.n_q - 1 if causal else 0)  # causal: every query must see the whole prefix
    if P > last:
        raise InputError(f"prefix={P} of k, v with N_k={shape.n_k} keys{f', causal N_q={shape.n_q}' if causal else ''}"
                         f"; allowed: 1 to {last}")
    P, U = check_split(P, shape.n_k - P, shape.n_q, causal, page_size)
    for name_, x in (("k", k), ("v", v)):
        differs = [b for b in range(shape.batch)
                   if not np.array_equal(x[b, :, :P], x[0, :, :P], equal_nan=bool(allow_nonfinite))]
        if differs:
            raise InputError(f"{name_}[{differs[0]}, :, :{P}] differs from {name_}[0, :, :{P}]: the shared prefix "
                             f"must be the same keys and values in every request")
    B, H, n, dd = q.shape
    options = dict(M=M, scale=scale, dtype=dtype, page_size=page_size, block_policy=block_policy, gpu=gpu,
                   allow_nonfinite=allow_nonfinite)
    # every request's queries as the rows of one head: (1, heads, B·N_q, d)
    q_all = q.transpose(1, 0, 2, 3).reshape(1, H, B * n, dd)
    first = simulate(name, q_all, k[:1, :, :P], v[:1, :, :P], **options)
    whole = replace(first.problem, shape=shape, causal=causal)
    separate = measure(plan(name, whole, M, block_policy=block_policy, gpu=gpu))

    def per_request(x: np.ndarray) -> np.ndarray:  # (1, heads, B·N_q, …) → (B, heads, N_q, …)
        return x.reshape(H, B, n, *x.shape[3:]).swapaxes(0, 1)

    levels = [Level("prefix", replace(first, out=per_request(first.out), l=per_request(first.l),
                                      m=per_request(first.m)), _predicted(name, first, M, block_policy, gpu))]
    if not U:
        top = levels[0].result
        return Cascade(name, whole, P, first.M, tuple(levels), None, None, separate, top.out, logsumexp(top.l, top.m))
    own = simulate(name, q, k[:, :, P:], v[:, :, P:], causal=causal, **options)
    levels.append(Level("suffix", own, _predicted(name, own, M, block_policy, gpu)))
    data = {f"{t}_{lv.name}": getattr(lv.result, "out" if t == "O" else t) for lv in levels for t in STATE}
    mem = _merge_memory(whole, first.M, data)
    merge(mem, whole, merge_rows(whole, first.M))
    out, l_rows, m_rows = (mem.tensor(t).reshape(B, H, n, -1) for t in STATE)
    return Cascade(name, whole, P, first.M, tuple(levels), mem.counts(), merge_traffic(whole, first.M), separate, out,
                   logsumexp(l_rows[..., 0], m_rows[..., 0]))


def _predicted(name: str, result: SimResult, M, block_policy, gpu) -> Counts:
    """The closed form of a level's numeric run, at the tiling it ran with."""
    return plan(name, result.problem, M, block_policy=block_policy, tiling=result.tiling, gpu=gpu).forward.exact()


# --- the merge: two partial states into O, ℓ, m, a block of query rows at a time ----------------------------------

def merge_rows(pb: Problem, M: int) -> int:
    """Query rows per merge block: as many of one head's N_q as fit O_i, O_s and five statistics per row."""
    per_row = 2 * pb.shape.d + 5
    if M < per_row:
        raise InputError(f"M={M} elements for the cascade's merge: one query row needs 2·d + 5 = {per_row}; allowed: "
                         f"M >= {per_row}")
    return min(pb.shape.n_q, M // per_row)


def _merge_memory(pb: Problem, M: int, data: dict | None) -> Memory:
    """HBM of the merge: both levels' O, ℓ, m as inputs and the final O, ℓ, m, one per batch·head."""
    s = pb.shape
    mem = Memory(M, bh=s.bh, numeric=data is not None)
    for level in LEVELS:
        for t in STATE:
            cols, element = (s.d, "out") if t == "O" else (1, "stat")
            name = f"{t}_{level}"
            mem.add_tensor(name, s.n_q, cols, pb.itemsize(element),
                           data=None if data is None else data[name].reshape(s.bh, s.n_q, cols))
    for t in STATE:
        mem.add_tensor(t, s.n_q, s.d if t == "O" else 1, pb.itemsize("out" if t == "O" else "stat"))
    return mem


def merge(mem: Memory, pb: Problem, Br: int) -> None:
    """O = (a·O_p + b·O_s)/(a + b), a = e^(m_p − m)ℓ_p, b = e^(m_s − m)ℓ_s, m = max(m_p, m_s), by blocks of Br rows."""
    for _, rows in mem.loop(Axis(pb.shape.n_q, Br).all()):
        br = rows.stop - rows.start
        O_i, l_i, m_i = (mem.load(f"{t}_prefix", rows, tile=f"{t}_i") for t in STATE)
        O_s, l_s, m_s = (mem.load(f"{t}_suffix", rows, tile=f"{t}_s") for t in STATE)
        m_new = mem.alloc("m_new", br)
        mem.compute(exp=2 * br)
        if mem.numeric:
            m_new.data = np.maximum(m_i.data, m_s.data)
            a = exp_diff(m_i.data, m_new.data) * l_i.data  # (bh, br, 1)
            b = exp_diff(m_s.data, m_new.data) * l_s.data
            l_i.data = a + b
            O_i.data = safe_divide(a * O_i.data + b * O_s.data, l_i.data)  # (bh, br, d)
            m_i.data = m_new.data
        for tile, t in ((O_i, "O"), (l_i, "l"), (m_i, "m")):
            mem.store(tile, t, rows)
        mem.free(O_i, l_i, m_i, O_s, l_s, m_s, m_new)


def merge_counts(pb: Problem, M: int) -> Counts:
    """The merge's traffic, counted by running it count-only."""
    mem = _merge_memory(pb, M, None)
    merge(mem, pb, merge_rows(pb, M))
    return mem.counts()


def merge_traffic(pb: Problem, M: int) -> Counts:
    """Closed form: every row's two partial states read once (O: d, ℓ, m: 1 each, twice) and O, ℓ, m written once;
    the peak is one block's O_i, O_s and five statistics per row."""
    s = pb.shape
    rows = s.bh * s.n_q
    size = {"O": s.d, "l": 1, "m": 1}
    item = {t: pb.itemsize("out" if t == "O" else "stat") for t in STATE}
    inputs = [TensorCounts(f"{t}_{level}", rows * size[t], 0, item[t]) for level in LEVELS for t in STATE]
    outputs = [TensorCounts(t, 0, rows * size[t], item[t]) for t in STATE]
    Br = merge_rows(pb, M)
    return Counts(tuple(inputs + outputs), (2 * s.d + 5) * Br)
