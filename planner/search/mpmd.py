"""HyperMPMD: sub-models as separate programs on disjoint device groups, sized so none waits on another.

Two kinds of program pairs compete with the single-program plan:

- **encoders | backbone** (here): a multimodal model's vision and audio
  towers with their projector on one group, the language backbone on the
  other. Each gets its own mesh, micro-batch, recompute, ZeRO and offload,
  found by the same search (`plan_search.search`) on its own subgraph; the
  encoders feed the backbone micro-batch by micro-batch over the fabric.
- **attention | experts** in MoE layers (`moe_programs`): tokens cross
  between the groups every layer, micro-batches ping-ponged so both work.

For encoders | backbone the step is set by the slower program, plus the
pipeline fill between the two and the hand-over that compute cannot hide
(`program_groups`):

    step = max(T_enc, T_llm) + min(T_enc, T_llm) / units + exposed hand-over

The encoder group size is found on the balance T_enc(n) = T_llm(N - n)
by secant steps (each program's device-seconds held at their last value,
`balance_points`), a full search of each program per size tried; then each
program's micro-batch is chosen again for the pair, since a smaller one
shortens the fill.
Load imbalance is the slowest program's time over the fastest's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from cost_models import Cluster, place_group
from cost_models.collectives import send_recv_s

from planner.errors import HyperplanError
from planner.graph.blocks import Structure, discover_blocks
from planner.graph.ir import Graph
from planner.graph.subgraph import boundary_bytes, extract
from planner.costing.graph_facts import GraphFacts
from planner.costing.node_work import graph_batch
from planner.search.plan_search import Budget, Candidate, Scorer, search
from planner.search.program_groups import group_cluster, group_sizes, group_workload, pipeline_fill_s
from planner.strategy import Strategy, Workload

#: Encoders below this share of the FLOPs are not worth the searches of a split: the most a split can
#: save is what the single program wastes on them, a fraction of their share.
MIN_SHARE = 0.05

Progress = Callable[[str, float], None]


@dataclass(frozen=True, slots=True)
class Program:
    """A part of the model planned and run on its own device group."""

    name: str
    submodels: tuple[str, ...]
    graph: Graph
    structure: Structure


@dataclass(frozen=True, slots=True)
class ProgramPlan:
    program: Program
    devices: int
    first_rank: int
    best: Candidate
    workload: Workload | None = None  # what the group is timed on (its share of the batch, rounded up)


@dataclass(frozen=True, slots=True)
class MpmdResult:
    programs: tuple[ProgramPlan, ...]
    step_s: float
    fill_s: float
    transfer_s: float
    imbalance: float
    splits_tried: int
    kind: str = "encoders"  # "encoders" (encoders | backbone) or "experts" (attention | experts)
    detail: Mapping[str, Any] = field(default_factory=dict)  # kind-specific figures for the report
    source: Any = None  # what the kind's reporter needs to score the plan again (not reported)


def split_programs(graph: Graph, structure: Structure) -> list[Program]:
    """Encoders (every sub-model but the largest) and the backbone, or [] when there is one program only."""
    subs = list(structure.submodels)
    if len(subs) < 2:
        return []
    total = sum(s.flops for s in subs) or 1.0
    backbone = max(subs, key=lambda s: (s.flops, s.name))
    encoders = [s for s in subs if s is not backbone]
    if sum(s.flops for s in encoders) / total < MIN_SHARE:
        return []
    out = []
    for name, members in (("encoders", encoders), (backbone.name, [backbone])):
        blocks = {b for s in members for b in s.blocks}
        nodes = [i for b in structure.blocks if b.name in blocks for i in b.nodes]
        sub = extract(graph, nodes, name)
        out.append(Program("+".join(s.name for s in members) if name == "encoders" else name,
                           tuple(s.name for s in members), sub, discover_blocks(sub)))
    return out


class ProgramSearch:
    """The best plan of a program on a group of n devices, searched once per (program, n)."""

    def __init__(self, cluster: Cluster, workload: Workload, allow_offload: bool, progress: Progress | None,
                 budget: Budget) -> None:
        self.cluster, self.workload, self.allow_offload = cluster, workload, allow_offload
        self.budget = budget  # the whole plan's (work and time), shared by every program's search
        self.report = progress or (lambda msg, frac: None)
        self.memo: dict[tuple[str, int], tuple[Candidate, ...]] = {}
        self.facts: dict[str, GraphFacts] = {}

    def facts_of(self, p: Program) -> GraphFacts:
        if p.name not in self.facts:
            self.facts[p.name] = GraphFacts(p.graph, p.structure)
        return self.facts[p.name]

    def best(self, p: Program, n: int, flat: bool = False) -> Candidate | None:
        """The fastest plan that fits (`flat`: the fastest without pipeline stages), None if none does."""
        key = (p.name, n)
        if key not in self.memo:
            self.report(f"MPMD: {p.name} on {n} devices", 0.5)
            try:
                r = search(p.graph, p.structure, group_cluster(self.cluster, n), group_workload(self.workload, n),
                           allow_offload=self.allow_offload, facts=self.facts_of(p), budget=self.budget)
                self.memo[key] = r.ranked
            except HyperplanError:
                self.memo[key] = ()
        return next((c for c in self.memo[key] if c.fits and (c.strategy.pp == 1 or not flat)), None)

    def step(self, p: Program, n: int) -> float:
        c = self.best(p, n)
        return c.step_s if c is not None else math.inf

    def micro_batch_variants(self, p: Program, n: int, c: Candidate, frugal: bool = False) -> list[Candidate]:
        """`c` and the same strategy at each other micro-batch size that fits (a smaller one shortens the fill);
        `frugal` adds each with more recompute and ZeRO-3, which keep less in memory (for more micro-batches in
        flight)."""
        wl = group_workload(self.workload, n)
        per_replica = wl.global_batch // c.strategy.dp
        scorer = Scorer(p.graph, p.structure, group_cluster(self.cluster, n), wl, 30.0, self.facts_of(p))
        out = [c]
        for mb in range(1, 9):
            if per_replica % mb:
                continue
            base = replace(c.strategy, micro_batch=mb)
            tries = [] if mb == c.strategy.micro_batch else [base]
            if frugal:
                zero = 3 if base.dp * base.cp > 1 else base.zero
                tries += [replace(base, recompute=rc, zero=zero, full_recompute_layers=0)
                          for rc in ("selective", "full") if (rc, zero) != (base.recompute, base.zero)
                          and rc in wl.execution.recompute_policies]
            out += [v for v in map(scorer.score, tries) if v.fits]
        return out


def plan_mpmd(
    graph: Graph,
    structure: Structure,
    cluster: Cluster,
    workload: Workload,
    *,
    time_limit_s: float | None = None,
    allow_offload: bool = True,
    progress: Progress | None = None,
    incumbent_s: float | None = None,
    budget: Budget | None = None,
    kinds: tuple[str, ...] = ("encoders", "experts"),
) -> MpmdResult | None:
    """The fastest multi-program plan of `kinds` (`MpmdResult.kind`: encoders | backbone, or attention | experts
    in MoE layers), or None when the model has none; `incumbent_s` is the single-program step to beat, if known;
    `budget` is the whole plan's (its searches spend from it)."""
    from planner.search.moe_programs import plan_moe_programs

    kw = dict(allow_offload=allow_offload, progress=progress, budget=budget or Budget(time_limit_s))
    results = [r for r in (plan_encoders(graph, structure, cluster, workload, **kw) if "encoders" in kinds else None,
                           plan_moe_programs(graph, structure, cluster, workload, incumbent_s=incumbent_s, **kw)
                           if "experts" in kinds else None)
               if r is not None]
    return min(results, key=lambda r: r.step_s) if results else None


