"""Exporter to PyTorch: a DeviceMesh, a `parallelize_module` plan, checkpointing and FSDP2, in torchtitan's style.

The generated file holds the declaration as data and applies it in
torchtitan's fixed order (tensor parallel, then activation checkpointing,
then FSDP). Tensor-parallel styles are chosen per module from its weight's
declared layout (`torch_tp`). ZeRO-1/2 map to FSDP2 without resharding
after forward, ZeRO-3 with it, ZeRO-0 to HSDP with one shard (plain data
parallel); host offload to CPUOffloadPolicy. Layouts torch's styles cannot
express (a split norm weight) are kept replicated and listed in the file;
a split linear stored [in, out] (GPT-2's Conv1D) is refused before
anything is written. Expert parallelism, which torch has no style for,
runs over the data-parallel ranks by an all-to-all module of the file's
own (`torch_experts`: one program, cp 1). At tp > 1 a MoE block runs on
each tensor rank's slice of the sequence with its experts whole
(`torch_moe_tp`: etp 1, sequence parallel, as the estimate costs it);
stacked experts split over tp are refused, since no torch style splits a
3-D weight. A head tied to its embedding keeps one weight through the styles,
and across pipeline stages its two copies' gradients are summed after each
step (`torch_tied`). Several programs (HyperMPMD) give one module:
`use_program(rank)` binds the plan of the program that rank runs, and
`build_mesh` makes every program's DeviceMesh over its own ranks (process
groups are made by all ranks together) and returns the rank's own.
Pipeline stages of different widths are such entries too, a DeviceMesh and
a tensor-parallel plan per stage; torch's pipelining schedules pair one
rank per stage over a pp axis, so their schedule here is a small 1F1B (or
GPipe) of its own (`torch_widths`): activations and gradients go point to
point between the ranks `stage_peers` pairs, with non-blocking sends (no
stage waits on one).
"""

from __future__ import annotations

from typing import Any, Mapping

from planner.hypershard.backends import common, torch_refusals as refusals
from planner.hypershard.backends.module_src import CHUNKS_SRC, LAYERS_SRC, chunks
from planner.hypershard.backends.torch_experts import EXPERTS_SRC
from planner.hypershard.backends.torch_moe_tp import MOE_TP_SRC
from planner.hypershard.backends.torch_tied import TIED_SRC
from planner.hypershard.backends.torch_tp import TP_SRC, own_param
from planner.hypershard.backends.torch_widths import WIDTH_SRC
from planner.hypershard.layouts import dim_axes

SUFFIX = ".py"

_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}

_MESH = r'''
def build_mesh(device_type="cuda"):
    """The world mesh, slowest axis first; data parallel is split into replicate x shard axes as in torchtitan
    (and, with expert parallelism, its data axis into edp x ep: see apply_expert_parallel; a MoE model at
    tp > 1 also has the (data, tp) axes flattened, where its MoE blocks reduce: see apply_local_tokens)."""
    shape, names = tuple(n for _, n in MESH), tuple(a for a, _ in MESH)
    if EXPERT_PARALLEL > 1:
        mesh = _split_data_axis(device_type, shape, names)
    else:
        mesh = init_device_mesh(device_type, shape, mesh_dim_names=names)
    return _fold_tp(mesh) if MOE_TOKEN_SPLIT else mesh
'''

_MULTI_MESH = r'''
def build_mesh(device_type="cuda"):
    """This rank's program mesh (call use_program first). Every rank makes every program's mesh, since process
    groups are created by all ranks together; each mesh spans its program's ranks, slowest axis first."""
    if PROGRAM is None:
        raise RuntimeError("call use_program(rank) before build_mesh()")
    meshes = {}
    for program in PROGRAMS:
        axes = program["plan"]["MESH"]
        ranks = torch.arange(program["first_rank"], program["first_rank"] + program["ranks"])
        meshes[program["name"]] = DeviceMesh(device_type, ranks.reshape(tuple(n for _, n in axes)),
                                             mesh_dim_names=tuple(a for a, _ in axes))
    return meshes[PROGRAM["name"]]
'''

