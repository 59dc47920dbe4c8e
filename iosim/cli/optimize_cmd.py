"""``iosim optimize``: the tilings with the fewest exact HBM accesses that fit M, per algorithm."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field

from iosim.api import backward_of
from iosim.cli.common import (
    PASS_TITLES,
    Distinct,
    add_block_mask,
    add_l2_options,
    add_outputs,
    add_problem,
    algorithms_of,
    band_title,
    block_sparsity,
    check_backward,
    count_arg,
    hardware_of,
    kernel_reach,
    l2_overrides,
    maskless_algorithms,
    window_of,
)
from iosim.cli.progress import progress_bar
from iosim.cli.render import compact_table, eng, nbytes, print_table
from iosim.core.errors import InputError
from iosim.core.gpus import GPUS, resolve_M
from iosim.core.tiling import tiling_record
from iosim.gpu.l2 import dram_record
from iosim.registry import ALGORITHMS
from iosim.reports.optimize import DRAM_CANDIDATES, OBJECTIVES, TOP_DEFAULT, Optimum, optimize
from iosim.reports.records import check_distinct, check_output_path, write_records


@dataclass(frozen=True)
class OptimizeOutcome:
    results: list  # per algorithm: an Optimum, or the error (no fit, search too large) in its place
    notes: tuple[str, ...] = ()  # options that some of the algorithms ignore (a --kernel of another algorithm)
    settings: dict = field(default_factory=dict)  # what every record was searched under: objective, pass, GPU, L2

    def records(self) -> list[dict]:
        """One record per tiling shown: the problem, the rank, the tiling and its traffic, and the policies'."""
        out = []
        for r in self.results:
            if not isinstance(r, Optimum):
                continue
            bs = r.problem.block_sparsity
            config = dict(algorithm=r.algorithm, **r.problem.record(), M=r.M, **self.settings, searched=r.searched,
                          sparsity=getattr(bs, "sparsity", None), sparsity_pattern=getattr(bs, "pattern", None),
                          sparsity_seed=getattr(bs, "seed", None))
            policies = {f"{name}_{key}": getattr(getattr(r, name), key, None)
                        for name in ("fit", "paper") for key in ("traffic", "c")}
            for rank, x in enumerate(r.best, 1):
                dram = dram_record(None if r.dram is None else r.dram[rank - 1])
                out.append({**config, "rank": rank, **tiling_record(x.tiling), "traffic": x.traffic,
                            "traffic_bytes": x.traffic_bytes, "working_set": x.working_set, "c": x.c,
                            "simulated": r.measured.total if rank == 1 else None, **policies, **dram})
        return out


def add_parser(sub) -> None:
    p = sub.add_parser("optimize", help="the tilings with the fewest exact HBM accesses that fit M, per algorithm")
    p.add_argument("--N", type=count_arg, required=True, help="query length N_q")
    p.add_argument("--N-k", type=count_arg, default=None, help="key/value length (default: N)")
    p.add_argument("--d", type=count_arg, required=True)
    p.add_argument("--d-v", type=count_arg, default=None, help="head size of V and O, apart from Q's and K's --d "
                                                              "(default: d)")
    p.add_argument("--M", default=None, help="SRAM capacity, as for sweep: 100k, 64Ki, 192KiB (default 100k, or "
                                             "with --gpu its shared memory per SM)")
    p.add_argument("--gpu", type=str.lower, choices=sorted(GPUS), default=None,
                   help="hardware preset: sets M, as for sweep")
    add_l2_options(p)
    p.add_argument("--objective", choices=OBJECTIVES, default="hbm",
                   help=f"what to minimize: hbm, the two-level count (default), or dram, the DRAM bytes behind "
                        f"--gpu's L2, over the {DRAM_CANDIDATES} tilings of least HBM traffic (forward passes)")
    p.add_argument("--pass", dest="pass_", choices=("fwd", "bwd"), default="fwd",
                   help="the pass whose tilings to search: fwd (default) or bwd (each pass has its own tiling)")
    p.add_argument("--algo", choices=maskless_algorithms(), nargs="+", action=Distinct, default=None,
                   help="default: every algorithm but the block-sparse ones")
    add_problem(p)
    p.add_argument("--page-size", type=count_arg, default=None,
                   help="split-kv, flash-swapped: K/V in a paged cache of pages of this many tokens; the search takes "
                        "K/V blocks of whole pages or within one (default: contiguous)")
    add_block_mask(p)
    p.add_argument("--top", type=count_arg, default=TOP_DEFAULT, help=f"tilings shown per algorithm (default "
                                                                      f"{TOP_DEFAULT})")
    add_outputs(p, "the tilings")


