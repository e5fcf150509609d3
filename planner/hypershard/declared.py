"""What a declaration asks for, read back: the model, cluster, workload, strategies and layouts; and its score.

The strategy is read from the sections a user edits (mesh axis sizes, the pipeline's layer lists and each
stage's tp, micro-batch, schedule, ZeRO stage, recompute policy, offload fractions, sequence parallelism),
and the parameter layouts are pinned as declared (`pins`), so a hand-edited file is scored as written. Scoring takes the same path as `plan_model` — the same graph,
cluster and `estimate` call, per program and combined as
`mpmd.score_groups` does when there are several — so an unedited
declaration scores to the very numbers it records.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from planner.errors import InvalidInput
from planner.graph.blocks import Structure
from planner.graph.ir import Graph
from planner.hypershard.document import Request, file_sha256
from planner.hypershard.io import beside
from planner.hypershard.pins import check_activations, declared_pins, estimator_pins
from planner.hypershard.programs import is_multi, is_serving, rank_problems, ranks_of, view, views
from planner.hypershard.stages import declared_widths, device_problem
from planner.costing.stage_costs import even_split
from planner.costing.execution import load_execution
from planner.strategy import Strategy, Workload


def request_of(doc: Mapping[str, Any], base_dir: str | None = None) -> Request:
    """The model and cluster to rebuild; a relative model path is tried from the cwd, then beside the file."""
    m, c = doc["model"], doc["cluster"]
    if m["source"] in ("file", "hf_config"):
        path = beside(m["path"], base_dir)
        if not os.path.exists(path):
            what = "model file" if m["source"] == "file" else "Hugging Face config"
            raise InvalidInput(f"{what} '{m['path']}' named by the declaration does not exist; "
                               "fix model.path or run from the folder it is relative to")
        return Request(model=path, cluster=c["spec"], overrides=dict(m.get("overrides") or {}),
                       dims=dict(m.get("dims") or {}), memory_gib=c.get("memory_gib"))
    return Request(model=m["zoo"], cluster=c["spec"], overrides=dict(m.get("overrides") or {}),
                   dims=dict(m.get("dims") or {}), memory_gib=c.get("memory_gib"))


def cluster_problems(doc: Mapping[str, Any]) -> list[str]:
    """What is wrong with the declaration's cluster.spec, if its hardware does not load at cluster.devices."""
    from cost_models import SpecError, load_cluster

    try:
        load_cluster(doc["cluster"]["spec"], devices=doc["cluster"]["devices"])
    except (InvalidInput, SpecError) as exc:
        return [f"cluster.spec: {exc}"]
    return []


def workload_of(doc: Mapping[str, Any]) -> Workload:
    w = doc["workload"]
    return Workload(mode=w["mode"], global_batch=w["global_batch"], seq_len=w["seq_len"], dtype=w["dtype"],
                    execution=load_execution(w.get("stack")))


def chunk_layers(doc: Mapping[str, Any]) -> dict[int, list[str]]:
    """Layers per pipeline chunk of a one-program document or view, by chunk index (chunk c on stage c mod pp)."""
    out: dict[int, list[str]] = {}
    for st in doc["programs"][0]["stages"]:
        for ch in st["chunks"]:
            if ch["chunk"] in out:
                raise InvalidInput(f"pipeline chunk {ch['chunk']} is listed twice in programs[0].stages; "
                                   "give each chunk once")
            out[ch["chunk"]] = list(ch["layers"])
    return out


def declared_layers(doc: Mapping[str, Any]) -> list[str]:
    """The layers a one-program document's pipeline lists, in chunk order."""
    chunks = chunk_layers(doc)
    return [name for c in sorted(chunks) for name in chunks[c]]


def strategy_of(doc: Mapping[str, Any], k: int = 0) -> Strategy:
    """The strategy of program k as the declaration's sections describe it (InvalidInput naming the field)."""
    return view_strategy(view(doc, k))


def strategies_of(doc: Mapping[str, Any]) -> list[Strategy]:
    return [strategy_of(doc, k) for k in range(len(doc["programs"]))]


