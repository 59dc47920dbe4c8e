"""One kernel as the DRAM level sees it (``Kernel``), what a pass asks of it (``Launch``), and its occupancy.

A grid is a mapping of an algorithm onto the GPU, so the DRAM level is keyed by kernel, not by algorithm:
flash-swapped has a CUDA-core kernel and a tensor-core one, the sawtooth is an option of a kernel, split-kv
launches a split kernel and a combine. ``iosim.gpu.kernels`` lists the descriptions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from iosim.core.errors import InputError
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.gpu.l2 import DramForm, Grid, SharedMemoryBound
from iosim.gpu.occupancy import report

OPTIONS = ("sawtooth",)  # kernel options: the sawtooth order of flash-swapped's forward (odd query blocks reversed)
TAKES = ("fp8", "d_v")  # what some kernels take and the others refuse: FP8 data, a V head size apart from Q's and K's


@dataclass(frozen=True)
class Launch:
    """What one pass of a kernel is asked: the problem as the kernel runs it, the tiling, the pass and the options;
    ``sms``, the GPU's SMs, for a kernel whose launch depends on them (SDPA's choice of K/V splits)."""

    problem: Problem
    tiling: Tiling
    backward: bool = False
    sawtooth: bool = False
    sms: int | None = None


@dataclass(frozen=True)
class Kernel:
    """One kernel of a GPU implementation as the DRAM level sees it.

    ``launches`` gives the grids of every kernel a pass launches, in launch order, each with its blocks per SM;
    ``forward_dram`` is the closed form of the forward's one kernel (None where it has none), equal to the
    simulation of its grid where it applies.
    """

    name: str
    algorithm: str  # the registered algorithm whose HBM traffic it realises
    source: str  # where its code and its occupancy come from
    launches: Callable[[Launch], tuple[Grid, ...]]
    backward: bool  # whether it has a backward pass
    forward_dram: Callable[[Problem, Tiling, int, int], DramForm | None] | None = None
    options: tuple[str, ...] = ()  # which of OPTIONS it takes
    # the tile the kernel launches whatever it is asked (pass backward or not, on a GPU of that many SMs: None where
    # unknown), where it fixes its own; None where it takes the request's tiling
    tile: Callable[[Problem, bool, int | None], Tiling] | None = None
    # its forward's measured FLOP/s on the problem's dtype, which sets the timed schedule's miss penalty
    # (iosim.gpu.timed); None where no GPU run has timed it
    rate: Callable[[Problem], float] | None = None
    # what beyond one head size and 16- or 32-bit data it takes (TAKES): "fp8" data, "d_v" apart from d
    takes: tuple[str, ...] = ()
    # the GPU presets (names) it runs on where it is built for one architecture; None: any
    runs_on: tuple[str, ...] | None = None
    # the dtypes it is built for; None where its grids refuse by name the dtypes it lacks (sdpa-flash, fa3)
    dtypes: tuple[str, ...] | None = None

    def check_gpu(self, gpu: str) -> None:
        """Refuse, by name, a GPU the kernel is not built for."""
        if self.runs_on is not None and gpu not in self.runs_on:
            raise InputError(f"the {gpu} preset: kernel={self.name!r} is built for the {', '.join(self.runs_on)} "
                             f"only; allowed: a GPU preset of those")

    def own(self, launch: Launch) -> Launch:
        """``launch`` at the kernel's own tile, where it fixes one: the DRAM level describes the kernel as it runs."""
        return launch if self.tile is None else replace(launch, tiling=self.tile(launch.problem, launch.backward,
                                                                                 launch.sms))

    def grids(self, launch: Launch) -> tuple[Grid, ...]:
        """The grids of ``launch``'s pass (at the kernel's own tile, where it has one), refusing by name a pass or an
        option the kernel does not take."""
        if launch.backward and not self.backward:
            raise InputError(f"kernel={self.name!r} has no backward pass; allowed with it: pass 'fwd'")
        if launch.sawtooth and "sawtooth" not in self.options:
            raise InputError(f"sawtooth=True: kernel={self.name!r} takes no sawtooth order; allowed with it: "
                             f"sawtooth=False")
        check_launchable(launch.problem, self.takes)
        if self.dtypes is not None and launch.problem.dtype not in self.dtypes:
            raise InputError(f"dtype={launch.problem.dtype!r}: kernel={self.name!r} is built for "
                             f"{', '.join(self.dtypes)} only; allowed: those, or a kernel built for it "
                             f"(`iosim kernels`)")
        return self.launches(self.own(launch))

    def closed_form(self, launch: Launch) -> Callable[[Problem, Tiling, int, int], DramForm | None] | None:
        """The closed form of the pass's one kernel, where the kernel has one for it."""
        return None if launch.backward or launch.sawtooth else self.forward_dram


