"""The GPU the DRAM level runs on, resolved once: a preset and the user's overrides of the L2 model.

``hardware(gpu, l2_bytes=..., blocks_per_sm=..., schedule=...)`` is called at the edge (the
API's ``dram``, the CLI, the sweep) and the ``Hardware`` it returns travels down whole; nothing
below it looks a preset up by name again.
"""

from __future__ import annotations

from dataclasses import dataclass

from iosim.core.errors import InputError
from iosim.core.gpus import GPU, get_gpu
from iosim.core.units import parse_bytes, parse_count
from iosim.gpu.l2 import SECTOR, Grid, L2Config

# How the blocks run (iosim.gpu.schedule). "lockstep": the first W start in the first round, so equal blocks run in
# waves that start and end together. "timed" (iosim.gpu.timed): blocks step at their own speed and stall on what they
# miss, for the one-kernel forward passes of kernels with a measured rate (Kernel.rate).
SCHEDULES = ("lockstep", "timed")
# Schedules offered once and retired, with why: a request for one is refused with its reason
RETIRED_SCHEDULES = {
    "staggered": "retired after calls 3 and 4: an H100 starts a wave's blocks together (within 3.3 µs at one head, "
                 "2.8 % of a block after 63 waves: docs/gpu-logs/2026-11-27-h100-call3.md), where staggered spread "
                 "the first wave's starts over a whole block; 'timed' models the drift that does happen",
}
# The timed schedule's spread of the blocks' own speeds: call 3's block trace (flash-swapped float32, 16 heads, N
# 65,536, d 128: docs/gpu-logs/2026-11-27-h100-call3.md) put the blocks within 1 % of each other (sd) and the SMs
# within 1e-5; a request runs the middle of that range, and its band the two ends (iosim.gpu.dram.spreads_of)
BLOCK_SPREADS = (0.0, 0.01)
CENTRAL_SPREAD = 0.005


class OverrideError(InputError):
    """An override of the L2 model that the kernel it meets cannot take (more blocks per SM than fit)."""


def check_schedule(schedule) -> str:
    if isinstance(schedule, str) and schedule in RETIRED_SCHEDULES:
        raise InputError(f"schedule={schedule!r} is {RETIRED_SCHEDULES[schedule]}; use one of {list(SCHEDULES)}")
    if schedule not in SCHEDULES:
        raise InputError(f"schedule={schedule!r} is not one of {list(SCHEDULES)}")
    return schedule


@dataclass(frozen=True)
class Hardware:
    """A GPU preset with the user's overrides of the L2 model (``--l2-bytes``, ``--blocks-per-sm``, ``--schedule``).

    ``l2_bytes`` is what DRAM sees of the L2 (the preset's effective capacity unless overridden),
    ``blocks_per_sm`` overrides every kernel's occupancy (None: each kernel's own, from the resource
    report), ``schedule`` is one of ``SCHEDULES``. ``overrides`` records what the user set, for records.
    """

    gpu: GPU
    l2_bytes: int
    blocks_per_sm: int | None
    schedule: str
    l2_overridden: bool = False
    block_spread: float = CENTRAL_SPREAD  # the timed schedule's (iosim.gpu.timed.Timing.block_spread)

    @property
    def sms(self) -> int:
        return int(self.gpu.sms.value)

    def config(self, grid: Grid) -> L2Config:
        """The L2 model's view of one kernel: the L2 bytes, its blocks at once (SMs × its blocks per SM) and the
        schedule. An override of the blocks per SM above what the kernel's registers, shared memory and threads allow
        on this GPU is refused."""
        fits = grid.per_sm(self.gpu)
        if self.blocks_per_sm is not None and self.blocks_per_sm > fits:
            raise OverrideError(f"blocks_per_sm={self.blocks_per_sm}: the kernel's registers, shared memory and "
                                f"threads fit at most {fits} of its blocks on an SM of the {self.gpu.name}; allowed: 1 "
                                f"to {fits}")
        per_sm = fits if self.blocks_per_sm is None else self.blocks_per_sm
        return L2Config(self.l2_bytes, self.sms * per_sm, self.schedule)

    def with_l2_bytes(self, l2_bytes: int) -> Hardware:
        """The same GPU with an L2 of ``l2_bytes`` (a capacity sweep)."""
        return Hardware(self.gpu, check_l2_bytes(self.gpu, l2_bytes), self.blocks_per_sm, self.schedule, True,
                        self.block_spread)

    def overrides(self) -> dict:
        """What the user set: the keys a record carries (None where the preset's or the kernel's own stands)."""
        return {"l2_bytes": self.l2_bytes if self.l2_overridden else None, "blocks_per_sm": self.blocks_per_sm,
                "schedule": None if self.schedule == "lockstep" else self.schedule}


def hardware(gpu: str | GPU = "h100", *, l2_bytes=None, blocks_per_sm=None, schedule: str = "lockstep",
             physical: bool = False) -> Hardware:
    """Resolve a preset (by name, ``iosim.core.gpus.GPUS``) and the user's overrides once, checking each
    (``physical``: the L2 no larger than the preset's, as the command line asks)."""
    preset = gpu if isinstance(gpu, GPU) else get_gpu(gpu)
    cap = int(preset.l2_effective.value) if l2_bytes is None else check_l2_bytes(preset, l2_bytes, physical)
    per_sm = None if blocks_per_sm is None else parse_count("blocks_per_sm", blocks_per_sm)
    if per_sm is not None and per_sm > preset.sm.blocks:
        raise InputError(f"blocks_per_sm={per_sm} is more than an SM of the {preset.name} holds (compute capability "
                         f"{preset.sm.compute_capability}); allowed: 1 to {preset.sm.blocks}")
    return Hardware(preset, cap, per_sm, check_schedule(schedule), l2_bytes is not None)


def check_l2_bytes(preset: GPU, l2_bytes, physical: bool = False) -> int:
    """An L2 capacity of at least one sector (the L2's unit to DRAM); with ``physical`` (the command line's
    ``--l2-bytes``) at most the preset's nominal L2 too. The API takes a larger one, an L2 that holds everything, as
    a what-if."""
    value = parse_bytes("l2_bytes", l2_bytes)
    nominal = int(preset.l2.value)
    if value < SECTOR or (physical and value > nominal):
        allowed = f"[{SECTOR}, {nominal:,}]: from one {SECTOR}-byte sector to the {preset.name}'s nominal L2" \
            if physical else f"at least one sector, {SECTOR}"
        raise InputError(f"l2_bytes={value:,} is outside the allowed range {allowed}")
    return value