_BODY = "\n\n".join(src.strip("\n") + "\n" for src in (TP_SRC, EXPERTS_SRC, MOE_TP_SRC, TIED_SRC, LAYERS_SRC,
                                                          CHUNKS_SRC)) + r'''

def _full(module):
    return checkpoint_wrapper(module)


def _selective(module):
    return checkpoint_wrapper(module, context_fn=partial(create_selective_checkpoint_contexts, _save_matmuls))


class _Swap(nn.Module):
    """Runs a layer with its saved activations kept in host memory (activation offload)."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        with torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available()):
            return self.module(*args, **kwargs)


def _swap(module):
    return _Swap(module)


def _fsdp_mesh(mesh, axis):
    """FSDP2's mesh over `axis` (a data axis, or one flattened from it): under ZeRO-0 HSDP with one shard,
    plain data parallel."""
    return mesh[(axis, "dp_shard")] if ZERO["stage"] == 0 else mesh[axis]


def _dp_mesh(mesh):
    if ZERO["stage"] > 0 and dict(MESH)["cp"] > 1:
        return mesh[("dp_shard", "cp")]._flatten("dp_shard_cp")
    return _fsdp_mesh(mesh, DATA_AXIS)


def apply_fsdp(model, mesh):
    """FSDP2 on each layer and on the root, as the declaration's ZeRO stage and offload say."""
    sizes = dict(MESH)
    if sizes["dp_replicate"] * sizes["dp_shard"] * sizes["cp"] == 1 and not MOE_TOKEN_SPLIT:
        return model
    kwargs = {"mesh": _dp_mesh(mesh), "reshard_after_forward": ZERO["stage"] == 3}
    if PARAM_DTYPE:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=getattr(torch, PARAM_DTYPE), reduce_dtype=torch.float32)
    if any(OFFLOAD[k] > 0 for k in ("params", "grads", "optimizer")):
        # torch offloads all of them, not a fraction; pinned host memory only where there is a GPU to pin for
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    shard_experts(model, mesh, kwargs)
    shard_moe_blocks(model, mesh, kwargs)
    for _, layer in _layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def parallelize(model, mesh, tied=None):
    """Apply the declaration: tensor parallel (or expert parallel), then activation checkpointing, then FSDP
    (torchtitan's order). `tied`: the weights the whole model holds under two names, when `model` is a chunk
    of it (default: the model's own)."""
    if dict(MESH)["tp"] > 1:
        tied = _tied_names(model) if tied is None else tied
        local = [path for path, _ in _moe_blocks(model)] if MOE_TOKEN_SPLIT else []  # whole on each tensor rank
        parallelize_module(model, mesh["tp"], tp_plan(model, tied, local))
        shard_own_params(model, mesh["tp"], local)
        _retie(model, tied)
    apply_local_tokens(model, mesh)
    apply_expert_parallel(model, mesh)
    apply_recompute(model)
    return apply_fsdp(model, mesh)


def batch_shard(mesh):
    """(index, count): which slice of each global batch this rank reads (its data-parallel coordinate)."""
    sizes = dict(MESH)
    index = mesh["dp_replicate"].get_local_rank() * sizes["dp_shard"] + mesh["dp_shard"].get_local_rank()
    return index, sizes["dp_replicate"] * sizes["dp_shard"]


def context_parallel_context(mesh, buffers, seq_dims):
    """The context manager that splits `buffers` by sequence over cp (torch's experimental context_parallel)."""
    if dict(MESH)["cp"] == 1:
        return contextlib.nullcontext()
    from torch.distributed.tensor.experimental import context_parallel

    return context_parallel(mesh["cp"], buffers=buffers, buffer_seq_dims=seq_dims)


class _Chunk(nn.Module):
    """One pipeline chunk of a Hugging Face *ForCausalLM: token ids in on the first, hidden states after.

    What crosses a stage boundary is a plain tensor (torch's pipelining sends tensors, not DTensors): under
    sequence parallelism (`seq_mesh`, the tp mesh) each rank sends its own sequence slice of the stream and
    the next stage's rank of the same tp coordinate takes it back as that slice of a DTensor split by
    sequence; a pending sum is reduced before it leaves, and a replicated DTensor goes as its whole."""

    def __init__(self, model, first, seq_mesh=None):
        super().__init__()
        self.model, self.first, self.seq_mesh = model, first, seq_mesh

    def forward(self, x):
        if not self.first and self.seq_mesh is not None:
            x = DTensor.from_local(x, self.seq_mesh, [Shard(1)], run_check=False)
        out = self.model(input_ids=x) if self.first else self.model(inputs_embeds=x)
        out = out.logits if hasattr(out, "logits") else out[0]
        if isinstance(out, DTensor):
            out = out.full_tensor() if any(p.is_partial() for p in out.placements) else out.to_local()
        return out


def pipeline_schedule(model, mesh, device, loss_fn):
    """This rank's PipelineStage(s), each chunk parallelized as declared, and the declared schedule."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    tied = _tied_names(model)
    if STAGE is not None:  # stages of different widths: this rank's stage on its own mesh
        if tied:
            raise ValueError(f"{tied[0][0]} is tied to {tied[0][1]}: stages of different widths do not sum the "
                             "gradients of a tied weight's copies; untie them, or plan with equal stages")
        stage = WidthStage(_Chunk(parallelize(chunk_model(model, STAGE), mesh), STAGE == 0), STAGE, len(STAGE_RANKS))
        return [stage], WidthSchedule(stage, MICRO_BATCHES, loss_fn, device)
    pp = dict(MESH)["pp"]
    stages = []
    for c in range(mesh["pp"].get_local_rank(), len(CHUNKS), pp):
        inner = parallelize(chunk_model(model, c), mesh, tied)
        seq = mesh["tp"] if SEQUENCE_PARALLEL else None
        stages.append(PipelineStage(_Chunk(inner, c == 0, seq), c, len(CHUNKS), device, group=mesh["pp"].get_group()))
    if len(stages) > 1:
        schedule = ScheduleInterleaved1F1B(stages, n_microbatches=MICRO_BATCHES, loss_fn=loss_fn)
    else:
        # 1F1B with fewer micro-batches than stages runs every forward before the first backward (its warm-up is
        # min(stages - stage - 1, micro-batches)): GPipe's order, which torch's Schedule1F1B refuses to run
        gpipe = SCHEDULE == "gpipe" or MICRO_BATCHES < pp
        schedule = (ScheduleGPipe if gpipe else Schedule1F1B)(stages[0], n_microbatches=MICRO_BATCHES,
                                                              loss_fn=loss_fn)
    return stages, (TiedSchedule(schedule, stages, tied, mesh) if tied else schedule)

'''


