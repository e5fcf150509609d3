"""Exporter to ONNX: the model with IR v11 sharding annotations (`NodeProto.device_configurations`).

The model gets one `DeviceConfigurationProto` (all devices of the mesh);
every node gets a `NodeDeviceConfigurationProto` with its pipeline stage
and a `ShardingSpecProto` for each parameter it reads and each layer
boundary it receives. A spec lists, per shard (row-major over the sharded
dims, as in the ONNX sharding formalism), the group of devices of the
node's stage that hold it; groups are keys into `index_to_device_group_map`.
A file model keeps its external-data references (write the output beside
them); a zoo model is rebuilt weightless at the declared micro-batch.
The result passes `onnx.checker.check_model`.
"""

from __future__ import annotations

import itertools
from typing import Any, Mapping

from planner.errors import InvalidInput
from planner.hypershard.backends import common
from planner.hypershard.declared import graph_of, request_of, workload_of
from planner.hypershard.layouts import dim_axes
from planner.hypershard.patterns import expand

SUFFIX = ".onnx"
CONFIG = "hyperplan"
MIN_IR = 11


def _proto(doc: Mapping[str, Any], base_dir: str | None) -> Any:
    import onnx

    req = request_of(doc, base_dir)
    if doc["model"]["source"] == "file":
        return onnx.load(req.model, load_external_data=False)
    import models_zoo

    settings = dict(req.overrides)
    settings.update(batch=doc["programs"][0]["micro_batch_size"], seq_len=workload_of(doc).seq_len)
    try:
        return models_zoo.build(req.model, flat=True, **settings)  # every node annotated on its own
    except ValueError as exc:
        raise InvalidInput(f"zoo model '{req.model}': {exc}") from None


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
    for (d, _), k in zip(sharded, counts):
        sd = spec.sharded_dim.add(axis=d)
        simple = sd.simple_sharding.add(num_shards=k)
        if shape and d < len(shape) and shape[d] is not None:
            simple.dim_value = shape[d]
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
    import onnx

    from planner.activations import layer_inputs, requires_grad

    model = _proto(doc, base_dir)
    graph, structure = graph_of(doc, base_dir)  # as the planner sees it: blocks, tensor names
    grad = requires_grad(graph)
    sizes = common.axis_sizes(doc)
    n = common.devices(doc)
    coord = {r: common.coords(doc, r) for r in range(n)}
    pp = sizes.get("pp", 1)
    per = n // pp
    chunk_of: dict[str, int] = {}
    for st in doc["programs"][0]["stages"]:
        for ch in st["chunks"]:
            for name in list(ch["layers"]) + list(ch.get("blocks", [])):
                chunk_of[name] = ch["chunk"]
    params, _, _ = expand(doc["layouts"]["params"], graph.params)
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
    shapes = _shapes(model)
    conf = model.configuration.add(name=CONFIG, num_devices=n)
    del conf.device[:]
    for node in model.graph.node:
        stage = stage_of_node.get(node.name)
        if stage is None:  # a node the planner saw under another name (a function call): its parameters' stage
            stage = next((stage_of_param[x] for x in node.input if x in stage_of_param), None)
        ranks = list(range(n)) if stage is None else list(range(stage * per, (stage + 1) * per))
        dc = onnx.NodeDeviceConfigurationProto(configuration_id=CONFIG)
        if stage is not None:
            dc.pipeline_stage = stage
        for x in dict.fromkeys(node.input):
            dims = params[x]["dims"] if x in params else boundary.get(x)
            if dims is None:
                continue
            dc.sharding_spec.append(_spec(onnx, x, dims, shapes.get(x, []), ranks, coord, sizes))
        if stage is not None or len(dc.sharding_spec):
            node.device_configurations.append(dc)
    model.ir_version = max(model.ir_version, MIN_IR)
    onnx.checker.check_model(model)
    return model.SerializeToString()
