"""Parameter layouts of a serving phase: Megatron's tensor parallelism read from the graph, experts over ep.

The serving cost model (`planner.inference.phase_cost`) splits every dense
weight `tp` ways and spreads a stage's routed experts over its tp x dp
devices. A backend needs to know *which* dim each weight splits on, which
the graph tells (Shoeybi et al. 2019, Megatron-LM section 3):

- a projection reading the residual stream (after a norm) whose output
  goes on to another contraction is column-parallel: split on its output
  features; its bias likewise;
- a projection not reading the residual stream whose output joins it
  (through an Add, perhaps after a post-norm) is row-parallel: split on
  the features it sums over, leaving a pending sum (`output_partial`);
- a projection reading the residual stream whose output is normalised or
  split along its whole width before the next contraction stays whole:
  MLA's down-projections (q_a_proj, kv_a_proj_with_mqa: a norm over the
  latent, a split off of the rope key) and the MoE router (a top-k over
  the experts), as vLLM and SGLang keep them (ReplicatedLinear);
- the vocabulary projection is column-parallel with its logits gathered;
  the embedding table splits its vocabulary (the masked lookup is summed);
- stacked routed experts split their expert dim over `ep`;
- a vector whose values land on the dim a column-parallel projection's
  output is split on, further on between it and the next projection, splits
  with it: GPT-OSS's attention sinks, one a head, joined to the scores
  (`_per_head_vectors`, the split dim followed through views, transposes
  and the attention's own matmuls); a QK-norm's weight, on the head dim's
  inner extent, stays whole.

A dim that `tp` does not divide stays whole. Norm weights stay whole.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Mapping

from planner.graph.blocks import Structure
from planner.graph.ir import Graph
from planner.hypershard.roles import ParamRole, param_roles, residual_tensors
from planner.graph.walk import GraphIndex, index_graph, is_weight_matmul
from planner.graph.moe import moe_facts
from planner.costing.node_work import MATRIX_OPS
from planner.search.tensor_layout import view_dim_map

#: Ops that normalise over a tensor's last dim: a column shard of it could not run them alone.
_NORMS = frozenset({"ReduceMean", "ReduceSum", "ReduceMax", "LayerNormalization", "RMSNormalization",
                    "SimplifiedLayerNormalization", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization"})
#: Ops that select over it (a router's top-k over the experts): the projection feeding them stays whole.
_SELECTS = frozenset({"Softmax", "LogSoftmax", "TopK", "ArgMax"})
_CUTS = frozenset({"Split", "Slice"})
_DEPTH = 24  # node levels walked forward from a projection (rotary embedding takes about a dozen)


def routed_experts(graph: Graph, structure: Structure, index: GraphIndex) -> dict[str, int]:
    """Routed-expert parameter -> the number of experts of its layer (found from each layer's router)."""
    out: dict[str, int] = {}
    for blk in structure.layers():
        facts = moe_facts(graph, index, frozenset(blk.nodes))
        if facts is not None:
            out.update({p: facts.experts for p in facts.params})
    return out


def _last(graph: Graph, name: str) -> int | None:
    t = graph.tensors.get(name)
    return int(t.shape[-1]) if t is not None and t.shape else None


def _fate(graph: Graph, index: GraphIndex, start: str, residual: set[str]) -> set[str]:
    """What the output `start` of a projection meets going forward (breadth first, up to `_DEPTH` levels):
    'contraction', 'residual' (an Add onto the residual stream), 'whole' (a norm or a split over its whole
    width), 'select' (a softmax or top-k over it)."""
    width = _last(graph, start)
    events: set[str] = set()
    seen = {start}
    frontier = deque([(start, 0)])
    while frontier:
        name, depth = frontier.popleft()
        if depth >= _DEPTH:
            continue
        for j in index.consumers.get(name, ()):
            node = graph.nodes[j]
            if node.op_type in MATRIX_OPS:
                events.add("contraction")
                continue
            if node.op_type == "Add" and any(o in residual for o in node.outputs if o):
                events.add("residual")
                continue
            if width is not None and _last(graph, name) == width:
                if node.op_type in _SELECTS:
                    events.add("select")
                elif node.op_type in _NORMS or (node.op_type in _CUTS and any(
                        _last(graph, o) not in (None, width) for o in node.outputs if o)):
                    events.add("whole")
            for o in node.outputs:
                if o and o not in seen:
                    seen.add(o)
                    frontier.append((o, depth + 1))
    return events


def _linear_dims(shape: tuple[int, ...], role: ParamRole, events: set[str], tp: int) -> tuple[int | None, bool]:
    """(the dim split over tp or None, whether the output is a pending sum) for a 2-d projection weight."""
    if tp == 1 or len(shape) != 2 or role.partial_dim is None or "select" in events:
        return None, False
    summed, out = role.partial_dim, 1 - role.partial_dim
    if role.reads_residual:
        if "whole" in events or ("residual" in events and not role.model_output):
            return None, False
        split = out if ("contraction" in events or role.model_output) else None
        partial = False
    elif "residual" in events:
        split, partial = summed, True
    elif "whole" in events:
        return None, False
    elif "contraction" in events or role.model_output:
        split, partial = out, False
    else:
        return None, False
    if shape[split] < tp or shape[split] % tp:
        return None, False
    return split, partial


def serving_param_layouts(graph: Graph, structure: Structure, tp: int, ep: int) -> dict[str, dict[str, Any]]:
    """Every parameter's entry in graph order: `dims` (per dim an axis or null), `op`, and `output_partial` /
    `model_output` where they apply (what a backend's tensor-parallel styles need)."""
    index = index_graph(graph)
    roles = param_roles(graph, structure)
    residual = residual_tensors(graph, structure)
    experts = routed_experts(graph, structure, index)
    column_nodes: set[int] = set()
    decided: dict[str, tuple[int | None, bool]] = {}
    for i, node in enumerate(graph.nodes):
        if not is_weight_matmul(graph, index, i) or not node.outputs:
            continue
        for p in sorted(index.weight_params(node.inputs)):
            if p in experts or p in decided or roles[p].op != "linear":
                continue
            shape = tuple(graph.tensors[p].shape or ())
            split, partial = _linear_dims(shape, roles[p], _fate(graph, index, node.outputs[0], residual), tp)
            decided[p] = (split, partial)
            if split is not None and not partial:
                column_nodes.add(i)
    column_outputs = {graph.nodes[i].outputs[0] for i in column_nodes}
    per_head = _per_head_vectors(graph, index, column_outputs, residual) if tp > 1 else set()
    out: dict[str, dict[str, Any]] = {}
    for p in graph.params:
        role = roles[p]
        shape = tuple(graph.tensors[p].shape or ())
        dims: list[Any] = [None] * len(shape)
        entry: dict[str, Any] = {"dims": dims, "op": role.op}
        if p in experts:
            if ep > 1 and shape and shape[0] == experts[p]:
                dims[0] = "ep"
        elif p in decided:
            split, partial = decided[p]
            if split is not None:
                dims[split] = "tp"
                if partial:
                    entry["output_partial"] = ["tp"]
        elif role.op == "embedding" and tp > 1 and role.partial_dim is not None:
            d = role.partial_dim
            if shape[d] >= tp and shape[d] % tp == 0:
                dims[d] = "tp"
        elif tp > 1 and len(shape) == 1 and shape[0] % tp == 0 and (
                _is_column_bias(graph, index, p, column_outputs) or p in per_head):
            dims[0] = "tp"
        if role.model_output:
            entry["model_output"] = True
        out[p] = entry
    return out


def _is_column_bias(graph: Graph, index: GraphIndex, p: str, column_outputs: set[str]) -> bool:
    """Whether `p` is added straight onto a column-parallel projection's output (its bias)."""
    for j in index.consumers.get(p, ()):
        node = graph.nodes[j]
        if node.op_type == "Add" and any(x in column_outputs for x in node.inputs if x and x != p):
            return True
    return False


_VIEWS = frozenset({"Reshape", "Unsqueeze", "Squeeze", "Flatten"})
#: Ops after which the split dim cannot be followed (a reduction or selection may run over it)
_OPAQUE = frozenset({"Gather", "GatherND", "GatherElements", "ScatterND", "TopK", "ArgMax", "Shape"})


def _carry(graph: Graph, node, x: str, dim: int, out: str) -> int | None:
    """Where dim `dim` of input `x` of `node` lands in its output `out` (None: nowhere that can be followed)."""
    ti, to = graph.tensors.get(x), graph.tensors.get(out)
    if node.op_type == "SequenceAt" and x == node.inputs[0]:  # a chunk of a split sequence (below)
        return dim
    if node.op_type == "SplitToSequence" and ti is not None and ti.shape:  # chunks along another dim keep it
        return None if node.attrs.get("axis", 0) % len(ti.shape) == dim else dim
    if ti is None or to is None or ti.shape is None or to.shape is None or node.op_type in _OPAQUE \
            or node.op_type.startswith("Reduce"):
        return None
    if node.op_type in _VIEWS:
        return next((j for j, i in sorted(view_dim_map(ti.shape, to.shape).items()) if i == dim), None)
    if node.op_type == "Transpose":
        perm = list(node.attrs.get("perm") or reversed(range(len(ti.shape))))
        return perm.index(dim) if dim in perm else None
    if node.op_type in MATRIX_OPS and dim == len(ti.shape) - (1 if node.inputs.index(x) == 0 else 2):
        return None  # the contracted dim
    if node.op_type == "Split" and (node.attrs.get("axis", 0) % len(ti.shape)) == dim:
        return None
    j = dim + len(to.shape) - len(ti.shape)  # elementwise, broadcast from the right
    return j if 0 <= j < len(to.shape) and to.shape[j] == ti.shape[dim] else None


def _follow(graph: Graph, index: GraphIndex, starts: Mapping[str, int], stop) -> dict[str, int]:
    """Each tensor reached from `starts` (tensor -> dim) with the dim it carries, not past nodes `stop` names."""
    seen = dict(starts)
    frontier = deque(starts.items())
    while frontier:
        name, dim = frontier.popleft()
        for j in index.consumers.get(name, ()):
            if stop(j):
                continue
            for out in graph.nodes[j].outputs:
                carried = _carry(graph, graph.nodes[j], name, dim, out) if out and out not in seen else None
                if carried is not None:
                    seen[out] = carried
                    frontier.append((out, carried))
    return seen


def _per_head_vectors(graph: Graph, index: GraphIndex, column_outputs: set[str], residual: set[str]) -> set[str]:
    """Vector parameters a node joins to a tensor split as a column-parallel output is, on its split dim (counted
    from the right): their values are one a head. The split is followed from each column output (its last dim)
    to the next projection or the residual stream; the vector's dim from the parameter through its views."""
    def stop(j: int) -> bool:
        node = graph.nodes[j]
        return is_weight_matmul(graph, index, j) or (node.op_type == "Add" and any(o in residual for o in node.outputs))

    split = _follow(graph, index, {x: len(graph.tensors[x].shape or (0,)) - 1 for x in column_outputs
                                   if graph.tensors.get(x) is not None and graph.tensors[x].shape}, stop)
    out = set()
    for p in graph.params:
        if len(graph.tensors[p].shape or ()) != 1 or p in index.consumers and any(
                is_weight_matmul(graph, index, j) for j in index.consumers[p]):
            continue
        mine = _follow(graph, index, {p: 0}, lambda j: graph.nodes[j].op_type not in _VIEWS | {"Expand", "Cast"})
        for x, dim in mine.items():
            rank = len(graph.tensors[x].shape or ())
            for j in index.consumers.get(x, ()):
                for y in graph.nodes[j].inputs:
                    if y != x and y in split and len(graph.tensors[y].shape or ()) - split[y] == rank - dim:
                        out.add(p)
    return out


def uses_of(entries: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """How many entries split a dim over each axis: what a file's summary line says."""
    counts: dict[str, int] = {}
    for e in entries.values():
        for spec in e["dims"]:
            for a in ([spec] if isinstance(spec, str) else spec or []):
                counts[a] = counts.get(a, 0) + 1
    return dict(sorted(counts.items()))
