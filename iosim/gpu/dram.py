"""The DRAM level of a request: the two-level count beside what a GPU's L2 lets through to DRAM.

``dram`` is the entry point: it plans the request as ``iosim.count`` does (the algorithm, M, the tiling of the block
policy on the GPU's SMs), counts it on the two-level ``Memory``, and runs its kernel's grids (``iosim.gpu.kernels``;
the kernel in ``kernels/`` named as the algorithm unless ``kernel=`` names another) against the GPU's L2. Every
kernel of a pass runs from a cold L2, as ncu measures it, and the passes one after another.

``kernel_counts`` picks the fastest path to a kernel's counts: its closed form where it has one (milliseconds: the
kernel's forward form, or the grid's own, ``Grid.form``), the lockstep count where its blocks are equal
(``iosim.gpu.lockstep``), else the simulation (``iosim.gpu.schedule``; under a causal mask, whose blocks run no
cohorts, the same schedule in a compiled loop, ``iosim.gpu.timed.simulate_rounds``); all are equal where they apply
(tests/test_l2.py, tests/test_head_waves.py, tests/test_timed.py). The closed forms and the lockstep count are the
lockstep schedule's; the timed one is always simulated. The model, its sources and its limits: docs/gpu.md.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace

from iosim.api import count_problem, measure, plan
from iosim.core.counts import Counts
from iosim.core.errors import InputError
from iosim.core.gpus import get_gpu
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling, one_pass
from iosim.gpu.budget import (
    BUDGET_S,
    ROUNDS_VISITS_PER_S,
    SIMULATION_VISITS_PER_S,
    TIMED_VISITS_PER_S,
    DramTooLong,
    check_budget,
    walk_watch,
)
from iosim.gpu.hardware import BLOCK_SPREADS, Hardware, OverrideError, hardware
from iosim.gpu.kernel import Kernel, Launch
from iosim.gpu.kernels import KERNELS, kernel_for, named_for
from iosim.gpu.l2 import CODE, DramCounts, DramTensor, in_sequence
from iosim.gpu.lockstep import lockstep
from iosim.gpu.schedule import simulate
from iosim.gpu.timed import Timing, simulate_rounds, simulate_timed_each
from iosim.plans import Plan, Request


class NotTimed(InputError):
    """The timed schedule cannot time a pass the lockstep schedule counts: a backward pass, several kernels, or a
    kernel no GPU run has measured the rate of (``timing_of``)."""


# the timed schedule's reads are a band, not a prediction, where the blocks' spread moves them by more than this
BRACKET = 0.10


def timing_of(kernel: Kernel, launch: Launch, hw: Hardware, kernels: int) -> Timing:
    """The timed schedule's parameters for a pass of ``kernels`` kernels: a one-kernel forward pass of a kernel with a
    measured rate R, whose steps of 4·B_r·B_c·d FLOPs take one unit and whose missed bytes m take m / B more,
    B = the preset's DRAM bandwidth × step FLOPs / R (a block's share of the bandwidth in a step's time;
    docs/gpu.md); the blocks' spread is ``hw.block_spread``."""
    if launch.backward or kernels != 1 or kernel.rate is None:
        timed = sorted(k.name for k in KERNELS.values() if k.rate is not None)
        raise NotTimed(f"schedule='timed' with kernel={kernel.name!r} {'backward' if launch.backward else 'forward'}"
                       f" ({kernels} kernel{'s' if kernels != 1 else ''}): the timed schedule times the steps of "
                       f"one-kernel forward passes with a measured rate; allowed: the forward of {timed} (the "
                       f"lockstep schedule counts the others)")
    t = launch.tiling
    step_flops = 4 * t.Br * t.Bc * launch.problem.shape.d
    return Timing(hw.gpu.hbm_bandwidth.value * step_flops / kernel.rate(launch.problem), 0.0, hw.block_spread)


