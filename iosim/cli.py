"""Command line: ``iosim sweep`` (count-only grid), ``iosim run`` (one numeric simulation), ``iosim optimize``
and ``iosim bound``.

``build_parser`` and ``run`` hold the logic and return data; only ``main`` renders,
with rich. Tests call ``run`` directly. Bad input (``iosim.InputError``, a
``CapacityError``, an unwritable file) is one line on stderr and exit status 2;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from iosim.api import SimResult, backward_of, simulate, simulation_bytes
from iosim.bound import POINTS_DEFAULT, BoundSweep, bound, plot
from iosim.counts import Counts, combined
from iosim.errors import InputError
from iosim.gpus import GPUS, resolve_M
from iosim.gradients import GradResult, gradients
from iosim.memory import CapacityError
from iosim.optimize import TOP_DEFAULT, Optimum, optimize
from iosim.reference import attention_backward_ref, attention_ref
from iosim.registry import ALGORITHMS, DEFAULT
from iosim.rng import check_seed
from iosim.sparsity import PATTERNS, BlockSparsity, element_mask
from iosim.sweep import DEFAULT_D, DEFAULT_N, PASSES, RecordWriter, SweepRow, check_output_path, rank_by_traffic, \
    run_sweep, sweep_configs
from iosim.policies import POLICIES
from iosim.units import DTYPE_ITEMSIZE, parse_count

PASS_TITLES = {"fwd": "forward pass", "bwd": "backward pass", "fwd+bwd": "forward + backward (blocks of each)"}
REFERENCE_CHUNK = 2**22  # float64 elements of one slice of the reference's N_q × N_k matrices (32 MiB)


class UsageError(Exception):
    """Bad command-line input: reported in one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print the usage block and exit; we want one line
        raise UsageError(message)


def _count(text: str) -> int:
    """A whole number ≥ 1 with an optional suffix (4096, 4Ki, 1e5), for argparse."""
    try:
        return parse_count("value", text)
    except InputError as err:
        raise argparse.ArgumentTypeError(str(err).replace(f"value={text!r}", text, 1)) from None


def _seed(text: str) -> int:
    try:
        return check_seed(int(text))
    except (ValueError, InputError):
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer in [0, 2**64)") from None