def _mesh(doc: Mapping[str, Any]) -> list[tuple[str, int]]:
    sizes = common.axis_sizes(doc)
    dp = sizes.get("dp", 1)
    zero0 = doc["zero"]["stage"] == 0
    return [("pp", sizes.get("pp", 1)), ("dp_replicate", dp if zero0 else 1), ("dp_shard", 1 if zero0 else dp),
            ("cp", sizes.get("cp", 1)), ("tp", sizes.get("tp", 1))]


def _not_expressed(doc: Mapping[str, Any]) -> list[str]:
    """Declared layouts the export cannot apply: splits of other ops than linear and embedding, but a module's own
    parameter (`own_param`, which `shard_own_params` splits)."""
    out = []
    for pattern, e in doc["layouts"]["params"].items():
        split = [d for d, spec in enumerate(e["dims"]) if "tp" in dim_axes(spec)]
        if split and e.get("op") not in ("linear", "embedding") and not pattern.endswith(".bias") \
                and not own_param(pattern, e):
            out.append(pattern)
    return out


def _data(doc: Mapping[str, Any]) -> list[tuple[str, Any, str | None]]:
    """The plan constants of one program (a one-program declaration, or a program's view)."""
    prog = doc["programs"][0]
    sizes, zero0 = common.axis_sizes(doc), doc["zero"]["stage"] == 0
    return [
        ("MESH", _mesh(doc), "(axis, size), slowest first: rank = ((((pp x DR + dr) x DS + ds) x CP + cp) x TP + tp"),
        ("SEQUENCE_PARALLEL", bool(doc["layouts"]["sequence_parallel"]), None),
        ("LAYOUTS", common.layouts(doc), "parameter name or glob -> declared layout (per dim: axis, axes or None)"),
        ("NOT_EXPRESSED", _not_expressed(doc), "declared splits torch's parallel styles cannot apply: kept replicated"),
        ("EXPERT_PARALLEL", sizes.get("ep", 1), "routed experts split over this many data-parallel ranks"),
        ("DATA_AXIS", "dp_replicate" if zero0 else "dp_shard", "the data-parallel axis FSDP2 and ep fold into"),
        ("MOE_TOKEN_SPLIT", sizes.get("tp", 1) > 1 and bool(refusals.stacked_experts(doc)),
         "MoE blocks run on each tensor rank's slice of the sequence, their weights whole (a shared expert "
         "declared split too)"),
        ("ZERO", doc["zero"], None),
        ("RECOMPUTE", doc["recompute"].get("layers", []), "per layer stack: save / recompute / swap"),
        ("OFFLOAD", doc["offload"], "fraction of each memory class kept in host memory"),
        ("PARAM_DTYPE", _DTYPES.get(doc["workload"]["dtype"]), "FSDP mixed precision (None: keep the model's)"),
        ("CHUNKS", chunks(doc),
         "pipeline chunks in order; chunk c runs on stage c mod pp"),
        ("SCHEDULE", prog["schedule"], None),
        ("MICRO_BATCH_SIZE", prog["micro_batch_size"], None),
        ("MICRO_BATCHES", prog.get("micro_batches", 1), "per step and pipeline"),
    ] + common.stage_data(doc)


