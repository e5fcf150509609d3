"""Exporter to MindSpore hyper-parallel: `init_device_mesh`, `shard_module` with a `ShardingPlan`,
`fully_shard` with an offload policy, checkpoint and swap wrappers, `PipelineStage` and a schedule.

hyper-parallel takes layouts in the declaration's own alias form (per
tensor dim an axis name, a tuple of names, or "None"), so the plan is the
declared table resolved over the model's parameter names. Recompute and
swap follow hyper-parallel's checkpoint policies: `checkpoint_wrapper` for
a recomputed layer (with a policy keeping matmul outputs for selective
recompute), `swap_wrapper` for the share of layers whose activations go to
host memory. ZeRO-3 reshards after forward; ZeRO-1/2 keep parameters
gathered between forward and backward; host offload is a CPUOffloadPolicy.
Several programs (HyperMPMD): `use_program(rank)` binds the plan of the
rank's program, whose `DeviceMesh` spans only its own ranks. Pipeline
stages of different widths (an open item of hyper-parallel's roadmap) are
entries of their own: each stage's DeviceMesh and ShardingPlan over its
ranks, and `stage_peers` pairing the ranks that hand activations across;
`pipeline()` refuses them, since its PipelineStage assumes equal stages.
"""

from __future__ import annotations

from typing import Any, Mapping

from planner.hypershard.backends import common
from planner.hypershard.backends.jax import _mesh

SUFFIX = ".py"

_MESH = r'''
def build_mesh(device_type="npu"):
    """The world mesh, slowest axis first (rank = sum of coordinate x stride, tp fastest)."""
    return init_device_mesh(device_type=device_type, mesh_shape=tuple(n for _, n in MESH),
                            mesh_dim_names=tuple(a for a, _ in MESH))
'''

_MULTI_MESH = r'''
def build_mesh(device_type="npu"):
    """The mesh of this rank's program (call use_program first): its ranks, slowest axis first."""
    if PROGRAM is None:
        raise RuntimeError("call use_program(rank) before build_mesh()")
    ranks = np.arange(PROGRAM["first_rank"], PROGRAM["first_rank"] + PROGRAM["ranks"])
    return DeviceMesh(device_type, ranks.reshape(tuple(n for _, n in MESH)), mesh_dim_names=tuple(a for a, _ in MESH))
'''

_BODY = common.ALIAS_SRC + r'''

def sharding_plan(model):
    """The ShardingPlan: every parameter's declared layout as alias tuples, inputs split as declared."""
    plan = {name: tuple(_alias(s) for s in layout_of(name)["dims"]) for name, _ in model.named_parameters()}
    inputs = {key: tuple(_alias(s) for s in spec["dims"]) for key, spec in INPUTS.items()}
    return ShardingPlan(plan=plan, input_plan=inputs or None)


def _matches(path, pattern):
    return path.count(".") == pattern.count(".") and fnmatch.fnmatchcase(path, pattern)


def _replace(model, path, new):
    parent, _, leaf = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


def _keep_matmuls(ctx, op, *args, **kwargs):
    name = str(op)
    return CheckpointPolicy.MUST_SAVE if ("mm" in name or "matmul" in name) else CheckpointPolicy.MUST_RECOMPUTE


def _rule_of(path):
    """A layer's recompute rule: its exact entry, else the glob (of the same depth) that matches it."""
    for rule in RECOMPUTE:
        if rule["match"] == path:
            return rule
    return next((r for r in RECOMPUTE if any(c in r["match"] for c in "*?[") and _matches(path, r["match"])), None)


def _layers(model):
    return [(p, m) for p, m in model.named_modules() if p and _rule_of(p) is not None]


def apply_memory_policies(model):
    """Recompute (checkpoint_wrapper) and swap (swap_wrapper) per layer, as its rule says."""
    layers = _layers(model)
    for k, (path, module) in enumerate(layers):
        rule = _rule_of(path)
        if rule["default"] == "recompute":
            module = checkpoint_wrapper(module)
        elif rule.get("ops", {}).get("core_attention") == "recompute":
            module = checkpoint_wrapper(module, policy_fn=_keep_matmuls)
        if k < round(rule.get("swap_fraction", 0.0) * len(layers)):
            module = swap_wrapper(module)
        _replace(model, path, module)


def parallelize(model, mesh):
    """shard_module, then recompute and swap wrappers, then fully_shard on each layer and the root."""
    model = shard_module(model, mesh, sharding_plan(model))
    apply_memory_policies(model)
    sizes = dict(MESH)
    data_axes = tuple(a for a in ("dp", "ep", "cp") if sizes.get(a, 1) > 1)
    if data_axes:
        kwargs = {"mesh": mesh[data_axes[0] if len(data_axes) == 1 else data_axes],
                  "reshard_after_forward": ZERO["stage"] == 3}
        if any(OFFLOAD[k] > 0 for k in ("params", "grads", "optimizer")):
            kwargs["offload_policy"] = CPUOffloadPolicy()
        for _, layer in _layers(model):
            fully_shard(layer, **kwargs)
        fully_shard(model, **kwargs)
    return model


def pipeline(stage_model, mesh):
    """This rank's PipelineStage and the declared schedule over MICRO_BATCHES (stage_model: this stage's part)."""
    if STAGE is not None:
        raise NotImplementedError(
            f"stage {STAGE} of {len(STAGE_RANKS)} has a width of its own, and PipelineStage pairs one rank per stage "
            "over a pp mesh axis; hand activations across with the ranks stage_peers(rank, other) gives")
    pp = dict(MESH)["pp"]
    index = mesh["pp"].get_local_rank()
    stage = PipelineStage(stage_model, index, pp * VIRTUAL_STAGES, mesh=mesh["pp"])
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}.get(SCHEDULE, ScheduleInterleaved1F1B)
    if VIRTUAL_STAGES > 1:
        kind = ScheduleInterleaved1F1B
    return stage, kind([stage], MICRO_BATCHES)
'''


