"""`hyperplan whatif MODEL --cluster A,B --devices 64..384+64 ...`: how a model scales; table, JSON, CSV, plot."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cli import options as opt
from cli import render
from cli.errors import err_console, guarded
from planner.errors import InvalidInput
from planner.whatif import cache_dir, parse_clusters, parse_devices, parse_prices, run_sweep

console = Console(highlight=False, soft_wrap=False)

CSV_COLUMNS = ("cluster", "devices", "status", "plan", "step_time_s", "tokens_per_s", "tokens_per_s_per_device",
               "mfu", "peak_memory_gib", "scaling_efficiency", "marginal_efficiency", "cost_per_mtoken",
               "search_complete", "reason")
_PLOT_SUFFIXES = (".png", ".svg")


def register(app: typer.Typer) -> None:
    app.command("whatif")(whatif_cmd)


@guarded
def whatif_cmd(
    model: opt.Model,
    cluster: Annotated[str, typer.Option("--cluster", help="Hardware presets or .toml files, comma-separated: "
                                         "cloudmatrix384,gb200-nvl72.", show_default=False)],
    devices: Annotated[str, typer.Option("--devices", help="Device counts: 64,128,256, a geometric range "
                                         "64..1024x2, or a stepped range 64..384+64.", show_default=False)],
    global_batch: opt.GlobalBatch,
    seq_len: opt.RequiredSeqLen,
    mode: Annotated[str, typer.Option("--mode", help="train (infer is not planned yet).")] = "train",
    time_limit: Annotated[float, typer.Option("--time-limit", help="Seconds each point's search may take.")] = 60.0,
    memory_gib: Annotated[Optional[float], typer.Option("--memory-gib", help="HBM a plan may use per device "
                                                        "(default: all of it).")] = None,
    price: Annotated[Optional[list[str]], typer.Option("--price", metavar="CLUSTER=PRICE", help="Your price per "
                                                       "device-hour for a cluster, to get a cost per million "
                                                       "tokens (repeatable).")] = None,
    csv_file: Annotated[Optional[str], typer.Option("--csv", help="Also write the points to a CSV file.")] = None,
    plot: Annotated[Optional[str], typer.Option("--plot", help="Also draw throughput and efficiency against "
                                                "devices to a .png or .svg (needs hyperplan[plot]).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Plan every point again; do not read or write "
                                           "the cache ($HYPERPLAN_CACHE or ~/.cache/hyperplan).")] = False,
    workers: Annotated[Optional[int], typer.Option("--workers", help="Points planned at once "
                                                   "(default: one per core).", min=1)] = None,
    dtype: opt.Dtype = "bf16",
    as_json: opt.Json = False,
    layers: opt.Layers = None,
    hidden: opt.Hidden = None,
    heads: opt.Heads = None,
    kv_heads: opt.KvHeads = None,
    vocab: opt.Vocab = None,
    experts: opt.Experts = None,
    top_k: opt.TopK = None,
    dim: opt.Dim = None,
) -> None:
    """Plan the model at each cluster and device count: best plan, throughput, MFU, memory and scaling.

    Each point is a full `hyperplan plan` search, run in parallel processes and cached on disk.

    Adding a point to a sweep plans only that point. Points where nothing fits are listed with the reason.

    Example: hyperplan whatif llama3-70b --cluster cloudmatrix384 --devices 64..384+64 --global-batch 256 --seq-len 4096
    """
    clusters = parse_clusters(cluster)
    counts = parse_devices(devices)
    prices = parse_prices(price, clusters)
    _check_output(csv_file, (".csv",), "--csv")
    if plot:
        _check_output(plot, _PLOT_SUFFIXES, "--plot")
        _matplotlib()
    overrides = opt.zoo_overrides(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, vocab=vocab,
                                  experts=experts, top_k=top_k)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True, disable=not err_console.is_terminal) as bar:
        task = bar.add_task(f"planning {model}", total=None)

        def progress(msg: str, frac: float) -> None:
            bar.update(task, completed=round(frac * 1000), total=1000, description=f"planned {msg}"[:60])

        sweep = run_sweep(model, clusters=clusters, devices=counts, global_batch=global_batch, seq_len=seq_len,
                          dtype=dtype, mode=mode, time_limit_s=time_limit, overrides=overrides,
                          dims=opt.parse_dims(dim), memory_gib=memory_gib, prices=prices, use_cache=not no_cache,
                          workers=workers, progress=progress)
    doc = sweep.doc
    if csv_file:
        write_csv(doc, csv_file)
    if plot:
        write_plot(doc, plot)
    total = sum(p["status"] != "invalid" for p in doc["points"])
    where = "" if no_cache else f" ({cache_dir()})"
    err_console.print(f"{sweep.computed} of {total} points planned, {total - sweep.computed} from the cache{where}")
    if as_json:
        typer.echo(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print_sweep(doc)
    failed = [p for p in doc["points"] if p["status"] == "error"]
    if failed:
        err_console.print(f"[bold red]error:[/] the planner failed at {len(failed)} point(s) (a hyperplan bug; "
                          "please report it with the reasons above)", markup=True)
        raise typer.Exit(1)


def _check_output(path: str | None, suffixes: tuple[str, ...], flag: str) -> None:
    """Refuse a bad output path before the sweep spends minutes."""
    if not path:
        return
    target = Path(path)
    if target.suffix.lower() not in suffixes:
        raise InvalidInput(f"{flag} {path}: use a file name ending in {' or '.join(suffixes)}")
    if not target.parent.is_dir():
        raise InvalidInput(f"{flag} {path}: folder {target.parent} does not exist")


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_sweep(doc: dict) -> None:
    w, m = doc["workload"], doc["model"]
    console.print(f"[bold]{m['name']}[/] ({render.count(m['params']) if m['params'] else '?'} parameters), "
                  f"{w['mode']}, global batch {w['global_batch']} x {w['seq_len']} tokens, {w['dtype']}")
    ok = [p for p in doc["points"] if p["status"] == "ok"]
    priced = any(p["cost_per_mtoken"] is not None for p in ok)
    cols = ["cluster", "devices", "best plan", "step s", "tokens/s", "tok/s/dev", "MFU", "peak GiB",
            "scaling", "marginal"] + (["$/Mtok"] if priced else [])
    rows = []
    for p in ok:
        row = [p["cluster"], p["devices"], p["plan"] + ("" if p["search_complete"] else " *"),
               _fmt(p["step_time_s"], ".3g"), render.count(p["tokens_per_s"]),
               render.count(p["tokens_per_s_per_device"]), _fmt(p["mfu"], ".1%"), _fmt(p["peak_memory_gib"], ".1f"),
               _fmt(p["scaling_efficiency"], ".0%"), _fmt(p["marginal_efficiency"], ".0%")]
        rows.append(row + ([_fmt(p["cost_per_mtoken"], ".3g")] if priced else []))
    if rows:
        right = ("devices", "step s", "tokens/s", "tok/s/dev", "MFU", "peak GiB", "scaling", "marginal", "$/Mtok")
        console.print(render.table("best plan per point", cols, rows, right=right))
        base = ", ".join(f"{c['name']} {c['baseline_devices']}" for c in doc["clusters"] if c["baseline_devices"])
        console.print(f"scaling: tokens/s per device against the smallest point that fits ({base}); "
                      "marginal: what the devices added since the previous point bring, per device, on the same scale")
        if any(not p["search_complete"] for p in ok):
            console.print("* the search stopped at --time-limit; a longer limit may find a faster plan")
    else:
        console.print("no point fits")
    misses = [p for p in doc["points"] if p["status"] != "ok"]
    if misses:
        console.print(render.table("points without a plan", ["cluster", "devices", "status", "why"],
                                   ([p["cluster"], p["devices"], p["status"], p["reason"]] for p in misses),
                                   right=("devices",)))


def write_csv(doc: dict, path: str) -> None:
    """One row per point; numbers written in full (repr) so that reading them back gives the same floats."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(CSV_COLUMNS)
        for p in doc["points"]:
            out.writerow(["" if p[c] is None else repr(p[c]) if isinstance(p[c], float) else p[c]
                          for c in CSV_COLUMNS])
    os.replace(tmp, target)


