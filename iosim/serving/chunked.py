"""Chunked prefill and prefix caching: the HBM traffic of prefilling a prompt chunk by chunk.

A serving engine (vLLM's and SGLang's chunked prefill, a prefix cache) prefills a prompt
of N new tokens, after P tokens whose K/V it already holds, in chunks of C: chunk k has
C_k = C query rows (the last one ragged, N − (K−1)·C, with K = ⌈N/C⌉) and attends
causally to every cached token and to itself, N_q = C_k and N_k = P + k·C + C_k with
the causal diagonal at the bottom right (iosim's convention, ``iosim.core.visits``). The
traffic of the prompt is

    Σ_k count(algorithm, N=C_k, N_k=P + k·C + C_k, causal=True)

exactly, every chunk with the tiling the block policy chooses for it (or the
``tiling`` given, capped to the chunk), as ``count`` would.

The sum is not taken chunk by chunk. At a fixed tiling, adding B_c keys in front of a
chunk's prefix adds one key block that every query of the chunk sees, and the blocks
after it stand to the queries exactly as before; so the traffic of the chunks of one
length and one tiling is affine in k along each residue class of k·C mod B_c, and
each class is summed as an arithmetic series from its first two members (its last
member is evaluated too, and checked against the series; a class that disagrees is
summed member by member). The chunks' tilings settle as N_k grows (``_runs``), so the cost is a bisection
for where they settle, a block-policy choice per chunk before it, and three closed forms per class: at most
3·B_c/gcd(C, B_c) per tiling, however long the prompt. Block policy 'optimal' searches every chunk's tiling:
it is refused above ``SEARCHED_MAX_CHUNKS`` chunks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from math import gcd

from iosim.api import count_problem, plan
from iosim.core.counts import Counts, TensorCounts, combined
from iosim.core.errors import InputError
from iosim.core.flops import Flops
from iosim.core.inputs import check_keys_after, check_positive_int, check_tokens
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.plans import Plan


@dataclass(frozen=True)
class ChunkGroup:
    """The chunks of one length: how many, and their traffic and arithmetic added."""

    length: int  # C_k: query rows of each chunk
    chunks: int
    traffic: Counts  # over all batch·heads; the peak is the largest chunk's
    flops: Flops | None  # None for an algorithm that declares no closed form for it


@dataclass(frozen=True)
class ChunkedPrefill:
    """A prompt of N tokens after a cached prefix of P, prefilled in chunks of C.

    ``groups`` holds the chunks of length C, then the ragged last chunk when there is
    one; ``traffic`` adds them. ``unchunked`` is the same prompt in one chunk (C = N):
    one causal prefill of N queries against P + N keys.
    """

    algorithm: str
    N: int  # new tokens of the prompt
    C: int  # chunk length
    prefix: int  # P: cached tokens before the prompt, read by every chunk and computed by none
    problem: Problem  # the first chunk's (its sizes, options and dtype)
    M: int
    groups: tuple[ChunkGroup, ...]
    unchunked: Counts

    @property
    def chunks(self) -> int:
        return sum(g.chunks for g in self.groups)

    @property
    def traffic(self) -> Counts:
        return combined(*(g.traffic for g in self.groups))

    @property
    def flops(self) -> Flops | None:
        parts = [g.flops for g in self.groups]
        return None if None in parts else sum(parts[1:], parts[0])

    @property
    def ratio(self) -> float:
        """Traffic over that of one unchunked prefill: what chunking costs."""
        return self.traffic.total / self.unchunked.total

    def record(self) -> dict:
        """One JSON record: the configuration, the totals, every tensor's traffic and the unchunked total."""
        s, f = self.problem.shape, self.flops
        return {"algorithm": self.algorithm, "N": self.N, "chunk": self.C, "prefix": self.prefix,
                "chunks": self.chunks, "last_chunk": self.groups[-1].length, "d": s.d, "M": self.M,
                "batch": s.batch, "heads": s.heads, "kv_heads": s.kv_heads, "dtype": self.problem.dtype,
                **self.traffic.as_dict(), "unchunked_total": self.unchunked.total,
                "unchunked_bytes": self.unchunked.total_bytes, "ratio": self.ratio,
                "matmul_flops": getattr(f, "matmul", None), "exp": getattr(f, "exp", None)}


def chunked_prefill(algorithm, *, N, C, d, M, prefix=0, batch=1, heads=1, kv_heads=None, dtype="float16",
                    block_policy="fit", tiling: Tiling | None = None, splits=None, gpu=None) -> ChunkedPrefill:
    """The exact HBM traffic of prefilling N tokens after a cached prefix of ``prefix`` in chunks of C.

    Every chunk is causal (bottom-right); the other arguments are ``iosim.count``'s. A C of
    N or more is one chunk: the plain causal prefill.
    """
    N, C, prefix = check_positive_int("N", N), check_positive_int("C", C), check_tokens("prefix", prefix)
    check_keys_after(prefix, N, "N")
    C = min(C, N)
    first = count_problem(C, d, prefix + C, batch, heads, causal=True, dtype=dtype, kv_heads=kv_heads)

    def chunk_plan(length: int, n_k: int) -> Plan:
        shape = replace(first.shape, n_q=length, n_k=n_k)
        request = plan(algorithm, replace(first, shape=shape), M, block_policy=block_policy, tiling=tiling,
                       splits=splits, gpu=gpu)
        return request.forward

    full, last = divmod(N, C)
    searched = tiling is None and block_policy == "optimal"
    if searched and full > SEARCHED_MAX_CHUNKS:
        raise InputError(f"block_policy='optimal' searches each chunk's tiling: N={N:,} in chunks of C={C:,} is "
                         f"{full:,} chunks; allowed up to {SEARCHED_MAX_CHUNKS:,} (block policy 'fit' or 'paper', or "
                         f"a tiling, count any number at once)")
    at = cache(lambda k: chunk_plan(C, prefix + (k + 1) * C))  # chunk k of length C
    groups = [_group(C, at, _runs(at, full, settles=not searched), C)]
    if last:
        tail = cache(lambda k: chunk_plan(last, prefix + N))
        groups.append(_group(last, tail, [(0, 1)], C))
    whole = chunk_plan(N, prefix + N)
    return ChunkedPrefill(whole.algorithm.name, N, C, prefix, first, whole.M, tuple(groups), whole.exact())


