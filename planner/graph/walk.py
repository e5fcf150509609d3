"""Small structural queries over a graph that the inference profile needs: weights, producers, per-token widths.

Why a module of its own: the KV-cache and MoE finders both walk the graph
by the same facts (which tensors are weights or derived only from weights,
which node produced a tensor, how wide a tensor is per token), and they
must agree on them. Everything is computed once per graph, O(nodes + edges).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping

from planner.graph.ir import Graph
from planner.costing.node_work import MATRIX_OPS

#: Ops that carry a weight through unchanged in value or only re-laid out or dequantised
#: (exporters often transpose a weight before its MatMul, or gather the routed experts' weights).
WEIGHT_CARRIERS = frozenset({"Transpose", "Cast", "Reshape", "Identity", "DequantizeLinear", "Squeeze", "Unsqueeze",
                             "Gather", "GatherND", "GatherElements", "Expand", "Flatten", "Slice", "Split"})


@dataclass(frozen=True, slots=True)
class GraphIndex:
    """Producer and consumers of each tensor, and the parameters each weight-derived tensor comes from."""

    producer: Mapping[str, int]
    consumers: Mapping[str, tuple[int, ...]]
    weight_of: Mapping[str, frozenset[str]]  # tensor -> parameters it is made of (weights and their views)
    constants: frozenset[str]  # outputs of Constant-like nodes and initializers that are not parameters

    outputs: tuple[tuple[str, ...], ...] = ()

    def outputs_of(self, i: int) -> tuple[str, ...]:
        return self.outputs[i]

    def is_weight(self, name: str) -> bool:
        return name in self.weight_of

    def weight_params(self, node_inputs: tuple[str, ...]) -> frozenset[str]:
        """Parameters a node reads through any of its inputs."""
        out: set[str] = set()
        for x in node_inputs:
            out |= self.weight_of.get(x, frozenset())
        return frozenset(out)


def index_graph(graph: Graph) -> GraphIndex:
    """Producers, consumers, weight-derived tensors (params and anything computed from params and constants only
    through `WEIGHT_CARRIERS`, or selected from them by an index: the routed-expert gather of torch exports)."""
    producer: dict[str, int] = {}
    consumers: dict[str, list[int]] = defaultdict(list)
    params = set(graph.params)
    weight_of: dict[str, frozenset[str]] = {p: frozenset((p,)) for p in graph.params}
    produced = {o for n in graph.nodes for o in n.outputs if o}
    inputs = set(graph.inputs)
    constants: set[str] = {name for name, t in graph.tensors.items() if not t.is_param and name not in inputs
                           and name not in produced}
    for i, n in enumerate(graph.nodes):
        for x in n.inputs:
            if x:
                consumers[x].append(i)
        for o in n.outputs:
            if o:
                producer[o] = i
        if n.op_type in ("Constant", "ConstantOfShape") or (n.inputs and all(not x or x in constants for x in n.inputs)
                                                             and not any(x in params for x in n.inputs)):
            constants.update(o for o in n.outputs if o)
            continue
        if n.op_type not in WEIGHT_CARRIERS or not n.inputs or n.inputs[0] not in weight_of:
            continue
        data = n.inputs[0]
        if n.op_type in ("Gather", "GatherND", "GatherElements"):
            if len(graph.tensors[data].shape or ()) < 3:
                continue  # a row lookup (an embedding) makes activations; a stack of matrices gives weights
        elif not all(not x or x in weight_of or x in constants for x in n.inputs[1:]):
            continue
        for o in n.outputs:
            if o:
                weight_of[o] = weight_of[data]
    return GraphIndex(producer=dict(producer), consumers={k: tuple(v) for k, v in consumers.items()},
                      weight_of=weight_of, constants=frozenset(constants),
                      outputs=tuple(tuple(o for o in n.outputs if o) for n in graph.nodes))


def is_weight_matmul(graph: Graph, index: GraphIndex, i: int) -> bool:
    """A contraction with a weight operand (a projection), as opposed to one of two activations (attention)."""
    n = graph.nodes[i]
    return n.op_type in MATRIX_OPS and any(index.is_weight(x) for x in n.inputs if x)


def per_token(graph: Graph, name: str, tokens: int) -> float:
    """Elements of tensor `name` per token, when `tokens` tokens (batch x sequence) produced it."""
    t = graph.tensors.get(name)
    return (t.numel / tokens) if t is not None and t.shape is not None and tokens > 0 else 0.0


def forward_closure(graph: Graph, index: GraphIndex, start: str, nodes: frozenset[int]) -> frozenset[str]:
    """Tensors computed (inside `nodes`) from `start`: the token stream of a layer, not its position tables."""
    seen = {start}
    stack = [start]
    while stack:
        t = stack.pop()
        for j in index.consumers.get(t, ()):
            if j not in nodes:
                continue
            for o in graph.nodes[j].outputs:
                if o and o not in seen and not index.is_weight(o):
                    seen.add(o)
                    stack.append(o)
    return frozenset(seen)
