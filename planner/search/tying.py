"""Tying: which ops and parameters share one decision because their blocks repeat.

Op position p of every instance of a block type maps to the key
(type_id, p); parameters likewise by their position in the block. The
instances tied are those sharing the op sequence most of them have; an
instance that does not line up (a different op at a position, a different
parameter count) keeps keys of its own, so tying never changes the problem,
only its size.

Instances whose ops line up can still differ in work the op types do not
show: gpt-oss's even layers attend to a 128-token band and its odd ones to
the whole causal prefix through one layer body fed two masks. A caller
passes such facts per node (`signature`); instances that differ there form
variants, each tied on its own ((type_id, variant, p) beyond the first), so
every instance is timed as one of its own kind.
"""

from __future__ import annotations

from typing import Hashable, Mapping

from planner.graph.blocks import Structure
from planner.graph.ir import Graph


def variant_of(key: Hashable, type_id: str) -> tuple | None:
    """The tied variant a node key of a `type_id` block stands for ((type_id,) or (type_id, variant)), or None for
    a key of its own (an instance that did not line up, or alone in its variant)."""
    return key[:-1] if isinstance(key, tuple) and key and key[0] == type_id else None


def tie_keys(graph: Graph, structure: Structure, signature: Mapping[int, Hashable] | None = None,
             ) -> tuple[list[Hashable], dict[str, Hashable]]:
    """(key per node, key per parameter) for the intra-op problem; `signature` holds, for the nodes that have
    one, what else two instances' ops must share to be timed as one (an attention core's mask)."""
    node_keys: list[Hashable] = [("n", i) for i in range(len(graph.nodes))]
    param_keys: dict[str, Hashable] = {p: ("p", p) for p in graph.params}
    sig = signature or {}
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
        variants: dict[tuple, list] = {}
        for blk in lined_up:
            variants.setdefault(tuple(sig.get(i) for i in blk.nodes), []).append(blk)
        shapes = [graph.tensors[p].shape for p in lined_up[0].params]
        for v, members in enumerate(variants.values()):
            if len(members) < 2:
                continue
            for blk in members:
                for pos, i in enumerate(blk.nodes):
                    node_keys[i] = (btype.type_id, pos) if v == 0 else (btype.type_id, v, pos)
        for blk in lined_up:  # parameters are placed alike whichever variant holds them
            if len(blk.params) == len(shapes) and all(
                graph.tensors[p].shape == s for p, s in zip(blk.params, shapes)
            ):
                for pos, p in enumerate(blk.params):
                    param_keys[p] = (btype.type_id, "p", pos)
    return node_keys, param_keys
