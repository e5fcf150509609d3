"""Per-stage costs of one strategy: time per micro-batch by kind, and memory per device.

The graph is costed once per strategy: op times at the micro-batch and shard they run on, tensor-parallel layouts
from the intra-op solver, context- and expert-parallel traffic per attention core and MoE layer, and the tensors each
op keeps for backward (with recompute and layouts applied). Layers are then cut into pipeline stages (and interleaved
chunks), and each stage sums its blocks. `step_time` turns these into a step.
"""

from __future__ import annotations

from copy import copy
from dataclasses import dataclass, field, fields, replace
from typing import Mapping

import numpy as np

from cost_models import Cluster, place_group
from cost_models.collectives import all_gather_s, all_reduce_s, all_to_all_s, reduce_scatter_s
from cost_models.compute import copy_s
from cost_models.memory import inflight_microbatches

from planner.costing.attribution import add_routed, block_parts, gemm_windows, var_parts
from planner.costing.block_costs import (Layouts, Parts, activation_bytes, keeps_input, layout_memory, layout_table,
                                         residual_pins)
from planner.costing.exchange import add_context_exchange, add_expert_exchange
from planner.costing.graph_facts import GraphFacts
from planner.costing.node_times import DTYPE_WIDTH, NodeTimes
from planner.costing.node_work import FLOAT_DTYPES
from planner.costing.pipeline_cut import assign_chunks, even_split, layer_policies
from planner.costing.program_charges import add_optimizer_steps, add_weight_traffic
from planner.costing.recompute import recompute_marks
from planner.costing.stage_memory import gathered, held_activations, stage_memory, working_copies
from planner.errors import Infeasible, InvalidInput
from planner.graph.blocks import Structure
from planner.graph.ir import Graph
from planner.search.charges import edge_costs
from planner.search.intra_op import IMPOSSIBLE_S, detach
from planner.search.skeleton import build_skeleton, price
from planner.search.solve import WALL_LIMIT_S, solve_intra_op
from planner.search.space import REPLICATED
from planner.strategy import Strategy, Workload


@dataclass(frozen=True, slots=True)
class StageCost:
    index: int
    layers: tuple[str, ...]
    parts: Parts
    forward_s: float
    backward_s: float
    dense_params: float  # per device, after tensor sharding
    expert_params: float  # per device, after tensor and expert sharding
    memory_bytes: Mapping[str, float]
    boundary_bytes: float  # activation sent to the next stage per micro-batch
    held: float  # micro-batches whose activations the stage holds at its peak
    gather_bytes: float = 0.0  # the part of the boundary held whole by every tensor rank: all-gathered after the p2p
    tp: int = 1  # the stage's tensor-parallel degree (stages may differ: `Strategy.stage_tp`)
    fp8_params: float = 0.0  # per device, of dense_params + expert_params: the weights that feed FP8 GEMMs
    activation_bytes: float = 0.0  # kept for backward at the stage's peak (all in-flight micro-batches), before offload
    widest_params: float = 0.0  # the largest layer's parameters ZeRO-3 gathers at once (`working_copies`)
    layer_params: float = 0.0  # the largest layer's parameters per device (what offloaded ones are staged by)