def _data(doc: Mapping[str, Any]) -> list[tuple[str, Any, str | None]]:
    axes, rename = _mesh(doc)
    prog = doc["programs"][0]
    acts = doc["layouts"].get("activations", {})
    return [
        ("MESH", axes, "(axis, size), slowest first"),
        ("_RENAME", rename, "declared axis -> mesh axes (dp is factored when experts use its ranks)"),
        ("LAYOUTS", {k: {"dims": e["dims"]} for k, e in common.layouts(doc).items()},
         "parameter name or glob -> per-dim axes (None: whole)"),
        ("INPUTS", {k: v for k, v in acts.items() if "*" not in k}, "model inputs"),
        ("STAGES", common.stage_layers(doc), "layers per pipeline stage"),
        ("SCHEDULE", prog["schedule"], None),
        ("VIRTUAL_STAGES", prog["virtual_stages"], None),
        ("MICRO_BATCHES", prog.get("micro_batches", 1), None),
        ("ZERO", doc["zero"], None),
        ("RECOMPUTE", doc["recompute"].get("layers", []), "per layer stack: save / recompute / swap"),
        ("OFFLOAD", doc["offload"], "fraction of each memory class in host memory"),
    ] + common.stage_data(doc)


def render(doc: Mapping[str, Any], *, base_dir: str | None = None) -> str:
    multi = common.grouped(doc)
    use = "    use_program(get_rank())   # several programs: bind this rank's first\n" if multi else ""
    lines = ['"""' + common.header(doc, "hyper-parallel plan") + f"\n\nUse:\n\n{use}    mesh = build_mesh()\n"
             "    model = parallelize(model, mesh)\n    stage, schedule = pipeline(stage_model, mesh)  # with pp > 1\n"
             '"""', "", "from __future__ import annotations", "", "import fnmatch", ""]
    if multi:
        lines += ["import numpy as np", "", "from hyper_parallel import DeviceMesh, PipelineStage, shard_module"]
    else:
        lines += ["from hyper_parallel import PipelineStage, init_device_mesh, shard_module"]
    lines += ["from hyper_parallel.core.activation_checkpoint import CheckpointPolicy, checkpoint_wrapper, swap_wrapper",
              "from hyper_parallel.core.fully_shard import fully_shard",
              "from hyper_parallel.core.fully_shard.utils import CPUOffloadPolicy",
              "from hyper_parallel.core.pipeline_parallel import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B",
              "from hyper_parallel.core.shard.sharding_plan import ShardingPlan", ""]
    return common.assemble(lines, doc, _data, _BODY, mesh=(_MESH, _MULTI_MESH))
