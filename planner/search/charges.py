"""What each tensor-axis collective of an assignment costs, pass by pass, and how much of it a GEMM hides.

One edge's collectives (or one read-by-many tensor's) become charges, one per
(collective, pass): a forward move runs in the forward pass and again in the
backward pass for every recomputed forward; a gradient move runs in backward;
an input its reader keeps for the weight gradient, all-gathered from sequence
shards, is gathered again in backward (Korthikanti 2022, section 4.2.2).

With tensor-parallel overlap (`IntraOpProblem.overlap` > 0: Transformer
Engine's userbuffers, torch's AsyncTP), an all-gather or reduce-scatter hides
behind the GEMM it feeds or follows, up to `overlap` times that GEMM's time in
the same pass and up to the stack's `overlap_share` of itself (a decomposed
GEMM and collective leave part of the transfer exposed): for an edge the
larger of its two ends' GEMMs; for a tensor read by several ops the sum of its
readers' GEMMs, each taken at its least (split) time whatever the readers
choose, which keeps the program's relaxation tight (HiGHS ran past 10 s on
Llama-3-70B with the window a sum over the readers' one-hots) and only
undercounts a reader left whole. The layout program minimises what the
charges leave exposed and the estimate reports the same charges, so the
program's objective is the time the estimate prints.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from planner.search.intra_op import IntraOpProblem, demand_cost, edge_cost, group_demands

HIDEABLE = frozenset({"all_gather", "reduce_scatter"})
#: What the program charges a second of collective a GEMM hides: hidden traffic still occupies the compute window
#: other overlaps share (ZeRO-3's gathers, offload: `planner.costing.step_time`), so among layouts that leave the
#: same time exposed the one that moves less wins, whichever solver or formulation finds it. Small enough that
#: no exposed time the program weighs changes.
HIDDEN_CHARGE = 1e-4


@dataclass(frozen=True, slots=True)
class Charge:
    """Seconds of one collective kind in one pass, and how much of them a GEMM window hides."""

    coll: str  # all_gather, reduce_scatter, all_reduce, all_to_all or impossible
    backward: bool
    sec: float
    hidden: float


def gemm_s(problem: IntraOpProblem, v: int, s: int, backward: bool) -> float:
    """One instance's GEMM seconds of var v under strategy s (0 for a var that is not an unfused contraction)."""
    if not problem.gemm:
        return 0.0
    return float(problem.gemm[v][1 if backward else 0][s])


def hidden_s(problem: IntraOpProblem, coll: str, sec: float, window: float) -> float:
    """What a GEMM window of `window` seconds hides of `sec` seconds of a collective: at most the stack's share of
    the collective, and at most the overlap efficiency's share of the window."""
    if problem.overlap <= 0 or coll not in HIDEABLE or window <= 0:
        return 0.0
    return min(problem.overlap_share * sec, problem.overlap * window)


def _split_passes(problem: IntraOpProblem, kind: str, sec: float, fwd_share: float, regather: bool,
                  into: dict[tuple[str, bool], float]) -> None:
    """Seconds of one move by (collective, pass): `fwd_share` of a forward move runs in the forward pass."""
    direction, coll = kind.split(":")
    if direction == "bwd":
        into[(coll, True)] += sec
        return
    first = sec * fwd_share
    into[(coll, False)] += first
    into[(coll, True)] += sec - first
    if coll == "all_gather" and problem.training and regather:
        into[(coll, True)] += first * (2 - 1 / fwd_share)  # gathered again in backward (module docstring)


def edge_charges(problem: IntraOpProblem, k: int, i: int, j: int) -> list[Charge]:
    """The charges of edge k when its source takes strategy i and its reader strategy j."""
    e = problem.edges[k]
    sa, sb = problem.vars[e.src].strategies[i], problem.vars[e.dst].strategies[j]
    by: dict[tuple[str, bool], float] = defaultdict(float)
    for kind, sec in edge_cost(problem, e, sa, sb).items():
        _split_passes(problem, kind, sec, e.times / e.fwd_times, e.regather, by)
    out = []
    for (coll, backward), sec in sorted(by.items()):
        window = max(gemm_s(problem, e.dst, j, backward), gemm_s(problem, e.src, i, backward)) * e.times
        out.append(Charge(coll, backward, sec, hidden_s(problem, coll, sec, window)))
    return out


