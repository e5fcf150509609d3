"""The vocabulary of the layout space: a tensor's layout over the tensor axis, and an op's strategy.

A *layout* of a tensor over that axis is one small int: a tensor dim index
(the dim is split into equal shards, one per rank), `REPLICATED` (every rank
holds all of it) or `PARTIAL` (every rank holds a full-size partial sum that
still has to be reduced). This is the notation of JAX/MindSpore layouts and
DTensor's Shard(d)/Replicate()/Partial(), restricted to one axis.

An op *strategy* says which layout each input must arrive in, which layout
each output leaves in, and whether the op's work is split across the axis.
`OpContext` holds one node's shapes for the rules that enumerate strategies
(`space.py`, `contractions.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from planner.graph.ir import Node

REPLICATED = -1
PARTIAL = -2
ANY = -3  # an input read only for its metadata (Shape, Size): any layout, no traffic

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OpStrategy:
    """One legal way to run an op over the tensor axis.

    `inputs[i]` is the layout input i must arrive in (ANY when only metadata is
    read); `outputs[j]` the layout output j leaves in; `split` is True when
    each rank does 1/t of the work.
    """

    name: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    split: bool  # False for ops on pending sums: each rank works on a full-size tensor


def layout_name(layout: int) -> str:
    return {REPLICATED: "R", PARTIAL: "P", ANY: "*"}.get(layout, f"S{layout}")


#: Ops that read their first input only for its metadata (shape, size).
METADATA = frozenset({"Shape", "Size"})


def norm_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def splittable(size: int, t: int) -> bool:
    return size >= t and size % t == 0


def bcast_dim(in_shape: Shape, out_rank: int, out_dim: int) -> int:
    """The input dim that out_dim reads under numpy broadcasting, or REPLICATED if broadcast."""
    i = out_dim - (out_rank - len(in_shape))
    if i < 0 or in_shape[i] == 1:
        return REPLICATED
    return i


def view_dim_map(in_shape: Shape, out_shape: Shape) -> dict[int, int]:
    """Map output dims to input dims of a reshape whose shard stays contiguous.

    A split on input dim i survives a reshape as a split on output dim j when
    both start at the same flat offset (equal products of the dims before
    them), so that each rank's contiguous block is still contiguous: e.g.
    [b, s, h] -> [b, s, heads, hd] maps dim 2 onto dim 2 (heads).
    """
    starts_in: dict[int, int] = {}
    p = 1
    for i, d in enumerate(in_shape):
        if d != 1:
            starts_in.setdefault(p, i)
        p *= d
    out: dict[int, int] = {}
    p = 1
    for j, d in enumerate(out_shape):
        if d != 1 and p in starts_in:
            out[j] = starts_in[p]
        p *= d
    return out


class OpContext:
    """Shapes of one node's inputs and outputs, with helpers to build strategies."""

    def __init__(self, node: Node, shapes: Mapping[str, Shape | None], t: int) -> None:
        self.node = node
        self.t = t
        self.ins: list[Shape | None] = [shapes.get(n) if n else None for n in node.inputs]
        self.outs: list[Shape | None] = [shapes.get(n) if n else None for n in node.outputs]

    def rep(self) -> OpStrategy:
        ins = tuple(ANY if (self.node.op_type in METADATA and i == 0) else REPLICATED for i in range(len(self.ins)))
        return OpStrategy("rep", ins, tuple(REPLICATED for _ in self.outs), False)

    def ok(self, shape: Shape | None, dim: int) -> bool:
        return shape is not None and 0 <= dim < len(shape) and splittable(shape[dim], self.t)
