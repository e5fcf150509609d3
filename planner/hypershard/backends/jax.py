"""Exporter to JAX: a `Mesh` and a `PartitionSpec` per parameter (and per boundary activation).

The declaration's notation is JAX's own: per tensor dim an axis name, a
tuple of axis names (major first) or None. The mesh is built slowest axis
first so device k of `jax.devices()` is rank k of the declaration. Expert
parallelism reuses data-parallel ranks; JAX needs it as a mesh axis of its
own, so with ep > 1 the data axis is factored into ("dp", "ep") — ep the
faster part, as the declaration places it (stride tp) — and activations
split their batch over both. Several programs (HyperMPMD) are meshes over
disjoint slices of the devices: `use_program(name)` binds one, and
`build_mesh` takes its ranks' devices. Pipeline stages of different widths
are such slices too: a Mesh per stage (`main/stage0`, ...), each with its
own tp, the layer-stack boundary moved between them by `jax.device_put`
to the next stage's sharding.

What a training step needs beyond the layouts is applied, not only listed:
ZeRO-3 shards each parameter over the data axis too (on its first whole
dim that divides; GSPMD then gathers it where it is used, as FSDP does),
ZeRO-1/2 shard the optimizer states that way (`optimizer_spec`; ZeRO-2's
gradients too, as the step's output sharding), the declared recompute is
`remat(layer_fn)` (jax.checkpoint with the policy of the declaration) and
the micro-batches are `micro_batches(batch)`. Pipelines of equal stages
(one mesh with a pp axis) and host offload have no JAX equivalent here
and are refused before anything is written.
"""

from __future__ import annotations

from typing import Any, Mapping

from planner.errors import InvalidInput
from planner.hypershard.backends import common
from planner.hypershard.programs import views

SUFFIX = ".py"

_MESH = r'''
def build_mesh(devices=None):
    """The mesh, slowest axis first: device k of `devices` (default jax.devices()) is rank k of the plan."""
    devices = np.asarray(jax.devices() if devices is None else devices)
    return Mesh(devices.reshape(tuple(n for _, n in MESH)), tuple(a for a, _ in MESH))
'''

_MULTI_MESH = r'''
def build_mesh(devices=None):
    """The mesh of the bound program (use_program): its ranks' devices of `devices` (default jax.devices()),
    slowest axis first; device k is rank k of the plan. Meshes of other programs use disjoint devices."""
    if PROGRAM is None:
        raise RuntimeError("call use_program(name or rank) before build_mesh()")
    devices = np.asarray(jax.devices() if devices is None else devices)
    mine = devices[PROGRAM["first_rank"]:PROGRAM["first_rank"] + PROGRAM["ranks"]]
    return Mesh(mine.reshape(tuple(n for _, n in MESH)), tuple(a for a, _ in MESH))
'''

_BODY = r'''
def _axis(spec):
    if spec is None:
        return None
    names = (spec,) if isinstance(spec, str) else tuple(spec)
    axes = tuple(m for a in names for m in _RENAME.get(a, (a,)))
    return axes[0] if len(axes) == 1 else axes


def _declared(name):
    return [_axis(spec) for spec in layout_of(name)["dims"]]


def _over_data(dims, shape):
    """`dims` with the data axes added on the first whole dim of `shape` they divide (ZeRO's sharding)."""
    used = {a for spec in dims if spec is not None for a in ((spec,) if isinstance(spec, str) else spec)}
    data = tuple(a for a, _ in MESH if a in ("dp", "ep") and a not in used)  # experts split over ep keep it
    size = int(np.prod([dict(MESH)[a] for a in data]))
    if size == 1 or shape is None:
        return dims
    for d, (spec, n) in enumerate(zip(dims, shape)):
        if spec is None and n % size == 0:
            return dims[:d] + [data[0] if len(data) == 1 else data] + dims[d + 1:]
    return dims  # no whole dim divides: kept replicated over dp (a norm weight of odd length)


def partition_spec(name, shape=None):
    """The PartitionSpec of parameter `name`; under ZeRO-3 (given its shape) also split over the data axis."""
    dims = _declared(name)
    return P(*(_over_data(dims, shape) if ZERO_STAGE >= 3 else dims))


def optimizer_spec(name, shape):
    """The PartitionSpec of the optimizer states (Adam's m and v) of parameter `name`: split over the data axis
    from ZeRO-1 on."""
    dims = _declared(name)
    return P(*(_over_data(dims, shape) if ZERO_STAGE >= 1 else dims))


def remat(layer_fn):
    """`layer_fn` (one layer's forward) with the declared recompute: full saves nothing, selective saves the
    matmul outputs and recomputes the rest (the attention core), none is `layer_fn` itself."""
    if RECOMPUTE == "none":
        return layer_fn
    policy = (jax.checkpoint_policies.nothing_saveable if RECOMPUTE == "full"
              else jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
    return jax.checkpoint(layer_fn, policy=policy)


def micro_batches(batch):
    """A batch (leading dim: one replica's, or every replica's in order as activation_spec splits it over dp)
    as MICRO_BATCHES micro-batches, [m, replicas x MICRO_BATCH_SIZE, ...]: micro-batch k takes the k-th
    MICRO_BATCH_SIZE rows of each replica's share, so no row leaves its replica."""
    replicas = batch.shape[0] // (MICRO_BATCHES * MICRO_BATCH_SIZE)
    shaped = batch.reshape((replicas, MICRO_BATCHES, MICRO_BATCH_SIZE) + batch.shape[1:]).swapaxes(0, 1)
    return shaped.reshape((MICRO_BATCHES, replicas * MICRO_BATCH_SIZE) + batch.shape[1:])


def activation_spec(key):
    """The PartitionSpec of a declared activation (a model input, or a layer stack's input such as 'model.layers.*')."""
    return P(*(_axis(spec) for spec in ACTIVATIONS[key]["dims"]))


def shardings(mesh, names):
    """{parameter name: NamedSharding} for the given flat parameter names."""
    return {name: NamedSharding(mesh, partition_spec(name, shape)) for name, shape in names.items()} \
        if isinstance(names, dict) else {name: NamedSharding(mesh, partition_spec(name)) for name in names}


def shard_params(params, mesh):
    """Place a flat {name: array} dict of parameters as declared (ZeRO-3: also over the data axis)."""
    return {name: jax.device_put(value, NamedSharding(mesh, partition_spec(name, value.shape)))
            for name, value in params.items()}
'''