def kernel_counts(kernel: Kernel, launch: Launch, hw: Hardware, budget_s: float | None = BUDGET_S) -> list[DramCounts]:
    """The DRAM counts of every kernel ``launch``'s pass launches, in launch order, each from a cold L2 (what ncu
    reports kernel by kernel). A lockstep count or a simulation estimated to take longer than ``budget_s`` raises
    ``DramTooLong`` before it starts (None: no limit)."""
    return kernel_counts_at(kernel, launch, hw, (hw.block_spread,), budget_s)[0]


def kernel_counts_at(kernel: Kernel, launch: Launch, hw: Hardware, spreads: tuple[float, ...],
                     budget_s: float | None = BUDGET_S) -> list[list[DramCounts]]:
    """``kernel_counts`` at each of the blocks' ``spreads`` (``hw``'s own is not used): the grids built once, a
    timed grid flattened once and its event loops run side by side (``simulate_timed_each``), and a count the spread
    does not move (the lockstep schedule's) made once for all."""
    kernel.check_gpu(hw.gpu.name)
    if launch.problem.dtype == "bfloat16" and hw.gpu.bf16_tensor is None:
        raise InputError(f"dtype='bfloat16' on the {hw.gpu.name} preset: it has no bfloat16 tensor cores, so no "
                         f"kernel's bfloat16 build runs on it; allowed: float16 or float32, or another GPU preset")
    launch = kernel.own(launch)
    grids = kernel.grids(launch)
    form = kernel.closed_form(launch) if len(grids) == 1 else None
    parts: list[list[DramCounts]] = [[] for _ in spreads]
    for g in grids:
        config = hw.config(g)
        if config.schedule == "timed":
            timings = tuple(timing_of(kernel, launch, replace(hw, block_spread=s), len(grids)) for s in spreads)
            check_budget(kernel, launch, g, False, budget_s, TIMED_VISITS_PER_S)
            each = simulate_timed_each(g, config, timings, hw.sms, walk_watch(kernel, launch, budget_s))
            for part, counts in zip(parts, each):
                part.append(counts)
            continue
        counts = None
        if g.form is not None:  # the grid's own closed form (the backward's main kernels, the one-step kernels)
            found = g.form(config.capacity, config.concurrent)
        else:
            found = form(launch.problem, launch.tiling, config.capacity, config.concurrent) if form else None
        if found is not None:
            counts = found.counts(g.tiles, config)
        elif g.uniform:
            check_budget(kernel, launch, g, True, budget_s)
            counts = lockstep(g, config)
        if counts is None:
            # under a causal mask blocks of one head start in different rounds and never run as cohorts: the compiled
            # loop of the lockstep schedule is the same count, and faster. One query block (decoding) is the last
            # query row's, which sees every key: the mask hides no tile, and the steps stream, as without a mask,
            # faster than they flatten into the compiled loop's arrays (1.6x for flash's grid at 2Mi keys)
            rounds = launch.problem.causal and launch.problem.shape.n_q > launch.tiling.Br
            check_budget(kernel, launch, g, False, budget_s, ROUNDS_VISITS_PER_S if rounds else SIMULATION_VISITS_PER_S)
            counts = simulate_rounds(g, config, walk_watch(kernel, launch, budget_s)) if rounds else simulate(g, config)
        for part in parts:
            part.append(counts)
    return parts


def pass_counts(kernel: Kernel, launch: Launch, hw: Hardware, budget_s: float | None = BUDGET_S) -> DramCounts:
    """The DRAM bytes of one pass's kernels run one after another, each from a cold L2 (``in_sequence``)."""
    return in_sequence(kernel_counts(kernel, launch, hw, budget_s))


def code_reads(kernel: Kernel, launch: Launch) -> int | None:
    """The bytes of machine code and constant banks a pass's kernels read from DRAM, once per launch from a cold L2
    (what ncu measures: it flushes the L2 before each kernel), from their binaries (``Grid.code_bytes``); None where
    one kernel's binary was not read (experiments/code_bytes.py sets this beside calls 1 and 4)."""
    codes = [g.code_bytes for g in kernel.grids(kernel.own(launch))]
    return None if None in codes else sum(codes)


