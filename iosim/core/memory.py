"""A two-level memory: HBM holding named tensors, and an on-chip SRAM of capacity M.

The model follows the paper's IO analysis (Dao et al. 2022, section 3.2):

- HBM holds named 2-D tensors per batch·head (Q, K, V, O, S, P, ℓ, m, ...); under
  grouped-query attention K and V are per batch·kv_head, one for each group of heads
  that run in lockstep, and a load hands each head its group's block.
- SRAM holds tiles. Every on-chip buffer, the S/P tile and the softmax statistics
  included, counts toward the capacity M, in elements (the paper's unit).
- Data moves only through ``load`` (HBM → SRAM, counted as reads of that tensor)
  and ``store`` (SRAM → HBM, counted as writes). Computation happens on tiles.

All batch·heads run in lockstep: a tile holds the same block of every head, so one
numpy operation covers them all. M is the SRAM of one streaming multiprocessor,
which in the paper's model serves one head at a time, so occupancy is counted per
head while traffic is summed over every head.

In count-only mode tiles carry shapes and no data. Blocks of equal size then move
identical traffic, so ``loop`` visits one block per size and weights its traffic by
how many there are (``iosim.core.visits``), in time independent of N. The algorithm code
is the same in both modes; tests hold the counts equal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from iosim.core.counts import Counts, TensorCounts
from iosim.core.flops import Flops

if TYPE_CHECKING:
    from iosim.core.visits import Blocks


class CapacityError(MemoryError):
    """An on-chip allocation would exceed the SRAM capacity M."""

    def __init__(self, requested: str, size: int, M: int, resident: dict[str, int]):
        self.requested, self.size, self.M, self.resident = requested, size, M, dict(resident)
        used = sum(resident.values())
        buffers = ", ".join(f"{name}={n}" for name, n in resident.items()) or "none"
        super().__init__(
            f"SRAM capacity M={M} elements exceeded: allocating {requested} ({size} elements) "
            f"on top of {used} resident [{buffers}] needs {used + size}"
        )


class Tile:
    """An on-chip buffer: ``rows × cols`` elements per head; ``data`` is (bh, rows, cols) or None. A ``view`` is
    columns of another tile (``Memory.view``): it holds no SRAM of its own."""

    __slots__ = ("name", "rows", "cols", "data", "view")

    def __init__(self, name: str, rows: int, cols: int, data: np.ndarray | None, view: bool = False):
        self.name, self.rows, self.cols, self.data, self.view = name, rows, cols, data, view

    @property
    def size(self) -> int:
        return 0 if self.view else self.rows * self.cols


class Memory:
    """HBM and SRAM for one run. Pass it explicitly: there is no global state.

    Args:
        M: SRAM capacity in elements, per head.
        bh: number of batch·heads processed in lockstep.
        numeric: True to carry data (float64), False for count-only.
    """

    def __init__(self, M: int, *, bh: int, numeric: bool):
        self.M, self.bh, self.numeric = int(M), int(bh), bool(numeric)
        self._hbm: dict[str, np.ndarray | None] = {}
        self._shape: dict[str, tuple[int, int]] = {}
        self._itemsize: dict[str, int] = {}
        self._group: dict[str, int] = {}  # heads of the run served by one head of the tensor
        self._reads: dict[str, int] = {}
        self._writes: dict[str, int] = {}
        self._resident: dict[int, Tile] = {}
        self._used = 0
        self._peak = 0
        self._flops = Flops()
        self._weight = 1  # count-only: how many blocks the current one stands for
        # count-only: [nested blocks, weight, nested sizes, taken] of each loop nested in the enclosing loop's block
        self._plan = None
        self.on_compute: Callable[[Flops], None] | None = None  # sees the arithmetic so far after each step

    # --- HBM ---------------------------------------------------------------
    def add_tensor(self, name: str, rows: int, cols: int, itemsize: int, data: np.ndarray | None = None,
                   heads: int | None = None) -> None:
        """Place a (rows, cols)-per-head tensor in HBM without counting traffic.

        Inputs arrive in HBM before the algorithm starts; outputs are allocated
        there. ``data`` must be (heads, rows, cols); without it the tensor starts as NaN. Writing
        initial values that the algorithm itself prescribes (Alg. 1 line 2) is the
        algorithm's job, through ``store``. ``heads`` (default bh) divides bh: each
        of its heads serves bh/heads consecutive heads of the run (a GQA group), which
        read it as their own, so a load counts bh reads of each element (read-only).
        """
        if name in self._shape:
            raise ValueError(f"tensor {name!r} is already in HBM")
        heads = self.bh if heads is None else int(heads)
        if heads < 1 or self.bh % heads:
            raise ValueError(f"tensor {name!r}: heads={heads} must divide bh={self.bh}")
        self._group[name] = self.bh // heads
        self._shape[name] = (rows, cols)
        self._itemsize[name] = itemsize
        self._reads[name] = 0
        self._writes[name] = 0
        if not self.numeric:
            self._hbm[name] = None
        elif data is not None:
            arr = np.asarray(data)
            arr = arr if arr.dtype == np.bool_ else arr.astype(np.float64)
            self._hbm[name] = arr.reshape(heads, rows, cols)
        else:
            self._hbm[name] = np.full((heads, rows, cols), np.nan)

    def tensor(self, name: str) -> np.ndarray:
        """The HBM contents of a tensor after a numeric run (no traffic counted)."""
        data = self._hbm[name]
        if data is None:
            raise RuntimeError(f"tensor {name!r} carries no data in count-only mode")
        return data

    def _block(self, name: str, rows: slice, cols: slice | None) -> tuple[slice, int, int]:
        """The column slice (all columns when None) and the size of a block, checked against the tensor."""
        if name not in self._shape:
            raise KeyError(f"no tensor {name!r} in HBM; tensors: {list(self._shape)}")
        n_rows, n_cols = self._shape[name]
        cols = cols if cols is not None else slice(0, n_cols)
        for axis, s, n in (("rows", rows, n_rows), ("cols", cols, n_cols)):
            if s.step not in (None, 1) or not 0 <= s.start < s.stop <= n:
                raise IndexError(f"{axis} {s.start}:{s.stop} of tensor {name!r} are outside its {n_rows} x {n_cols} "
                                 f"elements; allowed: a non-empty contiguous block within [0, {n})")
        return cols, rows.stop - rows.start, cols.stop - cols.start

    def load(self, name: str, rows: slice, cols: slice | None = None, *, tile: str | None = None) -> Tile:
        """Copy a block of an HBM tensor into a new SRAM tile, counting its reads."""
        cols, r, c = self._block(name, rows, cols)
        out = self.alloc(tile or name, r, c)
        self._reads[name] += r * c * self.bh * self._weight
        if self.numeric:
            out.data[...] = np.repeat(self._hbm[name][:, rows, cols], self._group[name], axis=0)  # (bh, r, c)
        return out

    def store(self, src: Tile, name: str, rows: slice, cols: slice | None = None) -> None:
        """Write an SRAM tile back to a block of an HBM tensor, counting the writes."""
        cols, r, c = self._block(name, rows, cols)
        if (r, c) != (src.rows, src.cols):
            raise ValueError(f"tile {src.name} is {src.rows}x{src.cols}; block of {name} is {r}x{c}")
        if self._group[name] != 1:
            raise ValueError(f"tensor {name!r} is shared by groups of {self._group[name]} heads: read-only")
        self._writes[name] += r * c * self.bh * self._weight
        if self.numeric:
            self._hbm[name][:, rows, cols] = src.data

    # --- SRAM --------------------------------------------------------------
    def alloc(self, name: str, rows: int, cols: int = 1, fill: float | None = None) -> Tile:
        """Allocate an on-chip buffer of rows × cols elements per head (uninitialized unless ``fill``)."""
        size = rows * cols
        if self._used + size > self.M:
            raise CapacityError(name, size, self.M, self.resident())
        data = None
        if self.numeric:
            data = np.empty((self.bh, rows, cols)) if fill is None else np.full((self.bh, rows, cols), fill)
        tile = Tile(name, rows, cols, data)
        self._resident[id(tile)] = tile
        self._used += size
        self._peak = max(self._peak, self._used)
        return tile

    def view(self, parent: Tile, name: str, cols: slice) -> Tile:
        """Columns ``cols`` of the resident tile ``parent`` as a tile of their own, with no SRAM and no read: MLA's V_j,
        the first d_v columns of the latent K_j. Freed like any tile."""
        if id(parent) not in self._resident or not 0 <= cols.start < cols.stop <= parent.cols:
            raise RuntimeError(f"view {name} of columns {cols.start}:{cols.stop} of tile {parent.name} "
                               f"({parent.cols} columns, resident: {id(parent) in self._resident})")
        data = parent.data[..., cols] if self.numeric else None
        tile = Tile(name, parent.rows, cols.stop - cols.start, data, view=True)
        self._resident[id(tile)] = tile
        return tile

    def free(self, *tiles: Tile) -> None:
        for t in tiles:
            if self._resident.pop(id(t), None) is None:
                raise RuntimeError(f"tile {t.name} is not resident in SRAM")
            self._used -= t.size

    def resident(self) -> dict[str, int]:
        """Buffers now in SRAM and their sizes in elements."""
        out: dict[str, int] = {}
        for t in self._resident.values():
            out[t.name] = out.get(t.name, 0) + t.size
        return out

    # --- arithmetic --------------------------------------------------------
    def compute(self, matmul: int = 0, exp: int = 0, score: int = 0) -> None:
        """Count the arithmetic of one step on one head's tiles, for every head (and every block it stands for)."""
        self._flops = self._flops + Flops(matmul, exp, score).scaled(self.bh * self._weight)
        if self.on_compute is not None:
            self.on_compute(self._flops)

    def flops(self) -> Flops:
        """The arithmetic counted so far, summed over batch·heads."""
        return self._flops

    # --- loops -------------------------------------------------------------
    def loop(self, blocks: Blocks) -> Iterator[tuple[int, slice]]:
        """(index, rows) of each block a loop visits.

        Numeric mode yields every block. Count-only mode yields one block of each size,
        weighting its traffic by how many blocks of that size the loop visits. Inside
        such a block, each loop over its nested blocks (``blocks.nested_plans(t)``: one, or
        several one after another) stands for the nested loops of every block of its size:
        it yields one nested block of each size, weighted by how many (block, nested block)
        pairs of those sizes there are. A loop over blocks that do not depend on the
        enclosing block is weighted by their own count.
        """
        if self.numeric:
            for t in blocks:
                yield t, blocks.axis.slice(t)
            return
        outer, plan = self._weight, self._plan
        # the first of the enclosing block's nested loops over these blocks that no loop has taken yet, else the
        # first at all: several nested loops over equal blocks (none, say) each take their own entry, and a loop
        # that passes twice over one set of blocks (two-pass softmax) takes its entry twice
        equal = [p for p in plan if p[0] == blocks] if plan is not None else []
        match = next((p for p in equal if not p[3]), equal[0] if equal else None)
        if match is not None:
            match[3] = True
            base, weights = match[1], [(blocks.axis.first_of_size(size), n) for size, n in match[2].items()]
        else:
            base, weights = outer, blocks.classes()
        try:
            for t, count in weights:
                self._weight = base * count
                nested = blocks.nested_plans(t)
                if nested:  # what the loops nested in block t will stand for
                    self._plan = [[inner, base, sizes, False] for inner, sizes in nested]  # False: not taken yet
                yield t, blocks.axis.slice(t)
        finally:
            self._weight, self._plan = outer, plan

    # --- results -----------------------------------------------------------
    def counts(self) -> Counts:
        """Every HBM tensor's reads and writes, in the order they were placed, and the peak SRAM."""
        if self._resident:
            raise RuntimeError(f"buffers still resident in SRAM at the end of the run: {self.resident()}")
        tensors = tuple(TensorCounts(n, self._reads[n], self._writes[n], self._itemsize[n]) for n in self._shape)
        return Counts(tensors=tensors, peak_sram=self._peak)
