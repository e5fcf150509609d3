"""`hyperplan estimate MODEL --cluster C ...`: score one given strategy; tables or JSON."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from cli import options as opt
from cli import render
from cli.errors import guarded
from planner.api import estimate_model
from planner.errors import InvalidInput

console = Console(highlight=False, soft_wrap=False)
_PAR = "Parallel strategy"


def register(app: typer.Typer) -> None:
    app.command("estimate")(estimate_cmd)


def parse_offload(items: list[str] | None) -> tuple[tuple[str, float], ...]:
    """`['optimizer=0.5', 'params=1']` -> (('optimizer', 0.5), ('params', 1.0))."""
    out: dict[str, float] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        try:
            frac = float(value) if sep else 1.0
        except ValueError:
            raise InvalidInput(f"--offload {item!r}: write CLASS=FRACTION, like --offload optimizer=0.5") from None
        out[name.strip()] = frac
    return tuple(sorted(out.items()))


@guarded
def estimate_cmd(
    model: opt.Model,
    cluster: opt.Cluster,
    global_batch: opt.GlobalBatch,
    seq_len: opt.RequiredSeqLen,
    devices: opt.Devices = None,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel degree.", rich_help_panel=_PAR)] = 1,
    pp: Annotated[int, typer.Option("--pp", help="Pipeline stages.", rich_help_panel=_PAR)] = 1,
    dp: Annotated[Optional[int], typer.Option("--dp", help="Data-parallel degree (default: what the devices leave).",
                                              rich_help_panel=_PAR)] = None,
    cp: Annotated[int, typer.Option("--cp", help="Context-parallel degree (splits the sequence).",
                                    rich_help_panel=_PAR)] = 1,
    ep: Annotated[int, typer.Option("--ep", help="Expert-parallel degree (over data x context ranks).",
                                    rich_help_panel=_PAR)] = 1,
    vpp: Annotated[int, typer.Option("--vpp", help="Interleaved chunks per stage (interleaved 1F1B).",
                                     rich_help_panel=_PAR)] = 1,
    micro_batch: Annotated[int, typer.Option("--micro-batch", help="Sequences per micro-batch.",
                                             rich_help_panel=_PAR)] = 1,
    recompute: Annotated[str, typer.Option("--recompute", help="Activation recompute: none, selective or full.",
                                           rich_help_panel=_PAR)] = "none",
    sp: Annotated[bool, typer.Option("--sp", help="Sequence parallelism over the tensor axis.",
                                     rich_help_panel=_PAR)] = False,
    zero: Annotated[int, typer.Option("--zero", help="ZeRO stage 0-3 over the data-parallel group.",
                                      rich_help_panel=_PAR)] = 0,
    schedule: Annotated[str, typer.Option("--schedule", help="Pipeline schedule: 1f1b or gpipe (--vpp > 1: interleaved).",
                                          rich_help_panel=_PAR)] = "1f1b",
    offload: Annotated[Optional[list[str]], typer.Option(
        "--offload", metavar="CLASS=FRACTION",
        help="Keep a fraction of a memory class (params, grads, optimizer, activations) in host/pooled memory.",
        rich_help_panel=_PAR)] = None,
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
    """Step time, throughput, MFU, memory per device and a breakdown of one given strategy.

    Example: hyperplan estimate llama3-70b --cluster cloudmatrix384 --devices 64 --global-batch 256
    --seq-len 4096 --tp 8 --pp 4 --sp --recompute selective --zero 1
    """
    overrides = opt.zoo_overrides(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, vocab=vocab,
                                  experts=experts, top_k=top_k)
    with render.progress(f"estimating {model} on {cluster} ..."):
        result = estimate_model(
            model, cluster=cluster, devices=devices, global_batch=global_batch, seq_len=seq_len, dtype=dtype,
            tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vpp, micro_batch=micro_batch, recompute=recompute, sp=sp,
            zero=zero, schedule=schedule, offload=parse_offload(offload), overrides=overrides,
            dims=opt.parse_dims(dim),
        )
    if as_json:
        typer.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    print_estimate(result)


def print_estimate(r: dict) -> None:
    """The human view of an estimate: headline, memory, breakdown, stages, layouts."""
    s = r["strategy"]
    console.print(f"[bold]{r['model']['name']}[/] on [bold]{r['cluster']['name']}[/] x{r['cluster']['devices']}: "
                  f"{s['summary']}")
    head = Table(show_header=False, box=None, pad_edge=False)
    head.add_row("step time", f"{r['step_time_s']:.3f} s  ({r['microbatches']} micro-batches)")
    head.add_row("throughput", f"{r['tokens_per_s']:,.0f} tokens/s")
    head.add_row("per device", f"{r['tflops_per_device']:.1f} TFLOP/s, MFU {r['mfu']:.1%}")
    mem = r["memory_gib"]
    fit = "fits" if r["fits"] else f"[bold red]does not fit: over by {r['over_gib']:.1f} GiB[/]"
    head.add_row("peak memory", f"{mem['peak']:.1f} GiB of {r['hbm_gib']:.0f} GiB HBM — {fit}")
    console.print(head)

    mt = Table(title="memory per device (worst stage)", title_justify="left")
    mt.add_column("kind")
    mt.add_column("GiB", justify="right")
    for k, v in mem.items():
        if k != "peak":
            mt.add_row(k, f"{v:.2f}")
    console.print(mt)

    bt = Table(title="step time breakdown", title_justify="left")
    bt.add_column("part")
    bt.add_column("seconds", justify="right")
    bt.add_column("share", justify="right")
    total = r["step_time_s"]
    for k, v in r["breakdown_s"].items():
        if v > 0:
            bt.add_row(k, f"{v:.4f}", f"{v / total:.1%}")
    bt.add_row("[bold]step[/]", f"[bold]{total:.4f}[/]", "100%")
    console.print(bt)

    if len(r["stages"]) > 1:
        st = Table(title="pipeline stages", title_justify="left")
        for c in ("stage", "layers", "devices", "fwd s/mb", "bwd s/mb", "peak GiB"):
            st.add_column(c, justify="right")
        for x in r["stages"]:
            st.add_row(str(x["stage"]), str(x["layers"]), str(x["devices"]), f"{x['forward_s']:.4f}",
                       f"{x['backward_s']:.4f}", f"{x['memory_gib']['peak']:.1f}")
        console.print(st)

    if r["layouts"]:
        lt = Table(title="tensor-parallel layouts (S<d>: split on dim d, R: replicated)", title_justify="left")
        lt.add_column("block type")
        lt.add_column("parameter")
        lt.add_column("layout")
        for btype, rows in r["layouts"].items():
            for i, (p, lay) in enumerate(rows.items()):
                lt.add_row(btype if i == 0 else "", p, lay)
        console.print(lt)
