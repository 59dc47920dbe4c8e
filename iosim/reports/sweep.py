"""Count-only sweeps over (algorithm, N, d), with measured and predicted traffic side by side.

Rows go to a ``iosim.reports.records.RecordWriter`` as they finish, so an interrupted sweep
keeps its work, and a resumed one skips the configurations its files already hold. Each record
carries the whole configuration (the problem and its options), the tiling, the
totals, the exact prediction, the paper's form and every tensor's traffic; the keys
are listed in README.md ("Saved records").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from iosim.api import closed_form, count_problem, measure, plan, predict
from iosim.core.counts import Counts
from iosim.core.errors import BlockSizeError
from iosim.core.flops import Flops
from iosim.core.gpus import Roofline, get_gpu, preset_name, roofline
from iosim.core.inputs import check_scale
from iosim.core.problem import check_window
from iosim.core.tiling import Tiling, one_pass, tiling_record
from iosim.core.units import parse_size
from iosim.gpu.dram import bracketed, covered_dram_or_why
from iosim.gpu.hardware import Hardware, hardware
from iosim.gpu.kernels import KERNELS, named_for
from iosim.gpu.l2 import DramCounts, dram_record, read_range
from iosim.registry import ALGORITHMS, get_algorithm
from iosim.variants.sparsity import BlockSparsity

KERNEL_ALGORITHMS = {k.algorithm for k in KERNELS.values()}  # those the L2 model has a kernel of

if TYPE_CHECKING:
    from iosim.reports.records import RecordWriter

DEFAULT_N = tuple(2**e for e in range(8, 17))  # 256 ... 65536
DEFAULT_D = (64, 128)


@dataclass(frozen=True)
class SweepRow:
    """One configuration of a sweep and what it moves; ``counts`` is None when it does not run."""

    algorithm: str
    N: int  # N_q
    N_k: int
    d: int
    M: int  # SRAM capacity, elements
    batch: int
    heads: int
    causal: bool
    mask: bool  # an explicit mask is read from HBM
    dropout_p: float
    dtype: str
    block_policy: str
    forward_tiling: Tiling | None  # None for a row without a forward pass, or one that does not run
    counts: Counts | None  # measured, all batch·heads
    predicted: int | None  # exact closed form, elements
    paper: float  # the paper's asymptotic form, elements
    paper_label: str
    status: str  # "ok", or why the configuration does not run
    pass_: str = "fwd"  # one of PASSES; with "fwd+bwd", counts, predicted and paper add the two passes
    backward_tiling: Tiling | None = None  # None for a row without a backward pass
    sparsity: float | None = None  # a block-sparse row's fraction of nonzero tiles; None when dense
    sparsity_pattern: str | None = None
    flops: Flops | None = None  # the arithmetic the count measured, None when it does not run
    roofline: Roofline | None = None  # with a GPU preset: the estimated time
    kv_heads: int | None = None  # K/V heads under grouped-query attention; None when equal to heads
    sparsity_seed: int | None = None  # a block-sparse row's mask seed; None when dense
    requested_splits: int | None = None  # split-kv's --splits as given; None: its default policy, or no splits
    gpu: str | None = None  # the preset's name: its roofline, and the SMs split-kv's default splits fill
    dram: DramCounts | None = None  # with a preset, the passes' kernels where their grids are declared: behind L2
    window_left: int | None = None  # the sliding window (left, right) as given; None without one
    window_right: int | None = None
    page_size: int | None = None  # tokens per page of a paged K/V cache, for an algorithm that reads one; else None
    # packed documents' lengths, space-separated (iosim.variants.varlen); N is the longest; else None
    seqlens: str | None = None
    padded: int | None = None  # packed documents: the traffic of padding each to the longest (elements); else None
    l2_bytes: int | None = None  # with a preset, the L2 capacity given for its DRAM level; None: the preset's
    blocks_per_sm: int | None = None  # with a preset, the blocks per SM given for every kernel; None: the kernels'
    schedule: str | None = None  # with a preset, "timed" where given (iosim.gpu.hardware.SCHEDULES); None: lockstep
    d_v: int | None = None  # V's and O's head size where it differs from d (Q's and K's); None when equal
    latent: bool = False  # MLA's latent cache: V read as the first d_v columns of K (Problem.latent)
    flex_mask: str | None = None  # the FlexAttention block mask's name (Problem.flex); None without one
    score_mod: str | None = None  # the FlexAttention score_mod's name (Problem.score_mod); None without one
    sinks: bool = False  # learned attention sinks read (Problem.sinks)
    kernel: str | None = None  # with a preset, the kernel description given (iosim.gpu.kernels); None: the default
    dram_note: str | None = None  # why a row the L2 model covers has no DRAM bytes (too slow, or not timed)
    # under the timed schedule, the counts at the two ends of the blocks' spread (iosim.gpu.dram.covered_dram_or_why)
    dram_band: tuple[DramCounts, DramCounts] | None = None

    @property
    def dram_band_reads(self) -> tuple[int, int] | None:
        """Under the timed schedule, the fewest and the most DRAM reads over the blocks' spread."""
        return None if self.dram_band is None else read_range(self.dram, self.dram_band)

    @property
    def bracketed(self) -> bool | None:
        """Under the timed schedule, whether the blocks' spread moves the DRAM reads by more than 10 %: a band, not a
        prediction (iosim.gpu.dram.bracketed); None otherwise."""
        return None if self.dram is None else bracketed(self.dram, self.dram_band)

    @property
    def tiling(self) -> Tiling | None:
        """The tiling of a one-pass row; None when both passes ran, or when it does not run."""
        return one_pass(self.forward_tiling, self.backward_tiling)

    @property
    def reads(self) -> int | None:
        return None if self.counts is None else self.counts.reads

    @property
    def writes(self) -> int | None:
        return None if self.counts is None else self.counts.writes

    @property
    def total(self) -> int | None:
        return None if self.counts is None else self.counts.total

    @property
    def total_bytes(self) -> int | None:
        return None if self.counts is None else self.counts.total_bytes

    @property
    def dram_bytes(self) -> int | None:
        """Bytes the L2 model moves to and from DRAM: reads, writes during the kernel and the dirty bytes written
        back after it; None without one."""
        return None if self.dram is None else self.dram.moved

    @property
    def ratio(self) -> float | None:
        """Measured over predicted traffic: 1 exactly when the closed form holds."""
        return None if self.counts is None else self.counts.total / self.predicted

    @property
    def packing_ratio(self) -> float | None:
        """Packed documents' traffic over that of padding each to the longest; None without documents."""
        return None if self.padded is None or self.counts is None else self.counts.total / self.padded

    @property
    def peak_sram(self) -> int | None:
        return None if self.counts is None else self.counts.peak_sram

    @property
    def peak_fraction(self) -> float | None:
        return None if self.counts is None else self.counts.peak_sram / self.M

    def record(self) -> dict:
        """The row as one JSON record: the configuration, the tiling, the counts and every tensor's traffic."""
        config = {name: getattr(self, "pass_" if name == "pass" else name) for name in CONFIG_KEYS}
        first = self.forward_tiling or self.backward_tiling  # records keep the first pass's under Br, Bc, splits
        second = self.backward_tiling if self.forward_tiling is not None else None
        tiling = tiling_record(first)
        counts = self.counts.as_dict() if self.counts is not None else {
            key: None for key in ("reads", "writes", "total", "read_bytes", "write_bytes", "total_bytes",
                                  "peak_sram", "tensors")}
        backward = tiling_record(second, "bwd_")
        arithmetic = {"matmul_flops": getattr(self.flops, "matmul", None), "exp": getattr(self.flops, "exp", None),
                      "score_flops": getattr(self.flops, "score", None),
                      "roofline_s": getattr(self.roofline, "seconds", None),
                      "bound": getattr(self.roofline, "bound", None),
                      "intensity": getattr(self.roofline, "intensity", None),
                      **dram_record(self.dram, self.dram_band, self.bracketed)}
        return {**config, "scale": check_scale(None, self.d), **tiling, **backward, **counts, **arithmetic,
                "predicted": self.predicted,
                "ratio": self.ratio, "peak_fraction": self.peak_fraction, "paper": self.paper,
                "paper_label": self.paper_label, "padded_total": self.padded, "packing_ratio": self.packing_ratio,
                "dram_note": self.dram_note, "status": self.status, "revision": RECORD_REVISION}


