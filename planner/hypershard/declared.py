"""What a declaration asks for, read back: the model, cluster, workload and strategy; and its score.

The strategy is read from the sections a user edits (mesh axis sizes, the
pipeline's layer lists, micro-batch, schedule, ZeRO stage, recompute
policy, offload fractions, sequence parallelism), so a hand-edited file is
scored as written. Scoring takes the same path as `plan_model` — the same
graph, cluster and `estimate` call — so an unedited declaration scores to
the very numbers it records.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from planner.errors import InvalidInput
from planner.graph.blocks import Structure
from planner.graph.ir import Graph
from planner.hypershard.document import Request, build_document
from planner.stage_costs import even_split
from planner.strategy import Strategy, Workload


def request_of(doc: Mapping[str, Any], base_dir: str | None = None) -> Request:
    """The model and cluster to rebuild; a relative model path is tried from the cwd, then beside the file."""
    m, c = doc["model"], doc["cluster"]
    if m["source"] == "file":
        path = m["path"]
        if not os.path.exists(path) and base_dir and not os.path.isabs(path):
            near = os.path.join(base_dir, path)
            path = near if os.path.exists(near) else path
        if not os.path.exists(path):
            raise InvalidInput(f"model file '{m['path']}' named by the declaration does not exist; "
                               "fix model.path or run from the folder it is relative to")
        return Request(model=path, cluster=c["spec"], dims=dict(m.get("dims") or {}), memory_gib=c.get("memory_gib"))
    return Request(model=m["zoo"], cluster=c["spec"], overrides=dict(m.get("overrides") or {}),
                   dims=dict(m.get("dims") or {}), memory_gib=c.get("memory_gib"))


def workload_of(doc: Mapping[str, Any]) -> Workload:
    w = doc["workload"]
    return Workload(mode=w["mode"], global_batch=w["global_batch"], seq_len=w["seq_len"], dtype=w["dtype"])


def chunk_layers(doc: Mapping[str, Any]) -> dict[int, list[str]]:
    """Layers per pipeline chunk, by chunk index (chunk c runs on stage c mod pp)."""
    out: dict[int, list[str]] = {}
    for st in doc["programs"][0]["stages"]:
        for ch in st["chunks"]:
            if ch["chunk"] in out:
                raise InvalidInput(f"pipeline chunk {ch['chunk']} is listed twice in programs[0].stages; "
                                   "give each chunk once")
            out[ch["chunk"]] = list(ch["layers"])
    return out


def strategy_of(doc: Mapping[str, Any]) -> Strategy:
    """The strategy the declaration's sections describe (InvalidInput with the field when they cannot)."""
    if len(doc["programs"]) != 1:
        raise InvalidInput(f"the declaration has {len(doc['programs'])} programs and this version scores one "
                           "(one program over all ranks); merge them into programs[0]")
    if len(doc["meshes"]) != 1:
        raise InvalidInput(f"the declaration has {len(doc['meshes'])} meshes and this version scores one; keep one")
    mesh = doc["meshes"][0]
    axes = {a["name"]: a["size"] for a in mesh["axes"]}
    unknown = sorted(set(axes) - {"tp", "cp", "dp", "pp"})
    if unknown:
        raise InvalidInput(f"mesh axis {unknown[0]!r} is not one of tp, cp, dp, pp; rename it in meshes[0].axes")
    ep = next((a["size"] for a in mesh.get("aliases", []) if a["name"] == "ep"), 1)
    prog = doc["programs"][0]
    chunks = chunk_layers(doc)
    sizes = tuple(len(chunks[c]) for c in sorted(chunks))
    even = even_split(sum(sizes), len(sizes)) if sizes and sum(sizes) >= len(sizes) else ()
    kw: dict[str, Any] = dict(
        tp=axes.get("tp", 1), cp=axes.get("cp", 1), dp=axes.get("dp", 1), pp=axes.get("pp", 1), ep=ep,
        vpp=prog["virtual_stages"], micro_batch=prog["micro_batch_size"], schedule=prog["schedule"],
        recompute=doc["recompute"]["policy"], sp=bool(doc["layouts"]["sequence_parallel"]),
        full_recompute_layers=doc["recompute"].get("full_layers_per_chunk", 0),
        zero=doc["zero"]["stage"], layouts=doc["layouts"]["space"],
        offload=tuple(sorted((k, float(v)) for k, v in doc["offload"].items() if v)),
        stage_layers=() if sizes == even else sizes,
    )
    return Strategy(**kw)


@dataclass(frozen=True, slots=True)
class Scored:
    """A declaration re-estimated: the rebuilt graph and the plan-shaped dict `build_document` takes."""

    graph: Graph
    structure: Structure
    request: Request
    plan: dict[str, Any]

    def estimate_view(self) -> dict[str, Any]:
        """The dict `hyperplan estimate --json` prints."""
        out = dict(self.plan["estimate"])
        for k in ("model", "cluster", "workload", "strategy"):
            out[k] = self.plan[k]
        return out


