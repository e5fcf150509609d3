"""The outer search: which mesh, pipeline cut, micro-batch, recompute and ZeRO level, around the layout ILP.

Decomposition (as Alpa does, but over a pruned enumeration instead of a
profile-driven DP): the inner integer program picks per-op layouts on the
tensor axis once per axis size (tied blocks keep it small, HiGHS proves its
optimum); the outer loop scores meshes by the analytic step time, keeping
the ones that fit in memory.

1. every mesh (tp x cp x pp x dp, ep for MoE) that the device count, the
   scale-up domain (tensor axis inside it), the layers and the batch allow,
   probed at micro-batch 1 with the cheapest recompute and ZeRO level that fit;
2. the best meshes again over micro-batch sizes and interleaved stages;
3. the best few with a balanced pipeline cut (`pipeline.balanced_split`);
4. the best few pipelines with stages of different widths (`stage_widths`).
Memory is a hard constraint; among plans that fit, the fastest step wins,
ties broken by fewer devices on the slow axes, then by order of discovery.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

from cost_models import Cluster

from planner.errors import HyperplanError
from planner.costing.estimate import fits_memory
from planner.graph.blocks import Structure
from planner.graph.moe import routed_experts
from planner.graph.ir import Graph
from planner.search.pipeline import balanced_split
from planner.costing.graph_facts import GraphFacts
from planner.search.stage_widths import edge_blocks, unequal_stage_strategies
from planner.costing.stage_costs import DTYPE_WIDTH, StageCosts, even_split, stage_costs
from planner.costing.step_time import step_breakdown
from planner.strategy import Strategy, Workload

Progress = Callable[[str, float], None]
"""Called with a message and the fraction of the search done."""

_RECOMPUTE_LADDER = ("none", "selective", "full")


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
    evaluated: int
    meshes: int
    wall_s: float
    complete: bool  # False when the time limit cut the search short


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]




def tensor_axis_limit(cluster: Cluster) -> int:
    """Largest tensor-parallel degree: inside the scale-up domain (every level but the scale-out one), at most 16."""
    inner = [lvl.group_size for lvl in cluster.levels[:-1] if lvl.group_size] or [
        cluster.levels[0].group_size or cluster.n_devices]
    return max(1, min(16, max(inner), cluster.n_devices))


def meshes(graph: Graph, structure: Structure, cluster: Cluster, workload: Workload) -> list[tuple[int, ...]]:
    """Every (tp, cp, pp, dp, ep, etp) the devices, scale-up domain, layers and batch allow."""
    n = cluster.n_devices
    layers = len(structure.layers())
    tmax = tensor_axis_limit(cluster)
    out = []
    experts = routed_experts(graph, structure)
    for tp in (1, 2, 4, 8, 16):
        if tp > tmax or n % tp:
            continue
        for cp in (1, 2, 4, 8):
            if cp > 1 and workload.seq_len < 16384:
                continue
            if (n // tp) % cp:
                continue
            for pp in _divisors(n // (tp * cp)):
                if pp > max(1, layers):
                    continue
                dp = n // (tp * cp * pp)
                if workload.global_batch % dp:
                    continue
                # experts fold onto the stage's tp x cp x dp ranks (Megatron-Core's MoE parallel folding): any ep
                # dividing the experts and the ranks, its expert-tensor degree tp (the default) or 1 (ep then
                # spans the tensor ranks too)
                ranks = tp * cp * dp
                eps = [e for e in _divisors(experts) if ranks % e == 0] if experts else [1]
                for ep in eps:
                    for etp in ((tp, 1) if tp > 1 and experts else (tp,)):
                        if ranks % (ep * etp) == 0:
                            out.append((tp, cp, pp, dp, ep, etp))
    return out


def probe_meshes(all_meshes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The meshes probed first: for MoE, only no expert parallelism and the widest of each expert-tensor degree;
    the rest come in step 2."""
    widest: dict[tuple, int] = {}
    for tp, cp, pp, dp, ep, etp in all_meshes:
        widest[(tp, cp, pp, dp, etp)] = max(ep, widest.get((tp, cp, pp, dp, etp), 1))
    return [m for m in all_meshes if m[4] == 1 or m[4] == widest[(m[0], m[1], m[2], m[3], m[5])]]


