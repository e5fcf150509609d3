"""`hyperplan validate FILE`: check a HyperShard declaration and re-estimate it; a table of checks, or JSON."""

from __future__ import annotations

import json
import os
import textwrap
from typing import Annotated

import typer
from rich.markup import escape

from cli import options as opt
from cli import render
from cli.errors import guarded
from cli.estimate_cmd import print_result
from planner.hypershard.io import read_document
from planner.hypershard.validate import validate_document

console = render.LiveConsole(highlight=False, soft_wrap=False)
#: where a check's detail starts: its mark, two spaces, its name in 9, a space
_INDENT = 16


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
        room = max(30, console.width - _INDENT)  # each detail wraps under itself, no line padded to the width
        for c in report.checks:
            mark = "[green]  ok[/]" if c.ok else "[bold red]FAIL[/]"
            lines = textwrap.wrap(c.detail, room, break_long_words=False, break_on_hyphens=False) or [""]
            console.print(f"{mark}  {c.name:<9} {escape(lines[0])}", soft_wrap=True)
            for line in lines[1:]:
                console.print(" " * _INDENT + escape(line), soft_wrap=True)
        for w in report.warnings:
            console.print(f"[yellow]note:[/] {escape(w)}")
        if report.estimate is not None:
            print_result(report.estimate)
        console.print("valid" if report.ok else "[bold red]not valid[/]")
    if not report.ok:
        raise typer.Exit(2)
