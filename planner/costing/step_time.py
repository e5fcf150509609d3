"""From per-stage costs to one step: overlaps, pipeline schedule, data-parallel reduction, optimizer, offload.

Per micro-batch, each stage runs its forward and backward compute; the
communication beside it is overlapped as the stack does (`Execution`):
tensor-parallel collectives inside the GEMMs they feed (Transformer
Engine's userbuffers, torch's AsyncTP; sequence parallelism only),
ZeRO-3/FSDP's parameter gathers one layer ahead and its gradient
reduce-scatters behind the backward. They share one compute window, of
which a fraction (the hardware file's `overlap`: communication kernels take
compute units and memory bandwidth) can hide communication
(`cost_models.overlap.shared_window_exposed`); the rest is exposed on the
stage's critical path. The context-parallel ring is already net of its
kernel's overlap (`exchange`). The expert all-to-all is on the critical
path of a micro-batch's forward and backward; under the stack's 1F1B
all-to-all overlap, a steady-state forward and backward of two
micro-batches run together, layer by layer (`moe_pairing`), and take
`steady_s` together, less than the two alone.

step = pipeline (busy + bubble + p2p) + the slowest stage's tail: the
gradient reduction of the last micro-batch's backward not hidden behind it
(all-reduce, or reduce-scatter with a distributed optimizer; expert
gradients over their expert-data-parallel group), the distributed
optimizer's parameter all-gather unless the stack overlaps it with the next
forward, the optimizer step, and offload traffic. The busy part is split by
kind in the proportions of the slowest stage, so the breakdown adds up to
the step time exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models import Cluster, place_group
from cost_models.collectives import all_gather_s, all_reduce_s, reduce_scatter_s, send_recv_s
from cost_models.offload import offload_tier, transfer_s
from cost_models.overlap import exposed_s, shared_window_exposed
from cost_models.schedule import pipeline_time

from planner.costing.execution import Execution, stays_gathered
from planner.costing.moe_pairing import MoELayerTimes, delays_wgrad, paired_s, unpaired_why
from planner.costing.node_times import activation_dtype, adam_bytes_per_param, optimizer_step_s
from planner.costing.stage_costs import DTYPE_WIDTH, StageCost, StageCosts
from planner.errors import InvalidInput
from planner.strategy import Strategy, Workload



@dataclass(frozen=True, slots=True)
class StageStep:
    """One stage's micro-batch with its communication overlapped (see the module docstring)."""

    forward_s: float  # compute and exposed communication
    backward_s: float  # backward and recompute compute and exposed communication
    exposed: dict[str, float]  # exposed seconds of a steady-state micro-batch by kind: tp, cp, ep, and dp
    # (ZeRO-2/3's per-micro-batch traffic)
    backward_room_s: float  # hiding capacity left in one backward after its own overlaps: for the DP tail
    steady_s: float  # a forward and a backward in the schedule's steady state (paired: see the module docstring)


def stage_step(s: StageCost, cluster: Cluster, workload: Workload, strategy: Strategy, width: float,
               mtp: int = 0) -> StageStep:
    """Exposed communication of one stage's micro-batch, forward and backward, and of a steady-state pair (on a
    model with `mtp` multi-token-prediction depths, which decide whether Megatron-Core pairs: `unpaired_why`)."""
    ex = workload.execution
    p, eta = s.parts, cluster.dp_overlap_efficiency
    gather_f = gather_b = scatter_b = 0.0
    if strategy.zero >= 3 and not stays_gathered(strategy, ex):  # FSDP: every micro-batch gathers the weights
        gather_f = gather_b = dp_collective_s(cluster, strategy, s, "all_gather", gather_width(s, ex, width))
    if strategy.zero >= 2 and not stays_gathered(strategy, ex):  # sharded gradients: reduce-scattered each time
        scatter_b = dp_collective_s(cluster, strategy, s, "reduce_scatter", ex.grad_bytes)
    tp_hidden = ex.overlap_tp_comm and strategy.sp
    fwd_c, bwd_c = p.forward, p.backward + p.recompute
    # TP collectives hide only behind the GEMM each feeds or follows (stage_costs: tp_*_hidden, already at the
    # overlap efficiency): their own window is what lets that much hide; the others may use the whole phase
    tp_window = (p.tp_fwd_hidden / eta if eta else 0.0, p.tp_bwd_hidden / eta if eta else 0.0)
    phases = (
        (fwd_c, [("tp", p.tp_fwd, tp_hidden, tp_window[0]), ("dp", gather_f, ex.fsdp_prefetch, fwd_c)]),
        (bwd_c, [("tp", p.tp_bwd, tp_hidden, tp_window[1]), ("dp", gather_b, ex.fsdp_prefetch, bwd_c),
                 ("dp", scatter_b, ex.overlap_grad_reduce, bwd_c)]),
    )
    exposed = {"tp": 0.0, "cp": p.cp_fwd + p.cp_bwd, "ep": p.ep_fwd + p.ep_bwd, "dp": 0.0}
    shown_by_phase, hidden_by_phase = [], []
    for window, items in phases:
        hidden = iter(shared_window_exposed([(sec, own) for _, sec, hide, own in items if hide], window, eta))
        shown_all = hidden_all = 0.0
        for kind, sec, hide, _ in items:
            shown = next(hidden) if hide else sec
            exposed[kind] += shown
            shown_all += shown
            hidden_all += sec - shown
        shown_by_phase.append(shown_all)
        hidden_by_phase.append(hidden_all)
    forward_s = fwd_c + p.cp_fwd + p.ep_fwd + shown_by_phase[0]
    backward_s = bwd_c + p.cp_bwd + p.ep_bwd + shown_by_phase[1]
    saved = 0.0
    if p.moe_layers > 0 and unpaired_why(strategy, ex, mtp) is None:
        n = p.moe_layers
        layer = MoELayerTimes((p.moe_fwd - p.experts_fwd) / n, p.experts_fwd / n, (p.moe_bwd - p.experts_bwd) / n,
                              p.experts_bwd / n, p.ep_fwd / n, p.ep_bwd / n)
        saved = max(0.0, n * layer.unpaired_s - paired_s(layer, n, strategy.vpp, eta, delays_wgrad(strategy),
                                                          ex.ep_comm_sm_share, not ex.whole_step_graph))
        # overlaps share one compute window: the pair's two phases, less what the others hid in them
        saved = min(saved, max(0.0, eta * (fwd_c + bwd_c) - sum(hidden_by_phase)))
        exposed["ep"] = max(0.0, exposed["ep"] - saved)
    return StageStep(forward_s=forward_s, backward_s=backward_s, exposed=exposed,
                     backward_room_s=max(0.0, eta * bwd_c - hidden_by_phase[1]), steady_s=forward_s + backward_s - saved)