def view_strategy(v: Mapping[str, Any]) -> Strategy:
    """The strategy of a one-program view (see `programs.view`)."""
    mesh = v["meshes"][0]
    axes = {a["name"]: a["size"] for a in mesh["axes"]}
    unknown = sorted(set(axes) - {"tp", "cp", "dp", "pp"})
    if unknown:
        raise InvalidInput(f"mesh axis {unknown[0]!r} of mesh {mesh['name']!r} is not one of tp, cp, dp, pp; "
                           "rename it")
    alias = next((a for a in mesh.get("aliases", []) if a["name"] == "ep"), {"size": 1})
    ep = alias["size"]
    # experts within cp x dp keep the tensor axis (etp = tp, Megatron-Core's default); within tp x cp x dp, etp 1
    # (also where they are on one expert rank: an alias of size 1)
    etp = 1 if axes.get("tp", 1) > 1 and "tp" in alias.get("within", ()) else 0
    prog = v["programs"][0]
    chunks = chunk_layers(v)
    sizes = tuple(len(chunks[c]) for c in sorted(chunks))
    even = even_split(sum(sizes), len(sizes)) if sizes and sum(sizes) >= len(sizes) else ()
    kw: dict[str, Any] = dict(
        tp=axes.get("tp", 1), cp=axes.get("cp", 1), dp=axes.get("dp", 1), pp=axes.get("pp", 1), ep=ep, etp=etp,
        vpp=prog["virtual_stages"], micro_batch=prog["micro_batch_size"], schedule=prog["schedule"],
        flushes=prog.get("pipeline_flushes", 1),
        recompute=v["recompute"]["policy"], sp=bool(v["layouts"]["sequence_parallel"]),
        full_recompute_layers=v["recompute"].get("full_layers_per_chunk", 0),
        zero=v["zero"]["stage"], layouts=v["layouts"]["space"],
        offload=tuple(sorted((k, float(x)) for k, x in v["offload"].items() if x)),
        stage_layers=() if sizes == even else sizes, stage_tp=declared_widths(v),
    )
    return Strategy(**kw)


@dataclass(frozen=True, slots=True)
class Scored:
    """A declaration re-estimated: the rebuilt graph and the plan-shaped dict `build_document` takes."""

    graph: Graph
    structure: Structure
    request: Request
    plan: dict[str, Any]
    #: parameters declared with other layouts than the estimator chooses: name -> (declared, chosen), as
    #: `search.space` layouts; the estimate scores the declared ones
    edited: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def estimate_view(self) -> dict[str, Any]:
        """The dict `hyperplan estimate --json` prints (with `programs` for a plan of several)."""
        out = dict(self.plan["estimate"])
        for k in ("model", "cluster", "workload", "strategy"):
            out[k] = self.plan[k]
        for k in ("accuracy", "assumptions"):  # what the figures rest on and how far off they may be, as estimate's
            if k in self.plan:
                out[k] = self.plan[k]
        if (self.plan.get("mpmd") or {}).get("used"):
            out["programs"] = self.plan["programs"]
        return out


def _rebuild(request: Request, workload: Workload, devices: int) -> tuple[Any, Graph, Structure]:
    """The cluster (with the declared memory cap), graph and blocks `plan_model` planned on (the graph is
    remembered for the process, as `plan_model` does: validate reads it twice)."""
    from cost_models import load_cluster

    from planner.api import _graph_for_costing, with_memory_cap
    from planner.graph.blocks import discover_blocks

    hw = with_memory_cap(load_cluster(request.cluster, devices=devices), request.memory_gib)
    graph = _graph_for_costing(request.model, workload.seq_len, dict(request.dims) or None, request.overrides)
    return hw, graph, discover_blocks(graph)


def program_parts(doc: Mapping[str, Any], request: Request, workload: Workload
                  ) -> tuple[Graph, Structure, list[tuple[Graph, Structure]]]:
    """The whole model's graph and blocks, and each declared program's (InvalidInput when the model does not
    split into the declared programs)."""
    _, graph, structure = _rebuild(request, workload, doc["cluster"]["devices"])
    if not is_multi(doc):
        return graph, structure, [(graph, structure)]
    split = split_as_declared(doc, graph, structure)
    return graph, structure, [(p.graph, p.structure) for p in split]


