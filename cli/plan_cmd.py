"""`hyperplan plan MODEL --cluster C ...`: search the fastest strategy that fits; tables, JSON, or a file."""

from __future__ import annotations

import json
from typing import Annotated, Any, Optional

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from cli import options as opt
from cli.arch_options import architecture_options
from cli import render
from cli.errors import err_console, guarded
from cli.estimate_cmd import parse_offload, parse_stage_tp, print_estimate
from cost_models import load_cluster
from planner import bounds
from planner.api import plan_inference, plan_model
from planner.errors import Infeasible, InvalidInput
from planner.hypershard import Request, declare_plan, declare_serving, write_document
from planner.hypershard.io import check_output, check_suffix, read_constraints
from planner.hypershard.backends import LAUNCH, TRAINING_LAUNCH, export, launch_configs, mode_problem, plan_limits
from planner.hypershard.backends.launch import mpmd_what
from planner.hypershard.document import DECLARED_MPMD
from planner.search.constraints import LAUNCH_LIMITS, merge as merge_constraints
from planner.strategy import run_lengths

console = render.LiveConsole(highlight=False, soft_wrap=False)


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_cmd)


_INFER = "Inference (--mode infer)"
_FIX = "Constraints (fixed; the search chooses the rest)"
_SOLVER_HELP = "Solver of the per-op layout integer program: highs or cpsat (the same optimum)."


