"""The structural hash of a block: identical layers get the same hash, whatever their names.

Why a hash: the planner searches one strategy per block type, so every
instance of a repeated layer must land in one type, and layers that differ
(dense vs MoE, vision vs text) must not. The hash covers op types,
attributes, edges inside the block (as relative positions) and the shapes
of what enters from outside (parameters, activations); never names or the
layer index. O(nodes + edges) over the whole graph.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterable, Mapping, Sequence

from planner.graph.ir import Graph, Node

_CONSTANT_OPS = frozenset({"Constant"})
_INT_DTYPES = frozenset({"int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8", "bool"})


def _canon(value: Any) -> str:
    """A stable text form of an attribute value (no ids, no memory addresses)."""
    if isinstance(value, (bool, int, float, str, bytes)) or value is None:
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_canon(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k!r}:{_canon(value[k])}" for k in sorted(value)) + "}"
    tobytes = getattr(value, "tobytes", None) or getattr(value, "SerializeToString", None)
    if callable(tobytes):
        return f"{type(value).__name__}:{hashlib.sha1(tobytes()).hexdigest()[:16]}"
    return type(value).__name__


def structural_hash(graph: Graph, members: Iterable[int], producer: Mapping[str, int],
                    skip: Sequence[bool] | None = None) -> str:
    """Hash of a block's ops, attributes, internal edges (relative positions) and outer shapes."""
    h = hashlib.sha1()
    for line in signature(graph, members, producer, skip):
        h.update(line.encode())
        h.update(b"\n")
    return h.hexdigest()[:12]


def _is_shape_value(graph: Graph, name: str) -> bool:
    """An integer scalar or vector: a size or shape being computed, not data flowing through a layer."""
    t = graph.tensors.get(name)
    return t is not None and t.dtype in _INT_DTYPES and t.shape is not None and len(t.shape) <= 1


def skipped(graph: Graph, node: Node) -> bool:
    """Constants and shape arithmetic are not per-layer structure.

    The exporter creates each constant and each symbolic size (batch*seq...)
    once; later layers read the first layer's copy. Counting them would make
    the first instance of a layer look different from the others.
    """
    if node.op_type in _CONSTANT_OPS and node.domain in ("", "ai.onnx"):
        return True
    return bool(node.outputs) and all(_is_shape_value(graph, o) for o in node.outputs if o)


def shared_between_layers(graph: Graph, node_block: Sequence[int], stacks: Sequence[str | None],
                          producer: Mapping[str, int], skip: Sequence[bool]) -> set[int]:
    """Nodes of a layer that compute, from no weight, a value several layers of its stack read.

    The TorchScript exporter computes what all layers share once (the rotary
    cos/sin unsqueezed for the heads, a mask) and names it after the first
    layer that asks: that layer then looks different from the others. These
    nodes, and the weightless nodes feeding only them, are left out of the
    hash, so what they produce enters every layer the same way, from outside.
    The residual stream is never among them: it comes out of weights (a size
    read off it, such as the positions' count, does not count).
    """
    tensors = graph.tensors
    readers: list[set[int]] = [set() for _ in graph.nodes]
    weightless = [True] * len(graph.nodes)
    for i, node in enumerate(graph.nodes):
        for name in node.inputs:
            t = tensors.get(name)
            j = producer.get(name, -1)
            if j >= 0:
                readers[j].add(i)
            if (t is not None and t.is_param) or (j >= 0 and not (skip[j] or weightless[j])):
                weightless[i] = False
    shared: set[int] = set()
    for i in range(len(graph.nodes) - 1, -1, -1):
        stack = stacks[node_block[i]]
        if stack is None or skip[i] or not weightless[i] or not readers[i]:
            continue
        layers = {node_block[c] for c in readers[i] if stacks[node_block[c]] == stack}
        if len(layers) > 1 or all(c in shared for c in readers[i]):
            shared.add(i)
    return shared


def signature(graph: Graph, members: Iterable[int], producer: Mapping[str, int],
              skip: Sequence[bool] | None = None) -> list[str]:
    """One line per node of a block, free of names and layer indices (see `skipped`).

    `skip` is `skipped` per graph node, when the caller computed it already.
    """
    tensors = graph.tensors
    if skip is None:
        skip = [skipped(graph, n) for n in graph.nodes]
    members = [i for i in members if not skip[i]]
    local = {i: k for k, i in enumerate(members)}
    lines: list[str] = []
    for i in members:
        node = graph.nodes[i]
        parts = [node.qualified_op, str(len(node.outputs))]
        parts += [f"{k}={_canon(node.attrs[k])}" for k in sorted(node.attrs)]
        for name in node.inputs:
            t = tensors.get(name)
            j = producer.get(name, -1)
            shape = f"{t.shape}{t.dtype}" if t is not None else "?"
            if not name:
                parts.append("-")
            elif j in local:
                parts.append(f"n{local[i] - local[j]}")
            elif _is_shape_value(graph, name) or (j >= 0 and skip[j]):
                parts.append(f"c{shape}")
            elif t is not None and t.is_param:
                parts.append(f"p{shape}")
            else:
                parts.append(f"{'x' if j >= 0 else 'i'}{shape}")
        lines.append("|".join(parts))
    return lines
