"""``iosim run``: one numeric simulation on random inputs, checked against the float64 reference."""

from __future__ import annotations

import argparse
import shlex
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from iosim.api import Progress, backward_of, count, simulate, simulation_bytes
from iosim.cli.common import (
    add_simulation,
    band_title,
    block_sparsity,
    check_backward,
    count_arg,
    documents,
    flex_mask_for,
    hardware_of,
    kernel_reach,
    lengths_of,
    score_mod_of,
    seed_arg,
    window_of,
)
from iosim.cli.progress import PatientBar
from iosim.cli.render import nbytes, print_table
from iosim.core.counts import Counts, combined
from iosim.core.errors import InputError
from iosim.core.gpus import preset_name, resolve_M
from iosim.core.tiling import Tiling, tiling_record
from iosim.gpu.dram import bracketed, covered_dram_or_why
from iosim.gpu.l2 import DramCounts, dram_record, read_range
from iosim.gradients import GradResult, gradients
from iosim.reference import attention_backward_ref, attention_ref, sinks_gradient_ref
from iosim.registry import ALGORITHMS, DEFAULT
from iosim.reports.records import check_distinct, check_output_path, write_document
from iosim.results import SimResult
from iosim.variants.sparsity import element_mask

REFERENCE_CHUNK = 2**22  # float64 elements of one slice of the reference's N_q × N_k matrices (32 MiB)


