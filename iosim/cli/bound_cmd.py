"""``iosim bound``: the least traffic of any algorithm at its optimal tiling against the IO lower bound."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from iosim.api import count_problem
from iosim.cli.common import (
    Distinct,
    add_outputs,
    add_problem,
    algorithms_of,
    count_arg,
    left_out_by,
    maskless_algorithms,
)
from iosim.cli.progress import progress_bar
from iosim.cli.render import compact_table, eng, print_table
from iosim.core.tiling import tiling_record
from iosim.core.units import FP8_DTYPES
from iosim.reports.bound import POINTS_DEFAULT, BoundPoint, BoundSweep, bound, check_plot_path, plot
from iosim.reports.records import RecordWriter, check_distinct, check_output_path, writing


def add_parser(sub) -> None:
    p = sub.add_parser("bound", help="least traffic of any algorithm at its optimal tiling against the IO lower "
                                     "bound, over M from the smallest working set to N·d")
    p.add_argument("--N", type=count_arg, required=True, help="query length N_q")
    p.add_argument("--N-k", type=count_arg, default=None, help="key/value length (default: N)")
    p.add_argument("--d", type=count_arg, required=True)
    p.add_argument("--algo", choices=maskless_algorithms(), nargs="+", action=Distinct, default=None,
                   help="default: every algorithm but the block-sparse ones")
    add_problem(p, grouped=False, windowed=False,  # the lower bound is for full multi-head attention: no window
                dtype_help="the element type: an FP8 type counts the FP8 path (its scales) and leaves out the "
                           "algorithms without one; the counts and the bound are in elements (default float16)")
    p.add_argument("--points", type=count_arg, default=POINTS_DEFAULT,
                   help=f"values of M, evenly spaced in log M (default {POINTS_DEFAULT})")
    p.add_argument("--out", metavar="PNG", help="plot every algorithm's traffic and the bound against M")
    add_outputs(p, "every (M, algorithm)")


def point_records(problem: dict, p: BoundPoint) -> list[dict]:
    """One record per algorithm at one value of M: its optimal tiling and simulated traffic, the bound and their
    ratio; ``problem``: the problem's record."""
    return [dict(**problem, M=p.M, algorithm=name, **tiling_record(p.tiling[name]), traffic=traffic,
                 lower_bound=p.lower_bound, ratio=None if traffic is None else traffic / p.lower_bound,
                 best=name == p.best) for name, traffic in p.traffic.items()]


def run(args: argparse.Namespace, on_row: Callable[[object], None] | None = None) -> BoundSweep:
    """Sweep M; ``on_row`` sees each value of M as it is done. Each value's records are journaled as it ends, so
    an interrupted run keeps the values that finished (``RecordWriter``)."""
    paths = {what: check_output_path(what, getattr(args, what)) for what in ("json", "csv", "out")}
    check_distinct(paths)
    if paths["out"]:
        check_plot_path(paths["out"], "out")
    problem = count_problem(args.N, args.d, args.N_k, args.batch, args.heads, causal=args.causal,
                            dtype=args.dtype).record()
    with RecordWriter(args.json, args.csv) as writer:
        def done(point: BoundPoint) -> None:
            for record in point_records(problem, point):
                writer.add(record)
            if on_row is not None:
                on_row(point)

        sweep = bound(args.N, args.d, N_k=args.N_k, batch=args.batch, heads=args.heads, causal=args.causal,
                      dtype=args.dtype, points=args.points, algorithms=algorithms_of(args), on_point=done)
    if paths["out"]:
        with writing("the --out plot", paths["out"]):
            plot(sweep, paths["out"])
    return sweep


def main(args: argparse.Namespace, console) -> None:
    with progress_bar(console, "bound", args.points) as step:
        sweep = run(args, on_row=step)
    render(console, sweep)
    if args.algo is None and args.dtype in FP8_DTYPES:
        console.print(f"[yellow]--dtype {args.dtype} leaves out {', '.join(left_out_by('fp8'))}: no FP8 path[/]")


def render(console, sweep: BoundSweep) -> None:
    s = sweep.problem.shape
    console.print(f"N_q={s.n_q:,}, N_k={s.n_k:,}, d={s.d}, batch·heads={s.bh}"
                  f"{', causal' if sweep.problem.causal else ''}: the least traffic of any algorithm at its optimal "
                  f"tiling (count-only simulation) against the lower bound min(N²d/√M, N²d²/M)")
    table = compact_table(("M", "best", "B_r×B_c", "traffic", "bound", "ratio"), left="best")
    for p in sweep.points:
        t = p.tiling[p.best]
        table.add_row(f"{p.M:,}", p.best, f"{t.Br}×{t.Bc}", eng(p.traffic[p.best]), eng(p.lower_bound),
                      f"{p.ratio:.2f}")
    print_table(console, table)
    w = sweep.worst
    console.print(f"worst ratio to the lower bound: {w.ratio:.2f} at M = {w.M:,} ({w.best}); "
                  f"M = d² = {s.d * s.d:,}")
