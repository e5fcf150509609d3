"""The intra-op problem: one strategy per op so that compute plus resharding is least.

This is Alpa's intra-operator ILP (one-hot strategy per op, a cost on every
edge between two layouts), with one change that keeps it small at 400B
scale: ops of repeated blocks are *tied*. Every instance of a block type
shares one variable per op position, and costs are multiplied by the number
of instances, so an 80-layer model costs as much to solve as one layer plus
the embedding and the head. Parameters are variables too (their layout is
their storage), so tied embeddings and weight-gradient resharding fall out.

This module holds the problem and what each move costs; what an assignment costs pass by pass (the
objective, with what tensor-parallel overlap hides) is `charges.py`; building it
from a graph is `skeleton.py`, which takes the costs as callbacks (`node_time`, `comm_time`), so neither
knows anything of hardware; solving it is `solve.py`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Hashable, Literal, Sequence

import numpy as np

from planner.search.reshard import IMPOSSIBLE, conjugate, grad_layout, transition
from planner.search.space import ANY, PARTIAL, OpStrategy

if TYPE_CHECKING:  # charges reads this module's problem
    from planner.search.charges import EdgeCosts

#: Seconds charged for a transition no collective can make; large enough never to be chosen.
IMPOSSIBLE_S = 1.0e3

Style = Literal["free", "megatron", "megatron_sp"]
"""'free': every layout the space holds. 'megatron': what Megatron-LM does with a tensor axis —
weights stay in the shard they are stored in (never gathered), matrix ops split only along a weight
dim, and activations move only by all-reduce (Shoeybi 2019). 'megatron_sp': the same with sequence
parallelism (Korthikanti 2022), whose activations also move by all-gather and reduce-scatter."""

#: Collectives each style lets activations use.
_STYLE_MOVES = {
    "free": frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}),
    "megatron": frozenset({"all_reduce"}),
    "megatron_sp": frozenset({"all_reduce", "all_gather", "reduce_scatter"}),
}

NodeTime = Callable[[int, OpStrategy], float]
"""Seconds for node i under a strategy, for one pass (forward, or forward+backward in training)."""
CommTime = Callable[[str, float], float]
"""Seconds for a collective kind over the tensor axis moving a tensor of the given full size in bytes."""


@dataclass(frozen=True, slots=True)
class Var:
    """One decision: the strategy of an op position (or a parameter's layout), shared by `count` instances."""

    key: Hashable
    strategies: tuple[OpStrategy, ...]
    node: int | None  # representative node index; None for a parameter
    param: str | None
    count: int


@dataclass(frozen=True, slots=True)
class Edge:
    """A tensor moving from output `out` of var `src` to input `inp` of var `dst`, `times` times per pass."""

    src: int
    out: int
    dst: int
    inp: int
    nbytes: float
    grad: bool
    times: int
    fwd_times: int  # forward passes over it: times, plus one per instance whose forward is recomputed
    shared: bool = False  # one of several readers of a tensor: costed with them (see `groups`)
    regather: bool = False  # the reader keeps this input for its backward: gathered again there (`charges`)


@dataclass(slots=True)
class IntraOpProblem:
    vars: list[Var]
    edges: list[Edge]
    unary: list[np.ndarray]  # seconds per strategy, already multiplied by the var's count
    training: bool
    comm_time: CommTime
    index: dict[Hashable, int] = field(default_factory=dict)
    style: Style = "free"
    sinks: list[tuple[int, int, float]] = field(default_factory=list)  # (var, output, bytes) of graph outputs
    groups: list[tuple[int, int, tuple[int, ...]]] = field(default_factory=list)
    """(var, output, edge indices) of tensors read by several ops. Forward, the tensor is moved once
    per distinct layout its readers need; backward, their gradients are summed where they meet, so
    one collective per distinct gradient layout serves them all (Megatron's single "f" all-reduce
    for the input of q, k and v), not one per reader."""
    members: list[np.ndarray] = field(default_factory=list)  # node indices each var stands for
    #: Per pipeline stage, the bytes per device each var's strategies put in HBM (its parameters' states, the
    #: activations its ops keep), and the budget each stage must fit in: the integer program's memory
    #: constraints, one per stage. Empty: unconstrained.
    memory: list[list[np.ndarray]] = field(default_factory=list)
    memory_budget: float | None = None
    #: Tensor-parallel overlap (`charges`): the fraction of a GEMM's time that can hide an all-gather or
    #: reduce-scatter, and per var one instance's (forward, backward) GEMM seconds per strategy. Empty: none.
    overlap: float = 0.0
    overlap_share: float = 1.0  # at most this share of each collective hides (the stack's tp_overlap_share)
    gemm: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    #: The edges' costs (`charges.EdgeCosts`) as priced once by the owner of a program it solves many times over
    #: with other unary costs or memory rows, after its last change to anything else; None: each solve prices them.
    edge_costs: EdgeCosts | None = None

    def sink_costs(self) -> dict[int, np.ndarray]:
        """Per var, the all-reduce a graph output left as a pending sum still needs, per strategy."""
        out: dict[int, np.ndarray] = {}
        for v, j, nbytes in self.sinks:
            ar = self.comm_time("all_reduce", nbytes)
            c = np.array([ar if s.outputs[j] == PARTIAL else 0.0 for s in self.vars[v].strategies])
            out[v] = out.get(v, 0) + c
        return out


def _move_cost(problem: IntraOpProblem, src: int, dst: int, nbytes: float) -> float:
    kind = transition(src, dst)
    if kind is None:
        return 0.0
    if kind == IMPOSSIBLE:
        return IMPOSSIBLE_S
    return problem.comm_time(kind, nbytes)


def edge_cost(problem: IntraOpProblem, e: Edge, s_src: OpStrategy, s_dst: OpStrategy) -> dict[str, float]:
    """Seconds by collective kind ('fwd:all_reduce', 'bwd:all_gather', ...) of one edge under two strategies."""
    out_l = s_src.outputs[e.out]
    in_l = s_dst.inputs[e.inp]
    res: dict[str, float] = {}
    kind = transition(out_l, in_l)
    if problem.style != "free" and kind is not None and (
        kind not in _STYLE_MOVES[problem.style] or (problem.vars[e.src].param is not None and in_l != out_l)
    ):
        kind = IMPOSSIBLE
    if kind == IMPOSSIBLE:
        return {"fwd:impossible": IMPOSSIBLE_S * e.times}
    if kind is not None:
        res[f"fwd:{kind}"] = _move_cost(problem, out_l, in_l, e.nbytes) * e.fwd_times
    if e.shared:
        return {}  # costed once for all readers: `group_demands`
    if problem.training and e.grad:
        g = grad_layout(in_l, s_dst.split)
        if g is not None:
            need = conjugate(out_l)
            bk = transition(g, need)
            if bk is not None:
                res[f"bwd:{bk}"] = _move_cost(problem, g, need, e.nbytes) * e.times
    return res


def group_demands(problem: IntraOpProblem, edge_idxs: Sequence[int]) -> dict[tuple[str, int], list[tuple[int, int, int]]]:
    """What the readers of one tensor may ask of its producer: ('fwd', layout needed) or ('bwd', gradient
    layout handed back), each with the (var, strategy, passes) choices that ask it."""
    out: dict[tuple[str, int], list[tuple[int, int, int]]] = defaultdict(list)
    for k in edge_idxs:
        e = problem.edges[k]
        for s_i, s in enumerate(problem.vars[e.dst].strategies):
            need = s.inputs[e.inp]
            if need != ANY:
                out[("fwd", need)].append((e.dst, s_i, e.fwd_times))
            if problem.training and e.grad:
                g = grad_layout(need, s.split)
                if g is not None:
                    out[("bwd", g)].append((e.dst, s_i, e.times))
    return out


def demand_cost(problem: IntraOpProblem, src: int, direction: str, layout: int, produced: int, nbytes: float,
                passes: int) -> dict[str, float]:
    """Seconds of serving one demand of a tensor's readers when its producer leaves it in `produced`."""
    if direction == "fwd":
        kind = transition(produced, layout)
        if problem.style != "free" and kind is not None and (
            kind not in _STYLE_MOVES[problem.style] or problem.vars[src].param is not None
        ):
            kind = IMPOSSIBLE
        if kind is None:
            return {}
        if kind == IMPOSSIBLE:
            return {"fwd:impossible": IMPOSSIBLE_S * passes}
        return {f"fwd:{kind}": _move_cost(problem, produced, layout, nbytes) * passes}
    need = conjugate(produced)
    kind = transition(layout, need)
    if kind is None:
        return {}
    return {f"bwd:{kind}": _move_cost(problem, layout, need, nbytes) * passes}


def detach(problem: IntraOpProblem, detached: set[int]) -> None:
    """Take vars out of the program: no cost of their own and no edge to or from them (in place).

    For ops another model costs (the routed experts of a MoE layer, whose tokens the expert-parallel
    dispatcher moves instead of tensor-axis collectives): their layouts are then arbitrary.
    """
    if not detached:
        return
    for v in detached:
        problem.unary[v] = np.zeros_like(problem.unary[v])
    keep = [k for k, e in enumerate(problem.edges) if e.src not in detached and e.dst not in detached]
    new_index = {old: new for new, old in enumerate(keep)}
    groups = []
    for src, out, idx in problem.groups:
        if src in detached:
            continue
        idx = tuple(new_index[k] for k in idx if k in new_index)
        groups.append((src, out, idx))
    edges = [problem.edges[k] for k in keep]
    for src, out, idx in groups:  # a group left with one reader is an ordinary edge again
        if len(idx) == 1:
            e = edges[idx[0]]
            edges[idx[0]] = replace(e, shared=False)
    problem.edges = edges
    problem.groups = [g for g in groups if len(g[2]) > 1]
    problem.sinks = [x for x in problem.sinks if x[0] not in detached]
