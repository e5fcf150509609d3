"""Exporters of a serving declaration to Python frameworks: a mesh per phase program, its layouts and experts.

Serving runs forward only, so what a framework needs from the plan is the
mesh of each phase over its ranks, the tensor-parallel layouts of its
weights, which routed experts each rank keeps and how the KV cache is laid
out; training's FSDP, recompute and pipeline schedules do not apply.

- torch: a `DeviceMesh` per phase (every rank makes each, as process
  groups are made together), `parallelize_module` with Colwise/Rowwise
  styles read from the layouts (torchtitan's plan as data), and the
  rank's routed experts cut out of the stacked expert weights by
  `expert_range` (uneven ranges allowed), and each Hugging Face experts
  module's tokens sent to the ranks of their experts and back by
  all-to-all over the stage's ranks (torch has no expert-parallel style
  of its own); a tensor group's ranks hold the same tokens, so each sends
  its share and the group gathers the results.
- jax: a `Mesh` per phase over its ranks' devices and a `PartitionSpec`
  per parameter; ep names the (dp, tp) ranks of a stage, dp major.
- hyper-parallel: a mesh per phase (every rank makes each) and
  `shard_module` with a `ShardingPlan` of Placements (an embedding's
  vocabulary split applied whole: its Embedding rule looks ids up locally).
- mindspore: a `Layout` over one stage's device matrix per parameter,
  `Cell.shard`, and `pipeline_stage` marks per layer.
JAX, hyper-parallel and MindSpore split arrays evenly: a phase whose ep
does not divide its experts is refused for them with one sentence.
"""

from __future__ import annotations

from typing import Any, Mapping

from planner.hypershard.backends import hyper_parallel_src as hp_src
from planner.hypershard.backends import jax as jax_export, torch as torch_export
from planner.hypershard.backends import serving_common as sc
from planner.hypershard.backends.common import layouts, mesh_slow_first
from planner.hypershard.backends.torch_experts import DISPATCH_SRC
from planner.hypershard.backends.torch_tp import TP_SRC

#: ep in the serving mesh is a stage's tp x dp ranks, tp fastest: dp is the major part of an expert index.
EP_AXES = ("dp", "tp")

_SPECS = r'''
def _axes(spec):
    return () if spec is None else (spec,) if isinstance(spec, str) else tuple(spec)


def _named(spec):
    """A declared dim's axes in this framework's names: ep is the stage's (dp, tp) ranks."""
    axes = tuple(m for a in _axes(spec) for m in (EP_AXES if a == "ep" else (a,)))
    return None if not axes else axes[0] if len(axes) == 1 else axes
'''

_TORCH = r'''
def shard_experts(model, rank):
    """Keep the routed experts `rank` holds: every stacked expert weight declared over ep on its expert dim is cut
    to expert_range(ep_coordinate(rank)); `route_experts` sends each token to the rank of each of its experts.
    Returns (first, end)."""
    first, end = expert_range(ep_coordinate(rank))
    for name, param in list(model.named_parameters()):
        dims = layout_of(name)["dims"]
        if dims and "ep" in _axes(dims[0]):
            parent, _, leaf = name.rpartition(".")
            owner = model.get_submodule(parent) if parent else model
            setattr(owner, leaf, nn.Parameter(param.detach()[first:end].clone(), requires_grad=False))
    return first, end


def _tp_sliced(dispatch, tp_group, hidden_states, top_k_index, top_k_weights):
    """`dispatch` on this tensor rank's contiguous share of the tokens its tensor group holds alike, the group's
    results gathered back in token order: each token goes through its experts once, not once a tensor rank."""
    tp, at = dist.get_world_size(tp_group), dist.get_rank(tp_group)
    bounds = [hidden_states.shape[0] * i // tp for i in range(tp + 1)]
    lo, hi = bounds[at], bounds[at + 1]
    own = dispatch(hidden_states[lo:hi], top_k_index[lo:hi], top_k_weights[lo:hi]).contiguous()
    parts = [own.new_empty((bounds[i + 1] - bounds[i],) + own.shape[1:]) for i in range(tp)]
    dist.all_gather(parts, own, group=tp_group)
    return torch.cat(parts)


def route_experts(model, rank, first, end, tp_group=None):
    """Route the tokens of every experts module `shard_experts` cut over the ranks of `rank`'s stage (its ep
    group: every rank of the stage calls this) by the training export's dispatch and combine (`_dispatched`). A
    Hugging Face experts module, forward(hidden_states, top_k_index, top_k_weights), then runs its own experts on
    the tokens sent to them. The ranks of a tensor group hold the same tokens, so with `tp_group` each sends its
    share of them and the group gathers the results (`_tp_sliced`), as the estimate costs it (tokens / tp a rank)."""
    stage, ep = stage_of(rank), dict(MESH)["tp"] * dict(MESH)["dp"]
    group = dist.new_group(list(range(stage["first_rank"], stage["first_rank"] + ep)), use_local_synchronization=True)
    owner = torch.tensor([c for c in range(ep) for _ in range(*expert_range(c))])
    for path, module in model.named_modules():
        cut = [n for n, p in module._parameters.items()
               if p is not None and "ep" in _axes((layout_of(f"{path}.{n}")["dims"] or [None])[0])]
        if not path or not cut:
            continue
        if len(inspect.signature(module.forward).parameters) < 3:
            raise ValueError(f"{path} ({type(module).__name__}) is declared split over ep {ep}, but the export routes "
                             "tokens to Hugging Face experts modules, forward(hidden_states, top_k_index, "
                             "top_k_weights)")
        module.num_experts = end - first  # none here: no token comes, and the module is never run
        compute = module.forward if end > first else (lambda x, *_: x)
        module.forward = partial(_dispatched, compute, group, owner, first)
        if tp_group is not None:
            module.forward = partial(_tp_sliced, module.forward, tp_group)
    return model


def parallelize(model, mesh, rank):
    """The bound phase's plan on `model`: tensor parallelism over the mesh's tp axis, then `rank`'s experts, each
    token sent to its experts' ranks and back."""
    if dict(MESH)["tp"] > 1:
        parallelize_module(model, mesh["tp"], tp_plan(model))
        shard_own_params(model, mesh["tp"])
    if EXPERTS:
        first, end = shard_experts(model, rank)
        if dict(MESH)["tp"] * dict(MESH)["dp"] > 1:
            route_experts(model, rank, first, end, mesh["tp"].get_group() if dict(MESH)["tp"] > 1 else None)
    return model
'''