# every option that changes a row: what --resume tells rows apart by
CONFIG_KEYS = ("algorithm", "N", "N_k", "d", "M", "batch", "heads", "causal", "mask", "dropout_p", "dtype",
               "block_policy", "pass", "sparsity", "sparsity_pattern", "sparsity_seed", "kv_heads",
               "requested_splits", "gpu", "window_left", "window_right", "page_size", "seqlens", "l2_bytes",
               "blocks_per_sm", "schedule", "kernel", "sinks", "d_v", "latent", "flex_mask", "score_mod")
# what a record written before a key existed means by its absence
CONFIG_DEFAULTS = {"pass": "fwd", "sinks": False, "latent": False}
# fields every sweep record has held since the first release: a file to --resume from must have them
RESUME_REQUIRED = ("algorithm", "N", "d", "M", "status")
# the revision of what a record's values mean, raised whenever a change makes the same configuration's record differ:
# none before 2026-11-28 (the DRAM of every pass of a sweep); 1, the DRAM reads hold the kernels' code; 2, only the
# code of the build a pass runs. --resume counts a record of another revision again rather than keep numbers this
# release would not give
RECORD_REVISION = 2


def current(record: dict) -> bool:
    """Whether a record kept by --resume was made at this ``RECORD_REVISION`` (compared as text: a CSV's values are
    read back by their look)."""
    return str(record.get("revision")) == str(RECORD_REVISION)


