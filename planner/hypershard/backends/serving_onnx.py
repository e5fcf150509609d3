"""Exporter of a serving declaration to ONNX: the model with a device configuration per phase program.

Every node runs in both phases, so it carries two IR v11
`NodeDeviceConfigurationProto`s: one for `hyperplan/prefill`, one for
`hyperplan/decode`, each with the node's pipeline stage in that phase and
a `ShardingSpecProto` per parameter it reads, over that phase's devices
(named by their global ranks; co-located phases name the same ranks).
Routed experts split over ep unevenly are refused (the spec has equal
shards only; `onnx._spec`). The annotation itself is the training
exporter's (`onnx._annotate`), given each phase as a one-program view.
The result passes `onnx.checker.check_model`.
"""

from __future__ import annotations

from typing import Any, Mapping

from planner.hypershard.backends import onnx_external
from planner.hypershard.backends.onnx import CONFIG, MIN_IR, _annotate, _shapes, model_dir
from planner.hypershard.backends.serving_common import phase_programs
from planner.hypershard.declared import request_of
from planner.hypershard.serving_doc import serving_graph


def _proto_and_graph(doc: Mapping[str, Any], base_dir: str | None) -> tuple[Any, Any, Any]:
    """The model as ONNX, and as the planner profiled it (graph and blocks: the names the layouts use)."""
    import onnx

    from planner.api import _build_zoo

    req = request_of(doc, base_dir)
    graph, structure = serving_graph(req)
    if doc["model"]["source"] == "file":
        proto = onnx.load(req.model, load_external_data=False)
    else:
        proto = _build_zoo(req.model, dict(req.overrides))
    return proto, graph, structure


def _view(prog: Mapping[str, Any], mesh: Mapping[str, Any]) -> dict[str, Any]:
    """A phase as the one-program view `_annotate` reads: its mesh, its stages as one chunk each, its layouts."""
    stages = [{"stage": st["stage"], "chunks": [{"chunk": st["stage"], "layers": list(st["layers"]),
                                                 "blocks": list(st.get("blocks", []))}]} for st in prog["stages"]]
    return {"meshes": [mesh], "programs": [{"name": prog["name"], "stages": stages}],
            "layouts": {"params": prog["layouts"]["params"], "activations": {}}}


def render(doc: Mapping[str, Any], *, base_dir: str | None = None) -> bytes:
    model, graph, structure = _proto_and_graph(doc, base_dir)
    shapes = _shapes(model)
    for prog, mesh in phase_programs(doc):
        first = prog["ranks"]["first"]
        _annotate(model, _view(prog, mesh), graph, structure, f"{CONFIG}/{prog['name']}", first, None, shapes,
                  named=True)
    model.ir_version = max(model.ir_version, MIN_IR)
    onnx_external.check(model, model_dir(doc, base_dir))
    return model.SerializeToString()
