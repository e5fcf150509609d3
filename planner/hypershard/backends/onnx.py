"""Exporter to ONNX: the model with IR v11 sharding annotations (`NodeProto.device_configurations`).

The model gets one `DeviceConfigurationProto` (all devices of the mesh);
every node gets a `NodeDeviceConfigurationProto` with its pipeline stage
and a `ShardingSpecProto` for each parameter it reads and each layer
boundary it receives. A spec lists, per shard (row-major over the sharded
dims, as in the ONNX sharding formalism), the group of devices of the
node's stage that hold it; groups are keys into `index_to_device_group_map`.
A file model keeps its external-data references (written into the model's
folder, `onnx_external`); a zoo model is rebuilt weightless at the declared micro-batch.
Several programs (HyperMPMD) give one configuration per program, named
`hyperplan/<program>`, whose devices are named by their global ranks; each
node carries its program's configuration, stages and specs over that
program's devices (a
zoo model is then built at the backbone's micro-batch). Pipeline stages of
different widths get one configuration per stage (`hyperplan/main/stage0`),
devices named by global ranks, and each stage's nodes carry it with specs
over the stage's own mesh. The result passes `onnx.checker.check_model`.
"""

from __future__ import annotations

import itertools
import os
from typing import Any, Mapping

from planner.errors import InvalidInput
from planner.graph.onnx_folded import stored_copies
from planner.hypershard.backends import common, onnx_external
from planner.hypershard.declared import split_as_declared, graph_of, request_of, workload_of
from planner.hypershard.layouts import dim_axes
from planner.hypershard.patterns import expand
from planner.hypershard.programs import is_multi

SUFFIX = ".onnx"
CONFIG = "hyperplan"
MIN_IR = 11


def _proto(doc: Mapping[str, Any], base_dir: str | None) -> Any:
    import onnx

    from planner.model_source import build_weightless

    req = request_of(doc, base_dir)
    if doc["model"]["source"] == "file":
        return onnx.load(req.model, load_external_data=False)
    settings = dict(req.overrides)
    settings.update(batch=doc["programs"][-1]["micro_batch_size"], seq_len=workload_of(doc).seq_len)
    return build_weightless(req.model, settings)  # a zoo model or a config.json, flat: every node annotated


def _spec(onnx_mod: Any, tensor: str, dims: list[Any], shape: list[int | None], ranks: list[int],
          coord: dict[int, dict[str, int]], sizes: Mapping[str, int]) -> Any:
    """The sharding spec of `tensor` on the devices `ranks`: one device group per shard."""
    sharded = [(d, spec) for d, spec in enumerate(dims) if dim_axes(spec)]
    counts = [common.shard_index(spec, {}, sizes)[1] for _, spec in sharded]
    groups: dict[tuple[int, ...], list[int]] = {key: [] for key in itertools.product(*(range(k) for k in counts))}
    for r in ranks:
        key = tuple(common.shard_index(spec, coord[r], sizes)[0] for _, spec in sharded)
        groups[key].append(r)
    spec = onnx_mod.ShardingSpecProto(tensor_name=tensor)
    for k, key in enumerate(groups):
        members = groups[key]
        if len(members) == 1:
            spec.device.append(members[0])
        else:
            spec.device.append(-(k + 1))
            spec.index_to_device_group_map.add(key=-(k + 1), value=members)
    for (d, axes), k in zip(sharded, counts):
        sd = spec.sharded_dim.add(axis=d)
        size = shape[d] if shape and d < len(shape) and shape[d] is not None else None
        if size is not None and size % k:
            # the spec divides N blocks into M equal shards; several simple_shardings on one axis mean fused axes
            # (onnx.proto, ShardedDimProto), so an uneven split has no encoding
            raise InvalidInput(f"the onnx backend splits a dim into equal shards only, and {tensor} splits "
                               f"{size} over {k} ({' x '.join(dim_axes(axes))}); export with --backend torch, which "
                               "places uneven ranges, or plan a degree that divides it")
        simple = sd.simple_sharding.add(num_shards=k)
        if size is not None:
            simple.dim_value = size
    return spec


def _shapes(model: Any) -> dict[str, list[int | None]]:
    out: dict[str, list[int | None]] = {}
    for init in model.graph.initializer:
        out[init.name] = list(init.dims)
    for vi in list(model.graph.input) + list(model.graph.value_info):
        dims = vi.type.tensor_type.shape.dim
        out.setdefault(vi.name, [d.dim_value if d.HasField("dim_value") else None for d in dims])
    return out


