"""What the running command was asked beyond its own options: the root's `--debug`, and the terminal width
a caller set (click's `terminal_width`, as a test runner sets it).

typer from 0.2x carries its own copy of click (`typer._click`); older ones use click itself. The command's
context lives in whichever one typer runs on, so it is looked up there and nowhere else.
"""

from __future__ import annotations

from typing import Any

try:  # typer with its own click
    from typer._click.exceptions import ClickException
    from typer._click.globals import get_current_context
except ImportError:  # typer on click
    from click import ClickException, get_current_context

__all__ = ["ClickException", "debugging", "terminal_width"]


def _context() -> Any:
    return get_current_context(silent=True)


def debugging() -> bool:
    """Whether the root command was given `--debug` (a traceback wanted instead of one line)."""
    ctx = _context()
    return bool(ctx is not None and ctx.find_root().params.get("debug"))


def terminal_width() -> int | None:
    """The width the caller set for this run (None: the console finds it: $COLUMNS, the terminal, or 80)."""
    ctx = _context()
    return getattr(ctx, "terminal_width", None) if ctx is not None else None