def check_launchable(pb: Problem, takes: tuple[str, ...] = ()) -> None:
    """Refuse, by name, what no kernel grid takes: the kernels described read no explicit or block mask, no block
    table and no attention sinks, skip no tiles outside a sliding window and launch one sequence per batch entry, not
    varlen's packed documents; and what a kernel that does not declare it in ``takes`` (``TAKES``) refuses: FP8 data,
    and a head size for V apart from Q's and K's."""
    if pb.has_mask or pb.block_sparsity is not None or pb.flex is not None:
        raise InputError("an explicit, block-sparse or FlexAttention block mask: no GPU kernel of iosim takes one, so "
                         "the L2 model has no grid for it; allowed: has_mask=False, block_sparsity=None, "
                         "block_mask=None")
    if pb.band.sliding:
        raise InputError(f"window=({pb.band.left}, {pb.band.right}): no GPU kernel of iosim takes a sliding "
                         f"window, so the L2 model has no grid for it; allowed: full attention, or causal (-1, 0)")
    if pb.page_size is not None:
        raise InputError(f"page_size={pb.page_size}: the L2 model's grids read no block table; allowed: None")
    if pb.seqlens is not None:
        raise InputError("seqlens: the L2 model's grids launch one sequence per batch entry, not packed documents; "
                         "allowed: None")
    if pb.sinks:
        raise InputError("sinks: no kernel the L2 model describes reads attention sinks; allowed: sinks=False")
    if pb.latent:
        raise InputError("latent: no kernel the L2 model describes reads MLA's latent cache; allowed: latent=False")
    if pb.fp8 and "fp8" not in takes:
        raise InputError(f"dtype={pb.dtype!r}: this kernel has no FP8 build; allowed: a dtype it is built for "
                         f"(`iosim kernels`), or a kernel that takes FP8 (fa3)")
    if pb.shape.d_v != pb.shape.d and "d_v" not in takes:
        raise InputError(f"d_v={pb.shape.d_v} beside d={pb.shape.d}: this kernel takes one head size for Q, K and V, "
                         f"as its grids and the resource report do; allowed: d_v = d, or a kernel that takes two "
                         f"(`iosim kernels`: fa3)")


def code(kernel: str, part: str, launch: Launch, one_build: bool = False, any_dtype: bool = False) -> int | None:
    """The code bytes of exactly the build ``launch`` runs, where the resource report compiled it; None where it did
    not. Its build: the sawtooth order's, causal and dropout together (the report's masked build has both), or
    neither; a causal pass without dropout, or a masked one in the sawtooth order, has none. ``one_build``: the
    kernel has one build whatever the mask (the grid-stride kernels, split-kv's combine)."""
    pb, t = launch.problem, launch.tiling
    masked = (pb.causal, pb.dropout_p > 0)
    if one_build:
        build = "plain"
    elif launch.sawtooth:
        build = "sawtooth" if masked == (False, False) else None
    else:
        build = {(False, False): "plain", (True, True): "causal+dropout"}.get(masked)
    row = None if build is None else report().exact(kernel, part, pb.dtype, pb.shape.d, build, (t.Br, t.Bc),
                                                    t.splits, any_dtype)
    return None if row is None else row.code_bytes


def measured(kernel: str, part: str, launch: Launch, bound: SharedMemoryBound | None,
             any_dtype: bool = False, any_d: bool = False) -> SharedMemoryBound:
    """The occupancy of ``kernel``'s ``part`` at the launch's dtype, head dimension, build and tile: the resource
    report's registers, shared memory and threads of that build, under each GPU's limits; where it has none,
    ``bound`` (what shared memory allows)."""
    pb, t = launch.problem, launch.tiling
    causal = pb.causal or pb.dropout_p > 0
    row = report().lookup(kernel, part, pb.dtype, pb.shape.d, causal=causal, sawtooth=launch.sawtooth,
                          tile=(t.Br, t.Bc), any_dtype=any_dtype, any_d=any_d)
    if row is not None:
        return row.bound()
    if bound is None:
        raise InputError(f"kernel {kernel} {part}: no row of the resource report at dtype={pb.dtype!r}, "
                         f"d={pb.shape.d}; allowed: the builds of {report().path.name}")
    return bound
