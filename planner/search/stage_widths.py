"""Pipeline stages with different device counts: give the heavy stages more tensor ranks.

A uniform pipeline gives every stage the same mesh, so the stage with the
embedding or the vocabulary head, or a device count that does not factor
into equal stages, leaves devices waiting on the slowest stage. Here each
stage of one pipeline replica picks its own tensor-parallel width (any
that divides the replica's tensor ranks and the heads) and its layers, with
the widths adding up to the replica's tensor ranks: `pipeline.unequal_split`
solves that exactly from per-layer costs measured at each width, and the
planner then scores the cut like any other strategy.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from cost_models import Cluster
from cost_models.memory import inflight_microbatches

from planner.graph.blocks import Structure
from planner.search.pipeline import WidthCosts, unequal_split
from planner.costing.execution import Execution
from planner.costing.stage_costs import StageCosts
from planner.costing.stage_memory import stage_memory
from planner.strategy import Strategy, Workload

Costing = Callable[[Strategy], StageCosts]
"""Costs a strategy (shared graph facts and solved layouts): `stage_costs` bound to one graph and cluster."""


def edge_blocks(structure: Structure) -> tuple[list[str], list[str]]:
    """The blocks that are not layers before the first layer (they ride with the first stage: the embedding)
    and after the last (with the last stage: final norm, head)."""
    layers = structure.layers()
    first_node = min(layers[0].nodes) if layers[0].nodes else 0
    last_node = max(layers[-1].nodes) if layers[-1].nodes else 0
    rest = [b for b in structure.blocks if not b.is_layer and b.nodes]
    return ([b.name for b in rest if min(b.nodes) < first_node], [b.name for b in rest if min(b.nodes) > last_node])


def width_costs(structure: Structure, costs: StageCosts, strategy: Strategy, training: bool,
                width: float, execution: Execution) -> WidthCosts:
    """Per-layer time and memory of a costing at one tensor width, with the embedding's and the head's apart."""
    layers = structure.layers()

    def state(name: str) -> float:
        dense, expert = costs.block_params.get(name, (0.0, 0.0))
        return stage_memory(dense, expert, 0.0, strategy, training, width, execution)["peak"]

    def act(name: str) -> float:  # per micro-batch in flight: all but the loss's
        kept = costs.block_act_bytes.get(name, 0.0) - costs.block_loss_bytes.get(name, 0.0)
        return stage_memory(0.0, 0.0, kept, strategy, training, width, execution)["peak"]

    def once(name: str) -> float:  # the loss's tensors: one micro-batch at a time
        return stage_memory(0.0, 0.0, costs.block_loss_bytes.get(name, 0.0), strategy, training, width,
                            execution)["peak"]

    first, last = edge_blocks(structure)
    return WidthCosts(
        tp=strategy.tp,
        layer_s=[costs.block_s.get(b.name, 0.0) for b in layers],
        layer_state_bytes=[state(b.name) for b in layers],
        layer_act_bytes=[act(b.name) for b in layers],
        first_s=sum(costs.block_s.get(n, 0.0) for n in first),
        last_s=sum(costs.block_s.get(n, 0.0) for n in last),
        first_bytes=(sum(map(state, first)), sum(map(act, first)), sum(map(once, first))),
        last_bytes=(sum(map(state, last)), sum(map(act, last)), sum(map(once, last))),
        layer_once_bytes=[once(b.name) for b in layers],
    )


def candidate_widths(base: Strategy, tp_limit: int, heads: tuple[int, ...] = ()) -> list[int]:
    """Every width a stage may take: a divisor of the replica's tensor ranks (base.tp x base.pp) within
    `tp_limit` that divides the attention heads and still folds the experts (ep x etp must divide the stage's
    tp x cp x dp ranks: a narrower stage has fewer)."""
    def folds(w: int) -> bool:
        return (w * base.cp * base.dp) % (base.ep * (base.etp or w)) == 0

    budget = base.tp * base.pp
    return [w for w in range(1, min(budget, tp_limit) + 1)
            if budget % w == 0 and folds(w) and all(h % w == 0 for h in heads)]


def unequal_stage_strategies(structure: Structure, cluster: Cluster, workload: Workload, base: Strategy,
                             costing: Costing, tp_limit: int, width: float,
                             heads: tuple[int, ...] = ()) -> list[Strategy]:
    """Strategies whose stages differ in width, one per stage count around `base.pp`; [] when none can.

    Widths are every divisor of the replica's tensor ranks (base.tp x base.pp) that a stage can take
    (`candidate_widths`); those ranks are kept, so the data-parallel degree and micro-batches do not change.
    """
    if base.pp < 2 or base.vpp > 1 or base.full_recompute_layers or base.stage_tp:
        return []
    training = workload.mode == "train"
    budget = base.tp * base.pp
    widths = candidate_widths(base, tp_limit, heads)
    if len(widths) < 2:
        return []
    per_width = {}
    for w in widths:
        s = replace(base, tp=w, sp=base.sp and w > 1, stage_layers=())
        per_width[w] = width_costs(structure, costing(s), s, training, width, workload.execution)
    m = base.schedule_micro_batches(workload)
    n_layers = len(structure.layers())
    out = []
    for n_stages in sorted({base.pp - 1, base.pp, base.pp + 1}):
        if n_stages < 2 or n_stages > n_layers:
            continue
        held = [inflight_microbatches(base.schedule, pp=n_stages, microbatches=m, stage=c) if training else 1.0
                for c in range(n_stages)]
        cut = unequal_split(list(per_width.values()), n_stages, budget, held,
                            workload.execution.usable_hbm_bytes(cluster.device.hbm_bytes))
        if cut is None:
            continue
        sizes, tps = cut
        if len(set(tps)) == 1:
            continue  # uniform widths: the balanced cut of the plain search covers it
        out.append(replace(base, pp=n_stages, tp=max(tps), stage_tp=tps, stage_layers=sizes,
                           sp=base.sp and max(tps) > 1))
    return out