def render(doc: Mapping[str, Any], *, base_dir: str | None = None) -> str:
    """The Python source of the torch plan (one module; several programs select theirs by rank)."""
    refusals.check(doc)
    multi = common.grouped(doc)
    use = ("    use_program(torch.distributed.get_rank())   # several programs or stage widths: bind this rank's "
           "first\n" if multi else "")
    lines = ['"""' + common.header(doc, "PyTorch plan (DTensor, FSDP2)") + "\n\nApply inside an initialised "
             f"process group:\n\n{use}    mesh = build_mesh(\"cuda\")\n    model = parallelize(model, mesh)\n"
             "    index, count = batch_shard(mesh)   # this rank reads batch slice `index` of `count`\n\n"
             "With pipeline stages: `pipeline_schedule(model, mesh, device, loss_fn)`.\n\"\"\"", "",
             "from __future__ import annotations", "", "import contextlib", "import copy", "import fnmatch",
             "import inspect", "from functools import partial", "", "import torch", "import torch.distributed as dist",
             "from torch import nn",
             "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper",
             "from torch.distributed.device_mesh import " + ("DeviceMesh" if multi else "init_device_mesh"),
             "from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard",
             "from torch.distributed.nn.functional import all_to_all_single",
             "from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor",
             "from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleOutput, RowwiseParallel,",
             "                                               SequenceParallel, parallelize_module)",
             "from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts", ""]
    return common.assemble(lines, doc, _data, _BODY.rstrip("\n") + "\n\n\n" + WIDTH_SRC, mesh=(_MESH, _MULTI_MESH))
