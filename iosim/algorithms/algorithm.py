"""What an algorithm declares about itself: its tensors, its run function and its closed forms.

Each module in ``iosim/algorithms/`` builds one ``Algorithm`` and the registry lists
it; nothing else in iosim names an algorithm. The closed forms may share the tiling
and the visited tiles (``iosim.core.visits``) with the run function, never the simulation.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from iosim.core.counts import Counts, TensorCounts
from iosim.core.errors import InputError
from iosim.core.flops import Flops
from iosim.core.problem import ELEMENTS, Problem
from iosim.core.tiling import Tiling, ceil_div
from iosim.core.units import parse_count

if TYPE_CHECKING:
    from iosim.core.memory import Memory

ROLES = ("input", "output", "intermediate")


@dataclass(frozen=True)
class Tensor:
    """An HBM tensor of rows × cols per batch·head, sizes named as ``Problem.dim`` names them."""

    name: str
    rows: str  # "N_q", "N_k", "d", "d_v" or "1", or "S·N_q": one block of N_q rows per K/V split (Tiling.splits)
    cols: str
    role: str  # one of ROLES: read only, returned, or written and read back within the run
    element: str = "data"  # one of ELEMENTS: sets the bytes per element
    kv: bool = False  # one per batch·kv_head (K, V under grouped-query attention), not per batch·head

    def __post_init__(self):
        if self.role not in ROLES or self.element not in ELEMENTS:
            raise ValueError(f"tensor {self.name}: role {self.role!r} must be one of {ROLES} and element "
                             f"{self.element!r} one of {ELEMENTS}")

    def shape(self, pb: Problem, tiling: Tiling | None = None) -> tuple[int, int]:
        """Rows and columns per head; a factor S is the tiling's number of K/V splits (1 without a tiling)."""
        def size(dims: str) -> int:
            n = 1
            for name in dims.split("·"):
                n *= (tiling.splits if tiling is not None else 1) if name == "S" else pb.dim(name)
            return n
        return size(self.rows), size(self.cols)


# What every algorithm reads: Q, K, V, and the boolean mask when the problem has one.
# K and V have kv_heads heads (grouped-query attention); every algorithm that runs per query head reads
# its group's K/V as its own, so its K/V reads are counted per query head.
INPUTS = (Tensor("Q", "N_q", "d", "input"), Tensor("K", "N_k", "d", "input", kv=True),
          Tensor("V", "N_k", "d_v", "input", kv=True))
MASK = Tensor("mask", "N_q", "N_k", "input", "mask")
# A paged KV cache's block table (iosim.variants.paging): one int32 page index per page; one per request in a serving
# engine, held here per K/V head, which its heads read as their own (no count depends on the copies)
BLOCK_TABLE = Tensor("block_table", "pages", "1", "input", "index", kv=True)
# Learned attention sinks (Problem.sinks): one logit per query head, read by the algorithms that take them; a head of
# a problem packed by GQA group holds its group's
SINKS = Tensor("sinks", "packed", "1", "input", "stat")
# and their gradient, which a backward pass that takes them writes: Σ over the head's rows of −P_sink·D
DSINKS = Tensor("dsinks", "packed", "1", "output", "stat")
# A FlexAttention block mask's index tensors (Problem.flex), int32, as create_block_mask builds them: per query block
# the number of partial (kv_num_blocks) and of full (full_kv_num_blocks) key blocks, and their indices; one copy per
# K/V head (the mask is every head's), which each query head reads as its own
FLEX_INDICES = (Tensor("kv_num_blocks", "T_r", "1", "input", "index", kv=True),
                Tensor("kv_indices", "T_r", "T_c", "input", "index", kv=True),
                Tensor("full_kv_num_blocks", "T_r", "1", "input", "index", kv=True),
                Tensor("full_kv_indices", "T_r", "T_c", "input", "index", kv=True))
