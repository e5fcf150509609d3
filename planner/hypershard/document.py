"""The HyperShard declaration: a plan written as data an execution backend can apply.

One document holds what to run (model, workload), where (cluster, the
named mesh with its rank placement), how (the programs: rank groups,
pipeline stages with their layers, schedule, micro-batches; per-parameter
and boundary layouts; ZeRO; recompute and swap per layer; offload per
memory class) and the estimate it was chosen by. A plan of several programs
(HyperMPMD: encoders beside the backbone) has a mesh per program, named
after it, and each program carries its own layouts, ZeRO, recompute and
offload sections and estimate (see `programs`). Pipeline stages of
different widths state their own `tp` and `ranks` (see `stages`). The
strategy is not stored twice: `declared.strategy_of` reads it back from
these sections, so a hand edit of, say, the ZeRO stage or a stage's tp is
what `validate` and `estimate --plan` score. Sections built here from the strategy (layouts, recompute rules)
are what backends apply; `validate` reports where they differ from what
the strategy implies.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from planner.errors import InvalidInput
from planner.graph.blocks import Structure
from planner.graph.ir import Graph
from planner.graph.mtp import mtp_depths
from planner.hypershard.layouts import activation_layouts, param_layouts
from planner.hypershard.patterns import compress
from planner.hypershard.roles import param_roles
from planner.hypershard.stages import STAGE_PLACEMENT, placed_ranges
from planner.costing.pipeline_cut import assign_chunks, layer_policies
from planner.strategy import OFFLOAD_CLASSES, Strategy

FORMAT_VERSION = 1
#: The HyperMPMD splits a declaration holds (`MpmdResult.kind`): encoders | backbone; a plan of attention | experts
#: programs is planned and printed, but not declared.
DECLARED_MPMD = ("encoders",)
PLACEMENT = "rank = sum of coordinate x stride over the axes; the first axis varies fastest"
PROGRAM_PLACEMENT = "rank = the program's first rank + sum of coordinate x stride over the axes; the first axis varies fastest"


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
            "full_recompute_layers", "flushes")
    kw = {k: d[k] for k in keys if k in d}
    if d.get("etp") and d["etp"] != d.get("tp", 1):
        kw["etp"] = d["etp"]
    kw["stage_layers"] = tuple(d.get("stage_layers") or ())
    kw["stage_tp"] = tuple(d.get("stage_tp") or ())
    kw["offload"] = tuple(sorted((k, float(v)) for k, v in dict(d.get("offload") or {}).items()))
    return Strategy(**kw)


def model_section(request: Request, graph: Graph) -> dict[str, Any]:
    """The model as the declaration names it: an ONNX file (path, hash), a Hugging Face config.json (path, hash of
    the config.json, overrides) or a zoo model (name, overrides)."""
    from planner.model_source import content_file, display_name, kind_of

    out: dict[str, Any] = {"name": display_name(request.model)}
    kind = kind_of(request.model)
    if kind == "onnx":
        out.update(source="file", path=request.model, sha256=file_sha256(request.model))
    elif kind == "hf_config":
        out.update(source="hf_config", path=request.model, sha256=file_sha256(str(content_file(request.model))),
                   overrides=dict(sorted(request.overrides.items())))
    else:
        out.update(source="zoo", zoo=request.model, overrides=dict(sorted(request.overrides.items())))
    out["dims"] = dict(sorted(request.dims.items()))
    out.update(params=graph.param_count, tensors=len(graph.params))
    return out


def _mesh(name: str, mesh: list[Mapping[str, Any]], n_devices: int, placement: str) -> dict[str, Any]:
    """The named mesh of a program; the plan's per-stage entries of stages of different widths (`stage<k>`, with
    their ranks) are the program's stages' `tp` and `ranks` instead, and the placement says how they read."""
    axes, aliases = [], []
    if any("ranks" in a for a in mesh):
        placement = STAGE_PLACEMENT
    for a in mesh:
        if "ranks" in a:
            continue
        row = {"name": a["name"], "size": a["size"], "stride": a["stride"], "levels": list(a.get("levels", []))}
        if a["name"] == "ep":  # experts over the stage's ranks; with etp 1 < tp across the tensor axis too
            if a.get("within") == "tp x cp x dp" and a.get("etp", 1) != 1:
                raise InvalidInput(f"--etp {a['etp']} is neither 1 nor the tensor degree; a declaration folds "
                                   "experts with etp = tp or etp = 1, so give one of those")
            row["within"] = ["tp", "cp", "dp"] if a.get("within") == "tp x cp x dp" else ["cp", "dp"]
            aliases.append(row)
        else:
            axes.append(row)
    out: dict[str, Any] = {"name": name, "devices": n_devices, "axes": axes}
    if aliases:
        out["aliases"] = aliases
    out["placement"] = placement
    return out


def _program(name: str, mesh: str, submodels: list[str], structure: Structure, s: Strategy, first: int, count: int,
             microbatches: int) -> dict[str, Any]:
    """One program on ranks first..first+count-1 over `mesh`: its stages, chunks and batches.

    Stage k runs on the k-th slice of the program's ranks (pp is the slowest axis); stages of different
    widths (`Strategy.stage_tp`) state their `tp` and run on the blocks `plan.stage_ranks` places.
    """
    chunk_of = assign_chunks(structure, s.pp * s.vpp, s.stage_layers)
    ranges = placed_ranges(s)
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
        entry: dict[str, Any] = {"stage": st}
        if s.stage_tp:
            entry["tp"] = s.stage_tp[st]
        entry["ranks"] = {"first": first + ranges[st][0], "count": ranges[st][1]}
        entry["chunks"] = chunks
        stages.append(entry)
    return {
        "name": name,
        "submodels": submodels,
        "mesh": mesh,
        "ranks": {"first": first, "count": count},
        "micro_batch_size": s.micro_batch,
        "micro_batches": microbatches,
        "pipeline_flushes": s.flushes,
        "schedule": s.schedule,
        "virtual_stages": s.vpp,
        "stages": stages,
    }


def zero_section(s: Strategy) -> dict[str, Any]:
    """ZeRO (Rajbhandari 2020) over the data-parallel ranks, which include the context-parallel ones."""
    sharded = ["optimizer", "grads", "params"][: s.zero]
    return {"stage": s.zero, "axes": [a for a, n in (("dp", s.dp), ("cp", s.cp)) if n > 1], "sharded": sharded,
            "reshard_after_forward": s.zero == 3}


def recompute_section(structure: Structure, s: Strategy, mtp: int = 0) -> dict[str, Any]:
    """Per layer, in hyper-parallel's terms: save, recompute, swap; a layer takes its exact rule, else its glob.

    selective = recompute the attention core only (Korthikanti 2022, section 5);
    full = keep the layer input, recompute the rest. The first
    `full_layers_per_chunk` layers of each pipeline chunk recompute fully
    whatever the policy (they are listed by name), but for multi-token-
    prediction depths (`layer_policies`). The activation offload
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
        policy = layer_policies(structure, assign_chunks(structure, s.pp * s.vpp, s.stage_layers), s, mtp)
        layers += [rule(b.name, "full") for b in structure.layers() if policy[b.name] == "full"]
    for stack in dict.fromkeys(b.stack for b in structure.layers()):
        layers.append(rule(f"{stack}.*" if stack else "*", s.recompute))
    return {"policy": s.recompute, "full_layers_per_chunk": s.full_recompute_layers, "layers": layers}


