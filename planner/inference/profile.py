"""A graph's serving profile: per layer, the weights, FLOPs and bytes per token, the KV cache, the experts.

Inference cost is a function of how many tokens a step carries and how
long the context is; the graph is imported once at a short sequence and
every quantity is divided by its tokens (or by its query-key pairs), so one
profile costs any prompt length, context and batch. What stays per token:
projection FLOPs, memory-bound bytes, the cache; what is per pair: the
attention core; what is per (token, expert): the routed experts; what is
per sequence: the vocabulary projection during prefill (only the last
position's logits are needed) and encoder towers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from planner.errors import InvalidModel
from planner.costing.attention import attention_regions, mask_builders
from planner.costing.fusion import fused_act_bytes
from planner.graph.blocks import Structure
from planner.graph.ir import Graph
from planner.graph.walk import GraphIndex, forward_closure, index_graph, is_weight_matmul
from planner.inference.kv_cache import AttentionFacts, attention_facts, core_windows, find_cores
from planner.graph.moe import moe_facts
from planner.costing.node_work import FLOAT_DTYPES, graph_batch, node_work

PartKind = Literal["layer", "pre", "post", "encoder"]

#: Ops that only move data: serving kernels fold them into their neighbours' loads and stores (rotary
#: embedding and head split inside the attention kernel, expert permutation inside dispatch and the grouped
#: GEMM: FlashMLA, DeepEP, DeepGEMM), so they add no HBM traffic of their own.
DATA_MOVEMENT = frozenset({"Transpose", "Reshape", "Split", "Concat", "Slice", "Gather", "GatherND", "GatherElements",
                           "ScatterND", "ScatterElements", "Expand", "Pad", "Cast", "Squeeze", "Unsqueeze", "Identity",
                           "Tile", "Flatten", "Shape", "Constant", "ConstantOfShape", "SplitToSequence",
                           "SequenceAt", "CastLike", "Range", "TopK"})


@dataclass(frozen=True, slots=True)
class Experts:
    """Routed experts of one layer: E, k, elements of one expert, FLOPs per (token, expert) pair."""

    experts: int
    top_k: int
    params_per_expert: float
    flops_per_pair: float


@dataclass(frozen=True, slots=True)
class Part:
    """One block of the model as serving costs it (a layer, or the embedding / head around the layers)."""

    name: str
    kind: PartKind
    type_id: str
    dense_params: float  # elements outside the routed experts: split by tensor parallelism, replicated by data
    streamed_params: float  # of those, the ones read whole every forward (a gathered embedding table is not)
    flops_per_token: float  # projections outside the routed experts (per sample for an encoder)
    vector_bytes_per_token: float  # memory-bound ops, at the graph's float width
    act_bytes_per_token: float  # the largest activation one op writes (workspace)
    attention: tuple[AttentionFacts, ...] = ()
    experts: Experts | None = None
    syncs: int = 0  # points where a tensor-parallel partial sum joins the residual stream

    @property
    def cached_elements(self) -> float:
        return sum(a.cached_elements for a in self.attention)

    @property
    def params(self) -> float:
        e = self.experts
        return self.dense_params + (e.experts * e.params_per_expert if e else 0.0)


@dataclass(frozen=True, slots=True)
class Profile:
    """The serving profile of a graph: parts in graph order and what they share."""

    name: str
    parts: tuple[Part, ...]
    hidden: int  # width of the residual stream
    float_bytes: float  # bytes per element of the graph's weights (quantities here are in elements or at this width)
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def layers(self) -> tuple[Part, ...]:
        return tuple(p for p in self.parts if p.kind == "layer")

    @property
    def params(self) -> float:
        return sum(p.params for p in self.parts)

    @property
    def cached_elements_per_token(self) -> float:
        """KV-cache elements per token, all layers (of a sequence no longer than any sliding window)."""
        return sum(p.cached_elements for p in self.parts)

    def cached_elements_at(self, context: float) -> float:
        """KV-cache elements a sequence of `context` tokens holds, all layers: a sliding-window layer its last
        window's."""
        return sum(a.cached_elements * a.held(context) for p in self.parts for a in p.attention)

    @property
    def is_moe(self) -> bool:
        return any(p.experts for p in self.parts)


