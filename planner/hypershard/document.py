"""The HyperShard declaration: a plan written as data an execution backend can apply.

One document holds what to run (model, workload), where (cluster, the
named mesh with its rank placement), how (the programs: rank groups,
pipeline stages with their layers, schedule, micro-batches; per-parameter
and boundary layouts; ZeRO; recompute and swap per layer; offload per
memory class) and the estimate it was chosen by. The strategy is not stored
twice: `declared.strategy_of` reads it back from these sections, so a
hand edit of, say, the ZeRO stage is what `validate` and `estimate --plan`
score. Sections built here from the strategy (layouts, recompute rules)
are what backends apply; `validate` reports where they differ from what
the strategy implies.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from planner.graph.blocks import Structure
from planner.graph.ir import Graph
from planner.hypershard.layouts import activation_layouts, param_layouts
from planner.hypershard.patterns import compress
from planner.hypershard.roles import param_roles
from planner.stage_costs import assign_chunks
from planner.strategy import OFFLOAD_CLASSES, Strategy

FORMAT_VERSION = 1
PLACEMENT = "rank = sum of coordinate x stride over the axes; the first axis varies fastest"


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """What the user asked for, beyond the plan dict: enough to rebuild the same graph and cluster."""

    model: str
    cluster: str
    overrides: Mapping[str, Any] = field(default_factory=dict)
    dims: Mapping[str, int] = field(default_factory=dict)
    memory_gib: float | None = None


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def strategy_from_dict(d: Mapping[str, Any]) -> Strategy:
    """The `strategy` dict of a plan (as `plan --json` prints it) back into a Strategy."""
    keys = ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "recompute", "sp", "zero", "schedule", "layouts",
            "full_recompute_layers")
    kw = {k: d[k] for k in keys if k in d}
    kw["stage_layers"] = tuple(d.get("stage_layers") or ())
    kw["offload"] = tuple(sorted((k, float(v)) for k, v in dict(d.get("offload") or {}).items()))
    return Strategy(**kw)


def _model(request: Request, graph: Graph) -> dict[str, Any]:
    out: dict[str, Any] = {"name": os.path.basename(request.model)}
    if os.path.exists(request.model):
        out.update(source="file", path=request.model, sha256=file_sha256(request.model))
    else:
        out.update(source="zoo", zoo=request.model, overrides=dict(sorted(request.overrides.items())))
    out["dims"] = dict(sorted(request.dims.items()))
    out.update(params=graph.param_count, tensors=len(graph.params))
    return out


def _meshes(mesh: list[Mapping[str, Any]], n_devices: int) -> list[dict[str, Any]]:
    axes, aliases = [], []
    for a in mesh:
        row = {"name": a["name"], "size": a["size"], "stride": a["stride"], "levels": list(a.get("levels", []))}
        if a["name"] == "ep":
            row["within"] = ["cp", "dp"]
            aliases.append(row)
        else:
            axes.append(row)
    out: dict[str, Any] = {"name": "world", "devices": n_devices, "axes": axes}
    if aliases:
        out["aliases"] = aliases
    out["placement"] = PLACEMENT
    return [out]


def _programs(structure: Structure, s: Strategy, n_devices: int, microbatches: int) -> list[dict[str, Any]]:
    chunk_of = assign_chunks(structure, s.pp * s.vpp, s.stage_layers)
    per_stage = n_devices // s.pp
    stages = []
    for st in range(s.pp):
        chunks = []
        for v in range(s.vpp):
            c = v * s.pp + st
            chunks.append({
                "chunk": c,
                "layers": [b.name for b in structure.blocks if b.is_layer and chunk_of[b.name] == c],
                "blocks": [b.name for b in structure.blocks if not b.is_layer and chunk_of[b.name] == c],
            })
        stages.append({"stage": st, "ranks": {"first": st * per_stage, "count": per_stage}, "chunks": chunks})
    return [{
        "name": "main",
        "submodels": [sm.name for sm in structure.submodels],
        "mesh": "world",
        "ranks": {"first": 0, "count": n_devices},
        "micro_batch_size": s.micro_batch,
        "micro_batches": microbatches,
        "schedule": s.schedule,
        "virtual_stages": s.vpp,
        "stages": stages,
    }]


def zero_section(s: Strategy) -> dict[str, Any]:
    """ZeRO (Rajbhandari 2020) over the data-parallel ranks, which include the context-parallel ones."""
    sharded = ["optimizer", "grads", "params"][: s.zero]
    return {"stage": s.zero, "axes": [a for a, n in (("dp", s.dp), ("cp", s.cp)) if n > 1], "sharded": sharded,
            "reshard_after_forward": s.zero == 3}


def recompute_section(structure: Structure, s: Strategy) -> dict[str, Any]:
    """Per layer, in hyper-parallel's terms: save, recompute, swap; a layer takes its exact rule, else its glob.

    selective = recompute the attention core only (Korthikanti 2022, section 5);
    full = keep the layer input, recompute the rest. The first
    `full_layers_per_chunk` layers of each pipeline chunk recompute fully
    whatever the policy (they are listed by name). The activation offload
    fraction becomes the share of a layer's saved tensors swapped to host.
    """
    rules = {"none": ("save", {}), "selective": ("save", {"core_attention": "recompute"}),
             "full": ("recompute", {"layer_input": "save"})}
    swap = s.offload_fraction("activations")

    def rule(match: str, policy: str) -> dict[str, Any]:
        default, ops = rules[policy]
        return {"match": match, "default": default, "ops": dict(ops), "swap_fraction": swap}

    layers = []
    if s.full_recompute_layers and s.recompute != "full":
        chunk_of = assign_chunks(structure, s.pp * s.vpp, s.stage_layers)
        position: dict[int, int] = {}
        for b in structure.layers():
            k = position.get(chunk_of[b.name], 0)
            position[chunk_of[b.name]] = k + 1
            if s.layer_policy(k) == "full":
                layers.append(rule(b.name, "full"))
    for stack in dict.fromkeys(b.stack for b in structure.layers()):
        layers.append(rule(f"{stack}.*" if stack else "*", s.recompute))
    return {"policy": s.recompute, "full_layers_per_chunk": s.full_recompute_layers, "layers": layers}


def build_document(plan: Mapping[str, Any], graph: Graph, structure: Structure, request: Request) -> dict[str, Any]:
    """The declaration of `plan` (the dict `plan_model` returns, or one `declared.score` builds) on `graph`."""
    s = strategy_from_dict(plan["strategy"])
    wl = plan["workload"]
    est = {k: v for k, v in plan["estimate"].items() if k != "layouts"}
    n = plan["cluster"]["devices"]
    roles = param_roles(graph, structure)
    params = param_layouts(graph, structure, plan["estimate"].get("layouts", {}), roles, s, wl["seq_len"])
    doc: dict[str, Any] = {
        "hypershard": FORMAT_VERSION,
        "model": _model(request, graph),
        "workload": {k: wl[k] for k in ("mode", "global_batch", "seq_len", "dtype")},
        "cluster": {"name": plan["cluster"]["name"], "spec": request.cluster, "devices": n,
                    "memory_gib": request.memory_gib},
        "meshes": _meshes(list(plan["mesh"]), n),
        "programs": _programs(structure, s, n, int(est.get("microbatches", 1))),
        "layouts": {"space": s.layouts, "sequence_parallel": s.sp, "params": compress(params, structure),
                    "activations": activation_layouts(graph, structure, s, wl["seq_len"])},
        "zero": zero_section(s),
        "recompute": recompute_section(structure, s),
        "offload": {cls: s.offload_fraction(cls) for cls in OFFLOAD_CLASSES},
        "estimate": est,
    }
    if "search" in plan:
        doc["search"] = dict(plan["search"])
    if plan.get("runners_up"):
        doc["runners_up"] = [{"summary": r["summary"], "step_time_s": r["step_time_s"], "why": r["why"]}
                             for r in plan["runners_up"]]
    return doc
