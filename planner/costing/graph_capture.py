"""Which ops a stack replays from CUDA graphs: the host issues nothing for them.

A kernel captured in a CUDA graph is launched by the device when the graph
replays, so the per-kernel host cost an eager step pays
(`Cluster.host_overhead_s`, `NodeTimes`) is not paid for it. Megatron-Core
captures either the whole forward-backward path of a step
(cuda_graph_impl = "full_iteration": one graph, the optimizer step outside)
or, per layer, the modules its cuda_graph_modules name
(megatron/core/transformer/transformer_config.py, NVIDIA/Megatron-LM at
d98e8a64dd):

- "attn": TransformerLayer._forward_attention(): the input norm, the
  attention and its residual add;
- "mlp" / "moe": TransformerLayer._forward_mlp() of a dense / MoE layer: the
  rest of the layer;
- "moe_router": _forward_mlp() up to MoELayer.router(), shared experts
  included; "moe_preprocess": the token dispatcher's preprocessing, which
  Megatron-Core captures only together with "moe_router".

Read from a graph: a layer's attention part is everything its first residual
add after the attention core depends on inside the layer (that add
included); the rest is its MLP part. In a MoE layer, the part before the
experts is what of the MLP part neither runs on routed tokens nor follows
from them. ASSUMPTION: an imported graph does not tell the router's ops from
the dispatcher's preprocessing, so either of "moe_router" and
"moe_preprocess" captures that whole part (the recipes that name one name
both). ASSUMPTION: a multi-token-prediction depth (`planner.graph.mtp`) is
costed uncaptured under per-layer graphs, where Megatron-Core graphs the one
transformer layer inside it: at most one layer's host issue charged over;
and an encoder tower's layers (a vision or audio encoder beside the decoder
whose last layer ends the model) are costed uncaptured, as Megatron-Core's
training graphs hold the language model's layers.
"""

from __future__ import annotations

import numpy as np

from planner.graph.ir import Graph


def captured_nodes(graph: Graph, facts, scopes: tuple[str, ...]) -> np.ndarray:
    """Per node of `graph`, whether the stack's CUDA graphs (`scopes`, `Execution.cuda_graphs`) replay it."""
    n = len(graph.nodes)
    if "full_iteration" in scopes:
        return np.ones(n, dtype=bool)
    out = np.zeros(n, dtype=bool)
    if not scopes:
        return out
    layers = facts.structure.layers()
    mtp = {b.name for b in layers[len(layers) - facts.mtp_layers():]} if facts.mtp_layers() else set()
    decoder = layers[-1].submodel if layers else None  # the language model's layers, not an encoder tower's
    for b in layers:
        if b.name in mtp or b.submodel != decoder:
            continue
        nodes = sorted(b.nodes)
        attn = attention_part(graph, facts, b.name, nodes)
        mlp = [i for i in nodes if i not in attn]
        moe = b.name in facts.moe
        if "attn" in scopes:
            out[sorted(attn)] = True
        if ("mlp" in scopes and not moe) or ("moe" in scopes and moe):
            out[mlp] = True
        elif moe and ("moe_router" in scopes or "moe_preprocess" in scopes):
            after = _reached(graph, mlp, {i for i in mlp if facts.in_routed[i]})
            routing = _routing(graph, facts, mlp)
            out[[i for i in mlp if i not in after or i in routing]] = True
    return out


def attention_part(graph: Graph, facts, block: str, nodes: list[int]) -> set[int]:
    """The nodes of a layer (`nodes`, in graph order) that its attention part runs: its first residual add after
    an attention core (a node that follows from the core and reads the layer's input) and all that add depends on
    inside the layer; none in a layer without an attention core."""
    cores = {i for i in nodes if facts.in_region[i]}
    if not cores:
        return set()
    inputs = set(facts.layer_inputs.get(block, ()))
    inputs |= {t for t, root in facts.roots.items() if root in inputs}
    after = _reached(graph, nodes, cores)
    add = next((i for i in nodes if i in after and i not in cores
                and any(x in inputs for x in graph.nodes[i].inputs if x)), None)
    if add is None:
        return set()
    inside = set(nodes)
    part, todo = {add}, [add]
    while todo:
        for x in graph.nodes[todo.pop()].inputs:
            src = facts.producer.get(x) if x else None
            if src is not None and src[0] in inside and src[0] not in part:
                part.add(src[0])
                todo.append(src[0])
    return part


def _routing(graph: Graph, facts, nodes: list[int]) -> set[int]:
    """What Megatron-Core's router computes (MoELayer.router(): scores, top-k, probabilities): the router's GEMMs
    and the nodes of `nodes` (in graph order) whose every data input follows from them alone."""
    found = {i for i in nodes if facts.router_node[i]}
    written = {o for i in found for o in graph.nodes[i].outputs if o}
    for i in nodes:
        data = [x for x in graph.nodes[i].inputs
                if x and x in facts.producer and not facts.index.is_weight(x) and x not in facts.index.constants]
        if i not in found and data and all(x in written for x in data):
            found.add(i)
            written.update(o for o in graph.nodes[i].outputs if o)
    return found


def _reached(graph: Graph, nodes: list[int], start: set[int]) -> set[int]:
    """`start` and the nodes of `nodes` (in graph order) that read, directly or not, what `start` writes."""
    seen = set(start)
    written = {o for i in start for o in graph.nodes[i].outputs if o}
    for i in nodes:
        if i in seen:
            continue
        if any(x in written for x in graph.nodes[i].inputs if x):
            seen.add(i)
            written.update(o for o in graph.nodes[i].outputs if o)
    return seen


__all__ = ["attention_part", "captured_nodes"]
