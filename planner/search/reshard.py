"""Resharding: which collective turns one layout into another, forward and backward.

Forward, a tensor leaves its producer in one layout and each consumer needs
it in another; the move is a collective over the tensor axis (Alpa's
resharding cost on an edge). Backward, the gradient travels the other way:
the consumer produces it in a layout fixed by its strategy (a replicated
input to an op whose work is split gets a *partial* gradient, Megatron's
"f" operator), and the producer needs it in the layout conjugate to its
output. Megatron's column/row pair thus costs one all-reduce forward (at the
row-parallel output) and one backward (at the column-parallel input).
"""

from __future__ import annotations

from typing import Literal

from planner.search.space import ANY, PARTIAL, REPLICATED

Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]

#: A transition that no collective can make (a split tensor cannot become a pending sum).
IMPOSSIBLE = "impossible"


def transition(src: int, dst: int) -> Collective | None | str:
    """The collective that turns layout `src` into `dst` (None: local, free)."""
    if dst == ANY or src == dst:
        return None
    if src == REPLICATED:
        return None  # slicing, or keeping one copy as the partial sum and zeros elsewhere
    if src == PARTIAL:
        return "all_reduce" if dst == REPLICATED else "reduce_scatter"
    # src is split on a dim
    if dst == REPLICATED:
        return "all_gather"
    if dst == PARTIAL:
        return IMPOSSIBLE
    return "all_to_all"


def grad_layout(required_input: int, split: bool) -> int | None:
    """Layout of the gradient an op hands back for an input it read in `required_input`."""
    if required_input == ANY:
        return None
    if required_input == PARTIAL:
        return REPLICATED
    if required_input == REPLICATED:
        return PARTIAL if split else REPLICATED
    return required_input


def conjugate(output_layout: int) -> int:
    """Layout in which a producer needs the gradient of an output it left in `output_layout`."""
    return REPLICATED if output_layout == PARTIAL else output_layout
