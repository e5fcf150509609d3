"""Expert parallelism in the torch export: stacked experts split over data-parallel ranks, tokens exchanged
by all-to-all.

torch has no parallel style for a mixture-of-experts layer, so the generated file carries one. At tp 1 it
follows the declaration's folding of ep into the data-parallel ranks (the `ep` alias of the mesh,
consecutive ranks; ep over tensor ranks is refused, `torch_refusals`): the data axis of the mesh is built
as (edp, ep) and flattened back under its own name, so the rest of the plan sees the mesh it always
does. Each ep rank keeps its contiguous share of every
stacked-expert weight (the layout's `ep` on dim 0); a Hugging Face experts module,
`forward(hidden_states, top_k_index, top_k_weights)`, then sends each token to the rank of each of its
top-k experts, runs its own experts on what arrives and sends the results back (GShard's dispatch and
combine, Lepikhin et al. 2020), so every rank computes only its experts' share of the tokens as the
estimate costs it. The exchange is `torch.distributed.nn.functional.all_to_all_single`, which carries
gradients back the same way.

Gradients: each expert's gradient on its ep rank sums the contributions of every token routed to it from
the whole ep group, and FSDP2 over the expert-data-parallel ranks (edp = dp / ep) averages over edp only,
so the experts' share of the backward is scaled by 1 / ep (the gradient into their output; the gradient
out of their input is scaled back by ep, so the tokens' own gradients are untouched): every expert weight
then gets the whole data-parallel mean. torchtitan reaches the same with FSDP2's
`set_gradient_divide_factor`, whose pre-multiplied reduction gloo does not have; this way runs on every
process-group backend. The other weights are sharded over all data-parallel ranks as before.
"""

from __future__ import annotations

#: The dispatch and combine both torch exports run (training's `apply_expert_parallel` below, serving's
#: `route_experts`); it uses torch, dist and torch.distributed.nn.functional's all_to_all_single.
DISPATCH_SRC = r'''
class _ScaleGrad(torch.autograd.Function):
    """The identity forward; its gradient times `factor` backward."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def _dispatched(compute, group, owner, first, hidden_states, top_k_index, top_k_weights):
    """Each token to the rank of `group` holding each of its top-k experts (`owner`: expert -> that rank, contiguous
    ranges), that rank's experts (its first is expert `first`) on what arrives (`compute`, the experts module's own
    forward, one expert a token at weight 1), and back, weighted (GShard's dispatch and combine, Lepikhin et al.
    2020). The exchange carries gradients back; the experts' weight gradients are scaled by 1 / ep, the tokens' own
    left unchanged."""
    ep = dist.get_world_size(group)
    flat, owner = top_k_index.reshape(-1), owner.to(top_k_index.device)
    order = torch.argsort(flat, stable=True)  # token-expert pairs grouped by expert, so by the rank holding it
    expert, token = flat[order], order // top_k_index.shape[-1]
    send = torch.bincount(owner[expert], minlength=ep)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    sent, got = send.tolist(), recv.tolist()
    x = all_to_all_single(hidden_states.new_empty((sum(got), hidden_states.shape[-1])), hidden_states[token],
                          got, sent, group=group)
    ids = torch.empty(sum(got), dtype=expert.dtype, device=expert.device)
    dist.all_to_all_single(ids, expert.contiguous(), got, sent, group=group)
    x = _ScaleGrad.apply(x, float(ep))
    y = _ScaleGrad.apply(compute(x, (ids - first)[:, None], x.new_ones((x.shape[0], 1))), 1.0 / ep)
    back = all_to_all_single(y.new_empty((len(order), y.shape[-1])), y, sent, got, group=group)
    weights = top_k_weights.reshape(-1)[order].to(back.dtype)
    return torch.zeros_like(hidden_states).index_add(0, token, back * weights[:, None])
'''

#: The training export's expert parallelism; it uses DISPATCH_SRC, EXPERT_PARALLEL, DATA_AXIS, MOE_TOKEN_SPLIT,
#: `layout_of`, `_axes` and `_fsdp_mesh`.
EXPERTS_SRC = DISPATCH_SRC + r'''
def _split_data_axis(device_type, shape, names):
    """The world mesh with the data axis built as (edp, ep) and flattened back under its name: ep takes
    consecutive ranks of it, as the declaration folds expert parallelism into data parallelism."""
    at = names.index(DATA_AXIS)
    mesh = init_device_mesh(device_type, shape[:at] + (shape[at] // EXPERT_PARALLEL, EXPERT_PARALLEL) + shape[at + 1:],
                            mesh_dim_names=names[:at] + ("edp", "ep") + names[at + 1:])
    mesh[("edp", "ep")]._flatten(DATA_AXIS)
    return mesh


def _stacked(module):
    """The names of a module's stacked-expert parameters (3-D, experts first)."""
    return [n for n, p in module._parameters.items() if p is not None and p.dim() == 3]


def _forward_by(module, func):
    """Whether the export has replaced `module`'s forward by `func` (bound to it with partial)."""
    forward = module.__dict__.get("forward")
    return isinstance(forward, partial) and forward.func is func


def apply_expert_parallel(model, mesh):
    """Keep this rank's share of each stacked-experts module declared split over ep, and route its tokens."""
    if EXPERT_PARALLEL == 1:
        return model
    group, rank = mesh["ep"].get_group(), mesh["ep"].get_local_rank()
    for path, module in model.named_modules():
        names = _stacked(module)
        if not path or not names or "ep" not in _axes(layout_of(f"{path}.{names[0]}")["dims"][0]):
            continue
        experts = getattr(module, "num_experts", None)
        routed = len(inspect.signature(module.forward).parameters) >= 3  # tokens, their experts, their weights
        if not isinstance(experts, int) or experts % EXPERT_PARALLEL or not routed:
            raise ValueError(f"{path} ({type(module).__name__}) is declared split over ep {EXPERT_PARALLEL}, but "
                             f"the export splits Hugging Face experts modules (num_experts divisible by ep, and "
                             f"forward(hidden_states, top_k_index, top_k_weights)); it has num_experts={experts!r}")
        share = experts // EXPERT_PARALLEL
        for name, p in list(module._parameters.items()):
            if p is not None and p.dim() >= 2 and p.shape[0] == experts:  # weights and per-expert biases
                module._parameters[name] = nn.Parameter(p.detach()[rank * share:(rank + 1) * share].clone(),
                                                        requires_grad=p.requires_grad)
        module.num_experts = share
        owner = torch.arange(experts) // share
        module.forward = partial(_dispatched, module.forward, group, owner, rank * share)
    return model


def shard_experts(model, mesh, kwargs):
    """FSDP2 on each routed experts module over where its copies are, its edp ranks, before the layers around it
    (FSDP2 wraps the innermost modules first)."""
    edp = "edp_tp" if MOE_TOKEN_SPLIT else "edp"  # times tp where each tensor rank routes its own tokens
    for module in [m for _, m in model.named_modules() if _forward_by(m, _dispatched)]:
        fully_shard(module, **dict(kwargs, mesh=_fsdp_mesh(mesh, edp)))
'''

__all__ = ["DISPATCH_SRC", "EXPERTS_SRC"]
