"""Tying: which ops and parameters share one decision because their blocks repeat.

Op position p of every instance of a block type maps to the key
(type_id, p); parameters likewise by their position in the block. The
instances tied are those sharing the op sequence most of them have; an
instance that does not line up (a different op at a position, a different
parameter count) keeps keys of its own, so tying never changes the problem,
only its size.
"""

from __future__ import annotations

from typing import Hashable

from planner.graph.blocks import Structure
from planner.graph.ir import Graph


def tie_keys(graph: Graph, structure: Structure) -> tuple[list[Hashable], dict[str, Hashable]]:
    """(key per node, key per parameter) for the intra-op problem."""
    node_keys: list[Hashable] = [("n", i) for i in range(len(graph.nodes))]
    param_keys: dict[str, Hashable] = {p: ("p", p) for p in graph.params}
    for btype in structure.types:
        if btype.count < 2:
            continue
        blocks = [structure.block(name) for name in btype.instances]
        by_ops: dict[tuple[str, ...], list] = {}
        for blk in blocks:
            by_ops.setdefault(tuple(graph.nodes[i].op_type for i in blk.nodes), []).append(blk)
        # the op sequence most instances share (the earliest on a tie): a first layer that also builds what the
        # others reuse (a mask, a cast) must not leave the rest untied
        lined_up = max(by_ops.values(), key=len)
        if len(lined_up) < 2:
            continue
        shapes = [graph.tensors[p].shape for p in lined_up[0].params]
        for blk in lined_up:
            for pos, i in enumerate(blk.nodes):
                node_keys[i] = (btype.type_id, pos)
            if len(blk.params) == len(shapes) and all(
                graph.tensors[p].shape == s for p, s in zip(blk.params, shapes)
            ):
                for pos, p in enumerate(blk.params):
                    param_keys[p] = (btype.type_id, "p", pos)
    return node_keys, param_keys
