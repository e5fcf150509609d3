"""A mixture-of-experts layer, found from its router: how many experts, how many per token, which weights.

The router is a TopK over the scores of a projection whose output width is
the number of experts E; k is the TopK's output width. Routed-expert weights
are the layer's parameters stacked by expert (leading dim E, other than the
router's own weight: transformers 5 and our zoo store them that way) or
named `*.experts.<i>.*` (one module per expert, as transformers 4 and
DeepSeek's release name them: the project's convention for expert weights,
see `planner.block_costs`). Shared experts are ordinary dense weights.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.graph.ir import Graph
from planner.inference.graph_walk import GraphIndex, is_weight_matmul

_SCORE_OPS = frozenset({"Softmax", "Sigmoid", "Cast", "Identity", "Add", "Mul", "Reshape", "LogSoftmax", "Div"})


@dataclass(frozen=True, slots=True)
class MoeFacts:
    """Routed experts of one layer."""

    experts: int
    top_k: int
    params: frozenset[str]  # the routed experts' weights (all E of them)
    router_params: frozenset[str]
    expert_nodes: frozenset[int]  # the contractions that read them


def moe_facts(graph: Graph, index: GraphIndex, nodes: frozenset[int]) -> MoeFacts | None:
    """The routed experts among `nodes`, or None for a dense layer."""
    for i in sorted(nodes):
        n = graph.nodes[i]
        if n.op_type != "TopK" or not n.inputs:
            continue
        scores = graph.tensors.get(n.inputs[0])
        picked = graph.tensors.get(n.outputs[0]) if n.outputs else None
        if scores is None or picked is None or not scores.shape or not picked.shape:
            continue
        router = _router(graph, index, n.inputs[0], nodes)
        if router is None:
            continue
        experts, top_k = int(scores.shape[-1]), int(picked.shape[-1])
        if not 1 <= top_k < experts:
            continue
        router_params = index.weight_params(graph.nodes[router].inputs)
        params = frozenset(p for j in nodes for x in graph.nodes[j].inputs if x
                           for p in index.weight_of.get(x, ()) if p not in router_params
                           and _is_expert_param(graph, p, experts))
        if not params:
            continue
        expert_nodes = frozenset(j for j in nodes if is_weight_matmul(graph, index, j)
                                 and index.weight_params(graph.nodes[j].inputs) & params)
        return MoeFacts(experts=experts, top_k=top_k, params=params, router_params=router_params,
                        expert_nodes=expert_nodes)
    return None


def _router(graph: Graph, index: GraphIndex, scores: str, nodes: frozenset[int]) -> int | None:
    """The projection that produced the router scores (through softmax/sigmoid and casts)."""
    name = scores
    for _ in range(8):
        j = index.producer.get(name)
        if j is None or j not in nodes:
            return None
        if is_weight_matmul(graph, index, j):
            return j
        node = graph.nodes[j]
        if node.op_type not in _SCORE_OPS or not node.inputs:
            return None
        acts = [x for x in node.inputs if x and not index.is_weight(x) and x not in index.constants]
        if not acts:
            return None
        name = acts[0]
    return None


def _is_expert_param(graph: Graph, name: str, experts: int) -> bool:
    shape = graph.tensors[name].shape or ()
    return (len(shape) >= 3 and shape[0] == experts) or ".experts." in name
