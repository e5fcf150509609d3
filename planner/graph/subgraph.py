"""Cutting a graph into the part one program runs: its nodes, the tensors they touch, and its boundary.

A HyperMPMD program (a vision tower, an audio tower, the language model)
is planned on its own device group as if it were a model of its own: what
it reads from another program becomes a graph input, what another program
reads from it becomes a graph output.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Iterable

from planner.graph.ir import Graph


def extract(graph: Graph, nodes: Iterable[int], name: str) -> Graph:
    """The subgraph of `nodes` (indices into graph.nodes), in graph order."""
    idx = sorted(set(nodes))
    inside = [graph.nodes[i] for i in idx]
    produced = {o for n in inside for o in n.outputs if o}
    read = [x for n in inside for x in n.inputs if x]
    params = set(graph.params)
    members = set(idx)
    outside_read: set[str] = set()
    for i, n in enumerate(graph.nodes):
        if i not in members:
            outside_read.update(x for x in n.inputs if x in produced)
    # graph inputs first, in the original order (the importer's batch convention), then boundary tensors
    inputs = [x for x in graph.inputs if x in set(read)]
    seen = set(inputs)
    for x in read:
        if x not in produced and x not in params and x not in seen and x in graph.tensors:
            t = graph.tensors[x]
            if t.shape is not None and len(t.shape) > 0:  # constants and scalars are not boundary activations
                seen.add(x)
                inputs.append(x)
    outputs = [o for o in sorted(produced) if o in outside_read or o in graph.outputs]
    touched = set(read) | produced
    tensors = {k: v for k, v in graph.tensors.items() if k in touched}
    sub_params = tuple(p for p in graph.params if p in touched)
    return Graph(name=name, nodes=tuple(inside), tensors=tensors, inputs=tuple(inputs), outputs=tuple(outputs),
                 params=sub_params, opset=graph.opset, producer=graph.producer, dims=graph.dims,
                 metadata=graph.metadata, notes=graph.notes,
                 scalars=MappingProxyType({k: v for k, v in graph.scalars.items() if k in touched}))


def boundary_bytes(graph: Graph, sub: Graph) -> float:
    """Bytes per imported batch that flow into `sub` from the rest of the graph (its non-graph inputs)."""
    return sum(graph.tensors[x].nbytes for x in sub.inputs if x not in graph.inputs)
