"""Shared rendering helpers: human-readable numbers and rich tables (no knowledge of any command).

Numbers carry the unit that fits them (840 ns, 12.3 ms, 1.58 min; 512 MiB, 14.9 TiB) and never an
exponent. Tables are measured at print time: one that cannot show every column without breaking a word
at the console's width (80 in a pipe or a CI log) prints as one block of `name  value` lines per row.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Sequence

from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from cli.context import terminal_width
from planner.units import GIB, count, flops, gib, nbytes, seconds, sig  # noqa: F401 - the CLI's number formats

PROSE_WIDTH = 20  # the narrowest a column of free text gets before a table prints as blocks


class LiveConsole:
    """A rich Console made when it is used, so that its width is the one asked for at print time, not at
    import: the running command's terminal width when one was set (click's `terminal_width`, as a test runner
    sets it), else $COLUMNS, else the terminal's, else 80 (a pipe, a CI log)."""

    def __init__(self, **options: Any) -> None:
        self._options = options

    def now(self) -> Console:
        """A Console for one use (a Progress bar or a status spinner holds on to it)."""
        options = dict(self._options)
        width = terminal_width()
        if width and "width" not in options:
            options["width"] = width
        return Console(**options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.now(), name)


def percent(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def _cell(value: object) -> Text | str:
    return value if isinstance(value, Text) else escape(str(value))


class Adaptive:
    """A table when its columns fit the console without breaking a word, else one `name  value` block per row
    (each row then reads in full at any width)."""

    def __init__(self, title: str, columns: Sequence[str], rows: Iterable[Sequence[object]],
                 right: Sequence[str] = (), header: bool = True, prose: Sequence[str] = ()) -> None:
        self.title, self.columns, self.right, self.header = title, list(columns), tuple(right), header
        self.prose = tuple(prose)
        self.rows = [list(r) for r in rows]

    def table(self) -> Table:
        t = Table(title=escape(self.title) if self.title else None, title_justify="left", show_edge=False,
                  pad_edge=False, header_style="bold", show_header=self.header,
                  **({} if self.header else {"box": None}))
        for i, c in enumerate(self.columns):
            t.add_column(escape(c), justify="right" if c in self.right else "left", overflow="fold",
                         style="bold" if i == 0 and not self.header else None)
        for row in self.rows:
            t.add_row(*(_cell(c) for c in row))
        return t

    def vertical(self, width: int = 80) -> Table:
        """Every row as a block of `column  value` lines, rows apart by a blank line; a long column name wraps
        in the first third of the width."""
        g = Table.grid(padding=(0, 2))
        g.add_column(style="bold", max_width=max(12, width // 3))
        g.add_column(overflow="fold")
        for i, row in enumerate(self.rows):
            if i:
                g.add_row("", "")
            for name, value in zip(self.columns, row):
                g.add_row(escape(name) if self.header or name else "", _cell(value))
        return g

    def _widths(self, console: Console, options: ConsoleOptions) -> list[int] | None:
        """Content widths that show every column without breaking a word (None: the natural widths fit; [] when
        no widths do: then the rows print vertically)."""
        cells = [[Text(c)] + [r[i] if isinstance(r[i], Text) else Text.from_markup(_cell(r[i])) for r in self.rows
                              if i < len(r)] for i, c in enumerate(self.columns)]
        sizes = [[Measurement.get(console, options, x) for x in col] for col in cells]
        lo = [max(m.minimum for m in col) for col in sizes]
        lo = [min(m, PROSE_WIDTH) if c in self.prose else m for m, c in zip(lo, self.columns)]
        hi = [max(m.maximum for m in col) for col in sizes]
        n = len(self.columns)
        room = options.max_width - (n - 1) - 2 * (n - 1)  # a rule and a space either side between columns
        if sum(hi) <= room:
            return None
        if sum(lo) > room:
            return []
        # water-filling: the spare goes in equal shares, a column taking no more than its natural width, so a
        # short column (a label) is shown whole and the long ones share what is left
        spare, widths = room - sum(lo), list(lo)
        order = sorted(range(n), key=lambda i: (hi[i] - lo[i], i))
        for k, i in enumerate(order):
            give = min(hi[i] - lo[i], spare // (n - k))
            widths[i] += give
            spare -= give
        for i in reversed(order):  # what integer division left, to the widest
            if spare <= 0:
                break
            extra = min(spare, hi[i] - widths[i])
            widths[i] += extra
            spare -= extra
        return widths

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        widths = self._widths(console, options)
        if widths == []:
            if self.title:
                yield Text(self.title)
            yield self.vertical(options.max_width)
            return
        t = self.table()
        for col, w in zip(t.columns, widths or ()):
            col.width = w
        yield t

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.table())


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[object]], *,
          right: Sequence[str] = (), prose: Sequence[str] = ()) -> Adaptive:
    """A plain table; `right` names the columns of numbers (right-aligned), `prose` the columns of free text
    (sources, reasons), which may break a word longer than PROSE_WIDTH (a URL) rather than turn the table into
    blocks. Cells are escaped (a rich Text cell is kept as it is)."""
    return Adaptive(title, columns, rows, right, prose=prose)


def kv_table(title: str, pairs: Iterable[tuple[str, object]]) -> Adaptive:
    """Two columns, name and value, without a header."""
    return Adaptive(title, ["", ""], ([k, v] for k, v in pairs), header=False)


@contextmanager
def progress(message: str) -> Iterator[None]:
    """A spinner on stderr while slow work runs, only when stderr is a terminal."""
    if not sys.stderr.isatty():
        yield
        return
    with Console(stderr=True).status(escape(message)):
        yield


def launch_line(configs: dict[str, str]) -> str:
    """One sentence on a training plan's launch configs (`backends.launch_configs`): which backends write it, and
    what the others cannot express (backends that refuse it alike named together)."""
    writes = [b for b, why in configs.items() if not why]
    alike: dict[str, list[str]] = {}
    for b, why in configs.items():
        if why:
            alike.setdefault(why, []).append(b)
    if not alike:
        return f"launch configs: {', '.join(writes)} write this plan"
    parts = ([f"{', '.join(writes)} write{'s' if len(writes) == 1 else ''} this plan"] if writes else []) + [
        f"{', '.join(bs)} cannot express its {why}" for why, bs in alike.items()]
    return f"launch configs: {'; '.join(parts)} (plan with --backend B for a plan B writes)"
