"""`hyperplan estimate MODEL --cluster C ...`: score one given strategy; tables or JSON."""

from __future__ import annotations

import json
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape
from rich.text import Text

from cli import options as opt
from cli.arch_options import architecture_options
from cli import render
from cli.errors import guarded
from cost_models import load_cluster
from planner import bounds
from planner.api import estimate_model
from planner.errors import InvalidInput

console = render.LiveConsole(highlight=False, soft_wrap=False)
_PAR = "Parallel strategy"


def register(app: typer.Typer) -> None:
    app.command("estimate")(estimate_cmd)


def parse_offload(items: list[str] | None) -> tuple[tuple[str, float], ...]:
    """`['optimizer=0.5', 'params=1']` -> (('optimizer', 0.5), ('params', 1.0)): a training step's offload (a class
    alone means all of it; each class once)."""
    out: dict[str, float] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        try:
            frac = float(value) if sep else 1.0
        except ValueError:
            raise InvalidInput(f"--offload {item!r}: write CLASS=FRACTION, like --offload optimizer=0.5") from None
        name = name.strip()
        if name in out:
            raise InvalidInput(f"--offload {name} is given twice ({out[name]:g} and {frac:g}); give it once")
        if name == "kv_cache":
            raise InvalidInput("--offload kv_cache: a training step keeps no KV cache; serving plans (plan --mode "
                               "infer) offload it themselves")
        out[name] = frac
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


def parse_stage_layers(text: str | None) -> tuple[int, ...]:
    """`'0,1*126,0'` -> (0, 1, ..., 1, 0): decoder layers per pipeline chunk, N*K for K chunks of N."""
    if text is None:
        return ()
    out: list[int] = []
    try:
        for part in text.replace(" ", "").split(","):
            count, _, times = part.replace("×", "*").partition("*")
            n, k = int(count), int(times) if times else 1
            if n < 0 or k < 1:
                raise ValueError(part)
            out += [n] * k
    except ValueError:
        raise InvalidInput(f"--stage-layers {text!r}: give each pipeline chunk's decoder layers (pp x vpp chunks, "
                           "chunk c on stage c mod pp), separated by commas, N*K for K chunks of N, like "
                           "--stage-layers 0,1*126,0") from None
    return tuple(out)


_OptCluster = Annotated[Optional[str], typer.Option(
    "--cluster", help="A hardware preset (`hyperplan hardware list`) or a .toml file (with --plan: the file's).",
    show_default=False)]
_OptBatch = Annotated[Optional[int], typer.Option("--global-batch", help="Sequences per training step.",
                                                  show_default=False)]
