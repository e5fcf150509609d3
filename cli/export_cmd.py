"""`hyperplan export FILE --backend NAME [-o OUT]`: turn a HyperShard declaration into code, an annotated model or a
framework's own launch configuration (printed when no -o is given)."""

from __future__ import annotations

import json
import os
from typing import Annotated, Optional

import typer
from rich.markup import escape

from cli import options as opt
from cli import render
from cli.errors import guarded
from planner.errors import InvalidInput
from planner.hypershard.backends import BACKENDS, LAUNCH, export, export_to_file, launch_config, suffix
from planner.hypershard.io import check_output, read_document

console = render.LiveConsole(highlight=False, soft_wrap=False)


def register(app: typer.Typer) -> None:
    app.command("export")(export_cmd)


@guarded
def export_cmd(
    file: Annotated[str, typer.Argument(help="A HyperShard declaration (.yaml, .yml or .json).", show_default=False)],
    backend: Annotated[str, typer.Option("--backend", help=f"Target: {', '.join(BACKENDS)}.", show_default=False)],
    output: Annotated[Optional[str], typer.Option(
        "-o", "--output", help="File to write (.py; .onnx for onnx; .sh for megatron, vllm and sglang, .toml for "
        "torchtitan, .json for deepspeed, .yaml for mindformers). Launch configs are printed when it is not given.",
        show_default=False)] = None,
    force: opt.Force = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print what was written as one JSON object (a launch config "
                                          "without -o: the config itself, as data).")] = False,
) -> None:
    """Write what an execution framework needs to apply the plan.

    hyper-parallel, mindspore, torch and jax give a Python module holding the layouts as data and the calls that
    apply them (torch: DeviceMesh, parallelize_module plan, FSDP2, in torchtitan's order); onnx gives the model
    with ONNX IR v11 sharding annotations on its nodes. A serving declaration (plan --mode infer -o) gives a mesh,
    tensor-parallel layouts and expert placement per phase program (prefill, decode); jax, mindspore and
    hyper-parallel refuse a phase whose expert-parallel degree does not divide its experts.

    Launch configs are the files users run: megatron gives Megatron-LM / NeMo / MindSpeed-LLM arguments (a torchrun
    line), torchtitan a job TOML, deepspeed a ds_config JSON, mindformers a MindFormers YAML; a serving declaration
    gives vllm or sglang command lines (two, prefill and decode, when the phases are disaggregated). Each says in one
    sentence what of the plan its format cannot express, before writing anything.

    Example: hyperplan export plan.yaml --backend torch -o parallelize_plan.py

    Example: hyperplan export plan.yaml --backend megatron
    """
    doc = read_document(file)
    base_dir = os.path.dirname(os.path.abspath(file))
    inputs = (file, *declared_inputs(doc, base_dir))
    if output is None:
        if backend not in LAUNCH:
            suffix(backend)  # an unknown backend is named as such
            raise InvalidInput(f"the {backend} backend writes a file: give -o FILE (launch configs, which are "
                               f"printed without -o: {', '.join(LAUNCH)})")
        refuse_invalid(doc, file, base_dir)
        if as_json:
            typer.echo(json.dumps({"backend": backend, "declaration": file,
                                   **launch_config(doc, backend, base_dir=base_dir)}, indent=2))
        else:
            typer.echo(export(doc, backend, base_dir=base_dir), nl=False)
        return
    check_output(output, "-o", protect=inputs, force=force, noun=f"{backend} export")
    refuse_invalid(doc, file, base_dir)
    with render.progress(f"exporting {file} to {backend} ..."):
        size = export_to_file(doc, backend, output, base_dir=base_dir, protect=inputs)
    if as_json:
        typer.echo(json.dumps({"backend": backend, "declaration": file, "output": output, "bytes": size},
                              indent=2, sort_keys=True))
        return
    console.print(f"{backend} export written to {escape(output)} ({render.nbytes(size)})")


def refuse_invalid(doc: dict, file: str, base_dir: str) -> None:
    """Before writing: a training declaration passes validate's checks of itself (cluster, model, pipeline,
    layouts; not the re-estimate), so no launch config goes out of a file validate refuses."""
    from planner.hypershard.programs import is_serving
    from planner.hypershard.validate import validate_document

    if is_serving(doc):
        return
    bad = next((c for c in validate_document(doc, os.path.basename(file), base_dir, through="layouts").checks
                if not c.ok), None)
    if bad is not None:
        raise InvalidInput(f"{file} does not validate ({bad.name}: {bad.detail}); fix it (`hyperplan validate "
                           f"{file}` lists every check), then export")


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