def gather_width(s: StageCost, ex, width: float) -> float:
    """Bytes per parameter of a data-parallel weight all-gather: 16-bit, except the weights that feed FP8 GEMMs
    when the stack gathers them in FP8 (`Execution.fp8_all_gather`), one byte each."""
    total = s.dense_params + s.expert_params
    if not ex.fp8_all_gather or s.fp8_params <= 0 or total <= 0:
        return width
    return width - (width - 1.0) * min(1.0, s.fp8_params / total)


def dp_collective_s(cluster: Cluster, strategy: Strategy, s: StageCost, kind: str, bytes_per_param: float) -> float:
    """One collective over a stage's data-parallel groups: its dense parameters over dp x cp (stride tp), its
    experts' over their expert-data-parallel group (stride ep x etp); they run one after the other."""
    dpg, edp = strategy.dp * strategy.cp, strategy.edp
    run = {"all_gather": all_gather_s, "reduce_scatter": reduce_scatter_s, "all_reduce": all_reduce_s}[kind]
    out = 0.0
    if dpg > 1 and s.dense_params > 0:
        out += run(s.dense_params * bytes_per_param, place_group(cluster, dpg, stride=s.tp))
    if edp > 1 and s.expert_params > 0:
        out += run(s.expert_params * bytes_per_param, place_group(cluster, edp, stride=strategy.ep * strategy.expert_tp))
    return out