def sections(graph: Graph, structure: Structure, s: Strategy, seq_len: int,
             estimated: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    """The strategy's layouts (from the estimate's per-block-type table), ZeRO, recompute and offload sections."""
    roles = param_roles(graph, structure)
    params = param_layouts(graph, structure, estimated, roles, s, seq_len)
    return {
        "layouts": {"space": s.layouts, "sequence_parallel": s.sp, "params": compress(params, structure),
                    "activations": activation_layouts(graph, structure, s, seq_len)},
        "zero": zero_section(s),
        "recompute": recompute_section(structure, s, mtp_depths(graph, structure)),
        "offload": {cls: s.offload_fraction(cls) for cls in OFFLOAD_CLASSES},
    }


def _head(plan: Mapping[str, Any], graph: Graph, request: Request, structure: Structure) -> dict[str, Any]:
    wl = plan["workload"]
    model = model_section(request, graph)
    mtp = mtp_depths(graph, structure)
    if mtp:  # frameworks build these apart from the decoder layers (Megatron-LM: --mtp-num-layers)
        model["mtp_layers"] = mtp
    return {
        "hypershard": FORMAT_VERSION,
        "model": model,
        "workload": {k: wl[k] for k in ("mode", "global_batch", "seq_len", "dtype", "stack") if k in wl},
        "cluster": {"name": plan["cluster"]["name"], "spec": request.cluster, "devices": plan["cluster"]["devices"],
                    "memory_gib": request.memory_gib},
    }


def build_document(plan: Mapping[str, Any], graph: Graph, structure: Structure, request: Request) -> dict[str, Any]:
    """The declaration of `plan` (the dict `plan_model` returns, or one `declared.score` builds) on `graph`."""
    if (plan.get("mpmd") or {}).get("used"):
        return _multi_document(plan, graph, structure, request)
    s = strategy_from_dict(plan["strategy"])
    est = recorded_figures(plan["estimate"])
    n = plan["cluster"]["devices"]
    doc = _head(plan, graph, request, structure)
    doc["meshes"] = [_mesh("world", list(plan["mesh"]), n, PLACEMENT)]
    doc["programs"] = [_program("main", "world", [sm.name for sm in structure.submodels], structure, s, 0, n,
                                int(est.get("microbatches", 1)))]
    doc.update(sections(graph, structure, s, plan["workload"]["seq_len"], plan["estimate"].get("layouts", {})))
    doc["estimate"] = est
    return _tail(doc, plan)


def _multi_document(plan: Mapping[str, Any], graph: Graph, structure: Structure,
                    request: Request) -> dict[str, Any]:
    """Several programs (HyperMPMD): a mesh per program, named after it, and each program with its own sections."""
    from planner.search.mpmd import split_programs

    split = {p.name: p for p in split_programs(graph, structure)}
    names = [entry["name"] for entry in plan["programs"]]
    if names != list(split):
        raise InvalidInput(f"this plan runs the programs {' | '.join(names)}, and declarations hold the encoders | "
                           f"backbone split ({' | '.join(split) or 'none for this model'}) only; re-plan with "
                           "--no-mpmd to write one")
    doc = _head(plan, graph, request, structure)
    doc["meshes"], doc["programs"] = [], []
    for entry in plan["programs"]:
        program = split[entry["name"]]
        s = strategy_from_dict(entry["strategy"])
        est = entry["estimate"]
        first, count = entry["ranks"][0], entry["devices"]
        doc["meshes"].append(_mesh(entry["name"], list(entry["mesh"]), count, PROGRAM_PLACEMENT))
        prog = _program(entry["name"], entry["name"], list(entry["submodels"]), program.structure, s, first, count,
                        int(est.get("microbatches", 1)))
        prog.update(sections(program.graph, program.structure, s, plan["workload"]["seq_len"], est.get("layouts", {})))
        prog["estimate"] = recorded_figures(est)
        doc["programs"].append(prog)
    doc["estimate"] = recorded_figures(plan["estimate"])
    return _tail(doc, plan)


def recorded_figures(estimate: Mapping[str, Any]) -> dict[str, Any]:
    """An estimate as a declaration records it: its figures, without the per-block-type layout tables (the
    layouts section says them per parameter)."""
    return {k: v for k, v in estimate.items() if k not in ("layouts", "expert_layouts")}


def _tail(doc: dict[str, Any], plan: Mapping[str, Any]) -> dict[str, Any]:
    for key in ("accuracy", "assumptions"):  # how far off its figures may be, and what they rest on, when planned
        if plan.get(key):
            doc[key] = plan[key]
    if "search" in plan:
        doc["search"] = dict(plan["search"])
    if plan.get("constraints"):
        doc["constraints"] = dict(plan["constraints"])
    if plan.get("runners_up"):
        doc["runners_up"] = [{"summary": r["summary"], "step_time_s": r["step_time_s"], "why": r["why"]}
                             for r in plan["runners_up"]]
    if plan.get("close_calls"):  # the runners-up the estimate did not tell from the plan
        doc["close_calls"] = dict(plan["close_calls"])
    return doc