@guarded
@architecture_options
def plan_cmd(
    model: opt.Model,
    cluster: opt.Cluster,
    global_batch: Annotated[Optional[int], typer.Option("--global-batch", help="Sequences per training step "
                                                        "(--mode train).", show_default=False)] = None,
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", help="Tokens per sequence (--mode train).",
                                                   show_default=False)] = None,
    devices: opt.Devices = None,
    mode: Annotated[str, typer.Option("--mode", help="What to plan: train, or infer (serving: prefill and "
                                      "decode device groups, layouts and batches).")] = "train",
    prompt_len: Annotated[Optional[int], typer.Option("--prompt-len", help="Prompt tokens per request.",
                                                      rich_help_panel=_INFER, show_default=False)] = None,
    gen_len: Annotated[Optional[int], typer.Option("--gen-len", help="Generated tokens per request.",
                                                   rich_help_panel=_INFER, show_default=False)] = None,
    batch: Annotated[Optional[int], typer.Option("--batch", help="Sequences per data-parallel replica per step "
                                                 "(instead of latency targets).", rich_help_panel=_INFER,
                                                 show_default=False)] = None,
    ttft_ms: Annotated[Optional[float], typer.Option("--ttft-ms", help="Time to first token target: the prefill "
                                                     "of a batch of prompts.", rich_help_panel=_INFER,
                                                     show_default=False)] = None,
    tpot_ms: Annotated[Optional[float], typer.Option("--tpot-ms", help="Time per output token target: one "
                                                     "decode step.", rich_help_panel=_INFER,
                                                     show_default=False)] = None,
    kv_dtype: Annotated[str, typer.Option("--kv-dtype", help="KV-cache precision: bf16, fp16, fp8 or int8.",
                                          rich_help_panel=_INFER)] = "bf16",
    uneven_experts: Annotated[bool, typer.Option("--uneven-experts", help="Let a MoE phase spread its routed "
                                                 "experts over any stage width, in uneven ranges (as vLLM and "
                                                 "SGLang can); only the torch and onnx exports write those.",
                                                 rich_help_panel=_INFER)] = False,
    time_limit: Annotated[Optional[float], typer.Option(
        "--time-limit", help="Stop a search that would take longer than this many seconds: the best plan so far is "
                             "returned, marked incomplete with its gap. Default: no limit but the work budget "
                             "(20,000 costings), which ends every search, so that the same inputs give the same plan "
                             "on an idle or a busy machine; the slowest zoo searches take one to two minutes.",
        show_default=False)] = None,
    tp: Annotated[Optional[int], typer.Option("--tp", help="Tensor-parallel degree.", rich_help_panel=_FIX,
                                              show_default=False)] = None,
    pp: Annotated[Optional[int], typer.Option("--pp", help="Pipeline stages.", rich_help_panel=_FIX,
                                              show_default=False)] = None,
    cp: Annotated[Optional[int], typer.Option("--cp", help="Context-parallel degree.", rich_help_panel=_FIX,
                                              show_default=False)] = None,
    ep: Annotated[Optional[int], typer.Option("--ep", help="Expert-parallel degree.", rich_help_panel=_FIX,
                                              show_default=False)] = None,
    etp: Annotated[Optional[int], typer.Option("--etp", help="Expert tensor-parallel degree.", rich_help_panel=_FIX,
                                               show_default=False)] = None,
    vpp: Annotated[Optional[int], typer.Option("--vpp", help="Interleaved chunks per stage.", rich_help_panel=_FIX,
                                               show_default=False)] = None,
    dp: Annotated[Optional[int], typer.Option("--dp", help="Data-parallel degree.", rich_help_panel=_FIX,
                                              show_default=False)] = None,
    micro_batch: Annotated[Optional[int], typer.Option("--micro-batch", help="Sequences per micro-batch.",
                                                       rich_help_panel=_FIX, show_default=False)] = None,
    recompute: Annotated[Optional[str], typer.Option("--recompute", help="none, selective or full (no per-layer "
                                                     "mix then).", rich_help_panel=_FIX, show_default=False)] = None,
    zero: Annotated[Optional[int], typer.Option("--zero", help="ZeRO stage 0-3.", rich_help_panel=_FIX,
                                                show_default=False)] = None,
    stage_tp: Annotated[Optional[str], typer.Option("--stage-tp", metavar="TP,TP,...", help="A tensor degree per "
                                                    "pipeline stage (sets --pp and --tp).", rich_help_panel=_FIX,
                                                    show_default=False)] = None,
    offload: Annotated[Optional[list[str]], typer.Option("--offload", metavar="CLASS=FRACTION", help="Fixed offload "
                                                         "fractions (params, grads, optimizer, activations), e.g. "
                                                         "--offload optimizer=1; --no-offload: none.",
                                                         rich_help_panel=_FIX, show_default=False)] = None,
    constraints_file: Annotated[Optional[str], typer.Option(
        "--constraints", metavar="FILE", help="Fix the knobs of a plan file's constraints: section (a declaration "
        "`plan -o` wrote with constraints, or a .yaml/.json holding that section, e.g. constraints: {tp: 8, pp: 4}); "
        "the flags above add to it.", rich_help_panel=_FIX, show_default=False)] = None,
    solver: Annotated[str, typer.Option("--solver", help=_SOLVER_HELP)] = "highs",
    backend: Annotated[Optional[str], typer.Option(
        "--backend", help="Search only what this export backend runs (torch: a MoE model at etp 1 and cp 1, its "
        "experts whole on each tensor rank, or split over data-parallel ranks at tp 1; a model whose linear "
        "weights are stored input-major (GPT-2's Conv1D) at tp 1; jax: no pipeline, no offload; megatron: optimizer "
        "offload with its distributed optimizer (ZeRO-1, or one data-parallel rank) and whole layers' activations "
        "with one stage and no recompute; deepspeed: ZeRO-Offload's optimizer states (a fraction under ZeRO-3 only), "
        "parameters under ZeRO-3, gradients beside all the states, and fully recomputed layers' activations, each "
        "whole; torchtitan: parameters, gradients and optimizer states together, under ZeRO; mindformers: all "
        "activations; all four: one "
        "program, one tensor width for every pipeline stage, "
        "recompute as the framework runs it (full "
        "recompute of some layers only beside none on megatron and mindformers, not at all on torchtitan and "
        "deepspeed; no selective on mindformers and deepspeed), and deepspeed no pipeline, context or sequence "
        "parallelism and experts over data-parallel ranks only, torchtitan ZeRO >= 1 beside tp, pp or cp), and "
        "check the plan exports to it.",
        rich_help_panel=_FIX,
        show_default=False)] = None,
    output: Annotated[Optional[str], typer.Option("-o", "--output", help="Write the HyperShard declaration to a "
                                                  ".yaml or .json file (`hyperplan validate` / `export` read it); "
                                                  "with --mode infer, prefill and decode as two programs. A "
                                                  "declaration holds HyperMPMD's encoders | backbone split, so "
                                                  "with -o (or --backend) the attention | experts split of MoE "
                                                  "layers is not searched.")] = None,
    memory_gib: Annotated[Optional[float], typer.Option("--memory-gib", help="HBM a plan may use per device "
                                                        "(default: all of it), e.g. to leave room for the runtime.")] = None,
    no_offload: Annotated[bool, typer.Option("--no-offload", help="Keep everything in HBM: no HyperOffload of "
                                             "parameters, optimizer states, activations or (serving) the KV cache "
                                             "to host/pooled memory.")] = False,
    no_mpmd: Annotated[bool, typer.Option("--no-mpmd", help="Keep the whole model one program: no HyperMPMD device "
                                          "groups for vision/audio encoders beside the backbone; serving: prefill "
                                          "and decode co-located on every device.")] = False,
    force: opt.Force = False,
    dtype: opt.Dtype = "bf16",
    stack: opt.Stack = None,
    strict_ops: opt.StrictOps = False,
    as_json: opt.Json = False,
    overrides: Optional[dict[str, Any]] = None,
    dim: opt.Dim = None,
) -> None:
    """Find the strategy with the best step time that fits in memory, say why it won and how close to the best of
    the space it is proven to be.

    The space: every TP that divides the devices and each attention's query heads within the scale-up domain (KV
    heads replicated beyond theirs); every CP that cuts the sequence into 2 x CP equal chunks; every PP up to the
    layers (unequal layer counts; the balanced cut, the embedding or the head alone in an end stage allowed), DP
    what is left; for MoE every EP dividing the experts and the ranks MoE folding puts them on, ETP = TP or 1;
    every micro-batch that divides the batch per replica; every VPP that divides the layers per stage, or them
    with the embedding and the loss counted as a layer each (Megatron's accounted split); ZeRO 0-3;
    recompute none, selective, full or the first k layers of each chunk full; offload fractions per memory class
    in 5 % steps; per-op tensor layouts (an integer program); and stages of different tensor widths around the best
    pipelines. Branch and bound over it, with a lower bound on
    the step time of each region, proves the plan within 1 % of the best of the equal-width space ("optimal within
    X %"), unless --time-limit stops it first (then the plan is marked incomplete with the gap it reached).
    Constraints (--tp, --pp, ... --offload, or a plan file's constraints: section with --constraints FILE) fix
    knobs and the search chooses the rest. Runners-up within the estimate's error band of the plan's step (the
    hardware's held-out error, or the measured error of estimated layout ratios, whichever is larger) are named
    as close calls: measure them before choosing.

    With --mode infer it plans serving instead: prefill and decode on device groups sized by the search (or
    co-located), each with its TP/DP/PP/EP layout, batch and KV-cache offload, under --ttft-ms/--tpot-ms or
    at a given --batch.

    Example: hyperplan plan llama3-70b --cluster cloudmatrix384 --devices 64 --global-batch 256 --seq-len 4096

    Example: hyperplan plan deepseek-v3 --mode infer --cluster cloudmatrix384 --prompt-len 4096 --gen-len 1024
    --ttft-ms 2000 --tpot-ms 50 --dtype int8
    """
    bounds.request(model, [load_cluster(cluster, devices=bounds.devices("--devices", devices))],
                   global_batch=global_batch, seq_len=seq_len, prompt_len=prompt_len, gen_len=gen_len, batch=batch,
                   ttft_ms=ttft_ms, tpot_ms=tpot_ms, time_limit_s=time_limit, memory_gib=memory_gib,
                   overrides=overrides)
    if output:  # before the search, so that no work is lost to a file that may not be written
        check_suffix(output)
        check_output(output, "-o", protect=(model, cluster, stack), force=force, noun="declaration")
    if backend is not None and (why := mode_problem(backend, mode)):  # before the search
        raise InvalidInput(why)
    if mode == "infer":
        if any(v is not None for v in (tp, pp, cp, ep, etp, vpp, dp, micro_batch, recompute, zero, stage_tp, offload,
                                       constraints_file)):
            raise InvalidInput("--tp, --pp, ... --offload and --constraints fix a training plan; with --mode infer "
                               "drop them")
        _check_infer_flags(global_batch, seq_len, prompt_len, gen_len, batch, ttft_ms, tpot_ms, output)
        result = plan_inference(model, cluster=cluster, devices=devices, prompt_len=prompt_len, gen_len=gen_len,
                                batch=batch, ttft_ms=ttft_ms, tpot_ms=tpot_ms, dtype=dtype, kv_dtype=kv_dtype,
                                overrides=overrides, dims=opt.parse_dims(dim), memory_gib=memory_gib,
                                offload=not no_offload, disaggregate=not no_mpmd, even_experts=not uneven_experts)
        request = Request(model=model, cluster=cluster, overrides=overrides, dims=opt.parse_dims(dim),
                          memory_gib=memory_gib)
        if backend is not None:
            _check_exports(declare_serving(result, request, offload=not no_offload, disaggregate=not no_mpmd), backend)
        if output:
            write_document(declare_serving(result, request, offload=not no_offload, disaggregate=not no_mpmd),
                           output, protect=(model, cluster, stack))
        if as_json:
            typer.echo(json.dumps(result, indent=2, sort_keys=True))
        else:
            print_serving(result)
            if output:
                console.print(f"HyperShard declaration written to {output}")
        return
    if mode != "train":
        raise InvalidInput(f"--mode {mode}: use train or infer")
    given = [f for f, v in (("--prompt-len", prompt_len), ("--gen-len", gen_len), ("--batch", batch),
                            ("--ttft-ms", ttft_ms), ("--tpot-ms", tpot_ms)) if v is not None]
    given += [f for f, on in (("--kv-dtype", kv_dtype != "bf16"), ("--uneven-experts", uneven_experts)) if on]
    if given:
        verb, them = ("describes", "it") if len(given) == 1 else ("describe", "them")
        raise InvalidInput(f"{', '.join(given)} {verb} serving; add --mode infer, or drop {them} to plan training")
    fixed = {k: v for k, v in dict(tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, vpp=vpp, dp=dp, micro_batch=micro_batch,
                                   recompute=recompute, zero=zero).items() if v is not None}
    if stage_tp is not None:
        fixed["stage_tp"] = parse_stage_tp(stage_tp, pp, tp)
    if offload:
        fixed["offload"] = parse_offload(offload)
    if constraints_file is not None:
        from_file = read_constraints(constraints_file)
        if backend is not None:  # a plan file keeps its own backend's launch limits; --backend brings its own
            from_file = {k: v for k, v in from_file.items() if k not in LAUNCH_LIMITS}
        fixed = merge_constraints(from_file, fixed, constraints_file)
    if backend is not None:
        fixed = merge_constraints(plan_limits(backend), fixed, f"--backend {backend}",
                                  "export with another backend")
        no_mpmd = no_mpmd or backend in LAUNCH  # a launch config starts one program
    if global_batch is None or seq_len is None:
        missing = " and ".join(f for f, v in (("--global-batch", global_batch), ("--seq-len", seq_len)) if v is None)
        raise InvalidInput(f"{missing} {'is' if ' and ' not in missing else 'are'} needed to plan training; "
                           "give them, or --mode infer with --prompt-len and --gen-len to plan serving")
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=err_console.now(),
                  transient=True, disable=not err_console.is_terminal) as bar:
        task = bar.add_task(f"planning {model}", total=1.0)

        def progress(msg: str, frac: float) -> None:
            bar.update(task, completed=frac, description=msg[:60])

        result = plan_model(model, cluster=cluster, devices=devices, global_batch=global_batch, seq_len=seq_len,
                            dtype=dtype, time_limit_s=time_limit, overrides=overrides, dims=opt.parse_dims(dim),
                            progress=progress, memory_gib=memory_gib, offload=not no_offload,
                            # a declaration to write or export holds only the splits it can say
                            mpmd=not no_mpmd and (DECLARED_MPMD if output or backend else True),
                            stack=stack, strict_ops=strict_ops, constraints=fixed, solver=solver)
    request = Request(model=model, cluster=cluster, overrides=overrides, dims=opt.parse_dims(dim),
                      memory_gib=memory_gib)
    mp = result.get("mpmd") or {}
    if mp.get("used") and mp["kind"] not in DECLARED_MPMD:  # printed, not declared (no -o or --backend asked)
        names = [p["name"] for p in result["programs"]]
        result["launch_configs"] = dict.fromkeys(TRAINING_LAUNCH, mpmd_what(names))
    else:
        doc = declare_plan(result, request)
        if backend is not None:
            _check_exports(doc, backend)
        result["launch_configs"] = launch_configs(doc)
    if output:
        write_document(doc, output, protect=(model, cluster, stack))
    if as_json:
        typer.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    print_plan(result)
    if output:
        console.print(f"HyperShard declaration written to {output}")


