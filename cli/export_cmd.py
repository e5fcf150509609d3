"""`hyperplan export FILE --backend NAME -o OUT`: turn a HyperShard declaration into code or an annotated model."""

from __future__ import annotations

import json
import os
from typing import Annotated

import typer
from rich.markup import escape

from cli import options as opt
from cli import render
from cli.errors import guarded
from planner.hypershard.backends import BACKENDS, export_to_file
from planner.hypershard.io import check_output, read_document

console = render.LiveConsole(highlight=False, soft_wrap=False)


def register(app: typer.Typer) -> None:
    app.command("export")(export_cmd)


@guarded
def export_cmd(
    file: Annotated[str, typer.Argument(help="A HyperShard declaration (.yaml, .yml or .json).", show_default=False)],
    backend: Annotated[str, typer.Option("--backend", help=f"Target: {', '.join(BACKENDS)}.", show_default=False)],
    output: Annotated[str, typer.Option("-o", "--output", help="File to write (.py; .onnx for the onnx backend).",
                                        show_default=False)],
    force: opt.Force = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print what was written as one JSON object.")] = False,
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
    base_dir = os.path.dirname(os.path.abspath(file))
    inputs = (file, *declared_inputs(doc, base_dir))
    check_output(output, "-o", protect=inputs, force=force, noun=f"{backend} export")
    with render.progress(f"exporting {file} to {backend} ..."):
        size = export_to_file(doc, backend, output, base_dir=base_dir, protect=inputs)
    if as_json:
        typer.echo(json.dumps({"backend": backend, "declaration": file, "output": output, "bytes": size},
                              indent=2, sort_keys=True))
        return
    console.print(f"{backend} export written to {escape(output)} ({render.nbytes(size)})")


def declared_inputs(doc: dict, base_dir: str) -> tuple[str, ...]:
    """The files a declaration names (its model, cluster and stack files): an export must not replace them."""
    names = [doc.get("model", {}).get("path"), doc.get("cluster", {}).get("spec"), doc.get("workload", {}).get("stack")]
    out = []
    for name in names:
        if isinstance(name, str) and name:
            out.append(name)
            if not os.path.isabs(name):
                out.append(os.path.join(base_dir, name))
    return tuple(out)