def render(doc: Mapping[str, Any], *, base_dir: str | None = None) -> bytes:
    model = _proto(doc, base_dir)
    graph, structure = graph_of(doc, base_dir)  # as the planner sees it: blocks, tensor names
    shapes = _shapes(model)
    parts = common.groups(doc)
    if len(parts) == 1:
        _annotate(model, doc, graph, structure, CONFIG, 0, None, shapes)
    else:  # a configuration per program, or per stage of its own width ('hyperplan/main/stage0')
        split = split_as_declared(doc, graph, structure) if is_multi(doc) else []
        programs = {p.name: p for p in split}
        for g in parts:
            p = programs.get(g.view["programs"][0]["name"])
            members = None if p is None else {n.name for n in p.graph.nodes} | set(p.graph.params)
            _annotate(model, g.view, graph if p is None else p.graph, structure if p is None else p.structure,
                      f"{CONFIG}/{g.name}", g.first, members, shapes, named=True)
    model.ir_version = max(model.ir_version, MIN_IR)
    onnx_external.check(model, model_dir(doc, base_dir))
    return model.SerializeToString()


def model_dir(doc: Mapping[str, Any], base_dir: str | None) -> str | None:
    """The folder of a file model (where its external data lives); None for a zoo model."""
    if doc["model"]["source"] != "file":
        return None
    return os.path.dirname(os.path.abspath(request_of(doc, base_dir).model))


def check_target(doc: Mapping[str, Any], base_dir: str | None, out: str) -> None:
    """Before writing: a file model with external weights is annotated into its own folder only."""
    if doc["model"]["source"] == "file":
        onnx_external.check_target(request_of(doc, base_dir).model, out)


def _annotate(model: Any, doc: Mapping[str, Any], graph: Any, structure: Any, config: str, first: int,
              members: set[str] | None, shapes: Mapping[str, list[int | None]], named: bool = False) -> None:
    """Annotate the nodes of one program (`members`: its node and parameter names; None: every node) with its
    device configuration (devices 0..count-1 of it are global ranks first..first+count-1, named so when `named`),
    stages, and sharding specs over them. A view of one stage of its own width (`stage` in its program)
    annotates that stage's nodes only, over all of its devices."""
    import onnx

    from planner.costing.activations import layer_inputs, requires_grad

    grad = requires_grad(graph)
    sizes = common.axis_sizes(doc)
    n = common.devices(doc)
    coord = {r: common.coords(doc, r) for r in range(n)}
    prog = doc["programs"][0]
    own = prog.get("stage")  # a stage of its own width: its view's devices are the stage's
    pp = len(prog["stages"]) if own is not None else sizes.get("pp", 1)
    per = n // pp
    chunk_of: dict[str, int] = {}
    for st in doc["programs"][0]["stages"]:
        for ch in st["chunks"]:
            for name in list(ch["layers"]) + list(ch.get("blocks", [])):
                chunk_of[name] = ch["chunk"]
    params, _, _ = expand(doc["layouts"]["params"], graph.params)
    for copy, (table, how) in stored_copies(graph).items():  # the file's folded copy of a parameter
        if table in params:
            dims = list(params[table]["dims"])
            if how == "Reshape":  # the parameter's dims, and the view's unit dims whole
                left = iter(dims)
                dims = [None if size == 1 else next(left, None) for size in graph.tensors[copy].shape]
            params[copy] = {"dims": dims[::-1] if how == "Transpose" else dims}
    boundary: dict[str, list[Any]] = {}
    acts = doc["layouts"].get("activations", {})
    for b in structure.layers():
        key = f"{b.stack}.*" if b.stack else "*"
        if key in acts:
            for x in layer_inputs(graph, set(b.nodes), grad):
                boundary.setdefault(x, acts[key]["dims"])
    stage_of_node = {}
    for i, node in enumerate(graph.nodes):
        blk = structure.block_of_node(i)
        if blk is not None and blk.name in chunk_of:
            stage_of_node[node.name] = chunk_of[blk.name] % pp
    stage_of_param = {p: chunk_of[b.name] % pp for b in structure.blocks if b.name in chunk_of for p in b.params}
    conf = model.configuration.add(name=config, num_devices=n)
    del conf.device[:]
    if named:  # device k of the configuration is global rank first + k
        conf.device.extend([str(first + r) for r in range(n)])
    for node in model.graph.node:
        if members is not None and node.name not in members and not any(x in members for x in node.input):
            continue  # another program's node
        stage = stage_of_node.get(node.name)
        if stage is None:  # a node the planner saw under another name (a function call): its parameters' stage
            stage = next((stage_of_param[x] for x in node.input if x in stage_of_param), None)
        if own is not None and stage != own:
            continue  # another stage's node (or one of no stage: stages of different widths share no devices)
        ranks = list(range(n)) if stage is None or own is not None else list(range(stage * per, (stage + 1) * per))
        dc = onnx.NodeDeviceConfigurationProto(configuration_id=config)
        if stage is not None:
            dc.pipeline_stage = stage
        for x in dict.fromkeys(node.input):
            dims = params[x]["dims"] if x in params else boundary.get(x)
            if dims is None:
                continue
            dc.sharding_spec.append(_spec(onnx, x, dims, shapes.get(x, []), ranks, coord, sizes))
        if stage is not None or len(dc.sharding_spec):
            node.device_configurations.append(dc)
