"""What the strategies of a region pay to fit in HBM, from below: for the branch and bound's policy regions.

A policy region fixes the mesh, micro-batch, interleaving and recompute policy; its strategies differ in the
ZeRO level, offload fractions, fully recomputed layers and the pipeline cut (`plan_search._leaves`). Where a
model's states do not fit the devices, every strategy of the region pays for fitting, and the compute bound
(`bounds`) cannot see it; this bound can, for each ZeRO level z the region holds (the least over them):

- the memory each stage keeps at z without offload, at the even cut (a region scores other cuts only of
  strategies that fit without offload), from per-layer figures: every dense weight split over the tensor
  axis and the routed experts over theirs; activations as the representative costing keeps them when the
  tensor degree is 1 and the policy is not selective (there no layout or recomputed-layer count can shrink
  them), else none; ZeRO-3's working copies likewise (`stage_memory`, the one formula);
- what is over the usable HBM must go to the host tier (`offload_by_class`): moving d bytes of a class off
  HBM costs, per step, rate x d bytes over the tier's link (activations 2m/held, parameters 2m x width x
  shard / param bytes, optimizer states (4 + width + Adam's step bytes) / optimizer bytes, gradients
  4 x shard / gradient bytes, per parameter); activations and parameters stream beside compute (X), the
  optimizer's and gradients' traffic adds to the step (Y); the least of max(P, X) + Y over the ways to
  remove the excess is a fractional knapsack, solved greedily (`least_offload_s`);
- with one pipeline stage, ZeRO-2's gradient reduce-scatter and ZeRO-3's two gathers per micro-batch
  (`dp_collective_s`) take at least their transfer time of each micro-batch (`step_time.stage_step`:
  compute and exposed traffic are at least either), so P = max(pipeline bound, m x that traffic).

Then the step is at least max(P, X) + Y: the pipeline is at least P and at least the window the stream hides
behind, and the step's tail adds the exposed stream and the optimizer's traffic (`step_time.step_breakdown`);
and at least P plus the data-parallel traffic the stack leaves exposed at z (`dp_floor`).
FP8 training (whose weight copies the floors leave out) gets no such bound.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping

from cost_models import Cluster
from cost_models.memory import inflight_microbatches
from cost_models.offload import offload_tier

from planner.costing.execution import stays_gathered
from planner.costing.node_times import DTYPE_WIDTH, activation_dtype
from planner.costing.pipeline_cut import assign_chunks
from planner.costing.stage_memory import gathered, held_activations, stage_memory, working_copies
from planner.costing.step_time import HOST_GRAD_BYTES, dp_collective_s, gather_width, host_update_bytes
from planner.search.dp_floor import Params
from planner.strategy import Strategy, Workload

def stage_floors(graph, structure, facts, costs, strategy: Strategy, exact: bool) -> list[tuple[float, ...]]:
    """Per stage of the strategy's cut (the search's: even, or `grid.chunk_cut`'s accounted split): (dense, expert)
    parameters per device at the least any layout keeps, the activations of one micro-batch and of those the loss's
    (`costs.block_act_bytes`, `costs.block_loss_bytes` when `exact`, else none) and the widest layer's gathered
    parameters (when `exact`)."""
    chunk = assign_chunks(structure, strategy.pp * strategy.vpp, strategy.stage_layers)
    out = [[0.0, 0.0, 0.0, 0.0, 0.0] for _ in range(strategy.pp)]
    numels = facts.block_numels()
    for blk in structure.blocks:
        dense = numels[blk.name][0] / strategy.tp
        expert = numels[blk.name][1] / (strategy.ep * strategy.expert_tp)
        st = out[chunk[blk.name] % strategy.pp]
        st[0] += dense
        st[1] += expert
        if exact:
            st[2] += costs.block_act_bytes.get(blk.name, 0.0)
            st[3] += costs.block_loss_bytes.get(blk.name, 0.0)
            st[4] = max(st[4], gathered((dense, expert), strategy))
    return [tuple(s) for s in out]


def least_offload_s(excess: float, classes: list[tuple[float, float, bool]], bandwidth: float,
                    free_s: float) -> tuple[float, float]:
    """The least (X, Y) seconds of host traffic that remove `excess` bytes from HBM, given per class (bytes it
    holds, traffic bytes per byte removed, whether it streams beside compute): streamed traffic up to `free_s`
    costs nothing (it hides under the pipeline's own bound), beyond it and all other traffic it costs its
    seconds; cheapest first. (inf, inf) when the classes hold less than the excess."""
    if excess <= 0:
        return 0.0, 0.0
    if sum(cap for cap, _, _ in classes) < excess:
        return math.inf, math.inf
    left, free, x, y = excess, free_s * bandwidth, 0.0, 0.0
    rest = []
    for cap, rate, streams in sorted(classes, key=lambda c: c[1]):
        if streams and free > 0 and rate > 0:  # removed at no cost while the stream hides under the bound
            take = min(cap, left, free / rate)
            left -= take
            free -= take * rate
            x += take * rate / bandwidth
            cap -= take
        rest.append((rate, cap, streams))
    for rate, cap, streams in rest:  # still cheapest first
        if left <= 0:
            break
        take = min(cap, left)
        left -= take
        if streams:
            x += take * rate / bandwidth
        else:
            y += take * rate / bandwidth
    return x, y


def fitting_bound_s(graph, structure, facts, costs, cluster: Cluster, workload: Workload, strategy: Strategy,
                    pipelines: Mapping[int, tuple[float, float]], offload: bool) -> float:
    """The least step over the region's ZeRO levels of what fitting adds to the pipeline (see the module
    docstring); `pipelines` gives per ZeRO level the region holds the pipeline bound and the exposed data-parallel
    tail (`dp_floor.dp_bounds_s`); `offload` says whether the region may offload; `costs` is the representative
    costing of the region's tensor, context, expert degrees, micro-batch and recompute policy (None: none)."""
    ex = workload.execution
    training = workload.mode == "train"
    if not training or costs is None or workload.dtype != activation_dtype(workload):
        return min((p + t for p, t in pipelines.values()), default=math.inf)
    width = DTYPE_WIDTH.get(activation_dtype(workload), 2.0)
    m = strategy.schedule_micro_batches(workload)
    exact = strategy.tp == 1 and strategy.recompute != "selective"
    floors = stage_floors(graph, structure, facts, costs, strategy, exact)
    schedule = "interleaved" if strategy.vpp > 1 else strategy.schedule
    held = [inflight_microbatches(schedule, pp=strategy.pp, microbatches=m, stage=s, virtual_stages=strategy.vpp)
            for s in range(strategy.pp)]
    usable = ex.usable_hbm_bytes(cluster.device.hbm_bytes)
    tier = offload_tier(cluster)
    st = ex.state
    dp_shard = strategy.dp * strategy.cp
    # the tier's link at its best (its efficiency curve's highest point, 1 at most)
    link = (tier.bandwidth_bytes_per_s * max(1.0, max(e for _, e in tier.efficiency.points))) if tier else 0.0
    best = math.inf
    for z, (pipeline_s, tail_s) in pipelines.items():
        s = replace(strategy, zero=z, offload=())
        floor_s = pipeline_s
        if strategy.pp == 1 and z >= 2 and dp_shard > 1 and not stays_gathered(s, ex):
            p = Params(floors[0][0], floors[0][1], strategy.tp)
            per_mb = dp_collective_s(cluster, s, p, "reduce_scatter", ex.grad_bytes)
            if z >= 3:
                per_mb += 2 * dp_collective_s(cluster, s, p, "all_gather", gather_width(p, ex, width))
            floor_s = max(floor_s, m * per_mb)
        step = max(floor_s, pipeline_s + tail_s)
        for (dense, expert, act, loss, widest), h in zip(floors, held):
            mem = stage_memory(dense, expert, held_activations(act, loss, h), s, True, width, ex,
                               buffers=working_copies(widest, gathered((dense, expert), s), s, ex, True, width))
            excess = mem["peak"] - usable
            if excess <= 0:
                continue
            if not offload or tier is None or excess > tier.capacity_bytes:
                step = math.inf
                break
            n = dense + expert
            least_shard = min(x for x, part in ((dp_shard, dense), (strategy.edp, expert)) if part > 0) if n else 1
            local = dense / (dp_shard if z >= 1 else 1) + expert / (strategy.edp if z >= 1 else 1)
            classes = [(mem["activations"], 2.0 * m / h, True),
                       (mem["params"], 2.0 * m * width * (least_shard if z >= 3 else 1) / st.param_bytes, True),
                       (mem["optimizer"], host_update_bytes(width, ex) / st.optimizer_bytes if local else 0.0, False),
                       (mem["grads"], HOST_GRAD_BYTES * (least_shard if z >= 2 else 1) / st.grad_bytes, False)]
            x, y = least_offload_s(excess, classes, link, floor_s)
            step = max(step, max(floor_s, x) + y)
        best = min(best, step)
    return best


__all__ = ["fitting_bound_s", "least_offload_s", "stage_floors"]
