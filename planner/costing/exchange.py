"""Traffic beside the tensor axis, per layer: context parallelism's K/V ring and mixture-of-experts exchange.

Context parallelism (ring attention: Liu et al. 2023; Megatron-Core's
p2p context parallelism): each rank keeps 1/cp of the sequence and the K
and V of every other rank pass it once, forward; backward they pass again
and their gradients travel back (about an all-gather and a reduce-scatter
of the whole K and V). K and V travel as stored, at their own (GQA) head
count, before the kernel broadcasts them to the query heads (Transformer
Engine context_parallel.py, AttnFuncWithCPAndKVP2P, sends the kv chunks of
num_gqa_groups heads). With the stack's overlap the exchange runs beside
the attention kernel it feeds and only what outlasts the kernel shows.

Mixture of experts (Megatron-Core's MoE parallel folding, Liu et al. 2025;
DeepSeek-V3 section 3.2; `cost_models.expert_dispatch`): the tokens of a
rank (its 1/(tp x cp) share of the micro-batch, sequence-split over the
tensor ranks) are dispatched, each to its top-k experts, over the
expert-parallel group, and combined back: the same exchange model as
serving, direct (all-to-all; here NCCL's, one message a peer: `exchange_s`'s
per_peer) or hierarchical (DeepEP's normal kernels, one
copy per destination node, so where a token's experts sit matters: the
stack's routing, `outer_groups`). With etp > 1 the all-to-all dispatcher
also all-gathers the dispatched tokens over the expert-tensor group and
reduce-scatters the expert outputs back (Megatron-LM
MoEAlltoAllTokenDispatcher: gather_from_sequence_parallel_region over the
expert-tensor group); the hierarchical (flex: DeepEP, HybridEP) dispatcher
instead sends over one group of ep x etp ranks, a token's copy to each
expert-tensor rank of its experts' ranks (MoEFlexTokenDispatcher, whose
routing map is replicated across the expert-tensor group), so those copies
share the crossing of the outer level and are forwarded inside the node by
the same kernel. Backward runs the transposed exchanges; a recomputed MoE
layer runs its forward exchanges again (`reruns_exchange`). The all-to-all
dispatcher also regroups what it receives by local expert and back
(`sort_chunks_s`), memory-bound passes charged to the layer's compute.
"""

from __future__ import annotations

from cost_models import Cluster, place_group
from cost_models.collectives import all_gather_s, reduce_scatter_s
from cost_models.compute import copy_s
from cost_models.expert_dispatch import (contiguous_groups, exchange_s, expected_groups, limited_groups,
                                         limited_members)

from planner.costing.block_costs import Parts
from planner.costing.execution import Execution
from planner.graph.blocks import Structure
from planner.search.space import REPLICATED
from planner.strategy import Strategy


def attention_cores(facts, structure: Structure, flash: bool) -> dict[str, list[tuple[tuple[int, ...], tuple]]]:
    """Per block, its attention cores as (the nodes whose times are the core's windows, the K and V tensors as
    stored): a flash kernel's anchor, or an unfused core's ops (found once per graph and kernel kind)."""
    key = ("attention_cores", flash)
    if key in facts.derived:
        return facts.derived[key]
    graph = facts.graph
    out: dict[str, list[tuple[tuple[int, ...], tuple]]] = {}
    for blk in structure.blocks:
        cores = []
        if flash:
            regions = {facts.region_of[i].anchor: facts.region_of[i] for i in blk.nodes if i in facts.region_of}
            for r in regions.values():
                cores.append(((r.anchor,), (facts.roots.get(r.k, r.k), facts.roots.get(r.v, r.v))))  # GQA: as stored
        else:
            ops = tuple(i for i in blk.nodes if i in facts.core)
            kv = tuple(graph.nodes[i].inputs[1] for i in ops if graph.nodes[i].op_type in ("MatMul", "Einsum")
                       and not any(x in facts.params for x in graph.nodes[i].inputs))
            if kv:
                cores.append((ops, kv))
        if cores:
            out[blk.name] = cores
    facts.derived[key] = out
    return out


def add_context_exchange(facts, structure: Structure, cluster: Cluster, strategy: Strategy, execution: Execution,
                         timer, tensor_bytes, layout, policy, block_parts: dict[str, Parts]) -> None:
    """K/V ring of each attention core, per micro-batch, into the blocks' `cp_fwd` / `cp_bwd`."""
    t, cp = strategy.tp, strategy.cp
    if cp <= 1:
        return
    spans = place_group(cluster, cp, stride=t)
    shard = lambda x: tensor_bytes(x) / (t if layout.get(x, REPLICATED) >= 0 else 1)  # noqa: E731
    hide = execution.overlap_cp_comm
    seconds: dict[tuple, tuple[float, float]] = {}  # tied layers share their cores' shapes: each timed once
    for name, cores in attention_cores(facts, structure, execution.attention == "flash").items():
        p = block_parts[name]
        for ops, kv in cores:
            moved = sum(shard(x) for x in kv if x) * cp
            shape = (tuple(facts.node_keys[i] for i in ops), moved)
            if shape not in seconds:
                fwd_window = sum(timer.forward(i, t) for i in ops)
                bwd_window = sum(timer.backward(i, t) for i in ops)
                ag, rs = all_gather_s(moved, spans), reduce_scatter_s(moved, spans)
                seconds[shape] = ((max(0.0, ag - fwd_window), max(0.0, ag + rs - bwd_window)) if hide
                                  else (ag, ag + rs))
            f, b = seconds[shape]
            p.cp_fwd += f
            p.cp_bwd += b + (f if policy.get(name) == "full" else 0.0)


