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
streams). Warm-up forwards and cool-down backwards run unpaired.

ASSUMPTIONS: layers of a chunk are alike (the stage's MoE layers averaged);
a node's backward splits half into dgrad, half into wgrad (a GEMM's two
gradients have equal FLOPs; the attention core has no wgrad); dispatch and
combine each take half of an exchange; tensor-parallel communication stays
outside the pairing, as in the unpaired step.
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


def paired_s(layer: MoELayerTimes, layers: float, chunks: int, efficiency: float) -> float:
    """Seconds of `layers` MoE layers of a stage (in `chunks` virtual chunks) running one micro-batch's forward
    beside another's backward (see the module docstring)."""
    if layers <= 0:
        return 0.0
    per_chunk = layers / max(1, chunks)
    if per_chunk < 1.0:  # chunks hold a layer or none: each pair stands alone
        return layers * _layer_ends(layer, 1, efficiency)[0]
    n = min(_SIMULATED, int(per_chunk))
    ends = _layer_ends(layer, n, efficiency)
    total = ends[-1]
    if per_chunk > n:  # the last simulated layer's increment, repeated
        total += (per_chunk - n) * (ends[-1] - (ends[-2] if n > 1 else 0.0))
    return chunks * total


def _chain_s(layer: MoELayerTimes, n: int, efficiency: float) -> float:
    """End of `n` paired layers of one chunk on the two streams."""
    return _layer_ends(layer, n, efficiency)[-1] if n > 0 else 0.0


@lru_cache(maxsize=4096)
def _layer_ends(layer: MoELayerTimes, n: int, efficiency: float) -> tuple[float, ...]:
    """When each of `n` paired layers of one chunk has ended on both streams."""
    tasks: list[Task] = []

    def add(stream: int, seconds: float, *after: int | None) -> int:
        tasks.append(Task(stream, seconds, tuple(a for a in after if a is not None)))
        return len(tasks) - 1

    d_f = c_f = layer.exchange_fwd / 2
    d_b = c_b = layer.exchange_bwd / 2
    fwd_out = bwd_out = None  # the forward layer's combine, the backward layer's pre-dispatch dgrad
    spans = []
    for _ in range(n):  # in the order run() issues them
        first = len(tasks)
        combine_b = add(COMM, c_b, bwd_out)
        pre_f = add(COMPUTE, layer.pre_fwd, fwd_out)
        experts_dgrad = add(COMPUTE, layer.experts_bwd / 2, combine_b)
        dispatch_f = add(COMM, d_f, pre_f)
        add(COMPUTE, layer.experts_bwd / 2)  # delayed wgrad
        dispatch_b = add(COMM, d_b, experts_dgrad)
        experts_f = add(COMPUTE, layer.experts_fwd, dispatch_f)
        fwd_out = add(COMM, c_f, experts_f)
        bwd_out = add(COMPUTE, layer.pre_bwd / 2, dispatch_b)
        add(COMPUTE, layer.pre_bwd / 2)  # its wgrad, delayed behind the dgrad
        spans.append((first, len(tasks)))
    ends = run_streams(tasks, efficiency)
    out, reached = [], 0.0
    for first, stop in spans:
        reached = max(reached, *ends[first:stop])
        out.append(reached)
    return tuple(out)


__all__ = ["MoELayerTimes", "paired_s"]
