"""`hyperplan export FILE --backend NAME -o OUT`: turn a HyperShard declaration into code or an annotated model."""

from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from cli import render
from cli.errors import guarded
from planner.hypershard.backends import BACKENDS, export_to_file
from planner.hypershard.io import read_document

console = Console(highlight=False, soft_wrap=False)


def register(app: typer.Typer) -> None:
    app.command("export")(export_cmd)


@guarded
def export_cmd(
    file: Annotated[str, typer.Argument(help="A HyperShard declaration (.yaml, .yml or .json).", show_default=False)],
    backend: Annotated[str, typer.Option("--backend", help=f"Target: {', '.join(BACKENDS)}.", show_default=False)],
    output: Annotated[str, typer.Option("-o", "--output", help="File to write (.py; .onnx for the onnx backend).",
                                        show_default=False)],
) -> None:
    """Write what an execution framework needs to apply the plan.

    hyper-parallel, mindspore, torch and jax give a Python module holding the layouts as data and the calls that
    apply them (torch: DeviceMesh, parallelize_module plan, FSDP2, in torchtitan's order); onnx gives the model
    with ONNX IR v11 sharding annotations on its nodes. A serving declaration (plan --mode infer -o) gives a mesh,
    tensor-parallel layouts and expert placement per phase program (prefill, decode); jax, mindspore and
    hyper-parallel refuse a phase whose expert-parallel degree does not divide its experts.

    Example: hyperplan export plan.yaml --backend torch -o parallelize_plan.py
    """
    doc = read_document(file)
    with render.progress(f"exporting {file} to {backend} ..."):
        size = export_to_file(doc, backend, output, base_dir=os.path.dirname(os.path.abspath(file)), protect=(file,))
    console.print(f"{backend} export written to {escape(output)} ({render.nbytes(size)})")
