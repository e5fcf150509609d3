"""Exporter to mindspore-ai/hyper-parallel on its torch platform (HYPER_PARALLEL_PLATFORM=torch).

The generated file applies the plan with hyper-parallel's own API, every
name of which is pinned from its source (tests/data/hyper_parallel_api.json):
`init_device_mesh`, `shard_module` with a `ShardingPlan` of Placements for
the split parameters and the model inputs (key "input"), `checkpoint_wrapper`
(with a policy keeping matmul outputs for selective recompute) and the torch
platform's `swap_wrapper` per layer, `fully_shard` per layer and root over
the data-parallel ranks (ZeRO-3 reshards after forward, ZeRO-1/2 do not,
ZeRO-0 is HSDP over one shard rank; host offload its `CPUOffloadPolicy`),
and a `PipelineStage` per chunk with `Schedule1F1B` or
`ScheduleInterleaved1F1B`. What the generated code relies on in the real
source is listed in `hyper_parallel_src`. Several programs (HyperMPMD): one
file, `use_program(rank)` binds the rank's program, and every rank makes
every program's mesh.

Refused before anything is written, each in one sentence: pipeline stages
of different widths (PipelineStage places world / stages ranks on each
stage), a tensor dim split over mesh axes in another order than the mesh's
(Placements cannot say it), and experts with data-parallel replicas (dp >
ep: the experts are left out of fully_shard, so their replicas would drift).
An embedding split over its vocabulary is applied whole and listed in the
file (`KEPT_WHOLE`): hyper-parallel's Embedding rule looks ids up in the
local rows only, and the planner's own plans split embeddings that way.
"""

from __future__ import annotations

from typing import Any, Mapping

from planner.errors import InvalidInput
from planner.hypershard.backends import common
from planner.hypershard.backends.hyper_parallel_src import (BODY_SRC, IMPORTS, MESH_SRC, MULTI_MESH_SRC,
                                                            PLACEMENTS_SRC, PROGRAM_MESHES_SRC)
from planner.hypershard.backends.jax import _mesh
from planner.hypershard.backends.module_src import CHUNKS_SRC, LAYERS_SRC, chunks
from planner.hypershard.declared import view_strategy
from planner.hypershard.layouts import dim_axes
from planner.hypershard.programs import rank_label, views

SUFFIX = ".py"


def _data(doc: Mapping[str, Any]) -> list[tuple[str, Any, str | None]]:
    axes, rename = _mesh(doc, "hyper-parallel")
    prog = doc["programs"][0]
    acts = doc["layouts"].get("activations", {})
    return [
        ("MESH", axes, "(axis, size), slowest first"),
        ("_RENAME", rename, "declared axis -> mesh axes (dp is factored when experts use its ranks)"),
        ("LAYOUTS", {k: {"dims": e["dims"], "op": e.get("op")} for k, e in common.layouts(doc).items()},
         "parameter name or glob -> per-dim axes (None: whole)"),
        ("KEPT_WHOLE", kept_whole(doc["layouts"]["params"]),
         "declared vocabulary splits of embeddings, applied whole (hyper-parallel's Embedding looks ids up locally)"),
        ("INPUTS", {k: {"dims": v["dims"]} for k, v in acts.items() if "*" not in k}, "model inputs"),
        ("LAYER_INPUTS", {k: {"dims": v["dims"]} for k, v in acts.items() if "*" in k}, "each layer's input"),
        ("CHUNKS", chunks(doc), "pipeline chunks in order; chunk c runs on stage c mod pp"),
        ("SCHEDULE", prog["schedule"], "as declared; run by Schedule1F1B (or ScheduleInterleaved1F1B)"),
        ("VIRTUAL_STAGES", prog["virtual_stages"], None),
        ("MICRO_BATCHES", prog.get("micro_batches", 1), "per step and pipeline"),
        ("ZERO", doc["zero"], None),
        ("RECOMPUTE", doc["recompute"].get("layers", []), "per layer stack: save / recompute / swap"),
        ("OFFLOAD", doc["offload"], "fraction of each memory class in host memory"),
    ]


