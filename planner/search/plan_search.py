"""The outer search: branch and bound over meshes, schedules and memory policies, around the layout ILP.

The space (`grid`) is split into regions, coarse to fine: context degree, then tensor degree (the layout
integer program is solved once per tensor and context degree), micro-batch, expert degrees, then the
pipeline and data degrees with the interleaving (a schedule), then the recompute policy; the leaves are
whole strategies (a ZeRO level, per-layer recompute, offload fractions, the pipeline cut) scored by the
analytic estimate. Each region gets a lower bound on the step time of every strategy in it
(`bounds`) from one costing of a representative, and a policy region's also what fitting in HBM costs
its strategies (`fitting`: ZeRO traffic and offload forced by memory); regions are opened best bound
first, and a region whose bound is within `gap` of the best plan found is closed unopened. The search
is exact up to `gap`: when it ends, no strategy of the space is faster than `bound_s`, and the plan says
how far it is from that.

Effort is counted in work (nodes: costings and scored strategies), never in seconds, so the same inputs
give the same plan on an idle or a loaded machine; `time_limit_s` only stops a search that would run
longer (best so far, marked incomplete, with the bound of what was left open). Ties go to fewer devices
on the slow axes (the lower pipeline degree, then the lower tensor degree), then to the order of the
regions, which is fixed.

Stages of different tensor widths (`stage_widths`) are tried around the best pipelines after the
search; they can only lower the step, and the bound covers the equal-width space.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

from cost_models import Cluster

from planner.costing.graph_facts import GraphFacts
from planner.costing.pipeline_cut import even_split
from planner.costing.stage_costs import DTYPE_WIDTH
from planner.graph.blocks import Structure
from planner.graph.ir import Graph
from planner.search import grid
from planner.search.bounds import mesh_bound_s
from planner.search.dp_floor import dp_bounds_s, meshes_floor_s, model_params
from planner.search.representatives import Representatives
from planner.search.runners_up import closest_unscored, smaller_micro_batches
from planner.search.budget import DEFAULT_MAX_NODES, Budget
from planner.search.constraints import NONE, Constraints
from planner.search.fitting import fitting_bound_s
from planner.search.scoring import Candidate, Progress, Scorer, SearchResult, _key, balanced_cut
from planner.search.solve import WALL_LIMIT_S
from planner.search.stage_widths import unequal_stage_strategies
from planner.search.to_fit import fewest_full_layers, offload_variants
from planner.strategy import Strategy, Workload

__all__ = ["Budget", "Candidate", "Scorer", "SearchResult", "search", "DEFAULT_GAP", "DEFAULT_MAX_NODES"]

#: Regions whose bound is within this fraction of the best plan are closed unopened.
DEFAULT_GAP = 0.01
_LEVELS = ("cp", "tp", "mb", "ep", "schedule", "policy")
RECOMPUTES = ("none", "selective", "full")


@dataclass(order=True, slots=True)
class _Node:
    bound_s: float
    order: tuple
    level: str = field(compare=False)
    key: tuple = field(compare=False)  # (cp, tp, mb, ep, etp, pp, dp, vpp, recompute), as far as the level fixes
    refined: bool = field(compare=False, default=False)


class _Search:
    """The state of one branch and bound (see the module docstring)."""

    def __init__(self, graph: Graph, structure: Structure, cluster: Cluster, workload: Workload, *,
                 budget: Budget, layouts: str, allow_offload: bool, facts: GraphFacts | None, constraints: Constraints,
                 gap: float, solver: str, progress: Progress | None) -> None:
        self.graph, self.structure, self.cluster, self.workload = graph, structure, cluster, workload
        self.budget, self.layouts, self.c, self.gap = budget, layouts, constraints, gap
        self.report = progress or (lambda msg, frac: None)
        constraints.check_stack(workload.execution, workload.mode == "train")
        self.sp = constraints.sequence_parallel_runs(workload.execution)  # tensor parallelism with it
        self.allow_offload = allow_offload and constraints.offload is None
        self.base_offload = tuple(sorted(constraints.offload or ()))
        # the layout ILP runs to its proven optimum or its work limit (a layout solved short of its optimum says
        # so in the plan's `layout_solver_gap`), unless it would take longer than the whole plan may
        self.scorer = Scorer(graph, structure, cluster, workload, min(max(30.0, budget.time_limit_s), WALL_LIMIT_S),
                             facts, solver)
        self.scorer.worth = lambda step_s: not self._closed(step_s)
        self.shape = grid.model_shape(graph, structure, self.scorer.facts)
        self.layers = self.shape.layers
        self.hbm = cluster.device.hbm_bytes
        self.training = workload.mode == "train"
        self.meshes = grid.meshes(self.shape, cluster, workload, constraints)
        self.by_tc: dict[tuple[int, int], list[tuple[int, ...]]] = {}
        for m in self.meshes:
            self.by_tc.setdefault((m[1], m[0]), []).append(m)
        self.heap: list[_Node] = []  # a binary heap (heapq) of the open regions, least bound first
        self.best_by_mesh: dict[tuple, Candidate] = {}
        self.best: Candidate | None = None
        self.pruned_bound = math.inf
        self.pruned = 0
        self.refused: Candidate | None = None  # the first strategy whose offload the launch framework refuses
        self.reps = Representatives(self.scorer, workload, self.layers, layouts, budget, self.sp)
        self.params = model_params(self.scorer.facts, structure)  # dense and routed-expert: for `dp_floor`
        self.schedules: dict[tuple, float] = {}  # every schedule region seen -> its bound
        self.fitted: dict[tuple, dict[int, int]] = {}  # schedule -> ZeRO level -> least recompute that fits

    # -- the work ------------------------------------------------------------------------------------
    def run(self) -> SearchResult:
        t0 = time.perf_counter()
        grid.check_buildable(self.workload, self.c, self.shape)
        if not self.meshes:
            raise grid.no_mesh(self.cluster, self.workload, self.c, self.shape)
        for cp in sorted({m[1] for m in self.meshes}):
            self._push("cp", (cp,), 0.0)
        complete = True
        while self.heap:
            node = self._next()
            if self._closed(node.bound_s):
                break
            if self.budget.out():
                complete = False
                break
            self._take(node)
            self.report(f"{node.level} {node.key}", min(0.95, self.budget.nodes / max(1, len(self.meshes) * 8)))
            if not node.refined and node.level in ("cp", "tp", "mb", "ep", "policy"):
                bound = self._refine(node)
                self._push(node.level, node.key, max(bound, node.bound_s), refined=True)
            else:
                self._expand(node)
        open_bound = min((n.bound_s for n in self.heap), default=math.inf)  # closed, or left by the budget
        for n in self.heap:
            if self._closed(n.bound_s):
                self.pruned += 1
        if complete:
            self._stage_widths()
            self._runners_up()
        ranked = tuple(sorted(self.best_by_mesh.values(), key=lambda c: _key(c, self.hbm)))
        best = ranked[0] if ranked and ranked[0].fits else None
        bound = min(best.step_s if best else math.inf, self.pruned_bound, open_bound)
        return SearchResult(best, ranked, None if best else (ranked[0] if ranked else self.refused), self.scorer.count,
                            len(self.meshes), time.perf_counter() - t0, complete, self.budget.nodes,
                            bound if math.isfinite(bound) else 0.0, self.pruned)

    def _next(self) -> _Node:
        """The region to open: the least bound, or, until a plan that fits is known, the deepest region of
        least bound (a dive to the first incumbent, which then closes the regions it beats)."""
        if self.best is None:  # smaller micro-batches first: they are the likelier to fit
            return min(self.heap, key=lambda n: (-_LEVELS.index(n.level), n.key[2] if len(n.key) > 2 else 0, n))
        return self.heap[0]

    def _take(self, node: _Node) -> None:
        """Remove `node` from the open regions (another than the top only while diving to a first incumbent)."""
        if node is self.heap[0]:
            heapq.heappop(self.heap)
        else:
            self.heap.remove(node)
            heapq.heapify(self.heap)

    def _closed(self, bound_s: float) -> bool:
        return self.best is not None and bound_s >= self.best.step_s * (1.0 - self.gap)

    def _push(self, level: str, key: tuple, bound_s: float, refined: bool = False) -> None:
        if self._closed(bound_s):
            self.pruned += 1
            self.pruned_bound = min(self.pruned_bound, bound_s)
            return
        heapq.heappush(self.heap, _Node(bound_s, (_LEVELS.index(level),) + key, level, key, refined))

    def _consider(self, c: Candidate) -> Candidate:
        self.budget.spend()
        old = self.best_by_mesh.get(c.mesh)
        if old is None or _key(c, self.hbm) < _key(old, self.hbm):
            self.best_by_mesh[c.mesh] = c
        if c.fits and (self.best is None or _key(c, self.hbm) < _key(self.best, self.hbm)):
            self.best = c
        return c

    def _score(self, s: Strategy) -> Candidate:
        why = self._offload_refused(s)
        if why:  # the launch framework does not offload so (`Constraints.offload_when`): nothing to score
            self.refused = self.refused or Candidate(s, math.inf, False, math.inf, note=why)
            return self.refused
        return self._consider(self.scorer.score(s))

    def _offload_refused(self, s: Strategy) -> str:
        decoder = self.layers - self.scorer.facts.mtp_layers()  # launch frameworks build MTP layers apart
        return self.c.offload_refused(s, self.workload.execution, fp8=self.workload.dtype == "fp8", layers=decoder)

    # -- bounds -------------------------------------------------------------------------------------
    def _widest(self, cp: int, tp: int, mb: int, etp: int) -> int:
        """The widest expert-parallel degree at `etp` among the meshes of a micro-batch's region."""
        return max(m[4] for m in self._region_meshes((cp, tp, mb)) if m[5] == etp)

    def _region_meshes(self, key: tuple) -> list[tuple[int, ...]]:
        """The meshes of a region key (cp, tp, mb, ep, etp, ...)."""
        cp = key[0]
        out = [m for (c, t), ms in sorted(self.by_tc.items()) if c == cp and (len(key) < 2 or t == key[1])
               for m in ms]
        if len(key) >= 3:
            out = [m for m in out if (self.workload.global_batch // m[3]) % key[2] == 0]
        if len(key) >= 5:
            out = [m for m in out if (m[4], m[5]) == (key[3], key[4])]
        return out

    def _refine(self, node: _Node) -> float:
        key, n, B = node.key, self.cluster.n_devices, self.workload.global_batch
        if not self.training or self.c.stage_tp:
            return 0.0
        region = self._region_meshes(key)
        if not region:
            return math.inf
        if node.level == "cp":  # tensor degree 1 at the largest micro-batch; a rank at tp does >= 1/tp of it
            cp = key[0]
            mb = max(B // m[3] for m in region)
            ep = max(m[4] for m in region)
            eps = tuple(sorted({m[4] for m in region}))
            return mesh_bound_s(self.reps.per_sample(1, cp, mb, [(1, cp, 1, 1, ep, 1)], eps), B, cp, n) + \
                self._dp_floor(region, None, 0.0)
        cp, tp = key[0], key[1]
        if node.level == "tp":  # the largest micro-batch: no sample costs less
            # the layouts of this tensor and context degree are solved once, at micro-batch 1 (the scorer
            # keeps them for every strategy of the degree), so they are solved at that size first
            self.reps.times(tp, cp, 1, 1, tp)
            ps = self.reps.per_sample(tp, cp, max(B // m[3] for m in region), region)
            return mesh_bound_s(ps, B, tp * cp, n) + self._dp_floor(region, None, ps)
        mb = key[2]
        if node.level == "mb":
            ps = self.reps.per_sample(tp, cp, mb, region)
            return mesh_bound_s(ps, B, tp * cp, n) + self._dp_floor(region, mb, ps)
        ep, etp = key[3], key[4]
        if node.level == "ep":
            ps = self.reps.ep_times(tp, cp, mb, ep, etp, self._widest(cp, tp, mb, etp)).per_sample_s
            return mesh_bound_s(ps, B, tp * cp, n) + self._dp_floor(region, mb, ps)
        rc = RECOMPUTES[key[8]]  # policy: the pipeline at this recompute
        s = self._schedule_strategy(key[:8], recompute=rc)
        floors = self._dp_bounds(self.reps.times(tp, cp, mb, ep, etp, rc), s)
        if self.base_offload:  # offload fixed by the user: the leaves keep it, and fitting bounds do not apply
            return min((p + t for p, t in floors.values()), default=math.inf)
        return fitting_bound_s(self.graph, self.structure, self.scorer.facts,
                               self.reps.costings.get((tp, cp, mb, ep, etp, rc)), self.cluster, self.workload, s,
                               floors, self.allow_offload)

    def _schedule_strategy(self, key: tuple, **knobs) -> Strategy:
        return grid.schedule_strategy(key, self.layers, self.sp, self.layouts, **knobs)

    def _dp_bounds(self, lt, s: Strategy) -> dict[int, tuple[float, float]]:
        """Per ZeRO level the region holds, the pipeline bound of `lt` and the data-parallel tail (`dp_floor`)."""
        return dp_bounds_s(lt, self.params, self.cluster, self.workload, s, self._zeros(s))

    def _dp_floor(self, region: list[tuple[int, ...]], mb: int | None, per_sample_s: float) -> float:
        """What the pipeline's fill and exposed data-parallel traffic add to the mesh bound of a region's meshes at
        micro-batch `mb` (None: any), from below (`dp_floor.meshes_floor_s`)."""
        B = self.workload.global_batch
        return meshes_floor_s(self.params, self.cluster, self.workload, (self._schedule_strategy(
            (cp, tp, mb or B // dp, ep, etp, pp, dp, 1)) for tp, cp, pp, dp, ep, etp in region), self._zeros,
            per_sample_s, mb or 1, self.layers)

    # -- branching ----------------------------------------------------------------------------------
    def _expand(self, node: _Node) -> None:
        key, B = node.key, self.workload.global_batch
        region = self._region_meshes(key)
        if node.level == "cp":
            for tp in sorted({m[0] for m in region}):
                self._push("tp", key + (tp,), node.bound_s)
        elif node.level == "tp":
            for mb in sorted({d for m in region for d in grid.micro_batches(B // m[3], self.c)}):
                self._push("mb", key + (mb,), node.bound_s)
        elif node.level == "mb":
            for ep, etp in sorted({(m[4], m[5]) for m in region}):
                # without experts there is one (ep, etp): its bound is the micro-batch's, already exact
                self._push("ep", key + (ep, etp), node.bound_s, refined=not self.shape.experts)
        elif node.level == "ep":
            self._schedules(node, region)
        elif node.level == "schedule":
            for rc in self._recomputes():
                self._push("policy", key + (RECOMPUTES.index(rc),), node.bound_s)
        else:
            self._leaves(node)

    def _schedules(self, node: _Node, region: list[tuple[int, ...]]) -> None:
        cp, tp, mb, ep, etp = node.key
        for m in region:
            pp, dp = m[2], m[3]
            micro = self.workload.global_batch // (dp * mb)
            for vpp in grid.vpp_degrees(self.layers, pp, micro, self.c):
                key = node.key + (pp, dp, vpp)
                self.schedules.setdefault(key, node.bound_s)
                bound = 0.0 if self.c.stage_tp or not self.training else min((p + t for p, t in self._dp_bounds(
                    self.reps.ep_times(tp, cp, mb, ep, etp, self._widest(cp, tp, mb, etp)),
                    self._schedule_strategy(key)).values()), default=math.inf)
                self._push("schedule", key, max(bound, node.bound_s), refined=True)

    def _recomputes(self) -> list[str]:  # in training, what the stack's framework can run (or the one asked)
        runs = self.c.recompute_runs(self.workload.execution) if self.training else ("none",)
        return [self.c.recompute] if self.c.recompute and self.training else [r for r in RECOMPUTES if r in runs]

    def _zeros(self, s: Strategy) -> list[int]:
        zeros = [0, 1, 2, 3] if s.dp * s.cp > 1 and self.training else [0]
        return [z for z in zeros if (self.c.zero is None or z == self.c.zero)
                and self.c.zero_allowed(z, s.dp, s.tp * s.pp * s.cp)]

    def _leaves(self, node: _Node) -> None:
        """Score a schedule's strategies at one recompute policy: every ZeRO level that did not fit with less
        recompute; where none fits, just enough layers recomputed fully, or just enough offloaded."""
        sched, level = node.key[:-1], node.key[-1]
        rc, pp, vpp = RECOMPUTES[level], sched[5], sched[7]
        base = self._schedule_strategy(sched, recompute=rc, offload=self.base_offload, stage_tp=self.c.stage_tp or ())
        fitted = self.fitted.setdefault(sched, {})  # ZeRO level -> the least recompute at which it fits
        misses: list[Candidate] = []  # over memory, by ZeRO level: the last keeps least
        for z in self._zeros(base):
            if fitted.get(z, len(RECOMPUTES)) < level:
                continue  # it fits with less recompute, which is faster
            if self._closed(node.bound_s):
                self.pruned_bound = min(self.pruned_bound, node.bound_s)
                break
            c = self._score(replace(base, zero=z))
            if c.fits:
                fitted[z] = min(level, fitted.get(z, level))
                self._balanced(c, node.bound_s)
            elif math.isfinite(c.peak_bytes):
                misses.append(c)
        if not misses or self._closed(node.bound_s):
            return
        beside = self.c.beside_full_layers(self.workload.execution)  # the other layers' beside some full ones
        if rc == beside and self.c.recompute is None and pp * vpp <= self.layers:
            fewest_full_layers(self._score, misses[-1].strategy, misses[-1].peak_bytes, self.layers,
                               self.workload.execution.usable_hbm_bytes(self.hbm), lambda c: self._balanced(c, 0.0))
        if self.allow_offload:  # from the level that keeps least, or each (`_score` passes what the framework runs)
            tried = misses[-1:] if self.c.offload_when is None else misses[::-1]
            for variant in (v for c in tried for v in offload_variants(c, self.hbm)):
                if not self._closed(node.bound_s):
                    self._score(variant)

    def _balanced(self, c: Candidate, bound_s: float) -> None:
        """The cuts that balance the stages' times, with and without a first or last stage of the embedding or the
        head alone, when they differ from the even one."""
        s = c.strategy
        if s.pp == 1 or s.vpp > 1 or s.stage_tp or self._closed(bound_s):
            return
        tried = {even_split(self.layers, s.pp)}
        for empty_ends in (False, True)[:1 if self.c.ends_alone is False else 2]:  # then an end's block alone
            split = balanced_cut(self.scorer, s, empty_ends)
            if split and split not in tried:
                tried.add(split)
                self._score(replace(s, stage_layers=split))

    def _runners_up(self, n: int = 3) -> None:
        """So the plan can say why the other meshes lost (`runners_up`): the best plan's policies on the closest
        meshes the bound closed unscored, and a shown strategy that does not fit at smaller micro-batches."""
        if self.best is None or self.c.stage_tp:  # fixed stage widths: no other mesh keeps them
            return
        b = self.best.strategy
        for key in closest_unscored(self.schedules, self.best_by_mesh, n):
            s = self._schedule_strategy(key, recompute=b.recompute, zero=b.zero if key[6] * key[0] > 1 else 0,
                                        offload=b.offload)
            if self.budget.out():
                return
            if self.c.zero_allowed(s.zero, s.dp, s.tp * s.pp * s.cp):
                self._score(s)
        shown = sorted((c for c in self.best_by_mesh.values() if c.mesh != self.best.mesh),
                       key=lambda c: _key(c, self.hbm))[:n]
        for c in (c for c in shown if not c.fits):
            for s in smaller_micro_batches(c.strategy, self.workload.global_batch, self.c, self.base_offload):
                if self.budget.out() or self._score(s).fits:
                    break

    def _stage_widths(self) -> None:
        """Stages of different widths for the best few pipelines: heavy stages get more tensor ranks."""
        if self.c.stage_tp or not self.training:
            return
        top = [c for c in sorted(self.best_by_mesh.values(), key=lambda c: _key(c, self.hbm)) if c.fits][:3]
        limit = grid.tensor_axis_limit(self.cluster)
        for cand in top:
            if self.budget.out():
                return
            for s in unequal_stage_strategies(self.structure, self.cluster, self.workload, cand.strategy,
                                              self.scorer.costs, limit, DTYPE_WIDTH.get(self.workload.dtype, 2.0),
                                              tuple(self.shape.heads)):
                if self.c.allows(s, experts=bool(self.shape.experts), inout=self.shape.inout):
                    self._score(s)


def search(graph: Graph, structure: Structure, cluster: Cluster, workload: Workload, *,
           time_limit_s: float | None = None, progress: Progress | None = None, layouts: str = "searched",
           allow_offload: bool = True, facts: GraphFacts | None = None, constraints: Constraints = NONE,
           budget: Budget | None = None, gap: float = DEFAULT_GAP, solver: str = "highs", **_: Any) -> SearchResult:
    """The fastest strategy that fits, the runners-up per mesh, how much work it took and how close to the
    best of the space it is (see the module docstring).

    Pass `facts` to share graph analysis and solved layouts between searches of one graph (the MPMD split
    search plans the same sub-model on several group sizes), and `budget` to share one budget between
    searches of one plan."""
    budget = budget or Budget(time_limit_s)
    return _Search(graph, structure, cluster, workload, budget=budget, layouts=layouts, allow_offload=allow_offload,
                   facts=facts, constraints=constraints, gap=gap, solver=solver, progress=progress).run()
