"""The GPU's L2 between SRAM and DRAM, and the thread blocks that share it.

The two-level ``Memory`` counts every load and store as HBM traffic. On a GPU they go
through an L2 shared by all SMs, and many thread blocks run at once, so a tile one
block loads may already be there because another loaded it (docs/gpu.md). A kernel's
launch is a ``Grid`` of thread blocks (``iosim.gpu.grids``, one module per kernel); this
module holds what the L2 model counts with, and the rules it follows:

- **Schedule.** W = SMs × blocks per SM blocks run at once. They start in grid order,
  and a new one starts in the slot of one that finishes, in the next round (dynamic
  dispatch). Each round, every running block makes one tile step, in slot order
  (round robin).
- **L2.** Least-recently-used replacement of whole tiles, fully associative; a tile's
  size is rounded up to 32-byte sectors. Write-back: a written tile is dirty until it
  is evicted, when it goes to DRAM. A write that covers whole sectors fetches nothing;
  one that does not (a size that is not a multiple of 32 B) is read first.
- **Reports**, per tensor, in bytes: DRAM reads (misses of reads), DRAM writes while
  the kernel runs (evictions of dirty tiles, what ncu counts) and the dirty bytes still
  in the L2 at the end (written later, outside the kernel).

LRU of variable sizes keeps the most recently used tiles that fit: a tile is resident
exactly when the distinct bytes touched since its last use, itself included, are at most
the capacity (its stack distance). The closed forms that algorithms give beside the
simulation (``iosim.gpu.grids``) use that rule; ``iosim.gpu.lockstep`` counts a grid of equal blocks from one
block's steps, ``iosim.gpu.schedule`` runs any grid against the LRU, and ``iosim.gpu.dram`` picks the fastest path
that applies.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, islice

from iosim.core.counts import PerTensor
from iosim.core.errors import InputError
from iosim.core.gpus import GPU
from iosim.core.tiling import ceil_div

SECTOR = 32  # bytes: the L2's unit of transfer to DRAM (NVIDIA CUDA C++ best practices guide, "Coalesced access")
READ, WRITE, READ_WRITE = 1, 2, 3  # what an access does to its tile

# One access: (key, bytes rounded to sectors, READ/WRITE/READ_WRITE); ``Tiles.access`` builds it.
Access = tuple[int, int, int]
Step = tuple[Access, ...]  # what one thread block moves in one step of its loop


# 32-bit registers per SM (64 K at every compute capability of the presets: CUDA Programming Guide (CUDA 13), 5.1
# Compute Capabilities, table 31), split over the SM's 4 sub-partitions (cuda_occupancy.h's
# cudaOccSubPartitionsPerMultiprocessor, compute capabilities 7 to 12) and allocated to each warp in units of 256
# (cudaOccRegAllocationGranularity)
REGISTERS_PER_SM = 65536
SUBPARTITIONS = 4
REGISTER_UNIT = 256
WARP = 32


def warps(threads: int) -> int:
    """The whole warps a block of ``threads`` takes."""
    return ceil_div(threads, WARP)


def warp_registers(registers: int) -> int:
    """The registers a warp of ``registers`` a thread is allocated, in whole units of REGISTER_UNIT."""
    return ceil_div(registers * WARP, REGISTER_UNIT) * REGISTER_UNIT


def occupancy_limits(gpu: GPU, block_bytes: int, threads: int | None = None, registers: int = 0) -> dict[str, int]:
    """The blocks of one kernel that an SM of ``gpu`` holds by each resource that binds it: its compute capability's
    most resident blocks (``GPU.sm``), its shared memory (``block_bytes`` a block and the bytes the driver keeps back
    from each, together rounded up to the compute capability's allocation unit, ``SMLimits.smem_unit``), and, where
    the block is known that far, its threads (in whole warps) and its registers per thread. Registers go to warps,
    each warp's rounded up to the allocation unit, within one sub-partition: an SM holds as many warps as one
    sub-partition's 16 K registers fit, times 4 (cuda_occupancy.h's cudaOccMaxBlocksPerSMRegsLimit), which for a
    block of 1, 2 or 3 warps can be fewer than the whole register file over the block's (196 registers by 64
    threads: 2 warps a sub-partition, 4 blocks, where 65,536 / 12,800 gives 5).
    What iosim.kernels' resource report computes for the H100 from ptxas's figures, and what the DRAM level bounds a
    kernel by on any preset."""
    allocated = ceil_div(block_bytes + gpu.sm.reserved_per_block, gpu.sm.smem_unit) * gpu.sm.smem_unit
    limits = {"blocks": gpu.sm.blocks, "shared memory": int(gpu.smem_per_sm.value) // max(1, allocated)}
    if threads is not None:
        block_warps = warps(threads)
        limits["threads"] = gpu.sm.threads // (block_warps * WARP)
        if registers:
            limits["registers"] = (REGISTERS_PER_SM // SUBPARTITIONS // warp_registers(registers) * SUBPARTITIONS
                                   // block_warps)
    return limits


@dataclass(frozen=True)
class SharedMemoryBound:
    """The occupancy of a kernel known only by its shared memory per block (a kernel that iosim.kernels does not
    implement, or a tiling the resource report did not compile): as many blocks as one SM of the GPU holds by its
    shared memory and its compute capability's block limit, an upper bound (registers may allow fewer)."""

    block_bytes: int

    def on(self, gpu: GPU) -> int:
        return max(1, min(occupancy_limits(gpu, self.block_bytes).values()))


