"""`hyperplan estimate MODEL --cluster C ...`: score one given strategy; tables or JSON."""

from __future__ import annotations

import json
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from cli import options as opt
from cli.arch_options import architecture_options
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


def parse_stage_tp(text: str | None, pp: int | None, tp: int | None) -> tuple[int, ...]:
    """`'4,8'` -> (4, 8): one tensor degree per pipeline stage, checked against --pp and --tp."""
    if text is None:
        return ()
    try:
        widths = tuple(int(x) for x in text.replace(" ", "").split(","))
    except ValueError:
        raise InvalidInput(f"--stage-tp {text!r}: give one whole tensor degree per pipeline stage, separated by "
                           "commas, like --stage-tp 4,8") from None
    if min(widths) < 1:
        raise InvalidInput(f"--stage-tp {text}: every stage's tensor degree must be at least 1")
    if len(widths) < 2:
        raise InvalidInput(f"--stage-tp {text} gives one stage; give a degree for each of two or more pipeline stages "
                           "(or use --tp for one width)")
    if pp is not None and pp != len(widths):
        raise InvalidInput(f"--stage-tp {text} gives {len(widths)} stages, but --pp is {pp}; give one degree per "
                           "stage (or drop --pp: it follows --stage-tp)")
    if tp is not None and tp != max(widths):
        raise InvalidInput(f"--tp {tp} with --stage-tp {text}: tp is then the widest stage's degree, "
                           f"{max(widths)}; drop --tp")
    return widths


_OptCluster = Annotated[Optional[str], typer.Option(
    "--cluster", help="A hardware preset (`hyperplan hardware list`) or a .toml file (with --plan: the file's).",
    show_default=False)]
_OptBatch = Annotated[Optional[int], typer.Option("--global-batch", help="Sequences per training step.",
                                                  show_default=False)]
_OptSeq = Annotated[Optional[int], typer.Option("--seq-len", help="Tokens per sequence.", show_default=False)]
_OptDtype = Annotated[Optional[str], typer.Option("--dtype", help="Compute precision: bf16, fp16, fp8 or fp32 "
                                                  "[default: bf16, or the --plan file's].", show_default=False)]


