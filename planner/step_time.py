"""From per-stage costs to one step: pipeline schedule, DP gradient reduction, optimizer, offload.

step = pipeline (busy + bubble + p2p) + the slowest stage's exposed
gradient reduction and optimizer step + exposed offload traffic. The busy
part is split by kind in the proportions of the slowest stage, so the
breakdown adds up to the step time exactly.
"""

from __future__ import annotations

from cost_models import Cluster, place_group
from cost_models.collectives import all_gather_s, all_reduce_s, reduce_scatter_s, send_recv_s
from cost_models.compute import op_time_s
from cost_models.memory import MEGATRON_ADAM
from cost_models.offload import transfer_s
from cost_models.overlap import exposed_dp_reduction_s, exposed_s
from cost_models.schedule import pipeline_time

from planner.errors import InvalidInput
from planner.stage_costs import DTYPE_WIDTH, StageCosts
from planner.strategy import Strategy, Workload

#: Bytes an Adam step reads and writes per parameter: bf16 param r/w, fp32 grad read, fp32 master, m and v r/w.
ADAM_BYTES_PER_PARAM = 2 + 2 + 4 + 8 + 8 + 8


def _dp_reduction_s(cluster: Cluster, strategy: Strategy, n_params: float, group: int, stride: int, width: float) -> float:
    """Gradient reduction of one stage's parameters over its data-parallel group (ZeRO: reduce-scatter + all-gather)."""
    if group <= 1 or n_params <= 0:
        return 0.0
    spans = place_group(cluster, group, stride=stride)
    grad_bytes = n_params * MEGATRON_ADAM.grad_bytes
    if strategy.zero == 0:
        return all_reduce_s(grad_bytes, spans)
    return reduce_scatter_s(grad_bytes, spans) + all_gather_s(n_params * width, spans)


