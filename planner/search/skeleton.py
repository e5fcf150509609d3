"""Building the tied intra-op problem from a graph: its skeleton once per tensor-axis size, then its prices.

The skeleton is what does not depend on costs: one variable per op position of a block type (tied
instances share it) or per parameter, each with the strategies the space (`space.py`) allows, and the
edges between them aggregated over instances. `price` puts seconds on it through callbacks, so it can be
priced again at another micro-batch or recompute policy without walking the graph; the problem it
returns, and its objective, are `intra_op.py`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Hashable, Mapping, Sequence

import numpy as np

from planner.costing.activations import requires_grad
from planner.graph.ir import Graph
from planner.search.intra_op import CommTime, Edge, IntraOpProblem, NodeTime, Style, Var
from planner.search.space import REPLICATED, OpStrategy, candidate_strategies


def _param_strategies(shape: tuple[int, ...] | None, t: int) -> tuple[OpStrategy, ...]:
    out = [OpStrategy("R", (), (REPLICATED,), False)]
    if shape is not None and t > 1:
        for d, n in enumerate(shape):
            if n >= t and n % t == 0:
                out.append(OpStrategy(f"S{d}", (), (d,), False))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Skeleton:
    """The shape of the intra-op problem, independent of costs: built once per tensor-axis size.

    Pricing it (`price`) at another micro-batch or recompute policy is cheap:
    only the representative of each var and each aggregated edge is costed.
    """

    vars: list[Var]
    members: list[np.ndarray]  # node indices each var stands for (empty for parameters)
    edges: list[tuple[int, int, int, int, str, bool, np.ndarray]]  # src, out, dst, inp, tensor, grad, dst nodes
    groups: list[tuple[int, int, tuple[int, ...]]]
    sinks: list[tuple[int, int, str]]
    index: dict[Hashable, int]
    style: Style
    training: bool
    regather: tuple[bool, ...] = ()  # per edge: its reader keeps the input for backward (set by the costing)


def build_skeleton(
    graph: Graph,
    node_keys: Sequence[Hashable],
    param_keys: Mapping[str, Hashable],
    t: int,
    training: bool = True,
    style: Style = "free",
    grad: set[str] | None = None,
) -> Skeleton:
    """Vars (one per op position or parameter; equal keys are tied instances), their strategies, and edges."""
    shapes = {name: tt.shape for name, tt in graph.tensors.items()}
    param_names = set(graph.params)
    index: dict[Hashable, int] = {}
    vars_: list[Var] = []
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, k in enumerate(node_keys):
        members[k].append(i)
    pcounts: dict[Hashable, int] = defaultdict(int)
    for k in param_keys.values():
        pcounts[k] += 1
    producer: dict[str, tuple[int, int]] = {}
    for i, n in enumerate(graph.nodes):
        k = node_keys[i]
        if k not in index:
            index[k] = len(vars_)
            cands = candidate_strategies(n, shapes, t)
            if style != "free":
                cands = _megatron_filter(n, cands, param_names)
            vars_.append(Var(k, cands, i, None, len(members[k])))
        for j, o in enumerate(n.outputs):
            if o:
                producer[o] = (index[k], j)
    for p in graph.params:
        k = param_keys[p]
        if k not in index:
            index[k] = len(vars_)
            vars_.append(Var(k, _param_strategies(shapes.get(p), t), None, p, pcounts[k]))
        producer[p] = (index[k], 0)
    mem = [np.array(members[v.key] if v.node is not None else [], dtype=np.int64) for v in vars_]

    grads = (requires_grad(graph) if grad is None else grad) if training else set()
    agg: dict[tuple[int, int, int, int], list] = {}
    for i, n in enumerate(graph.nodes):
        dst = index[node_keys[i]]
        for inp, name in enumerate(n.inputs):
            if not name or name not in producer:
                continue  # graph inputs and constants arrive replicated: slicing them is free
            src, out = producer[name]
            key = (src, out, dst, inp)
            if key in agg:
                agg[key][2].append(i)
            else:
                agg[key] = [name, name in grads, [i]]
    edges = [(s_, o, d, i, name, g, np.array(nodes, dtype=np.int64))
             for (s_, o, d, i), (name, g, nodes) in agg.items()]
    by_tensor: dict[tuple[int, int], list[int]] = defaultdict(list)
    for k, e in enumerate(edges):
        if e[0] != e[2]:
            by_tensor[(e[0], e[1])].append(k)
    groups = [(src, out, tuple(idx)) for (src, out), idx in by_tensor.items() if len(idx) > 1]
    sinks = [(producer[name][0], producer[name][1], name) for name in graph.outputs if name in producer]
    return Skeleton(vars_, mem, edges, groups, sinks, index, style, training)


def price(
    skel: Skeleton,
    var_time: Callable[[int, OpStrategy], float],
    passes: np.ndarray,
    comm_time: CommTime,
    tensor_bytes: Callable[[str], float],
    fwd_repeat: np.ndarray | None = None,
) -> IntraOpProblem:
    """Costs on a skeleton: `var_time(rep_node, strategy)` is one forward pass of one instance; `passes[i]`
    how many forward-equivalents node i runs per step (3 in training: forward and a backward twice as
    long, 4 when recomputed); `fwd_repeat[i]` is 2 where node i's forward runs again."""
    unary = []
    for v_i, v in enumerate(skel.vars):
        if v.node is None:
            unary.append(np.zeros(len(v.strategies)))
            continue
        mult = float(passes[skel.members[v_i]].sum())
        unary.append(np.array([var_time(v.node, s) for s in v.strategies]) * mult)
    shared = {k for _, _, idx in skel.groups for k in idx}
    edges = []
    for k, (src, out, dst, inp, name, g, nodes) in enumerate(skel.edges):
        times = len(nodes)
        fwd_times = int(fwd_repeat[nodes].sum()) if fwd_repeat is not None else times
        edges.append(Edge(src, out, dst, inp, tensor_bytes(name), g, times, fwd_times, k in shared,
                          bool(skel.regather) and skel.regather[k]))
    sinks = [(v, j, tensor_bytes(name)) for v, j, name in skel.sinks]
    return IntraOpProblem(skel.vars, edges, unary, skel.training, comm_time, skel.index, skel.style, sinks,
                          skel.groups, skel.members)


