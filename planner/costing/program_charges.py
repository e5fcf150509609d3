"""Terms the layout program charges each dense weight beside a micro-batch's compute and tensor traffic.

A weight's tensor-axis layout sets how much of it each rank stores, and with it two costs the program
would otherwise not see: the optimizer step over the stored shard, once a step (`add_optimizer_steps`),
and under ZeRO-3 the data-parallel traffic of that shard every micro-batch (`add_weight_traffic`). Both
charge each weight's strategies in place, per parameter at a rate taken at the size of all dense weights.
"""

from __future__ import annotations

import numpy as np

from cost_models import Cluster, place_group
from cost_models.collectives import all_gather_s, reduce_scatter_s

from planner.costing.graph_facts import GraphFacts
from planner.costing.node_times import optimizer_step_s
from planner.graph.ir import Graph
from planner.strategy import Strategy, Workload


def _stored_shards(problem, graph: Graph, facts: GraphFacts, t: int) -> tuple[list, float]:
    """The dense weights' vars, each with the parameters it stores per tensor rank under each of its strategies
    (a weight left whole on the tensor axis stores all of it), and their total split t ways."""
    dense = [(v_i, np.array([graph.tensors[v.param].numel * v.count / (t if s.outputs[0] >= 0 else 1)
                             for s in v.strategies]))
             for v_i, v in enumerate(problem.vars) if v.param is not None and not facts.is_expert(v.param)]
    total = sum(graph.tensors[problem.vars[v_i].param].numel * problem.vars[v_i].count for v_i, _ in dense) / t
    return dense, total


def _charge(problem, dense: list, rate: float, share: float = 1.0) -> None:
    """Add `rate` seconds per parameter to each dense weight's strategies (in place), on `share` of what each
    stores."""
    for v_i, local in dense:
        problem.unary[v_i] = problem.unary[v_i] + rate * (local * share)


def add_optimizer_steps(problem, graph: Graph, facts: GraphFacts, cluster: Cluster, workload: Workload, t: int,
                        zero_shards: int, micro_batches: int, offloaded: float) -> None:
    """Charge each dense weight's strategies their share of the optimizer step (in place): the step over the
    shard they store (a weight left whole on the tensor axis is updated on every rank of it) over the step's
    micro-batches, as the program's other costs are one micro-batch's. The cost per parameter is taken at
    the size of all dense weights split t ways (`optimizer_step_s` is nearly linear there)."""
    dense, total = _stored_shards(problem, graph, facts, t)
    kept = (1 - offloaded) / zero_shards
    total *= kept
    if total <= 0:
        return
    _charge(problem, dense, optimizer_step_s(cluster, workload, total) / total / micro_batches, kept)


def add_weight_traffic(problem, graph: Graph, facts: GraphFacts, cluster: Cluster, strategy: Strategy, t: int,
                       gather_bytes: float, grad_bytes: float) -> None:
    """ZeRO-3: charge each dense weight's strategies (in place) what its stored shard costs a micro-batch over
    the data-parallel group: gathered for the forward and again for the backward, its gradient reduce-scattered
    (`step_time.stage_step`, which sits above this module), at full rate, as each byte more costs once that
    traffic fills the compute it hides behind. The rate per parameter is taken at the size of all dense weights
    split t ways."""
    dense, total = _stored_shards(problem, graph, facts, t)
    if total <= 0:
        return
    group = place_group(cluster, strategy.dp * strategy.cp, stride=t)
    _charge(problem, dense,
            (2.0 * all_gather_s(total * gather_bytes, group) + reduce_scatter_s(total * grad_bytes, group)) / total)


__all__ = ["add_optimizer_steps", "add_weight_traffic"]