def step_breakdown(
    costs: StageCosts, cluster: Cluster, workload: Workload, strategy: Strategy, m: int
) -> tuple[dict[str, float], float, dict[str, dict]]:
    """(breakdown by kind, step time, offload per memory class of the stage that sets the step) of a training
    step; inference steps are one forward pass."""
    stages = costs.stages
    width = DTYPE_WIDTH.get(workload.dtype, 2.0)
    t, cp, dp, pp = strategy.tp, strategy.cp, strategy.dp, strategy.pp
    training = workload.mode == "train"
    if not training:
        f = [s.forward_s for s in stages]
        slow = max(range(len(stages)), key=lambda i: (f[i], -i))
        p = stages[slow].parts
        total = sum(f)
        bd = {"compute": p.forward, "tp_comm": p.tp_fwd, "cp_comm": p.cp_fwd, "ep_comm": p.ep_fwd,
              "pp_other_stages": total - f[slow]}
        return bd, sum(bd.values()), {}

    p2p = 0.0
    if pp > 1:
        spans = place_group(cluster, 2, stride=t * cp * dp)
        p2p = send_recv_s(max(s.boundary_bytes for s in stages), spans)
        # the receiver all-gathers what was sent scattered (see stage_costs), over its own tensor group
        p2p += max(all_gather_s(s.gather_bytes, place_group(cluster, s.tp, stride=1)) if s.tp > 1 else 0.0
                   for s in stages)
    schedule = "interleaved" if strategy.vpp > 1 else strategy.schedule
    pipe = pipeline_time([s.forward_s for s in stages], [s.backward_s for s in stages], m, schedule,
                         strategy.vpp, p2p)
    slow = max(range(len(stages)), key=lambda i: (stages[i].forward_s + stages[i].backward_s, -i))
    sp_ = stages[slow].parts
    bd = {
        "compute": m * (sp_.forward + sp_.backward),
        "recompute": m * sp_.recompute,
        "tp_comm": m * (sp_.tp_fwd + sp_.tp_bwd),
        "cp_comm": m * (sp_.cp_fwd + sp_.cp_bwd),
        "ep_comm": m * (sp_.ep_fwd + sp_.ep_bwd),
        "pp_bubble": pipe.bubble_s,
        "pp_p2p": pipe.p2p_s,
    }

    # after the last backward: gradient reduction (partly hidden behind it) and the optimizer step
    dpg = dp * cp
    tier = _tier(cluster, strategy)
    tail = 0.0
    dp_exposed = opt = off = 0.0
    detail: dict[str, dict] = {}
    for s in stages:
        red = _dp_reduction_s(cluster, strategy, s.dense_params, dpg, s.tp, width)
        red += _dp_reduction_s(cluster, strategy, s.expert_params, dpg // strategy.ep, s.tp * strategy.ep, width)
        layers = max(1, len(s.layers))
        exposed = exposed_dp_reduction_s(cluster, red, s.backward_s, red / layers)
        if strategy.zero == 3 and dpg > 1:  # parameters gathered before each micro-batch's forward and backward
            spans = place_group(cluster, dpg, stride=s.tp)
            gather = 2 * m * all_gather_s(s.dense_params * width, spans)
            exposed += exposed_s(gather, m * (s.forward_s + s.backward_s), cluster.dp_overlap_efficiency)
        local = s.dense_params / (dpg if strategy.zero >= 1 else 1) + s.expert_params / (
            max(1, dpg // strategy.ep) if strategy.zero >= 1 else 1)
        frac_opt = strategy.offload_fraction("optimizer")
        step_opt = op_time_s(cluster, 10.0 * local * (1 - frac_opt), ADAM_BYTES_PER_PARAM * local * (1 - frac_opt),
                             "elementwise", workload.dtype)
        per_class = {} if tier is None else offload_by_class(s, strategy, tier, m, local, width)
        offload = sum(v["exposed_s"] for v in per_class.values())
        if exposed + step_opt + offload > tail:
            tail, dp_exposed, opt, off = exposed + step_opt + offload, exposed, step_opt, offload
            detail = {cls: dict(v) for cls, v in per_class.items()}
    bd["dp_comm"] = dp_exposed
    bd["optimizer"] = opt
    bd["offload"] = off
    return bd, pipe.total_s + tail, detail


def _offload_exposed_s(s, strategy: Strategy, tier, m: int, local_params: float, width: float) -> float:
    """Offload traffic of one stage that compute cannot hide (the sum of `offload_by_class`)."""
    return sum(v["exposed_s"] for v in offload_by_class(s, strategy, tier, m, local_params, width).values())


def offload_by_class(s, strategy: Strategy, tier, m: int, local_params: float, width: float) -> dict[str, dict]:
    """Per memory class: bytes moved off HBM, bytes moved over the tier's link per step, and the exposed time.

    Optimizer states on the host: gradients go down and updated parameters
    come back after the backward (the update runs where the states live), so
    that traffic is exposed; gradients likewise. Parameters are fetched for
    every micro-batch's forward and backward, activations stored after the
    forward and fetched for the backward: prefetched, so only what exceeds
    the compute shows. The two streamed classes share the link, so the part
    of their time that compute cannot hide is split between them pro rata.
    """
    n_params = s.dense_params + s.expert_params
    window = m * (s.forward_s + s.backward_s)
    out: dict[str, dict] = {}
    f_opt = strategy.offload_fraction("optimizer")
    if f_opt:
        moved = f_opt * local_params * (MEGATRON_ADAM.grad_bytes + width + ADAM_BYTES_PER_PARAM)
        out["optimizer"] = {"traffic_bytes": moved, "exposed_s": transfer_s(moved, tier)}
    f_g = strategy.offload_fraction("grads")
    if f_g:
        moved = f_g * n_params * MEGATRON_ADAM.grad_bytes
        out["grads"] = {"traffic_bytes": moved, "exposed_s": transfer_s(moved, tier)}
    streamed = {"params": 2 * m * strategy.offload_fraction("params") * n_params * width,
                "activations": 2 * m * s.memory_bytes.get("offloaded_activations", 0.0) / max(s.held, 1.0)}
    total = sum(streamed.values())
    if total > 0:
        hidden_left = exposed_s(transfer_s(total, tier), window)
        for cls, moved in streamed.items():
            if moved > 0:
                out[cls] = {"traffic_bytes": moved, "exposed_s": hidden_left * moved / total}
    for cls, v in out.items():
        v["offloaded_bytes"] = s.memory_bytes.get(f"offloaded_{cls}", 0.0)
        v["fraction"] = strategy.offload_fraction(cls)
    return out


def _tier(cluster: Cluster, strategy: Strategy):
    wanted = any(f > 0 for _, f in strategy.offload)
    if not wanted:
        return None
    if not cluster.memory_tiers:
        raise InvalidInput(f"{cluster.name} has no memory tier beyond HBM to offload to; drop --offload")
    pooled = [t for t in cluster.memory_tiers if t.pooled]
    return (pooled or list(cluster.memory_tiers))[0]
