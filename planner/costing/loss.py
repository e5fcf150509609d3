"""The training loss: cross entropy over the logits, a memory-bound pass whose bytes depend on the kernel.

A language model's loss reads every logit, vocabulary x tokens of them, and
does almost no arithmetic on each: its time is the HBM traffic of the
kernels the stack runs, forward and backward. That traffic differs five-fold
between stacks, so each stack names its kernel (`Execution.loss_kernel`) and
the bytes per logit element are counted here from each kernel's source. The
loss runs where the logits are, on the last pipeline stage, over the rank's
share of the vocabulary under tensor parallelism.
"""

from __future__ import annotations

from cost_models import Cluster
from cost_models.compute import op_time_s

#: HBM bytes per logit element each cross-entropy kernel moves, (forward, backward).
LOSS_BYTES: dict[str, tuple[float, float]] = {
    # Megatron-Core's vocab-parallel cross entropy, unfused (tensor_parallel/cross_entropy.py; Megatron-LM's
    # default, and MindSpeed-LLM's): forward upcasts the 16-bit logits (2 read, 4 written), takes the max (4),
    # subtracts it in place (4 + 4), exponentiates (4 + 4), sums (4) and normalises in place (4 + 4); backward
    # scales the kept softmax in place (4 + 4) and autograd casts that gradient back to 16 bits (4 + 2)
    "megatron": (38.0, 14.0),
    # --cross-entropy-loss-fusion with the native implementation (fusions/fused_cross_entropy.py): the upcast
    # with the max (2 + 4), the shifted exponentials with their sum (4 + 4), their normalisation (4 + 4);
    # backward the scaled gradient cast to 16 bits in one pass (4 + 2)
    "megatron_fused": (22.0, 6.0),
    # --cross-entropy-fusion-impl te, Transformer Engine v2.9-v2.17 (pytorch/triton/cross_entropy.py): an
    # online-softmax pass reads the 16-bit logits (2), a second reads them again and writes the gradient over
    # them (2 + 2); backward scales it in place (2 + 2). TE 2.18 keeps an fp32 gradient instead.
    "te": (6.0, 4.0),
    # torch's F.cross_entropy on logits upcast to fp32, eager: the upcast (2 + 4), log_softmax over a row too
    # long for shared memory (three reads and a write: 16), nll_loss; backward nll_loss's zeroed gradient (4),
    # log_softmax's (three reads and a write: 16) and the cast back to 16 bits (4 + 2)
    "torch": (22.0, 26.0),
    # the same on the 16-bit logits, no upcast: three reads and a write forward (8), a zeroed gradient and
    # three reads and a write backward (10)
    "torch_16bit": (8.0, 10.0),
    # ASSUMPTION, read off how TorchInductor compiles it, not measured: torch.compile'd F.cross_entropy on upcast
    # logits (torchtitan from 2025-04, components/loss.py) runs a looped reduction that reads the 16-bit logits
    # twice (max, then the sum of exponentials: 2 + 2) and keeps them with the row statistics; backward one
    # kernel reads them and writes the 16-bit gradient (2 + 2). Its peak: the logits and that gradient.
    "torch_compiled": (4.0, 4.0),
}
LOSS_KERNELS: tuple[str, ...] = tuple(LOSS_BYTES)

#: Bytes per logit element each kernel holds at its peak, forward or backward, the 16-bit logits included (they
#: are no activation of the graph's: no op keeps them). Megatron's, either way: the logits and their fp32 copy,
#: which becomes the kept softmax and, in place, the gradient, cast to 16 bits at the end (2 + 4). Transformer
#: Engine's: the logits, overwritten by their gradient (2). torch's on upcast logits: forward the logits, their
#: fp32 copy and the log-softmax (2 + 4 + 4), backward the log-softmax, nll_loss's gradient and log_softmax's
#: (4 + 4 + 4; torchtitan frees the logits first: `del pred`). On 16-bit logits: (2 + 2 + 2).
LOSS_PEAK: dict[str, float] = {"megatron": 6.0, "megatron_fused": 6.0, "te": 2.0, "torch": 12.0, "torch_16bit": 6.0,
                               "torch_compiled": 4.0}


#: How `planner.costing.activations` names what the loss keeps: the logits' name and this suffix, priced at 4
#: bytes an element (an fp32 softmax); `peak_scale` turns that into what the stack's kernel holds at its peak.
LOSS_SUFFIX = "::loss"


def peak_scale(kernel: str) -> float:
    """What the loss holds at its peak under `kernel` over the fp32 softmax the saved-tensor list prices it at:
    its peak, not only what it keeps, since a stage runs one micro-batch's loss at a time, forward then backward,
    with everything else it keeps around it."""
    return LOSS_PEAK[kernel] / 4.0


def loss_time_s(cluster: Cluster, kernel: str, elements: float, backward: bool, dtype: str) -> float:
    """Seconds of the loss over `elements` logits on one device, forward or backward."""
    nbytes = LOSS_BYTES[kernel][1 if backward else 0] * elements
    return op_time_s(cluster, 0.0, nbytes, "elementwise", dtype) if nbytes > 0 else 0.0


__all__ = ["LOSS_BYTES", "LOSS_KERNELS", "LOSS_PEAK", "LOSS_SUFFIX", "loss_time_s", "peak_scale"]