@dataclass(frozen=True, slots=True)
class StageCosts:
    stages: tuple[StageCost, ...]
    forward_flops_per_sample: float
    layout_source: tuple = field(compare=False)  # (structure, problem, choice, param keys) `layouts` names, or ()
    solver_gap: float
    block_s: Mapping[str, float] = field(default_factory=dict)  # forward + backward per micro-batch, per block
    block_act_bytes: Mapping[str, float] = field(default_factory=dict)  # kept for backward, per micro-batch
    block_loss_bytes: Mapping[str, float] = field(default_factory=dict)  # of block_act_bytes: the loss's peak
    block_params: Mapping[str, tuple[float, float]] = field(default_factory=dict)  # (dense, expert) per device
    param_layouts: Mapping[str, int] = field(default_factory=dict)  # parameter -> dim split over tp, or REPLICATED
    mtp_layers: int = 0  # of the layers, the last ones that are multi-token-prediction depths (`graph.mtp`)
    block_parts: Mapping[str, Parts] = field(default_factory=dict)  # the seconds of `block_s`, by kind, per block

    def __eq__(self, other: object) -> bool:
        """Equal costings: every field and the layouts they name (`layout_source` holds arrays, compared so)."""
        if not isinstance(other, StageCosts):
            return NotImplemented
        same = all(getattr(self, f.name) == getattr(other, f.name) for f in fields(self) if f.compare)
        return same and self.layouts == other.layouts

    @property
    def layouts(self) -> Mapping[str, Mapping[str, str]]:
        """Per block type, the layout chosen for each parameter (`block_costs.layout_table`), named when asked: an
        estimate prints them once, where a search costs thousands of strategies that never do."""
        return layout_table(*self.layout_source) if self.layout_source else {}


