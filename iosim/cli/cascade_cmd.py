"""``iosim cascade``: decoding a batch that shares a prompt prefix, the shared K/V read once, against each request
reading its whole cache (iosim.serving.cascade)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from iosim.cli.common import Distinct, add_outputs, add_problem, count_arg, tokens_arg
from iosim.cli.progress import progress_bar
from iosim.cli.render import compact_table, count_text, nbytes, print_table
from iosim.core.gpus import GPUS, preset_name, resolve_M
from iosim.reports.records import RecordWriter, check_distinct, check_output_path
from iosim.serving.cascade import Cascade, cascade, kv_reads, merging_algorithms
from iosim.tilings.policies import POLICIES

DEFAULT_ALGOS = ("split-kv",)  # Flash-Decoding: what a serving engine decodes with


@dataclass(frozen=True)
class CascadeOutcome:
    results: list[Cascade]  # per (algorithm, prefix, batch), in the order asked


def add_parser(sub) -> None:
    p = sub.add_parser("cascade", help="decoding a batch whose requests share a prompt prefix: cascade attention "
                                       "reads the shared K/V once; against decoding each request on its own")
    p.add_argument("--prefix", type=count_arg, nargs="+", action=Distinct, required=True,
                   help="shared prefix lengths P in tokens, e.g. 4Ki 32Ki (whole pages with --page-size)")
    p.add_argument("--suffix", type=tokens_arg, default=0,
                   help="tokens of each request's own after the prefix (default 0: the whole context is shared)")
    p.add_argument("--N", type=count_arg, default=1, help="queries per request: 1 to decode a token (default 1)")
    p.add_argument("--d", type=count_arg, required=True)
    p.add_argument("--M", default=None, help="SRAM capacity, as for sweep: 100k, 64Ki, 192KiB (default 100k, or "
                                             "with --gpu its shared memory per SM)")
    p.add_argument("--gpu", type=str.lower, choices=sorted(GPUS), default=None,
                   help="hardware preset: sets M and the SMs the default K/V splits fill, as for sweep")
    p.add_argument("--algo", choices=merging_algorithms(), nargs="+", action=Distinct, default=list(DEFAULT_ALGOS),
                   help=f"algorithm of each level and of the separate decode (default: {' '.join(DEFAULT_ALGOS)})")
    add_problem(p, windowed=False, batches=True)
    p.add_argument("--page-size", type=count_arg, default=None,
                   help="K/V in a paged cache of pages of this many tokens (default: contiguous)")
    p.add_argument("--block-policy", choices=list(POLICIES), default="fit",
                   help="how each level's tiling is chosen, as for sweep (default fit)")
    add_outputs(p, "one record per (algorithm, prefix, batch)")


def run(args: argparse.Namespace, on_row: Callable[[Cascade], None] | None = None) -> CascadeOutcome:
    """Count every (algorithm, prefix, batch); ``on_row`` sees each as it is done."""
    check_distinct({"json": check_output_path("json", args.json), "csv": check_output_path("csv", args.csv)})
    M = resolve_M(args.M, args.gpu, args.dtype)
    results = []
    setting = dict(gpu=preset_name(args.gpu), block_policy=args.block_policy)  # options that change the counts
    with RecordWriter(args.json, args.csv) as writer:  # each row journaled as it ends: an interrupt keeps them
        for algo in args.algo:
            for P in args.prefix:
                for B in args.batch:
                    results.append(cascade(algo, batch=B, prefix=P, suffix=args.suffix, d=args.d, M=M, N=args.N,
                                           heads=args.heads, kv_heads=args.kv_heads, causal=args.causal,
                                           dtype=args.dtype, page_size=args.page_size,
                                           block_policy=args.block_policy, gpu=args.gpu))
                    writer.add(dict(results[-1].record(), **setting))
                    if on_row is not None:
                        on_row(results[-1])
    return CascadeOutcome(results)


def main(args: argparse.Namespace, console) -> None:
    with progress_bar(console, "cascade", len(args.algo) * len(args.prefix) * len(args.batch)) as step:
        outcome = run(args, on_row=step)
    render(console, outcome)


def render(console, outcome: CascadeOutcome) -> None:
    first = outcome.results[0]
    s, pb = first.problem.shape, first.problem
    paging = f"pages of {pb.page_size} tokens" if pb.page_size else "contiguous K/V"
    console.print(f"decoding B requests of N_q = {s.n_q} over a shared prefix of P tokens and {first.suffix:,} of "
                  f"their own, d = {s.d}, heads = {s.heads}, kv_heads = {s.kv_heads}, {paging}, M = {first.M:,} "
                  f"elements: HBM bytes of cascade attention (prefix level, suffix level, merge) against each "
                  f"request reading its whole cache (separate), and the K+V reads of one over the other")
    table = compact_table(("algorithm", "P", "B", "cascade", "separate", "÷ separate", "K+V ÷ separate"))
    for r in outcome.results:
        t, sep = r.traffic, r.separate.traffic
        table.add_row(r.algorithm, count_text(r.prefix), count_text(r.problem.shape.batch), nbytes(t.total_bytes),
                      nbytes(sep.total_bytes), f"{r.ratio:.3f}", f"{kv_reads(t) / kv_reads(sep):.3f}")
    print_table(console, table)
    console.print("attention only: the MLP, the KV-cache capacity and what the L2 would serve of shared pages are "
                  "not modelled")
