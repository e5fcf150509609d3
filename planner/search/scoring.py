"""Scoring one strategy for the search: the analytic step time, whether it fits, and what it keeps.

A `Scorer` shares the graph analysis and the solved layouts (once per tensor-axis size) between all the
strategies of one search, so a strategy costs one pass over the tied graph.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

from cost_models import Cluster

from planner.costing.estimate import Shortfall, retries_layouts, worst_shortfall
from planner.costing.graph_facts import GraphFacts
from planner.costing.stage_costs import StageCosts, stage_costs
from planner.costing.stage_memory import with_states
from planner.costing.step_time import step_breakdown
from planner.errors import HyperplanError
from planner.graph.blocks import Structure
from planner.graph.ir import Graph
from planner.strategy import Strategy, Workload

Progress = Callable[[str, float], None]
"""Called with a message and the fraction of the search done."""

@dataclass(frozen=True, slots=True)
class Candidate:
    """One scored strategy."""

    strategy: Strategy
    step_s: float
    fits: bool
    peak_bytes: float
    breakdown_s: Mapping[str, float] = field(default_factory=dict)
    note: str = ""
    memory_bytes: Mapping[str, float] = field(default_factory=dict)  # the stage with the highest peak
    shortfall: Shortfall | None = None  # what does not fit, and where (HBM or the offload tier)

    @property
    def mesh(self) -> tuple:
        """(tp, cp, pp, dp, ep, etp), and the stages' widths when they differ."""
        s = self.strategy
        return (s.tp, s.cp, s.pp, s.dp, s.ep, s.expert_tp) + ((s.stage_tp,) if s.stage_tp else ())


@dataclass(frozen=True, slots=True)
class SearchResult:
    best: Candidate | None
    ranked: tuple[Candidate, ...]  # the best candidate of each mesh, best first
    closest: Candidate | None  # when nothing fits: the candidate least over memory
    evaluated: int  # strategies scored
    meshes: int  # meshes in the space
    wall_s: float
    complete: bool  # False when --time-limit (or the work budget) cut the search short
    nodes: int = 0  # work: costings of region representatives and strategies scored
    bound_s: float = 0.0  # no strategy of the space is faster than this (see `bounds`)
    pruned: int = 0  # regions closed by their bound

    @property
    def gap(self) -> float:
        """How far the best plan may be from the best of the space: (step - bound) / step."""
        if self.best is None or not math.isfinite(self.best.step_s) or self.best.step_s <= 0:
            return math.inf
        return max(0.0, (self.best.step_s - self.bound_s) / self.best.step_s)


