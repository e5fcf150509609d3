"""The `hyperplan` command: wires subcommands; holds no logic of its own."""

from __future__ import annotations

import inspect
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Optional

import typer

app = typer.Typer(
    name="hyperplan",
    help="Auto-parallel strategy search for large AI models on supernodes.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _hide_flag_types() -> None:
    """Help shows no `<bool>` after a flag (typer prints the type of every option, flags included): a flag takes
    no value, so there is nothing to show."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None or getattr(shown, "_flags_hidden", False):
        return

    def display_type_rich(self, ctx):  # type: ignore[no-untyped-def]
        return None if getattr(self, "is_flag", False) else shown(self, ctx)

    display_type_rich._flags_hidden = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_hide_flag_types()


def _version(value: bool) -> None:
    if value:
        try:
            typer.echo(f"hyperplan {version('hyperplan')}")
        except PackageNotFoundError:
            typer.echo("hyperplan (not installed)")
        raise typer.Exit()


@app.callback()
def _root(
    version_: Annotated[
        Optional[bool],
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show the traceback of an error instead of one line "
                                        "(for a bug report).")] = False,
) -> None:
    """Read a model (ONNX file or zoo name), cost it on a cluster, and plan its parallel strategy."""


def _register() -> None:
    # One module per command (group); each exposes `register(app)`.
    from cli import (calibrate_cmd, estimate_cmd, export_cmd, hardware_cmd, inspect_cmd, plan_cmd, validate_cmd,
                     whatif_cmd, zoo_cmd)

    inspect_cmd.register(app)
    zoo_cmd.register(app)
    hardware_cmd.register(app)
    estimate_cmd.register(app)
    plan_cmd.register(app)
    validate_cmd.register(app)
    export_cmd.register(app)
    whatif_cmd.register(app)
    calibrate_cmd.register(app)


_register()


def _unwrap(text: str) -> str:
    """A help text with each paragraph on one line (list items keep their own lines), so that rich wraps it
    to the terminal: typer keeps the docstring's own line breaks, which at 80 columns left ragged half-lines."""
    paragraphs = []
    for para in inspect.cleandoc(text).split("\n\n"):
        lines: list[str] = []
        for line in para.splitlines():
            if lines and not line.lstrip().startswith(("- ", "* ", "\b")):
                lines[-1] += " " + line.strip()
            else:
                lines.append(line)
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


def _unwrap_help(group: typer.Typer) -> None:
    """Every command's help (its own or its docstring), and its groups', unwrapped (`_unwrap`)."""
    for cmd in group.registered_commands:
        text = cmd.help or (cmd.callback.__doc__ if cmd.callback else None)
        if text:
            cmd.help = _unwrap(text)
    for sub in group.registered_groups:
        _unwrap_help(sub.typer_instance)


_unwrap_help(app)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:  # Ctrl-C outside a command (while parsing or importing)
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