def stage_costs(
    graph: Graph,
    structure: Structure,
    cluster: Cluster,
    workload: Workload,
    strategy: Strategy,
    *,
    time_limit_s: float = WALL_LIMIT_S,
    style: str | None = None,
    facts: GraphFacts | None = None,
    param_pins: Mapping[str, int] | None = None,
    memory_constraint: bool = False,
    solver: str = "highs",
    weight_traffic: bool = False,
) -> StageCosts:
    """Costs of each pipeline stage; `style` is the tensor-parallel layout space ('megatron' or 'free').

    With `memory_constraint`, the layouts are chosen under one HBM constraint per stage (slower layouts
    that fit); without it, the fastest layouts (`estimate` falls back to the constraint when those do
    not fit).

    With `weight_traffic` (ZeRO-3), the layout program also charges each weight the data-parallel traffic its
    stored shard costs a micro-batch (`add_weight_traffic`).

    Pass the same `facts` to score many strategies of one graph: the graph
    analysis, the problem skeleton per tensor-axis size and the solved
    layouts per (size, style) are then reused. `param_pins` fixes parameters' tensor-axis layouts (name ->
    the dim split over tp, or REPLICATED), as a hand-edited declaration asks; the solver chooses the rest.
    """
    facts = facts or GraphFacts(graph, structure)
    if strategy.stage_tp:
        return _unequal_stage_costs(graph, structure, cluster, workload, strategy, time_limit_s=time_limit_s,
                                    style=style, facts=facts, param_pins=param_pins,
                                    memory_constraint=memory_constraint, solver=solver)
    style = style or ("free" if strategy.layouts == "searched" else "megatron")
    execution = workload.execution
    t, cp, pp = strategy.tp, strategy.cp, strategy.pp
    training = workload.mode == "train"
    timer = NodeTimes(facts, cluster, workload, strategy, execution)
    width, fscale, bs = timer.width, timer.fscale, timer.bs
    params = facts.params
    fp8_inputs = timer.fp8 and execution.fp8_saves_inputs

    # -- recompute: which nodes run their forward again, layer by layer ------------------------------
    grad = facts.grad if training else set()
    chunk = assign_chunks(structure, pp * strategy.vpp, strategy.stage_layers)
    policy = layer_policies(structure, chunk, strategy, facts.mtp_layers()) if training else {}
    again = recompute_marks(facts, structure, policy, execution) if training else np.zeros(len(graph.nodes), int)

    # -- the layout program over the tensor axis ----------------------------------------------------
    tp_spans = place_group(cluster, t, stride=1) if t > 1 else ()

    # FP8 training whose stack quantizes before the sequence-parallel all-gathers: they move one byte per element
    # (the output head's 16-bit gather too: one of some four gathers per layer)
    gather_scale = 1.0 / width if timer.fp8 and execution.fp8_tp_all_gather else 1.0

    # a stack that shards the sequence after the batch dimension copies NCCL's dim-0 buffers once more (read and
    # written): every reduce-scatter's input, and an all-gather's output unless the micro-batch is one sequence;
    # not when its TP overlap fuses the collectives into the GEMMs (`Execution.tp_layout_copies`)
    copies = execution.tp_layout_copies and strategy.sp and not execution.overlap_tp_comm
    gather_copy = copies and strategy.micro_batch > 1

    def comm_time(kind: str, nbytes: float) -> float:
        if kind == "all_reduce":
            return all_reduce_s(nbytes, tp_spans)
        if kind == "all_gather":
            moved = nbytes * gather_scale
            return all_gather_s(moved, tp_spans) + (copy_s(cluster, moved) if gather_copy else 0.0)
        if kind == "reduce_scatter":
            return reduce_scatter_s(nbytes, tp_spans) + (copy_s(cluster, nbytes) if copies else 0.0)
        return all_to_all_s(nbytes / t, tp_spans)

    def tensor_bytes(name: str) -> float:
        tt = graph.tensors[name]
        nb = tt.nbytes * (fscale if tt.dtype in FLOAT_DTYPES else 1.0)
        return nb if name in params else nb * bs / cp

    node_keys, param_keys = facts.node_keys, facts.param_keys
    space = ("megatron_sp" if strategy.sp else "megatron") if style == "megatron" else style
    skey = (t, space, training)
    # the program and its vars' seconds depend on the tensor axis, the micro-batch, the context degree and which nodes
    # run again, not on the expert degrees (the routed experts are detached) or the pipeline; with a stack that casts
    # FP8 weights once per step, also on the micro-batches the cast is spread over
    hardware = (cluster.scaled(1), tp_spans)  # the device count reaches the program only through tp_spans
    tkey = (skey, strategy.sp, cp, strategy.micro_batch, workload.seq_len, workload.dtype, execution, hardware,
            again.tobytes(), timer.weight_casts)
    if tkey not in facts.priced:
        if skey not in facts.skeletons:
            skel = build_skeleton(graph, node_keys, param_keys, t, training, space, grad)
            if training:  # inputs a contraction keeps for its backward are gathered again there (`keeps_input`)
                skel = replace(skel, regather=tuple(keeps_input(graph, skel.vars[e[2]].node, e[3], grad)
                                                    for e in skel.edges))
            facts.skeletons[skey] = skel
        facts.priced[tkey] = _priced(facts, facts.skeletons[skey], timer, t, again, training, comm_time,
                                     tensor_bytes, cluster, execution, strategy.sp)
    problem, detached = facts.priced[tkey]
    # a weight's layout sets the optimizer's work on it, once a step: a micro-batch's share of the step over its
    # shard (layouts reused across micro-batch and ZeRO choices, `reuse_layouts`, take it unsharded, per step)
    opt_key = (1, 1, 0.0)
    if training and not facts.reuse_layouts:
        opt_key = (strategy.dp * cp if strategy.zero >= 1 else 1, strategy.micro_batches(workload),
                   strategy.offload_fraction("optimizer"))
    gap = 0.0
    constrain = training and memory_constraint
    ckey = (skey, strategy.sp, cp, workload.seq_len, workload.dtype, execution, hardware)
    if not facts.reuse_layouts:
        ckey += (strategy.micro_batch, strategy.recompute, strategy.full_recompute_layers, constrain, opt_key)
        if constrain:
            ckey += (strategy.pp, strategy.vpp, strategy.stage_layers, strategy.zero, strategy.offload,
                     strategy.dp, strategy.ep, strategy.micro_batches(workload), strategy.flushes,
                     cluster.device.hbm_bytes)
    if param_pins:
        ckey += (tuple(sorted(param_pins.items())),)
    if solver != "highs":
        ckey += (solver,)
    weight_traffic = weight_traffic and training and strategy.zero >= 3 and strategy.dp * cp > 1
    if weight_traffic:  # the data-parallel group's placement: the whole cluster
        ckey += ("weight_traffic", strategy.dp, strategy.zero, cluster)
    if t == 1:
        choice = tuple(0 for _ in problem.vars)
    elif ckey in facts.choices:
        choice, gap = facts.choices[ckey]
    else:
        problem.edge_costs = edge_costs(problem)  # kept from its first solve: later ones add only unary costs
        program = copy(problem)  # the shared priced program stays as priced: this solve's charges go on a copy
        program.unary = list(problem.unary)
        if training:  # only the program reads them: a cached choice needs none
            add_optimizer_steps(program, graph, facts, cluster, workload, t, *opt_key)
        if weight_traffic:
            gather = 1.0 if timer.fp8 and execution.fp8_all_gather else width
            add_weight_traffic(program, graph, facts, cluster, strategy, t, gather, execution.grad_bytes)
        allowed = residual_pins(graph, structure, program, workload.seq_len, strategy.sp)
        pins = dict(param_pins or {})
        if space != "free":  # Megatron-Core keeps each MoE router whole on every tensor rank (TopKRouter)
            pins = {p: REPLICATED for p in facts.router_params if p in facts.param_keys} | pins
        for p, want in sorted(pins.items()):
            v_i = program.index[facts.param_keys[p]]
            ok = frozenset(k for k, s in enumerate(program.vars[v_i].strategies) if s.outputs[0] == want)
            allowed[v_i] = ok & allowed.get(v_i, ok)
        for v_i in detached:
            allowed[v_i] = frozenset((0,))
        if constrain:  # the integer program's memory constraints, one per stage
            schedule = "interleaved" if strategy.vpp > 1 else strategy.schedule
            m = strategy.schedule_micro_batches(workload)
            rows = [({b.name for b in structure.blocks if chunk[b.name] % pp == s},
                     inflight_microbatches(schedule, pp=pp, microbatches=m, stage=s, virtual_stages=strategy.vpp))
                    for s in range(pp)]
            program.memory = layout_memory(facts, structure, program, strategy, execution, policy, rows, width,
                                           bs / cp, fp8_inputs)
            program.memory_budget = execution.usable_hbm_bytes(cluster.device.hbm_bytes)
        try:
            sol = solve_intra_op(program, time_limit_s=time_limit_s, allowed=allowed, backend=solver)
            if constrain and sol.cost_s >= IMPOSSIBLE_S:  # fitting would need a move no collective makes
                raise Infeasible("no layout fits")
        except Infeasible:  # no layout fits: the fastest one, reported as over memory
            program.memory_budget = None
            sol = solve_intra_op(program, time_limit_s=time_limit_s, allowed=allowed, backend=solver)
        choice, gap = sol.choice, sol.gap
        facts.choices[ckey] = (choice, gap)

    # -- time per block ----------------------------------------------------------------------------
    layout_of_output = Layouts(facts, problem, choice)
    vkey = (tkey, choice)
    if vkey not in facts.var_seconds:
        by_var = var_parts(problem, choice, timer, t, again, training, detached)
        facts.var_seconds[vkey] = (by_var, block_parts(structure, problem, by_var),
                                   *_block_weights(graph, structure, facts, layout_of_output, tensor_bytes, t))
    parts_of_var, shared, param_layout, per_block = facts.var_seconds[vkey]
    bad = [v_i for v_i, vp in enumerate(parts_of_var) if vp.tp_kinds.get("impossible")] if param_pins else []
    if bad:
        node = graph.nodes[problem.vars[bad[0]].node]
        read = [x for x in node.inputs if x in param_pins] or ["its weight"]
        raise InvalidInput(f"op {node.name!r} cannot read the declared layout of {read[0]} in the {space!r} "
                           "tensor-axis layout space (a stored weight would move, or a split become a pending sum); "
                           "declare the layout the estimator chose, or set layouts.space to searched")
    parts_of_block = {name: p.copy() for name, p in shared.items()}  # the expert and context terms go on copies
    add_routed(facts, timer, t, again, training, parts_of_block)
    add_context_exchange(facts, structure, cluster, strategy, execution, timer, tensor_bytes, layout_of_output,
                         policy, parts_of_block)
    add_expert_exchange(facts, cluster, strategy, execution, width, bs, policy, parts_of_block)

    # -- memory per block ------------------------------------------------------------------------
    act_block, loss_block = (activation_bytes(facts, structure, strategy, execution, problem, choice, layout_of_output,
                                              width, bs / cp, policy, fp8_inputs) if training else ({}, {}))

    # -- stages ----------------------------------------------------------------------------------
    m = strategy.schedule_micro_batches(workload)  # in flight: one schedule's
    schedule = "interleaved" if strategy.vpp > 1 else strategy.schedule
    experts = strategy.ep * strategy.expert_tp
    numels = facts.block_numels()
    block_params = {name: (b.dense, numels[name][1] / experts) for name, b in per_block.items()}
    stages = []
    names_of: list[list[str]] = [[] for _ in range(pp)]  # each stage's blocks, in model order
    for b in structure.blocks:
        names_of[chunk[b.name] % pp].append(b.name)
    for s in range(pp):
        names = names_of[s]
        parts = Parts()
        dense = expert = 0.0
        acts = loss = 0.0
        boundary = gather = 0.0
        widest = layer = 0.0  # the largest layer's sharded parameters per device (what ZeRO-3 gathers), all of them
        fp8_params = 0.0
        for name in names:
            parts.add(parts_of_block[name])
            acts += act_block.get(name, 0.0)
            loss += loss_block.get(name, 0.0)
            dense += block_params[name][0]
            expert += block_params[name][1]
            widest, layer = max(widest, gathered(block_params[name], strategy)), max(layer, sum(block_params[name]))
            b = per_block[name]
            boundary, gather = max(boundary, b.boundary), max(gather, b.gather)
            fp8_params += b.dense_fp8 + numels[name][2] / experts
        fp8_params = fp8_params if timer.fp8 else 0.0
        held = (inflight_microbatches(schedule, pp=pp, microbatches=m, stage=s, virtual_stages=strategy.vpp)
                if training else 1.0)
        kept = held_activations(acts, loss, held)
        mem = stage_memory(dense, expert, kept, strategy, training, width, execution,
                           buffers=working_copies(widest, gathered((dense, expert), strategy), strategy, execution,
                                                  training, width, layer), fp8_params=fp8_params)
        fwd = parts.forward + parts.tp_fwd + parts.cp_fwd + parts.ep_fwd
        bwd = parts.backward + parts.recompute + parts.tp_bwd + parts.cp_bwd + parts.ep_bwd
        stages.append(StageCost(s, tuple(n for n in names if structure.block(n).is_layer), parts, fwd, bwd,
                                dense, expert, mem, boundary, held, gather, t, fp8_params, kept, widest, layer))
    block_s = {name: p.total() for name, p in parts_of_block.items()}
    return StageCosts(tuple(stages), facts.model_flops_per_sample(),
                      (structure, problem, choice, facts.param_keys), gap, block_s, dict(act_block),
                      dict(loss_block), block_params, param_layout, facts.mtp_layers(), dict(parts_of_block))


