"""Per-node work of a graph, split into what scales with the batch and what does not.

The graph is imported at one batch b0 (usually 1). An estimate runs it at a
micro-batch b on shards of 1/k: activation FLOPs and bytes scale by b/(b0 k)
while the bytes of the weights a node reads scale by 1/k only. Keeping the
two apart is what makes decode (weight-bound) and training (FLOP-bound)
come out of the same graph.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import numpy as np

from planner.graph.ir import Graph, dtype_bytes
from planner.graph.op_costs import is_shape_arithmetic

#: Ops that run on the matrix units; every other op is costed as vector / memory work.
MATRIX_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "Attention", "FusedMatMul",
                        "MatMulInteger", "QLinearMatMul", "MultiHeadAttention", "GroupQueryAttention"})

FLOAT_DTYPES = frozenset({"float32", "float", "float16", "bfloat16", "float64", "double",
                          "float8e4m3fn", "float8e5m2", "float8e4m3fnuz", "float8e5m2fnuz"})


@dataclass(frozen=True, slots=True)
class NodeWork:
    """Arrays over graph nodes: FLOPs, activation bytes and weight bytes at the imported batch."""

    flops: np.ndarray
    act_bytes: np.ndarray
    param_bytes: np.ndarray
    matrix: np.ndarray  # bool: runs on the matrix units
    host: np.ndarray  # bool: only computes sizes or scalars, which frameworks do on the host (no kernel)
    batch: int  # the batch the graph was imported at
    float_bytes: float  # bytes per element of the graph's floating-point tensors


def graph_batch(graph: Graph) -> int:
    """The batch the graph was built or bound at: dim 0 of its first non-parameter input (1 if none)."""
    for name in graph.inputs:
        t = graph.tensors.get(name)
        if t is not None and t.shape:
            return max(1, int(t.shape[0]))
    return 1


def float_width(graph: Graph) -> float:
    """Bytes per element of the graph's weights (its training/inference precision as exported)."""
    widths = [dtype_bytes(graph.tensors[p].dtype) for p in graph.params if graph.tensors[p].dtype in FLOAT_DTYPES]
    if not widths:
        return 4.0
    values, counts = np.unique(np.array(widths), return_counts=True)
    return float(values[int(np.argmax(counts))])


def node_work(graph: Graph, weights: Collection[str] | Mapping[str, Collection[str]] | None = None) -> NodeWork:
    """Per-node work; `weights` are the tensors that hold weights (parameters, and views of them such as a
    transposed or a gathered stack of expert matrices: `planner.graph.walk`), which a micro-batch does not
    scale (default: the parameters). Given as a mapping to the parameters each is made of, a view is charged at
    most those parameters' bytes: a per-token gather of expert matrices (transformers' batched_mm experts, as
    exported) spells a copy of an expert's weights for every (token, expert) pair, where a grouped GEMM reads
    each expert's weights once."""
    made_of = weights if isinstance(weights, Mapping) else {}
    weights = set(graph.params) if weights is None else set(weights)

    def weight_bytes(x: str) -> float:
        view = graph.tensors[x].nbytes
        params = made_of.get(x)
        if not params:
            return view
        return min(view, sum(graph.tensors[p].nbytes for p in params if p in graph.tensors))

    n = len(graph.nodes)
    flops = np.zeros(n)
    act = np.zeros(n)
    pbytes = np.zeros(n)
    matrix = np.zeros(n, dtype=bool)
    host = np.zeros(n, dtype=bool)

    def typed(name: str) -> tuple:
        t = graph.tensors.get(name)
        return (t.shape, t.dtype) if t is not None else (None, "")

    for i, node in enumerate(graph.nodes):
        read = [x for x in set(node.inputs) if x in weights and x in graph.tensors]
        pb = sum(weight_bytes(x) for x in read)
        views = sum(graph.tensors[x].nbytes for x in read)  # what the op's own bytes count for them
        flops[i] = node.flops
        pbytes[i] = pb
        act[i] = max(0.0, node.bytes_read + node.bytes_written - views)
        matrix[i] = node.op_type in MATRIX_OPS and node.flops > 0
        host[i] = not matrix[i] and is_shape_arithmetic(node.op_type, [typed(x) for x in node.inputs if x],
                                                        [typed(o) for o in node.outputs if o])
    host |= shape_only(graph)
    return NodeWork(flops, act, pbytes, matrix, host, graph_batch(graph), float_width(graph))


#: Ops that read only their input's shape: a tensor they read is not kept alive as data.
METADATA_OPS = frozenset({"Shape", "Size"})


def shape_only(graph: Graph) -> np.ndarray:
    """Per node: an op whose outputs only ever reach a Shape or Size (through ops of the same kind), so only
    their shapes are used: what a tracer recorded to size a buffer (a max over routing indices), computed from
    shapes a runtime already knows. Nodes come in topological order, so readers are decided first."""
    readers: dict[str, list[int]] = {}
    for i, n in enumerate(graph.nodes):
        for x in n.inputs:
            if x:
                readers.setdefault(x, []).append(i)
    outputs = set(graph.outputs)
    out = np.zeros(len(graph.nodes), dtype=bool)
    for i in range(len(graph.nodes) - 1, -1, -1):
        n = graph.nodes[i]
        names = [o for o in n.outputs if o]
        users = [j for o in names for j in readers.get(o, ())]
        out[i] = bool(users) and n.op_type not in METADATA_OPS and not any(o in outputs for o in names) \
            and all(graph.nodes[j].op_type in METADATA_OPS or out[j] for j in users)
    return out