def sweep_row(algorithm: str, N: int, d: int, M, *, N_k=None, batch=1, heads=1, causal=False, mask=False,
              dropout_p=0.0, dtype="float16", block_policy="fit", pass_="fwd", gpu: str | None = None,
              block_sparsity: BlockSparsity | None = None, kv_heads=None, splits=None, window=None,
              page_size=None, seqlens=None, hw: Hardware | None = None, kernel: str | None = None,
              sinks: bool = False, d_v=None, latent: bool = False, block_mask=None, score_mod=None) -> SweepRow:
    """Count one configuration and predict it; a block policy that overflows M gives a row that says so.

    ``pass_`` is one of PASSES; with "fwd+bwd" each pass has its own tiling, as
    ``iosim.count`` chooses them. ``gpu`` names a preset (``iosim.core.gpus.GPUS``) whose
    roofline time the row carries and whose SMs split-kv's default splits fill.
    ``block_sparsity`` is the block mask of the block-sparse algorithms and ``splits``
    split-kv's K/V splits: a sweep covers many algorithms, so each goes only to those it
    applies to (``iosim.cli.sweep_cmd.notes`` names the others). ``kv_heads`` shares K/V heads
    among the query heads. With ``gpu``, a forward row of an algorithm that has a GPU kernel
    (``iosim.gpu.kernels``; ``kernel`` names one for the algorithm it implements) also carries its
    DRAM bytes behind the preset's L2, and its roofline time uses them instead of the two-level bytes.
    ``window=(left, right)`` is a sliding window, refused by an algorithm that takes none.
    ``seqlens`` counts documents packed end to end instead of N (iosim.variants.varlen), and the row carries their
    traffic padded to the longest. ``hw`` is ``gpu`` resolved with the user's overrides of the L2 model (capacity,
    blocks per SM, schedule); None: the preset's own. ``sinks`` reads learned attention sinks, refused by an
    algorithm that takes none. ``d_v`` is V's and O's head size (None: d), and ``latent`` reads V as the first d_v
    columns of K (MLA's latent cache), refused by an algorithm that takes none; ``block_mask`` is a FlexAttention
    block mask of N and N_k (``iosim.block_mask``), which flex runs over and the others refuse, and ``score_mod`` a
    FlexAttention score_mod (``iosim.variants.score_mods.score_mod``) flex applies.
    """
    preset = None if gpu is None else get_gpu(gpu)
    if hw is None and gpu is not None:
        hw = hardware(preset)
    config = row_config(algorithm, N, d, N_k=N_k, batch=batch, heads=heads, causal=causal, mask=mask,
                        dropout_p=dropout_p, dtype=dtype, block_policy=block_policy, pass_=pass_, gpu=gpu,
                        block_sparsity=block_sparsity, kv_heads=kv_heads, splits=splits, window=window,
                        page_size=page_size, seqlens=seqlens, hw=hw, kernel=kernel, sinks=sinks, d_v=d_v,
                        latent=latent, block_mask=block_mask, score_mod=score_mod)
    options = dict(N=None if seqlens else N, N_k=N_k, seqlens=seqlens, d=d, d_v=d_v, latent=latent,
                   block_mask=block_mask, score_mod=score_mod, M=M, batch=batch,
                   heads=heads,
                   causal=causal, mask=mask, dropout_p=dropout_p,
                   window=window, sinks=sinks,
                   dtype=dtype, block_policy=block_policy, kv_heads=kv_heads, splits=config["requested_splits"],
                   block_sparsity=block_sparsity if config["sparsity"] is not None else None, gpu=gpu,
                   page_size=config["page_size"])
    pb = count_problem(None if seqlens else N, d, N_k, batch, heads, causal=causal, mask=mask, dropout_p=dropout_p,
                       dtype=dtype, block_sparsity=options["block_sparsity"], kv_heads=kv_heads, window=window,
                       page_size=config["page_size"], seqlens=seqlens, sinks=sinks, d_v=d_v, latent=latent,
                       block_mask=block_mask, score_mod=score_mod)
    try:  # planned once: the count and the closed form evaluate the same request
        request = plan(algorithm, pb, M, pass_=pass_, block_policy=block_policy, splits=config["requested_splits"],
                       gpu=gpu)
    except BlockSizeError as err:
        if block_policy == "fit":
            raise
        # M in elements, paper's form
        fit = predict(algorithm, pass_=pass_, **{**options, "block_policy": "fit", "splits": None})
        return SweepRow(algorithm, M=fit.M, **config, forward_tiling=None, counts=None, predicted=None, paper=fit.paper,
                        paper_label=fit.paper_label, status=f"does not fit: {err}")
    measured, pred = measure(request, gpu), closed_form(request)
    counts, flops = measured.traffic, measured.flops
    # on a preset, the DRAM bytes of the pass's kernels (each pass's, one after another, for fwd+bwd)
    covered = hw is not None
    dram, band, dram_note = (covered_dram_or_why(measured.plans, hw, algorithm, kernel, band=True,
                                                 explain=algorithm in KERNEL_ALGORITHMS) if covered
                             else (None, None, None))
    moved = counts.total_bytes if dram is None else dram.moved
    return SweepRow(algorithm, M=measured.M, **config, forward_tiling=measured.forward_tiling,
                    counts=counts, predicted=pred.exact.total, paper=pred.paper, paper_label=pred.paper_label,
                    status="ok", backward_tiling=measured.backward_tiling, flops=flops,
                    roofline=None if preset is None else roofline(preset, dtype, moved, flops), dram=dram,
                    dram_note=dram_note, dram_band=band,
                    padded=None if measured.padded is None else measured.padded.total)