def _generates_tokens(graph: Graph) -> bool:
    """A token generator looks tokens up in an embedding table (a Gather of a weight by integer ids) and ends in
    logits over that table's vocabulary: an encoder (ViT, CLIP) has no such output and nothing to decode."""
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    inputs = set(graph.inputs)

    def from_input(x: str) -> bool:  # ids fed by the caller (through reshapes), not positions made in the graph
        while x not in inputs:
            n = producer.get(x)
            if n is None or n.op_type not in _RESHAPES or not n.inputs:
                return False
            x = n.inputs[0]
        return True

    vocab = {graph.tensors[n.inputs[0]].shape[0] for n in graph.nodes
             if n.op_type == "Gather" and len(n.inputs) > 1 and n.inputs[0] in graph.params
             and graph.tensors[n.inputs[1]].dtype.startswith(("int", "uint")) and from_input(n.inputs[1])}
    return any((graph.tensors[o].shape or (None,))[-1] in vocab for o in graph.outputs if o in graph.tensors)


_RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Cast", "Identity", "Expand", "View"})


def serving_profile(graph: Graph, structure: Structure) -> Profile:
    """Profile every block of the graph; raises InvalidModel if it has no layers to serve.

    Layers keep their own part (tied layers share one profile). The decoder's other blocks are pooled by
    position into an embedding part (before the first layer) and a head part (after the last); the blocks
    of other sub-models (vision or audio towers) into one encoder part each.
    """
    layers = [b for b in structure.blocks if b.is_layer and b.nodes]
    if not layers:
        raise InvalidModel(f"'{graph.name}' has no repeated layers (blocks like model.layers.N); inference planning "
                           "needs a decoder stack to cost prefill and decode")
    if not _generates_tokens(graph):
        raise InvalidModel(f"'{graph.name}' reads no token ids through an embedding table into logits over that "
                           "vocabulary, so it does not generate text and has no decode phase; --mode infer plans "
                           "language models (plan this one's training with --mode train)")
    index = index_graph(graph)
    work = node_work(graph)
    acts = fused_act_bytes(graph, work.act_bytes, work.matrix, set())
    # the ops that only build attention masks do not run beside a flash kernel (it takes causal and window flags)
    regions = tuple(attention_regions(graph, index))
    free = mask_builders(graph, index, regions)
    acts[sorted(free)] = 0.0
    batch = graph_batch(graph)
    decoder = layers[-1].submodel
    mine = [b for b in layers if b.submodel == decoder]
    last = max(max(b.nodes) for b in mine)
    hidden_name = _stream_input(graph, index, mine[-1].name, frozenset(mine[-1].nodes))
    tokens = _tokens(graph, hidden_name)
    hidden = int((graph.tensors[hidden_name].shape or (1,))[-1])
    groups: dict[tuple[str, str], list[int]] = {}
    for blk in structure.blocks:
        if blk.is_layer and blk.submodel == decoder:
            continue
        for i in blk.nodes:
            if blk.submodel != decoder:
                key = ("encoder", blk.submodel)
            else:
                key = ("post", "head") if i > last else ("pre", "embedding")
            groups.setdefault(key, []).append(i)
    owner = _param_owner(graph, index, structure, decoder, last)
    by_type: dict[str, Part] = {}
    parts: list[Part] = []
    if ("pre", "embedding") in groups:
        parts.append(_part(graph, index, work, acts, "embedding", "pre", "embedding", groups[("pre", "embedding")],
                           owner, tokens, batch, regions, free))
    for blk in mine:
        if blk.type_id not in by_type:
            by_type[blk.type_id] = _part(graph, index, work, acts, blk.name, "layer", blk.type_id, list(blk.nodes),
                                         owner, tokens, batch, regions, free)
        parts.append(_with_windows(graph, index, dataclasses.replace(by_type[blk.type_id], name=blk.name), blk.nodes,
                                   regions))
    for (kind, name), nodes in sorted(groups.items()):
        if kind != "pre":
            parts.append(_part(graph, index, work, acts, name, kind, name, nodes, owner, tokens, batch, regions, free))
    parts = [p for p in parts if p.kind == "layer" or p.params or p.flops_per_token]
    notes = () if any(p.attention for p in parts) else (
        "no attention core was found: the model keeps no KV cache, decode costs weights and projections only",)
    return Profile(name=graph.name, parts=tuple(parts), hidden=hidden, float_bytes=work.float_bytes, notes=notes)


