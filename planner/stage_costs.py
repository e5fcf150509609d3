"""Per-stage costs of one strategy: time per micro-batch by kind, and memory per device.

The graph is costed once per strategy: op times at the micro-batch and
shard they run on, tensor-parallel layouts from the intra-op solver,
context- and expert-parallel traffic per attention core and MoE layer, and
the tensors each op keeps for backward (with recompute and layouts applied).
Layers are then cut into pipeline stages (and interleaved chunks), and each
stage sums its blocks. `step_time` turns these into a step.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Mapping

import numpy as np

from cost_models import Cluster, place_group
from cost_models.collectives import all_gather_s, all_reduce_s, all_to_all_s, reduce_scatter_s
from cost_models.compute import op_time_s
from cost_models.memory import MEGATRON_ADAM, inflight_microbatches, model_state_bytes

from planner.block_costs import (Layouts, Parts, activation_bytes, add_cp_ep, keeps_input, layout_memory,
                                 layout_table, residual_pins)
from planner.errors import Infeasible, InvalidInput
from planner.graph.blocks import Structure
from planner.graph.ir import Graph
from planner.graph_facts import GraphFacts
from planner.node_work import FLOAT_DTYPES
from planner.search.intra_op import build_skeleton, edge_cost, group_cost, price
from planner.search.solve import solve_intra_op
from planner.search.space import REPLICATED
from planner.strategy import Strategy, Workload

DTYPE_WIDTH = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "fp4": 0.5}


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


@dataclass(frozen=True, slots=True)
class StageCosts:
    stages: tuple[StageCost, ...]
    forward_flops_per_sample: float
    layouts: Mapping[str, Mapping[str, str]]
    solver_gap: float
    block_s: Mapping[str, float] = field(default_factory=dict)  # forward + backward per micro-batch, per block
    block_act_bytes: Mapping[str, float] = field(default_factory=dict)  # kept for backward, per micro-batch
    block_params: Mapping[str, tuple[float, float]] = field(default_factory=dict)  # (dense, expert) per device
    param_layouts: Mapping[str, int] = field(default_factory=dict)  # parameter -> dim split over tp, or REPLICATED


def even_split(n_layers: int, n_chunks: int) -> tuple[int, ...]:
    """Layers per chunk, as even as possible (the remainder goes to the last chunks, away from the embedding)."""
    base, extra = divmod(n_layers, n_chunks)
    return tuple(base + (1 if c >= n_chunks - extra else 0) for c in range(n_chunks))


def assign_chunks(structure: Structure, n_chunks: int, sizes: tuple[int, ...] = ()) -> dict[str, int]:
    """Block name -> pipeline chunk: layers in graph order by `sizes`; other blocks go with their neighbours."""
    layers = [b for b in structure.blocks if b.is_layer]
    if len(layers) < n_chunks:
        raise InvalidInput(
            f"the model has {len(layers)} layers, too few for {n_chunks} pipeline chunks (pp x vpp); lower --pp or --vpp"
        )
    sizes = sizes or even_split(len(layers), n_chunks)
    if sum(sizes) != len(layers):
        raise InvalidInput(f"stage layer counts {list(sizes)} add up to {sum(sizes)}, but the model has {len(layers)} layers")
    out: dict[str, int] = {}
    i = 0
    for c, size in enumerate(sizes):
        for _ in range(size):
            out[layers[i].name] = c
            i += 1
    firsts = [(min(b.nodes) if b.nodes else 0, b.name) for b in layers]
    for b in structure.blocks:
        if b.is_layer:
            continue
        start = min(b.nodes) if b.nodes else 0
        prev = [name for first, name in firsts if first <= start]
        out[b.name] = out[prev[-1]] if prev else 0
    return out


def _layer_policies(structure: Structure, chunk: Mapping[str, int], strategy: Strategy) -> dict[str, str]:
    """Recompute policy per layer block: by its position in its pipeline chunk (Megatron-LM's
    --recompute-num-layers with the block method); blocks that are not layers are not recomputed."""
    seen: dict[int, int] = defaultdict(int)
    out: dict[str, str] = {}
    for blk in structure.blocks:
        if blk.is_layer:
            c = chunk[blk.name]
            out[blk.name] = strategy.layer_policy(seen[c])
            seen[c] += 1
    return out


def stage_costs(
    graph: Graph,
    structure: Structure,
    cluster: Cluster,
    workload: Workload,
    strategy: Strategy,
    *,
    time_limit_s: float = 10.0,
    style: str | None = None,
    facts: GraphFacts | None = None,
    param_pins: Mapping[str, int] | None = None,
    memory_constraint: bool = False,
) -> StageCosts:
    """Costs of each pipeline stage; `style` is the tensor-parallel layout space ('megatron' or 'free').

    With `memory_constraint`, the layouts are chosen under one HBM constraint per stage (slower layouts
    that fit); without it, the fastest layouts (`estimate` falls back to the constraint when those do
    not fit).

    Pass the same `facts` to score many strategies of one graph: the graph
    analysis, the problem skeleton per tensor-axis size and the solved
    layouts per (size, style) are then reused. `param_pins` fixes parameters' tensor-axis layouts (name ->
    the dim split over tp, or REPLICATED), as a hand-edited declaration asks; the solver chooses the rest.
    """
    facts = facts or GraphFacts(graph, structure)
    if strategy.stage_tp:
        return _unequal_stage_costs(graph, structure, cluster, workload, strategy, time_limit_s=time_limit_s,
                                    style=style, facts=facts, param_pins=param_pins,
                                    memory_constraint=memory_constraint)
    style = style or ("free" if strategy.layouts == "searched" else "megatron")
    t, cp, pp = strategy.tp, strategy.cp, strategy.pp
    training = workload.mode == "train"
    dtype = workload.dtype
    width = DTYPE_WIDTH.get(dtype, 2.0)
    work = facts.work
    bs = strategy.micro_batch / work.batch
    fscale = width / work.float_bytes
    params = facts.params

    # -- recompute: which nodes run their forward again, layer by layer ------------------------------
    core = facts.core
    grad = facts.grad if training else set()
    n_chunks = pp * strategy.vpp
    chunk = assign_chunks(structure, n_chunks, strategy.stage_layers)
    policy = _layer_policies(structure, chunk, strategy) if training else {}
    again = np.zeros(len(graph.nodes), dtype=np.int64)
    core_nodes = np.flatnonzero(facts.core_in_layer)
    for blk in structure.blocks:
        rc = policy.get(blk.name, "none")
        if rc == "full":
            again[list(blk.nodes)] = 1
        elif rc == "selective" and blk.nodes:
            mine = core_nodes[(core_nodes >= min(blk.nodes)) & (core_nodes <= max(blk.nodes))]
            again[[i for i in mine if structure.node_block[i] == structure.node_block[blk.nodes[0]]]] = 1

    # -- op time at the micro-batch and shard it runs on --------------------------------------------
    cache: dict[tuple[int, int], float] = {}
    act = facts.act_bytes(training, width)

    def fwd_time(i: int, k: int) -> float:
        key = (i, k)
        if key not in cache:
            flops = work.flops[i] * bs / (k * cp)
            nbytes = (act[i] * bs / cp + work.param_bytes[i]) * fscale / k
            cache[key] = op_time_s(cluster, flops, nbytes, "matmul" if work.matrix[i] else "elementwise", dtype)
        return cache[key]

    # backward: a contraction computes two products (input and weight gradients, Narayanan 2021 section 5.1);
    # a memory-bound op reads the output gradient and what it saved and writes the input gradient, about
    # the traffic of its forward (PyTorch's autograd formulas for softmax, norms, GeLU, dropout, add)
    bwd = np.where(work.matrix, 2, 1)
    passes = (1 + bwd + again) if training else np.ones(len(graph.nodes), dtype=np.int64)

    def var_time(i: int, s) -> float:
        return fwd_time(i, t if s.split else 1)

    tp_spans = place_group(cluster, t, stride=1) if t > 1 else ()

    def comm_time(kind: str, nbytes: float) -> float:
        if kind == "all_reduce":
            return all_reduce_s(nbytes, tp_spans)
        if kind == "all_gather":
            return all_gather_s(nbytes, tp_spans)
        if kind == "reduce_scatter":
            return reduce_scatter_s(nbytes, tp_spans)
        return all_to_all_s(nbytes / t, tp_spans)

    def tensor_bytes(name: str) -> float:
        tt = graph.tensors[name]
        nb = tt.nbytes * (fscale if tt.dtype in FLOAT_DTYPES else 1.0)
        return nb if name in params else nb * bs / cp

    node_keys, param_keys = facts.node_keys, facts.param_keys
    space = ("megatron_sp" if strategy.sp else "megatron") if style == "megatron" else style
    skey = (t, space, training)
    if skey not in facts.skeletons:
        facts.skeletons[skey] = build_skeleton(graph, node_keys, param_keys, t, training, space, grad)
    problem = price(facts.skeletons[skey], var_time, passes, comm_time, tensor_bytes, 1 + again)
    gap = 0.0
    constrain = training and memory_constraint
    ckey = (skey, strategy.sp, cp, workload.seq_len, dtype)
    if not facts.reuse_layouts:
        ckey += (strategy.micro_batch, strategy.recompute, strategy.full_recompute_layers, constrain)
        if constrain:
            ckey += (strategy.pp, strategy.vpp, strategy.stage_layers, strategy.zero, strategy.offload,
                     strategy.dp, strategy.ep, strategy.micro_batches(workload), cluster.device.hbm_bytes)
    if param_pins:
        ckey += (tuple(sorted(param_pins.items())),)
    if t == 1:
        choice = tuple(0 for _ in problem.vars)
    elif ckey in facts.choices:
        choice, gap = facts.choices[ckey]
    else:
        allowed = residual_pins(graph, structure, problem, workload.seq_len, strategy.sp)
        for p, want in sorted((param_pins or {}).items()):
            v_i = problem.index[facts.param_keys[p]]
            ok = frozenset(k for k, s in enumerate(problem.vars[v_i].strategies) if s.outputs[0] == want)
            allowed[v_i] = ok & allowed.get(v_i, ok)
        if constrain:  # the integer program's memory constraints, one per stage
            schedule = "interleaved" if strategy.vpp > 1 else strategy.schedule
            m = strategy.micro_batches(workload)
            rows = [({b.name for b in structure.blocks if chunk[b.name] % pp == s},
                     inflight_microbatches(schedule, pp=pp, microbatches=m, stage=s, virtual_stages=strategy.vpp))
                    for s in range(pp)]
            problem.memory = layout_memory(graph, structure, facts, problem, strategy, policy, rows, width, bs / cp)
            problem.memory_budget = cluster.device.hbm_bytes
        try:
            sol = solve_intra_op(problem, time_limit_s=time_limit_s, allowed=allowed)
        except Infeasible:  # no layout fits: the fastest one, reported as over memory
            problem.memory_budget = None
            sol = solve_intra_op(problem, time_limit_s=time_limit_s, allowed=allowed)
        choice, gap = sol.choice, sol.gap
        facts.choices[ckey] = (choice, gap)

    # -- attribute time to blocks ---------------------------------------------------------------
    var_parts = [Parts() for _ in problem.vars]
    for v_i, v in enumerate(problem.vars):
        if v.node is None:
            continue
        s = v.strategies[choice[v_i]]
        f = fwd_time(v.node, t if s.split else 1) * v.count
        p = var_parts[v_i]
        p.forward += f
        if training:
            p.backward += bwd[v.node] * f
            p.recompute += float(again[problem.members[v_i]].sum()) / v.count * f
    for e in problem.edges:
        sa = problem.vars[e.src].strategies[choice[e.src]]
        sb = problem.vars[e.dst].strategies[choice[e.dst]]
        p = var_parts[e.dst]
        for kind, sec in edge_cost(problem, e, sa, sb).items():
            if kind.startswith("fwd:"):
                first = sec * e.times / e.fwd_times
                p.tp_fwd += first
                p.tp_bwd += sec - first
                if kind == "fwd:all_gather" and training and keeps_input(graph, problem.vars[e.dst].node, e.inp, grad):
                    extra = first * (2 - e.fwd_times / e.times)  # gathered again in backward (see keeps_input)
                    p.tp_bwd += extra
                    p.tp_kinds["all_gather"] += extra
            else:
                p.tp_bwd += sec
            p.tp_kinds[kind.split(":")[1]] += sec
    for src, o, idx in problem.groups:  # read-by-many tensors: charged to the producer
        owner = src if problem.vars[src].node is not None else problem.edges[idx[0]].dst
        for kind, sec in group_cost(problem, src, o, idx, choice).items():
            direction, coll = kind.split(":")
            if direction == "fwd":
                ratio = max(1, max(problem.edges[k].fwd_times / problem.edges[k].times for k in idx))
                first = sec / ratio
                var_parts[owner].tp_fwd += first
                var_parts[owner].tp_bwd += sec - first
                if coll == "all_gather" and training and any(
                        keeps_input(graph, problem.vars[problem.edges[k].dst].node, problem.edges[k].inp, grad)
                        for k in idx):
                    var_parts[owner].tp_bwd += first * (2 - ratio)  # gathered again in backward (see keeps_input)
                    var_parts[owner].tp_kinds[coll] += first * (2 - ratio)
            else:
                var_parts[owner].tp_bwd += sec
            var_parts[owner].tp_kinds[coll] += sec
    for v_i, c in problem.sink_costs().items():
        var_parts[v_i].tp_fwd += float(c[choice[v_i]])
        var_parts[v_i].tp_kinds["all_reduce"] += float(c[choice[v_i]])
    bad = [v_i for v_i, vp in enumerate(var_parts) if vp.tp_kinds.get("impossible")] if param_pins else []
    if bad:
        node = graph.nodes[problem.vars[bad[0]].node]
        read = [x for x in node.inputs if x in param_pins] or ["its weight"]
        raise InvalidInput(f"op {node.name!r} cannot read the declared layout of {read[0]} in the {space!r} "
                           "tensor-axis layout space (a stored weight would move, or a split become a pending sum); "
                           "declare the layout the estimator chose, or set layouts.space to searched")
    per_type: dict[str, Parts] = defaultdict(Parts)  # one instance of a tied block type
    own: dict[str, Parts] = defaultdict(Parts)
    for v_i, v in enumerate(problem.vars):
        if v.node is None:
            continue
        blk = structure.block_of_node(v.node)
        if blk is None:
            continue
        if isinstance(v.key, tuple) and v.key and v.key[0] == blk.type_id:
            per_type[blk.type_id].add(var_parts[v_i], 1.0 / v.count)
        else:
            own[blk.name].add(var_parts[v_i])
    block_parts: dict[str, Parts] = {}
    for blk in structure.blocks:
        p = Parts()
        if blk.type_id in per_type:
            p.add(per_type[blk.type_id])
        if blk.name in own:
            p.add(own[blk.name])
        block_parts[blk.name] = p

    layout_of_output = Layouts(facts, problem, choice)
    add_cp_ep(graph, structure, cluster, strategy, core, block_parts, tensor_bytes, fwd_time, layout_of_output, policy,
              facts.expert_exchange())

    # -- memory per block ------------------------------------------------------------------------
    act_block = activation_bytes(graph, structure, strategy, training, core, problem, choice,
                                  layout_of_output, width, bs / cp, node_keys, grad, facts, policy)
    param_layout = {p: layout_of_output[p] for p in graph.params}

    # -- stages ----------------------------------------------------------------------------------
    m = strategy.micro_batches(workload)
    schedule = "interleaved" if strategy.vpp > 1 else strategy.schedule
    block_params: dict[str, tuple[float, float]] = {}
    for blk in structure.blocks:
        dense = expert = 0.0
        for p in blk.params:
            shard = t if param_layout.get(p, REPLICATED) >= 0 else 1
            if ".experts." in p:
                expert += graph.tensors[p].numel / shard / strategy.ep
            else:
                dense += graph.tensors[p].numel / shard
        block_params[blk.name] = (dense, expert)
    stages = []
    for s in range(pp):
        names = [b.name for b in structure.blocks if chunk[b.name] % pp == s]
        parts = Parts()
        dense = expert = 0.0
        acts = 0.0
        boundary = gather = 0.0
        for name in names:
            parts.add(block_parts[name])
            acts += act_block.get(name, 0.0)
            blk = structure.block(name)
            dense += block_params[name][0]
            expert += block_params[name][1]
            if blk.is_layer:
                ins = facts.layer_inputs[blk.name]
                # Megatron-LM's scatter/gather (Narayanan 2021, section 4.1): each tensor rank sends 1/t of a
                # boundary tensor it holds whole, and the receiving stage all-gathers it over its tensor group
                boundary = max(boundary, sum(tensor_bytes(x) for x in ins) / t)
                if t > 1:  # what the previous layer hands over whole (the first layer's input never crosses)
                    whole = [x for x in ins if layout_of_output.get(x, REPLICATED) < 0 and x in facts.producer
                             and structure.node_block[facts.producer[x][0]] >= 0
                             and structure.blocks[structure.node_block[facts.producer[x][0]]].is_layer]
                    gather = max(gather, sum(tensor_bytes(x) for x in whole))
        held = inflight_microbatches(schedule, pp=pp, microbatches=m, stage=s, virtual_stages=strategy.vpp) if training else 1.0
        mem = stage_memory(dense, expert, acts * held, strategy, training, width)
        fwd = parts.forward + parts.tp_fwd + parts.cp_fwd + parts.ep_fwd
        bwd = parts.backward + parts.recompute + parts.tp_bwd + parts.cp_bwd + parts.ep_bwd
        stages.append(StageCost(s, tuple(n for n in names if structure.block(n).is_layer), parts, fwd, bwd,
                                dense, expert, mem, boundary, held, gather, t))
    block_s = {name: p.total() for name, p in block_parts.items()}
    return StageCosts(tuple(stages), float(work.flops.sum()) / work.batch,
                      layout_table(graph, structure, problem, choice), gap, block_s, dict(act_block), block_params,
                      param_layout)


def stage_memory(dense: float, expert: float, activation_bytes: float, strategy: Strategy, training: bool,
                 width: float) -> dict[str, float]:
    """Bytes per device by memory class of a stage holding these parameters (per device, after tensor and
    expert sharding) and activations: states by ZeRO stage, what is offloaded moved to `offloaded_*`, and
    the HBM `peak`. Linear in its inputs, so per-layer figures add up to a stage's."""
    if training:
        dpg = strategy.dp * strategy.cp
        st_d = model_state_bytes(dense, zero_stage=strategy.zero, dp=dpg, state=MEGATRON_ADAM)
        st_e = model_state_bytes(expert, zero_stage=strategy.zero, dp=max(1, dpg // strategy.ep), state=MEGATRON_ADAM)
        mem = {"params": st_d.params_bytes + st_e.params_bytes, "grads": st_d.grads_bytes + st_e.grads_bytes,
               "optimizer": st_d.optimizer_bytes + st_e.optimizer_bytes, "activations": activation_bytes}
    else:
        mem = {"params": (dense + expert) * width, "grads": 0.0, "optimizer": 0.0, "activations": activation_bytes}
    for cls in ("params", "grads", "optimizer", "activations"):
        frac = strategy.offload_fraction(cls)
        if frac:
            mem[f"offloaded_{cls}"] = mem[cls] * frac
            mem[cls] *= 1.0 - frac
    mem["peak"] = sum(v for k, v in mem.items() if not k.startswith("offloaded_"))
    return mem


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
    return StageCosts(stages, wide.forward_flops_per_sample, wide.layouts,
                      max(c.solver_gap for c in by_width.values()), wide.block_s, wide.block_act_bytes,
                      wide.block_params, wide.param_layouts)
