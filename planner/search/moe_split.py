"""The routed experts of a MoE model as a program of their own: which nodes they are, what crosses to them,
and what they cost on a group of their own.

The expert region of a MoE layer is every node reading an expert weight,
the matmuls those feed, and the nodes between them (the gated activation
between the up and down projections); everything else (attention, router,
shared experts, the weighting of the experts' outputs) stays with
attention. What enters the region is the dispatched tokens, [E, C, H] with
E x C = tokens x top_k under balanced routing (`models_zoo.moe`); what
leaves it is their results, the same size.

The expert group holds each expert on one device (the busiest device holds
experts / devices of them, rounded up), or replicates the experts when it
has more devices than experts, each replica taking its share of that
expert's tokens. Its op times are priced as `stage_costs` prices them, at
the tokens one device receives; backward is twice a matmul's forward and
once a memory-bound op's (Narayanan 2021, section 5.1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping


from cost_models import Cluster, place_group
from cost_models.collectives import all_gather_s, reduce_scatter_s
from cost_models.compute import op_time_s
from cost_models.memory import MEGATRON_ADAM, model_state_bytes
from cost_models.overlap import exposed_dp_reduction_s

from planner.costing.estimate import fits_memory
from planner.graph.blocks import Structure, discover_blocks
from planner.graph.ir import Graph
from planner.graph.moe import MoeFacts
from planner.graph.subgraph import extract
from planner.costing.graph_facts import GraphFacts
from planner.costing.node_work import FLOAT_DTYPES
from planner.search.mpmd import Program
from planner.costing.stage_costs import DTYPE_WIDTH
from planner.costing.node_times import optimizer_step_s
from planner.strategy import Workload

@dataclass(frozen=True, slots=True)
class MoeSplit:
    """The model cut into its attention program and, per MoE layer, the nodes of its routed experts."""

    attention: Program
    regions: Mapping[str, tuple[int, ...]]  # MoE layer block -> expert nodes (indices into the full graph)
    experts: int  # routed experts per layer
    expert_params: float  # parameters of all routed experts
    dispatch_bytes: Mapping[str, float]  # per MoE layer, per sample of the imported graph: tokens to the experts
    combine_bytes: Mapping[str, float]  # and back


def expert_regions(graph: Graph, structure: Structure, moe: Mapping[str, MoeFacts]) -> dict[str, tuple[int, ...]]:
    """Per MoE block, the routed experts' nodes: those reading the block's routed weights and the contractions
    that use them (`moe`, found from each router: `graph.moe`; through a dynamo export's Transpose and
    per-token Gather of the stacked weights too), and every node on a path between the two (the activation
    between the up and down projections)."""
    out: dict[str, tuple[int, ...]] = {}
    for blk in structure.blocks:
        if blk.name not in moe:
            continue
        weights, contractions = moe[blk.name].params, moe[blk.name].expert_nodes
        nodes = sorted(blk.nodes)
        readers = {i for i in nodes if any(x in weights for x in graph.nodes[i].inputs if x)}
        producer = {o: i for i in nodes for o in graph.nodes[i].outputs if o}
        below = set(readers)  # descendants of the weight readers, in graph (topological) order
        for i in nodes:
            if i not in below and any(producer.get(x) in below for x in graph.nodes[i].inputs if x):
                below.add(i)
        above = {i for i in contractions if i in below}  # their ancestors, the experts' activation among them
        for i in reversed(nodes):
            if i in above:
                above.update(producer[x] for x in graph.nodes[i].inputs if x in producer)
        out[blk.name] = tuple(sorted(readers | (below & above)))
    return out


def split_moe(graph: Graph, structure: Structure, facts: GraphFacts) -> MoeSplit | None:
    """The attention program and the expert regions, or None for a model without routed experts."""
    regions = expert_regions(graph, structure, facts.moe)
    if not regions:
        return None
    inside = {i for r in regions.values() for i in r}
    attn = extract(graph, [i for i in range(len(graph.nodes)) if i not in inside], "attention")
    attention = Program("attention", tuple(s.name for s in structure.submodels), attn, discover_blocks(attn))
    params = set(graph.params)
    dispatch, combine = {}, {}
    batch = facts.work.batch
    experts = 0
    for name, region in regions.items():
        members = set(region)
        produced = {o for i in region for o in graph.nodes[i].outputs if o}
        ins = {x for i in region for x in graph.nodes[i].inputs if x and x not in params and x not in produced
               and x in facts.producer and facts.producer[x][0] not in members
               and graph.tensors[x].dtype in FLOAT_DTYPES}
        outs = {o for o in produced if o in attn.tensors and graph.tensors[o].dtype in FLOAT_DTYPES}
        dispatch[name] = sum(graph.tensors[x].nbytes for x in sorted(ins)) / batch
        combine[name] = sum(graph.tensors[x].nbytes for x in sorted(outs)) / batch
        experts = max(experts, facts.moe[name].experts)
    expert_params = float(sum(graph.tensors[p].numel for p in sorted(facts.expert_params)))
    return MoeSplit(attention, regions, experts, expert_params, dispatch, combine)


@dataclass(frozen=True, slots=True)
class ExpertGroup:
    """The expert group's costs on `devices` devices, per micro-batch of `samples` samples."""

    devices: int
    layer_s: Mapping[str, tuple[float, float]]  # per MoE layer, per micro-batch: (forward, backward)
    tail_s: float  # gradient reduction among replicas (exposed) and the optimizer step
    memory_bytes: Mapping[str, float]
    fits: bool
    recompute: bool = False  # the expert FFN runs its forward again in backward

    def busy_s(self, microbatches: int) -> float:
        return microbatches * sum(f + b for f, b in self.layer_s.values())


