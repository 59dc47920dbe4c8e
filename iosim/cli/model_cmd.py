"""``iosim model``: a whole model's attention, per layer and for every layer, in training, prefill and decoding."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from iosim.cli.common import Distinct, add_outputs, count_arg, maskless_algorithms
from iosim.cli.progress import progress_bar
from iosim.cli.render import compact_table, eng, nbytes, print_table, seconds
from iosim.core.errors import InputError
from iosim.core.gpus import DEFAULT, GPUS
from iosim.core.units import DTYPE_ITEMSIZE
from iosim.models.config import ModelConfig
from iosim.models.cost import (
    ATTENTION_ONLY,
    PHASES,
    AlgorithmCost,
    ModelReport,
    PhaseCost,
    check_algorithms,
    model,
    plan_phases,
)
from iosim.models.hf_config import load_config
from iosim.models.presets import PRESETS, get_model
from iosim.models.records import records
from iosim.reports.bound import check_plot_path
from iosim.reports.model_plot import plot
from iosim.reports.records import RecordWriter, check_distinct, writing

WIDTH, WIDE = 80, 130  # the tables' width by default (piped output gets it too) and with --wide


def add_parser(sub) -> None:
    p = sub.add_parser("model", help="a whole model's attention: HBM bytes, FLOPs and roofline time per layer and "
                                     "in all, for a training step, prefill and each decoded token")
    p.add_argument("name", nargs="?", choices=sorted(PRESETS), default=None,
                   help="a preset, its numbers from the model's published config.json (or --config)")
    p.add_argument("--config", metavar="FILE.json",
                   help="a Hugging Face config.json of your own (read, never downloaded) instead of a preset")
    p.add_argument("--N", type=count_arg, nargs="+", action=Distinct, default=None,
                   help="sequence lengths of training and prefill, e.g. 4Ki 32Ki (default: max_position_embeddings)")
    p.add_argument("--context", type=count_arg, nargs="+", action=Distinct, default=None,
                   help="context lengths of decoding, one token against that many keys (default: each --N)")
    p.add_argument("--batch", type=count_arg, default=1)
    p.add_argument("--gpu", type=str.lower, choices=sorted(GPUS), default=DEFAULT,
                   help=f"hardware preset: M, bandwidth and peak FLOP/s of the roofline (default {DEFAULT})")
    p.add_argument("--dtype", choices=sorted(DTYPE_ITEMSIZE), default="float16",
                   help="element size, and the peak FLOP/s of the roofline (default float16)")
    p.add_argument("--M", default=None,
                   help="SRAM capacity, e.g. 100k elements or 192KiB (default: the --gpu preset's shared memory per "
                        "SM; an --M up to that wins)")
    p.add_argument("--algo", choices=maskless_algorithms(), nargs="+", action=Distinct, default=None,
                   help="algorithms to count (default: all but the block-sparse ones, which need a block mask)")
    p.add_argument("--phase", choices=PHASES, nargs="+", action=Distinct, default=list(PHASES),
                   help="phases to count (default: all)")
    p.add_argument("--plot", metavar="PNG", type=Path, default=None,
                   help="draw each phase's bytes and FLOPs per algorithm, stacked by kind of layer")
    p.add_argument("--wide", action="store_true",
                   help=f"every column (FLOPs, the sums of HBM, DRAM and FLOPs), {WIDE} columns wide; by default the "
                        f"tables fit {WIDTH}")
    add_outputs(p, "one record per (phase, algorithm, kind of layer)")


def config_of(args: argparse.Namespace) -> ModelConfig:
    if (args.name is None) == (args.config is None):
        raise InputError(f"give a model name ({', '.join(sorted(PRESETS))}) or --config FILE.json, not both")
    return get_model(args.name) if args.config is None else load_config(args.config)


def run(args: argparse.Namespace, on_row: Callable[[AlgorithmCost], None] | None = None) -> ModelReport:
    """Count the model; ``on_row`` sees each (phase, algorithm) as it is done; ``--plot`` draws it."""
    cfg = config_of(args)
    if args.plot is not None:
        check_plot_path(args.plot, "plot")
        check_distinct({what: None if path is None else Path(path)
                        for what, path in (("json", args.json), ("csv", args.csv), ("plot", args.plot))})
    with RecordWriter(args.json, args.csv) as writer:  # the paths are checked before any work

        def keep(done: ModelReport) -> None:  # each phase's records as it ends: a cut run keeps the phases finished
            for record in records(replace(done, phases=done.phases[-1:])):
                writer.add(record)

        report = model(cfg, N=args.N, context=args.context, batch=args.batch, gpu=args.gpu, dtype=args.dtype,
                       M=args.M, algorithms=args.algo, phases=args.phase, on_step=on_row, on_phase=keep)
    if args.plot is not None:
        if not any(pc.ran for pc in report.phases):
            raise InputError(f"plot={str(args.plot)!r}: no algorithm was counted in any phase (the records say "
                             f"why), so there is nothing to draw; allowed: --algo and --phase that count something")
        with writing("the --plot figure", args.plot):
            plot(report, args.plot)
    return report


def main(args: argparse.Namespace, console) -> None:
    if not console.is_terminal or args.wide:
        from rich.console import Console

        console = Console(width=WIDE if args.wide else WIDTH)
    steps = len(plan_phases(config_of(args), args.N, args.context, args.phase)) * len(check_algorithms(args.algo))
    with progress_bar(console, "model", steps) as step:
        report = run(args, on_row=step)
    render(console, report, wide=args.wide)
    if not any(pc.ran for pc in report.phases):
        raise InputError("no algorithm was counted in any phase (each 'not counted' line above says why); allowed: "
                         "--M, --algo and --phase that count something")


def render(console, report: ModelReport, wide: bool = False) -> None:
    cfg = report.model
    grouped = f", {cfg.kv_heads} K/V heads" if cfg.grouped else ""
    kinds = " + ".join(f"{k.layers} {k.label}" for k in cfg.kinds())
    heads = f"head_dim {cfg.head_dim}" + (f", v_head_dim {cfg.d_v}" if cfg.d_v != cfg.head_dim else "") + (
        f", latent {cfg.kv_lora_rank} + RoPE {cfg.qk_rope_head_dim}" if cfg.mla else "")
    console.print(f"[bold]{cfg.name}[/]: {cfg.layers} layers ({kinds}), {cfg.heads} heads{grouped}, {heads}; batch "
                  f"{report.batch}, {report.gpu} preset, {report.dtype}, M = {report.M:,} "
                  f"elements ({nbytes(report.M * DTYPE_ITEMSIZE[report.dtype])})")
    console.print(f"numbers from {cfg.source}")
    console.print(f"[bold]{ATTENTION_ONLY}[/]")
    for note in report.notes[1:]:
        console.print(f"[yellow]{note}[/]")
    kv = cfg.kv_cache_bytes(report.dtype)
    console.print(f"KV cache: {nbytes(kv['per_layer'])} a token a layer ({kv['what']}), {nbytes(kv['per_token'])} a "
                  f"token over {cfg.layers} layers")
    for pc in report.phases:
        render_phase(console, pc, wide)


def render_phase(console, pc: PhaseCost, wide: bool = False) -> None:
    console.print()
    console.print(f"[bold]{pc.phase.title}[/]: one layer of each kind, and Σ over every layer; time: the roofline "
                  f"from DRAM bytes (the L2 model) where shown, else from HBM bytes")
    columns = {  # name: (the layer's cell, the algorithm's total, in the narrow table)
        "algorithm": (None, lambda a: a.algorithm, True),
        "layers": (lambda c: f"{c.kind.layers} {c.kind.label.split()[0]}", None, True),
        "HBM": (lambda c: nbytes(c.counts.total_bytes), None, True),
        "DRAM": (lambda c: "—" if c.dram is None else nbytes(c.dram.moved), None, True),
        "FLOPs": (lambda c: eng(c.flops.matmul), None, False),
        "time": (lambda c: seconds(c.roofline.seconds), None, True),
        "bound": (lambda c: c.roofline.bound, None, False),
        "Σ HBM": (None, lambda a: nbytes(a.total_bytes), True),
        "Σ DRAM": (None, lambda a: "—" if a.dram_bytes is None else nbytes(a.dram_bytes), False),
        "Σ FLOPs": (None, lambda a: eng(a.flops.matmul), False),
        "Σ time": (None, lambda a: seconds(a.seconds), True),
        "÷ least": (None, lambda a: f"{pc.ratio(a):.2f}×", True),
    }
    shown = {name: cells for name, cells in columns.items() if wide or cells[2]}
    table = compact_table()
    for name in shown:
        table.add_column(name, justify="left" if name in ("algorithm", "layers", "bound") else "right",
                         no_wrap=True)
    for a in pc.ran:
        for i, c in enumerate(a.layers):
            table.add_row(*(layer(c) if layer else total(a) if i == 0 else "" for layer, total, _ in shown.values()))
    if pc.ran:
        print_table(console, table)
        console.print(f"least HBM bytes (÷ least): {pc.least.algorithm}")
    for note in dict.fromkeys(c.dram_note for a in pc.ran for c in a.layers if c.dram_note):
        console.print(f"[yellow]DRAM —: {note}[/]")
    inexact = [a.algorithm for a in pc.ran if not all(c.exact for c in a.layers)]
    if inexact:
        console.print(f"[red]count differs from the closed form: {', '.join(inexact)}[/]")
    reasons: dict[str, list[str]] = {}
    for a in pc.algorithms:
        if a.skipped:
            reasons.setdefault(a.skipped, []).append(a.algorithm)
    for reason, names in reasons.items():
        console.print(f"[yellow]not counted: {', '.join(names)}: {reason}[/]")
