"""What every command shares: the parser, argument types, the options spelled one way everywhere."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version

from iosim.api import PASSES, backward_of
from iosim.core.errors import InputError
from iosim.core.gpus import GPUS
from iosim.core.inputs import check_tokens
from iosim.core.problem import Problem
from iosim.core.rng import check_seed
from iosim.core.units import DTYPE_ITEMSIZE, FP8_DTYPES, parse_bytes, parse_count
from iosim.gpu.hardware import SCHEDULES, Hardware, check_schedule, hardware
from iosim.gpu.kernels import KERNELS
from iosim.registry import ALGORITHMS
from iosim.tilings.policies import POLICIES
from iosim.variants.flex import FlexBlockMask, named_mask
from iosim.variants.score_mods import ScoreMod, named_score_mod
from iosim.variants.sparsity import PATTERNS, BlockSparsity

FLEX_BLOCK = [128, 128]  # FlexAttention's blocks, where --flex-block gives none
PASS_TITLES = {"fwd": "forward pass", "bwd": "backward pass", "fwd+bwd": "forward + backward (blocks of each)"}


class UsageError(Exception):
    """Bad command-line input: reported in one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print the usage block and exit; we want one line
        raise UsageError(message)


class Once(argparse.Action):
    """A list option given once (--window, --seqlens, --flex-mask, ...): argparse would keep the last of
    ``--N 1024 --N 4096`` and drop the rest without a word, so a second one is refused."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, self.dest, self.default) is not self.default:  # set already by an earlier one
            raise argparse.ArgumentError(self, f"given twice ({' '.join(map(str, getattr(namespace, self.dest)))}, "
                                               f"then {' '.join(map(str, values))}); allowed: every value after one "
                                               f"{option_string}")
        setattr(namespace, self.dest, self.kept(values))

    @staticmethod
    def kept(values: list) -> list:
        return values


class Distinct(Once):
    """A list option whose values are a set (--algo, --N, --d, --chunk, ...): each value once, in the order given, so
    that ``--algo flash flash`` or ``--N 4Ki 4096`` count one row, not two alike."""

    @staticmethod
    def kept(values: list) -> list:
        return list(dict.fromkeys(values))


def maskless_algorithms() -> list[str]:
    """The ``--algo`` choices of a command without ``--flex-mask`` (optimize, model, prefill, cascade, bound): every
    algorithm but those that run only over a FlexAttention block mask."""
    return [name for name, algorithm in ALGORITHMS.items() if not algorithm.accepts("block_mask")]


def count_arg(text: str) -> int:
    """A whole number ≥ 1 with an optional suffix (4096, 4Ki, 1e5), for argparse."""
    try:
        return parse_count("value", text)
    except InputError as err:
        raise argparse.ArgumentTypeError(str(err).replace(f"value={text!r}", text, 1)) from None


def tokens_arg(text: str) -> int:
    """A token count ≥ 0 (0, 4096, 4Ki), for argparse."""
    try:
        return check_tokens("value", text)
    except InputError as err:
        raise argparse.ArgumentTypeError(str(err).replace(f"value={text!r}", text, 1)) from None


def signed_count_arg(text: str) -> int:
    """An integer as written (-1, 0, 7), else a count with units (4Ki, 1e3), for argparse: the options whose range
    their check names (--window's -1 unbounded, --splits' 1 to the K/V blocks)."""
    try:
        return int(text)
    except ValueError:
        return count_arg(text)


def seed_arg(text: str) -> int:
    try:
        return check_seed(int(text))
    except (ValueError, InputError):
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer in [0, 2**64)") from None


def package_version() -> str:
    try:
        return version("iosim")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def add_problem(p: argparse.ArgumentParser, grouped: bool = True, windowed: bool = True, batches: bool = False,
                dtype_help: str = "element size for bytes and for M given in bytes (default float16)") -> None:
    """The options of the problem itself, spelled the same by every command (``grouped``: --kv-heads too;
    ``windowed``: --window too; ``batches``: --batch takes a list; ``dtype_help``: what --dtype does there)."""
    if batches:
        p.add_argument("--batch", type=count_arg, nargs="+", action=Distinct, default=[1],
                       help="batch sizes, e.g. 1 8 64 (default 1)")
    else:
        p.add_argument("--batch", type=count_arg, default=1)
    p.add_argument("--heads", type=count_arg, default=1)
    if grouped:
        p.add_argument("--kv-heads", type=count_arg, default=None,
                       help="K/V heads shared by the query heads (grouped-query attention), a divisor of --heads; "
                            "1 is MQA (default: --heads)")
    p.add_argument("--causal", action="store_true", help="bottom-right aligned causal mask")
    if windowed:
        p.add_argument("--window", type=signed_count_arg, nargs="+", action=Once, metavar="L R", default=None,
                       help="sliding window as flash-attn's window_size: L keys back and R ahead of the diagonal, "
                            "-1 unbounded; one number W is (W, 0). Algorithms that take none are left out")
    p.add_argument("--dtype", choices=sorted(DTYPE_ITEMSIZE), default="float16", help=dtype_help)


def add_outputs(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--json", metavar="PATH", help=f"save {what} as JSON")
    p.add_argument("--csv", metavar="PATH", help=f"save {what} as CSV")


def add_simulation(p: argparse.ArgumentParser) -> None:
    """The options of sweep and run: the memory, the problem, the policy, the pass, the block mask, the outputs."""
    p.add_argument("--M", default=None,
                   help="SRAM capacity: 100k (×1000), 64Ki (×1024) elements, or bytes with a B: 192KiB "
                        "(default 100k, or with --gpu its shared memory per SM; an --M up to that wins)")
    p.add_argument("--gpu", type=str.lower, choices=sorted(GPUS), default=None,
                   help="hardware preset: sets M and the SMs split-kv's default splits fill; a sweep adds GB, "
                        "GFLOPs, intensity and a roofline time")
    add_problem(p)
    p.add_argument("--d-v", type=count_arg, default=None,
                   help="head size of V and of the output O, apart from Q's and K's --d (MLA's heads: --d 192 --d-v "
                        "128; default: d)")
    p.add_argument("--flex-mask", nargs="+", action=Once, default=None, metavar="NAME",
                   help="a FlexAttention block mask, which flex runs over: causal, window W, document (of --seqlens), "
                        "prefix_lm P, sinks_window K W (StreamingLLM), or module:function, a mask function of (b, h, "
                        "q_idx, kv_idx)")
    p.add_argument("--flex-block", type=count_arg, nargs=2, action=Once, default=None, metavar=("B_r", "B_c"),
                   help="with --flex-mask: the block mask's blocks (default 128 128, FlexAttention's)")
    p.add_argument("--flex-heads", action="store_true",
                   help="evaluate a --flex-mask module:function for every batch entry and head (FlexAttention's B "
                        "and H), each head running over its own blocks (default: once, at b = h = 0, for all)")
    p.add_argument("--score-mod", nargs="+", action=Once, default=None, metavar="NAME",
                   help="a FlexAttention score_mod, which flex applies to every score (forward and backward): "
                        "softcap T (Gemma 2's T·tanh(s/T)), relative_bias w (s − w·|i − j|), or module:name of an "
                        "iosim.variants.score_mods.score_mod(...)")
    p.add_argument("--latent", action="store_true",
                   help="multi-head latent attention's cache, projections absorbed (DeepSeek-V3 decoding, FlashMLA): "
                        "V is the first --d-v columns of K, which alone is read; split-kv, flash-swapped and flex "
                        "take it")
    add_l2_options(p)
    p.add_argument("--splits", type=signed_count_arg, default=None,
                   help="split-kv: K/V splits, 1 to the number of K/V blocks (default: enough to fill the SMs "
                        "of the --gpu preset, an H100's 132 without one)")
    p.add_argument("--page-size", type=count_arg, default=None,
                   help="split-kv, flash-swapped: K/V in a paged cache of pages of this many tokens, read by rows "
                        "through a block table (default: contiguous)")
    p.add_argument("--sinks", action="store_true",
                   help="learned attention sinks (gpt-oss), one logit per query head: flash, flash-swapped and "
                        "split-kv take them forward, flash and flash-swapped backward too (run draws them from --seed "
                        "after q, k, v)")
    p.add_argument("--seqlens", type=count_arg, nargs="+", action=Once, default=None, metavar="L",
                   help="documents packed end to end, each attending only to itself (flash-attn's varlen): their "
                        "lengths, e.g. 100 2000 37, instead of --N; compared with padding each to the longest")
    p.add_argument("--block-policy", choices=list(POLICIES), default="fit",
                   help="fit: largest blocks that fit M (default); paper: B_c = ceil(M/4d), B_r = min(B_c, d); "
                        "optimal: any block shape, fewest HBM accesses (iosim optimize)")
    p.add_argument("--pass", dest="pass_", choices=PASSES, default="fwd",
                   help="fwd: the forward pass (default); bwd: the backward pass; fwd+bwd: a training step")
    add_block_mask(p)
    add_outputs(p, "the results")


def add_block_mask(p: argparse.ArgumentParser) -> None:
    """The block mask of the block-sparse algorithms (sweep, run, optimize)."""
    p.add_argument("--sparsity", type=float, default=None,
                   help="block-sparse algorithms: the fraction of nonzero tiles in (0, 1] (default: dense)")
    p.add_argument("--sparsity-pattern", choices=PATTERNS, default=None,
                   help="with --sparsity: random, local (banded) or strided block mask (default random)")
    p.add_argument("--sparsity-seed", type=seed_arg, default=None, help="with --sparsity: seed of a random block "
                                                                          "mask (default 0)")


def bytes_arg(text: str) -> int:
    """A byte count with an optional trailing B (37M, 37MB, 32MiB), for argparse."""
    try:
        return parse_bytes("value", text)
    except InputError as err:
        raise argparse.ArgumentTypeError(str(err).replace(f"value={text!r}", text, 1)) from None


def schedule_arg(text: str) -> str:
    """A schedule of the L2 model (iosim.gpu.hardware.SCHEDULES), for argparse; a retired one is refused with why."""
    try:
        return check_schedule(text)
    except InputError as err:
        raise argparse.ArgumentTypeError(str(err).replace(f"schedule={text!r}", text, 1)) from None


def add_l2_options(p: argparse.ArgumentParser) -> None:
    """The L2 model's overrides, for --gpu (docs/gpu.md)."""
    p.add_argument("--l2-bytes", type=bytes_arg, default=None, metavar="BYTES",
                   help="with --gpu: the L2 bytes DRAM sees, e.g. 25MB or 32MiB (default: the preset's effective "
                        "capacity, 37 MB on an H100)")
    p.add_argument("--blocks-per-sm", type=count_arg, default=None, metavar="N",
                   help="with --gpu: thread blocks one SM holds, for every kernel (default: each kernel's, from "
                        "its registers, shared memory and threads under the preset's limits: iosim gpus)")
    p.add_argument("--schedule", type=schedule_arg, default="lockstep", metavar="{" + ",".join(SCHEDULES) + "}",
                   help="with --gpu: how the thread blocks run: lockstep (start together, default) or timed (each at "
                        "its speed, stalling on its L2 misses; the forward of kernels with a measured rate, always "
                        "simulated)")
    p.add_argument("--kernel", choices=sorted(KERNELS), default=None, metavar="NAME",
                   help="with --gpu: the kernel description whose grids the DRAM level runs, for the algorithm it "
                        "implements (default: the kernel of kernels/ named as the algorithm; `iosim kernels` lists "
                        "them)")