_JAX = r'''
def partition_spec(name):
    """The PartitionSpec of parameter `name`."""
    return P(*(_named(spec) for spec in layout_of(name)["dims"]))


def kv_cache_spec():
    """The PartitionSpec of a [batch, sequence, kv heads, head dim] cache: sequences over dp, heads over tp when
    every tensor rank keeps heads of its own (else whole, as for MLA's latent)."""
    tp = dict(MESH)["tp"]
    return P("dp", None, "tp" if KV_CACHE["head_ways"] == tp > 1 else None, None)


def shard_params(params, mesh):
    """Place a flat {name: array} dict of parameters as declared."""
    return {name: jax.device_put(value, NamedSharding(mesh, partition_spec(name))) for name, value in params.items()}
'''

_HYPER = r'''
def build_mesh(device_type="npu"):
    """The bound phase's mesh (call use_program first), after every rank has made every phase's mesh."""
    if PROGRAM is None:
        raise RuntimeError("call use_program(rank) before build_mesh()")
    return _program_meshes(device_type)[PROGRAM["name"]][0]


def sharding_plan(model):
    """The ShardingPlan: every parameter's declared layout as Placements (experts over the stage's dp x tp)."""
    axes = tuple(a for a, _ in MESH)
    return ShardingPlan(plan={name: placements([_named(s) for s in applied(layout_of(name))], axes)
                              for name, _ in model.named_parameters()})


def parallelize(model, mesh):
    """shard_module with the bound phase's plan (serving runs forward only: no fully_shard, no recompute)."""
    return shard_module(model, mesh, sharding_plan(model))
'''

_MINDSPORE = r'''
def layout(dims):
    """The Layout of one tensor over one pipeline stage's device matrix (dp x tp), from its declared axes."""
    matrix = [(a, n) for a, n in MESH if a != "pp"]
    aliases = tuple("None" if _named(s) is None else _named(s) for s in dims)
    return Layout(tuple(n for _, n in matrix), tuple(a for a, _ in matrix))(*aliases)


def parameter_plan(net):
    """{parameter name: Layout} for every parameter of `net` (names as the declaration's)."""
    return {p.name: layout(layout_of(p.name)["dims"]) for p in net.get_parameters()}


def mark_stages(net):
    """Set `pipeline_stage` on every layer and block of each stage (serving: forward only)."""
    for spec in STAGES:
        for name in spec["layers"] + spec["blocks"]:
            for cell_name, cell in net.cells_and_names():
                if cell_name == name:
                    cell.pipeline_stage = spec["stage"]


def parallelize(net, input_dims=(("dp", None),)):
    """Shard `net` as the bound phase declares with the Cell method `net.shard` (sharding propagation fills in the
    ops) and mark its pipeline stages; launch each phase's net on its own ranks (msrun). `input_dims`: per-dim axes
    of each positional input (default: token ids [batch, sequence], batch over dp)."""
    net.shard(in_strategy=tuple(layout(dims) for dims in input_dims), parameter_plan=parameter_plan(net))
    if dict(MESH)["pp"] > 1:
        mark_stages(net)
    return net
'''


