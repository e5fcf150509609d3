"""Bytes per device of a pipeline stage by memory class: model states by ZeRO stage, activations, ZeRO-3's
working copies, FP8 weight copies, and what is offloaded.

A stage's memory is a function of a few per-stage figures that the costing computes once (parameters per
device, activations kept, the widest layer) and of the strategy's ZeRO level and offload fractions, which
change neither the layouts nor the times (`planner.costing.stage_costs`): `with_states` restates a costing
for another ZeRO level or offload, so the search scores those variants of one strategy without costing
them again.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from cost_models.memory import model_state_bytes

from planner.costing.execution import Execution
from planner.costing.node_times import DTYPE_WIDTH, activation_dtype
from planner.strategy import Strategy, Workload

if TYPE_CHECKING:
    from planner.costing.stage_costs import StageCosts


def gathered(params: tuple[float, float], strategy: Strategy) -> float:
    """Of (dense, expert) parameters per device, those ZeRO-3 shards over a group and so gathers to compute:
    dense ones over dp x cp, experts over their expert-data-parallel group (not when it is one rank)."""
    dense, expert = params
    return (dense if strategy.dp * strategy.cp > 1 else 0.0) + (expert if strategy.edp > 1 else 0.0)


def working_copies(widest_layer: float, stage_params: float, strategy: Strategy, execution: Execution,
                   training: bool, width: float, layer_params: float = 0.0) -> float:
    """Bytes per device beyond the sharded states: under ZeRO-3 the gathered weights of the layer being
    computed and of the one prefetched (FSDP2's default, Zhao et al. 2023 section 3.3) and, in backward,
    that layer's unsharded gradient before its reduce-scatter; the whole stage's weights and gradients
    when they stay gathered over the step (`Execution.fsdp_gathered_with_pp`). Those hold what offloaded
    parameters are copied back into; without them, the offloaded share of those layers' weights and of one
    layer's gradient is staged in HBM (`offload_staging`, of the largest layer's `layer_params`)."""
    if not (training and strategy.zero >= 3 and strategy.dp * strategy.cp > 1):
        return offload_staging(layer_params, strategy, execution, width)
    if strategy.pp > 1 and execution.fsdp_gathered_with_pp:
        return stage_params * (width + execution.grad_bytes)
    layers = 2 if execution.fsdp_prefetch else 1
    return widest_layer * (layers * width + execution.grad_bytes)


def offload_staging(layer_params: float, strategy: Strategy, execution: Execution, width: float) -> float:
    """HBM bytes that offloaded parameters and gradients pass through: a GEMM reads its weight from HBM, so the
    offloaded share of the layer computed and of the one prefetched is copied in (as ZeRO-Infinity's parameter
    prefetch and FSDP2's CPUOffloadPolicy, which copies a layer's shards in before it gathers them, do), and the
    offloaded share of one layer's gradient is written there before it is copied out. ASSUMPTION: two layers'
    weights, as FSDP2's default prefetch of one layer holds (Zhao et al. 2023 section 3.3)."""
    params, grads = strategy.offload_fraction("params"), strategy.offload_fraction("grads")
    return layer_params * (2.0 * width * params + execution.grad_bytes * grads)


def held_activations(per_micro_batch: float, loss: float, held: float) -> float:
    """Activation bytes a stage keeps at its peak when it holds `held` micro-batches: `per_micro_batch` each,
    except the loss's tensors (`loss`, part of `per_micro_batch`), which live for one micro-batch at a time."""
    return (per_micro_batch - loss) * held + loss


def stage_memory(dense: float, expert: float, activation_bytes: float, strategy: Strategy, training: bool,
                 width: float, execution: Execution, buffers: float = 0.0, fp8_params: float = 0.0) -> dict[str, float]:
    """Bytes per device by memory class of a stage holding these parameters (per device, after tensor and
    expert sharding) and activations: states by ZeRO stage with the stack's bytes per parameter (experts
    sharded over their expert-data-parallel group), `buffers` (see `working_copies`), what is offloaded
    moved to `offloaded_*`, and the HBM `peak`. Linear in its inputs, so per-layer figures add up to a stage's.

    In FP8 training `fp8_params` (per device) of the weights feed FP8 GEMMs: the stack keeps their FP8 copies
    (`Execution.fp8_weight_bytes` per parameter, the weight and its transpose for Hopper's GEMMs; sharded like
    the weights), beside the 16-bit weights, or instead of them with `Execution.fp8_params`."""
    if training:
        dpg = strategy.dp * strategy.cp
        st = execution.state
        st_d = model_state_bytes(dense, zero_stage=strategy.zero, dp=dpg, state=st)
        st_e = model_state_bytes(expert, zero_stage=strategy.zero, dp=strategy.edp, state=st)
        mem = {"params": st_d.params_bytes + st_e.params_bytes, "grads": st_d.grads_bytes + st_e.grads_bytes,
               "optimizer": st_d.optimizer_bytes + st_e.optimizer_bytes, "activations": activation_bytes,
               "buffers": buffers}
    else:
        mem = {"params": (dense + expert) * width, "grads": 0.0, "optimizer": 0.0, "activations": activation_bytes,
               "buffers": 0.0}
    if training and fp8_params:
        shard = strategy.dp * strategy.cp if strategy.zero >= 3 else 1
        mem["buffers"] += fp8_params * execution.fp8_weight_bytes / shard
        if execution.fp8_params:
            mem["params"] -= fp8_params * execution.param_bytes / shard
    for cls in ("params", "grads", "optimizer", "activations"):
        frac = strategy.offload_fraction(cls)
        if frac:
            mem[f"offloaded_{cls}"] = mem[cls] * frac
            mem[cls] *= 1.0 - frac
    mem["peak"] = sum(v for k, v in mem.items() if not k.startswith("offloaded_"))
    return mem


def with_states(costs: "StageCosts", strategy: Strategy, workload: Workload) -> "StageCosts":
    """`costs` (a costing of a strategy that differs from `strategy` at most in its ZeRO level and offload
    fractions) with each stage's memory as `strategy` keeps it: what `stage_costs` of `strategy` returns."""
    training = workload.mode == "train"
    width = DTYPE_WIDTH.get(activation_dtype(workload), 2.0)
    ex = workload.execution
    stages = tuple(
        replace(st, memory_bytes=stage_memory(
            st.dense_params, st.expert_params, st.activation_bytes, strategy, training, width, ex,
            buffers=working_copies(st.widest_params, gathered((st.dense_params, st.expert_params), strategy),
                                   strategy, ex, training, width, st.layer_params),
            fp8_params=st.fp8_params))
        for st in costs.stages)
    return replace(costs, stages=stages)
