"""Where records go: one writer for every command's ``--json`` and ``--csv``.

A record is a flat dict (a value that is a list or a dict goes into CSV as JSON text).
Records are journaled as they finish, so an interrupted run keeps its work, and each
output is replaced whole, atomically, when its content is ready.
"""

from __future__ import annotations

import csv
import io
import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from pathlib import Path

from iosim.core.errors import InputError


def check_output_path(what: str, path: str | None) -> Path | None:
    """A path that records can be written to, or an InputError naming ``what``.

    A regular file (or a new one) is replaced atomically; through a symbolic link, the link's target is, and the link
    is kept. A character device or a FIFO (``/dev/stdout``, ``/dev/null``, a pipe) is written through, never
    replaced. Anything else is refused here, before any work."""
    if path is None:
        return None
    if not path.strip():
        raise InputError(f"{what}={path!r} is an empty path; give a file name")
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{what}={path!r} is a directory; give a file name")
    if not p.parent.is_dir():
        raise InputError(f"{what}={path!r}: the directory {str(p.parent)!r} does not exist")
    if p.exists() and not (is_stream(p) or p.is_file()):
        raise InputError(f"{what}={path!r} is {_kind(p)}, not a regular file, a character device or a FIFO; "
                         f"give a file name")
    if not is_stream(p):  # a file made and removed: what permissions alone miss (root, /sys, /proc)
        # beside the target, which is replaced, and beside the path itself, where a journal goes (a link's folder)
        for folder in dict.fromkeys((Path(os.path.realpath(p)).parent, p.parent)):
            try:
                handle, probe = tempfile.mkstemp(dir=folder, prefix=".iosim-")
            except OSError as err:
                raise InputError(f"{what}={path!r}: cannot create a file in {str(folder)!r} "
                                 f"({err.strerror or err})") from None
            os.close(handle)
            os.unlink(probe)
    return p


def is_stdout(path: str | None) -> bool:
    """Whether ``path`` is this process's standard output (``/dev/stdout``, ``/dev/fd/1``, or the file or pipe it is
    redirected to)."""
    if not path:
        return False
    try:
        found, out = os.stat(path), os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no such file yet, or a stdout without a descriptor (captured)
        return False
    return (found.st_dev, found.st_ino) == (out.st_dev, out.st_ino)


