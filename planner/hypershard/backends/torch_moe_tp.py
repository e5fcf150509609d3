"""A mixture-of-experts layer under tensor parallelism in the torch export: each tensor rank runs the MoE
block on its own slice of the sequence.

With sequence parallelism the residual stream arrives split by sequence over tp, and with an expert tensor
degree of 1 (Megatron-Core's MoE parallel folding at etp 1: attention over tp, the experts whole, or split
over ep) each tensor rank routes and computes only its own tokens, which is what the estimate costs. The
block (router, experts, any shared expert) is therefore given its rank's tokens as a plain tensor and its
output is taken back as the sequence-split DTensor the stream is (Megatron-Core asks for sequence
parallelism with MoE at tp > 1 for the same reason).

Its weights are whole on every tensor rank, and each rank's gradients come from its own tokens only: they
must be summed over tp as well as averaged over the data-parallel ranks. FSDP2 on each block over the
flattened (data, tp) ranks averages over both, so the block's share of the backward is scaled by tp (the
gradient into its output; the gradient out of its input by 1 / tp, so the stream's own gradients are
untouched): every weight of the block then gets the data-parallel mean of the sum over its tensor ranks.
"""

from __future__ import annotations

#: The generated source; it uses MOE_TOKEN_SPLIT, DATA_AXIS, EXPERT_PARALLEL, `_fsdp_mesh` and the experts'
#: `_stacked`, `_ScaleGrad`, `_forward_by`.
MOE_TP_SRC = r'''
def _fold_tp(mesh):
    """The flattened (data, tp) axes the MoE blocks' weights (and, under ep, the experts': edp x tp) reduce over."""
    data = ("edp", "ep") if EXPERT_PARALLEL > 1 else (DATA_AXIS,)
    mesh[data + ("tp",)]._flatten(f"{DATA_AXIS}_tp")
    if EXPERT_PARALLEL > 1:
        mesh[("edp", "tp")]._flatten("edp_tp")
    return mesh


def _moe_blocks(model):
    """(path, module) of the MoE blocks: the modules one of whose children holds stacked experts (the router
    and any shared expert beside them)."""
    return [(p, m) for p, m in model.named_modules() if any(_stacked(c) for c in m.children())]


def _token_local(tp_mesh, forward, hidden_states, *args, **kwargs):
    """The block on this tensor rank's tokens: the stream's local slice in, the output back as that slice (in
    the slice's shape: some blocks return their tokens flattened)."""
    tp = float(tp_mesh.size())
    x = hidden_states.to_local() if isinstance(hidden_states, DTensor) else hidden_states
    y = forward(_ScaleGrad.apply(x, 1.0 / tp), *args, **kwargs)  # with the scales below: the stream's gradients
    outs = y if isinstance(y, tuple) else (y,)                     # unchanged, the block's weights' times tp
    outs = tuple(_ScaleGrad.apply(t, tp) if torch.is_tensor(t) and t.requires_grad else t for t in outs)
    first = DTensor.from_local(outs[0].reshape(x.shape), tp_mesh, [Shard(1)], run_check=False)
    return (first, *outs[1:]) if isinstance(y, tuple) else first


def apply_local_tokens(model, mesh):
    """Run each MoE block on this tensor rank's slice of the sequence (MOE_TOKEN_SPLIT: tp > 1, etp 1)."""
    if MOE_TOKEN_SPLIT:
        for _, block in _moe_blocks(model):
            block.forward = partial(_token_local, mesh["tp"], block.forward)
    return model


def shard_moe_blocks(model, mesh, kwargs):
    """FSDP2 on each token-local MoE block over the (data, tp) ranks its weights reduce over, before the layers
    around it."""
    for block in [m for _, m in model.named_modules() if _forward_by(m, _token_local)]:
        fully_shard(block, **dict(kwargs, mesh=_fsdp_mesh(mesh, f"{DATA_AXIS}_tp")))
'''

__all__ = ["MOE_TP_SRC"]