def split_as_declared(doc: Mapping[str, Any], graph: Graph, structure: Structure) -> list[Any]:
    from planner.search.mpmd import split_programs

    split = split_programs(graph, structure)
    names = [p["name"] for p in doc["programs"]]
    if names != [p.name for p in split]:
        raise InvalidInput(f"the declaration's programs are {' | '.join(names)}, but the model splits into "
                           f"{' | '.join(p.name for p in split) or 'one program'} (encoders first); declare those")
    return split


def _pins(v: Mapping[str, Any] | None, graph: Graph, structure: Structure, s: Strategy, seq_len: int) -> dict:
    if v is None:
        return {}
    check_activations(v, graph, structure, s, seq_len)
    return declared_pins(v, graph, structure, s)


def score(request: Request, workload: Workload, strategy: Strategy, devices: int,
          v: Mapping[str, Any] | None = None) -> Scored:
    """Estimate `strategy` exactly as `plan_model` does for its chosen strategy, with the parameter layouts of the
    view `v` when it declares others than the estimator chooses (an unedited file scores to the planned numbers)."""
    from planner.api import _as_shipped, _describe
    from planner.costing.estimate import estimate
    from planner.plan import mesh_axes, strategy_dict

    hw, graph, structure = _rebuild(request, workload, devices)
    pins = _pins(v, graph, structure, strategy, workload.seq_len)
    est = estimate(graph, structure, hw, workload, strategy)
    edited = _edited(pins, estimator_pins(structure, est.layouts, pins))
    if edited:
        est = estimate(graph, structure, hw, workload, strategy, param_pins=pins)
    plan = {"strategy": strategy_dict(strategy), "mesh": list(mesh_axes(hw, strategy)), "estimate": est.to_dict()}
    plan.update(_describe(request.model, graph, hw, workload, structure,
                          as_shipped=_as_shipped(request.model, request.overrides, request.dims), cp=strategy.cp))
    return Scored(graph, structure, request, plan, edited)


