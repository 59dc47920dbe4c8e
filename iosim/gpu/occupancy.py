"""How many thread blocks of a kernel one SM holds: read from the committed resource report, not typed in.

``kernels_resources_sm90.json`` beside this module is what ``python -m experiments.kernel_resources``
measured of ``kernels/`` compiled for sm_90 (registers, shared memory, the blocks per SM they allow); its
``git_commit`` names the kernels it measured; a build's blocks per SM on any preset come from its registers,
shared memory and threads under that GPU's limits (``Resources.bound``). ``Report.lookup`` finds a kernel's row
by name, the part of the kernel (forward, backward, split, combine, row_dot, fill, cast), dtype, head dimension,
build (plain, causal+dropout, sawtooth) and tile; a tiling the kernel does not launch has no row, and the grid then
takes the bound its shared memory gives (``iosim.gpu.l2.SharedMemoryBound``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from iosim.core.gpus import CC_9_0
from iosim.gpu.l2 import ResourceBound

RESOURCE_REPORT = Path(__file__).with_name("kernels_resources_sm90.json")
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}

# "flash-swapped forward d=64 fp16 causal+dropout TileConfig(Br=64, Bc=32, TM=4, TN=4)",
# "sawtooth flash-swapped forward d=128 fp16 TileConfig(...)", "split-kv split d=64 fp16 S=3 TileConfig(...)",
# "flash-swapped-tc backward d=128 bf16 (4 warps, 64x16)" (64 keys by 16 queries), "split-kv combine d=64 fp16 (B_r=64)"
_MAIN = re.compile(r"^(?P<sawtooth>sawtooth )?(?P<kernel>flash-swapped-tc|flash-swapped|flash|split-kv) "
                   r"(?P<part>forward|backward|split|combine) d=(?P<d>\d+) (?P<dtype>fp32|fp16|bf16)"
                   r"(?P<causal> causal\+dropout)?(?: S=(?P<splits>\d+))? "
                   r"(?:TileConfig\(Br=(?P<br>\d+), Bc=(?P<bc>\d+)[^)]*\)|\(4 warps, (?P<a>\d+)x(?P<b>\d+)\)"
                   r"|\(B_r=(?P<rows>\d+)\))$")
# kernels/_device.py's grid-stride kernels of the backward: D = rowsum(dO ∘ O), the fill of dQ's float32
# accumulator, and its cast (or round, to bfloat16) to the dtype
_GRID_STRIDE = re.compile(r"^(?:(?P<row_dot>D = rowsum\(dO o O\))|(?P<fill>fill)|(?P<cast>cast|round) fp32 ->)"
                          r" (?P<dtype>fp32|fp16|bf16)")


@dataclass(frozen=True)
class Resources:
    """One kernel build's row of the report."""

    kernel: str  # the implementation, as kernels/api.py names it, or row_dot / fill / cast
    part: str  # forward, backward, split, combine; the grid-stride kernels' own name
    dtype: str
    d: int | None  # None for the grid-stride kernels, which take any d
    build: str  # "plain", "causal+dropout" or "sawtooth"
    tile: tuple[int, int] | None  # (B_r, B_c) the build launches; None where it has no tile of keys (combine)
    blocks_per_sm: int  # on an H100, as the report computed it
    registers: int
    shared_bytes: int  # ptxas's figure: the block's shared memory with the 1 KiB sm_90 keeps back, 0 where it has none
    label: str  # the report's own name of the build
    threads: int
    # the cubin's machine code and constant banks, which a launch reads from DRAM once from a cold L2
    # (experiments/code_bytes.py); None in a report made before it recorded them
    code_bytes: int | None = None
    splits: int | None = None  # the split count split-kv's split kernel is compiled for; None for the others

    def bound(self) -> ResourceBound:
        """Its occupancy on any preset (``sm90_bound``); ``blocks_per_sm`` on an H100. The registers are the sm_90
        build's, which another architecture's compiler may not repeat."""
        return sm90_bound(self.shared_bytes, self.threads, self.registers)


def sm90_bound(shared_bytes: int, threads: int, registers: int) -> ResourceBound:
    """The occupancy bound of a build from what ptxas reports for sm_90: its shared memory less the 1 KiB per block
    that sm_90 keeps back and ptxas counts in it (0 where the build has none), its threads and its registers per
    thread, under any GPU's limits (``iosim.gpu.l2.occupancy_limits``)."""
    return ResourceBound(max(0, shared_bytes - CC_9_0.reserved_per_block), threads, registers)