_OptSeq = Annotated[Optional[int], typer.Option("--seq-len", help="Tokens per sequence.", show_default=False)]
_OptDtype = Annotated[Optional[str], typer.Option("--dtype", help="Compute precision: bf16, fp16, fp8 or fp32 "
                                                  "\\[default: bf16, or the --plan file's].", show_default=False)]


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
    tp: Annotated[Optional[int], typer.Option("--tp", help="Tensor-parallel degree. \\[default: 1]",
                                              rich_help_panel=_PAR, show_default=False)] = None,
    pp: Annotated[Optional[int], typer.Option("--pp", help="Pipeline stages. \\[default: 1]", rich_help_panel=_PAR,
                                              show_default=False)] = None,
    stage_tp: Annotated[Optional[str], typer.Option(
        "--stage-tp", metavar="TP,TP,...", help="A tensor-parallel degree per pipeline stage, when stages differ in "
        "width (e.g. 4,8: the first stage on 4 ranks per replica, the second on 8); sets --pp and --tp.",
        rich_help_panel=_PAR, show_default=False)] = None,
    stage_layers: Annotated[Optional[str], typer.Option(
        "--stage-layers", metavar="N,N*K,...", help="Decoder layers per pipeline chunk (pp x vpp of them, chunk c on "
        "stage c mod pp; N*K for K chunks of N), when not as even as possible; the first or last may be 0, the "
        "embedding or the loss alone, as Megatron splits when it counts them as layers (e.g. 0,1*126,0).",
        rich_help_panel=_PAR, show_default=False)] = None,
    dp: Annotated[Optional[int], typer.Option("--dp", help="Data-parallel degree (default: what the devices leave).",
                                              rich_help_panel=_PAR)] = None,
    cp: Annotated[Optional[int], typer.Option("--cp", help="Context-parallel degree (splits the sequence). "
                                              "\\[default: 1]", rich_help_panel=_PAR, show_default=False)] = None,
    ep: Annotated[Optional[int], typer.Option("--ep", help="Expert-parallel degree (over data x context ranks). "
                                              "\\[default: 1]", rich_help_panel=_PAR, show_default=False)] = None,
    etp: Annotated[Optional[int], typer.Option("--etp", help="Expert tensor-parallel degree (MoE parallel folding: "
                                               "the experts' tensor split; default: --tp, and 1 lets --ep span the "
                                               "tensor ranks).", rich_help_panel=_PAR, show_default=False)] = None,
    vpp: Annotated[Optional[int], typer.Option("--vpp", help="Interleaved chunks per stage (interleaved 1F1B). "
                                               "\\[default: 1]", rich_help_panel=_PAR, show_default=False)] = None,
    micro_batch: Annotated[Optional[int], typer.Option("--micro-batch", help="Sequences per micro-batch. "
                                                       "\\[default: 1]", rich_help_panel=_PAR, show_default=False)] = None,
    recompute: Annotated[Optional[str], typer.Option("--recompute", help="Activation recompute: none, selective or "
                                                     "full. \\[default: none]", rich_help_panel=_PAR,
                                                     show_default=False)] = None,
    full_recompute_layers: Annotated[Optional[int], typer.Option(
        "--full-recompute-layers", help="In each pipeline chunk, recompute the first N layers fully and the rest "
        "with --recompute (Megatron's --recompute-num-layers). \\[default: 0]", rich_help_panel=_PAR,
        show_default=False)] = None,
    sp: Annotated[Optional[bool], typer.Option("--sp", help="Sequence parallelism over the tensor axis.",
                                               rich_help_panel=_PAR, show_default=False)] = None,
    zero: Annotated[Optional[int], typer.Option("--zero", help="ZeRO stage 0-3 over the data-parallel group. "
                                                "\\[default: 0]", rich_help_panel=_PAR, show_default=False)] = None,
    schedule: Annotated[Optional[str], typer.Option("--schedule", help="Pipeline schedule: 1f1b or gpipe (--vpp > 1: "
                                                    "interleaved). \\[default: 1f1b]", rich_help_panel=_PAR,
                                                    show_default=False)] = None,
    flushes: Annotated[Optional[int], typer.Option(
        "--flushes", help="Pipeline schedules per step, each over an equal share of the micro-batches and ending in "
        "a flush (torchtitan's and NeMo Automodel's gradient-accumulation steps with --pp > 1). \\[default: 1]",
        rich_help_panel=_PAR, show_default=False)] = None,
    offload: Annotated[Optional[list[str]], typer.Option(
        "--offload", metavar="CLASS=FRACTION",
        help="Keep a fraction of a memory class (params, grads, optimizer, activations) in host/pooled memory.",
        rich_help_panel=_PAR)] = None,
    dtype: _OptDtype = None,
    stack: opt.Stack = None,
    strict_ops: opt.StrictOps = False,
    solver: Annotated[str, typer.Option("--solver", help="Solver of the per-op layout integer program: highs or "
                                        "cpsat (the same optimum).")] = "highs",
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
    bounds.degrees(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vpp=vpp, micro_batch=micro_batch, flushes=flushes)
    bounds.devices("--devices", devices)
    bounds.step_tokens(global_batch, seq_len)
    if full_recompute_layers is not None:
        bounds.whole("--full-recompute-layers", full_recompute_layers, "the layers fully recomputed per chunk",
                     least=0)
    given = {"tp": tp, "pp": pp, "stage-tp": stage_tp, "stage-layers": stage_layers, "dp": dp, "cp": cp, "ep": ep,
             "etp": etp, "vpp": vpp, "micro-batch": micro_batch, "recompute": recompute, "full-recompute-layers": full_recompute_layers,
             "sp": sp, "zero": zero, "schedule": schedule, "flushes": flushes, "offload": offload}
    if plan is not None:
        clash = [f"--{k}" for k, v in given.items() if v is not None]
        if clash:
            raise InvalidInput(f"{', '.join(clash)} and --plan both set the strategy; edit the declaration or drop "
                               "--plan")
        from planner.hypershard.declared import estimate_declared

        if seq_len is not None:  # a longer sequence than the file's is bounded as without --plan
            _bound_declared_sequence(plan, model, seq_len, cluster, devices, overrides, opt.parse_dims(dim))
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
        bounds.sequence("--seq-len", seq_len, model, load_cluster(cluster, devices=devices), overrides=overrides)
        with render.progress(f"estimating {model} on {cluster} ..."):
            result = estimate_model(
                model, cluster=cluster, devices=devices, global_batch=global_batch, seq_len=seq_len,
                dtype=dtype or "bf16", tp=_given(tp, 1), pp=_given(pp, 1), stage_tp=widths,
                stage_layers=parse_stage_layers(stage_layers), dp=dp, cp=_given(cp, 1),
                ep=_given(ep, 1), vpp=_given(vpp, 1), micro_batch=_given(micro_batch, 1),
                recompute=_given(recompute, "none"), full_recompute_layers=_given(full_recompute_layers, 0),
                sp=bool(sp), zero=_given(zero, 0), schedule=_given(schedule, "1f1b"), flushes=_given(flushes, 1),
                offload=parse_offload(offload),
                overrides=overrides, dims=opt.parse_dims(dim), stack=stack, strict_ops=strict_ops, etp=_given(etp, 0),
                solver=solver,
            )
    if as_json:
        typer.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    print_result(result)


