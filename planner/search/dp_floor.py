"""What the data-parallel traffic a stack does not overlap adds to a step, from below: for the branch and bound.

The compute bound (`bounds`) keeps only what runs on a stage's critical path whatever the region chooses, and
leaves the data-parallel collectives out: under a stack that overlaps them (`Execution.overlap_grad_reduce`,
`overlap_param_gather`, Megatron-Core's and torchtitan's), most of them hide. A stack that does not (MindSpeed-LLM's
example scripts, `stacks/mindspeed.toml`) pays all of them, and a region bound without them stays far under the
regions' steps: the branch and bound then opens every mesh it could have closed.

A policy region fixes the mesh, micro-batch, interleaving and recompute policy; its strategies differ in the ZeRO
level, offload and the pipeline cut. Per ZeRO level z, as `step_time` charges it (the one formula,
`dp_collective_s`, over the least parameters any layout keeps: dense weights over the tensor axis, routed experts
over theirs, as `fitting.stage_floors`):

- after the last backward (z 0-1, or ZeRO-3 gathered once per step), the slowest stage's all-reduce, or
  reduce-scatter, of its gradients, unless overlapped; at z 1-2 (and gathered ZeRO-3) also the all-gather of the
  updated weights, unless overlapped. The slowest stage holds at least a pp-th of the parameters, so this is at
  least the collective of a pp-th (dense and expert parameters each, the larger of the two);
- per micro-batch (z 2-3, not gathered), each stage's reduce-scatter of its gradients unless overlapped, and at
  z 3 its two weight all-gathers unless prefetched. A collective's seconds are subadditive in its bytes (a
  latency of at least 0, and an efficiency that does not fall as messages grow: `cost_models.collectives`), so
  over the stages these add at least the collectives of all the parameters, whatever the cut, and the slowest
  stage takes at least a pp-th of that beside its compute (`bounds.pipeline_bound_s`'s `spread_s`).

Overlapped traffic adds nothing here: how much of it hides depends on the window the cut leaves it.

The regions above a schedule (context and tensor degree, micro-batch, expert degrees) leave the pipeline and data
degrees open, and their bound is the work of a step over the devices (`bounds.mesh_bound_s`). To it they add the
least, over their meshes and ZeRO levels, of the above and the pipeline's fill at the most interleaved chunks a
stage can hold (`meshes_floor_s`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Iterable

from cost_models import Cluster

from planner.costing.execution import stays_gathered
from planner.costing.node_times import DTYPE_WIDTH, activation_dtype
from planner.costing.step_time import dp_collective_s
from planner.search.bounds import LayerTimes, pipeline_bound_s
from planner.strategy import Strategy, Workload


@dataclass(frozen=True, slots=True)
class Params:
    """The figures `dp_collective_s` and `gather_width` read of a stage."""

    dense_params: float
    expert_params: float
    tp: int
    fp8_params: float = 0.0


def exposed_dp_s(totals: tuple[float, float], cluster: Cluster, workload: Workload,
                 strategy: Strategy) -> tuple[float, float]:
    """(per micro-batch over all stages, after the last backward): the least seconds the data-parallel collectives
    the stack leaves exposed add to a step of `strategy`'s region at its ZeRO level (see the module docstring), of
    a model of `totals` (dense, routed-expert) parameters; (0, 0) without a data-parallel group."""
    ex = workload.execution
    if workload.mode != "train" or strategy.dp * strategy.cp == 1 and strategy.edp == 1:
        return 0.0, 0.0
    mean, whole = _stage_params(totals, strategy)
    # the narrowest a weight all-gather can be: FP8 where the stack gathers FP8 weights
    width = 1.0 if ex.fp8_all_gather else DTYPE_WIDTH.get(activation_dtype(workload), 2.0)
    z, gathered = strategy.zero, stays_gathered(strategy, ex)
    tail: list[tuple[str, float]] = []  # the collectives after the last backward: (kind, bytes per parameter)
    per_mb = 0.0
    if z <= 1 or gathered:
        if not ex.overlap_grad_reduce:
            tail.append(("all_reduce" if z == 0 else "reduce_scatter", ex.grad_bytes))
        if z >= 1 and not ex.overlap_param_gather:
            tail.append(("all_gather", width))
    else:
        if not ex.overlap_grad_reduce:
            per_mb += dp_collective_s(cluster, strategy, whole, "reduce_scatter", ex.grad_bytes)
        if z >= 3 and not ex.fsdp_prefetch:
            per_mb += 2 * dp_collective_s(cluster, strategy, whole, "all_gather", width)
        if z == 2 and not ex.overlap_param_gather:
            tail.append(("all_gather", width))
    return per_mb, _slowest_stage(cluster, strategy, mean, tail)


def model_params(facts, structure) -> tuple[float, float]:
    """The model's dense and routed-expert parameters (`GraphFacts.block_numels`)."""
    numels = facts.block_numels()
    return (sum(numels[b.name][0] for b in structure.blocks), sum(numels[b.name][1] for b in structure.blocks))


