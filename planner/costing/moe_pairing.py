"""Megatron-Core's 1F1B expert all-to-all overlap: a forward and a backward of two micro-batches, layer by layer.

With `overlap_moe_expert_parallel_comm` (Megatron-Bridge's and the MoE
ModelZoo's A2A overlap, which set `delay_wgrad_compute` with it), each
steady-state step of the schedule runs the forward of one micro-batch and
the backward of the previous one together, pairing forward layer k with
backward layer n-1-k. A layer is split into four nodes: pre-dispatch
(attention, norms, router, shared experts), dispatch, the routed experts
(`mlp`), and combine. Megatron-LM's TransformerLayerSchedulePlan.run
(megatron/core/models/common/model_chunk_schedule_plan.py) issues, per
layer pair:

  communication stream: combine bwd     | dispatch fwd, dispatch bwd      | combine fwd
  compute stream:       pre-dispatch fwd | experts dgrad, wgrad, experts fwd | pre-dispatch dgrad, wgrad

with each node waiting for the one whose output it reads: the forward's
dispatch for its pre-dispatch, its experts for its dispatch, its combine for
its experts, the next layer's pre-dispatch for the combine; the backward's
experts for its combine, its dispatch for the experts' dgrad (wgrad delayed
behind it), its pre-dispatch for the dispatch, and the next (lower) layer's
combine for this pre-dispatch's dgrad. So an exchange hides only behind
the compute the schedule puts beside it, and the layers' dependencies
leave the rest on the critical path (`cost_models.streams` runs the two
streams). The exchange's kernels hold SMs of their own (DeepEP 20 of an
H100's 132, `Execution.ep_comm_sm_share`): beside them the compute runs at
the rest of its pace, the exchange at its own. Warm-up forwards and
cool-down backwards run unpaired.

The host issues the nodes in run()'s order. Eager, it issues each kernel
as the GPU runs the one before (the host law `NodeTimes` costs, issue added
in full), so a transfer starts only once the compute issued before it has
run: the forward's dispatch after the experts' dgrad, the backward's after
the delayed wgrad. A step replayed from one CUDA graph (Megatron-Core's
full_iteration scope) is issued whole, and only the data dependencies hold.

Megatron-Core pairs only where its config allows the overlap
(transformer_config.py): expert parallelism, no pipeline or an interleaved
one, at most one multi-token-prediction layer and then a pipeline, no full
recompute and no recompute of the `moe` module (`unpaired_why` says which). Megatron-FSDP does not delay weight gradients
(mcore_fsdp_adapter.py refuses delay_wgrad_compute): under ZeRO-2/3 the
backward's dispatch waits for the experts' whole backward.

ASSUMPTIONS: layers of a chunk are alike (the stage's MoE layers averaged);
a node's backward splits half into dgrad, half into wgrad (a GEMM's two
gradients have equal FLOPs, though a weight gradient that adds into a main
gradient over few tokens takes longer: `NodeTimes`; the attention side's dgrad is larger, its core
having no weights, but taking 70 % of it as dgrad moves none of the five
paired calibration rows by 0.1 %); dispatch and combine each take half of
an exchange;
tensor-parallel communication stays outside the pairing, as in the unpaired
step.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from cost_models.streams import COMM, COMPUTE, Task, run_streams

#: Layers simulated per chunk; longer chunks repeat the last layer's increment (the chain is periodic by then).
_SIMULATED = 4


@dataclass(frozen=True, slots=True)
class MoELayerTimes:
    """Seconds of one MoE layer per micro-batch: compute beside the experts (pre-dispatch), the routed experts,
    and one direction of its exchange (dispatch + combine), forward and backward (recompute included)."""

    pre_fwd: float
    experts_fwd: float
    pre_bwd: float
    experts_bwd: float
    exchange_fwd: float
    exchange_bwd: float

    @property
    def unpaired_s(self) -> float:
        """Forward and backward one after the other, each exchange on the critical path."""
        return (self.pre_fwd + self.experts_fwd + self.pre_bwd + self.experts_bwd + self.exchange_fwd
                + self.exchange_bwd)


def unpaired_why(strategy, execution, mtp: int = 0) -> str | None:
    """Why Megatron-Core would not run the stack's 1F1B all-to-all overlap for `strategy` on a model with `mtp`
    multi-token-prediction depths (None: it pairs)."""
    if not execution.overlap_ep_comm:
        return "the stack does not overlap the expert all-to-all"
    if strategy.ep <= 1:
        return "it needs expert parallelism"
    if strategy.pp > 1 and (strategy.vpp <= 1 or strategy.schedule == "gpipe"):
        return "with a pipeline it needs the interleaved schedule"
    if mtp > 1:  # TransformerConfig: 'MTP layernum only supports 1 when enabling overlap_moe_expert_parallel_comm'
        return f"it takes at most one multi-token-prediction layer ({mtp} here)"
    if mtp and strategy.pp <= 1:  # and with that one layer, 'Pipeline model parallel size must be larger than 1'
        return "with a multi-token-prediction layer it needs a pipeline"
    if strategy.recompute == "full" or strategy.full_recompute_layers:
        return "it refuses full recompute"
    if strategy.recompute == "selective" and execution.selective == "modules" and "moe" in execution.recompute_modules:
        return "it refuses recompute of the moe module"
    return None


def unpaired_warnings(strategy, workload, mtp: int = 0) -> list[str]:
    """One sentence when the stack asks for the overlap and the layout cannot have it."""
    why = unpaired_why(strategy, workload.execution, mtp) if workload.mode == "train" and strategy.ep > 1 else None
    if why is None or not workload.execution.overlap_ep_comm:
        return []
    return [f"the stack's 1F1B expert all-to-all overlap does not apply to this layout ({why}, as in Megatron-Core): "
            "its exchange is costed on the critical path"]


def delays_wgrad(strategy) -> bool:
    """Whether the pairing runs with weight gradients delayed: not under Megatron-FSDP (ZeRO-2/3 over data ranks)."""
    return not (strategy.zero >= 2 and strategy.dp * strategy.cp > 1)


def paired_s(layer: MoELayerTimes, layers: float, chunks: int, efficiency: float, delayed: bool = True,
             sm_share: float = 0.0, host_ordered: bool = False) -> float:
    """Seconds of `layers` MoE layers of a stage (in `chunks` virtual chunks) running one micro-batch's forward
    beside another's backward (see the module docstring), with the weight gradients `delayed` or not. With
    `sm_share` (`Execution.ep_comm_sm_share`) the exchange's kernels hold that share of the SMs: beside them the
    compute runs at the rest of its pace and the exchange at its own, in place of the fitted `efficiency`. With
    `host_ordered` (an eager step) each transfer also waits for the compute issued before it (module docstring)."""
    if layers <= 0:
        return 0.0
    if sm_share > 0.0:
        efficiency, pace = 1.0, 1.0 - sm_share
    else:
        pace = 1.0
    per_chunk = layers / max(1, chunks)
    if per_chunk < 1.0:  # chunks hold a layer or none: each pair stands alone
        return layers * _layer_ends(layer, 1, efficiency, delayed, pace, host_ordered)[0]
    n = min(_SIMULATED, int(per_chunk))
    ends = _layer_ends(layer, n, efficiency, delayed, pace, host_ordered)
    total = ends[-1]
    if per_chunk > n:  # the last simulated layer's increment, repeated
        total += (per_chunk - n) * (ends[-1] - (ends[-2] if n > 1 else 0.0))
    return chunks * total


def _chain_s(layer: MoELayerTimes, n: int, efficiency: float, delayed: bool = True) -> float:
    """End of `n` paired layers of one chunk on the two streams."""
    return _layer_ends(layer, n, efficiency, delayed)[-1] if n > 0 else 0.0


@lru_cache(maxsize=4096)
def _layer_ends(layer: MoELayerTimes, n: int, efficiency: float, delayed: bool,
                pace: float = 1.0, host_ordered: bool = False) -> tuple[float, ...]:
    """When each of `n` paired layers of one chunk has ended on both streams; `host_ordered`: each transfer is
    also issued only once the host has issued the compute before it (`paired_s`)."""
    tasks: list[Task] = []
    issued: list[int | None] = [None]  # the last compute task the host has issued

    def add(stream: int, seconds: float, *after: int | None) -> int:
        waits = after + ((issued[0],) if host_ordered and stream == COMM else ())
        tasks.append(Task(stream, seconds, tuple(sorted({a for a in waits if a is not None}))))
        if stream == COMPUTE:
            issued[0] = len(tasks) - 1
        return len(tasks) - 1

    d_f = c_f = layer.exchange_fwd / 2
    d_b = c_b = layer.exchange_bwd / 2
    late = 0.5 if delayed else 0.0  # the share of each backward run after its dgrad's consumer is released
    fwd_out = bwd_out = None  # the forward layer's combine, the backward layer's pre-dispatch dgrad
    spans = []
    for _ in range(n):  # in the order run() issues them
        first = len(tasks)
        combine_b = add(COMM, c_b, bwd_out)
        pre_f = add(COMPUTE, layer.pre_fwd, fwd_out)
        experts_dgrad = add(COMPUTE, layer.experts_bwd * (1 - late), combine_b)
        dispatch_f = add(COMM, d_f, pre_f)
        add(COMPUTE, layer.experts_bwd * late)  # delayed wgrad
        dispatch_b = add(COMM, d_b, experts_dgrad)
        experts_f = add(COMPUTE, layer.experts_fwd, dispatch_f)
        fwd_out = add(COMM, c_f, experts_f)
        bwd_out = add(COMPUTE, layer.pre_bwd * (1 - late), dispatch_b)
        add(COMPUTE, layer.pre_bwd * late)  # its wgrad, delayed behind the dgrad
        spans.append((first, len(tasks)))
    ends = run_streams(tasks, efficiency, pace)
    out, reached = [], 0.0
    for first, stop in spans:
        reached = max(reached, *ends[first:stop])
        out.append(reached)
    return tuple(out)


__all__ = ["MoELayerTimes", "delays_wgrad", "paired_s", "unpaired_warnings", "unpaired_why"]