def request_dram(plans: tuple[Plan, ...], hw: Hardware, kernel: Kernel, sawtooth: bool = False,
                 budget_s: float | None = BUDGET_S) -> DramCounts:
    """The DRAM bytes of a request's passes (its plans, forward then backward) on ``kernel``, one after another: their
    tensors' and, where every kernel's binary was read, their code's (a tensor named ``CODE``)."""
    return at_spreads(plans, hw, kernel, (hw.block_spread,), sawtooth, budget_s)[0]


def at_spreads(plans: tuple[Plan, ...], hw: Hardware, kernel: Kernel, spreads: tuple[float, ...],
               sawtooth: bool = False, budget_s: float | None = BUDGET_S) -> list[DramCounts]:
    """``request_dram`` at each of the blocks' ``spreads``, the grids built and flattened once for all
    (``kernel_counts_at``); under the timed schedule the event loops run side by side in threads, without the GIL."""
    launches = [Launch(p.run_problem, p.tiling, p.algorithm.is_backward, sawtooth, hw.sms) for p in plans]
    passes = [kernel_counts_at(kernel, launch, hw, spreads, budget_s) for launch in launches]
    codes = [code_reads(kernel, launch) for launch in launches]
    out = []
    for i in range(len(spreads)):
        counts = in_sequence([in_sequence(parts[i]) for parts in passes])
        out.append(counts if None in codes else
                   replace(counts, tensors=counts.tensors + (DramTensor(CODE, sum(codes), 0, 0),)))
    return out


def spreads_of(hw: Hardware) -> tuple[float, ...]:
    """The blocks' spreads a count is made at: under the timed schedule the preset's and the two ends of the range
    (``BLOCK_SPREADS``), the band; under lockstep, whose counts no spread moves, one."""
    return (hw.block_spread, *BLOCK_SPREADS) if hw.schedule == "timed" else (hw.block_spread,)


def bracketed(counts: DramCounts, band: tuple[DramCounts, DramCounts] | None) -> bool | None:
    """Whether the blocks' spread moves the DRAM reads by more than ``BRACKET`` of the middle's: then the reads are
    a band, not a prediction (docs/gpu.md). None without a band."""
    if band is None:
        return None
    return any(abs(b.reads - counts.reads) > BRACKET * counts.reads for b in band)


@dataclass(frozen=True)
class DramResult:
    """A request on a GPU: the two-level HBM count (elements) and the DRAM bytes of its kernel behind the L2."""

    algorithm: str
    kernel: str  # the kernel description that ran (iosim.gpu.kernels.KERNELS)
    problem: Problem
    M: int
    forward_tiling: Tiling | None  # None without a forward pass
    backward_tiling: Tiling | None  # None without a backward pass
    gpu: str
    hbm: Counts  # the two-level count, as iosim.count gives it
    dram: DramCounts  # bytes: reads (L2 misses), writes during the kernels, dirty at their end
    # under the timed schedule, its counts at the two ends of the blocks' spread (iosim.gpu.hardware.BLOCK_SPREADS);
    # ``dram`` is its middle. None under the other schedules
    band: tuple[DramCounts, DramCounts] | None = None

    @property
    def tiling(self) -> Tiling | None:
        """The tiling of a one-pass request; None when both passes ran."""
        return one_pass(self.forward_tiling, self.backward_tiling)

    @property
    def bracketed(self) -> bool | None:
        """Under the timed schedule, whether the blocks' spread moves the DRAM reads by more than 10 % (a band, not a
        prediction); None under lockstep."""
        return bracketed(self.dram, self.band)


