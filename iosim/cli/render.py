"""Numbers as a table shows them, and the one table style every command uses (rich is imported here, late)."""

from __future__ import annotations

_PREFIXES = ("", "k", "M", "G", "T", "P", "E")


def eng(x: float | None, prefixes: tuple[str, ...] = _PREFIXES) -> str:
    """x in at most 3 significant digits and a prefix (17.9G), never wider than 6 characters."""
    if x is None:
        return "—"
    if abs(x) < 1000:
        return str(int(x)) if x == int(x) else f"{x:.3g}"
    for e, prefix in enumerate(prefixes):
        text = f"{x / 1000**e:.3g}"  # rounding may carry into the next prefix: 999,960 is 1M, not 1e+03k
        if abs(float(text)) < 1000:
            return text + prefix
    return f"{x:.2e}"


def nbytes(x: float | None) -> str:
    return "—" if x is None else eng(x, ("", "K", "M", "G", "T", "P", "E", "Z", "Y")) + "B"


def seconds(t: float) -> str:
    """A time in the unit that keeps it between 1 and 1000 (41.7ms, 730µs); past 1000 s, in hours, days or years
    (1.39h, 200d, 83.3y)."""
    if t >= 1000:
        unit, scale = next((u, x) for u, x in (("y", 365.25 * 86400), ("d", 86400.0), ("h", 3600.0)) if t >= x)
        return f"{t / scale:.3g}{unit}"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if t >= scale:
            return f"{t / scale:.3g}{unit}"
    return f"{t / 1e-9:.3g}ns"


def count_text(n: int) -> str:
    """A sequence length in full up to six digits (65536), compactly beyond (1G)."""
    return str(n) if n < 10**6 else eng(n)


def print_table(console, table) -> None:
    """Print ``table`` at the console's width, or as wide as its cells that do not wrap need where that is wider: a
    narrow terminal then wraps the lines, where rich would cut each number short with "…"."""
    from rich.measure import Measurement

    wide = console.options.update_width(10**4)
    for column in table.columns:  # a column that does not wrap is as wide as its widest cell, or rich cuts it
        if column.no_wrap:
            cells = (column.header, *column.cells)
            column.min_width = max(Measurement.get(console, wide, cell).maximum for cell in cells)
    need = Measurement.get(console, wide, table).minimum
    if need <= console.width:
        console.print(table)
        return
    width = console.width
    console.width = need
    try:
        console.print(table)
    finally:
        console.width = width


def compact_table(columns: tuple[str, ...] = (), left: str = "algorithm", **options):
    """The compact table of sweep, optimize and bound: a rule under the header, no outer padding; ``columns``
    are added unwrapped, each right-aligned but ``left``."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, header_style="bold", collapse_padding=True, pad_edge=False, **options)
    for name in columns:
        table.add_column(name, justify="left" if name == left else "right", no_wrap=True)
    return table
