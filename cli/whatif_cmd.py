"""`hyperplan whatif MODEL --cluster A,B --devices 64..384+64 ...`: how a model scales; table, JSON, CSV, plot."""

from __future__ import annotations

import csv
import io
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Iterator, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cli import options as opt
from cli.arch_options import architecture_options
from cli import render
from cli.errors import err_console, guarded
from cost_models import load_cluster
from planner import bounds
from cli.plan_cmd import _check_infer_flags, _ms
from planner.errors import InvalidInput
from planner.hypershard.io import check_output, write_atomically
from planner.inference.sweep import run_infer_sweep
from planner.whatif import cache_dir, parse_clusters, parse_devices, parse_prices, run_sweep

console = render.LiveConsole(highlight=False, soft_wrap=False)

CSV_COLUMNS = ("cluster", "devices", "status", "plan", "step_time_s", "tokens_per_s", "tokens_per_s_per_device",
               "mfu", "peak_memory_gib", "scaling_efficiency", "marginal_efficiency", "cost_per_mtoken",
               "search_complete", "reason")
INFER_CSV_COLUMNS = ("cluster", "devices", "status", "serving", "plan", "prefill_devices", "decode_devices",
                     "requests_per_s", "prefill_tokens_per_s_per_device", "decode_tokens_per_s_per_device",
                     "output_tokens_per_s_per_device", "ttft_ms", "tpot_ms", "scaling_efficiency", "reason")
_PLOT_SUFFIXES = (".png", ".svg")
_INFER = "Inference (--mode infer)"


def register(app: typer.Typer) -> None:
    app.command("whatif")(whatif_cmd)


