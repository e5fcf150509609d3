"""A mixture-of-experts layer, found from its router: how many experts, how many per token, which weights.

The router is a TopK over the scores of a projection whose output width is
the number of experts E; k is the TopK's output width. A router may instead
pick one expert per ArgMax over its scores, masking those picked before
(Phi-3.5-MoE's sparsemixer): k is then its number of ArgMaxes. Routed-expert weights
are the layer's parameters stacked by expert (leading dim E, other than the
router's own weight: transformers 5 and our zoo store them that way) or
named `*.experts.<i>.*` (one module per expert, as transformers 4 and
DeepSeek's release name them: the project's convention for expert weights,
see `planner.costing.block_costs`). Shared experts are ordinary dense weights. Training and serving both find experts here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from planner.graph.blocks import Structure
from planner.graph.ir import Graph
from planner.graph.walk import GraphIndex, is_weight_matmul

_SCORE_OPS = frozenset({"Softmax", "Sigmoid", "Cast", "Identity", "Add", "Mul", "Reshape", "LogSoftmax", "Div",
                        "Where", "ScatterElements"})


@dataclass(frozen=True, slots=True)
class MoeFacts:
    """Routed experts of one layer."""

    experts: int
    top_k: int
    params: frozenset[str]  # the routed experts' weights (all E of them)
    router_params: frozenset[str]
    expert_nodes: frozenset[int]  # the contractions that read them
    tokens: int = 0  # tokens routed per forward at the imported batch (rows of the router's input)
    hidden: int = 0  # width of each routed token (what dispatch sends per (token, expert) pair)
    topk_node: int = -1  # the router's TopK (or its first ArgMax)


def moe_blocks(graph: Graph, index: GraphIndex, structure: Structure) -> dict[str, MoeFacts]:
    """Per block with a router, its routed experts (dense blocks are absent)."""
    out: dict[str, MoeFacts] = {}
    for b in structure.blocks:
        found = moe_facts(graph, index, frozenset(b.nodes)) if b.nodes else None
        if found is not None:
            out[b.name] = found
    return out


def expert_params(graph: Graph, structure: Structure, index: GraphIndex | None = None) -> frozenset[str]:
    """The routed experts' weights of every MoE block, found from the routers (not from parameter names)."""
    from planner.graph.walk import index_graph

    index = index or index_graph(graph)
    return frozenset(p for f in moe_blocks(graph, index, structure).values() for p in f.params)


def router_params(graph: Graph, structure: Structure, index: GraphIndex | None = None) -> frozenset[str]:
    """The routers' weights of every MoE block (the GEMM whose top-k picks the experts)."""
    from planner.graph.walk import index_graph

    index = index or index_graph(graph)
    return frozenset(p for f in moe_blocks(graph, index, structure).values() for p in f.router_params)


def token_wide_params(graph: Graph, moe: MoeFacts) -> frozenset[str]:
    """The experts' weights holding one token's width per expert (E x hidden): an output bias (gpt-oss's
    down_proj_bias), or an up projection's bias as wide."""
    return frozenset(p for p in moe.params if graph.tensors[p].numel == moe.experts * moe.hidden
                     and (graph.tensors[p].shape or (0,))[-1] == moe.hidden)


def moe_facts(graph: Graph, index: GraphIndex, nodes: frozenset[int]) -> MoeFacts | None:
    """The routed experts among `nodes`, or None for a dense layer. Of several TopKs over router scores the one
    over the most: group-limited routing (DeepSeek-V3's n_group, topk_group) first picks groups by a TopK over
    the group scores, then the experts by one over all of them."""
    found = list(_candidates(graph, index, nodes))
    return max(found, key=lambda f: (f.experts, -f.topk_node)) if found else None


def _candidates(graph: Graph, index: GraphIndex, nodes: frozenset[int]):
    """Each TopK among `nodes` over a router's scores, as the MoeFacts it would make; and each router whose experts
    are picked one ArgMax at a time, the scores of those picked before masked out (Phi-3.5-MoE's sparsemixer):
    as many ArgMaxes over its scores as experts a token takes."""
    argmaxes: dict[int, list[int]] = {}
    topk_routers: set[int] = set()
    for i in sorted(nodes):
        n = graph.nodes[i]
        if n.op_type not in ("TopK", "ArgMax") or not n.inputs:
            continue
        scores = graph.tensors.get(n.inputs[0])
        picked = graph.tensors.get(n.outputs[0]) if n.outputs else None
        if scores is None or picked is None or not scores.shape or not picked.shape:
            continue
        router = _router(graph, index, n.inputs[0], nodes)
        if router is None:
            continue
        if n.op_type == "ArgMax":  # over the experts (the scores' last axis; ONNX's default axis is the first)
            if int(n.attrs.get("axis", 0)) % len(scores.shape) == len(scores.shape) - 1:
                argmaxes.setdefault(router, []).append(i)
            continue
        found = _facts(graph, index, nodes, router, int(scores.shape[-1]), int(picked.shape[-1]), i)
        if found is not None:
            topk_routers.add(router)
            yield found
    for router, picks in argmaxes.items():
        if router in topk_routers:  # a TopK over the same scores says k itself
            continue
        experts = int(graph.tensors[graph.nodes[picks[0]].inputs[0]].shape[-1])
        found = _facts(graph, index, nodes, router, experts, len(picks), picks[0])
        if found is not None:
            yield found