def l2_overrides(args: argparse.Namespace) -> dict[str, object]:
    """The L2 model's options (``add_l2_options``) the user set, by flag: those left at their defaults are not in it."""
    given = {"--l2-bytes": args.l2_bytes, "--blocks-per-sm": args.blocks_per_sm,
             "--schedule": None if args.schedule == "lockstep" else args.schedule, "--kernel": args.kernel}
    return {name: value for name, value in given.items() if value is not None}


def hardware_of(args: argparse.Namespace) -> Hardware | None:
    """--gpu with --l2-bytes, --blocks-per-sm and --schedule, resolved once; None without --gpu. The overrides (and
    --kernel) are refused without --gpu, whose L2 they change, and a --kernel built for other GPUs than --gpu."""
    given = l2_overrides(args)
    if args.gpu is None:
        if given:
            name, value = next(iter(given.items()))
            raise InputError(f"{name} {value} without --gpu: it changes a GPU preset's L2 model; allowed: --gpu NAME "
                             f"{name} {value}")
        return None
    hw = hardware(args.gpu, l2_bytes=args.l2_bytes, blocks_per_sm=args.blocks_per_sm, schedule=args.schedule,
                  physical=True)
    if args.kernel is not None:
        KERNELS[args.kernel].check_gpu(hw.gpu.name)
    return hw