@guarded
@architecture_options
def whatif_cmd(
    model: opt.Model,
    cluster: Annotated[list[str], typer.Option("--cluster", help="Hardware presets or .toml files, comma-separated "
                                               "or repeated: cloudmatrix384,gb200-nvl72.", show_default=False)],
    devices: Annotated[str, typer.Option("--devices", help="Device counts: 64,128,256, a geometric range "
                                         "64..1024x2, or a stepped range 64..384+64.", show_default=False)],
    global_batch: Annotated[Optional[int], typer.Option("--global-batch", help="Sequences per training step "
                                                        "(--mode train).", show_default=False)] = None,
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", help="Tokens per sequence (--mode train).",
                                                   show_default=False)] = None,
    mode: Annotated[str, typer.Option("--mode", help="train, or infer (serving plans: prefill and decode).")] = "train",
    prompt_len: Annotated[Optional[int], typer.Option("--prompt-len", help="Prompt tokens per request.",
                                                      rich_help_panel=_INFER, show_default=False)] = None,
    gen_len: Annotated[Optional[int], typer.Option("--gen-len", help="Generated tokens per request.",
                                                   rich_help_panel=_INFER, show_default=False)] = None,
    batch: Annotated[Optional[int], typer.Option("--batch", help="Sequences per data-parallel replica per step.",
                                                 rich_help_panel=_INFER, show_default=False)] = None,
    ttft_ms: Annotated[Optional[float], typer.Option("--ttft-ms", help="Time to first token target.",
                                                     rich_help_panel=_INFER, show_default=False)] = None,
    tpot_ms: Annotated[Optional[float], typer.Option("--tpot-ms", help="Time per output token target.",
                                                     rich_help_panel=_INFER, show_default=False)] = None,
    kv_dtype: Annotated[str, typer.Option("--kv-dtype", help="KV-cache precision: bf16, fp16, fp8 or int8.",
                                          rich_help_panel=_INFER)] = "bf16",
    time_limit: Annotated[Optional[float], typer.Option(
        "--time-limit", help="Seconds each point's search may take (default: no limit but the work budget, which "
                             "ends every search, so that a sweep gives the same points on any machine; a point cut "
                             "short is marked incomplete and never cached).", show_default=False)] = None,
    memory_gib: Annotated[Optional[float], typer.Option("--memory-gib", help="HBM a plan may use per device "
                                                        "(default: all of it).")] = None,
    price: Annotated[Optional[list[str]], typer.Option("--price", metavar="CLUSTER=PRICE", help="Your price per "
                                                       "device-hour for a cluster, to get a cost per million "
                                                       "tokens (repeatable).")] = None,
    csv_file: Annotated[Optional[str], typer.Option("--csv", help="Also write the points to a CSV file.")] = None,
    plot: Annotated[Optional[str], typer.Option("--plot", help="Also draw throughput and efficiency against "
                                                "devices to a .png or .svg (needs hyperplan\\[plot]).")] = None,
    force: opt.Force = False,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Plan every point again; do not read or write "
                                           "the cache ($HYPERPLAN_CACHE or ~/.cache/hyperplan).")] = False,
    workers: Annotated[Optional[int], typer.Option("--workers", help="Points planned at once "
                                                   "(default: one per core).", min=1)] = None,
    dtype: opt.Dtype = "bf16",
    as_json: opt.Json = False,
    overrides: Optional[dict[str, Any]] = None,
    dim: opt.Dim = None,
) -> None:
    """Plan the model at each cluster and device count: best plan, throughput, MFU, memory and scaling.

    Each point is a full `hyperplan plan` search, run in parallel processes and cached on disk.

    Adding a point to a sweep plans only that point. Points where nothing fits are listed with the reason.

    Each cluster's `checked` line says how far its estimates were from its held-out published runs; over two
    presets on which one release of Megatron-Bridge ran the same job, another says how far the estimated speedup
    between them was from the published one.

    Example: hyperplan whatif llama3-70b --cluster cloudmatrix384 --devices 64..384+64 --global-batch 256 --seq-len 4096

    Example: hyperplan whatif deepseek-v3 --mode infer --cluster cloudmatrix384 --devices 64..384+64 --prompt-len 4096
    --gen-len 1024 --ttft-ms 2000 --tpot-ms 50 --dtype int8
    """
    clusters = parse_clusters(",".join(cluster))
    counts = parse_devices(devices)
    _check_output(csv_file, (".csv",), "--csv", (model, *clusters), force)
    bounds.request(model, [load_cluster(c) for c in clusters], devices=max(counts), global_batch=global_batch,
                   seq_len=seq_len, prompt_len=prompt_len, gen_len=gen_len, batch=batch, ttft_ms=ttft_ms,
                   tpot_ms=tpot_ms, time_limit_s=time_limit, memory_gib=memory_gib, overrides=overrides)
    if mode == "infer":
        _check_infer_flags(global_batch, seq_len, prompt_len, gen_len, batch, ttft_ms, tpot_ms, None)
        if plot or price:
            raise InvalidInput("--plot and --price apply to training sweeps; drop them with --mode infer")
        with _bar(model) as progress:
            sweep = run_infer_sweep(model, clusters=clusters, devices=counts, prompt_len=prompt_len,
                                    gen_len=gen_len, batch=batch, ttft_ms=ttft_ms, tpot_ms=tpot_ms, dtype=dtype,
                                    kv_dtype=kv_dtype, overrides=overrides, dims=opt.parse_dims(dim),
                                    memory_gib=memory_gib, use_cache=not no_cache, workers=workers,
                                    progress=progress)
        _finish(sweep, csv_file, INFER_CSV_COLUMNS, no_cache, as_json, print_infer_sweep)
        return
    if global_batch is None or seq_len is None:
        missing = " and ".join(f for f, v in (("--global-batch", global_batch), ("--seq-len", seq_len)) if v is None)
        raise InvalidInput(f"{missing} {'is' if ' and ' not in missing else 'are'} needed for a training sweep; "
                           "give them, or --mode infer with --prompt-len and --gen-len")
    prices = parse_prices(price, clusters)
    if plot:
        _check_output(plot, _PLOT_SUFFIXES, "--plot", (model, *clusters), force)
        _matplotlib()
    with _bar(model) as progress:
        sweep = run_sweep(model, clusters=clusters, devices=counts, global_batch=global_batch, seq_len=seq_len,
                          dtype=dtype, mode=mode, time_limit_s=time_limit, overrides=overrides,
                          dims=opt.parse_dims(dim), memory_gib=memory_gib, prices=prices, use_cache=not no_cache,
                          workers=workers, progress=progress)
    if plot:
        write_plot(sweep.doc, plot)
    _finish(sweep, csv_file, CSV_COLUMNS, no_cache, as_json, print_sweep)