@dataclass(frozen=True)
class ResourceBound(SharedMemoryBound):
    """The occupancy of a kernel known by its shared memory per block, its threads per block and its registers per
    thread (from a compiled build): the fewest blocks of the limits (``occupancy_limits``). A block larger than one
    SM's shared memory is refused by name: the kernel does not launch there as described."""

    threads: int = WARP
    registers: int = 0

    def on(self, gpu: GPU) -> int:
        most = int(gpu.smem_per_sm.value) - gpu.sm.reserved_per_block
        if self.block_bytes > most:
            raise InputError(f"a block of {self.block_bytes:,} B of shared memory: the {gpu.name} gives one block at "
                             f"most {most:,} B, so the kernel as described does not launch on it; allowed: a GPU "
                             f"with more shared memory per SM")
        if self.threads > gpu.sm.threads:
            raise InputError(f"a block of {self.threads:,} threads: an SM of the {gpu.name} (compute capability "
                             f"{gpu.sm.compute_capability}) holds at most {gpu.sm.threads:,}, so the kernel as "
                             f"described does not launch on it; allowed: a GPU that holds more")
        return max(1, min(occupancy_limits(gpu, self.block_bytes, self.threads, self.registers).values()))


def sectors(nbytes: int) -> int:
    """Bytes (or an array of them) rounded up to whole 32-byte sectors."""
    return -(-nbytes // SECTOR) * SECTOR


class Tiles:
    """Keys of the tiles of a grid's tensors: tile ``index`` of ``tensor`` is one L2 entry."""

    def __init__(self, tensors: tuple[str, ...]):
        self.tensors = tensors
        self._id = {name: k for k, name in enumerate(tensors)}

    def access(self, tensor: str, index: int, nbytes: int, mode: int) -> Access:
        """An access of ``nbytes`` to tile ``index`` of ``tensor``; a write of part of a sector reads it first."""
        if mode == WRITE and nbytes % SECTOR:
            mode = READ_WRITE
        return index * len(self.tensors) + self._id[tensor], sectors(nbytes), mode

    def tensor(self, key: int) -> str:
        """The tensor of an access's tile key."""
        return self.tensors[key % len(self.tensors)]


@dataclass(frozen=True)
class SharedSteps:
    """A block's steps: its own ``head``, then ``body[start:stop]``, a run of step objects it shares with other
    blocks (the same ``body`` object for all of them), then its own ``tail``. Iterating gives them in order."""

    head: tuple[Step, ...]
    body: Sequence[Step]
    start: int
    stop: int
    tail: tuple[Step, ...]

    def __post_init__(self):
        if not 0 <= self.start <= self.stop <= len(self.body):
            raise ValueError(f"SharedSteps run {self.start}:{self.stop} must lie within its body of {len(self.body)} "
                             f"steps")

    def __iter__(self) -> Iterator[Step]:
        return chain(self.head, islice(self.body, self.start, self.stop), self.tail)

    @property
    def total(self) -> int:
        return len(self.head) + self.stop - self.start + len(self.tail)

    def runs_with(self, other: SharedSteps) -> bool:
        """Whether the two, started in one round, make every step in the same rounds and share every body step."""
        return (self.body is other.body and self.start == other.start and self.stop == other.stop
                and len(self.head) == len(other.head) and len(self.tail) == len(other.tail))


def shared_run(head: Step, body: Sequence[Step], first: int, count: int, tail: Step) -> Iterator[Step] | SharedSteps:
    """A block's steps over ``count`` (at least one) consecutive steps of a shared ``body`` from ``first``: its own
    ``head`` accesses with the first, its own ``tail`` with the last, those between shared, so that the blocks of a
    head that start together run as one cohort (``iosim.gpu.schedule``)."""
    if count == 1:
        return iter((head + body[first] + tail,))
    return SharedSteps((head + body[first],), body, first + 1, first + count - 1, (body[first + count - 1] + tail,))


@dataclass(frozen=True)
class Grid:
    """A kernel's thread blocks as it launches them.

    ``steps(b)`` yields block b's tile steps in order (blocks are numbered in launch
    order, the order they start in), as an iterator or a ``SharedSteps``; ``blocks_per_sm`` is how many of them one SM
    holds at once: measured from the kernel's registers and shared memory, or bounded by its
    shared memory on each GPU (``per_sm``).
    """

    blocks: int
    steps: Callable[[int], Iterator[Step] | SharedSteps]
    tiles: Tiles
    blocks_per_sm: int | SharedMemoryBound
    # every block makes the same steps, on tiles no other block touches (iosim.gpu.lockstep.lockstep)
    uniform: bool = False
    # every block makes as many steps (at least one), and groups of ``fuse`` consecutive blocks share their joined
    # steps with other groups (the sawtooth's even and odd query blocks): the lockstep simulation runs each group as
    # one block (``iosim.gpu.schedule.fused``)
    fuse: int = 1
    # the grid's closed form under the lockstep schedule, (capacity, concurrent) -> its counts or None outside its
    # domain (``iosim.gpu.head_waves``); None where it has none of its own
    form: Callable[[int, int], DramForm | None] | None = None
    # the bytes of machine code and constant banks its kernel's binary holds, which a launch reads from DRAM once from
    # a cold L2 (iosim.gpu.kernels: the resource report's build); None where no binary was read
    code_bytes: int | None = None
    # the steps block 0 makes, where known without walking them (what a lockstep count's budget weighs)
    block_steps: int | None = None
    # the grid as the compiled loops' arrays (an ``iosim.gpu.timed_engine.FlatGrid``), built without walking its
    # blocks; None where ``timed_engine.flatten`` walks them
    flat: Callable[[], object] | None = None

    def per_sm(self, gpu: GPU) -> int:
        """Blocks one SM of ``gpu`` holds at once."""
        return self.blocks_per_sm if isinstance(self.blocks_per_sm, int) else self.blocks_per_sm.on(gpu)


# the machine code and constant banks of a request's kernels, counted beside its tensors (iosim.gpu.dram.request_dram)
CODE = "code"


@dataclass(frozen=True)
class DramTensor:
    """One tensor's DRAM bytes: read (L2 misses), written during the kernel, dirty in the L2 at its end."""

    name: str
    reads: int
    writes: int
    dirty_at_end: int


@dataclass(frozen=True)
class DramCounts(PerTensor):
    """DRAM bytes of one kernel behind an L2 of ``capacity`` bytes with ``concurrent`` blocks at once."""

    tensors: tuple[DramTensor, ...]
    capacity: int
    concurrent: int

    @property
    def dirty_at_end(self) -> int:
        return sum(t.dirty_at_end for t in self.tensors)

    @property
    def moved(self) -> int:
        """Every byte the kernel makes cross the DRAM bus: reads, writes, and the dirty bytes written back after."""
        return self.reads + self.writes + self.dirty_at_end


def read_range(dram: DramCounts, band: tuple[DramCounts, DramCounts]) -> tuple[int, int]:
    """The fewest and the most DRAM reads of a timed count and its band (the middle need not lie between the ends)."""
    reads = [dram.reads, *(b.reads for b in band)]
    return min(reads), max(reads)


def dram_record(dram: DramCounts | None, band: tuple[DramCounts, DramCounts] | None = None,
                bracketed: bool | None = None) -> dict:
    """A record's DRAM keys: read (the kernels' code included, where their binaries were read), of it the code, written
    during the kernel and dirty bytes; under the timed schedule the fewest and the most reads over the blocks' spread
    (its two ends and the middle), and whether the ends move them by more than 10 %; null where the model or the
    schedule does not apply."""
    low, high = (None, None) if band is None else read_range(dram, band)
    code = None if dram is None else next((t.reads for t in dram.tensors if t.name == CODE), None)
    return {"dram_read_bytes": getattr(dram, "reads", None), "dram_code_bytes": code,
            "dram_write_bytes": getattr(dram, "writes", None),
            "dram_dirty_bytes": getattr(dram, "dirty_at_end", None), "dram_read_low": low, "dram_read_high": high,
            "dram_bracketed": bracketed}


@dataclass(frozen=True)
class DramForm:
    """A closed form's DRAM bytes per tensor: ``reads``, ``written`` = writes during the kernel + dirty at its
    end, and ``dirty_at_end``, the part of ``written`` still in the L2 at the end."""

    reads: dict[str, int]
    written: dict[str, int]
    dirty_at_end: dict[str, int]

    def counts(self, tiles: Tiles, config: L2Config) -> DramCounts:
        """As ``simulate`` reports them."""
        left = self.dirty_at_end
        return DramCounts(tuple(DramTensor(name, self.reads.get(name, 0),
                                           self.written.get(name, 0) - left.get(name, 0), left.get(name, 0))
                                for name in tiles.tensors), config.capacity, config.concurrent)


@dataclass(frozen=True)
class L2Config:
    """What the L2 model needs of a GPU: the L2 bytes DRAM sees, the blocks that run at once, and how they run
    (``iosim.gpu.hardware.SCHEDULES``)."""

    capacity: int
    concurrent: int
    schedule: str = "lockstep"


class LRU:
    """A write-back L2 of whole tiles with least-recently-used replacement; counts DRAM bytes per tensor."""

    def __init__(self, capacity: int, n_tensors: int):
        if capacity < SECTOR:
            raise InputError(f"L2 capacity={capacity} bytes; allowed: at least one {SECTOR}-byte sector")
        self.capacity, self.n = capacity, n_tensors
        self.resident: OrderedDict[int, int] = OrderedDict()  # key -> bytes, least recent first
        self.dirty: set[int] = set()
        self.used = 0
        self.reads = [0] * n_tensors
        self.writes = [0] * n_tensors

    def step(self, step: Step) -> None:
        resident, dirty, reads, writes = self.resident, self.dirty, self.reads, self.writes
        capacity, n, used = self.capacity, self.n, self.used  # locals: this loop is the simulation's hot spot
        for key, nbytes, mode in step:
            if key in resident:
                resident.move_to_end(key)
            else:
                if mode & READ:
                    reads[key % n] += nbytes
                if nbytes > capacity:  # never fits: goes straight through
                    if mode & WRITE:
                        writes[key % n] += nbytes
                    continue
                used += nbytes
                while used > capacity:
                    old, size = resident.popitem(last=False)
                    used -= size
                    if old in dirty:
                        dirty.discard(old)
                        writes[old % n] += size
                resident[key] = nbytes
            if mode & WRITE:
                dirty.add(key)
        self.used = used

    def fits(self, step: Step) -> bool:
        """Whether every tile of ``step`` is resident, and dirty where the step writes it: asked right after the step
        ran, whether running it again would change nothing (each tile a hit, moved to the recent end in the order it
        already has, no tile made dirty: a write larger than the L2 went past it)."""
        resident, dirty = self.resident, self.dirty
        return all(key in resident and (not mode & WRITE or key in dirty) for key, _, mode in step)

    def counts(self, tiles: Tiles, config: L2Config) -> DramCounts:
        left = [0] * self.n
        for key in self.dirty:
            left[key % self.n] += self.resident[key]
        return DramCounts(tuple(DramTensor(name, self.reads[k], self.writes[k], left[k])
                                for k, name in enumerate(tiles.tensors)), config.capacity, config.concurrent)


def in_sequence(parts: list[DramCounts]) -> DramCounts:
    """Kernels run one after another, each from a cold L2 (as ncu measures them): per tensor sums; the blocks at
    once are the most of any kernel."""
    names = list(dict.fromkeys(t.name for p in parts for t in p.tensors))
    total = {name: [0, 0, 0] for name in names}
    for p in parts:
        for t in p.tensors:
            total[t.name] = [a + b for a, b in zip(total[t.name], (t.reads, t.writes, t.dirty_at_end))]
    return DramCounts(tuple(DramTensor(name, *total[name]) for name in names), parts[0].capacity,
                      max(p.concurrent for p in parts))