# block_policy "optimal" searches every chunk's tiling, one by one: at most this many chunks
SEARCHED_MAX_CHUNKS = 20_000


def _runs(at: Callable[[int], Plan], n: int, settles: bool) -> list[tuple[int, int]]:
    """The chunks 0 … n − 1 as runs [start, end) of one tiling.

    ``settles``: the tiling of chunk k depends on its N_k only through caps that stop binding as N_k grows (the
    blocks capped to the sequence, split-kv's splits to its key blocks: the policies 'fit' and 'paper', and a given
    tiling), so once a chunk has the last chunk's tiling every later one has it. The first such chunk is found by
    bisection and the chunks before it are looked at one by one: O(log n) tilings chosen and a few runs, whatever n.
    Otherwise every chunk's tiling is chosen.
    """
    final = at(n - 1).tiling
    settled = n - 1
    if settles:
        lo, hi = 0, n - 1  # the first k with the final tiling is in [lo, hi]
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if at(mid).tiling == final else (mid + 1, hi)
        settled = lo
    runs: list[tuple[int, int]] = []
    for k in range(settled):
        if runs and at(runs[-1][0]).tiling == at(k).tiling:
            runs[-1] = (runs[-1][0], k + 1)
        else:
            runs.append((k, k + 1))
    if runs and at(runs[-1][0]).tiling == final:
        runs[-1] = (runs[-1][0], n)
    else:
        runs.append((settled, n))
    return runs


def _group(length: int, at: Callable[[int], Plan], runs: list[tuple[int, int]], C: int) -> ChunkGroup:
    """The chunks of one length, consecutive (N_k growing by C from one to the next), summed run by run."""
    traffic, flops = [], []
    for start, end in runs:  # runs of chunks with one tiling
        period = at(start).tiling.Bc // gcd(C, at(start).tiling.Bc)  # k·C mod B_c repeats after it
        for r in range(start, min(start + period, end)):
            t, f = _series(at, range(r, end, period))
            traffic.append(t)
            flops.append(f)
    chunks = sum(end - start for start, end in runs)
    return ChunkGroup(length, chunks, combined(*traffic), None if None in flops else sum(flops[1:], flops[0]))


def _series(at: Callable[[int], Plan], chunks: range) -> tuple[Counts, Flops | None]:
    """Σ of the closed forms of chunks whose N_k grow by a whole number of key blocks from one to the next.

    Affine in the chunk's place, so n·f₀ + n(n−1)/2·(f₁ − f₀), checked at the last; summed one by one if not.
    """
    n = len(chunks)
    if n >= 3:
        first, second, final = at(chunks[0]), at(chunks[1]), at(chunks[-1])
        f0, f1, fn = (p.exact() for p in (first, second, final))
        g0, g1, gn = (p.flops() for p in (first, second, final))
        if _affine(f0, f1, fn, n) and (g0 is None or _affine_flops(g0, g1, gn, n)):
            traffic = Counts(tuple(TensorCounts(a.name, n * a.reads + n * (n - 1) // 2 * (b.reads - a.reads),
                                                n * a.writes + n * (n - 1) // 2 * (b.writes - a.writes), a.itemsize)
                                   for a, b in zip(f0.tensors, f1.tensors)), f0.peak_sram)
            flops = None if g0 is None else Flops(n * g0.matmul + n * (n - 1) // 2 * (g1.matmul - g0.matmul),
                                                  n * g0.exp + n * (n - 1) // 2 * (g1.exp - g0.exp))
            return traffic, flops
    exact = [at(k).exact() for k in chunks]
    flops = [at(k).flops() for k in chunks]
    return combined(*exact), None if None in flops else sum(flops[1:], flops[0])


def _affine(f0: Counts, f1: Counts, fn: Counts, n: int) -> bool:
    """Whether the n-th of f₀, f₁, ... is f₀ + (n−1)(f₁ − f₀), tensor by tensor, at one peak."""
    return f0.peak_sram == f1.peak_sram == fn.peak_sram and all(
        a.name == b.name == z.name and z.reads == a.reads + (n - 1) * (b.reads - a.reads)
        and z.writes == a.writes + (n - 1) * (b.writes - a.writes)
        for a, b, z in zip(f0.tensors, f1.tensors, fn.tensors))


def _affine_flops(g0: Flops, g1: Flops, gn: Flops, n: int) -> bool:
    return gn == Flops(g0.matmul + (n - 1) * (g1.matmul - g0.matmul), g0.exp + (n - 1) * (g1.exp - g0.exp))