def plan_encoders(
    graph: Graph,
    structure: Structure,
    cluster: Cluster,
    workload: Workload,
    *,
    time_limit_s: float | None = None,
    allow_offload: bool = True,
    progress: Progress | None = None,
    budget: Budget | None = None,
) -> MpmdResult | None:
    """The best two-program plan (encoders | backbone), or None when the model has no separable encoders;
    `budget` (or one of `time_limit_s`) is shared by every program's search."""
    progs = split_programs(graph, structure)
    sizes = group_sizes(cluster)
    if len(progs) != 2 or not sizes:
        return None
    enc, llm = progs
    n = cluster.n_devices
    ps = ProgramSearch(cluster, workload, allow_offload, progress, budget or Budget(time_limit_s))

    ks = balance_points(lambda c: ps.step(enc, c), lambda c: ps.step(llm, n - c), sizes, n)
    options = []
    for k in ks:
        a, b = ps.best(enc, sizes[k]), ps.best(llm, n - sizes[k])
        if a is not None and b is not None:
            options.append((pair_step(graph, llm, cluster, workload, sizes[k], a, b)[0], k, a, b))
    if not options:
        return None
    _, k, a, b = min(options, key=lambda o: (o[0], o[1]))
    n_enc = sizes[k]
    # each program's micro-batch again, for the pair: the fill shrinks with more, smaller hand-over units
    va, vb = ps.micro_batch_variants(enc, n_enc, a), ps.micro_batch_variants(llm, n - n_enc, b)
    pairs = [(pair_step(graph, llm, cluster, workload, n_enc, x, y), i, j)
             for i, x in enumerate(va) for j, y in enumerate(vb)]
    (step, fill, transfer), i, j = min(pairs, key=lambda p: (p[0][0], p[1], p[2]))
    a, b = va[i], vb[j]
    plans = (ProgramPlan(enc, n_enc, 0, a, group_workload(workload, n_enc)),
             ProgramPlan(llm, n - n_enc, n_enc, b, group_workload(workload, n - n_enc)))
    times = [a.step_s, b.step_s]
    return MpmdResult(plans, step, fill, transfer, max(times) / min(times), len(ps.memo))


