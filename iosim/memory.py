"""A two-level memory: HBM holding named tensors, and an on-chip SRAM of capacity M.

The model follows the paper's IO analysis (Dao et al. 2022, section 3.2):

- HBM holds named 2-D tensors per batch·head (Q, K, V, O, S, P, ℓ, m, ...).
- SRAM holds tiles. Every on-chip buffer, the S/P tile and the softmax statistics
  included, counts toward the capacity M, in elements (the paper's unit).
- Data moves only through ``load`` (HBM → SRAM, counted as reads of that tensor)
  and ``store`` (SRAM → HBM, counted as writes). Computation happens on tiles.

All batch·heads run in lockstep: a tile holds the same block of every head, so one
numpy operation covers them all. M is the SRAM of one streaming multiprocessor,
which in the paper's model serves one head at a time, so occupancy is counted per
head while traffic is summed over every head.

In count-only mode tiles carry shapes and no data. Blocks of equal shape then move
identical traffic, so ``blocks`` visits one representative per shape class (the
full blocks, and the ragged last one) and weights its traffic by the class size.
The algorithm code is the same in both modes; tests hold the counts equal.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np


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


@dataclass(frozen=True)
class TensorTraffic:
    """HBM traffic of one tensor, summed over all batch·heads."""

    name: str
    reads: int  # elements
    writes: int  # elements
    itemsize: int  # bytes per element

    @property
    def read_bytes(self) -> int:
        return self.reads * self.itemsize

    @property
    def write_bytes(self) -> int:
        return self.writes * self.itemsize


@dataclass(frozen=True)
class Traffic:
    """Every tensor's HBM reads and writes, and the peak SRAM occupancy of one head."""

    tensors: tuple[TensorTraffic, ...]
    peak_sram: int  # elements resident at once, per head
    M: int

    @property
    def reads(self) -> int:
        return sum(t.reads for t in self.tensors)

    @property
    def writes(self) -> int:
        return sum(t.writes for t in self.tensors)

    @property
    def total(self) -> int:
        return self.reads + self.writes

    @property
    def total_bytes(self) -> int:
        return sum(t.read_bytes + t.write_bytes for t in self.tensors)

    def tensor(self, name: str) -> TensorTraffic:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(f"no tensor named {name!r}; tensors: {[t.name for t in self.tensors]}")

    def as_dict(self) -> dict:
        return {
            "reads": self.reads, "writes": self.writes, "total": self.total,
            "total_bytes": self.total_bytes, "peak_sram": self.peak_sram, "M": self.M,
            "tensors": [asdict(t) for t in self.tensors],
        }


class Tile:
    """An on-chip buffer: ``rows × cols`` elements per head; ``data`` is (bh, rows, cols) or None."""

    __slots__ = ("name", "rows", "cols", "data")

    def __init__(self, name: str, rows: int, cols: int, data: np.ndarray | None):
        self.name, self.rows, self.cols, self.data = name, rows, cols, data

    @property
    def size(self) -> int:
        return self.rows * self.cols


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
        self._reads: dict[str, int] = {}
        self._writes: dict[str, int] = {}
        self._resident: dict[int, Tile] = {}
        self._used = 0
        self._peak = 0
        self._weight = 1

    # --- HBM ---------------------------------------------------------------
    def add_tensor(self, name: str, rows: int, cols: int, itemsize: int, data: np.ndarray | None = None,
                   fill: float | None = None) -> None:
        """Place a (rows, cols)-per-head tensor in HBM without counting traffic.

        Inputs arrive in HBM before the algorithm starts; outputs are allocated
        there. ``data`` must be (bh, rows, cols); ``fill`` creates it instead. Writing
        initial values that the algorithm itself prescribes (Alg. 1 line 2) is the
        algorithm's job, through ``store``.
        """
        if name in self._shape:
            raise ValueError(f"tensor {name!r} is already in HBM")
        self._shape[name] = (rows, cols)
        self._itemsize[name] = itemsize
        self._reads[name] = 0
        self._writes[name] = 0
        if not self.numeric:
            self._hbm[name] = None
        elif data is not None:
            arr = np.asarray(data)
            arr = arr if arr.dtype == np.bool_ else arr.astype(np.float64)
            self._hbm[name] = arr.reshape(self.bh, rows, cols)
        else:
            self._hbm[name] = np.full((self.bh, rows, cols), np.nan if fill is None else fill)

    def has(self, name: str) -> bool:
        return name in self._shape

    def tensor(self, name: str) -> np.ndarray:
        """The HBM contents of a tensor after a numeric run (no traffic counted)."""
        data = self._hbm[name]
        if data is None:
            raise RuntimeError(f"tensor {name!r} carries no data in count-only mode")
        return data

    def load(self, name: str, rows: slice, cols: slice | None = None, *, tile: str | None = None) -> Tile:
        """Copy a block of an HBM tensor into a new SRAM tile, counting its reads."""
        cols = cols if cols is not None else slice(0, self._shape[name][1])
        r, c = rows.stop - rows.start, cols.stop - cols.start
        out = self.alloc(tile or name, r, c)
        self._reads[name] += r * c * self.bh * self._weight
        if self.numeric:
            out.data[...] = self._hbm[name][:, rows, cols]
        return out

    def store(self, src: Tile, name: str, rows: slice, cols: slice | None = None) -> None:
        """Write an SRAM tile back to a block of an HBM tensor, counting the writes."""
        cols = cols if cols is not None else slice(0, self._shape[name][1])
        r, c = rows.stop - rows.start, cols.stop - cols.start
        if (r, c) != (src.rows, src.cols):
            raise ValueError(f"tile {src.name} is {src.rows}x{src.cols}; block of {name} is {r}x{c}")
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

    # --- loops -------------------------------------------------------------
    def blocks(self, n: int, B: int, *, start: int = 0, stop: int | None = None,
               every: bool = False) -> Iterator[tuple[int, slice]]:
        """Blocks start … stop − 1 of range(n) split into T = ceil(n/B) blocks of B.

        Numeric mode yields every (index, slice). Count-only mode yields one full
        block and the ragged last one, with traffic weighted by their counts, unless
        ``every`` is set: an outer loop whose inner range depends on its index must
        visit each of its blocks in both modes.
        """
        T = -(-n // B)
        stop = T if stop is None else min(stop, T)
        if self.numeric or every:
            for t in range(start, stop):
                yield t, slice(t * B, min(n, (t + 1) * B))
            return
        full_stop = min(stop, n // B)  # blocks below n // B are full
        classes = [(start, slice(start * B, start * B + B), full_stop - start)] if full_stop > start else []
        if stop == T and n % B and T - 1 >= start:
            classes.append((T - 1, slice((T - 1) * B, n), 1))
        outer = self._weight
        try:
            for index, block, count in classes:
                self._weight = outer * count
                yield index, block
        finally:
            self._weight = outer

    # --- results -----------------------------------------------------------
    def traffic(self) -> Traffic:
        if self._resident:
            raise RuntimeError(f"buffers still resident in SRAM at the end of the run: {self.resident()}")
        tensors = tuple(
            TensorTraffic(n, self._reads[n], self._writes[n], self._itemsize[n]) for n in self._shape
        )
        return Traffic(tensors=tensors, peak_sram=self._peak, M=self.M)
