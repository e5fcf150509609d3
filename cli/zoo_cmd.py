"""`hyperplan zoo`: list the built-in reference models, export one as a weightless ONNX file."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

import models_zoo
from cli.arch_options import architecture_options
from cli import options as opt
from cli import render
from cli.errors import guarded
from planner import bounds
from planner.errors import InvalidInput
from planner.hypershard.io import check_output, write_atomically

console = render.LiveConsole(highlight=False, soft_wrap=True)
zoo_app = typer.Typer(
    name="zoo",
    help="Reference models built in: list them, or export one as a weightless ONNX graph.",
    no_args_is_help=True,
    add_completion=False,
)


def _human(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}" if n / scale < 100 else f"{n / scale:.1f}{unit}"
    return str(int(n))


@zoo_app.command("list")
@guarded
def list_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print the presets as JSON.")] = False,
) -> None:
    """List the presets: family, parameters (total, active), layers, and the source of their figures."""
    rows = models_zoo.presets()
    if as_json:
        typer.echo(json.dumps([dataclasses.asdict(r) for r in rows], indent=2, sort_keys=True))
        return
    console.print(render.table("hyperplan zoo (weightless ONNX builders; each source in full: --json)",
                               ("name", "family", "params", "active", "layers", "source"),
                               ((r.name, r.family, _human(r.params), _human(r.active_params), r.layers,
                                 short_source(r.source)) for r in rows),
                               right=("params", "active", "layers"), prose=("source",)))


def short_source(source: str) -> str:
    """Where a preset's figures come from, without what was read there: the text before its first `;` or `:`,
    less a parenthesis of figures ("(36 layers, ...)") or one left open by that cut, and, past 50 characters,
    anything after its first comma outside parentheses."""
    head = re.sub(r"\s*\((?=\d)[^)]*\)?", "", re.split(r"[;:]", source, maxsplit=1)[0]).strip().rstrip(",")
    if head.count("(") > head.count(")"):
        head = head[:head.rindex("(")].rstrip()
    depth = 0
    for i, ch in enumerate(head if len(head) > 50 else ""):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and head.startswith(", ", i):
            return head[:i]
    return head


@zoo_app.command("export")
@guarded
@architecture_options
def export_cmd(
    name: Annotated[str, typer.Argument(help="Preset name (see `hyperplan zoo list`), or a Hugging Face "
                                        "config.json (or the folder holding it).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="ONNX file to write.")],
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", help="Sequence length of the graph.")] = None,
    batch: Annotated[Optional[int], typer.Option(help="Batch size of the graph.")] = None,
    overrides: Optional[dict[str, Any]] = None,
    flat: Annotated[bool, typer.Option("--flat", help="Write every layer's nodes out instead of one local "
                                       "function per layer type (a plain graph, about 10x larger).")] = False,
    force: opt.Force = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print what was written as one JSON object.")] = False,
) -> None:
    """Write the preset's weightless graph (load it with onnx.load(path, load_external_data=False))."""
    if output.suffix.lower() != ".onnx":
        raise InvalidInput(f"-o {output}: an ONNX model is a .onnx file; name it like {name}.onnx")
    check_output(output, "-o", force=force, noun="model")
    bounds.readable("--seq-len", seq_len, name)
    if batch is not None:
        bounds.whole("--batch", batch, "the sequences per batch")
    settings = dict(overrides or {}) | {k: v for k, v in (("seq_len", seq_len), ("batch", batch)) if v is not None}
    hf = models_zoo.hf_config_file(name) is not None
    try:
        build = models_zoo.build_hf if hf else models_zoo.build
        model = build(name, flat=flat, **settings)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    data = model.SerializeToString()
    try:
        write_atomically(str(output), lambda: data, (), "model")
    except OSError as exc:
        raise InvalidInput(f"cannot write {output}: {exc.strerror}; choose another path.") from None
    meta = {p.key: p.value for p in model.metadata_props}
    nodes = models_zoo.inlined_node_count(model)
    if as_json:
        typer.echo(json.dumps({"name": name, "output": str(output), "bytes": len(data),
                               "params": int(meta["hyperplan.params"]),
                               "active_params": int(meta["hyperplan.active_params"]), "nodes": nodes,
                               "functions": len(model.functions)}, indent=2, sort_keys=True))
        return
    shared = f" in {len(model.functions)} layer function(s)" if model.functions else ""
    console.print(
        f"wrote {output}: {name}, {_human(int(meta['hyperplan.params']))} parameters "
        f"({_human(int(meta['hyperplan.active_params']))} active), {nodes} nodes{shared}, {render.nbytes(len(data))}"
    )


def register(app: typer.Typer) -> None:
    app.add_typer(zoo_app, name="zoo")