def row_config(algorithm: str, N: int, d: int, *, N_k=None, batch=1, heads=1, causal=False, mask=False,
               dropout_p=0.0, dtype="float16", block_policy="fit", pass_="fwd", gpu: str | None = None,
               block_sparsity: BlockSparsity | None = None, kv_heads=None, splits=None, window=None,
               page_size=None, seqlens=None, hw: Hardware | None = None, kernel: str | None = None,
               sinks: bool = False, d_v=None, latent: bool = False, block_mask=None, score_mod=None) -> dict:
    """A row's configuration beside its algorithm and M, as ``SweepRow`` fields: every option that changes it, an
    option the algorithm does not take set to None, and the L2 model's overrides None where not given (the
    schedule None for lockstep), as rows written before they existed have them."""
    algo = get_algorithm(algorithm)
    sparse = block_sparsity is not None and algo.accepts("block_sparsity")
    band = check_window(window)
    N = max(seqlens) if seqlens else N
    return dict(N=N, N_k=N if N_k is None else N_k, d=d, seqlens=" ".join(map(str, seqlens)) if seqlens else None,
                batch=batch, heads=heads, causal=causal, mask=mask,
                dropout_p=dropout_p, dtype=dtype, block_policy=block_policy, pass_=pass_,
                kv_heads=None if kv_heads in (None, heads) else kv_heads,
                sparsity=block_sparsity.sparsity if sparse else None,
                sparsity_pattern=block_sparsity.pattern if sparse else None,
                sparsity_seed=block_sparsity.seed if sparse else None,
                requested_splits=splits if algo.accepts("splits") else None,
                page_size=page_size if algo.accepts("page_size") else None,
                gpu=preset_name(gpu),
                window_left=None if band is None else band.left, window_right=None if band is None else band.right,
                **(hw.overrides() if hw is not None else {"l2_bytes": None, "blocks_per_sm": None, "schedule": None}),
                kernel=named_for(algorithm, kernel) if hw is not None else None, sinks=sinks,
                d_v=None if d_v in (None, d) else d_v, latent=latent, flex_mask=getattr(block_mask, "label", None),
                score_mod=getattr(score_mod, "name", None))


def config_key(config: dict) -> tuple[str, ...]:
    """A configuration as text, the same whether it comes from a row, a JSON record or a CSV row."""
    values = (config.get(name, CONFIG_DEFAULTS.get(name)) for name in CONFIG_KEYS)
    return tuple("" if value is None else str(value) for value in values)  # CSV writes None as ""


def sweep_configs(algorithms: Iterable[str], Ns: Iterable[int], ds: Iterable[int]) -> list[tuple[str, int, int]]:
    """The (algorithm, N, d) grid in the order a sweep runs it."""
    return [(algorithm, N, d) for algorithm in algorithms for d in ds for N in Ns]