# and its transpose, which a backward pass's dK, dV loop reads: per key block, its partial and full query blocks
FLEX_INDICES_T = (Tensor("q_num_blocks", "T_c", "1", "input", "index", kv=True),
                  Tensor("q_indices", "T_c", "T_r", "input", "index", kv=True),
                  Tensor("full_q_num_blocks", "T_c", "1", "input", "index", kv=True),
                  Tensor("full_q_indices", "T_c", "T_r", "input", "index", kv=True))
# FP8 data's descales (Problem.fp8): one float32 each for Q, K and V per K/V head, as FlashAttention-3's FP8 forward
# takes q_descale, k_descale and v_descale of (batch, kv_heads); every thread block reads its head's three once
DESCALES = Tensor("descale", "1", "QKV", "input", "stat", kv=True)
# What attention writes: O, and in the FlashAttention family the softmax statistics ℓ and m.
OUTPUT = Tensor("O", "N_q", "d_v", "output", "out")
STATISTICS = (Tensor("l", "N_q", "1", "output", "stat"), Tensor("m", "N_q", "1", "output", "stat"))
# What every backward pass reads beside Q, K, V, and what it returns.
DOUT = Tensor("dO", "N_q", "d_v", "input")
GRADIENTS = (Tensor("dQ", "N_q", "d", "output"), Tensor("dK", "N_k", "d", "output"),
             Tensor("dV", "N_k", "d_v", "output"))


def saved(*tensors: Tensor) -> tuple[Tensor, ...]:
    """The forward pass's tensors as a backward pass reads them: inputs, taken from the forward's HBM."""
    return tuple(replace(t, role="input") for t in tensors)


# The HBM of a backward pass whose first pass saves D = rowsum(dO ∘ O) and the log-sum-exp L per query row
# (FlashAttention-2's: flash-swapped's and flex's backward passes)
STATISTICS_PASS_TENSORS = (
    *saved(OUTPUT, *STATISTICS), DOUT,
    Tensor("D", "N_q", "1", "intermediate", "stat"), Tensor("L", "N_q", "1", "intermediate", "stat"),
    *GRADIENTS,
)


# Options of a run that only some algorithms take, by their API keyword; ``Needs`` says which an algorithm takes.
OPTIONS = ("block_sparsity", "splits", "window", "page_size", "seqlens", "sinks", "latent", "fp8", "block_mask",
           "score_mod")


@dataclass(frozen=True)
class SplitRule:
    """How an algorithm that splits K/V (``Tiling.splits``) counts its splits: its default and their range."""

    # the default number of splits given the problem, the blocks and the GPU's SM count
    default: Callable[[Problem, Tiling, int], int]
    # the most keys one query block deals to its splits (N_k when it reads every key; fewer under a sliding window)
    keys: Callable[[Problem, Tiling], int]


@dataclass(frozen=True)
class Needs:
    """What an algorithm asks of the generic layers beyond Q, K, V and a tiling; the default asks for nothing.

    Declared once, in the algorithm's module. Generic code never reads these fields: it
    asks the ``Algorithm`` (``accepts``, ``listed_by_default``, ``run_problem``,
    ``with_splits``, ``step_shares_tiling``), the one place where their rules live.
    """

    # it skips the zero tiles of the problem's block mask (Problem.block_sparsity, defined on its tiles): its
    # backward pass must then run on the forward's tiles, so a training step uses one tiling for both passes
    block_mask: bool = False
    # it serves each GQA group of query heads from one K/V load: it runs on the problem packed by group
    # (Problem.packed_by_group: batch·kv_heads heads of G·N_q query rows), so its counts show the saving
    packs_groups: bool = False
    # it takes a sliding window (Problem.window): it skips the tiles outside the band, or masks S with it
    window: bool = False
    # how it chooses and bounds its K/V splits (Tiling.splits); None when it does not split K/V
    splits: SplitRule | None = None
    # it reads K and V from a paged cache through a block table (Problem.page_size, iosim.variants.paging)
    pages: bool = False
    # it takes learned attention sinks (Problem.sinks): a forward pass reads each query block's sink logits, a
    # backward pass reads them too and writes their gradient (DSINKS)
    sinks: bool = False
    # it reads MLA's latent cache (Problem.latent): K alone, V_j being the first d_v columns of K_j on chip; forward
    latent: bool = False
    # it has an FP8 forward (Problem.fp8, a dtype of FP8_DTYPES): each thread block reads its head's descales
    fp8: bool = False
    # it runs over a FlexAttention block mask (Problem.flex), on the mask's blocks, which it needs: its only mask
    flex: bool = False