def _facts(graph: Graph, index: GraphIndex, nodes: frozenset[int], router: int, experts: int, top_k: int,
           pick: int) -> MoeFacts | None:
    """The MoeFacts of `router`'s layer, which picks `top_k` of `experts` at node `pick` (None: no routed
    experts' weights among `nodes`)."""
    if not 1 <= top_k < experts:
        return None
    router_params = index.weight_params(graph.nodes[router].inputs)
    params = frozenset(p for j in nodes for x in graph.nodes[j].inputs if x
                       for p in index.weight_of.get(x, ()) if p not in router_params
                       and _is_expert_param(graph, p, experts))
    if not params:
        return None
    expert_nodes = frozenset(j for j in nodes if is_weight_matmul(graph, index, j)
                             and index.weight_params(graph.nodes[j].inputs) & params)
    x = next((graph.tensors.get(y) for y in graph.nodes[router].inputs if y and not index.is_weight(y)), None)
    hidden = int(x.shape[-1]) if x is not None and x.shape else 0
    tokens = int(x.numel // hidden) if hidden else 0
    return MoeFacts(experts=experts, top_k=top_k, params=params, router_params=router_params,
                    expert_nodes=expert_nodes, tokens=tokens, hidden=hidden, topk_node=pick)


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
        if node.op_type == "Where":  # group-limited routing masks the scores of the groups it did not pick
            out = graph.tensors.get(node.outputs[0]) if node.outputs else None
            acts = [x for x in acts[1:] if out is not None and x in graph.tensors
                    and graph.tensors[x].shape == out.shape and graph.tensors[x].dtype == out.dtype]
        if not acts:
            return None
        name = acts[0]
    return None


def _is_expert_param(graph: Graph, name: str, experts: int) -> bool:
    shape = graph.tensors[name].shape or ()
    return (len(shape) >= 3 and shape[0] == experts) or ".experts." in name


def routed_region(graph: Graph, index: GraphIndex, nodes: frozenset[int], moe: MoeFacts) -> frozenset[int]:
    """The nodes of a MoE layer that run on routed tokens: from the router's TopK (or first ArgMax) through the
    dispatch (sort, gather, pad) and the experts to the combine back into [tokens, hidden] (the first node after
    the experts whose output has that size). What the expert-parallel model costs instead of the tensor-axis program."""
    def closure(starts, step, stop=None):
        seen, stack = set(), list(starts)
        while stack:
            j = stack.pop()
            if j in seen or j not in nodes:
                continue
            seen.add(j)
            if stop is not None and stop(j):
                continue
            stack += step(j)
        return seen

    def after(j):
        return [c for o in graph.nodes[j].outputs if o for c in index.consumers.get(o, ())]

    def before(j):
        return [index.producer[x] for x in graph.nodes[j].inputs
                if x and x in index.producer and not index.is_weight(x)]

    width = moe.tokens * moe.hidden

    def combined(j):
        return j not in moe.expert_nodes and any(
            o in graph.tensors and graph.tensors[o].numel == width for o in graph.nodes[j].outputs if o)

    down = closure([moe.topk_node], after)
    up = closure(moe.expert_nodes, before)
    out = closure(moe.expert_nodes, after, stop=combined)
    return frozenset((down & up) | out | moe.expert_nodes)


def expert_counts(graph: Graph, structure, index: GraphIndex | None = None) -> list[int]:
    """The distinct routed-expert counts of the graph's MoE layers, ascending ([] for a dense model)."""
    from planner.graph.walk import index_graph

    index = index or index_graph(graph)
    found = [moe_facts(graph, index, frozenset(b.nodes)) for b in structure.blocks if b.is_layer and b.nodes]
    return sorted({f.experts for f in found if f is not None})


def ep_problem(ep: int, counts: Iterable[int]) -> str:
    """Why an expert-parallel degree `ep` cannot split MoE layers of these routed-expert counts, or "": each rank
    holds the same whole number of experts, as every backend splits them."""
    counts = sorted(set(counts))
    odd = [e for e in counts if e % ep]
    if not odd:
        return ""
    fits = [d for d in range(1, counts[0] + 1) if all(e % d == 0 for e in counts)]
    return (f"--ep {ep} does not divide the {odd[0]} routed experts of a MoE layer, so its ranks would hold unequal "
            f"shares; use an ep that divides them ({', '.join(map(str, fits))})")


def routed_experts(graph: Graph, structure, index: GraphIndex | None = None) -> int:
    """The most routed experts any layer of the graph has (0 for a dense model), found from the routers."""
    return max(expert_counts(graph, structure, index), default=0)
