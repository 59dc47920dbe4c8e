"""Counts of memory traffic: one type for what the simulator measures and what the closed forms predict.

Counts are keyed by tensor, so ``measured == predicted`` is a plain
equality of two ``Counts``: every tensor's reads and writes (elements, summed over
batch·heads), its element size, and the peak SRAM occupancy of one head.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorCounts:
    """Reads and writes of one HBM tensor, summed over all batch·heads."""

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


class PerTensor:
    """Counts kept per tensor (``tensors``, each with a ``name``), with their totals over tensors."""

    tensors: tuple

    @property
    def reads(self) -> int:
        return sum(t.reads for t in self.tensors)

    @property
    def writes(self) -> int:
        return sum(t.writes for t in self.tensors)

    def tensor(self, name: str):
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(f"no tensor {name!r}; tensors: {[t.name for t in self.tensors]}")


@dataclass(frozen=True)
class Counts(PerTensor):
    """Every tensor's traffic, in the order the algorithm declares its tensors, and the peak SRAM of one head."""

    tensors: tuple[TensorCounts, ...]
    peak_sram: int  # elements resident at once, per head

    @property
    def total(self) -> int:
        return self.reads + self.writes

    @property
    def read_bytes(self) -> int:
        return sum(t.read_bytes for t in self.tensors)

    @property
    def write_bytes(self) -> int:
        return sum(t.write_bytes for t in self.tensors)

    @property
    def total_bytes(self) -> int:
        return self.read_bytes + self.write_bytes

    def as_dict(self) -> dict:
        """Totals, peak and every tensor's reads, writes and bytes, as saved in records."""
        return {
            "reads": self.reads, "writes": self.writes, "total": self.total, "read_bytes": self.read_bytes,
            "write_bytes": self.write_bytes, "total_bytes": self.total_bytes, "peak_sram": self.peak_sram,
            "tensors": [{"name": t.name, "reads": t.reads, "writes": t.writes, "itemsize": t.itemsize,
                         "read_bytes": t.read_bytes, "write_bytes": t.write_bytes} for t in self.tensors],
        }


def combined(*passes: Counts) -> Counts:
    """The traffic of several passes run one after another (a forward and a backward pass).

    A tensor's reads and writes are summed over the passes that move it, in the order
    the tensors first appear; the peak is the largest pass's, since each pass frees its
    SRAM before the next starts.
    """
    merged: dict[str, TensorCounts] = {}
    for counts in passes:
        for t in counts.tensors:
            key = t.name
            if key in merged and merged[key].itemsize != t.itemsize:
                raise ValueError(f"tensor {t.name} has {merged[key].itemsize} bytes per element in one pass and "
                                 f"{t.itemsize} in another")
            old = merged.get(key, TensorCounts(t.name, 0, 0, t.itemsize))
            merged[key] = TensorCounts(t.name, old.reads + t.reads, old.writes + t.writes, t.itemsize)
    return Counts(tuple(merged.values()), max(c.peak_sram for c in passes))