def left_out_by(option: str, pass_: str = "fwd") -> list[str]:
    """The algorithms a command that names none lists in ``pass_`` (``algorithms_of``) but leaves out once ``option``
    (one of the OPTIONS: a window, packed documents, an FP8 dtype, ...) is set."""
    return [name for name, a in ALGORITHMS.items() if a.listed_by_default((), pass_)
            and not a.listed_by_default((option,), pass_) and (a.backward is not None or pass_ == "fwd")]


def kernel_reach(args: argparse.Namespace, algorithms: list[str]) -> str | None:
    """What --kernel serves among the ``algorithms`` a command counts: refused where it implements none of them (it
    would change nothing), else a note naming those it leaves to their own kernels, None where it leaves none."""
    if args.kernel is None:
        return None
    implements = KERNELS[args.kernel].algorithm
    if implements not in algorithms:
        fitting = sorted(k.name for k in KERNELS.values() if k.algorithm in algorithms
                         and (k.runs_on is None or args.gpu is not None and GPUS[args.gpu].name in k.runs_on))
        raise InputError(f"--kernel {args.kernel} implements {implements}, which is not counted here "
                         f"({', '.join(algorithms)}); allowed: "
                         + (f"--kernel one of {', '.join(fitting)}; " if fitting else "") + f"--algo {implements}; "
                         f"or no --kernel")
    ignoring = [a for a in algorithms if a != implements]
    if not ignoring:
        return None
    return f"--kernel {args.kernel} implements {implements} only; ignored by {', '.join(ignoring)}"