@dataclass(frozen=True)
class RunOutcome:
    result: SimResult | GradResult  # a GradResult with --pass bwd or fwd+bwd
    max_abs_error: float | None  # against the float64 reference; None with --no-check
    max_rel_error: float | None  # max |err| / max |reference|
    pass_: str = "fwd"
    dram: DramCounts | None = None  # with --gpu, a forward pass whose kernel grid is declared: bytes behind L2
    gpu: str | None = None  # the preset of --gpu
    padded: Counts | None = None  # --seqlens: the traffic of padding every document to the longest
    # why there are no DRAM bytes: too slow, not timed, --kernel refuses it, the L2 model has no grid for it, or a
    # backward pass (run counts the forward's)
    dram_note: str | None = None
    # under the timed schedule, the counts at the two ends of the blocks' spread (iosim.gpu.dram.covered_dram_or_why)
    dram_band: tuple[DramCounts, DramCounts] | None = None

    @property
    def traffic(self) -> Counts:
        """The traffic of the pass or passes run."""
        r = self.result
        return combined(r.forward_traffic, r.traffic) if self.pass_ == "fwd+bwd" else r.traffic


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="one numeric simulation on random inputs, checked against float64")
    add_simulation(p)
    p.add_argument("--algo", choices=list(ALGORITHMS), default=DEFAULT)
    p.add_argument("--N", type=count_arg, default=None, help="query length N_q (default 1000)")
    p.add_argument("--N-k", type=count_arg, default=None, help="key/value length (default: N)")
    p.add_argument("--d", type=count_arg, default=64)
    p.add_argument("--scale", type=float, default=None, help="softmax scale tau (default 1/sqrt(d))")
    p.add_argument("--dropout", type=float, default=0.0, help="dropout probability in [0, 1)")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of the inputs and of the dropout mask")
    p.add_argument("--no-check", action="store_true", help="skip the comparison with the float64 reference")


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (Linux's MemAvailable), or None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def run(args: argparse.Namespace, on_simulated: Callable[[SimResult | GradResult], None] | None = None,
        on_progress: Progress | None = None) -> RunOutcome:
    """Simulate and check; ``on_simulated`` sees the result before the reference check starts, ``on_progress``
    the simulation's work as it goes."""
    M = resolve_M(args.M, args.gpu, args.dtype)
    sparsity = block_sparsity(args)
    hw = hardware_of(args)
    kernel_reach(args, [args.algo])  # the one algorithm: refused unless the kernel implements it
    check_backward([args.algo], args.pass_)
    if args.page_size is not None and args.pass_ != "fwd":
        raise InputError(f"--page-size {args.page_size} with --pass {args.pass_}: a paged K/V cache is read by the "
                         f"forward (decode) pass only; allowed: --pass fwd")
    if args.latent and args.d_v is not None and args.d_v > args.d:
        raise InputError(f"--latent with --d-v {args.d_v} > --d {args.d}: V is the first d_v columns of the latent K; "
                         f"allowed: --d-v <= --d")
    if args.latent and args.pass_ != "fwd":
        raise InputError(f"--latent with --pass {args.pass_}: MLA's latent cache is read by the forward (decode) pass "
                         f"only; a training step runs MLA's heads expanded (--d 192 --d-v 128); allowed: --pass fwd")
    check_distinct({"json": check_output_path("json", args.json), "csv": check_output_path("csv", args.csv)})
    N = lengths_of(args, 1000)
    n_k = args.N_k or N
    docs = documents(args)
    masks = flex_mask_for(args)
    flex = None if masks is None else masks(N, n_k)
    mod = score_mod_of(args)
    batch = args.batch if docs is None else len(docs)  # a bound: every document padded to the longest
    d_v = args.d if args.d_v is None else args.d_v
    shape = dict(N=N, N_k=n_k, d=args.d, batch=batch, heads=args.heads, kv_heads=args.kv_heads, d_v=d_v)
    need = simulation_bytes(args.algo, **shape) + 8 * batch * args.heads * ((N + n_k) * args.d + n_k * d_v)
    if args.pass_ != "fwd":  # the backward pass's HBM, and the reference's whole N_q × N_k matrices
        need += simulation_bytes(backward_of(ALGORITHMS[args.algo]), **shape) + 4 * 8 * batch * args.heads * N * n_k
    free = available_memory()
    if free is not None and need > free:
        raise InputError(
            f"a numeric run of {args.algo} at N={N}, N_k={n_k}, d={args.d}, batch·heads="
            f"{batch * args.heads} holds {nbytes(need)} in float64, more than the {nbytes(free)} available; "
            f"use `iosim sweep` (count-only) for its traffic")
    rng = np.random.default_rng(args.seed)
    rows, n_k = (N, n_k) if docs is None else (sum(docs), sum(docs))  # packed documents: (1, heads, Σ L_b, d)
    q = rng.standard_normal((args.batch, args.heads, rows, args.d))
    kv_heads = args.heads if args.kv_heads is None else args.kv_heads
    k = rng.standard_normal((args.batch, kv_heads, n_k, args.d))
    # MLA's latent cache: V is K's first d_v columns
    v = k[..., :d_v].copy() if args.latent else rng.standard_normal((args.batch, kv_heads, n_k, d_v))
    options = dict(causal=args.causal, scale=args.scale, dropout_p=args.dropout, seed=args.seed, window=window_of(args),
                   **({"sinks": rng.standard_normal(args.heads)} if args.sinks else {}))
    run_options = dict(M=M, block_policy=args.block_policy, dtype=args.dtype, block_sparsity=sparsity,
                       splits=args.splits, on_progress=on_progress, seqlens=docs, **options)
    if args.pass_ == "fwd":
        with warnings.catch_warnings():  # an overflow is reported below, in one line
            warnings.simplefilter("ignore", RuntimeWarning)
            result = simulate(args.algo, q, k, v, gpu=args.gpu, page_size=args.page_size, latent=args.latent,
                              block_mask=flex, score_mod=mod, **run_options)
        outputs = (result.out,)
    else:
        do = rng.standard_normal(q.shape[:3] + (d_v,))
        with warnings.catch_warnings(), np.errstate(over="ignore", invalid="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            result = gradients(args.algo, q, k, v, do, block_mask=flex, score_mod=mod, **run_options)
        outputs = (result.dq, result.dk, result.dv)
    if not all(np.isfinite(x).all() for x in outputs):  # the inputs are finite: only the scale can overflow
        raise InputError(f"--scale {args.scale}: tau·QKᵀ overflows float64 on these inputs, so the output is not "
                         f"finite; allowed: a scale that keeps |tau·q·k| below 1.8e308")
    if on_simulated:
        on_simulated(result)
    if sparsity is not None:  # the reference masks out every element of a zero tile
        options["mask"] = element_mask(sparsity, result.forward_tiling, N, n_k)  # both passes' tiling
    if flex is not None:  # the mask function's own mask
        options["mask"] = flex.element_mask()
    if mod is not None:
        options["score_mod"] = mod
    err = rel = None
    spans = [slice(None)] if docs is None else [slice(a, a + L) for a, L in zip(np.cumsum([0, *docs]), docs)]
    if not args.no_check and args.pass_ == "fwd":  # packed documents: each against the reference alone
        errors = [check_against_reference(result.out[:, :, x], q[:, :, x], k[:, :, x], v[:, :, x], first_batch=b,
                                          **options) for b, x in enumerate(spans)]
        err, rel = max(e for e, _ in errors), max(r for _, r in errors)
    elif not args.no_check:
        refs = [attention_backward_ref(q[:, :, x], k[:, :, x], v[:, :, x], do[:, :, x], first_batch=b, **options)
                for b, x in enumerate(spans)]
        errs = [max(float(np.max(np.abs(out[:, :, x] - ref[i]))) for x, ref in zip(spans, refs))
                for i, out in enumerate(outputs)]  # per gradient, over the documents
        tops = [max(float(np.max(np.abs(ref[i]))) for ref in refs) for i in range(len(outputs))]
        if "sinks" in options:  # and the sinks' gradient (no packed documents beside sinks)
            want = sinks_gradient_ref(q, k, v, do, **options)
            errs.append(float(np.max(np.abs(result.dsinks - want))))
            tops.append(float(np.max(np.abs(want))))
        err = max(errs)
        rel = max(e / max(top, np.finfo(float).tiny) for e, top in zip(errs, tops))
    dram, band, dram_note = (covered_dram_or_why(result.plans, hw, args.algo, args.kernel, band=True, explain=True)
                             if hw is not None and args.pass_ == "fwd" else (None, None, None))
    if hw is not None and args.pass_ != "fwd":
        which = "the backward kernels'" if args.pass_ == "bwd" else "both passes'"
        dram_note = (f"run gives the DRAM bytes of a forward pass only; `iosim sweep --pass {args.pass_}` with the "
                     f"same options gives {which} DRAM bytes")
    padded = None if docs is None else count(
        args.algo, seqlens=docs, d=args.d, d_v=args.d_v, latent=args.latent, M=M, heads=args.heads,
        kv_heads=args.kv_heads,
        causal=args.causal,
        window=window_of(args), dropout_p=args.dropout, dtype=args.dtype, block_policy=args.block_policy,
        pass_=args.pass_, splits=args.splits).padded
    outcome = RunOutcome(result, err, rel, args.pass_, dram, args.gpu, padded, dram_note, band)
    write_document(args.json, args.csv, record(args, outcome),
                   [dict(tensor=t.name, reads=t.reads, writes=t.writes, read_bytes=t.read_bytes,
                         write_bytes=t.write_bytes) for t in outcome.traffic.tensors])
    return outcome


def check_against_reference(out: np.ndarray, q, k, v, *, chunk: int = REFERENCE_CHUNK, **options
                            ) -> tuple[float, float]:
    """(max |out − reference|, that over max |reference|), computed a slice of query rows at a time.

    Each slice holds about ``chunk`` elements of the N_q × N_k matrices, so the check needs
    memory O(chunk), not O(N_q·N_k).
    """
    b, h, n_q, _ = q.shape
    step = max(1, chunk // (b * h * k.shape[2]))
    err = ref_max = 0.0
    for start in range(0, n_q, step):
        rows = slice(start, min(n_q, start + step))
        ref = attention_ref(q, k, v, rows=rows, **options).out
        err = max(err, float(np.max(np.abs(out[:, :, rows] - ref))))
        ref_max = max(ref_max, float(np.max(np.abs(ref))))
    return err, err / max(ref_max, np.finfo(float).tiny)


def record(args: argparse.Namespace, outcome: RunOutcome) -> dict:
    """What `run --json` saves: the configuration, the tiling, the counts and the check."""
    r, pb = outcome.result, outcome.result.problem
    first = r.backward_tiling if outcome.pass_ == "bwd" else r.forward_tiling  # the pass reported first
    backward = r.backward_tiling if outcome.pass_ == "fwd+bwd" else None
    return {
        "algorithm": r.algorithm, **pb.record(), "M": r.M, "seed": pb.seed, "scale": pb.tau,
        "block_policy": args.block_policy, "pass": outcome.pass_, **tiling_record(first),
        **tiling_record(backward, "bwd_"), **outcome.traffic.as_dict(),
        "max_abs_error": outcome.max_abs_error, "max_rel_error": outcome.max_rel_error, "gpu": preset_name(args.gpu),
        "l2_bytes": args.l2_bytes, "blocks_per_sm": args.blocks_per_sm,
        "schedule": None if args.schedule == "lockstep" else args.schedule, "kernel": args.kernel,
        **dram_record(outcome.dram, outcome.dram_band, None if outcome.dram is None else bracketed(
            outcome.dram, outcome.dram_band)), "dram_note": outcome.dram_note,
        "padded_total": getattr(outcome.padded, "total", None),
        "packing_ratio": None if outcome.padded is None else outcome.traffic.total / outcome.padded.total,
    }


def main(args: argparse.Namespace, console) -> None:
    with PatientBar(console, "numeric run", count_only_hint(args)) as bar:
        outcome = run(args, on_simulated=lambda result: render_traffic(console, result, args.pass_), on_progress=bar)
    render_check(console, outcome)


def count_only_hint(args: argparse.Namespace) -> str:
    """The sweep command that answers a run's traffic question at once, count-only: the run's problem and every
    option it shares with sweep (``add_simulation``'s) that it sets, so that the sweep counts the same problem."""
    lengths = [] if args.seqlens is not None else ["--N", str(args.N or 1000)]
    options = ["--algo", args.algo, *lengths, "--d", str(args.d)]
    if args.N_k is not None:
        options += ["--N-k", str(args.N_k)]
    shared = argparse.ArgumentParser(add_help=False)
    add_simulation(shared)
    for action in shared._actions:
        value = getattr(args, action.dest)
        if action.dest in ("json", "csv") or value == action.default:
            continue
        flag = action.option_strings[0]
        if action.nargs == 0:  # a switch
            options.append(flag)
        else:
            options += [flag, *map(str, value if isinstance(value, list) else [value])]
    return f"`python -m iosim sweep {shlex.join(options)}` gives its traffic at once"


def render_traffic(console, r: SimResult | GradResult, pass_: str) -> None:
    """Each pass's table: the forward's, the backward's, or both."""
    if pass_ != "bwd":
        _render_pass(console, r, r.forward_traffic if pass_ == "fwd+bwd" else r.traffic, r.forward_tiling,
                     "forward pass" if pass_ == "fwd+bwd" else None)
    if pass_ != "fwd":
        _render_pass(console, r, r.traffic, r.backward_tiling, "backward pass")


def _render_pass(console, r: SimResult | GradResult, t: Counts, tiling: Tiling, what: str | None) -> None:
    from rich.table import Table

    pb = r.problem
    sizes = (f"N_q={pb.shape.n_q}, N_k={pb.shape.n_k}, " if pb.seqlens is None else
             f"{len(pb.seqlens)} packed documents of {sum(pb.seqlens):,} tokens (longest {pb.shape.n_q}), ")
    what_ran = [band_title(pb), *([f"score_mod {pb.score_mod.name}"] if pb.score_mod is not None else []), pb.dtype,
                *([f"dropout {pb.dropout_p:g}"] if pb.dropout_p else []), *(["sinks"] if pb.sinks else []),
                *([f"{pb.shape.kv_heads} K/V heads"] if pb.shape.kv_heads != pb.shape.heads else []),
                *([f"pages of {pb.page_size}"] if pb.page_size else []), *(["latent K/V"] if pb.latent else [])]
    table = Table(title=f"{r.algorithm}{f' ({what})' if what else ''}: {sizes}"
                        f"d={pb.shape.d}{f', d_v={pb.shape.d_v}' if pb.shape.d_v != pb.shape.d else ''}, "
                        f"batch·heads={pb.shape.bh}, M={r.M:,}, B_r={tiling.Br}, B_c={tiling.Bc}; "
                        f"{', '.join(what_ran)}", header_style="bold")
    for col in ("tensor", "reads", "writes", "read bytes", "write bytes"):
        table.add_column(col, justify="left" if col == "tensor" else "right", no_wrap=True)
    for x in t.tensors:
        table.add_row(x.name, f"{x.reads:,}", f"{x.writes:,}", nbytes(x.read_bytes), nbytes(x.write_bytes))
    table.add_row("total", f"{t.reads:,}", f"{t.writes:,}", nbytes(t.read_bytes), nbytes(t.write_bytes), style="bold")
    print_table(console, table)
    console.print(f"peak SRAM {t.peak_sram:,} of M = {r.M:,} elements ({t.peak_sram / r.M:.3f}); "
                  f"{nbytes(t.total_bytes)} moved in all")


def render_check(console, outcome: RunOutcome) -> None:
    if outcome.pass_ == "fwd+bwd":
        console.print(f"forward + backward: {outcome.traffic.total:,} elements, {nbytes(outcome.traffic.total_bytes)}")
    if outcome.dram is not None:
        d = outcome.dram
        console.print(f"DRAM behind the {preset_name(outcome.gpu)} preset's L2 (iosim.gpu.l2): {nbytes(d.reads)} read, "
                      f"{nbytes(d.writes)} written during the kernel, {nbytes(d.dirty_at_end)} dirty at its end")
        if outcome.dram_band is not None:
            low, high = read_range(d, outcome.dram_band)
            verdict = ("bracketed, not predicted: the spread moves them by more than 10 %"
                       if bracketed(d, outcome.dram_band) else "within 10 % of the middle")
            console.print(f"DRAM reads over the blocks' spread of speeds (0 to 1 %, the timed schedule): "
                          f"{nbytes(low)} to {nbytes(high)}, {verdict}")
    if outcome.dram_note is not None:
        console.print(f"[yellow]no DRAM bytes: {outcome.dram_note}[/]")
    if outcome.padded is not None:
        p, t = outcome.padded, outcome.traffic
        console.print(f"packed documents: {t.total:,} elements against {p.total:,} with every document padded to the "
                      f"longest ({t.total / p.total:.3f}×, {nbytes(p.total_bytes - t.total_bytes)} saved)")
    if outcome.max_abs_error is None:
        console.print("not checked against the float64 reference (--no-check)")
    else:
        console.print(f"max |error| against float64 reference: {outcome.max_abs_error:.3e} "
                      f"(relative {outcome.max_rel_error:.3e})")