def _mesh(doc: Mapping[str, Any], backend: str = "jax") -> tuple[list[tuple[str, int]], dict[str, tuple[str, ...]]]:
    """The mesh axes slowest first, dp factored into (dp, ep) when experts use its ranks, and that renaming;
    InvalidInput (naming `backend`) for an expert placement such a mesh cannot hold."""
    sizes = common.axis_sizes(doc)
    ep = sizes.get("ep", 1)
    alias = next((a for a in doc["meshes"][0].get("aliases", []) if a["name"] == "ep"), {})
    if ep > 1 and sizes.get("tp", 1) > 1 and "tp" in alias.get("within", ()):
        raise InvalidInput(f"this plan folds experts across the tensor axis (ep {ep} over tp x dp, etp 1), which a "
                           "device mesh with ep inside dp cannot express; plan with --etp equal to --tp")
    rename: dict[str, tuple[str, ...]] = {}
    axes = []
    for name, size in common.slow_first(doc):
        if name == "dp" and ep > 1:
            if sizes.get("cp", 1) > 1:
                raise InvalidInput(f"the {backend} backend places ep inside dp and cannot also split cp "
                                   f"({sizes['cp']}); plan with --cp 1" + (", or export with --backend mindspore"
                                                                          if backend == "jax" else ""))
            axes += [("dp", size // ep), ("ep", ep)]
            rename["dp"] = ("dp", "ep")
        else:
            axes.append((name, size))
    return axes, rename


def _data(doc: Mapping[str, Any]) -> list[tuple[str, Any, str | None]]:
    axes, rename = _mesh(doc)
    return [
        ("MESH", axes, "(axis, size), slowest first"),
        ("_RENAME", rename, "declared axis -> mesh axes (dp is factored when experts use its ranks)"),
        ("LAYOUTS", {k: {"dims": e["dims"]} for k, e in common.layouts(doc).items()},
         "parameter name or glob -> per-dim mesh axes (None: whole)"),
        ("ACTIVATIONS", {k: {"dims": e["dims"]} for k, e in doc["layouts"].get("activations", {}).items()},
         "model inputs and layer-stack inputs"),
        ("STAGES", common.stage_layers(doc), "layers per pipeline stage (pp axis)"),
        ("MICRO_BATCH_SIZE", doc["programs"][0]["micro_batch_size"], None),
        ("MICRO_BATCHES", doc["programs"][0].get("micro_batches", 1), "per step and replica"),
        ("ZERO_STAGE", doc["zero"]["stage"], "3: parameters split over dp too; 1-2: optimizer states"),
        ("RECOMPUTE", doc["recompute"]["policy"], "none, selective or full: what remat() applies"),
    ] + common.stage_data(doc)


def unexpressed(doc: Mapping[str, Any]) -> str | None:
    """The one plan feature this backend cannot apply (None: it applies them all), said before writing."""
    sizes = common.axis_sizes(doc)
    if sizes.get("pp", 1) > 1 and not common.grouped(doc):
        return (f"the jax backend has no pipeline runtime for {sizes['pp']} equal stages on one mesh (its arrays "
                f"would sit replicated over pp); plan with --pp 1 or --backend jax, or export with {_elsewhere(doc)}")
    moved = [k for k, v in doc.get("offload", {}).items() if v > 0]
    if moved:
        return (f"the jax backend does not offload to host memory ({', '.join(moved)} offloaded in this plan); "
                f"plan with --no-offload or --backend jax, or export with {_elsewhere(doc)}")
    return None


def _elsewhere(doc: Mapping[str, Any]) -> str:
    """The backends that write what this one cannot: torch where its export runs the plan, else the code ones."""
    from planner.hypershard.backends import torch_refusals

    try:
        torch_refusals.check(doc)
    except InvalidInput:
        return "--backend mindspore or hyper-parallel"
    return "--backend torch"


def render(doc: Mapping[str, Any], *, base_dir: str | None = None) -> str:
    for v in views(doc):  # each program of a HyperMPMD plan (the plan itself otherwise)
        why = unexpressed(v)
        if why:
            raise InvalidInput(why)
    multi = common.grouped(doc)
    use = ("    use_program(\"NAME\")   # several programs or stage widths: one at a time, each on its own devices\n"
           if multi else "")
    lines = ['"""' + common.header(doc, "JAX sharding (Mesh, PartitionSpec)") + f"\n\nUse:\n\n{use}"
             "    mesh = build_mesh()\n    params = shard_params(flat_params, mesh)   # {name: array}\n\"\"\"", "",
             "from __future__ import annotations", "", "import fnmatch", "", "import jax", "import numpy as np",
             "from jax.sharding import Mesh, NamedSharding, PartitionSpec as P", ""]
    return common.assemble(lines, doc, _data, _BODY, mesh=(_MESH, _MULTI_MESH))