def window_of(args: argparse.Namespace) -> tuple[int, int] | None:
    """--window as (left, right): ``W`` is (W, 0), ``L R`` is (L, R); None without it."""
    values = getattr(args, "window", None)
    if values is None:
        return None
    if len(values) > 2:
        raise InputError(f"--window {' '.join(map(str, values))}: takes W (for W 0) or L R; got {len(values)} numbers")
    return (values[0], 0) if len(values) == 1 else (values[0], values[1])


def lengths_of(args: argparse.Namespace, default):
    """--N, or with --seqlens (packed documents) their longest (with ``--flex-mask document``, their sum: one
    sequence, the mask keeping each document to itself); --N and --N-k are refused beside --seqlens."""
    if args.seqlens is None:
        return default if args.N is None else args.N
    if args.N is not None or args.N_k is not None:
        given = " ".join(f"{flag} {value if not isinstance(value, list) else ' '.join(map(str, value))}"
                         for flag, value in (("--N", args.N), ("--N-k", args.N_k)) if value is not None)
        raise InputError(f"{given} with --seqlens: the documents set the lengths; allowed: --seqlens alone")
    return sum(args.seqlens) if flex_documents(args) else max(args.seqlens)


def flex_documents(args: argparse.Namespace) -> bool:
    """Whether --seqlens are the documents of ``--flex-mask document`` rather than packed documents of their own."""
    return (getattr(args, "flex_mask", None) or [None])[0] == "document"


def documents(args: argparse.Namespace) -> list[int] | None:
    """The packed documents a command counts (--seqlens), None where a FlexAttention document mask takes them."""
    return None if flex_documents(args) else args.seqlens


def score_mod_of(args: argparse.Namespace) -> ScoreMod | None:
    """--score-mod NAME [ARG] as a score_mod; None without it. It needs --flex-mask: flex, which applies it, runs over
    a block mask."""
    spec = getattr(args, "score_mod", None)
    if spec is not None and getattr(args, "flex_mask", None) is None:
        raise InputError(f"--score-mod {' '.join(spec)} without --flex-mask: flex, the algorithm that applies a "
                         f"score_mod, runs over a FlexAttention block mask; allowed: --flex-mask NAME [ARG] beside it "
                         f"(--flex-mask causal, say)")
    return None if spec is None else named_score_mod(spec)