def _package_version() -> str:
    try:
        return version("iosim")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _add_problem(p: argparse.ArgumentParser, grouped: bool = True) -> None:
    """The options of the problem itself, spelled the same by every command (``grouped``: --kv-heads too)."""
    p.add_argument("--batch", type=_count, default=1)
    p.add_argument("--heads", type=_count, default=1)
    if grouped:
        p.add_argument("--kv-heads", type=_count, default=None,
                       help="K/V heads shared by the query heads (grouped-query attention), a divisor of --heads; "
                            "1 is MQA (default: --heads)")
    p.add_argument("--causal", action="store_true", help="bottom-right aligned causal mask")
    p.add_argument("--dtype", choices=sorted(DTYPE_ITEMSIZE), default="float16",
                   help="element size for bytes and for M given in bytes (default float16)")


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--M", default=None,
                   help="SRAM capacity: 100k (×1000), 64Ki (×1024) elements, or bytes with a B: 192KiB "
                        "(default 100k, or with --gpu its shared memory per SM; an --M up to that wins)")
    p.add_argument("--gpu", choices=sorted(GPUS), default=None,
                   help="hardware preset: sets M and adds GB, GFLOPs, intensity and a roofline time to the sweep")
    _add_problem(p)
    p.add_argument("--splits", type=int, default=None,
                   help="split-kv: K/V splits, 1 to the number of K/V blocks (default: enough to fill an "
                        "H100's 132 SMs)")
    p.add_argument("--block-policy", choices=list(POLICIES), default="fit",
                   help="fit: largest blocks that fit M (default); paper: B_c = ceil(M/4d), B_r = min(B_c, d); "
                        "optimal: any block shape, fewest HBM accesses (iosim optimize)")
    p.add_argument("--pass", dest="pass_", choices=PASSES, default="fwd",
                   help="fwd: the forward pass (default); bwd: the backward pass; fwd+bwd: a training step")
    p.add_argument("--sparsity", type=float, default=None,
                   help="block-sparse algorithms: the fraction of nonzero tiles in (0, 1] (default: dense)")
    p.add_argument("--sparsity-pattern", choices=PATTERNS, default="random",
                   help="random, local (banded) or strided block mask (default random)")
    p.add_argument("--sparsity-seed", type=_seed, default=0, help="seed of a random block mask")
    p.add_argument("--json", metavar="PATH", help="save the results as JSON")
    p.add_argument("--csv", metavar="PATH", help="save the results as CSV")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="iosim", description="HBM traffic of attention: simulated, predicted, checked.")
    parser.add_argument("--version", action="version", version=f"iosim {_package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    sw = sub.add_parser("sweep", help="count-only traffic of every algorithm over a grid of N and d")
    _add_common(sw)
    sw.add_argument("--N", type=_count, nargs="+", default=list(DEFAULT_N), help="sequence lengths, e.g. 1024 4Ki")
    sw.add_argument("--d", type=_count, nargs="+", default=list(DEFAULT_D), help="head dimensions")
    sw.add_argument("--algo", choices=list(ALGORITHMS), nargs="+", default=None,
                    help="algorithms to count (default: all; the block-sparse ones only with --sparsity)")
    sw.add_argument("--resume", action="store_true",
                    help="keep the records already in the --json/--csv file and skip their configurations")
    sw.add_argument("--wide", action="store_true",
                    help="every column (reads, writes, exact prediction, paper's form): about 130 columns")

    rn = sub.add_parser("run", help="one numeric simulation on random inputs, checked against float64")
    _add_common(rn)
    rn.add_argument("--algo", choices=list(ALGORITHMS), default=DEFAULT)
    rn.add_argument("--N", type=_count, default=1000, help="query length N_q")
    rn.add_argument("--N-k", type=_count, default=None, help="key/value length (default: N)")
    rn.add_argument("--d", type=_count, default=64)
    rn.add_argument("--scale", type=float, default=None, help="softmax scale tau (default 1/sqrt(d))")
    rn.add_argument("--dropout", type=float, default=0.0, help="dropout probability in [0, 1)")
    rn.add_argument("--seed", type=_seed, default=0, help="seed of the inputs and of the dropout mask")
    rn.add_argument("--no-check", action="store_true", help="skip the comparison with the float64 reference")

    op = sub.add_parser("optimize", help="the tilings with the fewest exact HBM accesses that fit M, per algorithm")
    op.add_argument("--N", type=_count, required=True, help="query length N_q")
    op.add_argument("--N-k", type=_count, default=None, help="key/value length (default: N)")
    op.add_argument("--d", type=_count, required=True)
    op.add_argument("--M", default=None, help="SRAM capacity, as for sweep: 100k, 64Ki, 192KiB (default 100k, or "
                                              "with --gpu its shared memory per SM)")
    op.add_argument("--gpu", choices=sorted(GPUS), default=None, help="hardware preset: sets M, as for sweep")
    op.add_argument("--pass", dest="pass_", choices=("fwd", "bwd"), default="fwd",
                    help="the pass whose tilings to search: fwd (default) or bwd (each pass has its own tiling)")
    op.add_argument("--algo", choices=list(ALGORITHMS), nargs="+", default=None,
                    help="default: every algorithm but the block-sparse ones")
    _add_problem(op)
    op.add_argument("--top", type=_count, default=TOP_DEFAULT, help=f"tilings shown per algorithm (default "
                                                                     f"{TOP_DEFAULT})")
    op.add_argument("--json", metavar="PATH", help="save the tilings as JSON")
    op.add_argument("--csv", metavar="PATH", help="save the tilings as CSV")

    bd = sub.add_parser("bound", help="least traffic of any algorithm at its optimal tiling against the IO lower "
                                      "bound, over M from the smallest working set to N·d")
    bd.add_argument("--N", type=_count, required=True, help="query length N_q")
    bd.add_argument("--N-k", type=_count, default=None, help="key/value length (default: N)")
    bd.add_argument("--d", type=_count, required=True)
    bd.add_argument("--algo", choices=list(ALGORITHMS), nargs="+", default=None,
                    help="default: every algorithm but the block-sparse ones")
    _add_problem(bd, grouped=False)  # the lower bound is for multi-head attention
    bd.add_argument("--points", type=_count, default=POINTS_DEFAULT,
                    help=f"values of M, evenly spaced in log M (default {POINTS_DEFAULT})")
    bd.add_argument("--out", metavar="PNG", help="plot every algorithm's traffic and the bound against M")
    bd.add_argument("--json", metavar="PATH", help="save every (M, algorithm) as JSON")
    bd.add_argument("--csv", metavar="PATH", help="save every (M, algorithm) as CSV")
    return parser


@dataclass(frozen=True)
class SweepOutcome:
    rows: list[SweepRow]
    skipped: int  # configurations the --resume file already held


@dataclass(frozen=True)
class OptimizeOutcome:
    results: list  # per algorithm: an Optimum, or the BlockSizeError of one that cannot fit M

    def records(self) -> list[dict]:
        """One record per tiling shown: the problem, the rank, the tiling and its traffic, and the policies'."""
        out = []
        for r in self.results:
            if not isinstance(r, Optimum):
                continue
            s = r.problem.shape
            config = dict(algorithm=r.algorithm, N=s.n_q, N_k=s.n_k, d=s.d, M=r.M, batch=s.batch, heads=s.heads,
                          causal=r.problem.causal, dtype=r.problem.dtype, searched=r.searched)
            policies = {f"{name}_{key}": getattr(getattr(r, name), key, None)
                        for name in ("fit", "paper") for key in ("traffic", "c")}
            for rank, x in enumerate(r.best, 1):
                out.append({**config, "rank": rank, "Br": x.tiling.Br, "Bc": x.tiling.Bc, "traffic": x.traffic,
                            "traffic_bytes": x.traffic_bytes, "working_set": x.working_set, "c": x.c,
                            "simulated": r.measured.total if rank == 1 else None, **policies})
        return out


def bound_records(sweep: BoundSweep) -> list[dict]:
    """One record per (M, algorithm): its optimal tiling and simulated traffic, the bound and their ratio."""
    s, out = sweep.problem.shape, []
    for p in sweep.points:
        for name, traffic in p.traffic.items():
            t = p.tiling[name]
            out.append(dict(N=s.n_q, N_k=s.n_k, d=s.d, batch=s.batch, heads=s.heads, causal=sweep.problem.causal,
                            M=p.M, algorithm=name, Br=t and t.Br, Bc=t and t.Bc, traffic=traffic,
                            lower_bound=p.lower_bound, ratio=None if traffic is None else traffic / p.lower_bound,
                            best=name == p.best))
    return out


@dataclass(frozen=True)
class RunOutcome:
    result: SimResult | GradResult  # a GradResult with --pass bwd or fwd+bwd
    max_abs_error: float | None  # against the float64 reference; None with --no-check
    max_rel_error: float | None  # max |err| / max |reference|
    pass_: str = "fwd"

    @property
    def traffic(self) -> Counts:
        """The traffic of the pass or passes run."""
        r = self.result
        return combined(r.forward_traffic, r.traffic) if self.pass_ == "fwd+bwd" else r.traffic


def run(args: argparse.Namespace, on_row: Callable[[SweepRow | None], None] | None = None,
        on_simulated: Callable[[SimResult], None] | None = None) -> SweepOutcome | RunOutcome:
    """Execute a parsed command and return its results as data.

    ``on_row`` sees each sweep row as it finishes (None for one skipped by --resume), or each
    algorithm's optimum;
    ``on_simulated`` sees a run's result before the reference check starts.
    """
    if args.command == "bound":
        return _run_bound(args, on_row)
    M = resolve_M(args.M, args.gpu, args.dtype)
    sparsity = None if getattr(args, "sparsity", None) is None else BlockSparsity(
        args.sparsity, args.sparsity_pattern, args.sparsity_seed)
    if sparsity is not None and args.command == "run" and not ALGORITHMS[args.algo].accepts("block_sparsity"):
        raise InputError(f"--sparsity {args.sparsity}: {args.algo} has no block mask; allowed with --sparsity: "
                         f"{[a.name for a in ALGORITHMS.values() if a.accepts('block_sparsity')]}")
    algorithms = [args.algo] if args.command == "run" else sweep_algorithms(args)
    if args.pass_ != "fwd":  # refuse an algorithm without a backward pass before anything runs
        for algo in algorithms:
            backward_of(ALGORITHMS[algo])
    if args.command == "sweep":
        if args.resume and not (args.json or args.csv):
            raise InputError("--resume needs --json PATH or --csv PATH: the file whose records to keep")
        writer = RecordWriter(args.json, args.csv, resume=args.resume)
        try:
            rows = run_sweep(algorithms, args.N, args.d, M, batch=args.batch, heads=args.heads,
                             kv_heads=args.kv_heads, splits=args.splits, causal=args.causal,
                             dtype=args.dtype, block_policy=args.block_policy, writer=writer, on_row=on_row,
                             pass_=args.pass_, gpu=args.gpu, block_sparsity=sparsity)
        finally:
            writer.close()
        return SweepOutcome(rows, len(sweep_configs(algorithms, args.N, args.d)) - len(rows))
    if args.command == "optimize":
        return _run_optimize(args, algorithms, M, on_row)
    return _run_one(args, M, on_simulated, sparsity)


def sweep_algorithms(args: argparse.Namespace) -> list[str]:
    """The algorithms a command covers: those named, else all that apply (block-sparse ones only with a block
    mask to use, and with --pass bwd or fwd+bwd only those with a backward pass)."""
    if args.algo is not None:
        return args.algo
    given = ("block_sparsity",) if getattr(args, "sparsity", None) is not None else ()
    backward = getattr(args, "pass_", "fwd") != "fwd"
    return [name for name, a in ALGORITHMS.items()
            if a.listed_by_default(given) and (a.backward is not None or not backward)]


def _run_bound(args: argparse.Namespace, on_point) -> BoundSweep:
    paths = {what: check_output_path(what, getattr(args, what)) for what in ("json", "csv", "out")}
    named = [p for p in paths.values() if p]
    if len(set(named)) < len(named):
        raise InputError(f"--json, --csv and --out name the same file; give each its own path: {sorted(map(str, named))}")
    sweep = bound(args.N, args.d, N_k=args.N_k, batch=args.batch, heads=args.heads, causal=args.causal,
                  dtype=args.dtype, points=args.points, algorithms=sweep_algorithms(args), on_point=on_point)
    records = bound_records(sweep)
    if paths["json"]:
        paths["json"].write_text(json.dumps(records, indent=1) + "\n")
    if paths["csv"]:
        with paths["csv"].open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(records[0]))
            writer.writeheader()
            writer.writerows(records)
    if paths["out"]:
        plot(sweep, paths["out"])
    return sweep


