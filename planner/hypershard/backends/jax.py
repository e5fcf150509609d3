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
"""

from __future__ import annotations

from typing import Any, Mapping

from planner.errors import InvalidInput
from planner.hypershard.backends import common

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


def partition_spec(name):
    """The PartitionSpec of parameter `name`."""
    return P(*(_axis(spec) for spec in layout_of(name)["dims"]))


def activation_spec(key):
    """The PartitionSpec of a declared activation (a model input, or a layer stack's input such as 'model.layers.*')."""
    return P(*(_axis(spec) for spec in ACTIVATIONS[key]["dims"]))


def shardings(mesh, names):
    """{parameter name: NamedSharding} for the given flat parameter names."""
    return {name: NamedSharding(mesh, partition_spec(name)) for name in names}


def shard_params(params, mesh):
    """Place a flat {name: array} dict of parameters as declared."""
    return {name: jax.device_put(value, NamedSharding(mesh, partition_spec(name))) for name, value in params.items()}
'''


def _mesh(doc: Mapping[str, Any]) -> tuple[list[tuple[str, int]], dict[str, tuple[str, ...]]]:
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
                raise InvalidInput(f"the jax backend places ep inside dp and cannot also split cp ({sizes['cp']}); "
                                   "export with --backend mindspore or hyper-parallel")
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
    ] + common.stage_data(doc)


def render(doc: Mapping[str, Any], *, base_dir: str | None = None) -> str:
    multi = common.grouped(doc)
    use = ("    use_program(\"NAME\")   # several programs or stage widths: one at a time, each on its own devices\n"
           if multi else "")
    lines = ['"""' + common.header(doc, "JAX sharding (Mesh, PartitionSpec)") + f"\n\nUse:\n\n{use}"
             "    mesh = build_mesh()\n    params = shard_params(flat_params, mesh)   # {name: array}\n\"\"\"", "",
             "from __future__ import annotations", "", "import fnmatch", "", "import jax", "import numpy as np",
             "from jax.sharding import Mesh, NamedSharding, PartitionSpec as P", ""]
    return common.assemble(lines, doc, _data, _BODY, mesh=(_MESH, _MULTI_MESH))