def _out_of_order(doc: Mapping[str, Any]) -> str | None:
    """A parameter pattern with a dim split over mesh axes in another order than the mesh's (None: there is none)."""
    axes, rename = _mesh(doc, "hyper-parallel")
    order = [a for a, _ in axes]
    for pattern, entry in doc["layouts"]["params"].items():
        for spec in entry["dims"]:
            names = [m for a in dim_axes(spec) for m in rename.get(a, (a,))]
            if names != sorted(names, key=order.index):
                return f"{pattern} (dim over {', '.join(names)})"
    return None


def kept_whole(params: Mapping[str, Any]) -> list[str]:
    """Embeddings split over their vocabulary: hyper-parallel's Embedding rule (core/shard/ops/parallel_embedding.py)
    keeps only the weight's last-dim split and looks every id up in the local rows, so they are applied whole."""
    return [k for k, e in params.items() if e.get("op") == "embedding" and e["dims"] and dim_axes(e["dims"][0])]


def unexpressed(doc: Mapping[str, Any], label: str = "the plan") -> str | None:
    """The first plan feature of one program (a view) that hyper-parallel's API cannot run, in one sentence."""
    strategy = view_strategy(doc)
    if strategy.stage_tp:
        return (f"hyper-parallel's PipelineStage gives each of the {len(strategy.stage_tp)} stages world / stages "
                f"ranks, and {label} has stages of different widths (tp {', '.join(map(str, strategy.stage_tp))}); "
                "plan with equal stages for --backend hyper-parallel")
    bad = _out_of_order(doc)
    if bad:
        return (f"{label} splits {bad} against the mesh order (slowest first), which hyper-parallel's Placements "
                "cannot say; declare the dim's axes slowest first")
    sizes = common.axis_sizes(doc)
    ep, dp = sizes.get("ep", 1), sizes.get("dp", 1)
    experts = any("ep" in dim_axes(s) for e in doc["layouts"]["params"].values() for s in e["dims"])
    if experts and ep > 1 and dp > ep:
        return (f"{label} keeps {dp // ep} data-parallel replicas of each expert (dp {dp} over ep {ep}), and the "
                "hyper-parallel export leaves experts out of fully_shard; plan with ep equal to dp")
    return None


def render(doc: Mapping[str, Any], *, base_dir: str | None = None) -> str:
    for k, v in enumerate(views(doc)):
        why = unexpressed(v, rank_label(doc, k) if len(doc["programs"]) > 1 else "the plan")
        if why:
            raise InvalidInput(why)
    multi = common.grouped(doc)
    use = "    use_program(torch.distributed.get_rank())   # several programs: bind this rank's first\n" if multi else ""
    lines = ['"""' + common.header(doc, "hyper-parallel plan (torch platform)") + "\n\nRun with "
             f"HYPER_PARALLEL_PLATFORM=torch inside an initialised process group:\n\n{use}"
             "    mesh = build_mesh(\"npu\")\n    model = parallelize(model, mesh)\n"
             "    inputs = shard_inputs(mesh, input_ids=ids, labels=ids)   # every rank passes the global batch\n\n"
             "With pipeline stages: `stages, schedule = pipeline(model, mesh, loss_fn, device)`.\n\"\"\"", "",
             "from __future__ import annotations", "", "import copy", "import fnmatch", "import inspect", ""] + IMPORTS + [""]
    mesh = (MESH_SRC, PROGRAM_MESHES_SRC.strip("\n") + "\n\n\n" + MULTI_MESH_SRC)
    body = "\n\n".join(src.strip("\n") + "\n" for src in (PLACEMENTS_SRC, LAYERS_SRC, CHUNKS_SRC, BODY_SRC))
    return common.assemble(lines, doc, _data, body, mesh=mesh)
