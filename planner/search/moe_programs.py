"""HyperMPMD in MoE layers: attention on one device group, the routed experts on another.

Disaggregated expert parallelism as MegaScale-Infer serves MoE models (Zhu
et al., arXiv 2504.02263, 2025, sections 3-4), here in training: the
attention group runs everything but the routed experts (embedding,
attention, router, shared experts, dense layers, head) with its own mesh,
found by the same search (`plan_search.search`) on that subgraph, one
pipeline stage; the expert group holds the routed experts (`moe_split`).
Every MoE layer, tokens leave the attention group after the router
(dispatch), are computed on the expert group and come back (combine): per
layer and direction, tokens x top_k x hidden x width bytes cross between
the groups, and the same again for their gradients in backward.

Micro-batches are ping-ponged: k of them are in flight at once, and while
the experts compute one the attention group computes another. k jobs
circulating through two servers and two links form a closed loop, whose
cycle per layer is set by its busiest server or by one job's round trip
(the condition MegaScale-Infer states for full overlap):

    cycle = max(k a, k e, k c, a + e + c_dispatch + c_combine)   per micro-batch: a, e, c

k = 1 is no ping-pong: the groups take turns. Each group keeps the
activations of the k micro-batches in flight. The step is

    step = micro-batches x attention's work outside the MoE layers
           + rounds x (cycles of every MoE layer, forward and backward)
           + the slower group's tail (gradient reduction, optimizer; each group runs its own)

The split is chosen by scoring expert-group sizes: the expert group is
analytic, attention is searched at the size where the FLOPs would balance,
then at the sizes that look best with attention time inversely
proportional to its devices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from cost_models import Cluster, place_group
from cost_models.collectives import send_recv_s

from planner.costing.estimate import fits_memory
from planner.graph.blocks import Structure
from planner.graph.ir import Graph
from planner.graph.moe import expert_params
from planner.graph.subgraph import extract
from planner.costing.graph_facts import GraphFacts
from planner.search.moe_split import ExpertGroup, MoeSplit, expert_flops, expert_group, split_moe
from planner.search.mpmd import MpmdResult, Program, ProgramPlan, ProgramSearch
from planner.search.plan_search import Budget, Candidate
from planner.search.program_groups import group_cluster, group_unit, group_workload
from planner.costing.stage_costs import DTYPE_WIDTH, stage_costs
from planner.strategy import Strategy, Workload

#: Most micro-batches in flight between the groups (MegaScale-Infer uses 2 to 4).
MAX_IN_FLIGHT = 4
#: Expert-group sizes timed with a full search of the attention program (the others by proportion only).
SEARCHED_SPLITS = 3
#: Splits predicted more than this much slower than the single-program plan are not searched (the prediction
#: is optimistic: attention's device-seconds scaled perfectly; 10% covers layouts a larger group may afford).
PRUNE_MARGIN = 1.1

Progress = Callable[[str, float], None]


def cycle_s(attn_s: float, expert_s: float, dispatch_s: float, combine_s: float, in_flight: int) -> float:
    """One MoE layer of `in_flight` ping-ponged micro-batches, from per-micro-batch times: the busiest server
    (attention, experts, the link, full duplex) or one micro-batch's round trip, whichever is longer."""
    k = in_flight
    return max(k * attn_s, k * expert_s, k * max(dispatch_s, combine_s), attn_s + expert_s + dispatch_s + combine_s)


@dataclass(frozen=True, slots=True)
class SplitScore:
    """Attention on the first `attention_devices` devices, experts on the rest: the step and its parts."""

    attention_devices: int
    attention: Candidate
    in_flight: int
    experts: ExpertGroup
    step_s: float
    attention_busy_s: float  # the attention group's own work per step, waits excluded
    attention_tail_s: float
    expert_busy_s: float
    link_busy_s: float  # dispatch and combine time per step on the link between the groups (mostly hidden)
    traffic_bytes: float  # bytes crossing between the groups per step: both ways, forward and backward
    fits: bool

    @property
    def imbalance(self) -> float:
        times = (self.attention_busy_s + self.attention_tail_s, self.expert_busy_s + self.experts.tail_s)
        return max(times) / min(times) if min(times) > 0 else math.inf