def dram(algorithm, *, N, d, M, N_k=None, d_v=None, batch=1, heads=1, causal=False, dtype="float16", block_policy="fit",
         tiling=None, kv_heads=None, pass_="fwd", gpu="h100", l2_bytes=None, blocks_per_sm=None,
         window=None, schedule="lockstep", kernel: str | None = None, sawtooth: bool = False,
         budget_s: float | None = BUDGET_S) -> DramResult:
    """The DRAM bytes of ``algorithm``'s kernels on ``gpu``, beside its two-level count.

    ``kernel`` names the kernel description (``iosim.gpu.kernels.KERNELS``; default the kernel of ``kernels/`` named
    as the algorithm, with its occupancy from the resource report); ``sawtooth`` selects flash-swapped's sawtooth
    order. ``l2_bytes`` (a count, or 25MB, 32MiB) overrides the preset's effective L2 capacity, ``blocks_per_sm``
    the kernels' residency and ``schedule`` how their blocks run (``iosim.gpu.hardware.SCHEDULES``; "timed", the
    one-kernel forward passes of kernels with a measured rate, also gives ``band``, the counts at both ends of the
    blocks' spread). The forward
    passes of flash and flash-swapped without a mask, and the backward's main kernels without one, have closed forms
    (milliseconds); the rest is counted in lockstep or simulated, which takes seconds at batch·heads in the hundreds
    and N in the tens of thousands. ``window`` is taken as ``count`` takes it, and a sliding
    window (other than causal's (−1, 0)) is refused: no kernel of iosim takes one. ``M`` is taken as given, even past
    the preset's shared memory per SM, as a what-if (the commands refuse such an M). A lockstep count or a simulation
    estimated (from its tile visits) to take longer than ``budget_s`` seconds raises ``DramTooLong`` before it runs;
    None lifts the limit.
    """
    if gpu is None:
        raise InputError("gpu=None: the DRAM level needs a GPU preset, such as gpu='h100'")
    if budget_s is not None and (isinstance(budget_s, bool) or not isinstance(budget_s, numbers.Real)
                                 or not math.isfinite(budget_s) or budget_s <= 0):
        raise InputError(f"budget_s={budget_s!r} is not a number of seconds; allowed: a finite number > 0, or None "
                         f"(no limit)")
    if not isinstance(sawtooth, bool):
        raise InputError(f"sawtooth={sawtooth!r} must be True or False")
    hw = hardware(gpu, l2_bytes=l2_bytes, blocks_per_sm=blocks_per_sm, schedule=schedule)
    pb = count_problem(N, d, N_k, batch, heads, causal=causal, dtype=dtype, kv_heads=kv_heads, window=window, d_v=d_v)
    request = plan(algorithm, pb, M, pass_=pass_, block_policy=block_policy, tiling=tiling, gpu=gpu)
    found = kernel_for(request.algorithm.name, kernel)
    if found.tile is not None:
        request = own_tiles(request, found, tiling, block_policy, gpu)
    r = measure(request, gpu)
    counts, *ends = at_spreads(r.plans, hw, found, spreads_of(hw), sawtooth, budget_s)  # the middle and the band
    band = tuple(ends) if ends else None
    return DramResult(r.algorithm, found.name, r.problem, r.M, r.forward_tiling, r.backward_tiling, gpu, r.traffic,
                      counts, band)


