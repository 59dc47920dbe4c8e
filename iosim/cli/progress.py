"""The one progress bar: a transient bar that a command's callback advances."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def progress_bar(console, label: str, total: int) -> Iterator[Callable[[object], None]]:
    """A bar of ``total`` steps shown while the block runs; yields a callback that takes a step per call."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task(label, total=total)
        yield lambda _: progress.advance(task)
