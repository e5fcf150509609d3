"""`hyperplan validate FILE`: check a HyperShard declaration and re-estimate it; a table of checks, or JSON."""

from __future__ import annotations

import json
import os
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from cli import options as opt
from cli import render
from cli.errors import guarded
from cli.estimate_cmd import print_result
from planner.hypershard.io import read_document
from planner.hypershard.validate import validate_document

console = render.LiveConsole(highlight=False, soft_wrap=False)


def register(app: typer.Typer) -> None:
    app.command("validate")(validate_cmd)


@guarded
def validate_cmd(
    file: Annotated[str, typer.Argument(help="A HyperShard declaration (.yaml, .yml or .json).", show_default=False)],
    as_json: opt.Json = False,
) -> None:
    """Check a declaration against the schema, its model's tensors, the cluster's size and memory, and re-estimate it.

    The re-estimate must equal the estimate the file records (what `hyperplan plan` printed). Exits 2 when a
    check fails. A serving declaration (plan --mode infer -o) re-scores prefill and decode as declared.

    Example: hyperplan validate plan.yaml
    """
    doc = read_document(file)
    with render.progress(f"validating {file} ..."):
        report = validate_document(doc, os.path.basename(file), base_dir=os.path.dirname(os.path.abspath(file)))
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2, sort_keys=True))
    else:
        console.print(f"[bold]{escape(file)}[/]")
        checks = Table.grid(padding=(0, 2))  # the detail wraps under itself at the console's width
        checks.add_column(width=4, no_wrap=True)
        checks.add_column(no_wrap=True)
        checks.add_column(overflow="fold")
        for c in report.checks:
            mark = Text("  ok", style="green") if c.ok else Text("FAIL", style="bold red")
            checks.add_row(mark, c.name, Text(c.detail))
        console.print(checks)
        for w in report.warnings:
            console.print(f"[yellow]note:[/] {escape(w)}")
        if report.estimate is not None:
            print_result(report.estimate)
        console.print("valid" if report.ok else "[bold red]not valid[/]")
    if not report.ok:
        raise typer.Exit(2)