@dataclass(frozen=True, slots=True)
class GroupProgram:
    """A read-by-many tensor as the layout program sees it.

    Each demand (a layout its readers may ask, served once if any reader asks
    it) has the (var, strategy) choices that ask it and, per producer strategy,
    its seconds by (collective, pass). `windows`: the GEMM seconds of each pass
    (backward: True) that can hide its collectives.
    """

    demands: tuple[tuple[tuple[tuple[int, int], ...], dict[int, dict[tuple[str, bool], float]]], ...]
    windows: dict[bool, float]


def group_program(problem: IntraOpProblem, src: int, out: int, idx: Sequence[int],
                  producer: int | None = None) -> GroupProgram:
    """The demands and windows of the tensor that output `out` of var `src` hands to the edges `idx` (with
    `producer`, the seconds of that producer strategy only)."""
    readers = [problem.edges[k] for k in idx]
    nbytes = readers[0].nbytes
    fwd_share = 1 / max(1, max(e.fwd_times / e.times for e in readers))
    regather = any(e.regather for e in readers)
    demands = []
    for (direction, layout), options in sorted(group_demands(problem, idx).items()):
        passes = max(p for _, _, p in options)
        per_producer = {}
        for su_i, su in enumerate(problem.vars[src].strategies):
            if producer is not None and su_i != producer:
                continue
            by: dict[tuple[str, bool], float] = defaultdict(float)
            for kind, sec in demand_cost(problem, src, direction, layout, su.outputs[out], nbytes, passes).items():
                _split_passes(problem, kind, sec, fwd_share, regather, by)
            if any(by.values()):
                per_producer[su_i] = dict(by)
        demands.append((tuple((v, s_i) for v, s_i, _ in options), per_producer))
    def least(v: int, backward: bool) -> float:
        return min(gemm_s(problem, v, s, backward) for s in range(len(problem.vars[v].strategies)))
    windows = {}
    for backward in (False, True):
        w = sum(least(e.dst, backward) * e.times for e in readers)
        windows[backward] = w or least(src, backward) * readers[0].times  # no reader is a GEMM: the producer's
    return GroupProgram(tuple(demands), windows)


def hide_caps(problem: IntraOpProblem, prog: GroupProgram) -> dict[tuple[str, bool], float]:
    """Per (collective, pass) a read-by-many tensor's GEMM windows can hide, the most they hide (overlap x the
    window): under an assignment its hidden seconds are min(overlap_share x its seconds, this), `hidden_s`."""
    if problem.overlap <= 0:
        return {}
    return {(coll, backward): problem.overlap * prog.windows[backward]
            for coll in sorted(HIDEABLE) for backward in (False, True) if prog.windows[backward] > 0}


def group_charges(problem: IntraOpProblem, src: int, out: int, idx: Sequence[int],
                  choice: Sequence[int]) -> list[Charge]:
    """The charges of a read-by-many tensor under an assignment."""
    prog = group_program(problem, src, out, idx, choice[src])
    by: dict[tuple[str, bool], float] = defaultdict(float)
    for askers, per_producer in prog.demands:
        if any(choice[v] == s for v, s in askers):
            for key, sec in per_producer.get(choice[src], {}).items():
                by[key] += sec
    return [Charge(coll, backward, sec, hidden_s(problem, coll, sec, prog.windows[backward]))
            for (coll, backward), sec in sorted(by.items())]


def edge_matrix(problem: IntraOpProblem, k: int) -> np.ndarray:
    """Exposed seconds of edge k per (source strategy, reader strategy), and `HIDDEN_CHARGE` of the hidden ones."""
    e = problem.edges[k]
    m = np.zeros((len(problem.vars[e.src].strategies), len(problem.vars[e.dst].strategies)))
    for i in range(m.shape[0]):
        for j in range(m.shape[1]):
            m[i, j] = sum(c.sec - c.hidden * (1.0 - HIDDEN_CHARGE) for c in edge_charges(problem, k, i, j))
    return m


def pair_costs(problem: IntraOpProblem) -> dict[tuple[int, int], np.ndarray]:
    """Edge costs gathered per pair of distinct vars (rows: first var's strategies)."""
    pairs: dict[tuple[int, int], np.ndarray] = {}
    for k, e in enumerate(problem.edges):
        if e.src == e.dst:
            continue  # handled in `self_costs`
        m = edge_matrix(problem, k)
        a, b = (e.src, e.dst) if e.src < e.dst else (e.dst, e.src)
        mm = m if e.src < e.dst else m.T
        pairs[(a, b)] = pairs[(a, b)] + mm if (a, b) in pairs else mm
    return pairs


