"""Context parallelism's ring steps beside the attention kernel: the partial results each step leaves, merged.

Under context parallelism a rank's queries meet the other ranks' keys and
values one ring step at a time: `cp` attention kernels a pass, each leaving a
partial output (forward) or partial gradients (backward) that the stack then
merges by the softmax statistics, op by op, with a point-to-point exchange
issued each step. The attention cost (`attention_time_s`) prices the kernels
at their shorter key spans, what they read and write included; what it leaves
out is counted here from the implementation's source: the HBM bytes of the
copies, merges and accumulations beside the kernels, per element of the
tensor each touches, and the kernels the host issues, at the busiest rank (the
last: under the load-balanced causal split its first c - 1 steps meet whole
chunks of earlier keys, its last the diagonal).

`te_p2p` is Transformer Engine's `AttnFuncWithCPAndKVP2P`
(pytorch/attention/dot_product_attention/context_parallel.py, v2.10), sbhd,
16-bit, what Megatron-Core runs with its default `cp_comm_type = "p2p"`:

- forward: K and V concatenated into the exchange buffer (`torch.cat`: 2 read,
  2 written an element of K and V); step 0's partial output copied into the
  merged one (`flash_attn_fwd_out_correction_init`: 2 read, 2 written an output
  element) and each later step's merged into it (`flash_attn_fwd_out_correction`:
  the partial read, the output read and written: 6), its softmax statistics
  cloned once and corrected each later step. Launches: that copy, c output and
  c statistics merges, and each later step's attention kernel and exchange.
- backward: K and V copied into the exchange buffer (4 an element); each step's
  dQ copied (step 0: 4) or added (6) into its accumulator; dK and dV, at the
  busiest rank half-size on its first c - 1 steps (`dk[0]`), copied on step 0
  (2) and added after (3 a middle step, 6 on the last, the diagonal, which
  covers them whole). Launches: that copy, three accumulations a step, and each
  later step's attention kernel, and an exchange a step (K and V, then K and V
  with the running dK and dV in one buffer, then dK and dV alone).

ASSUMPTIONS: queries as wide as the output (not MLA's 192 against 128); the
softmax statistics' bytes (one fp32 a row and head) left out; an exchange as
one launch (TE batches its send and receive on pre-Blackwell GPUs at cp = 2 or
with NVTE_BATCH_MHA_P2P_COMM, else issues two); TE 1.8, which NeMo 24.07 ran,
taken at these counts although it ran more (a zeroed output, double-precision
statistics, half-chunk K/V copies, a dK/dV concatenation a step). Sliding-window
layers take no ring (TE runs them only with the a2a and all-gather types), nor
do Ulysses-style stacks and torch's ring attention (`none`: nothing charged).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RingPass:
    """What one rank moves and issues beside its attention kernels in one pass (forward or backward) of c steps."""

    bytes_q: float  # HBM bytes per element of the queries (or the output, as wide): dQ's or the output's merges
    bytes_kv: float  # per element of K and V together: their exchange copy and dK's and dV's accumulation
    kernels: float  # memory-bound kernels beside the attention kernels (each pays the per-kernel overhead)
    launches: float  # everything the host issues besides the one attention kernel the pass already counts


def te_p2p(c: int, backward: bool) -> RingPass:
    """Transformer Engine's p2p ring at c ranks, read from its source (module docstring)."""
    if backward:
        dkv = 2.0 + 3.0 * (c - 2) + 6.0  # step 0 half-size copied, middle steps half-size added, the last whole
        return RingPass(bytes_q=4.0 + 6.0 * (c - 1), bytes_kv=4.0 + dkv, kernels=1.0 + 3.0 * c,
                        launches=1.0 + 3.0 * c + (c - 1) + c)
    return RingPass(bytes_q=4.0 + 6.0 * (c - 1), bytes_kv=4.0, kernels=1.0 + 2.0 * c,
                    launches=1.0 + 2.0 * c + 2.0 * (c - 1))


RING_MERGES = {"none": None, "te_p2p": te_p2p}
RING_KINDS: tuple[str, ...] = tuple(RING_MERGES)


def ring_pass(kind: str, cp: int, backward: bool) -> RingPass | None:
    """What `kind` runs beside the attention kernels of one pass at `cp` ranks (None: nothing, or no ring)."""
    count = RING_MERGES[kind]
    return count(cp, backward) if count is not None and cp > 1 else None


__all__ = ["RING_KINDS", "RING_MERGES", "RingPass", "ring_pass", "te_p2p"]