def expert_group(split: MoeSplit, facts: GraphFacts, cluster: Cluster, workload: Workload, devices: int,
                 samples: float, microbatches: int, in_flight: int = 1) -> ExpertGroup:
    """Costs of the routed experts on their own group (`cluster` is the group), tokens balanced over experts:
    a micro-batch is `samples` samples of all attention replicas together, `in_flight` of them at once
    keep their activations for backward. When those do not fit, the experts keep only the tokens they
    received and run their forward again in backward (full recompute of the expert FFN)."""
    kept = _expert_group(split, facts, cluster, workload, devices, samples, microbatches, in_flight, False)
    if kept.fits:
        return kept
    again = _expert_group(split, facts, cluster, workload, devices, samples, microbatches, in_flight, True)
    return again if again.fits else kept


def _expert_group(split: MoeSplit, facts: GraphFacts, cluster: Cluster, workload: Workload, devices: int,
                  samples: float, microbatches: int, in_flight: int, recompute: bool) -> ExpertGroup:
    work = facts.work
    width = DTYPE_WIDTH.get(workload.dtype, 2.0)
    fscale = width / work.float_bytes
    per_device = math.ceil(split.experts / devices)  # experts on the busiest device
    replicas = max(1, devices // split.experts)
    share = per_device / split.experts / replicas  # of every expert node's tokens and flops, on that device
    held = per_device / split.experts  # of every expert weight
    act = facts.act_bytes(True, width)
    scale = samples / work.batch
    by_node = facts.saved_by_node(width)
    layer_s = {}
    saved = 0.0
    for name, region in sorted(split.regions.items()):
        f = b = 0.0
        for i in region:
            kind = "matmul" if work.matrix[i] else "elementwise"
            t = op_time_s(cluster, work.flops[i] * scale * share,
                          (act[i] * scale * share + work.param_bytes[i] * held) * fscale, kind, workload.dtype)
            f += t
            b += (2 if work.matrix[i] else 1) * t + (t if recompute else 0.0)
            if not recompute:
                saved += sum(sv.nbytes for sv in by_node.get(i, ())) * scale * share  # saved at `width` already
        if recompute:  # only the tokens received are kept
            saved += split.dispatch_bytes[name] * work.batch * scale * share * width / work.float_bytes
        layer_s[name] = (f, b)
    local = split.expert_params * held
    states = model_state_bytes(local, zero_stage=1 if replicas > 1 else 0, dp=replicas, state=MEGATRON_ADAM)
    mem = {"params": states.params_bytes, "grads": states.grads_bytes, "optimizer": states.optimizer_bytes,
           "activations": saved * in_flight}
    mem["peak"] = sum(mem.values())
    updated = local / replicas
    tail = optimizer_step_s(cluster, workload, updated)
    if replicas > 1:  # replicas of one expert reduce its gradients (ZeRO-1: reduce-scatter + all-gather)
        spans = place_group(cluster, replicas, stride=split.experts)
        red = reduce_scatter_s(local * MEGATRON_ADAM.grad_bytes, spans) + all_gather_s(local * width, spans)
        backward = microbatches * sum(bw for _, bw in layer_s.values())
        tail += exposed_dp_reduction_s(cluster, red, backward, red / max(1, len(layer_s)))
    return ExpertGroup(devices, layer_s, tail, mem, fits_memory(cluster, mem, workload.execution), recompute)


def expert_flops(split: MoeSplit, facts: GraphFacts) -> float:
    """FLOPs of the routed experts per sample of the imported graph."""
    return float(sum(facts.work.flops[i] for r in split.regions.values() for i in r)) / facts.work.batch