def _with_windows(graph: Graph, index: GraphIndex, part: Part, nodes, regions) -> Part:
    """A layer's part with its own attention cores' sliding windows (a part is shared by the layers of one
    structure, which may band their masks differently); an op that fuses attention keeps none."""
    if not part.attention:
        return part
    windows = core_windows(graph, index, frozenset(nodes), regions)
    fused = len(part.attention) - len(windows)  # `attention_facts` lists the fused attention ops first
    attention = part.attention[:fused] + tuple(dataclasses.replace(a, window=w)
                                               for a, w in zip(part.attention[fused:], windows))
    banded = "".join(f"/window {w}" for w in windows if w)  # a banded layer is costed apart from the full ones
    return dataclasses.replace(part, attention=attention, type_id=part.type_id + banded)


def _param_owner(graph: Graph, index: GraphIndex, structure: Structure, decoder: str, last: int) -> dict[str, str]:
    """Parameter -> the part that holds it: its layer, else the head if a node after the layers reads it (a tied
    embedding is streamed by the head), else the embedding or its encoder."""
    out: dict[str, str] = {}
    for blk in structure.blocks:
        for p in blk.params:
            if blk.is_layer and blk.submodel == decoder:
                out[p] = blk.name
            elif blk.submodel != decoder:
                out[p] = blk.submodel
            else:
                out[p] = "head" if any(j > last for j in _users(index, p)) else "embedding"
    return out


def _users(index: GraphIndex, param: str) -> list[int]:
    """Nodes that read a parameter directly or through its views (a transposed copy, a gathered expert)."""
    todo, out, seen = [param], [], {param}
    while todo:
        t = todo.pop()
        for j in index.consumers.get(t, ()):
            out.append(j)
            for o in index.outputs_of(j):
                if o in index.weight_of and o not in seen:
                    seen.add(o)
                    todo.append(o)
    return out


def _part(graph: Graph, index: GraphIndex, work, acts: np.ndarray, name: str, kind: PartKind, type_id: str,
          node_list: list[int], owner: dict[str, str], tokens: int, batch: int, regions, free) -> Part:
    nodes = frozenset(node_list)
    per = float(batch) if kind == "encoder" else float(tokens)
    cores = find_cores(graph, index, nodes, regions)
    core_nodes = frozenset(i for c in cores for i in c.nodes)
    moe = moe_facts(graph, index, nodes) if kind == "layer" else None
    expert_nodes = moe.expert_nodes if moe else frozenset()
    weight_nodes = [i for i in nodes if is_weight_matmul(graph, index, i)]
    dense_flops = sum(graph.nodes[i].flops for i in weight_nodes if i not in expert_nodes)
    if kind == "encoder":  # an encoder runs whole, once per sample: its attention is part of its work
        dense_flops += sum(graph.nodes[i].flops for i in core_nodes)
    makes_weight = {i for i in nodes if graph.nodes[i].outputs and all(
        index.is_weight(o) for o in graph.nodes[i].outputs if o)}
    vector = [i for i in nodes if not work.matrix[i] and i not in makes_weight
              and graph.nodes[i].op_type not in DATA_MOVEMENT and (kind == "encoder" or i not in core_nodes)]
    vector_bytes = float(sum(acts[i] for i in vector))
    biggest = max((sum(graph.tensors[o].nbytes for o in graph.nodes[i].outputs if o in graph.tensors)
                   for i in nodes if i not in core_nodes and i not in makes_weight and i not in free), default=0.0)
    params = {p for p, o in owner.items() if o == name}
    expert_params = (moe.params & params) if moe else frozenset()
    gathered = _gathered_only(graph, index, params)
    dense = sum(graph.tensors[p].numel for p in params - expert_params)
    streamed = dense - sum(graph.tensors[p].numel for p in gathered - expert_params)
    experts = None
    if moe:
        experts = Experts(experts=moe.experts, top_k=moe.top_k,
                          params_per_expert=sum(graph.tensors[p].numel for p in expert_params) / moe.experts,
                          flops_per_pair=sum(graph.nodes[i].flops for i in expert_nodes) / (tokens * moe.top_k))
    attention: tuple[AttentionFacts, ...] = ()
    syncs = 0
    if kind == "layer":
        stream_in = _stream_input(graph, index, name, nodes)
        stream = forward_closure(graph, index, stream_in, nodes)
        attention = tuple(attention_facts(graph, index, cores, nodes, stream, tokens, batch))
        syncs = _residual_joins(graph, index, stream_in, nodes)
    return Part(name=name, kind=kind, type_id=type_id, dense_params=float(dense), streamed_params=float(streamed),
                flops_per_token=dense_flops / per, vector_bytes_per_token=vector_bytes / per,
                act_bytes_per_token=biggest / per, attention=attention, experts=experts, syncs=syncs)


