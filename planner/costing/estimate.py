"""A strategy of a graph on a cluster -> step time, throughput, MFU, memory, and where the time goes.

Op by op, from the graph's own FLOPs and bytes: each op's time is a roofline
with the cluster's efficiency curves, at the micro-batch and shard it runs
on. Tensor parallelism is applied to the graph by the intra-op solver over
the tensor axis, which on a transformer block lands on Megatron-LM's layout
(column-parallel QKV and first MLP matmul, row-parallel output projections);
`--sp` keeps the residual stream split by sequence between layers
(Korthikanti 2022), otherwise it stays replicated. Layers are cut into
pipeline stages, and the schedule, DP gradient reduction, optimizer step
and offload traffic are added as in Narayanan 2021. Every figure in the
breakdown adds up to the step time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from cost_models import Cluster
from cost_models.offload import offload_tier

from planner.costing.attention import heads_problem
from planner.costing.execution import Execution
from planner.costing.graph_facts import GraphFacts
from planner.errors import InvalidInput
from planner.graph.blocks import Structure
from planner.graph.ir import Graph
from planner.graph.moe import ep_problem
from planner.costing.stage_costs import StageCosts, stage_costs
from planner.search.solve import WALL_LIMIT_S
from planner.strategy import Strategy, Workload
from planner.costing.step_time import step_breakdown

GIB = 2.0**30


@dataclass(frozen=True, slots=True)
class StageEstimate:
    """One pipeline stage: its layers, per-micro-batch times and per-device memory."""

    index: int
    layers: tuple[str, ...]
    devices: int
    forward_s: float
    backward_s: float
    memory_bytes: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class Estimate:
    """The figures of one strategy; `breakdown_s` adds up to `step_time_s`."""

    step_time_s: float
    tokens_per_s: float
    tflops_per_device: float
    mfu: float
    model_flops_per_step: float
    memory_bytes: Mapping[str, float]  # the worst stage, per device: peak, params, grads, optimizer, activations
    hbm_bytes: float
    fits: bool
    breakdown_s: Mapping[str, float]
    stages: tuple[StageEstimate, ...]
    layouts: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: per block type, the routed experts' weights as the strategy splits them (`expert_layouts`): `layouts`
    #: holds the layout program's tensor-axis choice for them, which the expert split overrides
    expert_layouts: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    microbatches: int = 1
    solver_gap: float = 0.0
    offload: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # per memory class moved off HBM
    shortfall: Shortfall | None = None  # the tier that does not hold its share, when `fits` is False

    @property
    def over_bytes(self) -> float:
        return max(0.0, self.memory_bytes["peak"] - self.hbm_bytes)

    def to_dict(self) -> dict:
        g = {k: v / GIB for k, v in self.memory_bytes.items()}
        return plain({
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_device": self.tflops_per_device,
            "mfu": self.mfu,
            "model_flops_per_step": self.model_flops_per_step,
            "microbatches": self.microbatches,
            "fits": self.fits,
            "hbm_gib": self.hbm_bytes / GIB,
            "over_gib": self.over_bytes / GIB,
            "short_of": self.shortfall.to_dict() if self.shortfall else None,
            "memory_gib": dict(sorted(g.items())),
            "breakdown_s": dict(sorted(self.breakdown_s.items())),
            "stages": [
                {"stage": s.index, "devices": s.devices, "layers": len(s.layers), "first_layer": s.layers[0] if s.layers else None,
                 "last_layer": s.layers[-1] if s.layers else None, "forward_s": s.forward_s, "backward_s": s.backward_s,
                 "memory_gib": {k: v / GIB for k, v in sorted(s.memory_bytes.items())}}
                for s in self.stages
            ],
            "layouts": {k: dict(v) for k, v in sorted(self.layouts.items())},
            "expert_layouts": {k: dict(v) for k, v in sorted(self.expert_layouts.items())},
            "solver_gap": self.solver_gap,
            "offload": {cls: {"fraction": v["fraction"], "offloaded_gib": v["offloaded_bytes"] / GIB,
                              "traffic_gib_per_step": v["traffic_bytes"] / GIB, "exposed_s": v["exposed_s"]}
                        for cls, v in sorted(self.offload.items())},
        })


def plain(obj):
    """The same structure with numpy scalars as Python numbers, so YAML and JSON writers take it."""
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):
        return obj.item()
    return obj


@dataclass(frozen=True, slots=True)
class Shortfall:
    """A memory tier that cannot hold what a stage puts in it, per device: HBM, or the tier offload goes to."""

    tier: str  # "HBM", the offload tier's name (e.g. "host", "pooled-dram"), or "" when the cluster has none
    need_bytes: float
    have_bytes: float

    @property
    def over_bytes(self) -> float:
        return self.need_bytes - self.have_bytes

    def sentence(self) -> str:
        """What is over, in numbers: '117.3 GiB of HBM per device, 128 GiB usable' or, off HBM,
        '263.6 GiB offloaded per device, pooled-dram holds 192 GiB'."""
        need, have = self.need_bytes / GIB, self.have_bytes / GIB
        if self.tier == "HBM":
            return f"{need:.1f} GiB of HBM per device, {have:.4g} GiB usable"
        if not self.tier:
            return f"{need:.1f} GiB offloaded per device, and the cluster has no memory tier beyond HBM"
        return f"{need:.1f} GiB offloaded per device, {self.tier} holds {have:.4g} GiB"

    def to_dict(self) -> dict:
        return {"tier": self.tier, "need_gib": self.need_bytes / GIB, "have_gib": self.have_bytes / GIB,
                "why": self.sentence()}


def memory_shortfall(cluster: Cluster, memory_bytes: Mapping[str, float], execution: Execution) -> Shortfall | None:
    """None when the stage fits: the HBM the stack can hand out (less its allocator's and runtime's reserve)
    holds the peak, and the host/pooled tier holds what was offloaded to it; else the tier that is short."""
    usable = execution.usable_hbm_bytes(cluster.device.hbm_bytes)
    if memory_bytes["peak"] > usable:
        return Shortfall("HBM", memory_bytes["peak"], usable)
    offloaded = sum(v for k, v in memory_bytes.items() if k.startswith("offloaded_"))
    if offloaded <= 0:
        return None
    tier = offload_tier(cluster)
    if tier is None:
        return Shortfall("", offloaded, 0.0)
    return Shortfall(tier.name, offloaded, tier.capacity_bytes) if offloaded > tier.capacity_bytes else None


def fits_memory(cluster: Cluster, memory_bytes: Mapping[str, float], execution: Execution) -> bool:
    """Whether every tier holds what the stage puts in it (`memory_shortfall`)."""
    return memory_shortfall(cluster, memory_bytes, execution) is None


def worst_shortfall(cluster: Cluster, stages_memory, execution: Execution) -> Shortfall | None:
    """The stage's shortfall that is over by the most (HBM before another tier), or None when all fit."""
    short = [s for s in (memory_shortfall(cluster, m, execution) for m in stages_memory) if s is not None]
    return max(short, key=lambda s: (s.tier == "HBM", s.over_bytes), default=None)