def own_tiles(request: Request, kernel: Kernel, tiling: Tiling | None, block_policy: str, gpu: str) -> Request:
    """``request`` planned again at the tiles ``kernel`` launches (each pass its own), so that the two-level count
    beside its DRAM bytes is that of the same tiles; a different ``tiling`` asked of it is refused by name. Where a
    tile's working set is above M, that pass's M is raised to it: the kernel holds it on chip (its registers and
    shared memory), whatever the M asked."""
    passes = []
    for p in request.plans:
        own = kernel.tile(p.run_problem, p.algorithm.is_backward, int(get_gpu(gpu).sms.value))
        if tiling is not None and (tiling.Br, tiling.Bc) != (own.Br, own.Bc):
            raise InputError(f"tiling=({tiling.Br}, {tiling.Bc}): kernel={kernel.name!r} launches its own tile, "
                             f"({own.Br}, {own.Bc}) for this pass; allowed: tiling=None")
        one = "bwd" if p.algorithm.is_backward else "fwd"
        M = max(p.M, p.algorithm.working_set(p.run_problem, own.capped(p.run_problem), p.M))
        passes.append(plan(request.algorithm, p.problem, M, pass_=one, block_policy=block_policy,
                           tiling=own.capped(p.problem), gpu=gpu).plans[0])
    forward = passes[0] if request.forward is not None else None
    backward = passes[-1] if request.backward is not None else None
    return Request(request.algorithm, request.pass_, forward, backward)


def covered_dram(plans: tuple[Plan, ...], hw: Hardware, algorithm: str, kernel: str | None = None,
                 sawtooth: bool = False) -> DramCounts | None:
    """``request_dram`` of the kernel a request of ``algorithm`` runs (``kernel`` where it implements the algorithm,
    else the algorithm's own), or None where the algorithm's own kernel does not cover the request: an algorithm
    with no kernel, an option no kernel takes (a mask, a sliding window, pages, packed documents), refused by name
    below. A kernel the caller named that refuses the request raises its refusal, as does a count that would take too
    long (``DramTooLong``) or one the timed schedule cannot time (``NotTimed``)."""
    found = covered_at(plans, hw, algorithm, kernel, sawtooth, (hw.block_spread,))
    return None if found is None else found[0]


def covered_at(plans: tuple[Plan, ...], hw: Hardware, algorithm: str, kernel: str | None, sawtooth: bool,
               spreads: tuple[float, ...], explain: bool = False) -> list[DramCounts] | None:
    """``covered_dram`` at each of the blocks' ``spreads`` (``at_spreads``); with ``explain``, the default kernel's
    refusal is raised too."""
    named = named_for(algorithm, kernel)
    try:
        return at_spreads(plans, hw, kernel_for(algorithm, named), spreads, sawtooth)
    except (DramTooLong, OverrideError, NotTimed):  # too slow, the user's override does not fit, or not timed: said
        raise
    except InputError:  # the L2 model refuses the run by name: nothing to say, unless the caller asked for the kernel
        if named is not None or explain:  # or for the reason
            raise
        return None


def covered_dram_or_why(plans: tuple[Plan, ...], hw: Hardware, algorithm: str, kernel: str | None = None,
                        sawtooth: bool = False, band: bool = False, explain: bool = False
                        ) -> tuple[DramCounts | None, tuple[DramCounts, DramCounts] | None, str | None]:
    """``covered_dram``; with ``band``, under the timed schedule, its counts at the two ends of the blocks' spread
    (``BLOCK_SPREADS``), made beside it from the same grids (else None); and why the counts are None where that is
    worth saying, for a report that carries on without them: the count would take too long (``DramTooLong``'s
    message), the timed schedule cannot time it (``NotTimed``'s), or the kernel the caller named refuses the
    request; with ``explain`` (a report of one algorithm), also the default kernel's refusal, or that the algorithm
    has none."""
    try:
        found = covered_at(plans, hw, algorithm, kernel, sawtooth, spreads_of(hw) if band else (hw.block_spread,),
                           explain)
    except (DramTooLong, NotTimed) as err:
        return None, None, str(err)
    except OverrideError:
        raise
    except InputError as err:  # the named kernel's refusal, or with ``explain`` the default's (covered_at)
        if named_for(algorithm, kernel) is None:  # the refusal says why the L2 model has no grid
            return None, None, str(err)
        return None, None, f"kernel {kernel} refuses {algorithm} here: {err}"
    if found is None:
        return None, None, None
    middle, *ends = found
    return middle, (tuple(ends) if ends else None), None