def step_breakdown(
    costs: StageCosts, cluster: Cluster, workload: Workload, strategy: Strategy, m: int
) -> tuple[dict[str, float], float, dict[str, dict]]:
    """(breakdown by kind, step time, offload per memory class of the stage that sets the step) of a training
    step; inference steps are one forward pass."""
    stages = costs.stages
    width = DTYPE_WIDTH.get(activation_dtype(workload), 2.0)
    ex = workload.execution
    t, cp, dp, pp = strategy.tp, strategy.cp, strategy.dp, strategy.pp
    if workload.mode != "train":
        f = [s.forward_s for s in stages]
        slow = max(range(len(stages)), key=lambda i: (f[i], -i))
        p = stages[slow].parts
        total = sum(f)
        bd = {"compute": p.forward, "tp_comm": p.tp_fwd, "cp_comm": p.cp_fwd, "ep_comm": p.ep_fwd,
              "pp_other_stages": total - f[slow]}
        return bd, sum(bd.values()), {}

    steps = [stage_step(s, cluster, workload, strategy, width, costs.mtp_layers) for s in stages]
    p2p = 0.0
    if pp > 1:
        spans = place_group(cluster, 2, stride=t * cp * dp)
        p2p = send_recv_s(max(s.boundary_bytes for s in stages), spans)
        # the receiver all-gathers what was sent scattered (see stage_costs), over its own tensor group
        p2p += max(all_gather_s(s.gather_bytes, place_group(cluster, s.tp, stride=1)) if s.tp > 1 else 0.0
                   for s in stages)
        if ex.overlap_pp_comm and (strategy.vpp > 1 or ex.overlap_pp_comm_1f1b):  # beside the next chunk's compute
            p2p = exposed_s(p2p, min(x.forward_s for x in steps), cluster.dp_overlap_efficiency)
    schedule = "interleaved" if strategy.vpp > 1 else strategy.schedule
    pipe = pipeline_time([x.forward_s for x in steps], [x.backward_s for x in steps], m // strategy.flushes, schedule,
                         strategy.vpp, p2p, [x.steady_s for x in steps]).repeated(strategy.flushes)
    slow = max(range(len(stages)), key=lambda i: (steps[i].steady_s, -i))
    sp_, st_ = stages[slow].parts, steps[slow]
    # the steps run unpaired add expert exchange over the paired pace, not idle time
    unpaired = min(pipe.unpaired_s, pipe.bubble_s)
    bd = {
        "compute": m * (sp_.forward + sp_.backward),
        "recompute": m * sp_.recompute,
        "tp_comm": m * st_.exposed["tp"],
        "cp_comm": m * st_.exposed["cp"],
        "ep_comm": m * st_.exposed["ep"] + unpaired,
        "pp_bubble": pipe.bubble_s - unpaired,
        "pp_p2p": pipe.p2p_s,
    }
    dp_mb = m * st_.exposed["dp"]

    # after the last backward: gradient reduction (partly hidden behind it) and the optimizer step
    tier = _tier(cluster, strategy)
    tail = 0.0
    dp_exposed = opt = off = 0.0
    detail: dict[str, dict] = {}
    for s, x in zip(stages, steps):
        exposed = _dp_tail_s(cluster, strategy, s, x, ex, width)
        local = s.dense_params / (dp * cp if strategy.zero >= 1 else 1) + s.expert_params / (
            strategy.edp if strategy.zero >= 1 else 1)
        frac_opt = strategy.offload_fraction("optimizer")
        step_opt = optimizer_step_s(cluster, workload, local * (1 - frac_opt))
        per_class = {} if tier is None else offload_by_class(s, strategy, tier, m, local, width, ex)
        offload = sum(v["exposed_s"] for v in per_class.values())
        if exposed + step_opt + offload > tail:
            tail, dp_exposed, opt, off = exposed + step_opt + offload, exposed, step_opt, offload
            detail = {cls: dict(v) for cls, v in per_class.items()}
    bd["dp_comm"] = dp_mb + dp_exposed
    bd["optimizer"] = opt
    bd["offload"] = off
    return bd, pipe.total_s + tail, detail


def _dp_tail_s(cluster: Cluster, strategy: Strategy, s: StageCost, x: StageStep, ex, width: float) -> float:
    """What the data-parallel reduction after the last micro-batch adds to the step: ZeRO 0 all-reduces and
    ZeRO 1 (the distributed optimizer) reduce-scatters the accumulated gradients, bucket by bucket behind the
    last backward when the stack overlaps them (the last bucket cannot hide); ZeRO 1-2 then all-gather the
    updated parameters, hidden behind the next step's first forward when the stack overlaps that too."""
    gathered = stays_gathered(strategy, ex)
    if strategy.zero >= 2 and not gathered:  # already reduce-scattered micro-batch by micro-batch (StageStep)
        red = 0.0
    else:
        red = dp_collective_s(cluster, strategy, s, "all_reduce" if strategy.zero == 0 else "reduce_scatter",
                              ex.grad_bytes)
    layers = max(1, len(s.layers))
    shown = exposed_s(red, x.backward_room_s, 1.0, red / layers) if ex.overlap_grad_reduce else red
    if 1 <= strategy.zero <= 2 or gathered:  # the updated (or, gathered once, the sharded) weights all-gathered
        gather = dp_collective_s(cluster, strategy, s, "all_gather", gather_width(s, ex, width))
        shown += exposed_s(gather, s.parts.forward, cluster.dp_overlap_efficiency) if ex.overlap_param_gather \
            else gather
    return shown


#: Bytes per parameter of a gradient that crosses to the host's optimizer update (fp32).
HOST_GRAD_BYTES = 4.0


def host_update_bytes(width: float, execution: Execution) -> float:
    """Link traffic per parameter of an optimizer step that runs on the host, each step: its fp32 gradient
    down, the updated `width`-byte weight back, and the update's own state traffic (`adam_bytes_per_param`)."""
    return HOST_GRAD_BYTES + width + adam_bytes_per_param(execution)


def offload_by_class(s, strategy: Strategy, tier, m: int, local_params: float, width: float,
                     ex: Execution) -> dict[str, dict]:
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
        moved = f_opt * local_params * host_update_bytes(width, ex)
        out["optimizer"] = {"traffic_bytes": moved, "exposed_s": transfer_s(moved, tier)}
    f_g = strategy.offload_fraction("grads")
    if f_g:
        moved = f_g * n_params * HOST_GRAD_BYTES
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
    return offload_tier(cluster)
