"""Count-only sweeps over (algorithm, N, d), with measured and predicted traffic side by side."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from pathlib import Path

from iosim.api import count, predict
from iosim.errors import BlockSizeError
from iosim.tiling import Tiling

DEFAULT_N = tuple(2**e for e in range(8, 17))  # 256 ... 65536
DEFAULT_D = (64, 128)


@dataclass(frozen=True)
class SweepRow:
    algorithm: str
    N: int
    d: int
    M: int
    batch: int
    heads: int
    dtype: str
    tiling: Tiling | None
    reads: int | None  # elements, all batch·heads
    writes: int | None
    total: int | None
    total_bytes: int | None
    predicted: int | None  # exact closed form, elements
    paper: float  # the paper's or seed's asymptotic form, elements
    paper_label: str
    ratio: float | None  # measured / predicted
    peak_sram: int | None  # elements per head
    status: str  # "ok", or why the configuration does not run

    @property
    def peak_fraction(self) -> float | None:
        return None if self.peak_sram is None else self.peak_sram / self.M

    @staticmethod
    def columns() -> list[str]:
        """The keys of ``record``: the row's fields, with the tiling's fields in place of the tiling."""
        own = [f.name for f in fields(SweepRow)]
        at = own.index("tiling")
        return own[:at] + [f.name for f in fields(Tiling)] + own[at + 1:] + ["peak_fraction"]

    def record(self) -> dict:
        """The row as one flat JSON/CSV record."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update({f.name: getattr(self.tiling, f.name, None) for f in fields(Tiling)})
        values["peak_fraction"] = self.peak_fraction
        return {key: values[key] for key in self.columns()}


def sweep_row(algorithm: str, N: int, d: int, M, *, batch=1, heads=1, causal=False, dtype="float16",
              block_policy="fit") -> SweepRow:
    """Count one configuration and predict it; a block policy that overflows M gives a row that says so."""
    options = dict(N=N, d=d, M=M, batch=batch, heads=heads, causal=causal, dtype=dtype, block_policy=block_policy)
    try:
        measured, pred = count(algorithm, **options), predict(algorithm, **options)
    except BlockSizeError as err:
        if block_policy == "fit":
            raise
        fit = predict(algorithm, **{**options, "block_policy": "fit"})  # for M in elements and the paper's form
        return SweepRow(algorithm, N, d, fit.M, batch, heads, dtype, None, None, None, None, None, None,
                        fit.paper, fit.paper_label, None, None, f"does not fit: {err}")
    t = measured.traffic
    return SweepRow(
        algorithm, N, d, measured.M, batch, heads, dtype, measured.tiling, t.reads, t.writes, t.total,
        t.total_bytes, pred.exact.total, pred.paper, pred.paper_label, t.total / pred.exact.total, t.peak_sram, "ok",
    )


class RecordWriter:
    """Writes rows to JSON and/or CSV as they finish, so an interrupted sweep keeps its work.

    The JSON file is rewritten atomically after each row and is always a valid list.
    """

    def __init__(self, json_path: str | None = None, csv_path: str | None = None):
        self.json_path = Path(json_path) if json_path else None
        self.csv_path = Path(csv_path) if csv_path else None
        self.records: list[dict] = []
        self._csv_file = None
        self._csv = None
        if self.csv_path:
            self._csv_file = self.csv_path.open("w", newline="")
            self._csv = csv.DictWriter(self._csv_file, fieldnames=SweepRow.columns())
            self._csv.writeheader()

    def add(self, row: SweepRow) -> None:
        record = row.record()
        self.records.append(record)
        if self._csv:
            self._csv.writerow(record)
            self._csv_file.flush()
        if self.json_path:
            tmp = self.json_path.with_name(self.json_path.name + ".tmp")
            tmp.write_text(json.dumps(self.records, indent=1))
            os.replace(tmp, self.json_path)

    def close(self) -> None:
        if self._csv_file:
            self._csv_file.close()


def run_sweep(algorithms: Iterable[str], Ns: Iterable[int], ds: Iterable[int], M, *, batch=1, heads=1,
              causal=False, dtype="float16", block_policy="fit", writer: RecordWriter | None = None,
              on_row: Callable[[SweepRow], None] | None = None) -> list[SweepRow]:
    """Count every (algorithm, N, d); rows are handed to ``writer`` and ``on_row`` as they finish."""
    rows = []
    for algorithm in algorithms:
        for d in ds:
            for N in Ns:
                row = sweep_row(algorithm, N, d, M, batch=batch, heads=heads, causal=causal, dtype=dtype,
                                block_policy=block_policy)
                rows.append(row)
                if writer:
                    writer.add(row)
                if on_row:
                    on_row(row)
    return rows


@dataclass(frozen=True)
class Ratio:
    d: int
    N: int
    ratio: float  # numerator traffic / denominator traffic


def traffic_ratios(rows: list[SweepRow], numerator: str, denominator: str) -> list[Ratio]:
    """Traffic of one algorithm over another's at each (N, d) where both ran."""
    by_key = {(r.algorithm, r.N, r.d): r for r in rows if r.total is not None}
    out = []
    for (algo, N, d), r in sorted(by_key.items(), key=lambda kv: (kv[0][2], kv[0][1])):
        other = by_key.get((denominator, N, d))
        if algo == numerator and other is not None:
            out.append(Ratio(d, N, r.total / other.total))
    return out