def _check_exports(doc: dict, backend: str) -> None:
    """Infeasible when the plan found within --backend's limits still uses what that backend refuses."""
    try:
        export(doc, backend)
    except InvalidInput as exc:
        raise Infeasible(f"the best plan within --backend {backend}'s limits does not export to it: {exc}") from None


def print_plan(r: dict) -> None:
    s = r["strategy"]
    mp = r.get("mpmd")
    if mp and mp["used"]:
        alone = mp["spmd_step_time_s"]
        console.print(f"[bold]plan:[/] {len(r['programs'])} programs on disjoint device groups (HyperMPMD), "
                      f"step {render.seconds(mp['step_time_s'])} vs "
                      f"{render.seconds(alone) if alone else 'no fit'} as one program; imbalance {mp['imbalance']:.2f}")
        console.print(render.table("programs", ("program", "devices", "ranks", "strategy", "step"), (
            (p["name"], p["devices"], f"{p['ranks'][0]}-{p['ranks'][1]}", p["strategy"]["summary"],
             render.seconds(p["estimate"]["step_time_s"])) for p in r["programs"]), right=("devices", "step")))
        est = dict(r["estimate"])
        est.update({k: r[k] for k in ("model", "cluster", "workload", "accuracy", "assumptions", "warnings") if k in r})
        est["strategy"] = s
        print_estimate(est)
        if r.get("launch_configs"):
            console.print(render.launch_line(r["launch_configs"]))
        return
    console.print(f"[bold]plan:[/] {s['summary']}")
    if mp:
        label = mp.get("label", "encoders on their own devices")
        console.print(f"HyperMPMD ({label}) was {mp['step_time_s'] / (r['estimate']['step_time_s']) - 1:.1%} "
                      "slower here: one program wins")
    axes = [a for a in r["mesh"] if not a["name"].startswith("stage")]
    mesh = " x ".join(f"{a['name']}={a['size']}" + (f" ({'+'.join(a['levels'])})" if a["levels"] else "")
                      for a in axes if a["size"] > 1) or "one device"
    console.print(f"mesh: {mesh}" + (" (tp: the widest stage)" if s.get("stage_tp") else ""))
    if s["pp"] > 1:
        cut = tuple(s["stage_layers"] or ())
        alone = [what for what, n in (("embedding alone first", cut[:1]), ("head alone last", cut[-1:])) if n == (0,)]
        console.print(f"pipeline: {s['pp']} stages{' x ' + str(s['vpp']) + ' chunks' if s['vpp'] > 1 else ''}, "
                      f"{'interleaved 1F1B' if s['vpp'] > 1 else s['schedule']}, layers per chunk "
                      f"{run_lengths(cut) or 'even'}{' (' + ', '.join(alone) + ')' if alone else ''}")
    for a in r["mesh"]:
        if a["name"].startswith("stage"):  # stages of different widths: each its own block of ranks
            console.print(f"  {a['name']}: tp={a['tp']} ({'+'.join(a['levels']) or 'one device'}), "
                          f"{a['size']} devices, ranks {a['ranks'][0]}-{a['ranks'][1]}")
    full = s.get("full_recompute_layers", 0) if s["recompute"] != "full" else 0
    rc = f"full for {full} layers/chunk, {s['recompute']} for the rest" if full else s["recompute"]
    console.print(f"recompute: {rc}; ZeRO-{s['zero']}; micro-batch {s['micro_batch']} "
                  f"({r['estimate']['microbatches']} per step); sequence parallel: {'yes' if s['sp'] else 'no'}")
    est = dict(r["estimate"])
    est.update({k: r[k] for k in ("model", "cluster", "workload", "accuracy", "assumptions", "warnings") if k in r})
    est["strategy"] = s
    print_estimate(est)
    if r["runners_up"]:
        console.print(render.table("runners-up (best of each other mesh)", ("strategy", "step", "why it lost"), (
            (c["summary"], render.seconds(c["step_time_s"]) if c["step_time_s"] else "-", c["why"])
            for c in r["runners_up"]), right=("step",), prose=("why it lost",)))
        if r.get("close_calls"):
            console.print(r["close_calls"]["sentence"])
    if r.get("launch_configs"):
        console.print(render.launch_line(r["launch_configs"]))
    sr = r["search"]
    bound = f", bound {sr['bound_s']:.4g} s" if sr.get("bound_s") else ""
    console.print(f"searched {sr['evaluated']} strategies over {sr['meshes']} meshes ({sr.get('nodes', 0)} nodes, "
                  f"{sr.get('pruned', 0)} regions closed by their bound{bound}): {sr.get('optimal_within', '')}"
                  f"; layout solver gap {sr['layout_solver_gap']:.2%}")