def run(args: argparse.Namespace, on_row: Callable[[object], None] | None = None) -> OptimizeOutcome:
    """Search every algorithm's tilings; ``on_row`` sees each algorithm's optimum as it is found."""
    M = resolve_M(args.M, args.gpu, args.dtype)
    hw = hardware_of(args)
    algorithms = covered(args)
    check_backward(algorithms, args.pass_)
    check_distinct({"json": check_output_path("json", args.json), "csv": check_output_path("csv", args.csv)})
    if args.pass_ != "fwd" and args.kv_heads not in (None, args.heads):
        raise InputError(f"--kv-heads {args.kv_heads} with --pass {args.pass_}: the backward passes take kv_heads "
                         f"== heads={args.heads} (grouped-query attention is forward only)")
    passes = [ALGORITHMS[a] if args.pass_ == "fwd" else backward_of(ALGORITHMS[a]) for a in algorithms]
    if args.objective == "dram" and (args.gpu is None or args.pass_ != "fwd"):
        raise InputError(f"--objective dram{'' if args.gpu else ' without --gpu'}"
                         f"{'' if args.pass_ == 'fwd' else f' with --pass {args.pass_}'}: the DRAM bytes are those "
                         f"behind a GPU preset's L2, for forward passes; allowed: --gpu NAME --pass fwd")
    given = l2_overrides(args)
    if args.objective != "dram" and given:
        name, value = next(iter(given.items()))
        raise InputError(f"{name} {value} with --objective {args.objective}: it changes the DRAM bytes behind the L2, "
                         f"which only --objective dram counts; allowed: --objective dram, or no {name}")
    reach = kernel_reach(args, algorithms)
    outcome = OptimizeOutcome(optimize(passes, N=args.N, N_k=args.N_k,
                                       d=args.d, M=M, batch=args.batch, heads=args.heads, kv_heads=args.kv_heads,
                                       causal=args.causal, dtype=args.dtype, top=args.top, objective=args.objective,
                                       gpu=args.gpu, on_done=on_row, window=window_of(args),
                                       page_size=args.page_size, hw=hw, kernel=args.kernel,
                                       block_sparsity=block_sparsity(args), d_v=args.d_v),
                             () if reach is None else (reach,),
                             {"objective": args.objective, "pass": args.pass_,
                              "gpu": None if hw is None else hw.gpu.name,
                              **(hw.overrides() if hw is not None else {"l2_bytes": None, "blocks_per_sm": None,
                                                                          "schedule": None}),
                              "kernel": args.kernel})
    write_records(args.json, args.csv, outcome.records())
    return outcome


def covered(args: argparse.Namespace) -> list[str]:
    """The algorithms searched: those named, else those that apply (with --page-size, those that read pages)."""
    algorithms = algorithms_of(args)
    if args.page_size is not None and args.algo is None:
        return [a for a in algorithms if ALGORITHMS[a].accepts("page_size")]
    return algorithms


def main(args: argparse.Namespace, console) -> None:
    with progress_bar(console, "optimize", len(covered(args))) as step:
        outcome = run(args, on_row=step)
    render(console, outcome, args.pass_)


def mask_title(pb) -> str:
    """", a {pattern} block mask, s = {sparsity}" where the problem has a drawn block mask, else nothing."""
    bs = pb.block_sparsity
    if bs is None:
        return ""
    return ", an explicit block mask" if bs.blocks is not None else f", a {bs.pattern} block mask, s = {bs.sparsity:g}"