def retries_layouts(short: Shortfall | None) -> bool:
    """Whether to solve the layouts again under the integer program's memory rows, which hold HBM only: where a
    stage is over HBM (`worst_shortfall` names HBM first); a shortfall of the offload tier alone is not one the
    rows see (what the plan moves there is its offload fractions of what HBM would hold)."""
    return short is not None and short.tier == "HBM"


def check_devices(cluster: Cluster, strategy: Strategy) -> None:
    if strategy.devices != cluster.n_devices:
        s = strategy
        what = (f"stages of tensor degrees {'+'.join(map(str, s.stage_tp))} x cp {s.cp} x dp {s.dp}" if s.stage_tp
                else f"tp x cp x dp x pp = {s.tp} x {s.cp} x {s.dp} x {s.pp}")
        raise InvalidInput(f"{what} = {s.devices} devices, but the cluster has {cluster.n_devices}; "
                           f"pass --devices {s.devices} or change the degrees")


def check_heads(strategy: Strategy, facts: GraphFacts) -> None:
    """InvalidInput unless tp divides every attention layer's query heads (`attention.heads_problem`); stages of
    their own tensor widths are checked where they are cut."""
    if strategy.tp > 1 and not strategy.stage_tp:
        if why := heads_problem(strategy.tp, (r.heads for r in facts.regions)):
            raise InvalidInput(why)


def check_experts(strategy: Strategy, facts: GraphFacts) -> None:
    """InvalidInput unless ep divides the routed experts of every MoE layer (`moe.ep_problem`), and ep or etp needs
    routed experts at all."""
    ep = strategy.ep
    if ep == 1 and strategy.expert_tp == strategy.tp:
        return
    counts = sorted({f.experts for f in facts.moe.values()})
    if not counts:
        flag = f"--ep {ep}" if ep > 1 else f"--etp {strategy.etp}"
        raise InvalidInput(f"{flag}: the model has no routed experts (no MoE layer was found), so there is nothing "
                           "to split over an expert-parallel group; drop it")
    if why := ep_problem(ep, counts):
        raise InvalidInput(why)