def score_split(split: MoeSplit, facts: GraphFacts, attn_facts: GraphFacts, cluster: Cluster, workload: Workload,
                n_attention: int, attention: Candidate, in_flight: int) -> SplitScore:
    """The step of attention planned as `attention` (one pipeline stage) on the first `n_attention` devices and
    the routed experts on the rest, `in_flight` micro-batches ping-ponged between them."""
    s = attention.strategy
    if s.pp != 1 or in_flight < 1:
        raise ValueError(f"attention must be one pipeline stage and in_flight >= 1, got pp={s.pp}, {in_flight}")
    n_exp = cluster.n_devices - n_attention
    wl = group_workload(workload, n_attention)
    m = s.micro_batches(wl)
    samples = wl.global_batch / m  # one micro-batch of every attention replica goes to the experts at once
    group = group_cluster(cluster, n_attention)
    costs = stage_costs(split.attention.graph, split.attention.structure, group, wl, s, facts=attn_facts)
    st = costs.stages[0]
    per_mb = st.forward_s + st.backward_s
    fwd_share = st.forward_s / per_mb if per_mb > 0 else 1 / 3
    k = min(in_flight, m)
    experts = expert_group(split, facts, group_cluster(cluster, n_exp), workload, n_exp, samples, m, k)
    spans = place_group(cluster, 2, stride=n_attention)
    scale = DTYPE_WIDTH.get(workload.dtype, 2.0) / facts.work.float_bytes * samples / min(n_attention, n_exp)
    rounds = [k] * (m // k) + ([m % k] if m % k else [])
    moe_attn = cycles = link = traffic = 0.0
    for name, (e_f, e_b) in sorted(experts.layer_s.items()):
        a = costs.block_s.get(name, 0.0)
        c_d = send_recv_s(split.dispatch_bytes[name] * scale, spans)  # one micro-batch's tokens to the experts
        c_c = send_recv_s(split.combine_bytes[name] * scale, spans)  # and back
        # backward: the combine's gradients go to the experts, the dispatch's come back
        for r in rounds:
            cycles += cycle_s(a * fwd_share, e_f, c_d, c_c, r) + cycle_s(a * (1 - fwd_share), e_b, c_c, c_d, r)
        moe_attn += a
        link += 2 * m * (c_d + c_c)
        traffic += 2 * (split.dispatch_bytes[name] + split.combine_bytes[name]) * samples * m
    other = m * max(0.0, per_mb - moe_attn)  # embedding, dense layers, head: attention alone
    tail_a = max(0.0, attention.step_s - m * per_mb)
    step = other + cycles + max(tail_a, experts.tail_s)
    mem = dict(attention.memory_bytes)
    extra = (k - 1) * mem.get("activations", 0.0)  # the other micro-batches in flight keep theirs too
    mem["activations"] = mem.get("activations", 0.0) + extra
    mem["peak"] = mem.get("peak", attention.peak_bytes) + extra
    fits = attention.fits and fits_memory(group, mem, workload.execution) and experts.fits
    real = workload.global_batch / wl.global_batch
    return SplitScore(n_attention, attention, k, experts, step, m * per_mb, tail_a, experts.busy_s(m), link,
                      traffic * real, fits)


def expert_group_sizes(cluster: Cluster, experts: int) -> list[int]:
    """Expert-group sizes: whole groups of the fabric (`group_unit`) that hold an equal whole share of the
    experts each (a divisor of them) or whole replicas of them (a multiple), leaving at least one unit for
    attention: the expert program's ep then divides the experts, as every backend splits them."""
    n, unit = cluster.n_devices, group_unit(cluster)
    return [c for c in range(unit, n, unit) if (experts % c == 0 or c % experts == 0) and (n - c) % unit == 0]


class MoeSplitSearch:
    """Scores attention | experts splits of one model on one cluster; each split's attention searched once."""

    def __init__(self, graph: Graph, structure: Structure, cluster: Cluster, workload: Workload, split: MoeSplit,
                 facts: GraphFacts, *, time_limit_s: float | None = None, allow_offload: bool = True,
                 progress: Progress | None = None, budget=None) -> None:
        self.graph, self.structure, self.cluster, self.workload = graph, structure, cluster, workload
        self.split, self.facts = split, facts
        self.ps = ProgramSearch(cluster, workload, allow_offload, progress, budget or Budget(time_limit_s))
        self.attn_facts = self.ps.facts_of(split.attention)
        self.scored: dict[int, SplitScore | None] = {}
        # expert groups too small for their experts' states and one sample per attention device (the least
        # a micro-batch can be) are not worth a search of attention; a larger group holds fewer experts and
        # fewer tokens per device, so the sizes that fit are a suffix, found by bisection
        n = cluster.n_devices
        sizes = expert_group_sizes(cluster, split.experts)
        lo, hi = 0, len(sizes)  # sizes[hi:] fit
        while lo < hi:
            mid = (lo + hi) // 2
            if expert_group(split, facts, group_cluster(cluster, sizes[mid]), workload, sizes[mid], n - sizes[mid],
                            1).fits:
                hi = mid
            else:
                lo = mid + 1
        self.sizes = sizes[hi:]

    def score(self, n_exp: int) -> SplitScore | None:
        """The best plan with `n_exp` expert devices: attention's best one-stage plan at each micro-batch size,
        with every number of micro-batches in flight (None when none fits)."""
        if n_exp not in self.scored:
            n_attn = self.cluster.n_devices - n_exp
            cand = self.ps.best(self.split.attention, n_attn, flat=True)
            variants = self.ps.micro_batch_variants(self.split.attention, n_attn, cand, frugal=True) if cand else []
            options = [score_split(self.split, self.facts, self.attn_facts, self.cluster, self.workload, n_attn, c, k)
                       for c in variants for k in range(1, MAX_IN_FLIGHT + 1)]
            self.scored[n_exp] = min((o for o in options if o.fits), default=None,
                                     key=lambda o: (o.step_s, o.attention.strategy.micro_batch, o.in_flight))
        return self.scored[n_exp]

    def best(self, incumbent_s: float | None = None) -> SplitScore | None:
        """Attention searched where the FLOPs balance, then at the sizes that look best by proportion.

        With `incumbent_s` (the single-program plan's step), the search stops after the first split when
        no split is predicted within `PRUNE_MARGIN` of it: the prediction scales attention's measured
        device-seconds perfectly and prices the experts exactly, so it errs on the optimistic side."""
        n, split, facts = self.cluster.n_devices, self.split, self.facts
        share = expert_flops(split, facts) * facts.work.batch / max(float(facts.work.flops.sum()), 1.0)
        probe = None
        for c in sorted(self.sizes, key=lambda c: (abs(c - n * share), c))[:SEARCHED_SPLITS]:
            probe = self.score(c)
            if probe is not None:
                break
        if probe is None:
            return None
        predicted = self.predicted(probe)
        if incumbent_s is not None and min(predicted.values()) > PRUNE_MARGIN * incumbent_s:
            return probe
        for n_exp in sorted(self.sizes, key=lambda c: (predicted[c], c))[:SEARCHED_SPLITS]:
            self.score(n_exp)
        # once more from the best split scored: its attention plan is the one the prediction should scale
        predicted = self.predicted(min((sc for sc in self.scored.values() if sc is not None),
                                       key=lambda sc: (sc.step_s, sc.attention_devices)))
        for n_exp in [c for c in sorted(self.sizes, key=lambda c: (predicted[c], c)) if c not in self.scored][:2]:
            self.score(n_exp)
        return min((sc for sc in self.scored.values() if sc is not None), default=None,
                   key=lambda sc: (sc.step_s, sc.attention_devices))

    def predicted(self, probe: SplitScore) -> dict[int, float]:
        """Each expert-group size's step as `probe` predicts it: attention's device-seconds there spread over
        the devices left to it, against the experts priced exactly at its micro-batches (inf: they do not fit)."""
        n, split, facts = self.cluster.n_devices, self.split, self.facts
        attn_device_s = (probe.attention_busy_s + probe.attention_tail_s) * probe.attention_devices
        m = probe.attention.strategy.micro_batches(group_workload(self.workload, probe.attention_devices))
        out = {}
        for n_exp in self.sizes:
            eg = expert_group(split, facts, group_cluster(self.cluster, n_exp), self.workload, n_exp,
                              self.workload.global_batch / m, m, probe.in_flight)
            out[n_exp] = max(attn_device_s / (n - n_exp), eg.busy_s(m) + eg.tail_s) if eg.fits else math.inf
        return out


def plan_moe_programs(
    graph: Graph,
    structure: Structure,
    cluster: Cluster,
    workload: Workload,
    *,
    time_limit_s: float | None = None,
    allow_offload: bool = True,
    progress: Progress | None = None,
    incumbent_s: float | None = None,
    budget=None,
) -> MpmdResult | None:
    """The best attention | experts plan in training, or None for a dense model (or when no split fits);
    `incumbent_s`: the step to beat, which lets hopeless splits go unsearched (`MoeSplitSearch.best`)."""
    if workload.mode != "train" or not expert_params(graph, structure):  # from the routers (a third of the facts)
        return None
    facts = GraphFacts(graph, structure)
    split = split_moe(graph, structure, facts)
    if split is None or split.experts < 1:
        return None
    search = MoeSplitSearch(graph, structure, cluster, workload, split, facts, time_limit_s=time_limit_s,
                            allow_offload=allow_offload, progress=progress, budget=budget)
    best = search.best(incumbent_s)
    return None if best is None else _result(split, graph, structure, facts, best, workload, len(search.scored))


def _result(split: MoeSplit, graph: Graph, structure: Structure, facts: GraphFacts, sc: SplitScore,
            workload: Workload, tried: int) -> MpmdResult:
    n_attn, n_exp = sc.attention_devices, sc.experts.devices
    sub = extract(graph, sorted(i for r in split.regions.values() for i in r), "experts")
    experts = Program("experts", tuple(s.name for s in structure.submodels), sub, split.attention.structure)
    cand = Candidate(expert_strategy(split, n_exp, sc.attention.strategy.micro_batch), sc.expert_busy_s
                     + sc.experts.tail_s, sc.experts.fits, sc.experts.memory_bytes["peak"],
                     {"compute": sc.expert_busy_s, "optimizer": sc.experts.tail_s},
                     memory_bytes=dict(sc.experts.memory_bytes))
    plans = (ProgramPlan(split.attention, n_attn, 0, sc.attention, group_workload(workload, n_attn)),
             ProgramPlan(experts, n_exp, n_attn, cand, workload))
    detail = {"traffic_bytes_per_step": float(sc.traffic_bytes), "link_busy_s": float(sc.link_busy_s),
              "in_flight": sc.in_flight, "expert_recompute": sc.experts.recompute,
              "attention_busy_s": float(sc.attention_busy_s),
              "expert_busy_s": float(sc.expert_busy_s),
              "expert_flops_per_step": expert_flops(split, facts) * workload.global_batch}
    return MpmdResult(plans, sc.step_s, sc.step_s - sc.attention.step_s, sc.link_busy_s, sc.imbalance, tried,
                      "experts", detail, (split, facts, sc.in_flight))


def expert_strategy(split: MoeSplit, devices: int, micro_batch: int = 1) -> Strategy:
    """The expert group as a strategy: expert-parallel over the experts it holds, data-parallel over replicas."""
    holders = min(devices, split.experts)  # experts spread over every device (the group sizes divide them evenly)
    return Strategy(dp=devices, ep=holders, zero=1 if devices > split.experts else 0, micro_batch=micro_batch)


@dataclass(frozen=True, slots=True)
class ExpertEstimate:
    """The expert group's figures, shaped as much like an `Estimate` as `combined_figures` reads."""

    step_time_s: float
    memory_bytes: dict
    hbm_bytes: float
    fits: bool
    microbatches: int
    solver_gap: float = 0.0

    @property
    def over_bytes(self) -> float:
        return max(0.0, self.memory_bytes["peak"] - self.hbm_bytes)


def report_moe_programs(result: MpmdResult, cluster: Cluster, workload: Workload) -> tuple[list[dict], dict]:
    """The plan's figures of an attention | experts plan, the attention program re-estimated exactly.

    The breakdown is the attention group's (it adds up to its own step) plus `mpmd_wait`, the time it
    waits on the experts and the link, so it still adds up to the step."""
    from planner.costing.estimate import estimate, plain
    from planner.plan import strategy_dict
    from planner.search.mpmd import combined_figures, program_entry

    split, facts, in_flight = result.source
    attn_plan, exp_plan = result.programs
    n_attn, prog, strategy = attn_plan.devices, attn_plan.program, attn_plan.best.strategy
    group = group_cluster(cluster, n_attn)
    wl = group_workload(workload, n_attn)
    est = estimate(prog.graph, prog.structure, group, wl, strategy)
    exact = replace(attn_plan.best, step_s=est.step_time_s, fits=est.fits, peak_bytes=est.memory_bytes["peak"],
                    memory_bytes=dict(est.memory_bytes))
    sc = score_split(split, facts, GraphFacts(prog.graph, prog.structure), cluster, workload, n_attn, exact,
                     in_flight)
    experts = ExpertEstimate(sc.expert_busy_s + sc.experts.tail_s, dict(sc.experts.memory_bytes),
                             group_cluster(cluster, exp_plan.devices).device.hbm_bytes, sc.experts.fits,
                             est.microbatches)
    bd = dict(est.breakdown_s)
    bd["mpmd_wait"] = max(0.0, sc.step_s - est.step_time_s)
    flops = est.model_flops_per_step * workload.global_batch / wl.global_batch + result.detail["expert_flops_per_step"]
    overall = combined_figures([est, experts], est.step_time_s + bd["mpmd_wait"], bd, flops, cluster, workload)
    overall["fits"] = sc.fits
    overall["imbalance"] = sc.imbalance
    progs = [
        program_entry(prog, n_attn, 0, group, strategy, est),
        plain({"name": exp_plan.program.name, "submodels": list(exp_plan.program.submodels),
               "devices": exp_plan.devices, "ranks": [n_attn, cluster.n_devices - 1],
               "strategy": strategy_dict(exp_plan.best.strategy),
               "estimate": {"step_time_s": experts.step_time_s, "fits": experts.fits, "tail_s": sc.experts.tail_s,
                            "memory_gib": {k: v / 2**30 for k, v in sorted(experts.memory_bytes.items())}}}),
    ]
    return progs, overall
