"""Per-block pieces of one strategy: seconds by kind, the layouts the program chose, and what each block keeps.

The intra-op solution assigns a strategy to each var (an op position of a
block type, or a parameter); `attribution` charges its compute and
resharding to blocks, `exchange` adds context- and expert-parallel
traffic, and here each block's kept tensors are priced under its layouts
and recompute policy, for the estimate and for the program's memory rows.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Hashable, Mapping

from planner.costing.activations import _CONTRACTIONS
from planner.costing.loss import LOSS_SUFFIX
from planner.costing.recompute import fp8_scale, kept_tensors
from planner.graph.blocks import Structure
from planner.graph.ir import Graph
from planner.search.space import REPLICATED, layout_name
from planner.search.tying import variant_of

if TYPE_CHECKING:
    from planner.costing.graph_facts import GraphFacts


@dataclass(slots=True)
class Parts:
    """Seconds of one block (or stage) per micro-batch, by kind."""

    forward: float = 0.0  # forward compute
    backward: float = 0.0  # backward compute
    recompute: float = 0.0  # forward run again in the backward pass
    tp_fwd: float = 0.0
    tp_bwd: float = 0.0
    tp_fwd_hidden: float = 0.0  # of tp_fwd, what the GEMM each collective feeds or follows can hide (TP overlap)
    tp_bwd_hidden: float = 0.0
    cp_fwd: float = 0.0
    cp_bwd: float = 0.0
    ep_fwd: float = 0.0
    ep_bwd: float = 0.0
    # of forward and backward (+ recompute): the routed experts' share, and the MoE layers' whole compute with
    # their count, where an exchange runs (for the 1F1B all-to-all overlap's pairing, `moe_pairing`)
    experts_fwd: float = 0.0
    experts_bwd: float = 0.0
    moe_layers: float = 0.0
    moe_fwd: float = 0.0
    moe_bwd: float = 0.0
    tp_kinds: dict = field(default_factory=lambda: defaultdict(float))

    def total(self) -> float:
        return (self.forward + self.backward + self.recompute + self.tp_fwd + self.tp_bwd + self.cp_fwd
                + self.cp_bwd + self.ep_fwd + self.ep_bwd)

    def copy(self) -> "Parts":
        out = Parts()
        out.add(self)
        return out

    def add(self, o: "Parts", k: float = 1.0) -> None:
        """Add k times `o`: every seconds field, and the collectives by kind."""
        self.forward += k * o.forward
        self.backward += k * o.backward
        self.recompute += k * o.recompute
        self.tp_fwd += k * o.tp_fwd
        self.tp_bwd += k * o.tp_bwd
        self.tp_fwd_hidden += k * o.tp_fwd_hidden
        self.tp_bwd_hidden += k * o.tp_bwd_hidden
        self.cp_fwd += k * o.cp_fwd
        self.cp_bwd += k * o.cp_bwd
        self.ep_fwd += k * o.ep_fwd
        self.ep_bwd += k * o.ep_bwd
        self.experts_fwd += k * o.experts_fwd
        self.experts_bwd += k * o.experts_bwd
        self.moe_layers += k * o.moe_layers
        self.moe_fwd += k * o.moe_fwd
        self.moe_bwd += k * o.moe_bwd
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


def _split_rule(facts, problem, choice, layout, node_keys):
    """Whether a kept tensor is split over the tensor axis: routed tokens always are (the dispatcher spreads
    them over the stage's ranks); otherwise by its producer's layout, or the saver's layout of that input."""
    def split(sv) -> bool:
        if 0 <= sv.saver < len(facts.in_routed) and facts.in_routed[sv.saver]:
            return True
        if layout.get(sv.tensor, REPLICATED) >= 0:
            return True
        v_i = problem.index[node_keys[sv.saver]]
        s = problem.vars[v_i].strategies[choice[v_i]]
        k = sv.input_index
        return (s.inputs[k] >= 0) if 0 <= k < len(s.inputs) else (k == -1 and s.outputs[0] >= 0)
    return split


def activation_bytes(facts, structure: Structure, strategy, execution, problem, choice, layout, width: float,
                     scale: float, policy, fp8_inputs: bool = False) -> tuple[dict[str, float], dict[str, float]]:
    """Bytes each block keeps for backward per micro-batch, per device, with layouts and recompute applied
    (`recompute.kept_tensors` says what each policy keeps); and of those, what the loss holds at its peak (a
    stage runs one micro-batch's loss at a time: `planner.costing.loss`)."""
    out: dict[str, float] = defaultdict(float)
    loss: dict[str, float] = {}
    t = strategy.tp
    split = _split_rule(facts, problem, choice, layout, facts.node_keys)
    per_tie: dict[tuple, float] = {}
    for blk in structure.blocks:
        rc = policy.get(blk.name, "none")
        # instances tied as one variant (`planner.search.tying`) share their ops' layouts: with one policy they
        # keep the same; an instance with ops of its own is counted on its own
        variant = variant_of(facts.node_keys[blk.nodes[0]], blk.type_id) if blk.is_layer and blk.nodes else None
        tie = (variant, rc) if variant is not None else None
        if tie is not None and tie in per_tie:
            out[blk.name] = per_tie[tie]
            continue
        total = 0.0
        for sv in kept_tensors(facts, blk, rc, execution, width):
            nbytes = (sv.nbytes * scale * fp8_scale(facts, sv, fp8_inputs)
                      * facts.routed_load(sv.saver, execution, strategy.ep) / (t if split(sv) else 1))
            total += nbytes
            if sv.tensor.endswith(LOSS_SUFFIX):
                loss[blk.name] = loss.get(blk.name, 0.0) + nbytes
        out[blk.name] = total
        if tie is not None:
            per_tie[tie] = total
    return out, loss


def layout_table(structure: Structure, problem, choice, param_keys: Mapping[str, Hashable]
                 ) -> dict[str, dict[str, str]]:
    """Per block type, the layout chosen for each parameter: what a plan prints. The first instance's parameters
    are named relative to their block and stand for the other instances' of the same name; another instance's
    parameter is named absolutely where its layout differs (a first layer that builds what the others reuse is
    not tied to them: `param_keys`, `tying.tie_keys`) or where it is outside its block's path (an optimised torch
    export's `val_482` in one layer is `val_250` in the next)."""
    by_key = {param_keys[v.param]: layout_name(v.strategies[choice[v_i]].outputs[0])
              for v_i, v in enumerate(problem.vars) if v.param}
    out: dict[str, dict[str, str]] = {}
    for btype in structure.types:
        rows: dict[str, str] = {}
        for k, inst in enumerate(btype.instances):
            blk = structure.block(inst)
            for p in blk.params:
                rel = p[len(blk.name) + 1:] if p.startswith(blk.name + ".") else None
                lay = by_key.get(param_keys[p], "R")
                if k == 0:
                    rows[rel or p] = lay
                elif rel is None or rows.get(rel, "R") != lay:
                    rows[p] = lay
        if rows:
            out[btype.label] = rows
    return out


def layout_memory(facts, structure: Structure, problem, strategy, execution, policy,
                  stages: list[tuple[set[str], float]], width: float, scale: float,
                  fp8_inputs: bool = False) -> list[list]:
    """Per pipeline stage, per var and strategy: the bytes one device of that stage holds because of that
    choice: its parameters' states (by ZeRO stage, offload and the stack's bytes per parameter) and the
    activations its ops keep (by recompute, `recompute.kept_tensors`).

    `stages` gives each stage's blocks and the micro-batches it holds in flight. Tied layers share one
    var across stages, so each stage gets its own row: under 1F1B the first stage holds the most
    micro-batches (Narayanan 2021), but the last may hold the vocabulary's weights and logits. Routed
    experts' weights do not depend on the tensor-axis layout: they are `stage_memory`'s.
    """
    import numpy as np

    graph = facts.graph
    t, dpg, z = strategy.tp, strategy.dp * strategy.cp, strategy.zero
    f = strategy.offload_fraction
    st = execution.state
    per_param = (st.param_bytes * (1 - f("params")) / (dpg if z >= 3 else 1)
                 + st.grad_bytes * (1 - f("grads")) / (dpg if z >= 2 else 1)
                 + st.optimizer_bytes * (1 - f("optimizer")) / (dpg if z >= 1 else 1))
    stage_of = {b: k for k, (blocks, _) in enumerate(stages) for b in blocks}
    held = [h for _, h in stages]
    param_stage = {p: stage_of[b.name] for b in structure.blocks if b.name in stage_of for p in b.params}
    by_key: dict = defaultdict(list)
    for p, k in facts.param_keys.items():
        if p in param_stage and not facts.is_expert(p):
            by_key[k].append(p)
    kept_by_node: dict[int, list] = defaultdict(list)
    for blk in structure.blocks:
        if blk.name in stage_of:
            for sv in kept_tensors(facts, blk, policy.get(blk.name, "none"), execution, width):
                kept_by_node[sv.saver].append(sv)
    keep_act = 1.0 - f("activations")
    out = [[] for _ in stages]
    for v in problem.vars:
        m = np.zeros((len(stages), len(v.strategies)))
        if v.param is not None:
            for p in by_key.get(v.key, ()):
                total = graph.tensors[p].numel * per_param
                for s_i, s in enumerate(v.strategies):
                    m[param_stage[p], s_i] += total / (t if s.outputs[0] >= 0 else 1)
        else:
            for i in problem.members[problem.index[v.key]]:
                blk = structure.block_of_node(int(i))
                if blk is None or blk.name not in stage_of:
                    continue
                k_st = stage_of[blk.name]
                for sv in kept_by_node.get(int(i), ()):
                    times = 1.0 if sv.tensor.endswith(LOSS_SUFFIX) else held[k_st]  # the loss: one micro-batch's
                    nbytes = (sv.nbytes * scale * times * keep_act * fp8_scale(facts, sv, fp8_inputs)
                              * facts.routed_load(sv.saver, execution, strategy.ep))
                    for s_i, s in enumerate(v.strategies):
                        k = sv.input_index
                        split = facts.in_routed[int(i)] or (
                            (s.inputs[k] >= 0) if 0 <= k < len(s.inputs) else (s.outputs[0] >= 0))
                        m[k_st, s_i] += nbytes / (t if split else 1)
        for k_st in range(len(stages)):
            out[k_st].append(m[k_st])
    return out
