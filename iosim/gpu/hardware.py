"""The GPU the DRAM level runs on, resolved once: a preset and the user's overrides of the L2 model.

``hardware(gpu, l2_bytes=..., blocks_per_sm=..., schedule=...)`` is called at the edge (the
API's ``dram``, the CLI, the sweep) and the ``Hardware`` it returns travels down whole; nothing
below it looks a preset up by name again.
"""

from __future__ import annotations

from dataclasses import dataclass

from iosim.core.errors import InputError
from iosim.core.gpus import GPU, get_gpu
from iosim.core.units import parse_count
from iosim.gpu.l2 import Grid, L2Config

# How the first W blocks start (iosim.gpu.schedule). "lockstep": all in the first round, so equal blocks run in
# waves that start and end together. "staggered": slot s's first block starts s/W of a mean block's steps late, so
# that blocks finish one after another and the running blocks are a window sliding along the grid, the steady state
# of dynamic dispatch once blocks of equal work drift apart.
SCHEDULES = ("lockstep", "staggered")


def check_schedule(schedule) -> str:
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

    @property
    def sms(self) -> int:
        return int(self.gpu.sms.value)

    def config(self, grid: Grid) -> L2Config:
        """The L2 model's view of one kernel: the L2 bytes, its blocks at once (SMs × its blocks per SM) and the
        schedule."""
        per_sm = grid.per_sm(self.gpu) if self.blocks_per_sm is None else self.blocks_per_sm
        return L2Config(self.l2_bytes, self.sms * per_sm, self.schedule)

    def with_l2_bytes(self, l2_bytes: int) -> Hardware:
        """The same GPU with an L2 of ``l2_bytes`` (a capacity sweep)."""
        return Hardware(self.gpu, parse_count("l2_bytes", l2_bytes), self.blocks_per_sm, self.schedule, True)

    def overrides(self) -> dict:
        """What the user set: the keys a record carries (None where the preset's or the kernel's own stands)."""
        return {"l2_bytes": self.l2_bytes if self.l2_overridden else None, "blocks_per_sm": self.blocks_per_sm,
                "schedule": None if self.schedule == "lockstep" else self.schedule}


def hardware(gpu: str | GPU = "h100", *, l2_bytes=None, blocks_per_sm=None, schedule: str = "lockstep") -> Hardware:
    """Resolve a preset (by name, ``iosim.core.gpus.GPUS``) and the user's overrides once, checking each."""
    preset = gpu if isinstance(gpu, GPU) else get_gpu(gpu)
    cap = int(preset.l2_effective.value) if l2_bytes is None else parse_count("l2_bytes", l2_bytes)
    per_sm = None if blocks_per_sm is None else parse_count("blocks_per_sm", blocks_per_sm)
    return Hardware(preset, cap, per_sm, check_schedule(schedule), l2_bytes is not None)
