"""Shared rendering helpers: human-readable numbers and rich tables (no knowledge of any command)."""

from __future__ import annotations

import math
import sys
from contextlib import contextmanager
from typing import Iterable, Iterator, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

_SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_COUNT = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K"))
_BINARY = ((2**50, "Pi"), (2**40, "Ti"), (2**30, "Gi"), (2**20, "Mi"), (2**10, "Ki"))


def _scaled(value: float, table: Sequence[tuple[float, str]], unit: str, digits: int = 3) -> str:
    if not math.isfinite(value):
        return str(value)
    for scale, prefix in table:
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g} {prefix}{unit}".rstrip()
    return f"{value:.{digits}g} {unit}".rstrip() if value != int(value) else f"{int(value)} {unit}".rstrip()


def count(n: float) -> str:
    """A parameter or element count: 26784 -> '26.8 K', 7.24e9 -> '7.24 B'."""
    return _scaled(float(n), _COUNT, "")


def flops(x: float) -> str:
    """FLOPs with an SI prefix: 1.3e12 -> '1.3 TFLOP'."""
    return _scaled(float(x), _SI, "FLOP")


def nbytes(x: float) -> str:
    """Bytes in binary units: 3 * 2**30 -> '3 GiB'."""
    return _scaled(float(x), _BINARY, "B")


def seconds(x: float) -> str:
    """A duration in the unit that fits it: 8.4e-7 -> '840 ns', 0.0123 -> '12.3 ms', 95 -> '1.58 min'."""
    if not math.isfinite(x):
        return str(x)
    for limit, scale, unit in ((1e-6, 1e-9, "ns"), (1e-3, 1e-6, "us"), (1.0, 1e-3, "ms"), (60.0, 1.0, "s"),
                               (3600.0, 60.0, "min")):
        if abs(x) < limit:
            return f"{x / scale:.3g} {unit}"
    return f"{x / 3600.0:.3g} h"


def percent(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[object]], *,
          right: Sequence[str] = ()) -> Table:
    """A plain table; `right` names the columns of numbers (right-aligned). Cells are escaped."""
    t = Table(title=escape(title), title_justify="left", show_edge=False, pad_edge=False, header_style="bold")
    for c in columns:
        t.add_column(escape(c), justify="right" if c in right else "left", overflow="fold")
    for row in rows:
        t.add_row(*(escape(str(cell)) for cell in row))
    return t


def kv_table(title: str, pairs: Iterable[tuple[str, object]]) -> Table:
    """Two columns, name and value, without a header."""
    t = Table(title=escape(title), title_justify="left", show_header=False, show_edge=False, pad_edge=False)
    t.add_column(style="bold")
    t.add_column(overflow="fold")
    for k, v in pairs:
        t.add_row(escape(k), escape(str(v)))
    return t


@contextmanager
def progress(message: str) -> Iterator[None]:
    """A spinner on stderr while slow work runs, only when stderr is a terminal."""
    if not sys.stderr.isatty():
        yield
        return
    with Console(stderr=True).status(escape(message)):
        yield