def _edited(declared: Mapping[str, int], chosen: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    return {p: (declared[p], chosen[p]) for p in declared if declared[p] != chosen[p]}


def score_programs(request: Request, workload: Workload, doc: Mapping[str, Any], devices: int) -> Scored:
    """Re-estimate a declaration of several programs as `plan_model` does (`mpmd.score_groups`): each program on
    its subgraph and rank group, combined with the fill and the encoder-to-backbone hand-over."""
    vs = views(doc)
    ranks = [ranks_of(prog, devices) for prog in doc["programs"]]
    return score_split(request, workload, devices, ranks, [view_strategy(v) for v in vs], doc, vs)


def score_split(request: Request, workload: Workload, devices: int, ranks: list[tuple[int, int]],
                 strategies: list[Strategy], doc: Mapping[str, Any] | None, vs: list[Mapping[str, Any]] | None
                 ) -> Scored:
    """The model's programs (as declared in `doc`, when given) on `ranks` with `strategies`, the parameter layouts
    of the views `vs` pinned where they differ from the estimator's."""
    from planner.api import _as_shipped, _describe
    from planner.search.mpmd import score_groups, split_programs

    hw, graph, structure = _rebuild(request, workload, devices)
    split = split_as_declared(doc, graph, structure) if doc is not None else split_programs(graph, structure)
    if len(split) != len(strategies):
        raise InvalidInput(f"{len(strategies)} programs are given, but {request.model} splits into {len(split)} "
                           f"({' | '.join(p.name for p in split) or 'one program: plan it as one'})")
    groups = [(p, count, first, s) for p, (first, count), s in zip(split, ranks, strategies)]
    pins = [_pins(v, p.graph, p.structure, s, workload.seq_len) for v, p, s in zip(vs, split, strategies)] if vs \
        else [{} for _ in split]
    transfer = _handover_s(graph, split, hw, workload, ranks, strategies)
    entries, overall = score_groups(groups, hw, workload, transfer)
    differ = [_edited(pk, estimator_pins(p.structure, e["estimate"]["layouts"], pk))
              for pk, p, e in zip(pins, split, entries)]
    if any(differ):
        entries, overall = score_groups(groups, hw, workload, transfer,
                                        pins=[pk if d else None for pk, d in zip(pins, differ)])
    plan = {"strategy": entries[-1]["strategy"], "mesh": [], "estimate": overall, "programs": entries,
            "mpmd": {"used": True, "step_time_s": overall["step_time_s"], "imbalance": overall["imbalance"]}}
    plan.update(_describe(request.model, graph, hw, workload, structure,
                          as_shipped=_as_shipped(request.model, request.overrides, request.dims)))
    return Scored(graph, structure, request, plan, {p: d for one in differ for p, d in one.items()})


def program_workloads(doc: Mapping[str, Any], workload: Workload) -> list[Workload]:
    """What each program is timed on: the workload, or for several programs their group's share of it rounded up
    to the group (`program_groups.group_workload`, as the planner times them)."""
    if not is_multi(doc):
        return [workload]
    from planner.search.program_groups import group_workload

    return [group_workload(workload, ranks_of(p, doc["cluster"]["devices"])[1]) for p in doc["programs"]]


def _handover_s(graph: Graph, split: list[Any], hw: Any, workload: Workload, ranks: list[tuple[int, int]],
                strategies: list[Strategy]) -> float:
    """The encoders-to-backbone hand-over the planner charged the pair (`mpmd.pair_step`)."""
    from planner.search.mpmd import handover_s
    from planner.search.program_groups import group_workload

    m = [s.micro_batches(group_workload(workload, count)) for s, (_, count) in zip(strategies, ranks)]
    return handover_s(graph, split[-1], hw, workload, ranks[-1][0], m[0], m[-1])


def score_document(doc: Mapping[str, Any], base_dir: str | None = None, model: str | None = None) -> Scored:
    """Re-estimate a declaration of training (optionally on another MODEL, as `estimate MODEL --plan FILE` does)."""
    if is_serving(doc):
        raise InvalidInput("this is a serving declaration (workload mode infer); score it with "
                           "planner.hypershard.serving_check.rescore, or `hyperplan validate FILE`")
    request = request_of(doc, base_dir) if model is None else Request(
        model=model, cluster=doc["cluster"]["spec"], memory_gib=doc["cluster"].get("memory_gib"))
    return score_as(doc, request, workload_of(doc), doc["cluster"]["devices"])


def score_as(doc: Mapping[str, Any], request: Request, workload: Workload, devices: int) -> Scored:
    """The declaration's strategy (or programs) and layouts, scored on `request`'s model and cluster."""
    if is_multi(doc):
        problems = rank_problems(dict(doc, cluster=dict(doc["cluster"], devices=devices)))
        if problems:
            raise InvalidInput(problems[0])
        return score_programs(request, workload, doc, devices)
    v = view(doc, 0)
    s = view_strategy(v)
    problem = device_problem(v, s, devices, "cluster.devices" if devices == doc["cluster"]["devices"] else "--devices")
    if problem:
        raise InvalidInput(problem)
    return score(request, workload, s, devices, v)


def graph_of(doc: Mapping[str, Any], base_dir: str | None = None) -> tuple[Graph, Structure]:
    """The declaration's model as the planner sees it (graph and blocks), without scoring it: the graph
    remembered for the process, so an export after validate's checks does not import the model again."""
    from planner.api import _graph_for_costing
    from planner.graph.blocks import discover_blocks

    req = request_of(doc, base_dir)
    graph = _graph_for_costing(req.model, doc["workload"]["seq_len"], dict(req.dims) or None, req.overrides)
    return graph, discover_blocks(graph)


def _same_model(a: str, b: str) -> bool:
    """Two MODEL arguments naming one model: the same file (a config.json and its folder are one), or one name."""
    from planner.model_source import content_file

    fa, fb = content_file(a), content_file(b)
    if fa and fb:
        return os.path.samefile(fa, fb)
    return a == b


def request_on(doc: Mapping[str, Any], model: str, *, base_dir: str | None, cluster: str | None,
               overrides: Mapping[str, Any] | None, dims: Mapping[str, int] | None) -> Request:
    """What `estimate MODEL --plan FILE` scores on: MODEL, and the declared cluster unless another is given; MODEL
    must be the declared model (another model has other tensors); it keeps the declared zoo overrides and dims
    unless others are given."""
    declared = request_of(doc, base_dir)
    m = doc["model"]
    same_bytes = m["source"] == "file" and os.path.isfile(model) and m.get("sha256") == file_sha256(model)
    if not (_same_model(model, declared.model) or same_bytes):
        named = m["zoo"] if m["source"] == "zoo" else m["path"]
        raise InvalidInput(f"{model} is not the model the declaration was planned for ({named}): its layouts and "
                           f"pipeline name that model's tensors and layers; give {named} as MODEL, or plan "
                           f"{model} with hyperplan plan")
    if not overrides and not dims:
        overrides, dims = declared.overrides, declared.dims
    return Request(model=model, cluster=cluster or declared.cluster, overrides=dict(overrides or {}),
                   dims=dict(dims or {}), memory_gib=declared.memory_gib)


def estimate_declared(path: str, model: str, *, cluster: str | None = None, devices: int | None = None,
                      global_batch: int | None = None, seq_len: int | None = None, dtype: str | None = None,
                      overrides: Mapping[str, Any] | None = None, dims: Mapping[str, int] | None = None
                      ) -> dict[str, Any]:
    """`hyperplan estimate MODEL --plan FILE`: the declaration's strategy and layouts on MODEL (see `request_on`);
    given options replace the file's."""
    from planner.hypershard.io import read_document
    from planner.hypershard.serving_check import estimate_serving

    doc = read_document(path)
    serving = is_serving(doc)
    if serving:
        _refuse_training_options(doc, devices, global_batch, seq_len)
    request = request_on(doc, model, base_dir=os.path.dirname(os.path.abspath(path)), cluster=cluster,
                         overrides=overrides, dims=dims)
    if serving:
        return estimate_serving(doc, request, dtype=dtype)
    w = doc["workload"]
    workload = Workload(mode=w["mode"], global_batch=global_batch or w["global_batch"], seq_len=seq_len or w["seq_len"],
                        dtype=dtype or w["dtype"], execution=load_execution(w.get("stack")))
    devices = devices or doc["cluster"]["devices"]
    if not is_multi(doc) and (overrides or dims):
        _same_layers(doc, _rebuild(request, workload, devices)[2])
    return score_as(doc, request, workload, devices).estimate_view()


def _same_layers(doc: Mapping[str, Any], structure: Structure) -> None:
    """InvalidInput when the model as the options make it has other layers than the declaration's pipeline lists:
    its chunks would be cut anew, not scored as declared."""
    listed, layers = declared_layers(doc), [b.name for b in structure.layers()]
    if listed != layers:
        raise InvalidInput(f"the architecture options make a model of {len(layers)} layers where the declaration's "
                           f"pipeline lists {len(listed)} ({listed[0] if listed else 'none'} to "
                           f"{listed[-1] if listed else 'none'}); drop them to score the plan as declared, or plan "
                           "the variant with hyperplan plan")


def _refuse_training_options(doc: Mapping[str, Any], devices: int | None, global_batch: int | None,
                             seq_len: int | None) -> None:
    """InvalidInput for options a serving declaration cannot take: its ranks are fixed and it serves prompts."""
    given = [f for f, v in (("--global-batch", global_batch), ("--seq-len", seq_len)) if v is not None]
    if devices is not None and devices != doc["cluster"]["devices"]:
        given.insert(0, f"--devices {devices}")
    if given:
        raise InvalidInput(f"{', '.join(given)} cannot apply to a serving declaration (its phases' ranks are "
                           "fixed and it serves prompts, not training steps); edit its meshes, batch_per_replica "
                           "or workload instead")