def score(request: Request, workload: Workload, strategy: Strategy, devices: int) -> Scored:
    """Estimate `strategy` exactly as `plan_model` does for its chosen strategy."""
    from cost_models import load_cluster

    from planner.api import _describe, load_graph, with_memory_cap
    from planner.estimate import estimate
    from planner.graph.blocks import discover_blocks
    from planner.plan import mesh_axes, strategy_dict

    hw = with_memory_cap(load_cluster(request.cluster, devices=devices), request.memory_gib)
    graph = load_graph(request.model, batch=1, seq_len=workload.seq_len, dims=dict(request.dims) or None,
                       overrides=request.overrides)
    structure = discover_blocks(graph)
    est = estimate(graph, structure, hw, workload, strategy)
    plan = {"strategy": strategy_dict(strategy), "mesh": list(mesh_axes(hw, strategy)), "estimate": est.to_dict()}
    plan.update(_describe(request.model, graph, hw, workload))
    return Scored(graph, structure, request, plan)


def score_document(doc: Mapping[str, Any], base_dir: str | None = None, model: str | None = None) -> Scored:
    """Re-estimate a declaration (optionally on another MODEL, as `estimate MODEL --plan FILE` does)."""
    request = request_of(doc, base_dir) if model is None else Request(
        model=model, cluster=doc["cluster"]["spec"], memory_gib=doc["cluster"].get("memory_gib"))
    return score(request, workload_of(doc), strategy_of(doc), doc["cluster"]["devices"])


def graph_of(doc: Mapping[str, Any], base_dir: str | None = None) -> tuple[Graph, Structure]:
    """The declaration's model as the planner sees it (graph and blocks), without scoring it."""
    from planner.api import load_graph
    from planner.graph.blocks import discover_blocks

    req = request_of(doc, base_dir)
    graph = load_graph(req.model, batch=1, seq_len=doc["workload"]["seq_len"], dims=dict(req.dims) or None,
                       overrides=req.overrides)
    return graph, discover_blocks(graph)


def declare(model: str, *, cluster: str, global_batch: int, seq_len: int, devices: int, dtype: str = "bf16",
            mode: str = "train", overrides: Mapping[str, Any] | None = None, dims: Mapping[str, int] | None = None,
            memory_gib: float | None = None, **strategy: Any) -> dict[str, Any]:
    """Score one given strategy and declare it: the document `plan -o` writes, for a strategy you chose."""
    inner = strategy.get("tp", 1) * strategy.get("pp", 1) * strategy.get("cp", 1)
    strategy.setdefault("dp", max(1, devices // inner))
    request = Request(model=model, cluster=cluster, overrides=dict(overrides or {}), dims=dict(dims or {}),
                      memory_gib=memory_gib)
    wl = Workload(mode=mode, global_batch=global_batch, seq_len=seq_len, dtype=dtype)  # type: ignore[arg-type]
    sc = score(request, wl, Strategy(**strategy), devices)
    return build_document(sc.plan, sc.graph, sc.structure, request)


def declare_plan(plan: Mapping[str, Any], request: Request) -> dict[str, Any]:
    """The declaration of a `plan_model` result (rebuilds the graph it was planned on)."""
    mpmd = plan.get("mpmd") or {}
    if mpmd.get("used"):
        raise InvalidInput(f"this plan runs {len(mpmd['programs'])} programs (HyperMPMD) and this version writes "
                           "single-program declarations only; re-plan with --no-mpmd to write one")
    from planner.api import load_graph
    from planner.graph.blocks import discover_blocks

    graph = load_graph(request.model, batch=1, seq_len=plan["workload"]["seq_len"], dims=dict(request.dims) or None,
                       overrides=request.overrides)
    return build_document(plan, graph, discover_blocks(graph), request)


def _same_model(a: str, b: str) -> bool:
    if os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return a == b


def estimate_declared(path: str, model: str, *, cluster: str | None = None, devices: int | None = None,
                      global_batch: int | None = None, seq_len: int | None = None, dtype: str | None = None,
                      overrides: Mapping[str, Any] | None = None, dims: Mapping[str, int] | None = None
                      ) -> dict[str, Any]:
    """`hyperplan estimate MODEL --plan FILE`: the declaration's strategy on MODEL; given options replace the file's.

    MODEL naming the declared model keeps the declared zoo overrides and dims unless others are given.
    """
    from planner.hypershard.io import read_document

    doc = read_document(path)
    declared = request_of(doc, os.path.dirname(os.path.abspath(path)))
    if _same_model(model, declared.model) and not overrides and not dims:
        overrides, dims = declared.overrides, declared.dims
    request = Request(model=model, cluster=cluster or declared.cluster, overrides=dict(overrides or {}),
                      dims=dict(dims or {}), memory_gib=declared.memory_gib)
    w = doc["workload"]
    workload = Workload(mode=w["mode"], global_batch=global_batch or w["global_batch"], seq_len=seq_len or w["seq_len"],
                        dtype=dtype or w["dtype"])
    return score(request, workload, strategy_of(doc), devices or doc["cluster"]["devices"]).estimate_view()
