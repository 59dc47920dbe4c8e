"""Command line: ``iosim sweep`` (count-only grid) and ``iosim run`` (one numeric simulation).

``build_parser`` and ``run`` hold the logic and return data; only ``main`` renders,
with rich. Tests call ``run`` directly.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import numpy as np

from iosim.api import SimResult, simulate
from iosim.errors import InputError
from iosim.memory import CapacityError
from iosim.problem import DTYPE_ITEMSIZE
from iosim.reference import attention_ref
from iosim.registry import ALGORITHMS, DEFAULT, baseline
from iosim.tiling import POLICIES
from iosim.sweep import DEFAULT_D, DEFAULT_N, RecordWriter, SweepRow, run_sweep, traffic_ratios
from iosim.units import parse_size


class UsageError(Exception):
    """Bad command-line input: reported in one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print the usage block and exit; we want one line
        raise UsageError(message)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is outside the allowed range [1, inf)")
    return value


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--M", default="100k",
                   help="SRAM capacity: 100k (×1000), 64Ki (×1024) elements, or bytes with a B: 192KiB (default 100k)")
    p.add_argument("--batch", type=_positive_int, default=1)
    p.add_argument("--heads", type=_positive_int, default=1)
    p.add_argument("--causal", action="store_true", help="bottom-right aligned causal mask")
    p.add_argument("--dtype", choices=sorted(DTYPE_ITEMSIZE), default="float16",
                   help="element size for bytes and for M given in bytes (default float16)")
    p.add_argument("--block-policy", choices=list(POLICIES), default="fit",
                   help="fit: largest blocks that fit M (default); paper: B_c = ceil(M/4d), B_r = min(B_c, d)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="iosim", description="HBM traffic of attention: simulated, predicted, checked.")
    sub = parser.add_subparsers(dest="command", required=True)

    sw = sub.add_parser("sweep", help="count-only traffic of every algorithm over a grid of N and d")
    _add_common(sw)
    sw.add_argument("--N", type=_positive_int, nargs="+", default=list(DEFAULT_N), help="sequence lengths")
    sw.add_argument("--d", type=_positive_int, nargs="+", default=list(DEFAULT_D), help="head dimensions")
    sw.add_argument("--algo", choices=list(ALGORITHMS), nargs="+", default=list(ALGORITHMS))
    sw.add_argument("--json", metavar="PATH", help="write the rows as a JSON list (updated as rows finish)")
    sw.add_argument("--csv", metavar="PATH", help="write the rows as CSV (appended as rows finish)")

    rn = sub.add_parser("run", help="one numeric simulation on random inputs, checked against float64")
    _add_common(rn)
    rn.add_argument("--algo", choices=list(ALGORITHMS), default=DEFAULT)
    rn.add_argument("--N", type=_positive_int, default=1000, help="query length N_q")
    rn.add_argument("--N-k", type=_positive_int, default=None, help="key/value length (default: N)")
    rn.add_argument("--d", type=_positive_int, default=64)
    rn.add_argument("--scale", type=float, default=None, help="softmax scale tau (default 1/sqrt(d))")
    rn.add_argument("--dropout", type=float, default=0.0, help="dropout probability in [0, 1)")
    rn.add_argument("--seed", type=int, default=0, help="seed of the inputs and of the dropout mask")
    return parser


@dataclass(frozen=True)
class SweepOutcome:
    rows: list[SweepRow]


@dataclass(frozen=True)
class RunOutcome:
    result: SimResult
    max_abs_error: float  # against the float64 reference
    max_rel_error: float  # max |err| / max |reference|


def run(args: argparse.Namespace, on_row=None) -> SweepOutcome | RunOutcome:
    """Execute a parsed command and return its results as data."""
    M = parse_size(args.M, args.dtype)
    if args.command == "sweep":
        writer = RecordWriter(args.json, args.csv)
        try:
            rows = run_sweep(args.algo, args.N, args.d, M, batch=args.batch, heads=args.heads, causal=args.causal,
                             dtype=args.dtype, block_policy=args.block_policy, writer=writer, on_row=on_row)
        finally:
            writer.close()
        return SweepOutcome(rows)
    rng = np.random.default_rng(args.seed)
    n_k = args.N_k or args.N
    q = rng.standard_normal((args.batch, args.heads, args.N, args.d))
    k, v = (rng.standard_normal((args.batch, args.heads, n_k, args.d)) for _ in range(2))
    options = dict(causal=args.causal, scale=args.scale, dropout_p=args.dropout, seed=args.seed)
    result = simulate(args.algo, q, k, v, M=M, block_policy=args.block_policy, dtype=args.dtype, **options)
    ref = attention_ref(q, k, v, **options).out
    err = float(np.max(np.abs(result.out - ref)))
    return RunOutcome(result, err, err / max(float(np.max(np.abs(ref))), np.finfo(float).tiny))


# --- rendering (rich lives here only) -----------------------------------------------------
def _si(x: float | None) -> str:
    if x is None:
        return "—"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.4g}{unit}"
    return f"{x:.4g}"


