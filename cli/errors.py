"""The CLI's error boundary: library errors become one red line and an exit code by kind.

Exit codes: 2 invalid input (a file, name or option), 3 infeasible (nothing fits), 4 solver timeout,
130 interrupted (Ctrl-C), 1 a hyperplan bug. No traceback reaches the user unless the global `--debug`
flag asks for it.
"""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

import typer
from rich.markup import escape

from cli.context import ClickException, debugging
from cli.render import LiveConsole
from cost_models.errors import SpecError
from planner.errors import HyperplanError

F = TypeVar("F", bound=Callable)

err_console = LiveConsole(stderr=True, highlight=False, soft_wrap=True)

INTERRUPTED = 130  # what a shell reports for a command stopped by SIGINT (128 + 2)


def fail(message: str, code: int) -> typer.Exit:
    """Print `error: message` on stderr; the exit to raise."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", markup=True)
    return typer.Exit(code)


def guarded(fn: F) -> F:
    """Run a command; turn the project's errors into `error: ...` on stderr and their exit code, Ctrl-C into
    `interrupted`, and anything else (a bug) into one line that says to rerun with --debug."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, ClickException):
            raise
        except (HyperplanError, SpecError) as exc:
            if debugging():
                raise
            raise fail(str(exc), getattr(exc, "exit_code", 2)) from None
        except KeyboardInterrupt:
            if debugging():
                raise
            err_console.print("interrupted")
            raise typer.Exit(INTERRUPTED) from None
        except Exception as exc:  # noqa: BLE001 - the boundary: a bug must still read as one line
            if debugging():
                raise
            first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
            raise fail(f"internal error ({type(exc).__name__}{': ' + first if first else ''}); this is a "
                       "hyperplan bug: please report it with the command, and rerun with --debug for the "
                       "traceback", 1) from None

    return wrapper  # type: ignore[return-value]
