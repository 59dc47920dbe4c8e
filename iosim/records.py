"""Where records go: one writer for every command's ``--json`` and ``--csv``.

A record is a flat dict (a value that is a list or a dict goes into CSV as JSON text).
Records are written as they finish, so an interrupted run keeps its work; with
``resume`` the records already in the files are kept, and ``done`` holds their keys.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Hashable
from pathlib import Path

from iosim.errors import InputError


def check_output_path(what: str, path: str | None) -> Path | None:
    """A file path that records can be written to, or an InputError naming ``what``."""
    if path is None:
        return None
    if not path.strip():
        raise InputError(f"{what}={path!r} is an empty path; give a file name")
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{what}={path!r} is a directory; give a file name")
    if not p.parent.is_dir():
        raise InputError(f"{what}={path!r}: the directory {str(p.parent)!r} does not exist")
    return p


def check_distinct(paths: dict[str, Path | None]) -> None:
    """Refuse two options that name the same file."""
    seen: dict[Path, str] = {}
    for what, p in paths.items():
        if p is not None and p in seen:
            raise InputError(f"{seen[p]} and {what} name the same file {str(p)!r}; give each its own path")
        if p is not None:
            seen[p] = what


class RecordWriter:
    """Writes records to JSON and/or CSV as they come.

    The JSON file is rewritten atomically after each record and is always a valid list; the
    CSV file is appended to. With ``resume``, the records already in the files are kept
    and ``done`` holds ``key`` of each; a CSV to resume must have the ``required`` columns.
    """

    def __init__(self, json_path: str | None = None, csv_path: str | None = None, *, resume: bool = False,
                 key: Callable[[dict], Hashable] | None = None, required: tuple[str, ...] = ()):
        self.json_path = check_output_path("json", json_path)
        self.csv_path = check_output_path("csv", csv_path)
        check_distinct({"json": self.json_path, "csv": self.csv_path})
        self.records: list[dict] = _read_json(self.json_path) if resume and self.json_path else []
        old_csv = _read_csv(self.csv_path, required) if resume and self.csv_path else []
        self.done = {key(r) for r in self.records + old_csv} if key else set()
        self._csv_file = self._csv = None
        if self.csv_path:
            self._csv_file = self.csv_path.open("a" if old_csv else "w", newline="")
            if old_csv:  # append under the file's own header
                self._csv = csv.DictWriter(self._csv_file, fieldnames=list(old_csv[0]))

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def add(self, record: dict) -> None:
        self.records.append(record)
        if self._csv_file:
            if self._csv is None:
                self._csv = csv.DictWriter(self._csv_file, fieldnames=list(record))
                self._csv.writeheader()
            self._csv.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in record.items()})
            self._csv_file.flush()
        if self.json_path:
            _replace(self.json_path, json.dumps(self.records, indent=1))

    def close(self) -> None:
        if self._csv_file:
            self._csv_file.close()


def write_document(json_path: str | None, csv_path: str | None, document: dict, rows: list[dict]) -> None:
    """One JSON object, and its ``rows`` as CSV: what a single run saves."""
    json_file, csv_file = check_output_path("json", json_path), check_output_path("csv", csv_path)
    check_distinct({"json": json_file, "csv": csv_file})
    if json_file:
        _replace(json_file, json.dumps(document, indent=1) + "\n")
    if csv_file:
        with RecordWriter(csv_path=csv_path) as writer:
            for row in rows:
                writer.add(row)


def write_records(json_path: str | None, csv_path: str | None, records: list[dict]) -> None:
    """A finished list of records as a JSON list and CSV rows."""
    with RecordWriter(None, csv_path) as writer:
        for record in records:
            writer.add(record)
    if json_path:
        _replace(check_output_path("json", json_path), json.dumps(records, indent=1) + "\n")


def _replace(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically: a reader sees the old file or the new, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise OSError(f"cannot write records to {path}: {err.strerror or err}") from None


def _read_json(path: Path) -> list[dict]:
    if not path.exists():
        return []
    try:
        records = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise InputError(f"cannot resume from {str(path)!r}: not a JSON list of records ({err})") from None
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise InputError(f"cannot resume from {str(path)!r}: not a JSON list of records")
    return records


def _read_csv(path: Path, required: tuple[str, ...]) -> list[dict]:
    if not path.exists() or path.stat().st_size == 0:
        return []
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and set(required) - set(rows[0]):
        raise InputError(f"cannot resume from {str(path)!r}: its columns lack {sorted(set(required) - set(rows[0]))}")
    return rows
