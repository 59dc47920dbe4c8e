"""Counts of memory traffic: one type for what the simulator measures and what the closed forms predict.

Counts are keyed by memory level and tensor, so ``measured == predicted`` is a plain
equality of two ``Counts``: every tensor's reads and writes (elements, summed over
batch·heads), its element size, and the peak SRAM occupancy of one head.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class TensorCounts:
    """Reads and writes of one tensor at one memory level, summed over all batch·heads."""

    name: str
    reads: int  # elements
    writes: int  # elements
    itemsize: int  # bytes per element
    level: str = "HBM"

    @property
    def read_bytes(self) -> int:
        return self.reads * self.itemsize

    @property
    def write_bytes(self) -> int:
        return self.writes * self.itemsize


@dataclass(frozen=True)
class Counts:
    """Every tensor's traffic, in the order the algorithm declares its tensors, and the peak SRAM of one head."""

    tensors: tuple[TensorCounts, ...]
    peak_sram: int  # elements resident at once, per head

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
    def read_bytes(self) -> int:
        return sum(t.read_bytes for t in self.tensors)

    @property
    def write_bytes(self) -> int:
        return sum(t.write_bytes for t in self.tensors)

    @property
    def total_bytes(self) -> int:
        return self.read_bytes + self.write_bytes

    def tensor(self, name: str, level: str = "HBM") -> TensorCounts:
        for t in self.tensors:
            if t.name == name and t.level == level:
                return t
        raise KeyError(f"no tensor {name!r} at level {level}; tensors: {[t.name for t in self.tensors]}")

    def as_dict(self) -> dict:
        """Totals, peak and every tensor's reads, writes and bytes, as saved in records."""
        return {
            "reads": self.reads, "writes": self.writes, "total": self.total, "read_bytes": self.read_bytes,
            "write_bytes": self.write_bytes, "total_bytes": self.total_bytes, "peak_sram": self.peak_sram,
            "tensors": [{**asdict(t), "read_bytes": t.read_bytes, "write_bytes": t.write_bytes} for t in self.tensors],
        }