@guarded
@architecture_options
def estimate_cmd(
    model: opt.Model,
    cluster: _OptCluster = None,
    global_batch: _OptBatch = None,
    seq_len: _OptSeq = None,
    devices: opt.Devices = None,
    plan: Annotated[Optional[str], typer.Option(
        "--plan", help="Score the strategy of a HyperShard declaration (.yaml/.json; hand-edited ones too); its "
                       "cluster, devices and workload apply unless given here.", rich_help_panel=_PAR)] = None,
    tp: Annotated[Optional[int], typer.Option("--tp", help="Tensor-parallel degree. [default: 1]",
                                              rich_help_panel=_PAR, show_default=False)] = None,
    pp: Annotated[Optional[int], typer.Option("--pp", help="Pipeline stages. [default: 1]", rich_help_panel=_PAR,
                                              show_default=False)] = None,
    stage_tp: Annotated[Optional[str], typer.Option(
        "--stage-tp", metavar="TP,TP,...", help="A tensor-parallel degree per pipeline stage, when stages differ in "
        "width (e.g. 4,8: the first stage on 4 ranks per replica, the second on 8); sets --pp and --tp.",
        rich_help_panel=_PAR, show_default=False)] = None,
    dp: Annotated[Optional[int], typer.Option("--dp", help="Data-parallel degree (default: what the devices leave).",
                                              rich_help_panel=_PAR)] = None,
    cp: Annotated[Optional[int], typer.Option("--cp", help="Context-parallel degree (splits the sequence). "
                                              "[default: 1]", rich_help_panel=_PAR, show_default=False)] = None,
    ep: Annotated[Optional[int], typer.Option("--ep", help="Expert-parallel degree (over data x context ranks). "
                                              "[default: 1]", rich_help_panel=_PAR, show_default=False)] = None,
    etp: Annotated[Optional[int], typer.Option("--etp", help="Expert tensor-parallel degree (MoE parallel folding: "
                                               "the experts' tensor split; default: --tp, and 1 lets --ep span the "
                                               "tensor ranks).", rich_help_panel=_PAR, show_default=False)] = None,
    vpp: Annotated[Optional[int], typer.Option("--vpp", help="Interleaved chunks per stage (interleaved 1F1B). "
                                               "[default: 1]", rich_help_panel=_PAR, show_default=False)] = None,
    micro_batch: Annotated[Optional[int], typer.Option("--micro-batch", help="Sequences per micro-batch. "
                                                       "[default: 1]", rich_help_panel=_PAR, show_default=False)] = None,
    recompute: Annotated[Optional[str], typer.Option("--recompute", help="Activation recompute: none, selective or "
                                                     "full. [default: none]", rich_help_panel=_PAR,
                                                     show_default=False)] = None,
    full_recompute_layers: Annotated[Optional[int], typer.Option(
        "--full-recompute-layers", help="In each pipeline chunk, recompute the first N layers fully and the rest "
        "with --recompute (Megatron's --recompute-num-layers). [default: 0]", rich_help_panel=_PAR,
        show_default=False)] = None,
    sp: Annotated[Optional[bool], typer.Option("--sp", help="Sequence parallelism over the tensor axis.",
                                               rich_help_panel=_PAR, show_default=False)] = None,
    zero: Annotated[Optional[int], typer.Option("--zero", help="ZeRO stage 0-3 over the data-parallel group. "
                                                "[default: 0]", rich_help_panel=_PAR, show_default=False)] = None,
    schedule: Annotated[Optional[str], typer.Option("--schedule", help="Pipeline schedule: 1f1b or gpipe (--vpp > 1: "
                                                    "interleaved). [default: 1f1b]", rich_help_panel=_PAR,
                                                    show_default=False)] = None,
    offload: Annotated[Optional[list[str]], typer.Option(
        "--offload", metavar="CLASS=FRACTION",
        help="Keep a fraction of a memory class (params, grads, optimizer, activations) in host/pooled memory.",
        rich_help_panel=_PAR)] = None,
    dtype: _OptDtype = None,
    stack: opt.Stack = None,
    strict_ops: opt.StrictOps = False,
    as_json: opt.Json = False,
    overrides: Optional[dict[str, Any]] = None,
    dim: opt.Dim = None,
) -> None:
    """Step time, throughput, MFU, memory per device and a breakdown of one given strategy.

    Example: hyperplan estimate llama3-70b --cluster cloudmatrix384 --devices 64 --global-batch 256
    --seq-len 4096 --tp 8 --pp 4 --sp --recompute selective --zero 1

    Stages of different widths: hyperplan estimate llama3-8b --cluster dgx-h100 --devices 24 --global-batch 4
    --seq-len 8192 --stage-tp 4,8 --sp --zero 1

    Or score a (hand-edited) declaration: hyperplan estimate llama3-70b --plan plan.yaml
    """
    given = {"tp": tp, "pp": pp, "stage-tp": stage_tp, "dp": dp, "cp": cp, "ep": ep, "etp": etp, "vpp": vpp,
             "micro-batch": micro_batch, "recompute": recompute, "full-recompute-layers": full_recompute_layers,
             "sp": sp, "zero": zero, "schedule": schedule, "offload": offload}
    if plan is not None:
        clash = [f"--{k}" for k, v in given.items() if v is not None]
        if clash:
            raise InvalidInput(f"{', '.join(clash)} and --plan both set the strategy; edit the declaration or drop "
                               "--plan")
        from planner.hypershard.declared import estimate_declared

        with render.progress(f"estimating {model} with {plan} ..."):
            result = estimate_declared(plan, model, cluster=cluster, devices=devices, global_batch=global_batch,
                                       seq_len=seq_len, dtype=dtype, overrides=overrides, dims=opt.parse_dims(dim))
    else:
        missing = [flag for flag, v in (("--cluster", cluster), ("--global-batch", global_batch),
                                        ("--seq-len", seq_len)) if v is None]
        if missing:
            raise InvalidInput(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} needed (or --plan FILE "
                               "to take them from a declaration)")
        widths = parse_stage_tp(stage_tp, pp, tp)
        if widths:
            tp, pp = max(widths), len(widths)
        with render.progress(f"estimating {model} on {cluster} ..."):
            result = estimate_model(
                model, cluster=cluster, devices=devices, global_batch=global_batch, seq_len=seq_len,
                dtype=dtype or "bf16", tp=tp or 1, pp=pp or 1, stage_tp=widths, dp=dp, cp=cp or 1, ep=ep or 1,
                vpp=vpp or 1, micro_batch=micro_batch or 1, recompute=recompute or "none",
                full_recompute_layers=full_recompute_layers or 0, sp=bool(sp), zero=zero or 0,
                schedule=schedule or "1f1b", offload=parse_offload(offload), overrides=overrides,
                dims=opt.parse_dims(dim), stack=stack, strict_ops=strict_ops, etp=etp or 0,
            )
    if as_json:
        typer.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    print_result(result)


