"""``iosim sweep``: count-only traffic of every algorithm over a grid of N and d."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from iosim.api import count_problem
from iosim.cli.common import (
    PASS_TITLES,
    Distinct,
    add_simulation,
    algorithms_of,
    block_sparsity,
    check_backward,
    count_arg,
    documents,
    flex_mask_for,
    hardware_of,
    kernel_reach,
    left_out_by,
    lengths_of,
    score_mod_of,
    window_of,
)
from iosim.cli.progress import progress_bar
from iosim.cli.render import compact_table, count_text, eng, nbytes, print_table, seconds
from iosim.core.errors import InputError
from iosim.core.gpus import resolve_M
from iosim.core.units import DTYPE_ITEMSIZE, FP8_DTYPES
from iosim.gpu.kernel import check_launchable
from iosim.gpu.kernels import get_kernel, no_build
from iosim.registry import ALGORITHMS
from iosim.reports.records import RecordWriter
from iosim.reports.sweep import (
    DEFAULT_D,
    DEFAULT_N,
    RECORD_REVISION,
    RESUME_REQUIRED,
    SweepRow,
    config_key,
    current,
    rank_by_traffic,
    run_sweep,
    sweep_configs,
)
from iosim.variants.flex import MAX_PAIRS


@dataclass(frozen=True)
class SweepOutcome:
    rows: list[SweepRow]
    kept: list[dict]  # records of the grid's configurations that the --resume files already held
    notes: tuple[str, ...] = ()  # options that some algorithms of the grid ignore, and algorithms left out
    recounted: int = 0  # records of the --resume files made at another revision (RECORD_REVISION): counted again
    left_stale: int = 0  # and those outside this grid, kept as they were

    @property
    def skipped(self) -> int:
        return len(self.kept)


def notes(args: argparse.Namespace, algorithms: list[str]) -> tuple[str, ...]:
    """What the output must say: a sweep covers many algorithms, and an option applies only to some of them."""
    out = []
    for option, flag, value in (("splits", "--splits", args.splits), ("block_sparsity", "--sparsity", args.sparsity),
                                ("page_size", "--page-size", args.page_size)):
        ignoring = [a for a in algorithms if not ALGORITHMS[a].accepts(option)]
        if value is not None and ignoring:
            takers = [a for a in ALGORITHMS if ALGORITHMS[a].accepts(option)]
            out.append(f"{flag} {value:g} applies to {', '.join(takers)} only; ignored by {', '.join(ignoring)}")
    if args.algo is None:  # a window or packed documents leave out the algorithms that take none: say which
        for option, flag, value in (("window", "--window", args.window), ("seqlens", "--seqlens", documents(args)),
                                    ("sinks", "--sinks", args.sinks or None),
                                    ("latent", "--latent", args.latent or None),
                                    ("fp8", f"--dtype {args.dtype}", args.dtype if args.dtype in FP8_DTYPES else None)):
            if value is not None:
                left = left_out_by(option, args.pass_)
                what = {"window": "sliding window", "seqlens": "packed documents",
                        "sinks": "attention sinks" + (" in that pass" if args.pass_ != "fwd" else ""),
                        "latent": "latent cache" + (" in that pass" if args.pass_ != "fwd" else ""),
                        "fp8": "FP8 path" + (" in that pass" if args.pass_ != "fwd" else "")}[option]
                if left:
                    out.append(f"{flag} leaves out {', '.join(left)}: {'it takes' if len(left) == 1 else 'they take'} "
                               f"no {what}")
    reach = kernel_reach(args, algorithms)
    if reach is not None:
        out.append(reach)
    if args.gpu is not None:  # an option no kernel grid takes (the L2 model's own refusal) leaves rows no DRAM bytes
        N, masks = _Ns(args)[0], flex_mask_for(args)
        pb = count_problem(None if documents(args) else N, args.d[0], args.N_k, heads=args.heads,
                           kv_heads=args.kv_heads, causal=args.causal, window=window_of(args),
                           page_size=args.page_size, seqlens=documents(args), block_sparsity=block_sparsity(args),
                           sinks=args.sinks, d_v=args.d_v, latent=args.latent, dtype=args.dtype,
                           block_mask=None if masks is None else masks(N, args.N_k or N))
        try:
            check_launchable(pb, get_kernel(args.kernel).takes if args.kernel else ())
        except InputError as err:
            out.append(f"--gpu {args.gpu}: the rows counted with this option have no DRAM bytes, their time is from "
                       f"HBM bytes ({err})")
        lacking = no_build(algorithms, args.dtype, args.kernel)
        if lacking is not None:
            out.append(f"--dtype {lacking}")
    square = {"flash", "flash-swapped"} & set(args.algo or ALGORITHMS)  # their default kernels' tiles are square
    if args.gpu is not None and args.pass_ != "fwd" and args.kernel is None and square:
        out.append(f"--gpu {args.gpu} --pass {args.pass_}: the backward kernels of {' and '.join(sorted(square))} "
                   f"launch square tiles (B_r = B_c), so a row whose backward tiling is not square has no DRAM bytes"
                   + ("; for flash-swapped, --kernel sdpa-flash or fa3 launch their own" if "flash-swapped" in square
                      else ""))
    if args.algo is None and args.pass_ != "fwd":
        given = ("block_sparsity",) * (args.sparsity is not None) + ("block_mask",) * (args.flex_mask is not None)
        left = [name for name, a in ALGORITHMS.items() if a.backward is None and a.listed_by_default(given)]
        if left:
            out.append(f"--pass {args.pass_}: {', '.join(left)} have no backward pass and are not counted")
    return tuple(out)


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="count-only traffic of every algorithm over a grid of N and d")
    add_simulation(p)
    p.add_argument("--N", type=count_arg, nargs="+", action=Distinct, default=None,
                   help="sequence lengths, e.g. 1024 4Ki (default 256 … 65536)")
    p.add_argument("--N-k", type=count_arg, default=None, help="key/value length of every row (default: its N)")
    p.add_argument("--d", type=count_arg, nargs="+", action=Distinct, default=list(DEFAULT_D), help="head dimensions")
    p.add_argument("--algo", choices=list(ALGORITHMS), nargs="+", action=Distinct, default=None,
                   help="algorithms to count (default: all; the block-sparse ones only with --sparsity)")
    p.add_argument("--resume", action="store_true",
                   help="keep the records already in the --json/--csv file and skip their configurations")
    p.add_argument("--wide", action="store_true",
                   help="every column (reads, writes, exact prediction, paper's form): about 130 columns")


def run(args: argparse.Namespace, on_row: Callable[[SweepRow | None], None] | None = None) -> SweepOutcome:
    """Count the grid; ``on_row`` sees each row as it finishes (None for one skipped by --resume)."""
    M = resolve_M(args.M, args.gpu, args.dtype)
    if args.flex_mask is not None:  # every block mask is evaluated pair by pair: refuse a length too long at once
        longest = max(_Ns(args))
        if longest * (args.N_k or longest) > MAX_PAIRS:
            raise InputError(f"--flex-mask at N={longest:,}, N_k={args.N_k or longest:,}: a block mask evaluates "
                             f"every pair, at most {MAX_PAIRS:.0e}; allowed: --N such that N·N_k <= {MAX_PAIRS:.0e}")
    sparsity = block_sparsity(args)
    hw = hardware_of(args)
    algorithms = algorithms_of(args)
    check_backward(algorithms, args.pass_)
    if args.resume and not (args.json or args.csv):
        raise InputError("--resume needs --json PATH or --csv PATH: the file whose records to keep")
    said = notes(args, algorithms)  # before any work: a --kernel that serves none of the algorithms is refused
    kept: list[dict] = []
    with RecordWriter(args.json, args.csv, resume=args.resume, key=config_key, required=RESUME_REQUIRED,
                      current=current) as writer:
        rows = run_sweep(algorithms, _Ns(args), args.d, M, N_k=args.N_k, seqlens=documents(args), batch=args.batch,
                         heads=args.heads, kv_heads=args.kv_heads, splits=args.splits, causal=args.causal,
                         window=window_of(args), dtype=args.dtype, block_policy=args.block_policy, writer=writer,
                         on_row=on_row, pass_=args.pass_, gpu=args.gpu, block_sparsity=sparsity, kept=kept,
                         page_size=args.page_size, hw=hw, kernel=args.kernel, sinks=args.sinks, d_v=args.d_v,
                         latent=args.latent, block_mask_for=flex_mask_for(args), score_mod=score_mod_of(args))
    return SweepOutcome(rows, kept, said, writer.recounted, writer.left_stale)


def _Ns(args: argparse.Namespace) -> list[int]:
    """The lengths of the grid: --N, the default grid, or with --seqlens the longest document alone (with a
    FlexAttention document mask, their sum)."""
    return lengths_of(args, list(DEFAULT_N)) if args.seqlens is None else [lengths_of(args, None)]


def main(args: argparse.Namespace, console) -> None:
    if args.wide and not console.is_terminal:
        from rich.console import Console

        console = Console(width=132 + 48 * (args.gpu is not None))  # piped output: as wide as the --wide table
    with progress_bar(console, "sweep", len(sweep_configs(algorithms_of(args), _Ns(args), args.d))) as step:
        outcome = run(args, on_row=step)
    render(console, outcome, args.wide)


def _setting(first: SweepRow, rows: list[SweepRow]) -> str:
    options = [f"M = {first.M:,} elements ({nbytes(first.M * DTYPE_ITEMSIZE[first.dtype])} of {first.dtype})",
               f"batch·heads = {first.batch * first.heads}",
               f"FlexAttention mask {first.flex_mask}" if first.flex_mask else "causal" if first.causal else "no mask",
               *([f"score_mod {first.score_mod}"] if first.score_mod else []),
               *([f"window ({first.window_left}, {first.window_right})"] if first.window_left is not None else []),
               *(["learned attention sinks, one logit per query head"] if first.sinks else []),
               *([f"N_k = {first.N_k:,} (N is N_q)"] if any(r.N_k != r.N for r in rows) else []),
               f"block policy {first.block_policy}"]
    sparse = next((r for r in rows if r.sparsity is not None), None)
    if sparse is not None:
        options.append(f"block-sparse rows: {sparse.sparsity_pattern} block mask, s = {sparse.sparsity:g}")
    if first.seqlens is not None:
        lengths = [int(x) for x in first.seqlens.split()]
        options.append(f"{len(lengths)} documents packed end to end ({sum(lengths):,} tokens, the longest "
                       f"{max(lengths):,}: N), each attending only to itself; ÷ padded: traffic over that of padding "
                       f"every document to the longest")
    paged = next((r for r in rows if r.page_size is not None), None)
    if paged is not None:
        options.append(f"paged K/V cache of {paged.page_size}-token pages, read by rows (the algorithms that read one)")
    if first.roofline is not None:
        options.append(f"{first.roofline.gpu} preset: DRAM bytes behind its L2 where the algorithm's kernel grid "
                       f"is declared (iosim.gpu.l2), and the roofline time, a lower bound, from them (else from HBM "
                       f"bytes)")
        if first.schedule == "timed":
            options.append("the timed schedule (blocks at their own speed, stalling on their L2 misses; their speeds "
                           "spread 0.5 %, the middle of the 0 to 1 % call 3 measured; the fewest and most reads over "
                           "that range are in the records, dram_read_low and dram_read_high)")
        elif first.schedule is not None:
            options.append(f"the {first.schedule} schedule (--schedule)")
        own = sorted({r.kernel for r in rows if r.kernel is not None and get_kernel(r.kernel).tile is not None})
        if own:
            options.append(f"{', '.join(own)}'s DRAM bytes at the tiles the kernel launches (`iosim kernels`), the "
                           f"HBM bytes at the block policy's tiles")
    if first.pass_ != "fwd":
        options.append(PASS_TITLES[first.pass_])
    unit = "HBM and DRAM traffic in bytes" if first.roofline is not None else "HBM traffic in elements"
    return f"{unit}, over all batch·heads: " + ", ".join(options)


def render(console, outcome: SweepOutcome, wide: bool) -> None:
    rows = outcome.rows
    if outcome.skipped:
        console.print(f"{outcome.skipped} configurations were already in the file and were skipped (--resume)")
    if outcome.recounted:
        console.print(f"{outcome.recounted} records in the file were made at another revision than {RECORD_REVISION} "
                      f"(an earlier release's numbers) and were counted again (--resume)")
    if outcome.left_stale:
        console.print(f"{outcome.left_stale} records in the file of another revision than {RECORD_REVISION} are "
                      f"outside this grid and were kept as they were: their revision field says which (--resume)")
    for note in outcome.notes:
        console.print(f"[yellow]{note}[/]")
    if not rows:
        return
    console.print(_setting(rows[0], rows))
    table = compact_table()

    def tile(r: SweepRow) -> str:
        return "—" if r.counts is None else "/".join(
            f"{t.Br}×{t.Bc}" for t in (r.forward_tiling, r.backward_tiling) if t is not None)

    def exact(r: SweepRow) -> str:
        return "—" if r.ratio is None else "yes" if r.total == r.predicted else f"{r.ratio:.4f}"

    def peak(r: SweepRow) -> str:
        return "overflow" if r.peak_sram is None else f"{r.peak_fraction:.3f}"

    def head_sizes(r: SweepRow) -> str:  # d, or d/d_v where V's head size differs
        return str(r.d) if r.d_v is None else f"{r.d}/{r.d_v}"

    if wide:
        columns = [("algorithm", lambda r: r.algorithm), ("N", lambda r: count_text(r.N)), ("d", head_sizes),
                   ("B_r×B_c", tile), ("HBM reads", lambda r: eng(r.reads)), ("writes", lambda r: eng(r.writes)),
                   ("total", lambda r: eng(r.total)), ("bytes", lambda r: nbytes(r.total_bytes)),
                   ("exact prediction", lambda r: eng(r.predicted)), ("paper's form", lambda r: eng(r.paper)),
                   ("meas/pred", lambda r: "—" if r.ratio is None else f"{r.ratio:.6f}"), ("peak SRAM/M", peak)]
    else:
        columns = [("algorithm", lambda r: r.algorithm), ("N", lambda r: count_text(r.N)), ("d", head_sizes),
                   ("B_r×B_c", tile), ("HBM total", lambda r: eng(r.total)), ("bytes", lambda r: nbytes(r.total_bytes)),
                   ("= pred", exact), ("peak/M", peak)]
        # two tilings a row: room made for them
        if any(None not in (r.forward_tiling, r.backward_tiling) for r in rows):
            columns = [c for c in columns if c[0] != "peak/M"]
    if rows[0].roofline is not None:  # a GPU preset: bytes and FLOPs become a time
        kept = columns if wide else [c for c in columns if c[0] in ("algorithm", "N", "d")]
        columns = kept + [
            ("HBM B", lambda r: nbytes(r.total_bytes)),
            ("DRAM B", lambda r: "—" if r.dram is None else nbytes(r.dram_bytes) + ("*" if r.bracketed else "")),
            ("FLOPs", lambda r: "—" if r.flops is None else eng(r.flops.matmul)),
            ("FLOP/B", lambda r: "—" if r.roofline is None else eng(r.roofline.intensity)),
            ("time", lambda r: "—" if r.roofline is None else seconds(r.roofline.seconds)),
            ("bound", lambda r: "—" if r.roofline is None else r.roofline.bound),
        ]
    packing = ("÷ padded", lambda r: "—" if r.packing_ratio is None else f"{r.packing_ratio:.3f}")
    packed = any(r.padded is not None for r in rows)  # packed documents: their traffic over padding each to the longest
    if packed and rows[0].roofline is None:  # a preset's columns leave no room: a line below the table instead
        columns.append(packing)
    for name, _ in columns:
        table.add_column(name, justify="left" if name in ("algorithm", "bound") else "right", no_wrap=True)
    for r in rows:
        table.add_row(*(cell(r) for _, cell in columns))
    print_table(console, table)
    if packed and rows[0].roofline is not None:
        console.print("÷ padded: " + ", ".join(f"{r.algorithm} (d={r.d}) {packing[1](r)}" for r in rows))
    for r in rows:
        if r.status != "ok":
            console.print(f"[yellow]{r.algorithm} N={r.N} d={r.d}: {r.status}[/]")
            break
    why: dict[str, list[str]] = {}  # each note once, with the algorithms of its rows: "—" under DRAM B says why,
    for r in rows:
        if r.dram_note and not any(r.dram_note in said for said in outcome.notes):  # unless a note above said it
            why.setdefault(r.dram_note, [])
            if r.algorithm not in why[r.dram_note]:
                why[r.dram_note].append(r.algorithm)
    for note, algorithms in why.items():
        console.print(f"[yellow]DRAM B — ({', '.join(algorithms)}): {note}[/]")
    bracketed = [r for r in rows if r.bracketed]
    if bracketed:
        console.print("[yellow]DRAM B *: bracketed, not predicted: the blocks' spread of speeds (0 to 1 %) moves the "
                      "DRAM reads by more than 10 %: " + "; ".join(
                          f"{r.algorithm} N={r.N} d={r.d} reads {nbytes(r.dram_band_reads[0])} to "
                          f"{nbytes(r.dram_band_reads[1])} (spread 0.5 %: {nbytes(r.dram.reads)})" for r in bracketed)
                      + "[/]")
    labels = {r.algorithm: r.paper_label for r in rows}
    console.print("Paper's forms: " + "; ".join(f"{a}: {label}" for a, label in labels.items()))
    _render_ranking(console, [dict(algorithm=r.algorithm, N=r.N, d=r.d, total=r.total) for r in rows] + outcome.kept)


def _render_ranking(console, records: list[dict]) -> None:
    """The summary ranks every configuration of the grid: those counted now and those a resumed file held."""
    from rich import box
    from rich.table import Table

    ranking = rank_by_traffic(records)
    if not ranking or len({r["algorithm"] for r in records}) < 2:
        return
    table = Table(box=box.SIMPLE_HEAD, title="least traffic at each (N, d), and each other algorithm's ÷ it",
                  header_style="bold")
    for name in ("N", "d", "least", "others ÷ least"):
        table.add_column(name, justify="left" if name in ("least", "others ÷ least") else "right")
    for x in ranking:
        others = ", ".join(f"{a} {ratio:.2f}×" for a, ratio in sorted(x.ratios.items(), key=lambda kv: kv[1])
                           if a != x.best)
        table.add_row(count_text(x.N), str(x.d), x.best, others or "—")
    print_table(console, table)
