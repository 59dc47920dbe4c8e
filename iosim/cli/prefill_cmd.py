"""``iosim prefill``: the traffic of prefilling a prompt in chunks, over a list of chunk sizes."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from iosim.cli.common import Distinct, add_outputs, count_arg, maskless_algorithms, tokens_arg
from iosim.cli.progress import progress_bar
from iosim.cli.render import compact_table, count_text, eng, nbytes, print_table
from iosim.core.gpus import GPUS, preset_name, resolve_M
from iosim.core.units import DTYPE_ITEMSIZE, FP8_DTYPES
from iosim.registry import ALGORITHMS
from iosim.reports.records import RecordWriter, check_distinct, check_output_path
from iosim.serving.chunked import ChunkedPrefill, chunked_prefill
from iosim.tilings.policies import POLICIES

DEFAULT_ALGOS = ("flash", "flash-swapped")  # the causal-skipping algorithms a serving engine prefills with


@dataclass(frozen=True)
class PrefillOutcome:
    results: list[ChunkedPrefill]  # per (algorithm, chunk size), in the order asked
    notes: tuple[str, ...] = ()  # the default algorithms the dtype left out


def add_parser(sub) -> None:
    p = sub.add_parser("prefill", help="HBM traffic of prefilling a prompt of N tokens in chunks of C, for each C "
                                       "(chunked prefill against the cached K/V of the chunks before)")
    p.add_argument("--N", type=count_arg, required=True, help="prompt length: new tokens to prefill, e.g. 32Ki")
    p.add_argument("--chunk", type=count_arg, nargs="+", action=Distinct, required=True,
                   help="chunk sizes C, e.g. 256 512 2Ki (a C of N or more is one plain causal prefill)")
    p.add_argument("--prefix", type=tokens_arg, default=0,
                   help="cached tokens before the prompt (a prefix-cache hit), read by every chunk (default 0)")
    p.add_argument("--d", type=count_arg, required=True)
    p.add_argument("--M", default=None, help="SRAM capacity, as for sweep: 100k, 64Ki, 192KiB (default 100k, or "
                                             "with --gpu its shared memory per SM)")
    p.add_argument("--gpu", type=str.lower, choices=sorted(GPUS), default=None,
                   help="hardware preset: sets M, as for sweep")
    p.add_argument("--algo", choices=maskless_algorithms(), nargs="+", action=Distinct, default=None,
                   help=f"algorithms to count (default: {' '.join(DEFAULT_ALGOS)}, those of them with an FP8 path "
                        f"in an FP8 dtype)")
    p.add_argument("--batch", type=count_arg, default=1)
    p.add_argument("--heads", type=count_arg, default=1)
    p.add_argument("--kv-heads", type=count_arg, default=None,
                   help="K/V heads shared by the query heads (grouped-query attention), a divisor of --heads")
    p.add_argument("--dtype", choices=sorted(DTYPE_ITEMSIZE), default="float16",
                   help="element size for bytes and for M given in bytes (default float16)")
    p.add_argument("--block-policy", choices=list(POLICIES), default="fit",
                   help="how each chunk's tiling is chosen, as for sweep (default fit)")
    add_outputs(p, "one record per (algorithm, chunk size)")


def run(args: argparse.Namespace, on_row: Callable[[ChunkedPrefill], None] | None = None) -> PrefillOutcome:
    """Count every (algorithm, chunk size); ``on_row`` sees each as it is done."""
    check_distinct({"json": check_output_path("json", args.json), "csv": check_output_path("csv", args.csv)})
    M = resolve_M(args.M, args.gpu, args.dtype)
    algorithms, notes = covered(args)
    results = []
    setting = dict(gpu=preset_name(args.gpu), block_policy=args.block_policy)  # options that change the counts
    with RecordWriter(args.json, args.csv) as writer:  # each row journaled as it ends: an interrupt keeps them
        for algo in algorithms:
            for C in args.chunk:
                results.append(chunked_prefill(algo, N=args.N, C=C, d=args.d, M=M, prefix=args.prefix,
                                               batch=args.batch, heads=args.heads, kv_heads=args.kv_heads,
                                               dtype=args.dtype, block_policy=args.block_policy, gpu=args.gpu))
                writer.add(dict(results[-1].record(), **setting))
                if on_row is not None:
                    on_row(results[-1])
    return PrefillOutcome(results, notes)


def covered(args: argparse.Namespace) -> tuple[list[str], tuple[str, ...]]:
    """The algorithms counted (those named, else the defaults, in an FP8 dtype those with an FP8 path), and a note
    naming the defaults left out."""
    if args.algo is not None:
        return args.algo, ()
    given = ("fp8",) if args.dtype in FP8_DTYPES else ()
    taken = [a for a in DEFAULT_ALGOS if ALGORITHMS[a].listed_by_default(given)]
    left = [a for a in DEFAULT_ALGOS if a not in taken]
    return taken, ((f"--dtype {args.dtype} leaves out {', '.join(left)}: no FP8 path",) if left else ())


def main(args: argparse.Namespace, console) -> None:
    with progress_bar(console, "prefill", len(covered(args)[0]) * len(args.chunk)) as step:
        outcome = run(args, on_row=step)
    render(console, outcome)


def render(console, outcome: PrefillOutcome) -> None:
    first = outcome.results[0]
    s = first.problem.shape
    console.print(f"a prompt of N = {first.N:,} tokens after {first.prefix:,} cached, prefilled in chunks of C "
                  f"(causal, bottom-right), d = {s.d}, batch·heads = {s.bh}, M = {first.M:,} elements: HBM elements "
                  f"over all batch·heads, and the traffic over one unchunked prefill (C = N)")
    table = compact_table(("algorithm", "C", "chunks", "HBM total", "bytes", "K+V reads", "÷ C = N"))
    for r in outcome.results:
        t = r.traffic
        table.add_row(r.algorithm, count_text(r.C), count_text(r.chunks), eng(t.total), nbytes(t.total_bytes),
                      eng(t.tensor("K").reads + t.tensor("V").reads), f"{r.ratio:.3f}")
    print_table(console, table)
    for note in outcome.notes:
        console.print(f"[yellow]{note}[/]")
