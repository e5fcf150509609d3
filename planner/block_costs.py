"""Per-block costs of one strategy: time by kind, activation memory, and the layouts they come from.

The intra-op solution assigns a strategy to each var (an op position of a
block type, or a parameter); here its compute and resharding are charged to
blocks, context- and expert-parallel traffic is added, and each block's
saved tensors are priced under its layouts and recompute policy.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cost_models import place_group
from cost_models.collectives import all_gather_s, all_to_all_s, reduce_scatter_s

from planner.activations import _CONTRACTIONS
from planner.graph.blocks import Structure
from planner.graph.ir import Graph
from planner.node_work import FLOAT_DTYPES
from planner.search.space import REPLICATED, layout_name

if TYPE_CHECKING:
    from planner.graph_facts import GraphFacts


@dataclass(slots=True)
class Parts:
    """Seconds of one block (or stage) per micro-batch, by kind."""

    forward: float = 0.0  # forward compute
    backward: float = 0.0  # backward compute
    recompute: float = 0.0  # forward run again in the backward pass
    tp_fwd: float = 0.0
    tp_bwd: float = 0.0
    cp_fwd: float = 0.0
    cp_bwd: float = 0.0
    ep_fwd: float = 0.0
    ep_bwd: float = 0.0
    tp_kinds: dict = field(default_factory=lambda: defaultdict(float))

    def total(self) -> float:
        return (self.forward + self.backward + self.recompute + self.tp_fwd + self.tp_bwd + self.cp_fwd
                + self.cp_bwd + self.ep_fwd + self.ep_bwd)

    def add(self, o: "Parts", k: float = 1.0) -> None:
        self.forward += k * o.forward
        self.backward += k * o.backward
        self.recompute += k * o.recompute
        self.tp_fwd += k * o.tp_fwd
        self.tp_bwd += k * o.tp_bwd
        self.cp_fwd += k * o.cp_fwd
        self.cp_bwd += k * o.cp_bwd
        self.ep_fwd += k * o.ep_fwd
        self.ep_bwd += k * o.ep_bwd
        for kk, v in o.tp_kinds.items():
            self.tp_kinds[kk] += k * v


def keeps_input(graph: Graph, node: int | None, inp: int, grad: set[str]) -> bool:
    """Whether a contraction keeps input `inp` for its backward (another of its inputs needs a gradient).

    Such an input, all-gathered from sequence shards, is stored as its shard
    and all-gathered again in the backward pass for the weight gradient
    (Korthikanti 2022, section 4.2.2, which is what `activation_bytes`
    counts); recomputing the forward gathers it anyway.
    """
    if node is None or graph.nodes[node].op_type not in _CONTRACTIONS:
        return False
    ins = graph.nodes[node].inputs
    return any(x in grad for j, x in enumerate(ins) if x and j != inp)


def residual_pins(graph: Graph, structure: Structure, problem, seq_len: int, sp: bool) -> dict[int, frozenset[int]]:
    """Between layers the residual stream is replicated, or split by sequence with --sp (Korthikanti 2022)."""
    pins: dict[int, frozenset[int]] = {}
    consumers_block: dict[str, set[int]] = defaultdict(set)
    for i, n in enumerate(graph.nodes):
        for x in n.inputs:
            if x:
                consumers_block[x].add(structure.node_block[i])
    for v_i, v in enumerate(problem.vars):
        if v.node is None:
            continue
        node = graph.nodes[v.node]
        blk = structure.node_block[v.node]
        if blk < 0 or not structure.blocks[blk].is_layer:
            continue
        for j, o in enumerate(node.outputs):
            if not o or not (consumers_block.get(o, set()) - {blk}):
                continue
            shape = graph.tensors[o].shape if o in graph.tensors else None
            if not shape:
                continue
            want = REPLICATED
            if sp:
                dims = [d for d, n in enumerate(shape) if n == seq_len]
                if not dims:
                    continue
                want = dims[0]
            ok = frozenset(k for k, s in enumerate(v.strategies) if s.outputs[j] == want)
            if ok:
                pins[v_i] = ok & pins.get(v_i, ok)
    return pins


class Layouts:
    """Tensor -> the layout its producer leaves it in, looked up on demand (absent: replicated)."""

    def __init__(self, facts: GraphFacts, problem, choice) -> None:
        self.facts, self.problem, self.choice = facts, problem, choice

    def get(self, name: str, default: int = REPLICATED) -> int:
        f, pr = self.facts, self.problem
        if name in f.params:
            v_i = pr.index[f.param_keys[name]]
            return pr.vars[v_i].strategies[self.choice[v_i]].outputs[0]
        hit = f.producer.get(name)
        if hit is None:
            return default
        v_i = pr.index[f.node_keys[hit[0]]]
        return pr.vars[v_i].strategies[self.choice[v_i]].outputs[hit[1]]

    def __getitem__(self, name: str) -> int:
        return self.get(name)


def add_cp_ep(graph, structure, cluster, strategy, core, block_parts, tensor_bytes, fwd_time, layout,
              policy, exchange) -> None:
    """Context-parallel K/V exchange per attention core, expert-parallel all-to-all per MoE layer
    (`exchange`: the tensors each MoE block dispatches and combines, `GraphFacts.expert_exchange`)."""
    t, cp, ep = strategy.tp, strategy.cp, strategy.ep
    params = set(graph.params)
    shard = lambda x: tensor_bytes(x) / (t if layout.get(x, REPLICATED) >= 0 else 1)  # noqa: E731
    if cp > 1:
        spans = place_group(cluster, cp, stride=t)
        for blk in structure.blocks:
            kv: list[str] = []
            core_s = 0.0
            for i in blk.nodes:
                n = graph.nodes[i]
                if i not in core:
                    continue
                core_s += fwd_time(i, t)
                if n.op_type == "Attention":
                    kv += [x for x in n.inputs[1:3] if x]
                elif n.op_type in ("MatMul", "Einsum") and not any(x in params for x in n.inputs):
                    kv.append(n.inputs[1])
            if not kv:
                continue
            # ring attention: K and V of the whole sequence pass every rank, overlapped with the core's compute
            ag = sum(all_gather_s(shard(x) * cp, spans) for x in kv)
            rs = sum(reduce_scatter_s(shard(x) * cp, spans) for x in kv)
            p = block_parts[blk.name]
            p.cp_fwd += max(0.0, ag - core_s)
            p.cp_bwd += max(0.0, ag + rs - 2 * core_s)
            if policy.get(blk.name) == "full":
                p.cp_bwd += p.cp_fwd
    if ep > 1:
        spans = place_group(cluster, ep, stride=t)
        for name, (dispatch, combine) in exchange.items():
            moved = sum(shard(x) for x in dispatch) + sum(shard(x) for x in combine)
            # dispatch and combine forward, and their transposes backward (and again when the layer is recomputed)
            p = block_parts[name]
            a2a = all_to_all_s(moved, spans)
            p.ep_fwd += a2a
            p.ep_bwd += a2a * (2 if policy.get(name) == "full" else 1)


def activation_bytes(graph, structure, strategy, training, core, problem, choice, layout, width, scale,
                     node_keys, grad, facts, policy) -> dict[str, float]:
    """Bytes each block keeps for backward per micro-batch, per device, with layouts and recompute applied."""
    out: dict[str, float] = defaultdict(float)
    if not training:
        return out
    t = strategy.tp
    in_core_output = facts.in_core_output

    def split(saved) -> bool:
        if layout.get(saved.tensor, REPLICATED) >= 0:
            return True
        v_i = problem.index[node_keys[saved.saver]]
        s = problem.vars[v_i].strategies[choice[v_i]]
        k = saved.input_index
        return 0 <= k < len(s.inputs) and s.inputs[k] >= 0

    by_block = facts.saved(width)
    per_type: dict[tuple[str, str], float] = {}
    for blk in structure.blocks:
        rc = policy.get(blk.name, "none")
        if rc == "full":
            continue
        tied = blk.is_layer and structure.type(blk.type_id).count > 1
        if tied and (blk.type_id, rc) in per_type:  # tied instances with one policy keep the same
            out[blk.name] = per_type[(blk.type_id, rc)]
            continue
        total = 0.0
        for sv in by_block.get(blk.name, ()):
            if rc == "selective" and sv.saver in core and (
                sv.tensor in in_core_output or sv.input_index == -1 or graph.nodes[sv.saver].op_type == "Dropout"
            ):
                continue
            total += sv.nbytes * scale / (t if split(sv) else 1)
        out[blk.name] = total
        if tied:
            per_type[(blk.type_id, rc)] = total
    if any(v == "full" for v in policy.values()):
        for blk in structure.blocks:
            if policy.get(blk.name) == "full":
                for x in facts.layer_inputs[blk.name]:
                    tt = graph.tensors[x]
                    nb = tt.numel * (width if tt.dtype in FLOAT_DTYPES else tt.nbytes / max(tt.numel, 1))
                    out[blk.name] += nb * scale / (t if layout.get(x, REPLICATED) >= 0 else 1)
    return out


def layout_table(graph: Graph, structure: Structure, problem, choice) -> dict[str, dict[str, str]]:
    """Per block type, the layout chosen for each parameter (name relative to its block): what a plan prints."""
    out: dict[str, dict[str, str]] = {}
    by_param = {v.param: layout_name(v.strategies[choice[v_i]].outputs[0]) for v_i, v in enumerate(problem.vars) if v.param}
    for btype in structure.types:
        blk = structure.block(btype.instances[0])
        rows = {}
        for p in blk.params:
            rel = p[len(blk.name) + 1:] if p.startswith(blk.name + ".") else p
            rows[rel] = by_param.get(p, "R")
        if rows:
            out[btype.label] = rows
    return out


def layout_memory(graph: Graph, structure: Structure, facts: GraphFacts, problem, strategy, policy,
                  stages: list[tuple[set[str], float]], width: float, scale: float) -> list[list]:
    """Per pipeline stage, per var and strategy: the bytes one device of that stage holds because of that
    choice: its parameters' states (by ZeRO stage and offload) and the activations its ops keep (by recompute).

    `stages` gives each stage's blocks and the micro-batches it holds in flight. Tied layers share one
    var across stages, so each stage gets its own row: under 1F1B the first stage holds the most
    micro-batches (Narayanan 2021), but the last may hold the vocabulary's weights and logits.
    """
    import numpy as np

    t, dpg, ep, z = strategy.tp, strategy.dp * strategy.cp, strategy.ep, strategy.zero
    f = strategy.offload_fraction

    def per_param(expert: bool) -> float:
        g = max(1, dpg // ep) if expert else dpg
        b = width * (1 - f("params")) / (g if z >= 3 else 1) + 4.0 * (1 - f("grads")) / (g if z >= 2 else 1)
        b += 12.0 * (1 - f("optimizer")) / (g if z >= 1 else 1)
        return b / (ep if expert else 1)

    stage_of = {b: k for k, (blocks, _) in enumerate(stages) for b in blocks}
    held = [h for _, h in stages]
    param_stage = {p: stage_of[b.name] for b in structure.blocks if b.name in stage_of for p in b.params}
    by_key: dict = defaultdict(list)
    for p, k in facts.param_keys.items():
        if p in param_stage:
            by_key[k].append(p)
    saved_by_node = facts.saved_by_node(width)
    core, in_core_output = facts.core, facts.in_core_output
    keep_act = 1.0 - f("activations")
    out = [[] for _ in stages]
    for v in problem.vars:
        m = np.zeros((len(stages), len(v.strategies)))
        if v.param is not None:
            for p in by_key.get(v.key, ()):
                total = graph.tensors[p].numel * per_param(".experts." in p)
                for s_i, s in enumerate(v.strategies):
                    m[param_stage[p], s_i] += total / (t if s.outputs[0] >= 0 else 1)
        else:
            for i in problem.members[problem.index[v.key]]:
                blk = structure.block_of_node(int(i))
                if blk is None or blk.name not in stage_of or policy.get(blk.name) == "full":
                    continue
                k_st = stage_of[blk.name]
                for sv in saved_by_node.get(int(i), ()):
                    if policy.get(blk.name) == "selective" and sv.saver in core and (
                            sv.tensor in in_core_output or sv.input_index == -1
                            or graph.nodes[sv.saver].op_type == "Dropout"):
                        continue
                    for s_i, s in enumerate(v.strategies):
                        k = sv.input_index
                        split = (s.inputs[k] >= 0) if 0 <= k < len(s.inputs) else (s.outputs[0] >= 0)
                        m[k_st, s_i] += sv.nbytes * scale * held[k_st] * keep_act / (t if split else 1)
        for k_st in range(len(stages)):
            out[k_st].append(m[k_st])
    return out
