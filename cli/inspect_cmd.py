"""`hyperplan inspect MODEL`: what the importer and block discovery found, as tables or JSON."""

from __future__ import annotations

import json
from typing import Annotated, Any, Optional

import typer

from cli import options as opt
from cli.arch_options import architecture_options
from cli import render
from cli.errors import guarded
from planner import bounds
from planner.api import load_graph
from planner.graph.blocks import discover_blocks
from planner.graph.summary import summarize

console = render.LiveConsole(highlight=False, soft_wrap=False)

#: Op histogram rows shown in the table (all are in --json).
TOP_OPS = 12


def register(app: typer.Typer) -> None:
    """Add `inspect` to the root app."""
    app.command("inspect")(inspect_cmd)


@guarded
@architecture_options
def inspect_cmd(
    model: opt.Model,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
    batch: opt.Batch = None,
    seq_len: opt.SeqLen = None,
    dim: opt.Dim = None,
    overrides: Optional[dict[str, Any]] = None,
) -> None:
    """Parameters, FLOPs per token, layers and their types, sub-models, ops and weight memory of a model."""
    dims = opt.parse_dims(dim)
    for flag, value in (("--batch", batch), ("--seq-len", seq_len)):
        if value is not None:
            bounds.whole(flag, value, "the sequences per batch" if flag == "--batch" else "the sequence length (tokens)")
    bounds.readable("--seq-len", seq_len, model)
    with render.progress(f"reading {model} ..."):
        graph = load_graph(model, batch=batch, seq_len=seq_len, dims=dims, overrides=overrides)
        summary = summarize(graph, discover_blocks(graph))
    if as_json:
        typer.echo(json.dumps(summary, indent=2, sort_keys=True))
    else:
        _print_tables(summary)


def _print_tables(s: dict[str, Any]) -> None:
    m, w, p, f = s["model"], s["workload"], s["params"], s["flops"]
    unit = w["unit"]
    dims = ", ".join(f"{k}={v}" for k, v in m["dims"].items()) or "none (static shapes)"
    shape = f"batch {w['batch']}" + (f" x seq {w['seq_len']}" if w["seq_len"] else "")
    console.print(render.kv_table(f"Model {m['name']}", [
        ("producer", m["producer"] or "-"), ("opset", m["opset"]), ("nodes", f"{m['nodes']:,}"),
        ("symbolic dims", dims), ("imported at", f"{shape} ({w['source']})"),
        ("parameters", f"{render.count(p['total'])} ({p['total']:,})"),
        ("weights", render.nbytes(s["weights_bytes"])),
        ("forward FLOPs", render.flops(f["forward"])),
        (f"forward FLOPs per {unit}", render.flops(f[f"forward_per_{unit}"])),
        ("layers", f"{s['layers']['count']} in {s['layers']['types']} block types"),
    ]))
    console.print()
    total = p["total"]
    rows = [(t["label"], t["kind"], t["submodel"], t["count"], render.count(t["params_per_instance"]),
             render.count(t["params"]), render.percent(t["params"], total), render.flops(t["flops_per_instance"]))
            for t in s["block_types"]]
    if p["outside_blocks"]:
        rows.append(("(read by no node)", "-", "-", "-", "-", render.count(p["outside_blocks"]),
                     render.percent(p["outside_blocks"], total), "-"))
    console.print(render.table("Block types", ["type", "kind", "sub-model", "count", "params each", "params",
                                               "share", "FLOPs each"], rows,
                               right=["count", "params each", "params", "share", "FLOPs each"]))
    console.print()
    console.print(render.table("Sub-models", ["name", "layers", "blocks", "params", "forward FLOPs"],
                               [(x["name"], x["layers"], x["blocks"], render.count(x["params"]),
                                 render.flops(x["flops"])) for x in s["submodels"]],
                               right=["layers", "blocks", "params", "forward FLOPs"]))
    console.print()
    hist = sorted(s["ops"]["histogram"].items(), key=lambda kv: (-kv[1], kv[0]))
    shown = hist[:TOP_OPS]
    rest = sum(c for _, c in hist[TOP_OPS:])
    rows = [(op, c) for op, c in shown] + ([(f"({len(hist) - TOP_OPS} other ops)", rest)] if rest else [])
    console.print(render.table("Ops", ["op", "nodes"], rows, right=["nodes"]))
    unknown = s["ops"]["unknown"]
    if unknown:
        listed = ", ".join(f"{k} x{v}" for k, v in unknown.items())
        console.print(f"ops without a FLOP rule (costed by bytes moved): {listed}", markup=False)
    console.print()
    console.print(render.table("Weight memory", ["dtype", "bytes"],
                               [(k, render.nbytes(v)) for k, v in s["weights_bytes_by_dtype"].items()],
                               right=["bytes"]))
    for note in s["notes"]:
        console.print(f"note: {note}", markup=False)