def _check_output(path: str | None, suffixes: tuple[str, ...], flag: str, inputs: tuple[str, ...],
                  force: bool) -> None:
    """Refuse a bad output path (its suffix, its folder, an input, an existing file without --force) before the
    sweep spends minutes."""
    if not path:
        return
    if Path(path).suffix.lower() not in suffixes:
        raise InvalidInput(f"{flag} {path}: use a file name ending in {' or '.join(suffixes)}")
    check_output(path, flag, protect=inputs, force=force)


def _fmt(value: Any, spec: Any) -> str:
    """'-' for a missing figure; else `spec` (a format spec, or a function like render.seconds) of it."""
    if value is None:
        return "-"
    return spec(value) if callable(spec) else format(value, spec)


def print_sweep(doc: dict) -> None:
    w, m = doc["workload"], doc["model"]
    console.print(f"[bold]{m['name']}[/] ({render.count(m['params']) if m['params'] else '?'} parameters), "
                  f"{w['mode']}, global batch {w['global_batch']} x {w['seq_len']} tokens, {w['dtype']}")
    ok = [p for p in doc["points"] if p["status"] == "ok"]
    priced = any(p["cost_per_mtoken"] is not None for p in ok)
    cols = ["cluster", "devices", "best plan", "step", "tokens/s", "tok/s/dev", "MFU", "peak",
            "scaling", "marginal"] + (["$/Mtok"] if priced else [])
    rows = []
    for p in ok:
        row = [p["cluster"], p["devices"], p["plan"] + ("" if p["search_complete"] else " *"),
               _fmt(p["step_time_s"], render.seconds), render.count(p["tokens_per_s"]),
               render.count(p["tokens_per_s_per_device"]), _fmt(p["mfu"], ".1%"),
               _fmt(p["peak_memory_gib"], render.gib), _fmt(p["scaling_efficiency"], ".0%"),
               _fmt(p["marginal_efficiency"], ".0%")]
        rows.append(row + ([_fmt(p["cost_per_mtoken"], render.sig)] if priced else []))
    if rows:
        right = ("devices", "step", "tokens/s", "tok/s/dev", "MFU", "peak", "scaling", "marginal", "$/Mtok")
        console.print(render.table("best plan per point", cols, rows, right=right))
        base = ", ".join(f"{c['name']} {c['baseline_devices']}" for c in doc["clusters"] if c["baseline_devices"])
        console.print(f"scaling: tokens/s per device against the smallest point that fits ({base}); "
                      "marginal: what the devices added since the previous point bring, per device, on the same scale")
        if any(not p["search_complete"] for p in ok):
            console.print("* the search stopped at --time-limit; a longer limit may find a faster plan")
        _print_checked(doc)  # how far off each cluster's estimates may be: its held-out runs
    else:
        console.print("no point fits")
    print_misses(doc)


def write_csv(doc: dict, path: str, columns: tuple[str, ...] = CSV_COLUMNS) -> None:
    """One row per point; numbers written in full (repr) so that reading them back gives the same floats."""
    def text() -> str:
        buf = io.StringIO()
        out = csv.writer(buf, lineterminator="\n")
        out.writerow(columns)
        for p in doc["points"]:
            out.writerow(["" if p[c] is None else repr(p[c]) if isinstance(p[c], float) else p[c]
                          for c in columns])
        return buf.getvalue()

    write_atomically(path, text, (), "CSV")


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
    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.hashsalt": "hyperplan", "svg.fonttype": "none"}):
        fig.savefig(buf, format=path.lower().rsplit(".", 1)[-1], metadata=meta)
    write_atomically(path, buf.getvalue, (), "plot")


