"""The public entry points: what the CLI calls and what a user can call.

`load_graph` accepts what every command accepts as MODEL: a path to an ONNX
file, a Hugging Face config.json (or the folder holding one), or the name of
a zoo model; the last two are built weightless, with overrides
(`planner.model_source` tells them apart). Heavy imports (onnx, the zoo)
happen inside the functions so `import planner` stays fast.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from planner import bounds
from planner.bounds import zoo_overrides
from planner.caveats import accuracy, assumptions, check_costed, scale_warnings, stack_warnings, uncosted_note
from planner.costing.attention import attention_regions
from planner.costing.pipeline_cut import even_split
from planner.costing.rotary import scaled_rotary_nodes
from planner.errors import InvalidInput
from planner.graph.ir import Graph
from planner.graph.moe import moe_blocks, token_wide_params
from planner.graph.walk import index_graph
from planner.model_source import build_weightless, content_file, display_name, kind_of, takes, unknown_message
from planner.units import nbytes


def zoo_names() -> list[str]:
    """Names the zoo can build (empty if the zoo lists none)."""
    import models_zoo

    names = getattr(models_zoo, "names", None)
    return sorted(names()) if callable(names) else []


def load_graph(
    model: str | os.PathLike,
    *,
    batch: int | None = None,
    seq_len: int | None = None,
    dims: Mapping[str, int] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Graph:
    """The costed graph of an ONNX file, a Hugging Face config.json or a zoo model.

    A file binds its symbolic dims from `dims`, `batch` and `seq_len`; a zoo
    model or a config.json is built at `batch`/`seq_len` with the
    architecture `overrides` (layers, hidden, heads, ...). Raises
    InvalidInput for anything else.
    """
    from planner.graph.onnx_import import import_model

    overrides = {k: v for k, v in sorted((overrides or {}).items()) if v is not None}
    text = os.fspath(model)
    kind = kind_of(text)
    if kind == "onnx":
        if overrides:
            flags = ", ".join(f"--{k.replace('_', '-')}" for k in overrides)
            verb, them = ("changes", "it") if len(overrides) == 1 else ("change", "them")
            raise InvalidInput(f"{flags} {verb} only zoo models and config.json files, and '{text}' is an ONNX "
                               f"file; drop {them} or edit the model itself")
        return import_model(text, dims=dims, batch=batch, seq_len=seq_len)
    if kind == "unknown":
        raise InvalidInput(unknown_message(text, zoo_names()))
    what = "a Hugging Face config" if kind == "hf_config" else "a zoo model"
    if dims:
        raise InvalidInput(f"--dim applies to ONNX files, and '{text}' is {what}; "
                           "use --seq-len or the architecture options (--layers, --hidden, ...) instead")
    zoo_overrides(text, overrides)
    settings = dict(overrides)
    for key, value in (("batch", batch), ("seq_len", seq_len)):
        if value is not None and key not in settings and takes(text, key, value):
            settings[key] = value  # image models (ViT) have no sequence length: their tokens are patches
    return import_model(build_weightless(text, settings), name=text, built=True)


def _graph_for_costing(model: str | os.PathLike, seq_len: int, dims: Mapping[str, int] | None,
                       overrides: Mapping[str, Any] | None) -> Graph:
    """`load_graph` at batch 1, remembered for the process: a what-if sweep plans one model many times.

    Files (an ONNX file, a config.json) are keyed by path, size and modification time, so an edited file is
    read again.
    """
    text = os.fspath(model)
    stamp = _stamp(text)
    key = (text, stamp, seq_len, tuple(sorted((dims or {}).items())), tuple(sorted((overrides or {}).items())))
    hit = _GRAPHS.get(key)
    if hit is None:
        hit = load_graph(model, batch=1, seq_len=seq_len, dims=dims, overrides=overrides)
        if len(_GRAPHS) >= 4:
            _GRAPHS.pop(next(iter(_GRAPHS)))
        _GRAPHS[key] = hit
    return hit


def _stamp(text: str) -> tuple[int, int] | None:
    """(size, mtime) of the file that holds the model; None for a zoo name."""
    path = content_file(text)
    if path is None:
        return None
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


_GRAPHS: dict[tuple, Graph] = {}


def _build_zoo(name: str, settings: Mapping[str, Any]) -> Any:
    """The weightless graph of a zoo model or a config.json (see `planner.model_source.build_weightless`)."""
    return build_weightless(name, settings)


def estimate_model(
    model: str | os.PathLike,
    *,
    cluster: str,
    global_batch: int,
    seq_len: int,
    devices: int | None = None,
    dtype: str = "bf16",
    mode: str = "train",
    overrides: Mapping[str, Any] | None = None,
    dims: Mapping[str, int] | None = None,
    dp: int | None = None,
    stack: str | None = None,
    strict_ops: bool = False,
    solver: str = "highs",
    **strategy: Any,
) -> dict[str, Any]:
    """Score one strategy of a model on a cluster: the dict `hyperplan estimate --json` prints.

    `strategy` holds the degrees and policies of `planner.strategy.Strategy`
    (tp, pp, cp, ep, etp, vpp, micro_batch, recompute, sp, zero, schedule,
    offload). `dp` defaults to what the devices leave; `devices` defaults to
    the preset's size, or to what the degrees need when `dp` is given.
    `stack` is the software stack that runs it (a preset name or a stack
    .toml file; default: today's Megatron-Core). `strict_ops` refuses a graph
    with ops that have no FLOP rule instead of costing them by bytes moved.
    """
    from cost_models import load_cluster

    from planner.costing.estimate import estimate
    from planner.costing.moe_pairing import unpaired_warnings
    from planner.graph.blocks import discover_blocks
    from planner.graph.mtp import mtp_depths
    from planner.strategy import Strategy

    workload = make_workload(mode, global_batch, seq_len, dtype, stack)
    stage_tp = tuple(strategy.get("stage_tp") or ())
    inner = (sum(stage_tp) if stage_tp else strategy.get("tp", 1) * strategy.get("pp", 1)) * strategy.get("cp", 1)
    if devices is None and dp is not None:
        devices = inner * dp
    hw = load_cluster(cluster, devices=devices)
    if mode == "train":
        bounds.training_dtype(dtype, hw)
    if dp is None:
        dp, rem = divmod(hw.n_devices, inner)
        if rem or dp < 1:
            what = "sum(stage_tp) x cp" if stage_tp else "tp x pp x cp"
            raise InvalidInput(f"{what} = {inner} does not divide the {hw.n_devices} devices of {hw.name}; "
                               "change the degrees or pass --devices")
    strat = Strategy(dp=dp, **strategy)
    graph = _graph_for_costing(model, seq_len, dims, overrides)
    check_costed(graph, strict_ops)
    structure = discover_blocks(graph)
    if solver not in ("highs", "cpsat"):
        raise InvalidInput(f"--solver {solver!r}: use highs or cpsat")
    chunk = max(strat.stage_layers or even_split(len(structure.layers()), strat.pp * strat.vpp))
    if strat.full_recompute_layers > chunk:
        raise InvalidInput(f"--full-recompute-layers {strat.full_recompute_layers}: a pipeline chunk here holds at "
                           f"most {chunk} layers; give at most {chunk}, or --recompute full")
    est = estimate(graph, structure, hw, workload, strat, solver=solver)
    out = est.to_dict()
    out.update(_describe(model, graph, hw, workload, structure, as_shipped=_as_shipped(model, overrides, dims),
                         cp=strat.cp))
    out["warnings"] = scale_warnings(est.step_time_s, est.microbatches, workload.mode) + unpaired_warnings(
        strat, workload, mtp_depths(graph, structure)) + stack_warnings(strat, workload)
    from planner.plan import strategy_dict

    out["strategy"] = strategy_dict(strat)
    return out


def make_workload(mode: str, global_batch: int, seq_len: int, dtype: str, stack: str | None) -> Any:
    """The job: batch, length and precision, run by `stack` (a preset name or a stack file; None: the default)."""
    from planner.costing.execution import load_execution
    from planner.strategy import Workload

    return Workload(mode=mode, global_batch=global_batch, seq_len=seq_len, dtype=dtype,  # type: ignore[arg-type]
                    execution=load_execution(stack))


def _as_shipped(model: str | os.PathLike, overrides: Mapping[str, Any] | None, dims: Mapping[str, int] | None) -> bool:
    """Whether `model` is a zoo model as the zoo builds it (no overrides, no dimensions bound): its published runs
    are then its own."""
    return kind_of(model) == "zoo" and not overrides and not dims


def _describe(model: str | os.PathLike, graph: Graph, hw: Any, workload: Any, structure: Any,
              as_shipped: bool = False, cp: int | None = None) -> dict[str, Any]:
    """What an estimate rests on and how far off it may be; `as_shipped`: the model is a zoo name without overrides
    (its own published runs are then cited); `cp`: the layout's context-parallel degree, None when not one."""
    moe = any(t.kind == "moe" for t in structure.types)
    ex, index = workload.execution, index_graph(graph)
    biased = moe and ex.expert_bias_bytes > 0 and any(
        token_wide_params(graph, f) for f in moe_blocks(graph, index, structure).values())
    regions = attention_regions(graph)
    eager_rope = ex.fuse_elementwise and ex.scaled_rope_unfused and bool(scaled_rotary_nodes(graph, index).any())
    return {
        "accuracy": accuracy(hw, workload, moe, display_name(model) if as_shipped else None),
        "uncosted": graph.uncosted(),
        "model": {"name": display_name(model), "params": graph.param_count},
        "cluster": {"name": hw.name, "devices": hw.n_devices, "calibration": hw.calibration,
                    "fitted": hw.fitted},
        "workload": {"mode": workload.mode, "global_batch": workload.global_batch, "seq_len": workload.seq_len,
                     "dtype": workload.dtype, "stack": workload.execution.origin or workload.execution.name,
                     "allocator_reserve": workload.execution.allocator_reserve},
        "assumptions": assumptions(hw, workload, {r.head_dim for r in regions}, moe, biased,
                                   any(r.window for r in regions), eager_rope, cp is None or cp > 1)
        + ([uncosted_note(graph)] if graph.uncosted()["ops"] else []),
    }


def plan_model(
    model: str | os.PathLike,
    *,
    cluster: str,
    global_batch: int,
    seq_len: int,
    devices: int | None = None,
    dtype: str = "bf16",
    mode: str = "train",
    time_limit_s: float | None = None,
    overrides: Mapping[str, Any] | None = None,
    dims: Mapping[str, int] | None = None,
    progress: Any = None,
    memory_gib: float | None = None,
    offload: bool = True,
    mpmd: bool | tuple[str, ...] = True,
    stack: str | None = None,
    strict_ops: bool = False,
    constraints: Mapping[str, Any] | None = None,
    gap: float | None = None,
    solver: str = "highs",
    max_nodes: int | None = None,
) -> dict[str, Any]:
    """Search the fastest strategy that fits: the dict `hyperplan plan --json` prints.

    `memory_gib` caps the HBM a plan may use per device (default: all of it);
    `offload=False` keeps everything in HBM (HyperOffload off); `mpmd=False` keeps the whole model one
    program (no HyperMPMD device groups for encoders beside the backbone, or for MoE layers' experts beside
    their attention), and a tuple of those kinds ("encoders", "experts") searches those only;
    `strict_ops` refuses a graph with
    ops that have no FLOP rule. `constraints` fixes knobs of the strategy (tp, pp, cp, ep, etp, vpp, dp,
    micro_batch, recompute, zero, stage_tp, offload: `planner.search.constraints.Constraints`) and the search
    chooses the rest (as one program: no MPMD split then). `gap` is how close to the bound the search must
    prove its plan (default 1 %), `solver` the layout ILP's solver (highs or cpsat); `time_limit_s` stops a
    search that would take longer (the plan is then marked incomplete; None: no limit but the work); effort is counted in work (`max_nodes`), so the same inputs give the same plan on any machine.

    Raises `Infeasible` when nothing fits, saying how much memory the closest
    strategy needs and about how many devices would hold it; `SolverTimeout` when
    the search stopped (--time-limit, or its work budget) before anything fit.
    """
    from cost_models import load_cluster

    from planner.errors import Infeasible, SolverTimeout
    from planner.costing.estimate import estimate
    from planner.graph.blocks import discover_blocks
    from planner.calibration.published import ranking_error
    from planner.plan import Plan, close_calls, fitting_best, mesh_axes, plan_to_dict, search_summary
    from planner.search.constraints import Constraints
    from planner.search.plan_search import DEFAULT_GAP, DEFAULT_MAX_NODES, Budget, search

    budget = Budget(time_limit_s, max_nodes or DEFAULT_MAX_NODES)  # one budget for the whole plan
    if solver not in ("highs", "cpsat"):
        raise InvalidInput(f"--solver {solver!r}: use highs or cpsat")
    fixed = user = Constraints.from_mapping(constraints)
    if not offload:
        if fixed.offload:
            raise InvalidInput("--no-offload with --offload fractions: give one or the other")
        fixed = Constraints.from_mapping({**fixed.given(), "offload": ()})
    workload = make_workload(mode, global_batch, seq_len, dtype, stack)
    hw = with_memory_cap(load_cluster(cluster, devices=devices), memory_gib)
    if mode == "train":
        bounds.training_dtype(dtype, hw)
    graph = _graph_for_costing(model, seq_len, dims, overrides)
    check_costed(graph, strict_ops)
    structure = discover_blocks(graph)
    result = search(graph, structure, hw, workload, progress=progress, allow_offload=offload, constraints=fixed,
                    budget=budget, gap=DEFAULT_GAP if gap is None else gap, solver=solver)
    mp = None
    if mpmd and not user.given() and not budget.out():
        from planner.search.mpmd import plan_mpmd

        kinds = {"kinds": mpmd} if isinstance(mpmd, tuple) else {}
        mp = plan_mpmd(graph, structure, hw, workload, allow_offload=offload, progress=progress,
                       incumbent_s=result.best.step_s if result.best else None, budget=budget, **kinds)
    if result.best is None and mp is None:
        stopped = f"{budget.stopped_by} after {budget.nodes} nodes" if budget.stopped else ""
        # nothing proven where the search stopped: a timeout (exit 4), which whatif never caches
        raise (SolverTimeout if stopped else Infeasible)(_infeasible_message(model, hw, result, stopped))
    out: dict[str, Any]
    if result.best is not None:
        best, est, unfit = fitting_best(result, lambda s: estimate(graph, structure, hw, workload, s, solver=solver))
        others = tuple(c for c in result.ranked if c.mesh != best.mesh and c not in unfit)[:3]
        plan = Plan(best.strategy, est, others, result, mesh_axes(hw, best.strategy), budget.stopped_by)
        out = plan_to_dict(plan)
        out["programs"] = [{"name": "model", "submodels": [s.name for s in structure.submodels],
                            "devices": hw.n_devices, "ranks": [0, hw.n_devices - 1], "strategy": out["strategy"]}]
    if mp is not None:
        from planner.search.mpmd import exact_programs

        progs, overall = exact_programs(mp, hw, workload)
        spmd_step = out["estimate"]["step_time_s"] if result.best is not None else None
        label = {"encoders": "encoders on their own devices"}.get(mp.kind, "attention and experts on their own devices")
        mpmd_info = {"kind": mp.kind, "label": label, "step_time_s": overall["step_time_s"],
                     "spmd_step_time_s": spmd_step, "imbalance": overall["imbalance"], "detail": dict(mp.detail),
                     "programs": [
                         {k: p[k] for k in ("name", "devices", "ranks")} | {"summary": p["strategy"]["summary"],
                                                                            "step_time_s": p["estimate"]["step_time_s"]}
                         for p in progs]}
        if overall["fits"] and (spmd_step is None or overall["step_time_s"] < spmd_step):
            backbone = progs[-1] if mp.kind == "encoders" else progs[0]  # the backbone, or attention beside experts
            out = {"strategy": backbone["strategy"], "mesh": [], "estimate": overall, "runners_up": (
                [{"summary": "single program: " + plan.strategy.short(), "strategy": out["strategy"],
                  "step_time_s": spmd_step, "fits": True, "peak_gib": plan.estimate.memory_bytes["peak"] / 2**30,
                  "why": f"{(spmd_step / overall['step_time_s'] - 1) * 100:.1f}% slower than MPMD"}]
                if result.best is not None else []),
                "search": {**search_summary(result, overall["step_time_s"], budget.stopped_by), "layout_solver_gap":
                           overall["solver_gap"]},
                "programs": progs}
            mpmd_info["used"] = True
        else:
            mpmd_info["used"] = False
        out["mpmd"] = mpmd_info
    programs = out.get("programs") or [out]  # an MPMD plan's programs, each with its strategy
    cp = max(int((p.get("strategy") or {}).get("cp", 1)) for p in programs)
    out.update(_describe(model, graph, hw, workload, structure, as_shipped=_as_shipped(model, overrides, dims),
                         cp=cp))
    out["warnings"] = scale_warnings(out["estimate"]["step_time_s"], out["estimate"].get("microbatches", 1),
                                     workload.mode)
    acc = out.get("accuracy")
    close = close_calls(out["runners_up"], out["estimate"]["step_time_s"], acc, hw.name,
                        ranking_error(acc["category"]) if acc else None)
    if close:
        out["close_calls"] = close
    if user.given():
        out["constraints"] = user.as_section()
    return out


def with_memory_cap(hw: Any, memory_gib: float | None) -> Any:
    """The cluster with at most `memory_gib` of HBM per device usable by a plan."""
    import dataclasses

    if memory_gib is None:
        return hw
    if not 0 < memory_gib < float("inf"):  # NaN too: it would compare as no cap at all
        raise InvalidInput(f"--memory-gib must be a finite number above 0, got {memory_gib}")
    cap = min(hw.device.hbm_bytes, memory_gib * 2.0**30)
    return dataclasses.replace(hw, device=dataclasses.replace(hw.device, hbm_bytes=cap))


def _infeasible_message(model: Any, hw: Any, result: Any, stopped_by: str = "") -> str:
    """Why no plan came out: nothing fits (and what would), or, `stopped_by` a limit, nothing was proven."""
    from cost_models.spec import nearest_valid_counts

    c, where = result.closest, f"{display_name(model)} on {hw.n_devices} devices of {hw.name}"
    if c is None or c.peak_bytes == float("inf"):
        if stopped_by:  # nothing scored: no "fits" to speak of
            return (f"the search of {where} stopped by {stopped_by}, before it scored any strategy; raise "
                    "--time-limit to search on")
        return f"no strategy fits {where}: {c.note if c is not None else 'no strategy could be built'}"
    rough = int(hw.n_devices * c.peak_bytes / hw.device.hbm_bytes) + 1
    more = nearest_valid_counts(hw.levels, rough)[1] or rough  # the next count the network builds, else rough
    return (f"no strategy fits {where}: the closest ({c.strategy.short()}) needs {nbytes(c.peak_bytes)} per device "
            f"and a device has {nbytes(hw.device.hbm_bytes)}; try about {more} devices (--devices {more}), a shorter "
            "--seq-len, or offload" + (f" (not proven: the search stopped by {stopped_by} before any strategy fit; "
                                       "raise --time-limit to search on)" if stopped_by else ""))


def plan_inference(model: str | os.PathLike, **options: Any) -> dict[str, Any]:
    """Plan serving: prefill and decode device groups, layouts and batches under latency targets; the dict
    `hyperplan plan --mode infer --json` prints. Options: see `planner.inference.serve.plan_inference`."""
    from planner.inference.serve import plan_inference as plan

    return plan(model, **options)


def calibrate(files=None, *, hardware: str | None = None, category: str | None = None, fit=None, predictor=None):
    """Predicted against measured step time of the runs in `files` (the shipped runs when None), optionally
    filtered by hardware and category; with `fit` (run ids), the hardware of those runs fitted on them first; with
    `predictor` (a `planner.calibration.predict.Predictor`), its graphs reused.
    Returns a `planner.calibration.report.CalibrationResult`."""
    from planner.calibration import read_runs
    from planner.calibration.report import calibrate_runs, select

    runs = select(read_runs(files), hardware, category)
    return calibrate_runs(runs, fit, predictor=predictor)