def _run_optimize(args: argparse.Namespace, algorithms: list[str], M: int, on_done) -> OptimizeOutcome:
    json_path, csv_path = check_output_path("json", args.json), check_output_path("csv", args.csv)
    if json_path and json_path == csv_path:
        raise InputError(f"json and csv name the same file {args.json!r}; give each its own path")
    if args.pass_ != "fwd" and args.kv_heads not in (None, args.heads):
        raise InputError(f"--kv-heads {args.kv_heads} with --pass {args.pass_}: the backward passes take kv_heads "
                         f"== heads={args.heads} (grouped-query attention is forward only)")
    passes = [ALGORITHMS[a] if args.pass_ == "fwd" else backward_of(ALGORITHMS[a]) for a in algorithms]
    outcome = OptimizeOutcome(optimize(passes, N=args.N, N_k=args.N_k,
                                       d=args.d, M=M, batch=args.batch, heads=args.heads, kv_heads=args.kv_heads,
                                       causal=args.causal, dtype=args.dtype, top=args.top, on_done=on_done))
    records = outcome.records()
    if json_path:
        json_path.write_text(json.dumps(records, indent=1) + "\n")
    if csv_path:
        with csv_path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(records[0]))
            writer.writeheader()
            writer.writerows(records)
    return outcome


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (Linux's MemAvailable), or None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _run_one(args: argparse.Namespace, M: int, on_simulated, sparsity: BlockSparsity | None) -> RunOutcome:
    json_path, csv_path = check_output_path("json", args.json), check_output_path("csv", args.csv)
    n_k = args.N_k or args.N
    shape = dict(N=args.N, N_k=n_k, d=args.d, batch=args.batch, heads=args.heads, kv_heads=args.kv_heads)
    need = simulation_bytes(args.algo, **shape) + 8 * args.batch * args.heads * (args.N + 2 * n_k) * args.d
    if args.pass_ != "fwd":  # the backward pass's HBM, and the reference's whole N_q × N_k matrices
        need += simulation_bytes(backward_of(ALGORITHMS[args.algo]), **shape) + 4 * 8 * args.batch * args.heads * args.N * n_k
    free = available_memory()
    if free is not None and need > free:
        raise InputError(
            f"a numeric run of {args.algo} at N={args.N}, N_k={n_k}, d={args.d}, batch·heads="
            f"{args.batch * args.heads} holds {_bytes(need)} in float64, more than the {_bytes(free)} available; "
            f"use `iosim sweep` (count-only) for its traffic")
    rng = np.random.default_rng(args.seed)
    q = rng.standard_normal((args.batch, args.heads, args.N, args.d))
    kv_heads = args.heads if args.kv_heads is None else args.kv_heads
    k, v = (rng.standard_normal((args.batch, kv_heads, n_k, args.d)) for _ in range(2))
    options = dict(causal=args.causal, scale=args.scale, dropout_p=args.dropout, seed=args.seed)
    run_options = dict(M=M, block_policy=args.block_policy, dtype=args.dtype, block_sparsity=sparsity, **options)
    if args.splits is not None:
        run_options["splits"] = args.splits
    if args.pass_ == "fwd":
        with warnings.catch_warnings():  # an overflow is reported below, in one line
            warnings.simplefilter("ignore", RuntimeWarning)
            result = simulate(args.algo, q, k, v, **run_options)
        outputs = (result.out,)
    else:
        do = rng.standard_normal(q.shape)
        with warnings.catch_warnings(), np.errstate(over="ignore", invalid="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            result = gradients(args.algo, q, k, v, do, **run_options)
        outputs = (result.dq, result.dk, result.dv)
    if not all(np.isfinite(x).all() for x in outputs):  # the inputs are finite: only the scale can overflow
        raise InputError(f"--scale {args.scale}: tau·QKᵀ overflows float64 on these inputs, so the output is not "
                         f"finite; allowed: a scale that keeps |tau·q·k| below 1.8e308")
    if on_simulated:
        on_simulated(result)
    if sparsity is not None:  # the reference masks out every element of a zero tile
        options["mask"] = element_mask(sparsity, result.forward_tiling, args.N, n_k)  # both passes' tiling
    err = rel = None
    if not args.no_check and args.pass_ == "fwd":
        err, rel = check_against_reference(result.out, q, k, v, **options)
    elif not args.no_check:
        refs = attention_backward_ref(q, k, v, do, **options)
        err = max(float(np.max(np.abs(x - r))) for x, r in zip(outputs, refs))
        rel = max(float(np.max(np.abs(x - r))) / max(float(np.max(np.abs(r))), np.finfo(float).tiny)
                  for x, r in zip(outputs, refs))
    outcome = RunOutcome(result, err, rel, args.pass_)
    if json_path:
        json_path.write_text(json.dumps(run_record(args, outcome), indent=1) + "\n")
    if csv_path:
        with csv_path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["tensor", "level", "reads", "writes", "read_bytes", "write_bytes"])
            writer.writeheader()
            for t in outcome.traffic.tensors:
                writer.writerow(dict(tensor=t.name, level=t.level, reads=t.reads, writes=t.writes,
                                     read_bytes=t.read_bytes, write_bytes=t.write_bytes))
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


def run_record(args: argparse.Namespace, outcome: RunOutcome) -> dict:
    """What `run --json` saves: the configuration, the tiling, the counts and the check."""
    r, pb = outcome.result, outcome.result.problem
    first = r.backward_tiling if outcome.pass_ == "bwd" else r.forward_tiling  # the pass reported first
    backward = r.backward_tiling if outcome.pass_ == "fwd+bwd" else None
    return {
        "algorithm": r.algorithm, "N": pb.shape.n_q, "N_k": pb.shape.n_k, "d": pb.shape.d, "M": r.M,
        "batch": pb.shape.batch, "heads": pb.shape.heads, "causal": pb.causal, "mask": pb.has_mask,
        "dropout_p": pb.dropout_p, "seed": pb.seed, "scale": pb.tau, "dtype": pb.dtype,
        "block_policy": args.block_policy, "pass": outcome.pass_, "Br": first.Br, "Bc": first.Bc,
        "bwd_Br": getattr(backward, "Br", None), "bwd_Bc": getattr(backward, "Bc", None), **outcome.traffic.as_dict(),
        "max_abs_error": outcome.max_abs_error, "max_rel_error": outcome.max_rel_error,
    }


# --- rendering (rich lives here only) -----------------------------------------------------
_PREFIXES = ("", "k", "M", "G", "T", "P", "E")


def _eng(x: float | None, prefixes: tuple[str, ...] = _PREFIXES) -> str:
    """x in at most 3 significant digits and a prefix (17.9G), never wider than 6 characters."""
    if x is None:
        return "—"
    if abs(x) < 1000:
        return str(int(x)) if x == int(x) else f"{x:.3g}"
    for e, prefix in enumerate(prefixes):
        text = f"{x / 1000**e:.3g}"  # rounding may carry into the next prefix: 999,960 is 1M, not 1e+03k
        if abs(float(text)) < 1000:
            return text + prefix
    return f"{x:.2e}"


def _bytes(x: float | None) -> str:
    return "—" if x is None else _eng(x, ("", "K", "M", "G", "T", "P", "E")) + "B"


def _seconds(t: float) -> str:
    """A time in the unit that keeps it between 1 and 1000: 41.7ms, 730µs."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if t >= scale:
            return f"{t / scale:.3g}{unit}"
    return f"{t / 1e-9:.3g}ns"


def _count_text(n: int) -> str:
    """A sequence length in full up to six digits (65536), compactly beyond (1G)."""
    return str(n) if n < 10**6 else _eng(n)


def _setting(first: SweepRow, rows: list[SweepRow]) -> str:
    options = [f"M = {first.M:,} elements ({_bytes(first.M * DTYPE_ITEMSIZE[first.dtype])} of {first.dtype})",
               f"batch·heads = {first.batch * first.heads}", "causal" if first.causal else "no mask",
               f"block policy {first.block_policy}"]
    sparse = next((r for r in rows if r.sparsity is not None), None)
    if sparse is not None:
        options.append(f"block-sparse rows: {sparse.sparsity_pattern} block mask, s = {sparse.sparsity:g}")
    if first.roofline is not None:
        options.append(f"{first.roofline.gpu} preset (roofline time: a lower bound)")
    if first.pass_ != "fwd":
        options.append(PASS_TITLES[first.pass_])
    return "HBM traffic in elements, over all batch·heads: " + ", ".join(options)


def _render_sweep(console, outcome: SweepOutcome, wide: bool) -> None:
    from rich import box
    from rich.table import Table

    rows = outcome.rows
    if outcome.skipped:
        console.print(f"{outcome.skipped} configurations were already in the file and were skipped (--resume)")
    if not rows:
        return
    console.print(_setting(rows[0], rows))
    table = Table(box=box.SIMPLE_HEAD, header_style="bold", collapse_padding=True, pad_edge=False)
    tile = (lambda r: "—" if r.counts is None else "/".join(
        f"{t.Br}×{t.Bc}" for t in (r.forward_tiling, r.backward_tiling) if t is not None))
    exact = (lambda r: "—" if r.ratio is None else "yes" if r.total == r.predicted else f"{r.ratio:.4f}")
    peak = (lambda r: "overflow" if r.peak_sram is None else f"{r.peak_fraction:.3f}")
    if wide:
        columns = [("algorithm", lambda r: r.algorithm), ("N", lambda r: _count_text(r.N)), ("d", lambda r: str(r.d)),
                   ("B_r×B_c", tile), ("HBM reads", lambda r: _eng(r.reads)), ("writes", lambda r: _eng(r.writes)),
                   ("total", lambda r: _eng(r.total)), ("bytes", lambda r: _bytes(r.total_bytes)),
                   ("exact prediction", lambda r: _eng(r.predicted)), ("paper's form", lambda r: _eng(r.paper)),
                   ("meas/pred", lambda r: "—" if r.ratio is None else f"{r.ratio:.6f}"), ("peak SRAM/M", peak)]
    else:
        columns = [("algorithm", lambda r: r.algorithm), ("N", lambda r: _count_text(r.N)), ("d", lambda r: str(r.d)),
                   ("B_r×B_c", tile), ("HBM total", lambda r: _eng(r.total)), ("bytes", lambda r: _bytes(r.total_bytes)),
                   ("= pred", exact), ("peak/M", peak)]
        if any(None not in (r.forward_tiling, r.backward_tiling) for r in rows):  # two tilings a row: room made for them
            columns = [c for c in columns if c[0] != "peak/M"]
    if rows[0].roofline is not None:  # a GPU preset: bytes and FLOPs become a time
        kept = columns if wide else [c for c in columns if c[0] in ("algorithm", "N", "d")]
        columns = kept + [
            ("HBM bytes", lambda r: _bytes(r.total_bytes)),
            ("FLOPs", lambda r: "—" if r.flops is None else _eng(r.flops.matmul)),
            ("FLOP/B", lambda r: "—" if r.roofline is None else f"{r.roofline.intensity:.3g}"),
            ("time", lambda r: "—" if r.roofline is None else _seconds(r.roofline.seconds)),
            ("bound", lambda r: "—" if r.roofline is None else r.roofline.bound),
        ]
    for name, _ in columns:
        table.add_column(name, justify="left" if name in ("algorithm", "bound") else "right", no_wrap=True)
    for r in rows:
        table.add_row(*(cell(r) for _, cell in columns))
    console.print(table)
    for r in rows:
        if r.status != "ok":
            console.print(f"[yellow]{r.algorithm} N={r.N} d={r.d}: {r.status}[/]")
            break
    labels = {r.algorithm: r.paper_label for r in rows}
    console.print("Paper's forms: " + "; ".join(f"{a}: {label}" for a, label in labels.items()))
    _render_ranking(console, rows)


def _render_ranking(console, rows: list[SweepRow]) -> None:
    from rich import box
    from rich.table import Table

    ranking = rank_by_traffic(rows)
    if not ranking or len({r.algorithm for r in rows}) < 2:
        return
    table = Table(box=box.SIMPLE_HEAD, title="least traffic at each (N, d), and each other algorithm's ÷ it",
                  header_style="bold")
    for name in ("N", "d", "least", "others ÷ least"):
        table.add_column(name, justify="left" if name in ("least", "others ÷ least") else "right")
    for x in ranking:
        others = ", ".join(f"{a} {ratio:.2f}×" for a, ratio in sorted(x.ratios.items(), key=lambda kv: kv[1])
                           if a != x.best)
        table.add_row(_count_text(x.N), str(x.d), x.best, others or "—")
    console.print(table)


def _render_run(console, r: SimResult) -> None:
    _render_traffic(console, r, r.traffic, r.tiling, None)


def _render_training(console, r: GradResult, pass_: str) -> None:
    """The traffic of a run with --pass bwd or fwd+bwd: each pass's table."""
    if pass_ == "fwd+bwd":
        _render_traffic(console, r, r.forward_traffic, r.forward_tiling, "forward pass")
    _render_traffic(console, r, r.traffic, r.backward_tiling, "backward pass")


def _render_traffic(console, r: SimResult | GradResult, t: Counts, tiling, what: str | None) -> None:
    from rich.table import Table

    pb = r.problem
    table = Table(title=f"{r.algorithm}{f' ({what})' if what else ''}: N_q={pb.shape.n_q}, N_k={pb.shape.n_k}, "
                        f"d={pb.shape.d}, batch·heads={pb.shape.bh}, M={r.M:,}, B_r={tiling.Br}, B_c={tiling.Bc}",
                  header_style="bold")
    for col in ("tensor", "reads", "writes", "read bytes", "write bytes"):
        table.add_column(col, justify="left" if col == "tensor" else "right", no_wrap=True)
    for x in t.tensors:
        table.add_row(x.name, f"{x.reads:,}", f"{x.writes:,}", _bytes(x.read_bytes), _bytes(x.write_bytes))
    table.add_row("total", f"{t.reads:,}", f"{t.writes:,}", _bytes(t.read_bytes), _bytes(t.write_bytes), style="bold")
    console.print(table)
    console.print(f"peak SRAM {t.peak_sram:,} of M = {r.M:,} elements ({t.peak_sram / r.M:.3f}); "
                  f"{_bytes(t.total_bytes)} moved in all")


def _render_optimize(console, outcome: OptimizeOutcome, pass_: str = "fwd") -> None:
    from rich import box
    from rich.table import Table

    found = [r for r in outcome.results if isinstance(r, Optimum)]
    first = found[0]
    s = first.problem.shape
    console.print(f"N_q={s.n_q:,}, N_k={s.n_k:,}, d={s.d}, batch·heads={s.bh}, M={first.M:,} elements, "
                  f"{'causal' if first.problem.causal else 'no mask'}, {PASS_TITLES[pass_]}. The best tilings of each "
                  f"algorithm (ties in traffic shown once): HBM elements over all batch·heads, the working set (SRAM) "
                  f"per head, and c = traffic·M/(N_q·N_k·d²) per head, beside the c of the fit and paper block "
                  f"policies (— where the policy overflows M)")
    table = Table(box=box.SIMPLE_HEAD, header_style="bold", collapse_padding=True, pad_edge=False)
    for name in ("algorithm", "B_r×B_c", "HBM total", "bytes", "SRAM", "c", "fit c", "paper c"):
        table.add_column(name, justify="left" if name == "algorithm" else "right", no_wrap=True)
    for r in found:
        name = r.algorithm.removesuffix(" backward")  # the pass is in the title
        policy_c = [f"{p.c:.3g}" if p else "—" for p in (r.fit, r.paper)]
        for rank, x in enumerate(r.best, 1):
            table.add_row(name if rank == 1 else "", f"{x.tiling.Br}×{x.tiling.Bc}", _eng(x.traffic),
                          _bytes(x.traffic_bytes), _eng(x.working_set), f"{x.c:.3g}",
                          *(policy_c if rank == 1 else ("", "")), end_section=rank == len(r.best))
    console.print(table)
    for r in outcome.results:
        if not isinstance(r, Optimum):
            console.print(f"[yellow]{r}[/]")
    best = min(found, key=lambda r: r.best[0].traffic)
    x = best.best[0]
    console.print(f"least traffic: {best.algorithm} with B_r={x.tiling.Br}, B_c={x.tiling.Bc}: {x.traffic:,} elements "
                  f"(c = {x.c:.2f}), simulated count-only: {best.measured.total:,}; "
                  f"{sum(r.searched for r in found):,} tilings searched")


def _render_bound(console, sweep: BoundSweep) -> None:
    from rich import box
    from rich.table import Table

    s = sweep.problem.shape
    console.print(f"N_q={s.n_q:,}, N_k={s.n_k:,}, d={s.d}, batch·heads={s.bh}"
                  f"{', causal' if sweep.problem.causal else ''}: the least traffic of any algorithm at its optimal "
                  f"tiling (count-only simulation) against the lower bound min(N²d/√M, N²d²/M)")
    table = Table(box=box.SIMPLE_HEAD, header_style="bold", collapse_padding=True, pad_edge=False)
    for name in ("M", "best", "B_r×B_c", "traffic", "bound", "ratio"):
        table.add_column(name, justify="left" if name == "best" else "right", no_wrap=True)
    for p in sweep.points:
        t = p.tiling[p.best]
        table.add_row(f"{p.M:,}", p.best, f"{t.Br}×{t.Bc}", _eng(p.traffic[p.best]), _eng(p.lower_bound),
                      f"{p.ratio:.2f}")
    console.print(table)
    w = sweep.worst
    console.print(f"worst ratio to the lower bound: {w.ratio:.2f} at M = {w.M:,} ({w.best}); "
                  f"M = d² = {s.d * s.d:,}")


def _render_check(console, outcome: RunOutcome) -> None:
    if outcome.pass_ == "fwd+bwd":
        console.print(f"forward + backward: {outcome.traffic.total:,} elements, {_bytes(outcome.traffic.total_bytes)}")
    if outcome.max_abs_error is None:
        console.print("not checked against the float64 reference (--no-check)")
    else:
        console.print(f"max |error| against float64 reference: {outcome.max_abs_error:.3e} "
                      f"(relative {outcome.max_rel_error:.3e})")


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console()
    try:
        args = build_parser().parse_args(argv)
        if args.command == "sweep" and getattr(args, "wide", False) and not console.is_terminal:
            console = Console(width=132 + 48 * (args.gpu is not None))  # piped output: as wide as the --wide table
        if args.command == "sweep":
            total = len(sweep_configs(sweep_algorithms(args), args.N, args.d))
            with Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=console, transient=True) as progress:
                task = progress.add_task("sweep", total=total)
                outcome = run(args, on_row=lambda row: progress.advance(task))
            _render_sweep(console, outcome, args.wide)
        elif args.command == "optimize":
            with Progress(TextColumn("optimize"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=console, transient=True) as progress:
                task = progress.add_task("optimize", total=len(sweep_algorithms(args)))
                outcome = run(args, on_row=lambda result: progress.advance(task))
            _render_optimize(console, outcome, args.pass_)
        elif args.command == "bound":
            with Progress(TextColumn("bound"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=console, transient=True) as progress:
                task = progress.add_task("bound", total=args.points)
                outcome = run(args, on_row=lambda point: progress.advance(task))
            _render_bound(console, outcome)
        else:
            render = (lambda result: _render_run(console, result)) if args.pass_ == "fwd" else \
                (lambda result: _render_training(console, result, args.pass_))
            outcome = run(args, on_simulated=render)
            _render_check(console, outcome)
    except (UsageError, InputError, CapacityError, OSError) as err:
        print(f"iosim: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("iosim: interrupted", file=sys.stderr)
        return 130
    return 0