def print_result(r: dict) -> None:
    """An estimate, or a serving declaration's re-score (prefill and decode, as `plan` prints them)."""
    if r.get("mode") == "infer":
        from cli.plan_cmd import print_serving

        print_serving(r)
        return
    print_estimate(r)


def print_estimate(r: dict) -> None:
    """The human view of an estimate: headline, memory, breakdown, stages, layouts."""
    s = r["strategy"]
    progs = r.get("programs") or []
    what = f"{len(progs)} programs (HyperMPMD)" if progs else s["summary"]
    console.print(f"[bold]{r['model']['name']}[/] on [bold]{r['cluster']['name']}[/] x{r['cluster']['devices']}: "
                  f"{what}")
    if progs:
        pt = Table(title="programs, each on its own device group", title_justify="left")
        for c in ("program", "ranks", "strategy", "step s", "peak GiB"):
            pt.add_column(c, justify="right" if c in ("step s", "peak GiB") else "left")
        for p in progs:
            pt.add_row(p["name"], f"{p['ranks'][0]}-{p['ranks'][1]}", p["strategy"]["summary"],
                       f"{p['estimate']['step_time_s']:.4f}", f"{p['estimate']['memory_gib']['peak']:.1f}")
        console.print(pt)
    head = Table(show_header=False, box=None, pad_edge=False)
    head.add_row("step time", f"{r['step_time_s']:.3f} s  ({r['microbatches']} micro-batches)")
    head.add_row("throughput", f"{r['tokens_per_s']:,.0f} tokens/s")
    head.add_row("per device", f"{r['tflops_per_device']:.1f} TFLOP/s, MFU {r['mfu']:.1%}")
    mem = r["memory_gib"]
    fit = "fits" if r["fits"] else f"[bold red]does not fit: over by {r['over_gib']:.1f} GiB[/]"
    head.add_row("peak memory", f"{mem['peak']:.1f} GiB of {r['hbm_gib']:.0f} GiB HBM — {fit}")
    if r.get("workload", {}).get("stack"):
        head.add_row("stack", r["workload"]["stack"])
    console.print(head)
    for note in r.get("assumptions", ()):
        console.print(f"assumption: {note}", markup=False)

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

    if r.get("offload"):
        ot = Table(title="offload (HyperOffload) per memory class", title_justify="left")
        for c in ("class", "fraction", "off HBM GiB", "traffic GiB/step", "exposed s"):
            ot.add_column(c, justify="right" if c != "class" else "left")
        for cls, v in r["offload"].items():
            ot.add_row(cls, f"{v['fraction']:.0%}", f"{v['offloaded_gib']:.2f}", f"{v['traffic_gib_per_step']:.1f}",
                       f"{v['exposed_s']:.4f}")
        console.print(ot)

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
