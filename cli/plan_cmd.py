"""`hyperplan plan MODEL --cluster C ...`: search the fastest strategy that fits; tables, JSON, or a file."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cli import options as opt
from cli.errors import err_console, guarded
from cli.estimate_cmd import print_estimate
from planner.api import plan_model
from planner.errors import InvalidInput
from planner.hypershard import Request, declare_plan, write_document

console = Console(highlight=False, soft_wrap=False)


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_cmd)


@guarded
def plan_cmd(
    model: opt.Model,
    cluster: opt.Cluster,
    global_batch: opt.GlobalBatch,
    seq_len: opt.RequiredSeqLen,
    devices: opt.Devices = None,
    mode: Annotated[str, typer.Option("--mode", help="What to plan: train. (Inference planning, prefill and decode, is not available yet.)")] = "train",
    time_limit: Annotated[float, typer.Option("--time-limit", help="Seconds the search may take; the best plan so "
                                                                   "far is returned when it runs out.")] = 60.0,
    output: Annotated[Optional[str], typer.Option("-o", "--output", help="Write the HyperShard declaration to a "
                                                  ".yaml or .json file (`hyperplan validate` / `export` read it).")] = None,
    memory_gib: Annotated[Optional[float], typer.Option("--memory-gib", help="HBM a plan may use per device "
                                                        "(default: all of it), e.g. to leave room for the runtime.")] = None,
    no_offload: Annotated[bool, typer.Option("--no-offload", help="Keep everything in HBM: no HyperOffload of "
                                             "parameters, optimizer states or activations to host/pooled memory.")] = False,
    no_mpmd: Annotated[bool, typer.Option("--no-mpmd", help="Keep the whole model one program: no HyperMPMD device "
                                          "groups for vision/audio encoders beside the backbone.")] = False,
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
    """Find the strategy with the best step time that fits in memory, and say why it won.

    It searches the mesh (TP, CP, PP, DP, EP with the tensor axis inside the scale-up domain), the pipeline cut,
    per-op tensor layouts (an integer program), micro-batch size, recompute and ZeRO level.

    Example: hyperplan plan llama3-70b --cluster cloudmatrix384 --devices 64 --global-batch 256 --seq-len 4096
    """
    if mode != "train":
        raise InvalidInput(f"--mode {mode}: only train is planned so far")
    overrides = opt.zoo_overrides(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, vocab=vocab,
                                  experts=experts, top_k=top_k)
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=err_console,
                  transient=True, disable=not err_console.is_terminal) as bar:
        task = bar.add_task(f"planning {model}", total=1.0)

        def progress(msg: str, frac: float) -> None:
            bar.update(task, completed=frac, description=msg[:60])

        result = plan_model(model, cluster=cluster, devices=devices, global_batch=global_batch, seq_len=seq_len,
                            dtype=dtype, time_limit_s=time_limit, overrides=overrides, dims=opt.parse_dims(dim),
                            progress=progress, memory_gib=memory_gib, offload=not no_offload, mpmd=not no_mpmd)
    if output:
        request = Request(model=model, cluster=cluster, overrides=overrides, dims=opt.parse_dims(dim),
                          memory_gib=memory_gib)
        write_document(declare_plan(result, request), output, protect=(model, cluster))
    if as_json:
        typer.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    print_plan(result)
    if output:
        console.print(f"HyperShard declaration written to {output}")


def print_plan(r: dict) -> None:
    s = r["strategy"]
    mp = r.get("mpmd")
    if mp and mp["used"]:
        console.print(f"[bold]plan:[/] {len(r['programs'])} programs on disjoint device groups (HyperMPMD), "
                      f"step {mp['step_time_s']:.3f} s vs {mp['spmd_step_time_s'] or float('nan'):.3f} s as one program; "
                      f"imbalance {mp['imbalance']:.2f}")
        t = Table(title="programs", title_justify="left")
        for c in ("program", "devices", "ranks", "strategy", "step s"):
            t.add_column(c)
        for p in r["programs"]:
            t.add_row(p["name"], str(p["devices"]), f"{p['ranks'][0]}-{p['ranks'][1]}", p["strategy"]["summary"],
                      f"{p['estimate']['step_time_s']:.3f}")
        console.print(t)
        est = dict(r["estimate"])
        est.update({k: r[k] for k in ("model", "cluster", "workload")})
        est["strategy"] = s
        print_estimate(est)
        return
    console.print(f"[bold]plan:[/] {s['summary']}")
    if mp:
        console.print(f"HyperMPMD (encoders on their own devices) was {mp['step_time_s'] / (r['estimate']['step_time_s']) - 1:.1%} "
                      "slower here: one program wins")
    mesh = " x ".join(f"{a['name']}={a['size']}" + (f" ({'+'.join(a['levels'])})" if a["levels"] else "")
                      for a in r["mesh"] if a["size"] > 1) or "one device"
    console.print(f"mesh: {mesh}")
    if s["pp"] > 1:
        cut = s["stage_layers"] or "even"
        console.print(f"pipeline: {s['pp']} stages{' x ' + str(s['vpp']) + ' chunks' if s['vpp'] > 1 else ''}, "
                      f"layers per chunk {cut}, schedule {'interleaved 1F1B' if s['vpp'] > 1 else s['schedule']}")
    console.print(f"recompute: {s['recompute']}; ZeRO-{s['zero']}; micro-batch {s['micro_batch']} "
                  f"({r['estimate']['microbatches']} per step); sequence parallel: {'yes' if s['sp'] else 'no'}")
    est = dict(r["estimate"])
    est.update({k: r[k] for k in ("model", "cluster", "workload")})
    est["strategy"] = s
    print_estimate(est)
    if r["runners_up"]:
        t = Table(title="runners-up (best of each other mesh)", title_justify="left")
        t.add_column("strategy")
        t.add_column("step s", justify="right")
        t.add_column("why it lost")
        for c in r["runners_up"]:
            t.add_row(c["summary"], f"{c['step_time_s']:.3f}" if c["step_time_s"] else "-", c["why"])
        console.print(t)
    sr = r["search"]
    console.print(f"searched {sr['evaluated']} strategies over {sr['meshes']} meshes"
                  f"{'' if sr['complete'] else ' (stopped by --time-limit)'}; layout solver gap {sr['layout_solver_gap']:.2%}")