def balance_points(first_s: Callable[[int], float], second_s: Callable[[int], float], sizes: Sequence[int],
                   n: int, rounds: int = 4) -> list[int]:
    """Indices into `sizes` around the balance first_s(c) = second_s(c) of two programs on c and n - c devices.

    Each round moves to where the two would balance if each program's device-seconds stayed what they
    were at the last size (time inversely proportional to devices, a secant step on the balance); it stops
    when the size repeats. Then the neighbour on the side of the slower program is added, since sizes are
    discrete and the times are not exactly inverse. A program that fits nowhere on a size gets more devices.
    """
    last = len(sizes) - 1
    k = min(range(len(sizes)), key=lambda i: (abs(sizes[i] - n / 2), i))
    for _ in range(rounds):
        a, b = first_s(sizes[k]), second_s(sizes[k])
        if not math.isfinite(a) or not math.isfinite(b):
            step = (1 if not math.isfinite(a) else 0) - (1 if not math.isfinite(b) else 0)
            if step == 0 or not 0 <= k + step <= last:
                return [k]
            k += step
            continue
        wa, wb = a * sizes[k], b * (n - sizes[k])
        target = n * wa / (wa + wb)
        nxt = min(range(len(sizes)), key=lambda i: (abs(sizes[i] - target), i))
        if nxt == k:
            break
        k = nxt
    a, b = first_s(sizes[k]), second_s(sizes[k])
    other = k + 1 if a > b else k - 1
    return sorted({k} | ({other} if 0 <= other <= last else set()))


def pair_step(graph: Graph, backbone: Program, cluster: Cluster, workload: Workload, n_first: int,
              a: Candidate, b: Candidate) -> tuple[float, float, float]:
    """(step, fill, exposed hand-over) of programs scored `a` on the first `n_first` devices and `b` on the rest."""
    n_second = cluster.n_devices - n_first
    wl_a, wl_b = group_workload(workload, n_first), group_workload(workload, n_second)
    m_a, m_b = a.strategy.micro_batches(wl_a), b.strategy.micro_batches(wl_b)
    fill = pipeline_fill_s(a.step_s, m_a, b.step_s, m_b)
    transfer = handover_s(graph, backbone, cluster, workload, n_first, m_a, m_b)
    return max(a.step_s, b.step_s) + fill + transfer, fill, transfer


def handover_s(graph: Graph, backbone: Program, cluster: Cluster, workload: Workload, n_first: int,
               units_a: int, units_b: int) -> float:
    """Exposed time of handing the encoders' outputs to the backbone group.

    One hand-over unit (the coarser program's micro-batch) is spread over the devices of each group; the
    smaller group's share per device sets the time. Only the first unit's features (and, in training, the
    last unit's gradients, the same shape, going back) wait: the others travel behind compute."""
    n_second = cluster.n_devices - n_first
    unit_samples = workload.global_batch / max(1, min(units_a, units_b))
    per_device = unit_samples / min(n_first, n_second)
    one = transfer_s(graph, backbone, cluster, n_first, per_device)
    return one * (2 if workload.mode == "train" else 1)


def transfer_s(graph: Graph, backbone: Program, cluster: Cluster, first_rank: int, micro_batch: float) -> float:
    """Seconds to send `micro_batch` samples' encoder outputs from one device to the backbone group, whose first
    rank is `first_rank`."""
    per_sample = boundary_bytes(graph, backbone.graph) / max(1, graph_batch(graph))
    spans = place_group(cluster, 2, stride=first_rank) if cluster.n_devices > first_rank else ()
    return send_recv_s(per_sample * micro_batch, spans) if spans else 0.0