class Scorer:
    """Scores strategies with shared graph facts; layouts are solved once per tensor-axis size."""

    def __init__(self, graph: Graph, structure: Structure, cluster: Cluster, workload: Workload,
                 time_limit_s: float, facts: GraphFacts | None = None) -> None:
        self.graph, self.structure, self.cluster, self.workload = graph, structure, cluster, workload
        self.facts = facts or GraphFacts(graph, structure)
        self.facts.reuse_layouts = True
        self.count = 0
        self.time_limit_s = time_limit_s
        self.memo: dict[Strategy, Candidate] = {}

    def score(self, s: Strategy) -> Candidate:
        if s in self.memo:
            return self.memo[s]
        self.memo[s] = c = self._score(s)
        return c

    def costs(self, s: Strategy) -> StageCosts:
        """The stage costs of `s` (not counted as a scored strategy)."""
        return stage_costs(self.graph, self.structure, self.cluster, self.workload, s, facts=self.facts,
                           time_limit_s=self.time_limit_s)

    def _score(self, s: Strategy) -> Candidate:
        self.count += 1
        try:
            m = s.micro_batches(self.workload)
            costs = self.costs(s)
            bd, step, _ = step_breakdown(costs, self.cluster, self.workload, s, m)
        except HyperplanError as exc:
            return Candidate(s, math.inf, False, math.inf, note=str(exc))
        worst = max(costs.stages, key=lambda st: (st.memory_bytes["peak"], -st.index)).memory_bytes
        fits = all(fits_memory(self.cluster, st.memory_bytes, self.workload.execution) for st in costs.stages)
        return Candidate(s, step, fits, worst["peak"], bd, memory_bytes=dict(worst))


def _key(c: Candidate, hbm: float) -> tuple:
    if c.fits:
        return (0, c.step_s, c.strategy.pp, c.strategy.tp)
    return (1, c.peak_bytes - hbm, c.step_s)