class Scorer:
    """Scores strategies with shared graph facts; layouts are solved once per tensor-axis size."""

    def __init__(self, graph: Graph, structure: Structure, cluster: Cluster, workload: Workload,
                 time_limit_s: float, facts: GraphFacts | None = None, solver: str = "highs") -> None:
        self.graph, self.structure, self.cluster, self.workload = graph, structure, cluster, workload
        self.facts = facts or GraphFacts(graph, structure)
        self.facts.reuse_layouts = True
        self.count = 0
        self.time_limit_s = time_limit_s
        self.solver = solver
        self.worth: Callable[[float], bool] = lambda step_s: True  # could a plan this fast (or slower) still win?
        self.memo: dict[Strategy, Candidate] = {}
        # the last costing and the strategy it was made for, less its ZeRO level and offload (`with_states`)
        self._last: tuple[Strategy, StageCosts] | None = None

    @functools.cached_property
    def edges(self) -> tuple[list[str], list[str]]:
        """The blocks before the first layer and after the last (the embedding's, the head's), found once."""
        from planner.search.stage_widths import edge_blocks

        return edge_blocks(self.structure)

    def score(self, s: Strategy) -> Candidate:
        if s in self.memo:
            return self.memo[s]
        self.memo[s] = c = self._score(s)
        return c

    def costs(self, s: Strategy, workload: Workload | None = None, memory_constraint: bool = False) -> StageCosts:
        """The stage costs of `s` (not counted as a scored strategy); `workload` replaces the search's (a
        region's representative runs one micro-batch); `memory_constraint` solves the layouts under the
        integer program's memory rows, for this strategy alone (as `estimate` does when the fastest do not fit)."""
        wl = workload or self.workload
        if not memory_constraint:
            if workload is not None:
                return stage_costs(self.graph, self.structure, self.cluster, wl, s, facts=self.facts,
                                   time_limit_s=self.time_limit_s, solver=self.solver)
            # the ZeRO and offload variants of one strategy share its layouts and times: one costing, restated
            key = replace(s, zero=0, offload=())
            if self._last is None or self._last[0] != key:
                self._last = key, stage_costs(self.graph, self.structure, self.cluster, wl, s, facts=self.facts,
                                              time_limit_s=self.time_limit_s, solver=self.solver)
            return with_states(self._last[1], s, wl)
        self.facts.reuse_layouts = False  # the layouts of this strategy alone, under its memory
        try:
            return stage_costs(self.graph, self.structure, self.cluster, wl, s, facts=self.facts,
                               time_limit_s=self.time_limit_s, memory_constraint=True, solver=self.solver)
        finally:
            self.facts.reuse_layouts = True

    def _score(self, s: Strategy) -> Candidate:
        self.count += 1
        try:
            m = s.micro_batches(self.workload)
            costs = self.costs(s)
            short = self._shortfall(costs)
            usable = self.workload.execution.usable_hbm_bytes(self.cluster.device.hbm_bytes)
            peak = max(st.memory_bytes["peak"] for st in costs.stages)
            bd, step, _ = step_breakdown(costs, self.cluster, self.workload, s, m)
            # slower layouts that fit in HBM, as `estimate` picks them, when they could win
            if retries_layouts(short) and self.workload.mode == "train" and s.tp > 1 \
                    and peak <= MEMORY_RETRY * usable and self.worth(step):
                costs = self.costs(s, memory_constraint=True)
                short = self._shortfall(costs)
                bd, step, _ = step_breakdown(costs, self.cluster, self.workload, s, m)
        except HyperplanError as exc:
            return Candidate(s, math.inf, False, math.inf, note=str(exc))
        worst = max(costs.stages, key=lambda st: (st.memory_bytes["peak"], -st.index)).memory_bytes
        return Candidate(s, step, short is None, worst["peak"], bd, memory_bytes=dict(worst), shortfall=short)

    def _shortfall(self, costs: StageCosts) -> Shortfall | None:
        return worst_shortfall(self.cluster, (st.memory_bytes for st in costs.stages), self.workload.execution)


#: A strategy whose fastest layouts are at most this far over memory has its layouts solved again under the
#: memory rows of the integer program (beyond it no layout saves enough).
MEMORY_RETRY = 1.25


def _key(c: Candidate, hbm: float) -> tuple:
    if c.fits:
        return (0, c.step_s, c.strategy.pp, c.strategy.tp)
    return (1, c.peak_bytes - hbm, c.step_s)


def balanced_cut(scorer: Scorer, s: Strategy, empty_ends: bool = False) -> tuple[int, ...] | None:
    """Layers per stage that balance the stage times of `s` (embedding and head included); with `empty_ends`,
    the first and the last stage may hold the embedding or the head alone."""
    from planner.search.pipeline import balanced_split

    costs = scorer.costs(s)
    first, last = scorer.edges
    stem = sum(costs.block_s.get(name, 0.0) for name in first)
    head = sum(costs.block_s.get(name, 0.0) for name in last)
    try:
        return balanced_split([costs.block_s.get(b.name, 0.0) for b in scorer.structure.layers()], s.pp, stem, head,
                              empty_ends)
    except ValueError:
        return None