def _render_sweep(console, outcome: SweepOutcome) -> None:
    from rich import box
    from rich.table import Table

    rows = outcome.rows
    first = rows[0]
    table = Table(box=box.SIMPLE_HEAD, title=f"HBM traffic in elements (M = {first.M:,} elements, batch·heads = {first.batch * first.heads}, "
                        f"{first.dtype})", header_style="bold")
    for col in ("algorithm", "N", "d", "B_r", "B_c", "HBM reads", "writes", "total", "exact prediction",
                "paper's form", "meas/pred", "peak SRAM/M"):
        table.add_column(col, justify="left" if col == "algorithm" else "right")
    for r in rows:
        table.add_row(
            r.algorithm, str(r.N), str(r.d), str(r.tiling.Br if r.tiling else "—"),
            str(r.tiling.Bc if r.tiling else "—"), _si(r.reads), _si(r.writes),
            _si(r.total), _si(r.predicted), _si(r.paper), "—" if r.ratio is None else f"{r.ratio:.6f}",
            "overflow" if r.peak_sram is None else f"{r.peak_fraction:.3f}",
        )
    console.print(table)
    for r in rows:
        if r.status != "ok":
            console.print(f"[yellow]{r.algorithm} N={r.N} d={r.d}: {r.status}[/]")
            break
    labels = {r.algorithm: r.paper_label for r in rows}
    console.print("Paper's forms: " + "; ".join(f"{a}: {label}" for a, label in labels.items()))
    base = baseline().name
    for other in [a for a in labels if a != base]:
        ratios = traffic_ratios(rows, base, other)
        if not ratios:
            continue
        console.print(f"[bold]{base} ÷ {other} traffic[/]")
        for d in sorted({x.d for x in ratios}):
            line = ", ".join(f"N={x.N}: {x.ratio:.2f}×" for x in ratios if x.d == d)
            console.print(f"  d={d}: {line}")


def _render_run(console, outcome: RunOutcome) -> None:
    from rich.table import Table

    r = outcome.result
    t = r.traffic
    pb = r.problem
    table = Table(title=f"{r.algorithm}: N_q={pb.shape.n_q}, N_k={pb.shape.n_k}, d={pb.shape.d}, "
                        f"batch·heads={pb.shape.bh}, M={r.M:,}, B_r={r.tiling.Br}, B_c={r.tiling.Bc}",
                  header_style="bold")
    for col in ("tensor", "reads", "writes", "read bytes", "write bytes"):
        table.add_column(col, justify="left" if col == "tensor" else "right")
    for x in t.tensors:
        table.add_row(x.name, f"{x.reads:,}", f"{x.writes:,}", f"{x.read_bytes:,}", f"{x.write_bytes:,}")
    table.add_row("total", f"{t.reads:,}", f"{t.writes:,}", "", f"{t.total_bytes:,} B", style="bold")
    console.print(table)
    console.print(f"peak SRAM {t.peak_sram:,} of M = {r.M:,} elements ({t.peak_sram / r.M:.3f})")
    console.print(f"max |error| against float64 reference: {outcome.max_abs_error:.3e} "
                  f"(relative {outcome.max_rel_error:.3e})")


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console()
    if not console.is_terminal:  # piped output: wide enough for the sweep table
        console = Console(width=132)
    try:
        args = build_parser().parse_args(argv)
        if args.command == "sweep":
            total = len(args.algo) * len(args.N) * len(args.d)
            with Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=console, transient=True) as progress:
                task = progress.add_task("sweep", total=total)
                outcome = run(args, on_row=lambda row: progress.advance(task))
            _render_sweep(console, outcome)
        else:
            _render_run(console, run(args))
    except (UsageError, InputError, CapacityError, OSError) as err:
        print(f"iosim: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("iosim: interrupted", file=sys.stderr)
        return 130
    return 0