def search(
    graph: Graph,
    structure: Structure,
    cluster: Cluster,
    workload: Workload,
    *,
    time_limit_s: float = 60.0,
    progress: Progress | None = None,
    layouts: str = "searched",
    offload: tuple[tuple[str, float], ...] = (),
    allow_offload: bool = True,
    facts: GraphFacts | None = None,
) -> SearchResult:
    """The fastest strategy that fits, the runners-up per mesh, and how much was searched.

    Pass `facts` to share graph analysis and solved layouts between searches of one graph
    (the MPMD split search plans the same sub-model on several group sizes)."""
    t0 = time.perf_counter()
    report = progress or (lambda msg, frac: None)
    scorer = Scorer(graph, structure, cluster, workload, max(1.0, time_limit_s / 4), facts)
    hbm = cluster.device.hbm_bytes
    all_meshes = meshes(graph, structure, cluster, workload)
    if not all_meshes:
        raise HyperplanError(
            f"no parallel layout of {cluster.n_devices} devices divides the global batch {workload.global_batch}; "
            "use a batch that is a multiple of the data-parallel degree"
        )
    per_replica = {d: workload.global_batch // d for d in {m[3] for m in all_meshes}}
    best_by_mesh: dict[tuple, Candidate] = {}
    complete = True

    def consider(c: Candidate) -> None:
        old = best_by_mesh.get(c.mesh)
        if old is None or _key(c, hbm) < _key(old, hbm):
            best_by_mesh[c.mesh] = c

    def ladder(base: Strategy, with_offload: bool = False, per_layer: bool = False) -> Candidate:
        """The fastest recompute / ZeRO (/ offload) combination of one strategy that fits, or the least over.

        Without offload, less recompute and a lower ZeRO stage are faster, so the
        first combination that fits wins. With offload (HyperOffload), a level
        that does not fit may still fit by moving a fraction of a memory class
        to the host or pooled tier; whether that beats the next recompute level
        depends on the tier's link, so both are scored. With `per_layer`, a level
        that does not fit is also tried with just enough layers of each chunk
        recomputed fully (recompute chosen per layer).
        """
        zeros = (1, 2, 3) if base.dp * base.cp > 1 else (0,)
        best: Candidate | None = None
        fitting: list[Candidate] = []
        last: Candidate | None = None  # the most frugal combination tried at the previous recompute level
        for rc in _RECOMPUTE_LADDER:
            if per_layer and rc == "full" and not fitting and last is not None and math.isfinite(last.peak_bytes):
                mixed = _fewest_full_layers(last.strategy)
                if mixed is not None:
                    fitting.append(mixed)
                    if best is None or _key(mixed, hbm) < _key(best, hbm):
                        best = mixed
            last = None
            for z in zeros:
                c = scorer.score(replace(base, recompute=rc, zero=z))
                if best is None or _key(c, hbm) < _key(best, hbm):
                    best = c
                last = c
                if c.fits:
                    fitting.append(c)
                    break
            if fitting and fitting[-1].strategy.recompute == rc:
                break  # a plain fit at this level: more recompute is only slower
            if with_offload and last is not None and math.isfinite(last.peak_bytes):
                for variant in offload_variants(last, hbm):
                    c = scorer.score(variant)
                    if best is None or _key(c, hbm) < _key(best, hbm):
                        best = c
                    if c.fits:
                        fitting.append(c)
        if fitting:
            return min(fitting, key=lambda c: _key(c, hbm))
        return best  # type: ignore[return-value]

    def _fewest_full_layers(s: Strategy) -> Candidate | None:
        """Bisect the number of fully recomputed layers per chunk that makes `s` fit (memory falls with it)."""
        per_chunk = math.ceil(len(structure.layers()) / (s.pp * s.vpp))
        lo, hi = 0, per_chunk  # lo does not fit; hi = all layers full, which the ladder tries anyway
        found = None
        while hi - lo > 1:
            mid = (lo + hi) // 2
            c = scorer.score(replace(s, full_recompute_layers=mid))
            if c.fits:
                hi, found = mid, c
            else:
                lo = mid
        return found

    # 1. probe every mesh at micro-batch 1; within one (tp, cp, ep) family, deeper pipelines stop being
    #    probed once two in a row fit but are slower than the family's best (more stages only add bubble)
    probes = probe_meshes(all_meshes)
    worse: dict[tuple[int, ...], int] = {}
    family_best: dict[tuple[int, ...], float] = {}
    for k, (tp, cp, pp, dp, ep, etp) in enumerate(probes):
        if time.perf_counter() - t0 > time_limit_s * 0.6:
            complete = False
            break
        fam = (tp, cp, ep, etp)
        if worse.get(fam, 0) >= 2:
            continue
        report(f"mesh TP{tp}·CP{cp}·PP{pp}·DP{dp}·EP{ep}", 0.6 * k / len(probes))
        base = Strategy(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, etp=0 if etp == tp else etp, micro_batch=1, sp=tp > 1,
                        layouts=layouts, offload=offload)
        c = ladder(base)
        consider(c)
        if c.fits:
            if c.step_s > family_best.get(fam, math.inf):
                worse[fam] = worse.get(fam, 0) + 1
            else:
                family_best[fam], worse[fam] = c.step_s, 0

    # 1b. nothing fits: try offload on the probes closest to fitting
    if allow_offload and not any(c.fits for c in best_by_mesh.values()):
        for cand in sorted(best_by_mesh.values(), key=lambda c: _key(c, hbm))[:12]:
            consider(ladder(cand.strategy, with_offload=True))

    # 2. the best meshes over micro-batch sizes, interleaving and offload
    top = sorted(best_by_mesh.values(), key=lambda c: _key(c, hbm))[:6]
    for k, cand in enumerate(top):
        if time.perf_counter() - t0 > time_limit_s * 0.85:
            complete = False
            break
        report(f"micro-batches for {cand.strategy.short()}", 0.6 + 0.25 * k / max(1, len(top)))
        s = cand.strategy
        if allow_offload:
            consider(ladder(s, with_offload=True))
        consider(ladder(s, per_layer=True))
        for mb in (2, 4, 8):
            if per_replica[s.dp] % mb:
                continue
            consider(ladder(replace(s, micro_batch=mb), with_offload=allow_offload, per_layer=True))
        layers = len(structure.layers())
        if s.pp > 1 and layers >= 2 * s.pp:
            consider(ladder(replace(s, vpp=2)))
        for mesh in all_meshes:  # the expert-parallel degrees between the probed ones
            tp, cp, pp, dp, ep, etp = mesh
            if (tp, cp, pp, dp, etp) == (s.tp, s.cp, s.pp, s.dp, s.expert_tp) and ep not in (1, s.ep) \
                    and mesh not in probes:
                consider(ladder(replace(s, ep=ep)))

    # 3. a balanced pipeline cut for the best few
    top = sorted(best_by_mesh.values(), key=lambda c: _key(c, hbm))[:3]
    for cand in top:
        s = cand.strategy
        if s.pp == 1 or s.vpp > 1 or not cand.fits:
            continue
        report(f"balancing stages of {s.short()}", 0.9)
        split = _balanced(scorer, s)
        if split and split != _even(len(structure.layers()), s.pp):
            consider(scorer.score(replace(s, stage_layers=split)))

    # 4. stages of different widths for the best few pipelines: heavy stages get more tensor ranks
    top = sorted(best_by_mesh.values(), key=lambda c: _key(c, hbm))[:3]
    for cand in top:
        if not cand.fits or time.perf_counter() - t0 > time_limit_s * 0.95:
            continue
        report(f"stage widths of {cand.strategy.short()}", 0.95)
        for s in unequal_stage_strategies(structure, cluster, workload, cand.strategy, scorer.costs,
                                          tensor_axis_limit(cluster), DTYPE_WIDTH.get(workload.dtype, 2.0)):
            consider(scorer.score(s))

    ranked = tuple(sorted(best_by_mesh.values(), key=lambda c: _key(c, hbm)))
    best = ranked[0] if ranked and ranked[0].fits else None
    closest = None if best else (ranked[0] if ranked else None)
    report("done", 1.0)
    return SearchResult(best, ranked, closest, scorer.count, len(all_meshes), time.perf_counter() - t0, complete)


_OFFLOAD_STEP = 0.05


def offload_variants(c: Candidate, hbm: float) -> list[Strategy]:
    """Strategies that move just enough of one memory class (or the optimizer and one more) off HBM to fit.

    Fractions are rounded up to 5% steps; activations first (their traffic hides behind compute), then
    the optimizer states (ZeRO-Offload: the update runs on the host), then parameters.
    """
    mem = c.memory_bytes
    over = mem.get("peak", 0.0) - 0.99 * hbm
    if over <= 0 or c.strategy.tp == 0:
        return []
    base = dict(c.strategy.offload)
    out: list[Strategy] = []

    def frac(need: float, have: float) -> float | None:
        if have <= 0:
            return None
        f = math.ceil(need / have / _OFFLOAD_STEP) * _OFFLOAD_STEP
        return min(1.0, round(f, 2)) if need <= have else None

    for cls in ("activations", "optimizer", "params"):
        f = frac(over, mem.get(cls, 0.0))
        if f:
            out.append(replace(c.strategy, offload=tuple(sorted({**base, cls: f}.items()))))
    rest = over - mem.get("optimizer", 0.0)
    if rest > 0 and mem.get("optimizer", 0.0) > 0:
        for cls in ("activations", "params"):
            f = frac(rest, mem.get(cls, 0.0))
            if f:
                out.append(replace(c.strategy, offload=tuple(sorted({**base, "optimizer": 1.0, cls: f}.items()))))
    return out


def _even(n: int, k: int) -> tuple[int, ...]:
    return even_split(n, k)


def _balanced(scorer: Scorer, s: Strategy) -> tuple[int, ...] | None:
    """Layers per stage that balance the stage times of `s` (embedding and head included)."""
    costs = scorer.costs(s)
    first, last = edge_blocks(scorer.structure)
    stem = sum(costs.block_s.get(name, 0.0) for name in first)
    head = sum(costs.block_s.get(name, 0.0) for name in last)
    try:
        return balanced_split([costs.block_s.get(b.name, 0.0) for b in scorer.structure.layers()], s.pp, stem, head)
    except ValueError:
        return None
