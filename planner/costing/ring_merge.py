"""Context parallelism's ring steps beside the attention kernel: the partial results each step leaves, merged.

Under context parallelism a rank's queries meet the other ranks' keys and
values one ring step at a time: `cp` attention kernels a pass, each writing a
partial output (forward) or partial gradients (backward) that the stack then
merges by the softmax statistics, op by op, with a point-to-point exchange
issued each step. The attention cost (`attention_time_s`) prices the kernels'
work at their shorter key spans; what it leaves out is counted here from the
implementation's source: the HBM bytes of the merges and partials per element
of the layer's attention output (or of its query, key and value gradients),
and the kernels the host issues for them, at the busiest rank (the last: under
the load-balanced causal split its every step covers whole chunks).

`te_p2p` is Transformer Engine's `AttnFuncWithCPAndKVP2P`
(pytorch/attention/dot_product_attention/context_parallel.py, v2.10; v1.8,
of NeMo 24.07's time, in pytorch/attention.py, the same steps, its forward
zeroing the output first and merging step 0 by an add: 4 bytes more), bshd or
sbhd, 16-bit, what Megatron-Core runs with its default `cp_comm_type = "p2p"`:

- forward: step 0's partial output copied into the merged one
  (`flash_attn_fwd_out_correction_init`: 2 read, 2 written) and its softmax
  statistics cloned; each later step re-reads the queries (2), writes its
  partial (2) and merges it (`flash_attn_fwd_out_correction`: the partial read,
  the merged output read and written: 6), beside a statistics correction and
  the step's K/V exchange. Launches: one more attention kernel, one exchange,
  one output and one statistics merge a step after the first, two for step 0.
- backward: each step's kernel writes partial dQ, dK and dV (2 each), which are
  copied (step 0: 2 read, 2 written) or added (6) into the accumulators; each
  later step re-reads the queries, the output and its gradient (6 per output
  element). Launches: one more attention kernel and two exchanges (K/V and the
  accumulated dK/dV) a step after the first, three accumulations a step.

ASSUMPTIONS: queries as wide as the output (not MLA's 192 against 128); the
softmax statistics' bytes (one fp32 a row and head) left out; the a2a and
all-gather communication types, Ulysses-style stacks and torch's ring attention
are not this one (`none`: nothing charged beyond the kernels).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RingSteps:
    """What one rank moves and issues beside its attention kernels, per pass, by ring step."""

    first_out_bytes: float  # forward, step 0: HBM bytes per attention output element
    step_out_bytes: float  # forward, each later step: per output element
    first_grad_bytes: float  # backward, step 0: per element of dQ, dK and dV
    step_grad_bytes: float  # backward, each later step: per element of dQ, dK and dV
    step_reread_bytes: float  # backward, each later step: per output element (queries, output, its gradient)
    first_launches: float  # forward, step 0
    step_launches: float  # forward, each later step
    grad_launches: float  # backward, every step
    grad_step_launches: float  # backward, each later step besides


RING_MERGES: dict[str, RingSteps | None] = {
    "none": None,
    "te_p2p": RingSteps(first_out_bytes=4.0, step_out_bytes=10.0, first_grad_bytes=4.0, step_grad_bytes=8.0,
                        step_reread_bytes=6.0, first_launches=2.0, step_launches=4.0, grad_launches=3.0,
                        grad_step_launches=3.0),
}
RING_KINDS: tuple[str, ...] = tuple(RING_MERGES)


def merge_bytes(kind: str, cp: int, out_elements: float, grad_elements: float, backward: bool) -> float:
    """HBM bytes one rank moves beside its `cp` attention kernels in one pass (none without a ring)."""
    steps = RING_MERGES[kind]
    if steps is None or cp <= 1:
        return 0.0
    if backward:
        return (grad_elements * (steps.first_grad_bytes + (cp - 1) * steps.step_grad_bytes)
                + out_elements * (cp - 1) * steps.step_reread_bytes)
    return out_elements * (steps.first_out_bytes + (cp - 1) * steps.step_out_bytes)


def merge_launches(kind: str, cp: int, backward: bool) -> float:
    """Kernels the host issues beside the one attention kernel a pass already counts (none without a ring)."""
    steps = RING_MERGES[kind]
    if steps is None or cp <= 1:
        return 0.0
    if backward:
        return cp * steps.grad_launches + (cp - 1) * steps.grad_step_launches
    return steps.first_launches + (cp - 1) * steps.step_launches


__all__ = ["RING_KINDS", "RING_MERGES", "RingSteps", "merge_bytes", "merge_launches"]
