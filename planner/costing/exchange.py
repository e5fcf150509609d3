"""Traffic beside the tensor axis, per layer: context parallelism's K/V ring and mixture-of-experts exchange.

Context parallelism (ring attention: Liu et al. 2023; Megatron-Core's
p2p context parallelism): each rank keeps 1/cp of the sequence and the K
and V of every other rank pass it once, forward; backward they pass again
and their gradients travel back (about an all-gather and a reduce-scatter
of the whole K and V). With the stack's overlap the exchange runs beside
the attention kernel it feeds and only what outlasts the kernel shows.

Mixture of experts (Megatron-Core's MoE parallel folding, Liu et al. 2025;
DeepSeek-V3 section 3.2; `cost_models.expert_dispatch`): the tokens of a
rank (its 1/(tp x cp) share of the micro-batch, sequence-split over the
tensor ranks) are dispatched, each to its top-k experts, over the
expert-parallel group, and combined back: the same exchange model as
serving, direct (all-to-all) or hierarchical (DeepEP's normal kernels, one
copy per destination node, so where a token's experts sit matters: the
stack's routing, `outer_groups`). With etp > 1 the dispatched tokens are also
all-gathered over the expert-tensor group and the expert outputs
reduce-scattered back. Backward runs the transposed exchanges; a fully
recomputed layer runs its forward exchanges again.
"""

from __future__ import annotations

from cost_models import Cluster, place_group
from cost_models.collectives import all_gather_s, reduce_scatter_s
from cost_models.expert_dispatch import contiguous_groups, exchange_s, limited_groups

from planner.costing.block_costs import Parts
from planner.costing.execution import Execution
from planner.graph.blocks import Structure
from planner.search.space import REPLICATED
from planner.strategy import Strategy


def add_context_exchange(facts, structure: Structure, cluster: Cluster, strategy: Strategy, execution: Execution,
                         timer, tensor_bytes, layout, policy, block_parts: dict[str, Parts]) -> None:
    """K/V ring of each attention core, per micro-batch, into the blocks' `cp_fwd` / `cp_bwd`."""
    t, cp = strategy.tp, strategy.cp
    if cp <= 1:
        return
    spans = place_group(cluster, cp, stride=t)
    graph = facts.graph
    flash = execution.attention == "flash"
    shard = lambda x: tensor_bytes(x) / (t if layout.get(x, REPLICATED) >= 0 else 1)  # noqa: E731
    for blk in structure.blocks:
        cores = []  # (K and V tensors, forward window, backward window)
        if flash:
            for r in {facts.region_of[i].anchor: facts.region_of[i] for i in blk.nodes if i in facts.region_of}.values():
                cores.append(((r.k, r.v), timer.forward(r.anchor, t), timer.backward(r.anchor, t)))
        else:
            kv, fwd, bwd = [], 0.0, 0.0
            for i in blk.nodes:
                if i not in facts.core:
                    continue
                n = graph.nodes[i]
                fwd += timer.forward(i, t)
                bwd += timer.backward(i, t)
                if n.op_type in ("MatMul", "Einsum") and not any(x in facts.params for x in n.inputs):
                    kv.append(n.inputs[1])
            if kv:
                cores.append((tuple(kv), fwd, bwd))
        p = block_parts[blk.name]
        for kv, fwd_window, bwd_window in cores:
            moved = sum(shard(x) for x in kv if x) * cp
            ag, rs = all_gather_s(moved, spans), reduce_scatter_s(moved, spans)
            hide = execution.overlap_cp_comm
            f = max(0.0, ag - fwd_window) if hide else ag
            b = max(0.0, ag + rs - bwd_window) if hide else ag + rs
            p.cp_fwd += f
            p.cp_bwd += b + (f if policy.get(blk.name) == "full" else 0.0)


def add_expert_exchange(facts, cluster: Cluster, strategy: Strategy, execution: Execution, width: float,
                        batch_share: float, policy, block_parts: dict[str, Parts]) -> None:
    """Dispatch and combine of each MoE layer, per micro-batch, into the blocks' `ep_fwd` / `ep_bwd`."""
    t, cp, ep, etp = strategy.tp, strategy.cp, strategy.ep, strategy.expert_tp
    if not facts.moe or (ep <= 1 and etp <= 1):
        return
    ep_spans = place_group(cluster, ep, stride=etp) if ep > 1 else ()
    etp_spans = place_group(cluster, etp, stride=1) if etp > 1 else ()
    hierarchical = execution.moe_dispatcher == "deepep"
    for name, f in facts.moe.items():
        tokens = f.tokens * batch_share / (cp * t)  # this rank's tokens per micro-batch
        token_bytes = f.hidden * width
        outer, ranks = destinations(f.top_k, f.experts, ep, ep_spans, execution) if ep_spans else (None, None)
        one_way = exchange_s(tokens, f.top_k, token_bytes, ep_spans, hierarchical, outer, ranks) if ep_spans else 0.0
        fwd = 2.0 * one_way  # dispatch, then combine
        if etp_spans:
            pairs = tokens * f.top_k * token_bytes * etp  # the expert-tensor group's routed tokens, gathered
            fwd += all_gather_s(pairs, etp_spans) + reduce_scatter_s(pairs, etp_spans)
        p = block_parts[name]
        p.ep_fwd += fwd
        p.ep_bwd += fwd * (2.0 if policy.get(name) == "full" else 1.0)


def destinations(top_k: int, experts: int, ep: int, spans, execution: Execution) -> tuple[float | None, float | None]:
    """(distinct outermost groups, distinct ranks) of the expert-parallel group one token's experts are on, by
    the stack's routing; None where the exchange model's default (uniform picks) holds."""
    g = spans[-1].participants if len(spans) > 1 else 1
    if execution.moe_routing == "contiguous":
        per_rank = max(1.0, experts / ep)
        ranks = (top_k + per_rank - 1.0) / per_rank
        return (contiguous_groups(top_k, experts, ep, max(1, ep // g)) if g > 1 else None), ranks
    if execution.moe_group_limit and g > 1:
        return limited_groups(top_k, g, execution.moe_group_limit), None
    return None, None


__all__ = ["add_context_exchange", "add_expert_exchange", "destinations"]
