"""Cost control-flow nodes (If, Loop, Scan) from the graphs they carry.

The IR is flat: a control-flow node stays one node whose cost is that of its
body. If: the costlier branch (we cannot know which runs). Loop: the body
times the trip count when it is a constant, else once (and a note says so).
Scan: the body times the length of the scanned axis. Never silently dropped.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np
import onnx

from planner.graph.op_costs import OpCost, node_cost
from planner.graph.dtype_rules import dtype_name

ShapeOf = Callable[[str], tuple[tuple[int, ...] | None, str]]


def _value_info_shape(vi: onnx.ValueInfoProto) -> tuple[tuple[int, ...] | None, str]:
    tt = vi.type.tensor_type
    dtype = dtype_name(tt.elem_type)
    if not tt.HasField("shape"):
        return None, dtype
    dims = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value"):
            return None, dtype
        dims.append(d.dim_value)
    return tuple(dims), dtype


def graph_cost(graph: onnx.GraphProto, outer: ShapeOf, attrs_of: Callable[[onnx.NodeProto], Mapping]) -> OpCost:
    """Sum of the costs of a (sub)graph's nodes, shapes from its value_info or the enclosing scope."""
    local: dict[str, tuple[tuple[int, ...] | None, str]] = {}
    for vi in (*graph.input, *graph.output, *graph.value_info):
        local[vi.name] = _value_info_shape(vi)
    for t in graph.initializer:
        local[t.name] = (tuple(t.dims), dtype_name(t.data_type))

    def shape_of(name: str) -> tuple[tuple[int, ...] | None, str]:
        return local[name] if name in local else outer(name)

    flops = read = written = 0.0
    known = True
    for n in graph.node:
        c = control_flow_cost(n, shape_of, attrs_of, {})[0] if is_control_flow(n) else _plain_cost(n, shape_of,
                                                                                                     attrs_of)
        flops, read, written, known = flops + c.flops, read + c.bytes_read, written + c.bytes_written, known and c.known
    return OpCost(flops, read, written, known)


def _plain_cost(n: onnx.NodeProto, shape_of: ShapeOf, attrs_of: Callable[[onnx.NodeProto], Mapping]) -> OpCost:
    ins = [shape_of(i) if i else (None, "") for i in n.input]
    outs = [shape_of(o) if o else (None, "") for o in n.output]
    return node_cost(n.op_type, n.domain, attrs_of(n), [s for s, _ in ins], [d for _, d in ins],
                     [s for s, _ in outs], [d for _, d in outs])


def is_control_flow(n: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute)


def control_flow_cost(n: onnx.NodeProto, shape_of: ShapeOf, attrs_of: Callable[[onnx.NodeProto], Mapping],
                      values: Mapping[str, np.ndarray]) -> tuple[OpCost, str]:
    """Cost of a node carrying subgraphs, and a one-line note of how it was costed."""
    graphs = {a.name: a.g for a in n.attribute if a.type == onnx.AttributeProto.GRAPH}
    label = n.name or n.op_type
    if n.op_type == "If" and {"then_branch", "else_branch"} <= graphs.keys():
        then_c = graph_cost(graphs["then_branch"], shape_of, attrs_of)
        else_c = graph_cost(graphs["else_branch"], shape_of, attrs_of)
        pick = max(then_c, else_c, key=lambda c: (c.flops, c.bytes_read + c.bytes_written))
        side = "then" if pick is then_c else "else"
        return pick, f"If '{label}': costed as its costlier branch ({side})"
    if n.op_type == "Loop" and "body" in graphs:
        body = graph_cost(graphs["body"], shape_of, attrs_of)
        trip = values.get(n.input[0]) if n.input and n.input[0] else None
        if trip is not None and np.asarray(trip).size == 1:
            k = int(np.asarray(trip).reshape(-1)[0])
            return _times(body, k), f"Loop '{label}': body costed {k} times (constant trip count)"
        return body, f"Loop '{label}': trip count not constant; body costed once"
    if n.op_type == "Scan" and "body" in graphs:
        body = graph_cost(graphs["body"], shape_of, attrs_of)
        n_scan = int(next((a.i for a in n.attribute if a.name == "num_scan_inputs"), 0))
        axes = list(next((a.ints for a in n.attribute if a.name == "scan_input_axes"), []))
        first = n.input[len(n.input) - n_scan] if n_scan else ""
        shape = shape_of(first)[0] if first else None
        axis = axes[0] if axes else 0
        if shape is not None and shape:
            k = shape[axis % len(shape)]
            return _times(body, k), f"Scan '{label}': body costed {k} times (scanned axis length)"
        return body, f"Scan '{label}': scan length unknown; body costed once"
    total = OpCost(0.0, 0.0, 0.0, True)
    for g in graphs.values():
        c = graph_cost(g, shape_of, attrs_of)
        total = OpCost(total.flops + c.flops, total.bytes_read + c.bytes_read,
                       total.bytes_written + c.bytes_written, total.known and c.known)
    return total, f"{n.op_type} '{label}': its {len(graphs)} subgraph(s) costed once each"


def _times(c: OpCost, k: int) -> OpCost:
    return OpCost(c.flops * k, c.bytes_read * k, c.bytes_written * k, c.known)
