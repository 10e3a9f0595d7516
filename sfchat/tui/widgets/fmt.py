"""Numbers as the panels show them."""
from __future__ import annotations

from rich.table import Table


def size(n: int | None) -> str:
    if not n:
        return "—"
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("kB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}" if n < 10 * scale else f"{n / scale:.0f} {unit}"
    return f"{n} B"


def ms(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f} ms" if x < 100 else f"{x:.0f} ms"


def pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.0f}%"


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def two_columns(rows: list[tuple[str, str]]) -> Table:
    """Names in bold on the left, what they mean on the right, wrapped to the screen (never cut)."""
    t = Table(box=None, show_header=False, padding=(0, 2, 0, 0), expand=True)
    t.add_column(style="bold", no_wrap=True)
    t.add_column(ratio=1)
    for row in rows:
        t.add_row(*row)
    return t