def add_expert_exchange(facts, cluster: Cluster, strategy: Strategy, execution: Execution, width: float,
                        batch_share: float, policy, block_parts: dict[str, Parts]) -> None:
    """Dispatch and combine of each MoE layer, per micro-batch, into the blocks' `ep_fwd` / `ep_bwd`; and, for the
    1F1B overlap's pairing, the layer's whole compute (`moe_fwd`, `moe_bwd`): after `add_routed`, so with its
    experts in it."""
    t, cp, ep, etp = strategy.tp, strategy.cp, strategy.ep, strategy.expert_tp
    if not facts.moe or (ep <= 1 and etp <= 1):
        return
    hierarchical = execution.moe_dispatcher == "deepep"
    flex = hierarchical and etp > 1  # one exchange over the ep x etp ranks (see the module docstring)
    ep_spans = place_group(cluster, ep * etp, stride=1) if flex else (
        place_group(cluster, ep, stride=etp) if ep > 1 else ())
    etp_spans = place_group(cluster, etp, stride=1) if etp > 1 and not flex else ()
    seconds: dict[tuple, float] = {}  # the layers of a model mostly share their shapes: each exchange timed once
    for name, f in facts.moe.items():
        tokens = f.tokens * batch_share / (cp * t)  # this rank's tokens per micro-batch
        token_bytes = f.hidden * width
        shape = (tokens, f.top_k, f.experts, token_bytes)
        if shape not in seconds:
            # where a token's copies go matters only to a hierarchical exchange (an all-to-all sends each peer its
            # share)
            outer, ranks = destinations(f.top_k, f.experts, ep, ep_spans, execution, etp if flex else 1) \
                if ep_spans and hierarchical else (None, None)
            one_way = exchange_s(tokens, f.top_k, token_bytes, ep_spans, hierarchical, outer, ranks,
                                 per_peer=not hierarchical) \
                if ep_spans else 0.0
            seconds[shape] = 2.0 * one_way  # dispatch, then combine
            if etp_spans:
                pairs = tokens * f.top_k * token_bytes * etp  # the expert-tensor group's routed tokens, gathered
                seconds[shape] += all_gather_s(pairs, etp_spans) + reduce_scatter_s(pairs, etp_spans)
        load = execution.routed_load(ep, f.experts)  # the busiest rank's tokens: it ends each exchange last
        fwd = seconds[shape] * load
        p = block_parts[name]
        again = reruns_exchange(policy.get(name, "none"), execution)
        p.ep_fwd += fwd
        p.ep_bwd += fwd * (2.0 if again else 1.0)
        if not hierarchical and ep > 1 and f.experts > ep:  # received chunks regrouped by local expert, and back
            regroup = 2.0 * load * sort_chunks_s(cluster, tokens * f.top_k * max(etp, 1) * token_bytes)
            p.forward += regroup
            p.backward += regroup
            p.recompute += regroup if again else 0.0
        p.moe_layers += 1.0
        p.moe_fwd += p.forward
        p.moe_bwd += p.backward + p.recompute


def sort_chunks_s(cluster: Cluster, nbytes: float) -> float:
    """One regrouping of `nbytes` of received tokens (read and written once): the all-to-all dispatcher's
    sort_chunks_by_idxs, which puts the chunks that arrived from each expert-parallel rank in the order of the
    local experts after the dispatch, and back before the combine, whenever a rank holds more than one expert
    (Megatron-LM token_dispatcher.py, MoEAlltoAllTokenDispatcher.dispatch_postprocess and combine_preprocess;
    the flex dispatchers receive tokens already laid out by expert). Backward runs the inverse permutations."""
    return copy_s(cluster, nbytes)


def reruns_exchange(policy: str, execution: Execution) -> bool:
    """Whether a MoE layer's backward runs its forward dispatch and combine again: under full recompute, and
    under selective recompute of the moe module, which checkpoints the whole MoE forward, routing, dispatch,
    experts and combine (Megatron-LM moe_layer.py: MoELayer.forward wraps custom_forward in checkpoint)."""
    return policy == "full" or (policy == "selective" and execution.selective == "modules"
                                and "moe" in execution.recompute_modules)


def destinations(top_k: int, experts: int, ep: int, spans, execution: Execution,
                 etp: int = 1) -> tuple[float | None, float | None]:
    """(distinct outermost groups, distinct ranks) of the group `spans` one token's experts are on, by the
    stack's routing; None where the exchange model's default (uniform picks) holds. With `etp` > 1 the group
    is ep x etp ranks, each expert rank's etp consecutive ranks all receiving its tokens (the flex dispatcher)."""
    g = spans[-1].participants if len(spans) > 1 else 1
    if execution.moe_routing == "contiguous":
        per_rank = max(1.0, experts / ep)
        ranks = (top_k + per_rank - 1.0) / per_rank
        return (contiguous_groups(top_k, experts, ep, max(1, ep // g)) if g > 1 else None), ranks * etp
    limit, groups = execution.moe_group_limit, execution.moe_groups
    if limit and groups:  # the limit counts groups of experts, laid out in order over the ranks and the nodes
        return (limited_members(top_k, g, groups, limit) if g > 1 else None), \
            limited_members(top_k, ep, groups, limit) * etp
    ranks = expected_groups(top_k, ep) * etp if etp > 1 else None
    if limit and g > 1:  # the limit counts nodes
        return limited_groups(top_k, g, limit), ranks
    return None, ranks


__all__ = ["add_context_exchange", "add_expert_exchange", "attention_cores", "destinations", "reruns_exchange",
           "sort_chunks_s"]