def run_sweep(algorithms: Iterable[str], Ns: Iterable[int], ds: Iterable[int], M, *, N_k=None, batch=1, heads=1,
              causal=False, mask=False, dtype="float16", block_policy="fit", writer: RecordWriter | None = None,
              on_row: Callable[[SweepRow | None], None] | None = None, pass_: str = "fwd",
              gpu: str | None = None, block_sparsity: BlockSparsity | None = None, kv_heads=None,
              splits=None, kept: list[dict] | None = None, window=None, page_size=None, seqlens=None,
              hw: Hardware | None = None, kernel: str | None = None, sinks: bool = False, d_v=None,
              latent: bool = False, block_mask_for: Callable[[int, int], object] | None = None,
              score_mod=None) -> list[SweepRow]:
    """Count every (algorithm, N, d) not already done; rows go to ``writer`` and ``on_row`` as they finish.

    ``on_row`` gets None for a configuration the writer already holds (``--resume``), and
    ``kept`` its record. ``N_k`` (default: each N) is the key/value length of every row. With ``seqlens``
    (packed documents, iosim.variants.varlen) each row counts them, and ``Ns`` should be their longest alone.
    ``d_v`` (None: each d) is V's and O's head size in every row; ``latent`` reads MLA's latent cache in every row;
    ``block_mask_for(N_q, N_k)`` makes each row's FlexAttention block mask, and ``score_mod`` is every row's
    FlexAttention score_mod.
    """
    rows = []
    if hw is None and gpu is not None:
        hw = hardware(gpu)  # resolved once for every row
    options = dict(N_k=N_k, batch=batch, heads=heads, causal=causal, mask=mask, dropout_p=0.0, dtype=dtype,
                   block_policy=block_policy, pass_=pass_, gpu=gpu, block_sparsity=block_sparsity, kv_heads=kv_heads,
                   splits=splits, window=window, page_size=page_size, seqlens=seqlens, hw=hw, kernel=kernel,
                   sinks=sinks, d_v=d_v, latent=latent, score_mod=score_mod)
    masks: dict[int, object] = {}  # each N's block mask, made once for every algorithm and d

    def mask_of(N: int):
        if block_mask_for is not None and N not in masks:
            masks[N] = block_mask_for(N, N_k or N)
        return masks.get(N)

    configs = sweep_configs(algorithms, Ns, ds)
    if configs:  # before any row: a named algorithm that refuses the window, the documents or the sinks
        _, N, d = configs[0]
        pb = count_problem(None if seqlens else N, d, N_k, batch, heads, causal=causal, window=window, dtype=dtype,
                           seqlens=seqlens, sinks=sinks, d_v=d_v, latent=latent,
                           block_mask=mask_of(N), score_mod=score_mod)
        for algorithm in dict.fromkeys(a for a, _, _ in configs):
            get_algorithm(algorithm).refuse_options(pb, pass_, ALGORITHMS.values())
    for algorithm, N, d in configs:
        options["block_mask"] = mask_of(N)
        config = row_config(algorithm, N, d, **options)
        done = config_key({"algorithm": algorithm, "M": parse_size(M, dtype), "pass": pass_, **config})
        if writer and done in writer.done:
            if kept is not None:
                kept.append(writer.done[done])
            if on_row:
                on_row(None)
            continue
        row = sweep_row(algorithm, N, d, M, **options)
        rows.append(row)
        if writer:
            writer.add(row.record())
        if on_row:
            on_row(row)
    return rows


@dataclass(frozen=True)
class Ranking:
    """At one (N, d): the algorithm that moves least, and every algorithm's traffic over its."""

    N: int
    d: int
    best: str
    ratios: dict[str, float]  # algorithm → its traffic ÷ the least


def rank_by_traffic(records: Iterable[dict]) -> list[Ranking]:
    """The least traffic at each (N, d) where some algorithm ran, and each algorithm's ratio to it.

    ``records`` are rows' records (``SweepRow.record``), or those a resumed file kept.
    """
    groups: dict[tuple[int, int], list[dict]] = {}
    for r in records:
        if r["total"] is not None:
            groups.setdefault((r["d"], r["N"]), []).append(r)
    out = []
    for (d, N), group in sorted(groups.items()):
        best = min(group, key=lambda r: r["total"])
        out.append(Ranking(N, d, best["algorithm"], {r["algorithm"]: r["total"] / best["total"] for r in group}))
    return out