def exact_programs(result: MpmdResult, cluster: Cluster, workload: Workload) -> tuple[list[dict], dict]:
    """Re-estimate each program on its own (as `plan` does for SPMD) and combine them into the plan's figures."""
    if result.kind == "experts":
        from planner.search.moe_programs import report_moe_programs

        return report_moe_programs(result, cluster, workload)
    groups = [(p.program, p.devices, p.first_rank, p.best.strategy) for p in result.programs]
    return score_groups(groups, cluster, workload, result.transfer_s)


def score_groups(groups: Sequence[tuple[Program, int, int, Strategy]], cluster: Cluster, workload: Workload,
                 transfer: float, pins: Sequence[Mapping[str, int] | None] = ()) -> tuple[list[dict], dict]:
    """Estimate each (program, devices, first rank, strategy) on its own group and combine them.

    Returns (programs, overall): `overall` has the Estimate fields for the whole model, its breakdown that of
    the slower program plus the MPMD fill and transfer, so it still adds up to the step time. `pins[k]` fixes
    parameter layouts of program k (see `stage_costs`), as a hand-edited declaration asks. Each group is timed
    on its share of the batch rounded up (`program_groups.group_workload`); throughput counts the real batch.
    """
    from planner.costing.estimate import estimate

    progs, ests, scale = [], [], []
    for k, (program, devices, first, strategy) in enumerate(groups):
        group = group_cluster(cluster, devices)
        wl = group_workload(workload, devices)
        est = estimate(program.graph, program.structure, group, wl, strategy,
                       param_pins=pins[k] if k < len(pins) else None)
        ests.append(est)
        scale.append(workload.global_batch / wl.global_batch)
        progs.append(program_entry(program, devices, first, group, strategy, est))
    slow = max(range(len(ests)), key=lambda i: (ests[i].step_time_s, i))
    fast = 1 - slow if len(ests) == 2 else slow
    fill = pipeline_fill_s(ests[slow].step_time_s, ests[slow].microbatches, ests[fast].step_time_s,
                           ests[fast].microbatches)
    step = ests[slow].step_time_s + fill + transfer
    bd = dict(ests[slow].breakdown_s)
    bd["mpmd_fill"] = fill
    bd["mpmd_transfer"] = transfer
    flops = sum(e.model_flops_per_step * s for e, s in zip(ests, scale))
    return progs, combined_figures(ests, step, bd, flops, cluster, workload)


def program_entry(program: Program, devices: int, first: int, group: Cluster, strategy: Strategy, est: Any) -> dict:
    """One program as the plan reports it: its ranks, strategy, mesh on its group and its own estimate."""
    from planner.costing.estimate import plain
    from planner.plan import mesh_axes, strategy_dict

    return plain({
        "name": program.name, "submodels": list(program.submodels), "devices": devices,
        "ranks": [first, first + devices - 1], "strategy": strategy_dict(strategy),
        "mesh": list(mesh_axes(group, strategy)), "estimate": est.to_dict(),
    })


def combined_figures(ests: Sequence[Any], step: float, breakdown: Mapping[str, float], flops: float,
                     cluster: Cluster, workload: Workload) -> dict:
    """The Estimate fields of a multi-program plan: throughput of the whole model, memory of the fullest group."""
    from planner.costing.estimate import plain

    n = cluster.n_devices
    peak = cluster.device.peak_flops(workload.dtype)
    worst = max(ests, key=lambda e: e.memory_bytes["peak"])
    times = [e.step_time_s for e in ests]
    return plain({
        "step_time_s": step, "tokens_per_s": workload.tokens / step, "tflops_per_device": flops / step / n / 1e12,
        "mfu": flops / (step * n * peak), "model_flops_per_step": flops, "microbatches": ests[-1].microbatches,
        "fits": all(e.fits for e in ests), "hbm_gib": worst.hbm_bytes / 2**30, "over_gib": worst.over_bytes / 2**30,
        "memory_gib": {k: v / 2**30 for k, v in sorted(worst.memory_bytes.items())},
        "breakdown_s": dict(sorted(breakdown.items())), "stages": [], "layouts": {},
        "solver_gap": max(e.solver_gap for e in ests),
        "imbalance": max(times) / min(times),
    })
