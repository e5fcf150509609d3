"""What a generated hyper-parallel file runs (its torch platform, mindspore-ai/hyper-parallel, pinned API in
tests/data/hyper_parallel_api.json): meshes, the ShardingPlan, inputs, fully_shard, the pipeline.

Facts of the real source these pieces rest on (read at fdd0a80, checked on CPU by
benchmarks/check_hyper_parallel.py):

- `torch.distributed.new_group`, which hyper-parallel's DeviceMesh calls for
  each axis, is entered by every rank: each rank makes every program's
  mesh (and every data-parallel mesh) in the same order.
- `shard_module` reads an alias tuple such as ("None", "tp") as the axes of
  one dim (`Layout(value)`, not `Layout(*value)`), so it would split dim 0;
  the plan is given as Placements (one per mesh axis), which it reads right.
- Its DTensor ops need every operand laid out, so with split parameters the
  inputs are DTensors too (`shard_inputs`); with none split, shard_module is
  not called and the model runs on plain tensors under fully_shard.
- fully_shard takes a 1-D mesh (FSDP) or a 2-D one (HSDP: replicate, shard);
  ZeRO-0 is HSDP whose shard axis has one rank.
- PipelineStage(submodule, stage_index, stage_num, device, group=...) takes
  no mesh and no loss: the schedule back-propagates from the last stage's
  output with a gradient of one per micro-batch, so the last chunk returns
  its share of the loss; keyword inputs reach every stage.
- ScheduleGPipe fails in its own constructor (`self.stage`), so a GPipe
  plan runs Schedule1F1B: the same order while micro-batches <= stages,
  and never more activations in flight than GPipe.
"""

from __future__ import annotations

#: Placements from declared dims (shared with the serving export, whose dims name mesh axes through `_named`).
PLACEMENTS_SRC = r'''
def placements(dims, axes):
    """One placement per mesh axis of `axes` (names, slowest first) for a tensor whose dims are split over mesh
    axes (per dim None, a name or a tuple of names, major first): Shard(d) on each axis that splits dim d."""
    out = [Replicate()] * len(axes)
    for d, spec in enumerate(dims):
        for a in () if spec is None else (spec,) if isinstance(spec, str) else spec:
            out[axes.index(a)] = Shard(d)
    return tuple(out)


def applied(entry):
    """The dims shard_module applies: as declared, but an embedding's vocabulary dim whole (hyper-parallel's
    Embedding rule keeps only the weight's last-dim split and looks every id up in the local rows)."""
    dims = list(entry["dims"])
    if entry.get("op") == "embedding" and dims:
        dims[0] = None
    return dims
'''

#: Every program's mesh, made on every rank (shared with the serving export).
PROGRAM_MESHES_SRC = r'''
def _program_meshes(device_type):
    """Every program's mesh by name, over its own ranks, slowest axis first, with those ranks (all ranks make
    them all, in order: hyper-parallel makes their process groups with torch.distributed.new_group)."""
    out = {}
    for program in PROGRAMS:
        axes = program["plan"]["MESH"]
        ranks = tuple(range(program["first_rank"], program["first_rank"] + program["ranks"]))
        out[program["name"]] = (init_device_mesh(device_type, tuple(n for _, n in axes),
                                                 mesh_dim_names=tuple(a for a, _ in axes), rank_list=ranks), ranks)
    return out
'''

MESH_SRC = r'''
def build_mesh(device_type="npu"):
    """The world mesh, slowest axis first (rank = sum of coordinate x stride, tp fastest), and the mesh
    fully_shard runs on (every rank calls this: process groups are made by all ranks together)."""
    mesh = init_device_mesh(device_type, tuple(n for _, n in MESH), mesh_dim_names=tuple(a for a, _ in MESH))
    DATA_MESHES[None] = _data_mesh(device_type, mesh, MESH, ZERO["stage"], tuple(range(_size(MESH))))
    return mesh
'''

MULTI_MESH_SRC = r'''
def build_mesh(device_type="npu"):
    """This rank's program mesh (call use_program first), after making every program's mesh and data-parallel
    mesh on every rank."""
    if PROGRAM is None:
        raise RuntimeError("call use_program(rank) before build_mesh()")
    meshes = _program_meshes(device_type)
    for program in PROGRAMS:
        mesh, ranks = meshes[program["name"]]
        plan = program["plan"]
        DATA_MESHES[program["name"]] = _data_mesh(device_type, mesh, plan["MESH"], plan["ZERO"]["stage"], ranks)
    return meshes[PROGRAM["name"]][0]
'''