def _bound_declared_sequence(plan, model, seq_len, cluster, devices, overrides, dims) -> None:
    """`bounds.sequence` on the cluster and model the declaration would be scored on (its own unless given)."""
    import os

    from planner.hypershard.declared import is_serving, request_on
    from planner.hypershard.io import read_document

    doc = read_document(plan)
    if is_serving(doc):
        return  # refused with its own sentence: a serving declaration takes no --seq-len
    req = request_on(doc, model, base_dir=os.path.dirname(os.path.abspath(plan)), cluster=cluster,
                     overrides=overrides, dims=dims)
    hw = load_cluster(req.cluster, devices=devices or doc["cluster"]["devices"])
    bounds.sequence("--seq-len", seq_len, model, hw, overrides=req.overrides)


def _given(value, default):
    """The option's value, or `default` when it was not given (0 is a value, refused by the bounds, not 'unset')."""
    return default if value is None else value


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
    console.print(f"[bold]{escape(r['model']['name'])}[/] on [bold]{escape(r['cluster']['name'])}[/] "
                  f"x{r['cluster']['devices']}: {escape(what)}")
    if progs:
        console.print(render.table("programs, each on its own device group", (
            "program", "ranks", "strategy", "step", "peak"), (
            (p["name"], f"{p['ranks'][0]}-{p['ranks'][1]}", p["strategy"]["summary"],
             render.seconds(p["estimate"]["step_time_s"]), render.gib(p["estimate"]["memory_gib"]["peak"]))
            for p in progs), right=("step", "peak")))
    mem = r["memory_gib"]
    reserve = r.get("workload", {}).get("allocator_reserve", 0.0)
    if reserve:  # the peak counts tensors; the usable HBM is what the allocator leaves them
        peak = Text(f"{render.gib(mem['peak'])} of tensors, {render.gib(r['hbm_gib'])} usable ({reserve:.1%} of "
                    "HBM kept by the allocator): ")
    else:
        peak = Text(f"{render.gib(mem['peak'])} of {render.gib(r['hbm_gib'])} HBM: ")
    short_of = r.get("short_of") or {}  # HBM short: the line already gives both figures, so say by how much
    short = f"over by {render.gib(r['over_gib'])}" if short_of.get("tier", "HBM") == "HBM" else short_of["why"]
    peak.append("fits" if r["fits"] else f"does not fit: {short}",
                style="" if r["fits"] else "bold red")
    m = r["microbatches"]
    head = [("step time", f"{render.seconds(r['step_time_s'])} ({m} micro-batch{'' if m == 1 else 'es'})"),
            ("throughput", f"{r['tokens_per_s']:,.0f} tokens/s"),
            ("per device", f"{render.sig(r['tflops_per_device'])} TFLOP/s, MFU {r['mfu']:.1%}"),
            ("peak memory", peak)]
    if r.get("workload", {}).get("stack"):
        head.append(("stack", r["workload"]["stack"]))
    if r.get("accuracy"):  # how far off the held-out runs of this hardware and kind of job came out
        head.append(("checked", r["accuracy"]["sentence"]))
        if r["accuracy"].get("published_sentence"):  # and this very model's published runs on it
            head.append(("published", r["accuracy"]["published_sentence"]))
        if r["accuracy"].get("bridge_sweep_sentence"):  # and every Megatron-Bridge table row of it there
            head.append(("tables", r["accuracy"]["bridge_sweep_sentence"]))
    console.print(render.kv_table("", head))
    for note in r.get("assumptions", ()):
        console.print(f"assumption: {note}", markup=False)
    for note in r.get("warnings", ()):
        console.print(f"warning: {note}", markup=False, style="yellow")
    console.print(memory_table(mem))

    total = r["step_time_s"]
    parts = [(k, render.seconds(v), f"{v / total:.1%}") for k, v in r["breakdown_s"].items() if v > 0]
    console.print(render.table("step time breakdown", ("part", "time", "share"),
                               [*parts, (Text("step", style="bold"), Text(render.seconds(total), style="bold"),
                                         "100%")], right=("time", "share")))

    if r.get("offload"):
        console.print(render.table(
            "offload traffic (HyperOffload) per memory class, in the stage that sets the step",
            ("class", "fraction", "traffic per step", "exposed"),
            ((cls, f"{v['fraction']:.0%}", render.gib(v["traffic_gib_per_step"]), render.seconds(v["exposed_s"]))
             for cls, v in r["offload"].items()), right=("fraction", "traffic per step", "exposed")))

    if len(r["stages"]) > 1:
        console.print(render.table("pipeline stages", ("stage", "layers", "devices", "fwd/mb", "bwd/mb", "peak"), (
            (x["stage"], x["layers"], x["devices"], render.seconds(x["forward_s"]), render.seconds(x["backward_s"]),
             render.gib(x["memory_gib"]["peak"])) for x in r["stages"]),
            right=("stage", "layers", "devices", "fwd/mb", "bwd/mb", "peak")))

    if r["layouts"]:
        experts = r.get("expert_layouts") or {}
        rows = [(btype if i == 0 else "", p, experts.get(btype, {}).get(p, lay))
                for btype, entries in r["layouts"].items() for i, (p, lay) in enumerate(entries.items())]
        legend = "S<d>: split on dim d over TP, R: replicated"
        if experts:
            legend += "; routed experts: EP<n> dealt over n ranks, ETP<n> each split over n"
        console.print(render.table(f"tensor-parallel layouts ({legend})", ("block type", "parameter", "layout"), rows))


def memory_table(mem: dict) -> render.Adaptive:
    """Memory per device by kind: what stays in HBM adds up to the peak; what is offloaded to host or pooled
    memory is its own column (not part of the peak)."""
    kinds = list(dict.fromkeys(k.removeprefix("offloaded_") for k in mem if k != "peak"))
    offloaded = any(k.startswith("offloaded_") and v for k, v in mem.items())
    rows = []
    for k in kinds:
        row = [k, render.gib(mem.get(k, 0.0))]
        if offloaded:
            row.append(render.gib(mem.get(f"offloaded_{k}", 0.0)))
        rows.append(row)
    total = [Text("peak (HBM)", style="bold"), Text(render.gib(mem["peak"]), style="bold")]
    if offloaded:
        total.append(Text(render.gib(sum(v for k, v in mem.items() if k.startswith("offloaded_"))), style="bold"))
    cols = ("kind", "in HBM") + (("offloaded",) if offloaded else ())
    return render.table("memory per device (worst stage)", cols, [*rows, total], right=cols[1:])