def _matplotlib() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise InvalidInput("--plot needs matplotlib, which is not installed; run pip install 'hyperplan[plot]' "
                           "or drop --plot") from None
    return matplotlib


def write_plot(doc: dict, path: str) -> None:
    """Throughput and scaling efficiency against devices, one line per cluster (log2 device axis)."""
    matplotlib = _matplotlib()
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), layout="constrained")
    tput, eff = fig.subplots(1, 2)
    for c in doc["clusters"]:
        pts = [p for p in doc["points"] if p["cluster"] == c["name"] and p["status"] == "ok"]
        if not pts:
            continue
        xs = [p["devices"] for p in pts]
        tput.plot(xs, [p["tokens_per_s"] for p in pts], marker="o", label=c["name"])
        eff.plot(xs, [p["scaling_efficiency"] for p in pts], marker="o", label=c["name"])
    w = doc["workload"]
    fig.suptitle(f"{doc['model']['name']}: global batch {w['global_batch']} x {w['seq_len']} tokens, {w['dtype']}")
    for ax, label in ((tput, "tokens/s"), (eff, "scaling efficiency (tokens/s per device vs smallest)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("devices")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    eff.set_ylim(bottom=0)
    # Fixed metadata and SVG ids: the same sweep draws the same bytes.
    meta = {"Date": None} if path.lower().endswith(".svg") else {"Software": None}
    with matplotlib.rc_context({"svg.hashsalt": "hyperplan", "svg.fonttype": "none"}):
        fig.savefig(path, metadata=meta)
