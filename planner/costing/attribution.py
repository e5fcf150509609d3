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

from planner.costing.block_costs import Parts, keeps_input
from planner.graph.blocks import Structure
from planner.graph.ir import Graph
from planner.search.intra_op import edge_cost, group_cost


def var_parts(graph: Graph, problem, choice, timer, t: int, again, grad: set[str], training: bool,
              detached: set[int], overlap: float = 0.0) -> list[Parts]:
    """Seconds per micro-batch of each var of `problem` under `choice` (detached vars: nothing).

    With `overlap` > 0 (the stack overlaps tensor-parallel collectives with GEMMs: Transformer Engine's
    userbuffers, torch's AsyncTP), each all-gather or reduce-scatter can hide behind the GEMM it feeds or
    follows, up to `overlap` times that GEMM's time (its backward GEMMs in the backward pass): that much of
    it is recorded as `tp_fwd_hidden` / `tp_bwd_hidden`.
    """
    out = [Parts() for _ in problem.vars]

    def gemm_s(v_i: int, backward: bool) -> float:
        """One instance's GEMM time of var v_i (0 for a var that is not a contraction)."""
        v = problem.vars[v_i]
        if v.node is None or not timer.facts.work.matrix[v.node] or timer.fused(v.node):
            return 0.0
        k = t if v.strategies[choice[v_i]].split else 1
        return timer.backward(v.node, k) if backward else timer.forward(v.node, k)

    def hide(p: Parts, kind: str, sec: float, window: float, backward: bool) -> None:
        if overlap > 0 and kind in ("all_gather", "reduce_scatter") and window > 0:
            hidden = min(sec, overlap * window)
            if backward:
                p.tp_bwd_hidden += hidden
            else:
                p.tp_fwd_hidden += hidden
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
    for e in problem.edges:
        sa = problem.vars[e.src].strategies[choice[e.src]]
        sb = problem.vars[e.dst].strategies[choice[e.dst]]
        p = out[e.dst]
        # an all-gather feeds the GEMM it gathers for; a reduce-scatter follows the GEMM whose partial sums it
        # reduces: that GEMM is the window (per instance, times the instances the edge stands for)
        fwd_window = max(gemm_s(e.dst, False), gemm_s(e.src, False)) * e.times
        bwd_window = max(gemm_s(e.dst, True), gemm_s(e.src, True)) * e.times
        for kind, sec in edge_cost(problem, e, sa, sb).items():
            coll = kind.split(":")[1]
            if kind.startswith("fwd:"):
                first = sec * e.times / e.fwd_times
                p.tp_fwd += first
                p.tp_bwd += sec - first
                hide(p, coll, first, fwd_window, False)
                hide(p, coll, sec - first, bwd_window, True)
                if kind == "fwd:all_gather" and training and keeps_input(graph, problem.vars[e.dst].node, e.inp, grad):
                    extra = first * (2 - e.fwd_times / e.times)  # gathered again in backward (see keeps_input)
                    p.tp_bwd += extra
                    p.tp_kinds["all_gather"] += extra
                    hide(p, coll, extra, bwd_window, True)
            else:
                p.tp_bwd += sec
                hide(p, coll, sec, bwd_window, True)
            p.tp_kinds[coll] += sec
    for src, o, idx in problem.groups:  # read-by-many tensors: charged to the producer
        owner = src if problem.vars[src].node is not None else problem.edges[idx[0]].dst
        p = out[owner]
        readers = [problem.edges[k] for k in idx]  # the GEMMs the gathered tensor feeds are the window
        fwd_window = sum(gemm_s(e.dst, False) * e.times for e in readers) or gemm_s(src, False) * readers[0].times
        bwd_window = sum(gemm_s(e.dst, True) * e.times for e in readers) or gemm_s(src, True) * readers[0].times
        for kind, sec in group_cost(problem, src, o, idx, choice).items():
            direction, coll = kind.split(":")
            if direction == "fwd":
                ratio = max(1, max(e.fwd_times / e.times for e in readers))
                first = sec / ratio
                p.tp_fwd += first
                p.tp_bwd += sec - first
                hide(p, coll, first, fwd_window, False)
                hide(p, coll, sec - first, bwd_window, True)
                if coll == "all_gather" and training and any(
                        keeps_input(graph, problem.vars[e.dst].node, e.inp, grad) for e in readers):
                    p.tp_bwd += first * (2 - ratio)  # gathered again in backward (see keeps_input)
                    p.tp_kinds[coll] += first * (2 - ratio)
                    hide(p, coll, first * (2 - ratio), bwd_window, True)
            else:
                p.tp_bwd += sec
                hide(p, coll, sec, bwd_window, True)
            p.tp_kinds[coll] += sec
    for v_i, c in problem.sink_costs().items():
        out[v_i].tp_fwd += float(c[choice[v_i]])
        out[v_i].tp_kinds["all_reduce"] += float(c[choice[v_i]])
    return out


def block_parts(structure: Structure, problem, parts: list[Parts]) -> dict[str, Parts]:
    """Var seconds summed per block: a tied var's seconds split evenly over its instances."""
    per_type: dict[str, Parts] = defaultdict(Parts)  # one instance of a tied block type
    own: dict[str, Parts] = defaultdict(Parts)
    for v_i, v in enumerate(problem.vars):
        if v.node is None:
            continue
        blk = structure.block_of_node(v.node)
        if blk is None:
            continue
        if isinstance(v.key, tuple) and v.key and v.key[0] == blk.type_id:
            per_type[blk.type_id].add(parts[v_i], 1.0 / v.count)
        else:
            own[blk.name].add(parts[v_i])
    out: dict[str, Parts] = {}
    for blk in structure.blocks:
        p = Parts()
        if blk.type_id in per_type:
            p.add(per_type[blk.type_id])
        if blk.name in own:
            p.add(own[blk.name])
        out[blk.name] = p
    return out


def add_routed(facts, timer, t: int, again, training: bool, parts: dict[str, Parts]) -> None:
    """The routed experts of each MoE block (detached from the layout program): their tokens are spread over
    the stage's ranks by the dispatcher, so each rank runs 1/t of its replica's routed work."""
    for name, nodes in facts.routed.items():
        p = parts[name]
        for i in sorted(nodes):
            f = timer.forward(i, t)
            p.forward += f
            if training:
                p.backward += timer.backward(i, t)
                p.recompute += float(again[i]) * f


__all__ = ["add_routed", "block_parts", "var_parts"]