def flex_mask_for(args: argparse.Namespace) -> Callable[[int, int], FlexBlockMask] | None:
    """--flex-mask NAME [ARG ...] as the block mask of a problem's (N_q, N_k), in blocks of --flex-block; None
    without one."""
    if getattr(args, "flex_mask", None) is None:
        if getattr(args, "flex_heads", False):
            raise InputError("--flex-heads without --flex-mask: it evaluates a mask function for every head; allowed: "
                             "--flex-mask module:function --flex-heads")
        if getattr(args, "flex_block", None) is not None:
            raise InputError(f"--flex-block {' '.join(map(str, args.flex_block))} without --flex-mask: it sets the "
                             f"blocks of a FlexAttention block mask; allowed: --flex-mask NAME --flex-block B_r B_c")
        return None
    if documents(args) is not None:
        raise InputError(f"--seqlens with --flex-mask {' '.join(args.flex_mask)}: a block mask keeps packed documents "
                         f"apart itself; allowed: --flex-mask document with --seqlens, or no --seqlens")
    heads = (args.batch, args.heads) if getattr(args, "flex_heads", False) else None
    block = args.flex_block or FLEX_BLOCK
    return lambda n_q, n_k: named_mask(args.flex_mask, n_q, n_k, block=block, seqlens=args.seqlens, per_head=heads)


def band_title(pb: Problem) -> str:
    """How a title names a problem's band: causal, a window, both, a FlexAttention block mask, or no mask."""
    if pb.flex is not None:
        return f"FlexAttention mask {pb.flex.label}"
    window = f"window ({pb.window.left}, {pb.window.right})" if pb.window is not None else ""
    causal = "causal" if pb.causal else ""
    return ", ".join(x for x in (causal, window) if x) or "no mask"


def block_sparsity(args: argparse.Namespace) -> BlockSparsity | None:
    """--sparsity's block mask; --sparsity-pattern or --sparsity-seed without it is refused, not ignored."""
    if args.sparsity is None:
        for flag, value in (("--sparsity-pattern", args.sparsity_pattern), ("--sparsity-seed", args.sparsity_seed)):
            if value is not None:
                raise InputError(f"{flag} {value} without --sparsity: it shapes the block-sparse algorithms' block "
                                 f"mask, which --sparsity makes; allowed: --sparsity S {flag} {value}")
        return None
    return BlockSparsity(args.sparsity, args.sparsity_pattern or "random",
                         0 if args.sparsity_seed is None else args.sparsity_seed)


def algorithms_of(args: argparse.Namespace) -> list[str]:
    """The algorithms a command covers: those named, else all that apply (block-sparse ones only with a block
    mask to use, with a window, documents, sinks, a latent cache or an FP8 dtype only those that take them, and with
    --pass bwd or fwd+bwd only those with a backward pass)."""
    if args.algo is not None:
        return args.algo
    score_mod_of(args)  # a score_mod without a block mask: refused by name before the list is made
    given = (("block_sparsity",) * (getattr(args, "sparsity", None) is not None)
             + ("window",) * (window_of(args) is not None)
             + ("seqlens",) * (getattr(args, "seqlens", None) is not None and not flex_documents(args))
             + ("sinks",) * bool(getattr(args, "sinks", False))
             + ("latent",) * bool(getattr(args, "latent", False))
             + ("fp8",) * (getattr(args, "dtype", None) in FP8_DTYPES)
             + ("block_mask",) * (getattr(args, "flex_mask", None) is not None)
             + ("score_mod",) * (getattr(args, "score_mod", None) is not None))
    pass_ = getattr(args, "pass_", "fwd")
    listed = [name for name, a in ALGORITHMS.items()
              if a.listed_by_default(given, pass_) and (a.backward is not None or pass_ == "fwd")]
    if not listed:
        raise InputError(f"no algorithm takes {', '.join(given)} together{f' in pass {pass_!r}' * (pass_ != 'fwd')}; "
                         f"allowed: fewer of them, or --algo NAME to be told which it refuses")
    return listed


def check_backward(algorithms: list[str], pass_: str) -> None:
    """Refuse an algorithm without a backward pass before anything runs."""
    if pass_ != "fwd":
        for algo in algorithms:
            backward_of(ALGORITHMS[algo])