@dataclass(frozen=True)
class Algorithm:
    """One attention algorithm: how it runs on a ``Memory`` and what it moves, in closed form.

    All callables take the problem, the tiling and the SRAM capacity M in elements.
    ``traffic`` returns the exact ``Counts`` (peak SRAM included) that a run must measure.

    A backward pass is an ``Algorithm`` too, held by its forward's ``backward``: its
    tensors declare dO and what it reads of the forward's HBM (O, ℓ, m or P) as inputs,
    and dQ, dK, dV as outputs. The registry lists forward algorithms only.
    """

    name: str
    run: Callable[[Memory, Problem, Tiling], None]
    tensors: tuple[Tensor, ...]  # what it writes to HBM, beside the inputs
    outer: str  # the block of the outer loop, "Br" or "Bc": block policies size it first
    working_set: Callable[[Problem, Tiling, int], int]  # on-chip elements per head with full blocks
    traffic: Callable[[Problem, Tiling, int], Counts]
    paper_form: Callable[[Problem, int], float]  # the paper's asymptotic form, elements
    paper_label: str
    baseline: bool = False  # the algorithm the others are compared with
    backward: Algorithm | None = None  # its backward pass, itself an Algorithm; None when it has none
    flops: Callable[[Problem, Tiling, int], Flops] | None = None  # exact arithmetic, as the run counts it
    needs: Needs = field(default_factory=Needs)  # what it asks of the generic layers

    def hbm_tensors(self, pb: Problem) -> tuple[Tensor, ...]:
        return hbm_tensors(self.tensors, pb)

    def outputs(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tensors if t.role == "output")

    def saved_inputs(self) -> tuple[str, ...]:
        """Inputs beside Q, K, V and the mask: for a backward pass, dO and what its forward saved."""
        return tuple(t.name for t in self.tensors if t.role == "input")

    # --- the seam: what the generic layers ask of an algorithm ---------------------------------------------
    @property
    def is_backward(self) -> bool:
        """A backward pass: it reads dO and returns the gradients (see ``Algorithm``)."""
        return DOUT.name in self.saved_inputs()

    def accepts(self, option: str) -> bool:
        """Whether its runs use ``option``, one of OPTIONS; the others leave it unread."""
        if option not in OPTIONS:
            raise ValueError(f"option {option!r} is not one of {OPTIONS}")
        # packed documents (iosim.variants.varlen) are a sum of plain problems at the longest's tiling, which every
        # algorithm counts, except one that splits K/V: its splits are sized per sequence, and one count of splits
        # cannot serve documents of every length (a short one has fewer K/V blocks than splits)
        return {"block_sparsity": self.needs.block_mask, "splits": self.needs.splits is not None,
                "window": self.needs.window, "page_size": self.needs.pages,
                "seqlens": self.needs.splits is None and not self.needs.flex, "sinks": self.needs.sinks,
                "latent": self.needs.latent, "fp8": self.needs.fp8, "block_mask": self.needs.flex,
                "score_mod": self.needs.flex}[option]

    def refuse_options(self, pb: Problem, pass_: str, algorithms: Iterable[Algorithm]) -> None:
        """Refuse, by name, the first option of ``pb`` that this algorithm does not take for ``pass_`` (a block mask,
        a sliding window, a paged cache, attention sinks, packed documents), naming those of ``algorithms`` that take
        it: the one refusal that ``iosim.api.plan`` and ``iosim.reports.optimize`` use."""
        algorithms = tuple(algorithms)
        if pb.block_sparsity is not None and not self.accepts("block_sparsity"):
            raise InputError(f"block_sparsity for {self.name}: it has no block mask; allowed: block_sparsity=None, "
                             f"or an algorithm that takes one: "
                             f"{[a.name for a in algorithms if a.accepts('block_sparsity')]}")
        if pb.window is not None and not self.accepts("window"):
            raise InputError(f"window=({pb.window.left}, {pb.window.right}) for {self.name}: "
                             f"it takes no sliding window; allowed: window=None, or an algorithm that takes one: "
                             f"{[a.name for a in algorithms if a.accepts('window')]}")
        if pb.page_size and not (self.accepts("page_size") and pass_ == "fwd"):
            raise InputError(f"page_size={pb.page_size} for {self.name}, pass {pass_!r}: it reads no paged K/V cache; "
                             f"allowed: page_size=None, or the forward pass of one that does: "
                             f"{[a.name for a in algorithms if a.accepts('page_size')]}")
        if pb.sinks and not self.takes_sinks(pass_):
            why = ("it has no backward pass" if pass_ != "fwd" and self.backward is None else
                   f"{'its backward pass' if self.accepts('sinks') else 'it'} takes no attention sinks")
            raise InputError(f"sinks for {self.name}, pass {pass_!r}: {why}; allowed: sinks=False, or one that "
                             f"takes them in that pass: {[a.name for a in algorithms if a.takes_sinks(pass_)]}")
        if pb.latent and not (self.accepts("latent") and pass_ == "fwd"):
            raise InputError(f"latent for {self.name}, pass {pass_!r}: it reads V apart from K, not MLA's latent "
                             f"cache; allowed: latent=False, or the forward pass of one that reads it: "
                             f"{[a.name for a in algorithms if a.accepts('latent')]}")
        if pb.flex is not None and not self.takes_flex(pass_):
            raise InputError(f"block_mask for {self.name}, pass {pass_!r}: it runs over no FlexAttention block mask; "
                             f"allowed: block_mask=None, or one that does in that pass: "
                             f"{[a.name for a in algorithms if a.takes_flex(pass_)]}")
        if self.accepts("block_mask") and pb.flex is None:
            raise InputError(f"{self.name} with block_mask=None: it runs over a FlexAttention block mask and has none; "
                             f"allowed: a block mask (iosim.block_mask; --flex-mask in sweep and run)")
        if self.accepts("block_mask") and (pb.causal or pb.has_mask):
            raise InputError(f"{self.name} with block_mask={pb.flex.name!r}, causal={pb.causal}, an explicit mask "
                             f"{pb.has_mask}: its block mask is its only mask (iosim.variants.flex.causal makes a "
                             f"causal one); allowed: causal=False and no explicit mask")
        if pb.score_mod is not None and not (self.accepts("score_mod")
                                             and (pass_ == "fwd" or pb.score_mod.grad is not None)):
            takers = [a.name for a in algorithms if a.accepts("score_mod")]
            if self.accepts("score_mod"):
                why, allowed = ("a score_mod's gradient needs its derivative, and this one has none",
                                "pass 'fwd', or a score_mod with its derivative (score_mod(..., grad=))")
            else:
                why, allowed = "it runs no FlexAttention score_mod", f"an algorithm that runs one: {takers}"
            raise InputError(f"score_mod {pb.score_mod.name!r} for {self.name}, pass {pass_!r}: {why}; allowed: "
                             f"score_mod=None, or {allowed}")
        shared = set(getattr(pb.flex, "reads", ())) & set(getattr(pb.score_mod, "reads", ()))
        if shared:
            raise InputError(f"reads {sorted(shared)} declared by both the block mask and the score_mod: each tensor "
                             f"is read under one name; allowed: distinct names")
        if pb.fp8 and not (self.accepts("fp8") and pass_ == "fwd"):
            raise InputError(f"dtype={pb.dtype!r} for {self.name}, pass {pass_!r}: it has no FP8 path "
                             f"(FlashAttention-3's FP8 kernels are forward only); allowed: a dtype of 2 or more bytes, "
                             f"or the forward pass of one that has: {[a.name for a in algorithms if a.accepts('fp8')]}")
        if pb.sinks and pb.seqlens is not None:
            raise InputError("sinks with seqlens: packed documents take no attention sinks here; allowed: one of them")
        if pb.seqlens is not None and not self.accepts("seqlens"):
            why = ("its K/V splits are sized per sequence" if self.needs.splits is not None else
                   "its block mask keeps documents apart itself: iosim.variants.flex.document")
            raise InputError(f"seqlens for {self.name}: it takes no packed documents ({why}); allowed: seqlens=None, "
                             f"or an algorithm that takes them: "
                             f"{[a.name for a in algorithms if a.accepts('seqlens')]}")

    def takes_flex(self, pass_: str) -> bool:
        """Whether every pass of ``pass_`` runs over a FlexAttention block mask: its forward, and its backward where it
        runs one."""
        backward = self.backward is not None and self.backward.accepts("block_mask")
        return self.accepts("block_mask") and (pass_ == "fwd" or backward)

    def takes_sinks(self, pass_: str) -> bool:
        """Whether every pass of ``pass_`` takes learned attention sinks: its forward, and its backward where it
        runs one."""
        backward = self.backward is not None and self.backward.accepts("sinks")
        return self.accepts("sinks") and (pass_ == "fwd" or backward)

    def listed_by_default(self, given: Collection[str], pass_: str = "fwd") -> bool:
        """Whether a command that names no algorithm lists it for ``pass_``, given the OPTIONS the user set: one that
        adds a block mask to another algorithm repeats that algorithm without a mask to use, and one that takes no
        window (no packed documents, no sinks in that pass, no latent cache, no FP8 path) is left out when a window
        (documents, sinks, MLA's latent cache, an FP8 dtype) is set; one that runs over a FlexAttention block mask
        is listed exactly when one is given (a score_mod lists only those)."""
        return ((not self.needs.block_mask or "block_sparsity" in given)
                and ("window" not in given or self.needs.window)
                and ("seqlens" not in given or self.accepts("seqlens"))
                and ("sinks" not in given or self.takes_sinks(pass_))
                and ("latent" not in given or self.accepts("latent") and pass_ == "fwd")
                and ("fp8" not in given or self.accepts("fp8") and pass_ == "fwd")
                and ("score_mod" not in given or self.accepts("score_mod"))
                and ("block_mask" in given) == self.accepts("block_mask"))

    def own_tiling(self, pb: Problem) -> Tiling | None:
        """The tiling its runs take whatever the block policy: a FlexAttention block mask's blocks, for one that runs
        over it (``Needs.flex``); None for the others."""
        return Tiling(pb.flex.Br, pb.flex.Bc) if self.needs.flex and pb.flex is not None else None

    def run_problem(self, pb: Problem) -> Problem:
        """The problem as it runs it: packed by GQA group when it serves a group from one K/V load."""
        return pb.packed_by_group() if self.needs.packs_groups else pb

    def follows_block_mask(self, pb: Problem) -> bool:
        """Whether its traffic on ``pb`` follows a block mask drawn on each tiling's own tiles.

        Then a change of block count redraws which tiles are visited, so traffic need not
        fall as a block grows, nor be the same for every block of one block count: the
        ``optimal`` search (``iosim.tilings.search``) evaluates the corners of each pair of block
        counts where the problem has no band, and every tiling that fits where it has one.
        """
        return self.needs.block_mask and pb.block_sparsity is not None

    @property
    def step_shares_tiling(self) -> bool:
        """A training step runs both passes on one tiling (the backward's, which fits the forward too)."""
        return self.needs.block_mask

    def with_splits(self, pb: Problem, tiling: Tiling, splits: int | None, default: bool, sms: int,
                    fixed: bool = False) -> Tiling:
        """``tiling`` with its K/V splits: ``splits`` when given, else (``default``) its own policy's count for a
        GPU of ``sms`` SMs, else 1. One that does not split takes only 1; one that does, over the K keys its widest
        query block deals to its splits (``SplitRule.keys``: N_k without a window), 1 to ⌈K/B_c⌉ of a ``fixed``
        (user-given) tiling, else 1 to K: a policy's K/V blocks are shortened to ⌊K/S⌋ where they are fewer than the
        S splits, as a decode kernel sizes its splits first."""
        n_k = pb.shape.n_k
        rule = self.needs.splits
        if splits is None and fixed and tiling.splits != 1:  # a given Tiling(splits=S) asks for S splits
            splits = tiling.splits
        if splits is None and rule is not None and default:
            splits = rule.default(pb, tiling, sms)
        if splits is None:
            return tiling
        try:  # a count as counts are taken (4, 4.0, "4"); one out of every range is named with this one's below
            splits = parse_count("splits", splits)
        except InputError as err:
            if "outside the allowed range" not in str(err):
                raise
        keys = rule.keys(pb, tiling) if rule is not None else n_k
        blocks = ceil_div(keys, tiling.Bc)  # a run of K keys meets at least ⌈K/B_c⌉ blocks
        most = (blocks if fixed else keys) if rule is not None else 1
        if isinstance(splits, bool) or not isinstance(splits, int) or not 1 <= splits <= max(most, 1):
            seen = "" if keys == n_k else f" in the {keys} keys a query block sees"
            what = f" (the number of K/V blocks of B_c={tiling.Bc}{seen})" if fixed else \
                f" ({'the keys a query block sees' if seen else 'N_k'})"
            raise InputError(f"splits={splits!r} for {self.name} at N_k={n_k}; allowed: 1"
                             f"{f' to {max(most, 1)}{what}' if rule is not None else ''}")
        if 0 < blocks < splits:
            tiling = replace(tiling, Bc=keys // splits)  # at least S blocks in the widest run
        return replace(tiling, splits=splits)


def hbm_tensors(own: tuple[Tensor, ...], pb: Problem) -> tuple[Tensor, ...]:
    """Every HBM tensor of a run of an algorithm that writes ``own``, in the order results list them."""
    backward = DOUT in own  # a backward pass writes the sinks' gradient beside its own
    inputs = tuple(t for t in INPUTS if not (pb.latent and t.name == "V"))  # MLA's V is columns of the latent K
    flex = () if pb.flex is None else FLEX_INDICES + FLEX_INDICES_T * backward + tuple(
        Tensor(name, "N", "1", "input", "index", kv=True) for name in pb.flex.reads)  # what its function reads
    if pb.score_mod is not None:  # and what a score_mod reads, float32 entries
        flex += tuple(Tensor(name, "N", "1", "input", "stat", kv=True) for name in pb.score_mod.reads)
    return (inputs + ((DESCALES,) if pb.fp8 else ()) + flex
            + ((MASK,) if pb.has_mask else ()) + ((BLOCK_TABLE,) if pb.page_size else ())
            + ((SINKS,) if pb.sinks else ()) + own + ((DSINKS,) if pb.sinks and backward else ()))


def exact_counts(own: tuple[Tensor, ...], pb: Problem, reads: dict[str, int], writes: dict[str, int],
                 peak_sram: int) -> Counts:
    """Counts from per-head element counts by tensor name (absent means 0), scaled to all batch·heads.

    Every head of the run counts its reads of K and V, its group's under grouped-query
    attention, as the memory does.
    """
    tensors = hbm_tensors(own, pb)
    unknown = (set(reads) | set(writes)) - {t.name for t in tensors}
    if unknown:
        raise ValueError(f"counts name tensors the algorithm does not declare: {sorted(unknown)}")
    bh = pb.shape.bh
    return Counts(tuple(TensorCounts(t.name, reads.get(t.name, 0) * bh, writes.get(t.name, 0) * bh,
                                     pb.itemsize(t.element)) for t in tensors), peak_sram)