def is_stream(path: Path) -> bool:
    """A character device or a FIFO (following links): written through, never replaced."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def _kind(path: Path) -> str:
    mode = path.stat().st_mode
    return "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a file"


def check_distinct(paths: dict[str, Path | None]) -> None:
    """Refuse two options that name the same file."""
    seen: dict[Path, str] = {}
    for what, p in paths.items():
        if p is None:
            continue
        if p.resolve() in seen:
            raise InputError(f"{seen[p.resolve()]} and {what} name the same file {str(p)!r}; give each its own path")
        seen[p.resolve()] = what


class RecordWriter:
    """Writes records to JSON and/or CSV, in time linear in their number, losing none on an interrupt.

    Each record is appended to a journal beside the first output (``<path>.partial``, one
    JSON object a line) as it comes. ``close`` writes every output whole (the records kept
    from the files and the new ones) to a temporary file and moves it into place, so an
    output is replaced only when its content is ready, and then removes the journal. A run
    that fails before its first record leaves the files as they were; one interrupted
    after it keeps what finished; one killed leaves the journal, which ``resume`` reads.

    With ``resume``, the records already in the outputs (and in a journal left behind)
    are kept and ``done`` maps ``key`` of each to it; every output gets all of them. A file whose records lack a
    field of ``required`` (those that identify the command's records) is refused by name, before any work. A record
    ``current`` refuses (one an earlier release made, whose values this one would not give) is not in ``done``, so
    that its configuration is counted again where the run meets it, and replaced by the new record; one the run does
    not meet stays as it was. ``recounted`` and ``left_stale`` say how many of each there were.
    """

    def __init__(self, json_path: str | None = None, csv_path: str | None = None, *, resume: bool = False,
                 key: Callable[[dict], Hashable] | None = None, required: tuple[str, ...] = (),
                 current: Callable[[dict], bool] = lambda record: True):
        self.outputs = {"json": check_output_path("json", json_path), "csv": check_output_path("csv", csv_path)}
        check_distinct(self.outputs)
        files = [p for p in self.outputs.values() if p is not None and not is_stream(p)]
        self.journal = files[0].with_name(files[0].name + ".partial") if files else None  # none beside a stream
        if resume and key is None:
            raise ValueError("resume needs the key that tells records apart")
        for what, p in self.outputs.items():
            if resume and p is not None and is_stream(p):
                raise InputError(f"--resume reads the records already in {what}={str(p)!r}, which is a character "
                                 f"device or a FIFO; resume into a regular file")
        self.resume = resume
        self.key = key
        self.done: dict[Hashable, dict] = {}
        found = _read_all(self.outputs, self.journal, required) if resume else []
        for record in found:
            if current(record):
                self.done.setdefault(key(record), record)  # a record in the JSON and the CSV is kept once
        self.stale: dict[Hashable, dict] = {}  # of another revision, and held by no current record
        for record in found:
            if not current(record) and key(record) not in self.done:
                self.stale.setdefault(key(record), record)
        self.kept: list[dict] = list(self.done.values())
        self.new: list[dict] = []
        self._new_keys: set[Hashable] = set()
        self._journal_file = None

    @property
    def recounted(self) -> int:
        """Records of another revision that new records replace."""
        return len(self.stale.keys() & self._new_keys)

    @property
    def left_stale(self) -> int:
        """Records of another revision whose configurations this run did not count: kept as they were."""
        return len(self.stale.keys() - self._new_keys)

    @property
    def records(self) -> list[dict]:
        """Every record the outputs will hold: those kept, those of another revision no new record replaces, then
        the new ones."""
        return self.kept + [r for k, r in self.stale.items() if k not in self._new_keys] + self.new

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None or self.new:
            self.close()
        else:  # failed or interrupted before a record finished: leave every file as it was
            self._close_journal()

    def add(self, record: dict) -> None:
        self.new.append(record)
        if self.key is not None:
            self._new_keys.add(self.key(record))
        if self.journal is None:
            return
        if self._journal_file is None:
            self._journal_file = self.journal.open("w" if not self.resume else "a")
        self._journal_file.write(json.dumps(record) + "\n")
        self._journal_file.flush()

    def close(self) -> None:
        """Write every output whole, atomically, then drop the journal."""
        self._close_journal()
        records = self.records
        try:
            if self.outputs["json"]:
                _replace(self.outputs["json"], json.dumps(records, indent=1) + "\n", "json")
            if self.outputs["csv"]:
                _replace(self.outputs["csv"], _csv_text(records), "csv")
        except OSError as err:
            if self.new and self.journal is not None and self.journal.exists():
                raise OSError(f"{err}; the {len(self.new)} records finished are kept in {self.journal}, which "
                              f"--resume reads") from None
            raise
        if self.journal is not None:
            self.journal.unlink(missing_ok=True)

    def _close_journal(self) -> None:
        if self._journal_file is not None:
            self._journal_file.close()
            self._journal_file = None


def write_document(json_path: str | None, csv_path: str | None, document: dict, rows: list[dict]) -> None:
    """One JSON object, and its ``rows`` as CSV: what a single run saves."""
    outputs = {"json": check_output_path("json", json_path), "csv": check_output_path("csv", csv_path)}
    check_distinct(outputs)
    if outputs["json"]:
        _replace(outputs["json"], json.dumps(document, indent=1) + "\n", "json")
    if outputs["csv"]:
        _replace(outputs["csv"], _csv_text(rows), "csv")


def write_records(json_path: str | None, csv_path: str | None, records: list[dict]) -> None:
    """A finished list of records as a JSON list and CSV rows."""
    with RecordWriter(json_path, csv_path) as writer:
        for record in records:
            writer.add(record)


@contextmanager
def writing(what: str, path) -> Iterator[None]:
    """Name ``what`` is written, and where, in the error of a write that fails (a full disk, a device that refuses)."""
    try:
        yield
    except OSError as err:
        raise OSError(f"cannot write {what} to {path}: {err.strerror or err}") from None


def _csv_text(records: list[dict]) -> str:
    """Records as CSV: the union of their keys, in order of first appearance; a list or dict as JSON text."""
    columns = list(dict.fromkeys(k for r in records for k in r))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns)
    writer.writeheader()
    for r in records:
        writer.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in r.items()})
    return out.getvalue() if records else ""


def _replace(path: Path, text: str, what: str) -> None:
    """Write ``text`` to ``path``, the option ``what``'s: a regular file atomically (a reader sees the old file or
    the new, never half of one), through a symbolic link to its target (the link stays), to a character device or
    FIFO as a stream."""
    with writing(f"the --{what} records", path):
        if is_stream(path):
            with path.open("w") as stream:
                stream.write(text)
            return
        target = Path(os.path.realpath(path))
        tmp = target.with_name(target.name + ".tmp")
        try:
            tmp.write_text(text)
            os.replace(tmp, target)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise


def _read_all(outputs: dict[str, Path | None], journal: Path | None, required: tuple[str, ...] = ()) -> list[dict]:
    """The records a resumed run keeps: the JSON file's, a journal's left by a killed run, then the CSV's; each
    source's records must hold every field of ``required``."""
    sources = [(outputs["json"], _read_json), (journal, _read_journal), (outputs["csv"], _read_csv)]
    records = []
    for path, read in sources:
        if path is None:
            continue
        found = read(path)
        missing = sorted({k for record in found for k in required if k not in record})
        if missing:
            raise InputError(f"cannot resume from {str(path)!r}: its records lack {missing}, which identify the "
                             f"records this command writes; resume from a file it wrote, or write to a new one")
        records += found
    return records


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


def _read_journal(path: Path) -> list[dict]:
    """Every whole line of a journal; a last line cut off by a kill is dropped."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _read_csv(path: Path) -> list[dict]:
    """A CSV's rows with the types CSV loses restored: empty is None, True/False bools, numbers and JSON parsed."""
    if not path.exists() or path.stat().st_size == 0:
        return []
    with path.open(newline="") as f:
        return [{k: _from_csv(v) for k, v in row.items() if k is not None} for row in csv.DictReader(f)]


def _from_csv(text: str | None):
    if text is None or text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