def dp_bounds_s(lt: LayerTimes, totals: tuple[float, float], cluster: Cluster, workload: Workload,
                strategy: Strategy, zeros: Iterable[int]) -> dict[int, tuple[float, float]]:
    """Per ZeRO level of `zeros`: (the pipeline bound of `lt` with that level's exposed per-micro-batch traffic
    spread over the stages, the exposed traffic after the last backward): the step is at least their sum."""
    out, m = {}, strategy.micro_batches(workload)
    for z in zeros:
        spread, tail = exposed_dp_s(totals, cluster, workload, replace(strategy, zero=z, offload=()))
        out[z] = (pipeline_bound_s(lt, strategy.pp, m, strategy.vpp, spread), tail)
    return out


def meshes_floor_s(totals: tuple[float, float], cluster: Cluster, workload: Workload, strategies: Iterable[Strategy],
                   zeros_of: Callable[[Strategy], list[int]], per_sample_s: float, least_mb: int, layers: int) -> float:
    """The least, over a region's `strategies` (one per mesh, at the largest micro-batch the region gives it) and
    their ZeRO levels, of what a pipeline and the exposed data-parallel traffic add to `bounds.mesh_bound_s`
    (m/pp x S, m micro-batches of S = `per_sample_s` x micro-batch on a rank of the mesh's tensor and context
    degrees): the pipeline's fill, S (pp - 1) / (v pp) at micro-batch `least_mb` and the most interleaved chunks v
    a stage can hold (the layers, the embedding and the head one each: `grid.vpp_degrees`), m/pp of the
    per-micro-batch traffic (the slowest stage's share of it) and the tail. 0 for no strategy."""
    best = math.inf
    for s in strategies:
        m = s.micro_batches(workload)
        fill = per_sample_s * least_mb * (s.pp - 1) / (s.pp * max(1, (layers + 2) // s.pp))
        for z in zeros_of(s):
            spread, tail = exposed_dp_s(totals, cluster, workload, replace(s, zero=z))
            best = min(best, fill + m * spread / s.pp + tail)
    return best if math.isfinite(best) else 0.0


def _slowest_stage(cluster: Cluster, strategy: Strategy, mean: Params, kinds: list[tuple[str, float]]) -> float:
    """The collectives `kinds` of the slowest stage, from below: of a pp-th of the dense or of the expert
    parameters, the longer (the stage that holds the most of one need not hold the most of the other)."""
    return max(sum(dp_collective_s(cluster, strategy, part, kind, width) for kind, width in kinds)
               for part in (Params(mean.dense_params, 0.0, mean.tp), Params(0.0, mean.expert_params, mean.tp)))


def _stage_params(totals: tuple[float, float], strategy: Strategy) -> tuple[Params, Params]:
    """(a pp-th of the parameters per device, all of them), at the least any layout keeps: dense weights over the
    tensor axis, routed experts over theirs."""
    dense, expert = totals[0] / strategy.tp, totals[1] / (strategy.ep * strategy.expert_tp)
    return (Params(dense / strategy.pp, expert / strategy.pp, strategy.tp), Params(dense, expert, strategy.tp))


__all__ = ["Params", "dp_bounds_s", "exposed_dp_s", "meshes_floor_s", "model_params"]
