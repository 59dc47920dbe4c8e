"""How far the best tiling is from the IO lower bound, at every M.

Saha and Ye (ICML 2024) prove that exact attention moves Ω(min(N²d/√M, N²d²/M))
elements between HBM and an SRAM of M elements: N²d/√M while M < d² (the small-cache
regime, matrix-product-like), N²d²/M above. ``bound`` sweeps M on a log grid from the
smallest working set of any registered algorithm to N·d, counts (count-only
simulation) every algorithm at its ``optimal`` tiling, and takes the least. The ratio
of that least traffic to min(N_q·N_k·d/√M, N_q·N_k·d²/M) per head is what iosim can
claim about optimality; its worst value over M is the constant reached.

The bound is stated for full attention; with a causal mask the same curve is used,
so causal ratios are about half.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from iosim.algorithms.algorithm import Algorithm
from iosim.api import count, count_problem
from iosim.core.errors import BlockSizeError, InputError
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.registry import ALGORITHMS, get_algorithm
from iosim.reports.records import check_output_path
from iosim.tilings.search import MAX_BLOCK_SIZES

POINTS_DEFAULT = 40


def lower_bound(pb: Problem, M: int) -> float:
    """min(N_q·N_k·d/√M, N_q·N_k·d²/M), summed over batch·heads (Saha and Ye's Θ, constant 1)."""
    s = pb.shape
    return s.bh * min(s.n_q * s.n_k * s.d / math.sqrt(M), s.n_q * s.n_k * s.d * s.d / M)


def smallest_M(algorithms: Iterable[Algorithm], pb: Problem) -> int:
    """The least M at which some algorithm fits 1 × 1 blocks."""
    least = None
    for algo in algorithms:
        M = algo.working_set(pb, Tiling(1, 1), 0)
        while algo.working_set(pb, Tiling(1, 1), M) > M:  # a working set may grow with M
            M += 1
        least = M if least is None else min(least, M)
    return least


def M_grid(lo: int, hi: int, points: int) -> list[int]:
    """``points`` values of M from lo to hi, evenly spaced in log M, rounded and without repeats."""
    if points == 1 or lo == hi:
        return [lo]
    return sorted({round(lo * (hi / lo) ** (k / (points - 1))) for k in range(points)})


@dataclass(frozen=True)
class BoundPoint:
    """One M: every algorithm's simulated traffic at its optimal tiling (None where it cannot fit)."""

    M: int
    lower_bound: float
    traffic: dict[str, int | None]
    tiling: dict[str, Tiling | None]

    @property
    def best(self) -> str:
        return min((a for a, t in self.traffic.items() if t is not None), key=lambda a: self.traffic[a])

    @property
    def ratio(self) -> float:
        """The least traffic over the lower bound."""
        return self.traffic[self.best] / self.lower_bound


@dataclass(frozen=True)
class BoundSweep:
    problem: Problem
    points: list[BoundPoint]

    @property
    def worst(self) -> BoundPoint:
        return max(self.points, key=lambda p: p.ratio)


def bound(N, d, *, N_k=None, batch=1, heads=1, causal=False, dtype="float16", points: int = POINTS_DEFAULT,
          algorithms: Iterable[str | Algorithm] | None = None,
          on_point: Callable[[BoundPoint], None] | None = None) -> BoundSweep:
    """Every algorithm's least traffic against the lower bound, on a log grid of M from the smallest working set to
    N·d."""
    pb = count_problem(N, d, N_k, batch, heads, causal=causal, dtype=dtype)
    if isinstance(points, bool) or not isinstance(points, int) or points < 1:
        raise InputError(f"points={points!r} must be a whole number >= 1")
    if algorithms is None:  # those a command lists with no option set: the block-sparse ones would repeat flash
        algorithms = [a for a in ALGORITHMS.values() if a.listed_by_default(())]
    algos = [get_algorithm(a) for a in algorithms]
    lo, hi = smallest_M(algos, pb), pb.shape.n_q * pb.shape.d
    if hi < lo:
        raise InputError(f"N·d = {hi} is below the smallest working set of every algorithm ({lo} elements at "
                         f"d={pb.shape.d}, N_k={pb.shape.n_k}): no M from the smallest working set to N·d; allowed: "
                         f"N·d >= {lo}")
    longest = MAX_BLOCK_SIZES if pb.causal else (MAX_BLOCK_SIZES // 2) ** 2  # sizes a search at M = N·d tries
    if max(pb.shape.n_q, pb.shape.n_k) > longest:
        raise InputError(f"N_q={pb.shape.n_q:,}, N_k={pb.shape.n_k:,} are too long for the optimal tiling search "
                         f"at M up to N·d{' with a causal mask' if pb.causal else ''}; allowed range: N_q, N_k "
                         f"<= {longest:,}")
    shape = dict(N=N, N_k=N_k, d=d, batch=batch, heads=heads, causal=causal, dtype=dtype)
    out = []
    for M in M_grid(lo, hi, points):
        traffic, tiling = {}, {}
        for algo in algos:
            try:
                r = count(algo, **shape, M=M, block_policy="optimal")
            except BlockSizeError:
                traffic[algo.name] = tiling[algo.name] = None
                continue
            traffic[algo.name], tiling[algo.name] = r.traffic.total, r.tiling
        point = BoundPoint(M, lower_bound(pb, M), traffic, tiling)
        out.append(point)
        if on_point:
            on_point(point)
    return BoundSweep(pb, out)


def check_plot_path(path: Path, option: str = "out") -> None:
    """Refuse, before any work, a plot path (the command's ``option``) that cannot be written or whose suffix
    matplotlib cannot write."""
    from matplotlib.backend_bases import FigureCanvasBase

    check_output_path(option, str(path))

    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    if path.suffix.lstrip(".").lower() not in formats:
        raise InputError(f"{option}={str(path)!r} has the suffix {path.suffix or '(none)'!r}, which matplotlib cannot "
                         f"write; allowed: {', '.join('.' + f for f in formats)}")


def same_curves(sweep: BoundSweep) -> list[tuple[str, ...]]:
    """The algorithms grouped by their traffic at every M, in the sweep's order: one line of the plot each, so that
    one drawn over another (flash-swapped under split-kv, whose one split is flash-swapped) is named, not hidden."""
    curves: dict[tuple, list[str]] = {}
    for name in sweep.points[0].traffic:
        curves.setdefault(tuple(p.traffic[name] for p in sweep.points), []).append(name)
    return [tuple(names) for names in curves.values()]


def plot(sweep: BoundSweep, path) -> None:
    """Every algorithm's least traffic against M, log-log, with the lower bound and M = d² marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = sweep.problem.shape
    Ms = [p.M for p in sweep.points]
    fig, ax = plt.subplots(figsize=(8, 5))
    for k, names in enumerate(same_curves(sweep)):
        pts = [(p.M, p.traffic[names[0]]) for p in sweep.points if p.traffic[names[0]] is not None]
        if pts:
            ax.plot(*zip(*pts), "-o", ms=2.5, lw=1.2, color=f"C{k}", label=f"{' = '.join(names)} (optimal blocks)")
    ax.plot(Ms, [p.lower_bound for p in sweep.points], "k--", lw=1.5, label="lower bound min(N²d/√M, N²d²/M)")
    ax.axvline(s.d * s.d, color="grey", lw=0.8)
    ax.text(s.d * s.d * 1.05, 0.03, "M = d²", transform=ax.get_xaxis_transform(), fontsize=8, color="grey")
    worst = sweep.worst
    ax.annotate(f"worst ratio {worst.ratio:.2f} ({worst.best})", (worst.M, worst.traffic[worst.best]),
                xytext=(30, -160), textcoords="offset points", fontsize=8, arrowprops=dict(arrowstyle="->", lw=0.6))
    ax.set(xscale="log", yscale="log", xlabel="M (elements)", ylabel="HBM traffic (elements)",
           title=f"N_q = {s.n_q}, N_k = {s.n_k}, d = {s.d}{', causal' if sweep.problem.causal else ''}, "
                 f"batch·heads = {s.bh}")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