def build_problem(
    graph: Graph,
    node_keys: Sequence[Hashable],
    param_keys: Mapping[str, Hashable],
    t: int,
    node_time: NodeTime,
    comm_time: CommTime,
    tensor_bytes: Callable[[str], float],
    training: bool = True,
    fwd_repeat: Sequence[int] | None = None,
    style: Style = "free",
    grad: set[str] | None = None,
) -> IntraOpProblem:
    """The tied intra-op problem of `graph` on a tensor axis of size t, built and priced in one go.

    `node_time(i, s)` is the time of node i under strategy s for the whole
    step (tied instances are charged like their representative).
    """
    skel = build_skeleton(graph, node_keys, param_keys, t, training, style, grad)
    rep = np.asarray(fwd_repeat, dtype=np.int64) if fwd_repeat is not None else None
    return price(skel, node_time, np.ones(len(graph.nodes)), comm_time, tensor_bytes, rep)


_WEIGHT_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "Gather", "FusedMatMul"})


def _megatron_filter(node, cands: tuple[OpStrategy, ...], params: set[str]) -> tuple[OpStrategy, ...]:
    """Drop the splits of a weight op that leave its weight whole (Megatron never splits work that way)."""
    if node.op_type not in _WEIGHT_OPS:
        return cands
    pk = [k for k, x in enumerate(node.inputs) if x in params]
    if not pk:
        return cands
    return tuple(s for s in cands if not s.split or all(s.inputs[k] >= 0 for k in pk))
