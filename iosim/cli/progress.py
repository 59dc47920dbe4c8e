"""Progress bars: a transient bar that a command's callback advances, and one that shows only on long work."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def progress_bar(console, label: str, total: int) -> Iterator[Callable[[object], None]]:
    """A bar of ``total`` steps shown while the block runs, with the time spent and the time left at the rate so
    far; yields a callback that takes a step per call.

    Only on a terminal: piped or captured output gets the command's output alone.
    """
    if not console.is_terminal:
        yield lambda _: None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("left"),
                  TimeRemainingColumn(), console=console, transient=True) as progress:
        task = progress.add_task(label, total=total)
        yield lambda _: progress.advance(task)


class PatientBar:
    """A bar for work of known total that appears only once the work has run ``after`` seconds.

    When it appears it estimates the whole from the rate so far and, above ``warn_over``
    seconds, says so first in one line with ``hint`` (a faster way to the answer). Call it
    with (done, total); use it as a context manager so the bar goes when the work ends.
    """

    def __init__(self, console, label: str, hint: str, after: float = 1.0, warn_over: float = 60.0):
        self.console, self.label, self.hint, self.after, self.warn_over = console, label, hint, after, warn_over
        self.first: tuple[float, int] | None = None  # (time, done) of the first report: setup is not work
        self.progress = self.task = None
        self.shown = False

    def __call__(self, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=done)
            return
        now = time.monotonic()
        if self.first is None:
            self.first = now, done
            return
        elapsed, worked = now - self.first[0], done - self.first[1]
        if self.shown or elapsed < self.after or worked <= 0:
            return
        self.shown = True
        estimate = elapsed * (total - self.first[1]) / worked
        if estimate > self.warn_over:
            self.console.print(f"this {self.label} will take about {duration(estimate)} (from the rate of its first "
                               f"{elapsed:.0f} s); {self.hint}")
        if self.console.is_terminal:
            from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

            self.progress = Progress(TextColumn(self.label), BarColumn(), TaskProgressColumn(), TimeRemainingColumn(),
                                     console=self.console, transient=True)
            self.progress.start()
            self.task = self.progress.add_task(self.label, total=total, completed=done)

    def __enter__(self) -> PatientBar:
        return self

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.stop()


def duration(seconds: float) -> str:
    """A duration in the largest unit that keeps it readable: 45 s, 12 min, 3.5 h, 2.1 days."""
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:.2g} {unit}" if seconds < 10 * size else f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"