@contextmanager
def _bar(model: str) -> Iterator[Any]:
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console.now(), transient=True, disable=not err_console.is_terminal) as bar:
        task = bar.add_task(f"planning {model}", total=None)

        def progress(msg: str, frac: float) -> None:
            bar.update(task, completed=round(frac * 1000), total=1000, description=f"planned {msg}"[:60])

        yield progress


def _finish(sweep: Any, csv_file: str | None, columns: tuple[str, ...], no_cache: bool, as_json: bool,
            printer: Any) -> None:
    doc = sweep.doc
    if csv_file:
        write_csv(doc, csv_file, columns)
    total = sum(p["status"] != "invalid" for p in doc["points"])
    where = "" if no_cache else f" ({cache_dir()})"
    err_console.print(f"{sweep.computed} of {total} points planned, {total - sweep.computed} from the cache{where}")
    if as_json:
        typer.echo(json.dumps(doc, indent=2, sort_keys=True))
    else:
        printer(doc)
    failed = [p for p in doc["points"] if p["status"] == "error"]
    if failed:
        err_console.print(f"[bold red]error:[/] the planner failed at {len(failed)} point(s) (a hyperplan bug; "
                          "please report it with the reasons above)", markup=True)
        raise typer.Exit(1)


def print_infer_sweep(doc: dict) -> None:
    w, m = doc["workload"], doc["model"]
    target = (f"batch {w['batch']}" if w["batch"] else
              " and ".join(f"{k.split('_')[0].upper()} <= {w[k]:g} ms" for k in ("ttft_ms", "tpot_ms") if w[k]))
    console.print(f"[bold]{m['name']}[/] ({render.count(m['params']) if m['params'] else '?'} parameters) serving "
                  f"prompts of {w['prompt_len']} + {w['gen_len']} generated tokens, {w['dtype']}, {target}")
    ok = [p for p in doc["points"] if p["status"] == "ok"]
    cols = ["cluster", "devices", "plan", "req/s", "prefill tok/s/dev", "decode tok/s/dev", "out tok/s/dev",
            "TTFT", "TPOT", "scaling"]
    rows = [[p["cluster"], p["devices"], p["plan"], _fmt(p["requests_per_s"], ",.1f"),
             _fmt(p["prefill_tokens_per_s_per_device"], ",.0f"), _fmt(p["decode_tokens_per_s_per_device"], ",.0f"),
             _fmt(p["output_tokens_per_s_per_device"], ",.0f"), _fmt(p["ttft_ms"], _ms), _fmt(p["tpot_ms"], _ms),
             _fmt(p["scaling_efficiency"], ".0%")] for p in ok]
    if rows:
        console.print(render.table("best serving plan per point", cols, rows,
                                   right=tuple(c for c in cols if c not in ("cluster", "plan"))))
        console.print("scaling: output tokens/s per device against the smallest point that serves")
        _print_checked(doc)  # how far off each cluster's serving estimates may be: its published deployments
    else:
        console.print("no point serves")
    print_misses(doc)


def _print_checked(doc: dict) -> None:
    """One `checked` line per cluster of a sweep that says how far off its estimates may be, and one per pair of
    clusters that published runs compare."""
    for c in doc["clusters"]:
        if c.get("checked"):
            console.print(f"checked: {c['checked']}", markup=False)
    for pair in doc.get("pairs", ()):
        console.print(f"checked: {pair['checked']}", markup=False)


def print_misses(doc: dict) -> None:
    """The points without a plan, and why."""
    misses = [p for p in doc["points"] if p["status"] != "ok"]
    if misses:
        console.print(render.table("points without a plan", ["cluster", "devices", "status", "why"],
                                   ([p["cluster"], p["devices"], p["status"], p["reason"]] for p in misses),
                                   right=("devices",), prose=("why",)))