def _priced(facts: GraphFacts, skel, timer: NodeTimes, t: int, again: np.ndarray, training: bool, comm_time,
            tensor_bytes, cluster: Cluster, execution, sp: bool):
    """The layout program of one tensor-axis costing, priced, with the routed experts detached and the TP
    overlap windows set: (problem, detached vars)."""
    # forward-equivalents per node: 1 + its backward over its forward (at the tensor split) + a recomputed forward
    passes = (1 + again).astype(float)
    if training:
        for v_i, v in enumerate(skel.vars):
            if v.node is not None:
                fwd = timer.forward(v.node, t)
                passes[skel.members[v_i]] += timer.backward(v.node, t) / fwd if fwd > 0 else 0.0
    problem = price(skel, lambda i, s: timer.forward(i, t if s.split else 1), passes, comm_time, tensor_bytes,
                    1 + again)
    detached = {v_i for v_i, v in enumerate(problem.vars) if v.node is not None and facts.in_routed[v.node]}
    detach(problem, detached)
    # TP overlap: the stack hides sequence-parallel gathers and scatters behind the GEMMs next to them
    problem.overlap = cluster.dp_overlap_efficiency if (execution.overlap_tp_comm and sp and training) else 0.0
    if problem.overlap:
        problem.overlap_share = execution.tp_overlap_share
        problem.gemm = gemm_windows(problem, timer, t)
    return problem, detached