BODY_SRC = r'''
DATA_MESHES = {}  # program name (None: the only one) -> the mesh fully_shard runs on, made by build_mesh
_DATA_AXES = ("dp", "ep", "cp")  # the ranks a batch (and its sequence) is split over: adjacent in MESH


def _size(axes):
    out = 1
    for _, n in axes:
        out *= n
    return out


def _data_mesh(device_type, mesh, axes, zero_stage, ranks):
    """The mesh fully_shard runs on (None: no data parallelism): one data axis as it is for ZeRO 1-3, else the
    data axes merged into one, as the shard axis (ZeRO 1-3) or the replicate axis over a shard axis of one rank
    (ZeRO-0). A merged mesh is a mesh of its own over `ranks` (DeviceMesh.flatten would make its groups per
    sub-mesh, which not every rank enters)."""
    data = [(a, n) for a, n in axes if a in _DATA_AXES and n > 1]
    if not data:
        return None
    if len(data) == 1 and zero_stage > 0:
        return mesh[data[0][0]]
    shape, names = [], []
    for a, n in axes:
        if a not in _DATA_AXES:
            shape.append(n)
            names.append(a)
        elif "dp_shard" not in names:
            shape += [_size(data), 1] if zero_stage == 0 else [_size(data)]
            names += ["dp_replicate", "dp_shard"] if zero_stage == 0 else ["dp_shard"]
    merged = init_device_mesh(device_type, tuple(shape), mesh_dim_names=tuple(names), rank_list=ranks)
    return merged[("dp_replicate", "dp_shard")] if zero_stage == 0 else merged["dp_shard"]


def _mesh_axes(spec):
    """A declared dim's mesh axes (a tuple, major first): the declaration's names, dp factored as _RENAME says."""
    names = () if spec is None else (spec,) if isinstance(spec, str) else tuple(spec)
    return tuple(m for a in names for m in _RENAME.get(a, (a,)))


def _model_axes():
    """The axes shard_module lays tensors out over: all, but pp when there are stages (a stage's tensors live on
    its own ranks)."""
    staged = dict(MESH)["pp"] > 1
    return tuple(a for a, _ in MESH if not (staged and a == "pp"))


def _model_mesh(mesh):
    return mesh[_model_axes()] if dict(MESH)["pp"] > 1 else mesh


def model_split():
    """Whether any parameter is split over a mesh axis (only then is shard_module applied)."""
    return any(_mesh_axes(s) for e in LAYOUTS.values() for s in applied(e))


def sharding_plan(model):
    """The ShardingPlan: every parameter's declared layout and the model inputs' (key "input": hyper-parallel
    takes forward-plan keys ending in input or output), as Placements over the model axes."""
    axes = _model_axes()
    plan = {name: placements([_mesh_axes(s) for s in applied(layout_of(name))], axes)
            for name, _ in model.named_parameters()}
    inputs = {key: placements([_mesh_axes(s) for s in spec["dims"]], axes) for key, spec in INPUTS.items()}
    forward = dict(_layer_inputs(model), **({"input": inputs} if inputs else {}))
    return ShardingPlan(plan=plan, input_plan=forward or None)


def _layer_inputs(model):
    """input_plan entries "<layer path>.input" for each layer's declared input, its first argument (the residual
    stream; split by sequence over tp under sequence parallelism), keyed by that argument's name."""
    out = {}
    for path, module in model.named_modules():
        spec = next((s for p, s in LAYER_INPUTS.items() if path and _matches(path, p)), None)
        if spec is not None:
            first = next(iter(inspect.signature(module.forward).parameters))
            out[f"{path}.input"] = {first: placements([_mesh_axes(s) for s in spec["dims"]], _model_axes())}
    return out


def batch_shard(mesh):
    """(index, count): which slice of each global batch this rank reads (its coordinate over the data axes)."""
    index, count = 0, 1
    for a, n in MESH:
        if a in _DATA_AXES[:2]:
            index, count = index * n + mesh.get_local_rank(a), count * n
    return index, count


def shard_inputs(mesh, **inputs):
    """This rank's part of each global model input (every rank passes the same tensors), laid out as declared: a
    DTensor when parameters are split (hyper-parallel's ops need every operand laid out), else plain. A keyword
    the declaration does not name (labels) is laid out as the first input it names (the token ids)."""
    first = next(iter(INPUTS.values()), {"dims": ["dp", None]})
    out = {}
    for name, value in inputs.items():
        dims = [_mesh_axes(s) for s in INPUTS.get(name, first)["dims"]]
        local = distribute_tensor(value, _model_mesh(mesh), placements(dims, _model_axes()))
        out[name] = local if model_split() else local.to_local()
    return out


def _full(module):
    return checkpoint_wrapper(module)


def _selective(module):
    return checkpoint_wrapper(module, policy_fn=_save_matmuls)


def _swap(module):
    return swap_wrapper(module)


def _experts(model):
    """Parameters split over ep: each ep rank holds its own experts, so fully_shard leaves them be."""
    return {p for name, p in model.named_parameters() if any("ep" in _mesh_axes(s) for s in layout_of(name)["dims"])}


def apply_fsdp(model, mesh):
    """fully_shard on each layer and on the root over the data-parallel mesh, as the ZeRO stage and offload say:
    ZeRO-3 reshards after forward, ZeRO-1/2 keep parameters gathered until backward, ZeRO-0 is HSDP sharding over
    one rank; host offload is CPUOffloadPolicy (parameters and gradients, all of them)."""
    data_mesh = DATA_MESHES[PROGRAM["name"] if "PROGRAM" in globals() else None]
    if data_mesh is None:
        return model
    offload = any(OFFLOAD[k] > 0 for k in ("params", "grads", "optimizer"))
    experts = _experts(model)
    for module in [layer for _, layer in _layers(model)] + [model]:
        fully_shard(module, mesh=data_mesh, reshard_after_forward=ZERO["stage"] == 3, ignored_params=experts,
                    offload_policy=CPUOffloadPolicy() if offload else OffloadPolicy())
    return model


def parallelize(model, mesh):
    """shard_module (when parameters are split), then recompute and swap wrappers, then fully_shard."""
    if model_split():
        model = shard_module(model, _model_mesh(mesh), sharding_plan(model))
    apply_recompute(model)
    return apply_fsdp(model, mesh)


class _Chunk(nn.Module):
    """One pipeline chunk of a Hugging Face *ForCausalLM: token ids in on the first, hidden states between; the
    last returns loss_fn(logits, labels) / MICRO_BATCHES, its share of the step's loss, since hyper-parallel's
    schedules take no loss function and back-propagate from it with a gradient of one."""

    def __init__(self, model, first, last, loss_fn):
        super().__init__()
        self.model, self.first, self.last, self.loss_fn = model, first, last, loss_fn

    def forward(self, x, labels=None):
        out = self.model(input_ids=x) if self.first else self.model(inputs_embeds=x)
        out = out.logits if hasattr(out, "logits") else out[0]
        return self.loss_fn(out, labels) / MICRO_BATCHES if self.last else out


def pipeline(model, mesh, loss_fn, device=None):
    """This rank's PipelineStage(s), a copy of `model` per chunk with only its layers, parallelized as declared,
    and the declared schedule. With `inputs = shard_inputs(mesh, input_ids=ids, labels=ids)`, run
    `schedule.run(inputs["input_ids"], labels=inputs["labels"])` on the first stage and `schedule.run(labels=
    inputs["labels"])` on the others (keyword inputs reach every stage); the last returns each micro-batch's loss."""
    pp = dict(MESH)["pp"]
    stages = [PipelineStage(_Chunk(parallelize(chunk_model(model, c), mesh), c == 0, c == len(CHUNKS) - 1, loss_fn),
                            c, len(CHUNKS), device, group=mesh.get_group("pp"))
              for c in range(mesh.get_local_rank("pp"), len(CHUNKS), pp)]
    if len(stages) > 1:
        return stages, ScheduleInterleaved1F1B(stages, MICRO_BATCHES)
    # GPipe plans too: ScheduleGPipe fails in its constructor at fdd0a80 (self.stage), and 1F1B runs GPipe's
    # order while micro-batches <= stages (beyond, it keeps fewer activations in flight than GPipe would)
    return stages, Schedule1F1B(stages[0], MICRO_BATCHES)
'''

