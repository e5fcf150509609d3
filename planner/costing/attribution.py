"""From a solved layout program to seconds per block: compute and tensor-axis communication, by kind.

Each var of the program (an op position shared by its tied instances)
gets its ops' forward, backward and recomputed forward at the shard its
strategy runs on (`NodeTimes`), and the collectives on the edges into it;
a tensor read by several ops is charged to its producer, once per layout
its readers need. Forward collectives run again when their reader's
forward is recomputed; an input all-gathered from sequence shards is
gathered again in backward when the contraction keeps it (`keeps_input`).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from planner.costing.block_costs import Parts
from planner.graph.blocks import Structure
from planner.search.charges import edge_charges, group_charges
from planner.search.tying import variant_of


def var_parts(problem, choice, timer, t: int, again, training: bool, detached: set[int]) -> list[Parts]:
    """Seconds per micro-batch of each var of `problem` under `choice` (detached vars: nothing).

    Collectives are the program's own charges (`charges`): an edge's go to its reader, a read-by-many
    tensor's to its producer; what TP overlap hides of them is recorded as `tp_fwd_hidden` / `tp_bwd_hidden`.
    """
    out = [Parts() for _ in problem.vars]
    for v_i, v in enumerate(problem.vars):
        if v.node is None or v_i in detached:
            continue
        s = v.strategies[choice[v_i]]
        k = t if s.split else 1
        f = timer.forward(v.node, k) * v.count
        p = out[v_i]
        p.forward += f
        if training:
            p.backward += timer.backward(v.node, k) * v.count
            p.recompute += float(again[problem.members[v_i]].sum()) / v.count * f

    def add(p: Parts, charges) -> None:
        for c in charges:
            if c.backward:
                p.tp_bwd += c.sec
                p.tp_bwd_hidden += c.hidden
            else:
                p.tp_fwd += c.sec
                p.tp_fwd_hidden += c.hidden
            p.tp_kinds[c.coll] += c.sec
    for k, e in enumerate(problem.edges):
        add(out[e.dst], edge_charges(problem, k, choice[e.src], choice[e.dst]))
    for src, o, idx in problem.groups:  # read-by-many tensors: charged to the producer
        owner = src if problem.vars[src].node is not None else problem.edges[idx[0]].dst
        add(out[owner], group_charges(problem, src, o, idx, choice))
    for v_i, c in problem.sink_costs().items():
        out[v_i].tp_fwd += float(c[choice[v_i]])
        out[v_i].tp_kinds["all_reduce"] += float(c[choice[v_i]])
    return out


def gemm_windows(problem, timer, t: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per var, one instance's forward and backward GEMM seconds per strategy: the windows TP overlap hides
    collectives in (0 for a var that is not an unfused contraction)."""
    out = []
    for v in problem.vars:
        n = len(v.strategies)
        if v.node is None or not timer.facts.work.matrix[v.node] or timer.fused(v.node):
            out.append((np.zeros(n), np.zeros(n)))
            continue
        ks = [t if s.split else 1 for s in v.strategies]
        out.append((np.array([timer.forward(v.node, k) for k in ks]), np.array([timer.backward(v.node, k) for k in ks])))
    return out


def block_parts(structure: Structure, problem, parts: list[Parts]) -> dict[str, Parts]:
    """Var seconds summed per block: a tied var's seconds split evenly over its instances (the blocks whose ops
    it stands for, of one variant of their type: `planner.search.tying`; an instance of the type that did not
    line up has vars of its own)."""
    per_tie: dict[tuple, Parts] = defaultdict(Parts)  # one instance of a tied variant of a block type
    own: dict[str, Parts] = defaultdict(Parts)
    tie_of: dict[str, tuple] = {}  # the blocks the tied vars stand for, and their variant's key
    # every var of a variant has one member in each of the variant's blocks (`tying.tie_keys`): map them once
    mapped: set[tuple] = set()
    for v_i, v in enumerate(problem.vars):
        if v.node is None:
            continue
        blk = structure.block_of_node(v.node)
        if blk is None:
            continue
        if (tie := variant_of(v.key, blk.type_id)) is not None:
            per_tie[tie].add(parts[v_i], 1.0 / v.count)
            if tie not in mapped:
                mapped.add(tie)
                tie_of.update((structure.block_of_node(int(i)).name, tie) for i in problem.members[v_i])
        else:
            own[blk.name].add(parts[v_i])
    out: dict[str, Parts] = {}
    for blk in structure.blocks:
        p = Parts()
        if blk.name in tie_of:
            p.add(per_tie[tie_of[blk.name]])
        if blk.name in own:
            p.add(own[blk.name])
        out[blk.name] = p
    return out


def add_routed(facts, timer, t: int, again, training: bool, parts: dict[str, Parts]) -> None:
    """The routed experts of each MoE block (detached from the layout program): their tokens are spread over
    the stage's ranks by the dispatcher, so each rank runs 1/t of its replica's routed work. The instances of a
    tied block type run the same ops on the same shapes: each position is timed once (`GraphFacts.routed_positions`)."""
    positions = facts.routed_positions
    if not positions.firsts:
        return
    fwd = np.array([timer.forward(i, t) for i in positions.firsts])[positions.positions]
    n = len(positions.names)
    f_sum = np.bincount(positions.owners, weights=fwd, minlength=n)
    if training:
        bwd = np.array([timer.backward(i, t) for i in positions.firsts])[positions.positions]
        b_sum = np.bincount(positions.owners, weights=bwd, minlength=n)
        again_sum = np.bincount(positions.owners, weights=again[positions.nodes] * fwd, minlength=n)
    for b, name in enumerate(positions.names):
        p = parts[name]
        p.forward += float(f_sum[b])
        p.experts_fwd += float(f_sum[b])
        if training:
            p.backward += float(b_sum[b])
            p.recompute += float(again_sum[b])
            p.experts_bwd += float(b_sum[b]) + float(again_sum[b])


__all__ = ["add_routed", "block_parts", "gemm_windows", "var_parts"]
