"""Tying: which ops and parameters share one decision because their blocks repeat.

Op position p of every instance of a block type maps to the key
(type_id, p); parameters likewise by their position in the block. An
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
        first = blocks[0]
        ops = [graph.nodes[i].op_type for i in first.nodes]
        shapes = [graph.tensors[p].shape for p in first.params]
        for blk in blocks:
            if len(blk.nodes) != len(ops) or any(graph.nodes[i].op_type != o for i, o in zip(blk.nodes, ops)):
                continue
            for pos, i in enumerate(blk.nodes):
                node_keys[i] = (btype.type_id, pos)
            if len(blk.params) == len(shapes) and all(
                graph.tensors[p].shape == s for p, s in zip(blk.params, shapes)
            ):
                for pos, p in enumerate(blk.params):
                    param_keys[p] = (btype.type_id, "p", pos)
    return node_keys, param_keys