@dataclass(frozen=True, slots=True)
class _BlockWeights:
    dense: float  # dense weights' elements per device under the layouts
    dense_fp8: float  # of them, those that feed FP8 GEMMs
    boundary: float  # a layer's inputs per tensor rank: what a pipeline stage starting with it receives
    gather: float  # of them, what the previous layer hands over whole (all-gathered after the p2p)


def _block_weights(graph: Graph, structure: Structure, facts: GraphFacts, layout, tensor_bytes, t: int):
    """Each block's weights per device and pipeline boundary under one costing's layouts: (parameter -> its
    layout, block name -> `_BlockWeights`)."""
    param_layout = {p: layout[p] for p in graph.params}
    out = {}
    for blk in structure.blocks:
        dense = {p: graph.tensors[p].numel / (t if param_layout.get(p, REPLICATED) >= 0 else 1)
                 for p in blk.params if not facts.is_expert(p)}
        boundary = gather = 0.0
        if blk.is_layer:
            ins = facts.layer_inputs[blk.name]
            # Megatron-LM's scatter/gather (Narayanan 2021, section 4.1): each tensor rank sends 1/t of a
            # boundary tensor it holds whole, and the receiving stage all-gathers it over its tensor group
            boundary = sum(tensor_bytes(x) for x in ins) / t
            if t > 1:  # what the previous layer hands over whole (the first layer's input never crosses)
                whole = [x for x in ins if layout.get(x, REPLICATED) < 0 and x in facts.producer
                         and structure.node_block[facts.producer[x][0]] >= 0
                         and structure.blocks[structure.node_block[facts.producer[x][0]]].is_layer]
                gather = sum(tensor_bytes(x) for x in whole)
        out[blk.name] = _BlockWeights(sum(dense.values()), sum(v for p, v in dense.items() if p in facts.fp8_weights),
                                      boundary, gather)
    return param_layout, out


