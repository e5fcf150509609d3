"""The graph IR: what the rest of hyperplan knows of a model.

Immutable and small on purpose: a node keeps its op, attributes, tensor
names and its own cost (FLOPs and bytes), so every later stage can work from
plain numbers without going back to ONNX. Shapes are concrete: symbolic
dimensions are bound at import time (`onnx_import`).

Vocabulary: "dim" is a tensor dimension; "axis" is a device-mesh axis.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

#: Bytes per element for the ONNX element types we meet (names as in onnx.TensorProto, lower case).
DTYPE_BYTES: Mapping[str, float] = MappingProxyType(
    {
        "float32": 4, "float": 4, "float16": 2, "bfloat16": 2, "float64": 8, "double": 8,
        "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
        "int64": 8, "uint64": 8, "bool": 1, "string": 8,
        "float8e4m3fn": 1, "float8e4m3fnuz": 1, "float8e5m2": 1, "float8e5m2fnuz": 1,
        "float8e8m0": 1, "uint4": 0.5, "int4": 0.5, "float4e2m1": 0.5, "int2": 0.25, "uint2": 0.25,
        "complex64": 8, "complex128": 16, "undefined": 4,
    }
)


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of `dtype` (4 when unknown, the common float32 case)."""
    return DTYPE_BYTES.get(dtype, 4)


@dataclass(frozen=True, slots=True)
class Tensor:
    """A value in the graph: activation, graph input/output, or parameter.

    `shape` is None only when even the rank is unknown (an op whose output
    shape rules we do not have); such tensors cost nothing in bytes.
    """

    name: str
    shape: tuple[int, ...] | None
    dtype: str
    is_param: bool = False

    @property
    def numel(self) -> int:
        return math.prod(self.shape) if self.shape is not None else 0

    @property
    def nbytes(self) -> float:
        return self.numel * dtype_bytes(self.dtype)


@dataclass(frozen=True, slots=True)
class Node:
    """One op with its cost per forward pass of the imported batch.

    `scope` is the module path the exporter left (``model.layers.0.self_attn``),
    '' when none is known. `cost_known` is False for ops costed only by the
    bytes they move (unknown to `op_costs`); they are listed by `Graph.unknown_ops`.
    """

    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    domain: str = ""
    scope: str = ""
    flops: float = 0.0
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    cost_known: bool = True

    @property
    def qualified_op(self) -> str:
        """`op_type`, prefixed by its domain when not the default ONNX one."""
        return f"{self.domain}::{self.op_type}" if self.domain not in ("", "ai.onnx") else self.op_type


@dataclass(frozen=True, slots=True)
class Graph:
    """A whole model: nodes in topological order and every tensor by name.

    `dims` holds the values symbolic dimensions were bound to at import,
    `scalars` the values of its one-element floating constants (initializers
    and Constant outputs: scales, epsilons, bounds), by tensor name.
    `notes` collects what the importer did that the user may want to know
    (functions inlined, subgraphs costed as opaque ops, ...).
    """

    name: str
    nodes: tuple[Node, ...]
    tensors: Mapping[str, Tensor]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: tuple[str, ...]
    opset: int = 0
    producer: str = ""
    dims: Mapping[str, int] = field(default_factory=dict)
    metadata: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    scalars: Mapping[str, float] = field(default_factory=dict)

    @property
    def param_count(self) -> int:
        return sum(self.tensors[p].numel for p in self.params)

    @property
    def param_bytes(self) -> float:
        return sum(self.tensors[p].nbytes for p in self.params)

    @property
    def flops(self) -> float:
        """Forward FLOPs of the whole graph at the imported shapes."""
        return sum(n.flops for n in self.nodes)

    def op_histogram(self) -> Counter[str]:
        return Counter(n.qualified_op for n in self.nodes)

    def unknown_ops(self) -> Counter[str]:
        """Ops without a FLOP rule, costed by bytes moved only."""
        return Counter(n.qualified_op for n in self.nodes if not n.cost_known)

    def uncosted(self) -> dict[str, Any]:
        """How much of the graph has no FLOP rule (costed by the bytes it moves): ops, their share of the
        graph's ops and of its bytes moved, and the op types (most frequent first)."""
        moved = sum(n.bytes_read + n.bytes_written for n in self.nodes) or 1.0
        unknown = [n for n in self.nodes if not n.cost_known]
        ops = self.unknown_ops()
        return {"ops": len(unknown), "op_share": len(unknown) / max(len(self.nodes), 1),
                "byte_share": sum(n.bytes_read + n.bytes_written for n in unknown) / moved,
                "op_types": dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])))}

    def param_bytes_by_dtype(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for p in self.params:
            t = self.tensors[p]
            out[t.dtype] = out.get(t.dtype, 0.0) + t.nbytes
        return out
