"""The CLI's error boundary: library errors become one red line and an exit code."""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from cost_models.errors import SpecError
from planner.errors import HyperplanError

F = TypeVar("F", bound=Callable)

err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def guarded(fn: F) -> F:
    """Run a command; turn the project's errors into `error: ...` on stderr and a non-zero exit."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (HyperplanError, SpecError) as exc:
            err_console.print(f"[bold red]error:[/] {escape(str(exc))}", markup=True)
            raise typer.Exit(getattr(exc, "exit_code", 2)) from None

    return wrapper  # type: ignore[return-value]