def _gathered_only(graph: Graph, index: GraphIndex, params: set[str]) -> set[str]:
    """Parameters read only by a Gather of token ids (embedding tables): a step reads a few rows, not all."""
    out = set()
    for p in params:
        users = index.consumers.get(p, ())
        if users and all(graph.nodes[j].op_type == "Gather" and graph.nodes[j].inputs[0] == p
                         and not index.is_weight(graph.nodes[j].inputs[1]) for j in users):
            out.add(p)
    return out


def _stream_input(graph: Graph, index: GraphIndex, name: str, nodes: frozenset[int]) -> str:
    """The residual stream entering a layer: the outside activation shaped like the tensor the layer hands on."""
    outside = []
    for i in sorted(nodes):
        for x in graph.nodes[i].inputs:
            if x and x in graph.tensors and not index.is_weight(x) and x not in index.constants:
                j = index.producer.get(x)
                if j is None or j not in nodes:
                    outside.append(x)
    handed = [o for i in sorted(nodes) for o in graph.nodes[i].outputs
              if o and any(j not in nodes for j in index.consumers.get(o, ()))]
    shapes = {graph.tensors[o].shape for o in handed if o in graph.tensors}
    same = [x for x in dict.fromkeys(outside) if graph.tensors[x].shape in shapes]
    pool = same or list(dict.fromkeys(outside))
    if not pool:
        raise InvalidModel(f"layer {name} reads no activation from outside itself, so its input cannot be found; "
                           "export the model with its layers connected through the residual stream")
    # a mask built in the first layer and handed on is shaped like what it reads too: the stream is floating
    # point and [batch, seq, hidden] (or flatter), where a mask is boolean or [batch, 1, seq, seq]
    return max(pool, key=lambda x: (graph.tensors[x].dtype in FLOAT_DTYPES, len(graph.tensors[x].shape or ()) <= 3,
                                    graph.tensors[x].numel, x))


def _tokens(graph: Graph, hidden_name: str) -> int:
    t = graph.tensors[hidden_name]
    return max(1, t.numel // max(1, (t.shape or (1,))[-1]))


def _residual_joins(graph: Graph, index: GraphIndex, stream_in: str, nodes: frozenset[int]) -> int:
    """Adds along the residual stream: each joins a sub-layer's output, a tensor-parallel all-reduce point
    (Shoeybi et al. 2019, Megatron-LM section 3: two all-reduces per layer in the forward pass)."""
    shape = graph.tensors[stream_in].shape
    cur, joins = stream_in, 0
    for _ in range(16):
        nxt = [j for j in index.consumers.get(cur, ()) if j in nodes and graph.nodes[j].op_type == "Add"
               and graph.nodes[j].outputs and graph.tensors[graph.nodes[j].outputs[0]].shape == shape]
        if not nxt:
            break
        cur = graph.nodes[min(nxt)].outputs[0]
        joins += 1
    return max(joins, 1)


__all__ = ["Experts", "Part", "Profile", "serving_profile"]