def _check_infer_flags(global_batch, seq_len, prompt_len, gen_len, batch, ttft_ms, tpot_ms, output=None) -> None:
    """The flags of --mode infer: one sentence for each mistake, before any work."""
    if global_batch is not None or seq_len is not None:
        raise InvalidInput("--global-batch and --seq-len describe a training step; with --mode infer give "
                           "--prompt-len and --gen-len")
    missing = [f for f, v in (("--prompt-len", prompt_len), ("--gen-len", gen_len)) if v is None]
    if missing:
        raise InvalidInput(f"--mode infer needs {' and '.join(missing)} (tokens per request)")
    if batch is None and ttft_ms is None and tpot_ms is None:
        raise InvalidInput("--mode infer needs --batch, or latency targets --ttft-ms and --tpot-ms")
    if output:
        check_suffix(output)  # before planning, so no work is lost to a bad file name


def _ms(x: float | None) -> str:
    """A latency given in milliseconds, in the unit that fits it."""
    return "-" if x is None else render.seconds(x / 1000.0)


def print_serving(r: dict) -> None:
    """The serving plan: how the devices are split, then one column per phase."""
    w, pre, dec = r["workload"], r["prefill"], r["decode"]
    m = r["model"]
    console.print(f"[bold]serving {m['name']}[/] on {r['cluster']['devices']} devices of {r['cluster']['name']}: "
                  f"prompts of {w['prompt_len']} tokens, {w['gen_len']} generated, {w['dtype']} weights, "
                  f"{w['kv_dtype']} KV cache")
    if r["serving"] == "disaggregated":
        console.print(f"[bold]plan:[/] prefill on {pre['devices']} devices, decode on {dec['devices']} "
                      "(disaggregated: two programs)")
    else:
        console.print(f"[bold]plan:[/] prefill and decode co-located on all {dec['devices']} devices; "
                      f"decode gets {dec['decode_share']:.0%} of the time")
    rows = [
        ("devices", str(pre["devices"]), str(dec["devices"])),
        ("layout", pre["strategy"]["summary"], dec["strategy"]["summary"]),
        ("batch per replica", str(pre["batch_per_replica"]), str(dec["batch_per_replica"])),
        ("TTFT / TPOT", _ms(pre["ttft_ms"]), _ms(dec["tpot_ms"])),
        ("tokens/s per device", f"{pre['tokens_per_s_per_device']:,.0f}", f"{dec['tokens_per_s_per_device']:,.0f}"),
        ("KV cache per device", render.gib(pre["kv_cache_gib"]), render.gib(dec["kv_cache_gib"])),
        ("memory per device", f"{render.gib(pre['memory_gib']['total'])} of {render.gib(pre['usable_hbm_gib'])}",
         f"{render.gib(dec['memory_gib']['total'])} of {render.gib(dec['usable_hbm_gib'])}"),
        ("limited by", pre["limiter"].replace("_", " "), dec["limiter"].replace("_", " ")),
    ]
    off = dec["kv_offload"]
    if off["fraction"]:
        rows.append(("KV offloaded", "-", f"{off['fraction']:.0%} ({render.gib(off['offloaded_gib'])}, "
                                          f"{_ms(off['exposed_ms'])} exposed)"))
    console.print(render.table("phases", ("", "prefill", "decode"), rows, right=("prefill", "decode")))
    console.print(render.table("where a step goes (slowest stage)", ("", "prefill", "decode"), (
        (k.replace("_", " "), _ms(pre["breakdown_ms"][k]), _ms(dec["breakdown_ms"][k]))
        for k in sorted(pre["breakdown_ms"]) if pre["breakdown_ms"][k] or dec["breakdown_ms"][k]),
        right=("prefill", "decode")))
    console.print(f"{r['requests_per_s']:,.1f} requests/s: {r['output_tokens_per_s_per_device']:,.0f} output and "
                  f"{r['input_tokens_per_s_per_device']:,.0f} input tokens/s per device over all devices; "
                  f"KV cache {render.nbytes(r['kv_cache']['bytes_per_token'])} per token"
                  f"{' (latent, MLA)' if r['kv_cache']['latent'] else ''}")
    for alt in r["alternatives"]:
        console.print(f"{alt['serving']}: {alt['why']} (prefill {alt['prefill']}; decode {alt['decode']})")
    if r.get("accuracy"):
        console.print(f"checked: {r['accuracy']['sentence']}", markup=False)
    for note in r["notes"]:
        console.print(f"note: {note}")