#: The imports of a generated training file (torch platform); each name is pinned in tests/data.
IMPORTS = [
    "import torch",
    "from torch import nn",
    "",
    "from hyper_parallel import PipelineStage, init_device_mesh, shard_module",
    "from hyper_parallel.core.activation_checkpoint import CheckpointPolicy, checkpoint_wrapper",
    "from hyper_parallel.core.dtensor import distribute_tensor",
    "from hyper_parallel.core.fully_shard import fully_shard",
    "from hyper_parallel.core.pipeline_parallel import Schedule1F1B, ScheduleInterleaved1F1B",
    "from hyper_parallel.core.placement_types import Replicate, Shard",
    "from hyper_parallel.core.shard.sharding_plan import ShardingPlan",
    "from hyper_parallel.platform.torch.activation_checkpoint import swap_wrapper",
    "from hyper_parallel.platform.torch.fully_shard.utils import CPUOffloadPolicy, OffloadPolicy",
]

#: What the generated code reaches through objects: methods of the mesh and a DTensor, the policy's members.
REACHED = {
    "hyper_parallel.DeviceMesh": ["__getitem__", "get_group", "get_local_rank"],
    "hyper_parallel.core.dtensor.DTensor": ["to_local"],
    "hyper_parallel.core.activation_checkpoint.CheckpointPolicy": ["MUST_SAVE", "PREFER_RECOMPUTE"],
}

__all__ = ["REACHED", "BODY_SRC", "IMPORTS", "MESH_SRC", "MULTI_MESH_SRC", "PLACEMENTS_SRC", "PROGRAM_MESHES_SRC"]
