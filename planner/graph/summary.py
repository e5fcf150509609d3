"""What `hyperplan inspect` reports about a model, as plain data (the CLI only renders it).

Why per token: forward FLOPs per token (graph FLOPs / (batch * sequence))
is the number that compares across batch sizes and with the 2 * parameters
rule of thumb (Kaplan et al. 2020, "Scaling Laws for Neural Language
Models", C_forward ~ 2N per token). Models without a sequence (a ResNet, a
ViT classifier) are reported per sample, and the report says which.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from planner.graph.blocks import Structure
from planner.graph.ir import Graph
from planner.graph.onnx_dims import is_batch_name, is_seq_name

_INT_INPUT_DTYPES = frozenset({"int64", "int32"})


@dataclass(frozen=True, slots=True)
class Workload:
    """How many samples and tokens one forward pass of the imported graph covers, and where that came from."""

    batch: int
    seq_len: int | None
    source: str

    @property
    def unit(self) -> str:
        return "token" if self.seq_len else "sample"

    @property
    def units(self) -> int:
        return self.batch * (self.seq_len or 1)


def workload(graph: Graph) -> Workload:
    """Batch and sequence length: from bound symbolic dims, the zoo's config, or the first input's shape."""
    batch = [v for k, v in sorted(graph.dims.items()) if is_batch_name(k)]
    seq = [v for k, v in sorted(graph.dims.items()) if is_seq_name(k)]
    if batch:
        return Workload(batch[0], seq[0] if seq else None, "symbolic dims")
    config = graph.metadata.get("hyperplan.config")
    if config:
        try:
            cfg = json.loads(config)
        except ValueError:
            cfg = {}
        if isinstance(cfg, dict) and isinstance(cfg.get("batch"), int):
            seq_len = cfg.get("seq_len")
            return Workload(cfg["batch"], seq_len if isinstance(seq_len, int) and seq_len > 0 else None,
                            "zoo config")
    for name in graph.inputs:
        t = graph.tensors.get(name)
        if t is None or not t.shape:
            continue
        source = "symbolic dims" if graph.dims else f"shape of input '{name}'"  # bound by the input's roles
        if t.dtype in _INT_INPUT_DTYPES and len(t.shape) == 2:  # token ids (batch, seq)
            return Workload(t.shape[0], t.shape[1], source)
        return Workload(t.shape[0], seq[0] if seq else None, source)
    return Workload(1, None, "no input shape; assumed 1")


def summarize(graph: Graph, structure: Structure) -> dict[str, Any]:
    """Every figure `inspect` prints, as one JSON-ready dict (keys sorted when dumped)."""
    work = workload(graph)
    total_params = graph.param_count
    in_blocks = sum(b.param_count for b in structure.blocks)
    types = [
        {
            "type_id": t.type_id, "label": t.label, "kind": t.kind, "submodel": t.submodel,
            "count": t.count, "instances": list(t.instances),
            "params_per_instance": t.param_count, "params": sum(structure.block(n).param_count for n in t.instances),
            "flops_per_instance": t.flops,
        }
        for t in structure.types
    ]
    hist = graph.op_histogram()
    unknown = graph.unknown_ops()
    return {
        "model": {"name": graph.name, "producer": graph.producer, "opset": graph.opset,
                  "nodes": len(graph.nodes), "dims": dict(sorted(graph.dims.items()))},
        "workload": {"batch": work.batch, "seq_len": work.seq_len, "unit": work.unit, "units": work.units,
                     "source": work.source},
        "params": {"total": total_params, "outside_blocks": total_params - in_blocks,
                   "by_type": {t["label"]: t["params"] for t in types}},
        "flops": {"forward": graph.flops, f"forward_per_{work.unit}": graph.flops / work.units,
                  "per_unit": work.unit},
        "layers": {"count": len(structure.layers()), "types": len(structure.types),
                   "repeated_types": len(structure.repeated_types())},
        "block_types": types,
        "submodels": [
            {"name": s.name, "layers": s.layers, "blocks": len(s.blocks), "params": s.param_count, "flops": s.flops}
            for s in structure.submodels
        ],
        "ops": {"histogram": {k: hist[k] for k in sorted(hist)}, "unknown": {k: unknown[k] for k in sorted(unknown)}},
        "weights_bytes_by_dtype": {k: v for k, v in sorted(graph.param_bytes_by_dtype().items())},
        "weights_bytes": graph.param_bytes,
        "notes": list(graph.notes),
    }