def expert_layouts(structure: Structure, layouts: Mapping[str, Mapping[str, str]], routed: frozenset[str],
                   strategy: Strategy) -> dict[str, dict[str, str]]:
    """The rows of `layouts` that are routed experts' weights, named as `block_costs.layout_table` names them
    (relative to their block, or absolute), labelled as the strategy splits them: `EP<n>` the experts dealt over n
    ranks, `ETP<n>` each expert's weight split over n (Megatron-Core's grouped GEMMs: the first column-, the
    second row-wise), `R` whole and on every rank."""
    parts = [f"EP{strategy.ep}"] if strategy.ep > 1 else []
    parts += [f"ETP{strategy.expert_tp}"] if strategy.expert_tp > 1 else []
    label = "·".join(parts) or "R"
    out: dict[str, dict[str, str]] = {}
    for btype in structure.types:
        rows = layouts.get(btype.label, {})
        for inst in btype.instances:
            blk = structure.block(inst)
            for p in sorted(routed & set(blk.params)):
                rel = p[len(blk.name) + 1:] if p.startswith(blk.name + ".") else p
                # a later instance's row is named absolutely where its layout differs
                for name in sorted({rel, p} & rows.keys()):
                    out.setdefault(btype.label, {})[name] = label
    return out


def estimate(
    graph: Graph,
    structure: Structure,
    cluster: Cluster,
    workload: Workload,
    strategy: Strategy,
    *,
    time_limit_s: float = WALL_LIMIT_S,
    param_pins: Mapping[str, int] | None = None,
    facts: GraphFacts | None = None,
    solver: str = "highs",
) -> Estimate:
    """Score one strategy: the numbers `hyperplan estimate` prints (`param_pins`: see `stage_costs`; pass the
    same `facts` to score many strategies of one graph)."""
    check_devices(cluster, strategy)
    facts = facts or GraphFacts(graph, structure)  # once, for the checks and every costing below
    check_experts(strategy, facts)
    check_heads(strategy, facts)
    m = strategy.micro_batches(workload)
    costs: StageCosts = stage_costs(graph, structure, cluster, workload, strategy, time_limit_s=time_limit_s,
                                    param_pins=param_pins, facts=facts, solver=solver)
    short = worst_shortfall(cluster, (s.memory_bytes for s in costs.stages), workload.execution)
    if retries_layouts(short):  # the fastest layouts do not fit in HBM: the fastest that do
        costs = stage_costs(graph, structure, cluster, workload, strategy, time_limit_s=time_limit_s,
                            param_pins=param_pins, memory_constraint=True, facts=facts, solver=solver)
        short = worst_shortfall(cluster, (s.memory_bytes for s in costs.stages), workload.execution)
    bd, step, offload = step_breakdown(costs, cluster, workload, strategy, m)
    if strategy.tp > 1 and strategy.zero >= 3 and workload.mode == "train" and bd["dp_comm"] + bd["offload"] > 0:
        # the layout program leaves out what ZeRO-3 moves per micro-batch (each weight's gathers and gradient
        # scatter, and the activations offload shares the compute that hides them with); where some of it
        # shows, the layouts that weigh the weights' traffic too, if they make a faster step
        alt = stage_costs(graph, structure, cluster, workload, strategy, time_limit_s=time_limit_s,
                          param_pins=param_pins, memory_constraint=retries_layouts(short), facts=facts, solver=solver,
                          weight_traffic=True)
        alt_short = worst_shortfall(cluster, (s.memory_bytes for s in alt.stages), workload.execution)
        alt_bd, alt_step, alt_offload = step_breakdown(alt, cluster, workload, strategy, m)
        if (alt_short is None, not retries_layouts(alt_short), -alt_step) > \
                (short is None, not retries_layouts(short), -step):  # fits, then within HBM, then faster
            costs, short, bd, step, offload = alt, alt_short, alt_bd, alt_step, alt_offload

    peak = cluster.device.peak_flops(workload.dtype)
    model_flops = 3.0 * costs.forward_flops_per_sample * workload.global_batch
    if workload.mode == "infer":
        model_flops = costs.forward_flops_per_sample * workload.global_batch
    n = cluster.n_devices
    stages = tuple(
        StageEstimate(index=s.index, layers=s.layers, devices=strategy.tp_of_stage(s.index) * strategy.dp * strategy.cp,
                      forward_s=s.forward_s,
                      backward_s=s.backward_s, memory_bytes=s.memory_bytes)
        for s in costs.stages
    )
    worst = max(stages, key=lambda s: (s.memory_bytes["peak"], -s.index))
    return Estimate(
        step_time_s=step,
        tokens_per_s=workload.tokens / step,
        tflops_per_device=model_flops / step / n / 1e12,
        mfu=model_flops / (step * n * peak),
        model_flops_per_step=model_flops,
        memory_bytes=dict(worst.memory_bytes),
        hbm_bytes=workload.execution.usable_hbm_bytes(cluster.device.hbm_bytes),
        fits=short is None,
        breakdown_s=bd,
        stages=stages,
        layouts=costs.layouts,
        expert_layouts=expert_layouts(structure, costs.layouts, facts.expert_params, strategy),
        microbatches=m,
        solver_gap=costs.solver_gap,
        offload=offload,
        shortfall=short,
    )


__all__ = ["Estimate", "Shortfall", "StageEstimate", "check_devices", "check_experts", "estimate", "fits_memory",
           "memory_shortfall", "retries_layouts", "worst_shortfall"]