def self_costs(problem: IntraOpProblem) -> dict[int, np.ndarray]:
    """Edges from an op position to the same position of the next instance: a cost on the diagonal."""
    out: dict[int, np.ndarray] = {}
    for k, e in enumerate(problem.edges):
        if e.src == e.dst:
            out[e.src] = out.get(e.src, 0) + np.diag(edge_matrix(problem, k)).copy()
    return out


def breakdown(problem: IntraOpProblem, choice: Sequence[int], memo: dict | None = None) -> dict[str, float]:
    """Compute and communication by pass and kind ('fwd:all_reduce', ...) of an assignment, 'hidden' (negative)
    what GEMMs hide of them; 'total', what is left exposed and `HIDDEN_CHARGE` of the hidden, is the objective the
    solvers minimise. `memo`, a dict the caller keeps for one problem, holds each edge's and group's charges by
    the strategies they depend on (and the sinks' costs), for callers that cost many assignments of it."""
    memo = {} if memo is None else memo

    def kept(key, charges_of):
        if key not in memo:
            memo[key] = charges_of()
        return memo[key]

    out: dict[str, float] = defaultdict(float)
    for v_i, u in enumerate(problem.unary):
        out["compute"] += float(u[choice[v_i]])
    for v_i, c in kept("sinks", problem.sink_costs).items():
        if c[choice[v_i]]:
            out["fwd:all_reduce"] += float(c[choice[v_i]])
    charges = []
    for g_i, (src, o, idx) in enumerate(problem.groups):
        deps = (choice[src],) + tuple(choice[problem.edges[k].dst] for k in idx)
        charges += kept(("group", g_i, deps), lambda: group_charges(problem, src, o, idx, choice))
    for k, e in enumerate(problem.edges):
        i, j = choice[e.src], choice[e.dst]
        charges += kept(("edge", k, i, j), lambda: edge_charges(problem, k, i, j))
    for c in charges:
        out[f"{'bwd' if c.backward else 'fwd'}:{c.coll}"] += c.sec
        if c.hidden:
            out["hidden"] -= c.hidden
    out["total"] = sum(v for k, v in out.items() if k != "total") - HIDDEN_CHARGE * out["hidden"]
    return dict(sorted(out.items()))


@dataclass(frozen=True, slots=True)
class EdgeCosts:
    """What a program's edges, graph outputs and read-by-many tensors cost, gathered for its solvers: the pairs of
    vars (`pair_costs`), each var's own diagonal and outputs' all-reduces, and each group's program, in the order
    of `IntraOpProblem.groups`. None of it reads `unary` or `memory`."""

    pairs: dict[tuple[int, int], np.ndarray]
    selfs: dict[int, np.ndarray]  # same-position edges (`self_costs`)
    sinks: dict[int, np.ndarray]  # pending sums on graph outputs (`IntraOpProblem.sink_costs`)
    groups: tuple[GroupProgram, ...]


def edge_costs(problem: IntraOpProblem) -> EdgeCosts:
    """The program's `EdgeCosts`: as priced with it (`IntraOpProblem.edge_costs`, set by the owner of a program
    solved many times over with other unary costs or memory rows), else computed now."""
    if problem.edge_costs is not None:
        return problem.edge_costs
    return EdgeCosts(pair_costs(problem), self_costs(problem), problem.sink_costs(),
                     tuple(group_program(problem, src, out, idx) for src, out, idx in problem.groups))


def total_cost(problem: IntraOpProblem, choice: Sequence[int], memo: dict | None = None) -> float:
    """Seconds of an assignment (strategy index per var): the objective the solvers minimise (`memo`: `breakdown`)."""
    return breakdown(problem, choice, memo)["total"]


__all__ = ["Charge", "EdgeCosts", "GroupProgram", "HIDDEN_CHARGE", "HIDEABLE", "breakdown", "edge_charges",
           "edge_costs", "edge_matrix", "gemm_s", "group_charges", "group_program", "hidden_s", "hide_caps",
           "pair_costs", "self_costs", "total_cost"]