def _data(prog: Mapping[str, Any], mesh: Mapping[str, Any]) -> list[tuple[str, Any, str | None]]:
    view = {"layouts": prog["layouts"]}
    return [("MESH", mesh_slow_first(mesh), "(axis, size), slowest first: rank = first + (pp x DP + dp) x TP + tp"),
            ("LAYOUTS", layouts(view), "parameter name or glob -> per-dim mesh axes (None: whole)")] \
        + sc.base_data(prog, mesh)


def _join(*sources: str) -> str:
    """Pieces of generated source, two blank lines apart (mesh builders and plans shared with the training export)."""
    return "\n\n\n".join(src.strip("\n") for src in sources)


_USE = ("    use_program(rank)        # disaggregated: the phase this rank serves\n"
        "    use_program(\"decode\")    # co-located: every rank runs both; bind the phase at hand\n")


def render_torch(doc: Mapping[str, Any]) -> str:
    head = ['"""' + sc.header(doc, "PyTorch serving plan (DeviceMesh, DTensor tensor parallelism, experts)")
            + f"\n\nApply inside an initialised process group:\n\n{_USE}    mesh = build_mesh(\"cuda\")\n"
            "    model = parallelize(model, mesh, torch.distributed.get_rank())\n\"\"\"", "",
            "from __future__ import annotations", "", "import fnmatch", "import inspect",
            "from functools import partial", "", "import torch", "import torch.distributed as dist",
            "from torch import nn",
            "from torch.distributed.device_mesh import DeviceMesh",
            "from torch.distributed.nn.functional import all_to_all_single",
            "from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor",
            "from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleOutput, RowwiseParallel,",
            "                                               SequenceParallel, parallelize_module)", "",
            "SEQUENCE_PARALLEL = False  # serving keeps the residual stream whole between layers", ""]
    return sc.assemble(head, doc, _data, _join(torch_export._MULTI_MESH, TP_SRC, DISPATCH_SRC, _TORCH))


def render_jax(doc: Mapping[str, Any]) -> str:
    sc.uneven_experts(doc, "jax")
    head = ['"""' + sc.header(doc, "JAX serving sharding (Mesh, PartitionSpec)") + f"\n\nUse:\n\n{_USE}"
            "    mesh = build_mesh()\n    params = shard_params(flat_params, mesh)   # {name: array}\n\"\"\"", "",
            "from __future__ import annotations", "", "import fnmatch", "", "import jax", "import numpy as np",
            "from jax.sharding import Mesh, NamedSharding, PartitionSpec as P", "", f"EP_AXES = {EP_AXES!r}", ""]
    return sc.assemble(head, doc, _data, _join(jax_export._MULTI_MESH, _SPECS, _JAX))


def render_hyper_parallel(doc: Mapping[str, Any]) -> str:
    sc.uneven_experts(doc, "hyper-parallel")
    head = ['"""' + sc.header(doc, "hyper-parallel serving plan") + f"\n\nUse:\n\n{_USE}    mesh = build_mesh()\n"
            "    model = parallelize(model, mesh)\n\"\"\"", "", "from __future__ import annotations", "",
            "import fnmatch", "", "from hyper_parallel import init_device_mesh, shard_module",
            "from hyper_parallel.core.placement_types import Replicate, Shard",
            "from hyper_parallel.core.shard.sharding_plan import ShardingPlan", "", f"EP_AXES = {EP_AXES!r}", ""]
    return sc.assemble(head, doc, _data, _join(hp_src.PROGRAM_MESHES_SRC, hp_src.PLACEMENTS_SRC, _SPECS, _HYPER))


def render_mindspore(doc: Mapping[str, Any]) -> str:
    sc.uneven_experts(doc, "mindspore")
    head = ['"""' + sc.header(doc, "MindSpore serving plan (Layout, Cell.shard)") + "\n\nUse (graph mode, each phase's "
            f"net launched on its ranks with msrun):\n\n{_USE}    net = parallelize(net)\n\"\"\"", "",
            "from __future__ import annotations", "", "import fnmatch", "", "from mindspore.parallel import Layout",
            "", f"EP_AXES = {EP_AXES!r}", ""]
    return sc.assemble(head, doc, _data, _join(_SPECS, _MINDSPORE))


RENDER = {"torch": render_torch, "jax": render_jax, "hyper-parallel": render_hyper_parallel,
          "mindspore": render_mindspore}