def parse(row: dict) -> Resources | None:
    """A report row as ``Resources``; None for a kernel the DRAM level has no grid for (standard's matmuls)."""
    label = row["kernel"]
    found = _MAIN.match(label)
    if found:
        g = found.groupdict()
        if g["br"]:
            tile = (int(g["br"]), int(g["bc"]))
        elif g["a"]:  # the tensor-core kernels: 64 rows by B_c keys forward, 64 keys by B_r queries backward
            a, b = int(g["a"]), int(g["b"])
            tile = (a, b) if g["part"] == "forward" else (b, a)
        else:
            tile = None
        build = "sawtooth" if g["sawtooth"] else "causal+dropout" if g["causal"] else "plain"
        return Resources(g["kernel"], g["part"], DTYPES[g["dtype"]], int(g["d"]), build, tile, row["blocks_per_sm"],
                         row["registers"], row["shared_bytes"], label, row["threads"], row.get("code_bytes"),
                         int(g["splits"]) if g["splits"] else None)
    found = _GRID_STRIDE.match(label)
    if found:
        part = next(k for k in ("row_dot", "fill", "cast") if found.group(k))
        return Resources(part, part, DTYPES[found.group("dtype")], None, "plain", None, row["blocks_per_sm"],
                         row["registers"], row["shared_bytes"], label, row["threads"], row.get("code_bytes"))
    return None


@dataclass(frozen=True)
class Report:
    """The resource report: its rows, the commit whose kernels it measured, and where it is."""

    rows: tuple[Resources, ...]
    commit: str
    path: Path

    def lookup(self, kernel: str, part: str, dtype: str, d: int | None = None, *, causal: bool = False,
               sawtooth: bool = False, tile: tuple[int, int] | None = None, any_dtype: bool = False,
               any_d: bool = False) -> Resources | None:
        """The row of ``kernel``'s ``part`` in ``dtype`` at head dimension ``d``, of the build the options select
        (sawtooth; else causal+dropout where ``causal``, which the report measures with dropout; else plain, and
        the plain build where no causal one was measured), launching ``tile`` where given. ``any_dtype``: a kernel
        compiled in one dtype only stands for the others (the grid-stride kernels, one thread per element, whose
        registers the element size does not change); ``any_d``: a build at one head dimension stands for the others
        (split-kv's combine, which holds no tile in shared memory: the report gives it the same registers at every d
        it compiles). An exact match is always preferred. None where the report has no such row."""
        def matches(r: Resources, lenient: bool) -> bool:
            return (r.kernel == kernel and r.part == part and (r.dtype == dtype or (lenient and any_dtype))
                    and (r.d is None or r.d == d or (lenient and any_d))
                    and (tile is None or r.tile is None or r.tile == tile))

        builds = ("sawtooth",) if sawtooth else ("causal+dropout", "plain") if causal else ("plain",)
        for lenient in (False, True) if any_dtype or any_d else (False,):
            for build in builds:
                found = [r for r in self.rows if r.build == build and matches(r, lenient)]
                if found:
                    return found[0]
        return None

    def exact(self, kernel: str, part: str, dtype: str, d: int, build: str, tile: tuple[int, int],
              splits: int | None = None, any_dtype: bool = False) -> Resources | None:
        """The row of exactly this build, or None where the report did not compile it: ``kernel``'s ``part`` in
        ``dtype`` (any, with ``any_dtype``: a kernel compiled in one dtype whatever the problem's, such as the fill
        of the float32 accumulator), at head dimension ``d`` (a kernel compiled without one takes any), of
        ``build``, launching ``tile`` where it holds one, and compiled for ``splits`` where it is compiled per split
        count. No other build stands in (their code differs by up to 2.4×: experiments/code_bytes.py)."""
        for r in self.rows:
            if ((r.kernel, r.part, r.build) == (kernel, part, build) and (any_dtype or r.dtype == dtype)
                    and r.d in (None, d) and r.tile in (None, tile) and r.splits in (None, splits)):
                return r
        return None


@cache
def report(path: Path = RESOURCE_REPORT) -> Report:
    """The committed resource report, read once."""
    data = json.loads(path.read_text())
    rows = tuple(r for r in (parse(row) for row in data["kernels"]) if r is not None)
    return Report(rows, data["git_commit"], path)