def _unequal_stage_costs(graph: Graph, structure: Structure, cluster: Cluster, workload: Workload,
                         strategy: Strategy, **options) -> StageCosts:
    """Stages of different tensor-parallel widths: stage s is costed as it would be in a pipeline whose every
    stage had its width (same cut, same in-flight micro-batches), since a stage's work and memory depend
    only on its own width and position. Every stage uses the widest stage's parameter layouts (what a
    declaration writes, once per block type), each split over its own tensor group."""
    widths = sorted(set(strategy.stage_tp), reverse=True)
    by_width: dict[int, StageCosts] = {}
    for w in widths:
        opts = dict(options)
        if by_width and w > 1 and widths[0] % w == 0:
            opts["param_pins"] = by_width[widths[0]].param_layouts
        by_width[w] = stage_costs(graph, structure, cluster, workload,
                                  replace(strategy, tp=w, stage_tp=(), sp=strategy.sp and w > 1), **opts)
    stages = tuple(by_width[w].stages[s] for s, w in enumerate(strategy.stage_tp))
    wide = by_width[widths[0]]
    return StageCosts(stages, wide.forward_flops_per_sample, wide.layout_source,
                      max(c.solver_gap for c in by_width.values()), wide.block_s, wide.block_act_bytes,
                      wide.block_loss_bytes, wide.block_params, wide.param_layouts, wide.mtp_layers, wide.block_parts)


__all__ = ["DTYPE_WIDTH", "StageCost", "StageCosts", "assign_chunks", "even_split", "stage_costs", "stage_memory",
           "working_copies"]