def render(console, outcome: OptimizeOutcome, pass_: str = "fwd") -> None:
    if any(isinstance(r, Optimum) and r.dram is not None for r in outcome.results):
        return render_dram(console, outcome)
    found = [r for r in outcome.results if isinstance(r, Optimum)]
    first = found[0]
    s = first.problem.shape
    console.print(f"N_q={s.n_q:,}, N_k={s.n_k:,}, d={s.d}{f', d_v={s.d_v}' if s.d_v != s.d else ''}, "
                  f"batch·heads={s.bh}, M={first.M:,} elements, "
                  f"{band_title(first.problem)}, {PASS_TITLES[pass_]}"
                  f"{f', K/V in pages of {first.problem.page_size} tokens' if first.problem.page_size else ''}"
                  f"{mask_title(first.problem)}"
                  f". The best tilings of each "
                  f"algorithm (ties in traffic shown once): HBM elements over all batch·heads, the working set (SRAM) "
                  f"per head, and c = traffic·M/(N_q·N_k·d²) per head, beside the c of the fit and paper block "
                  f"policies (— where the policy overflows M)")
    table = compact_table(("algorithm", "B_r×B_c", "HBM total", "bytes", "SRAM", "c", "fit c", "paper c"))
    for r in found:
        name = r.algorithm.removesuffix(" backward")  # the pass is in the title
        policy_c = [eng(p.c) if p else "—" for p in (r.fit, r.paper)]
        for rank, x in enumerate(r.best, 1):
            table.add_row(name if rank == 1 else "", f"{x.tiling.Br}×{x.tiling.Bc}", eng(x.traffic),
                          nbytes(x.traffic_bytes), eng(x.working_set), eng(x.c),
                          *(policy_c if rank == 1 else ("", "")), end_section=rank == len(r.best))
    print_table(console, table)
    for r in outcome.results:
        if not isinstance(r, Optimum):
            console.print(f"[yellow]{r}[/]")
    best = min(found, key=lambda r: r.best[0].traffic)
    x = best.best[0]
    console.print(f"least traffic: {best.algorithm} with B_r={x.tiling.Br}, B_c={x.tiling.Bc}: {x.traffic:,} elements "
                  f"(c = {x.c:.2f}), simulated count-only: {best.measured.total:,}; "
                  f"{sum(r.searched for r in found):,} tilings searched")


def render_dram(console, outcome: OptimizeOutcome) -> None:
    """The tilings ranked by DRAM bytes: each with its two-level bytes beside the DRAM reads, writes and total."""
    found = [r for r in outcome.results if isinstance(r, Optimum)]
    s = found[0].problem.shape
    console.print(f"N_q={s.n_q:,}, N_k={s.n_k:,}, d={s.d}, batch·heads={s.bh}, M={found[0].M:,} elements, "
                  f"{'causal' if found[0].problem.causal else 'no mask'}, forward. Of the {DRAM_CANDIDATES} tilings "
                  f"of least HBM traffic, those moving the fewest DRAM bytes behind the L2 (reads, writes during "
                  f"the kernel and dirty bytes written back after; L2 model: docs/gpu.md)")
    table = compact_table(("algorithm", "B_r×B_c", "HBM bytes", "DRAM read", "DRAM write", "DRAM moved", "blocks"))
    for r in found:
        for rank, (x, dram) in enumerate(zip(r.best, r.dram), 1):
            table.add_row(r.algorithm if rank == 1 else "", f"{x.tiling.Br}×{x.tiling.Bc}", nbytes(x.traffic_bytes),
                          nbytes(dram.reads), nbytes(dram.writes + dram.dirty_at_end), nbytes(dram.moved),
                          f"{dram.concurrent:,}", end_section=rank == len(r.best))
    print_table(console, table)
    for r in outcome.results:
        if not isinstance(r, Optimum):
            console.print(f"[yellow]{r}[/]")
    for note in outcome.notes:
        console.print(f"[yellow]{note}[/]")
    best = min(found, key=lambda r: r.dram[0].moved)
    console.print(f"fewest DRAM bytes: {best.algorithm} with B_r={best.best[0].tiling.Br}, "
                  f"B_c={best.best[0].tiling.Bc}: {nbytes(best.dram[0].moved)} moved")
