"""Declared layouts as pins of the intra-op problem, so the estimate scores a hand-edited layout as written.

The estimate's tensor-axis choice for a parameter is one small int (the
dim split over tp, or replicated: see `search.space`); a declared layout
says the same as the dim whose axes include tp. Pinning every declared
parameter and letting the solver choose the ops' strategies around them
scores an edit (a weight moved from column- to row-parallel, or
replicated) with the compute, resharding and memory it implies.

What cannot be scored is an `InvalidInput` of one sentence: an entry
naming no parameter, a dim tp does not split evenly, an unknown axis,
layers of one tied block type declared differently (they share one
decision in the estimate: `search.tying`), and boundary activations that
disagree with the strategy (the estimate places a model input's batch
over dp and sequence over cp, and splits the layer boundary by sequence
over tp exactly under sequence parallelism). Axes other than tp on a
parameter (ep on experts aside) are not scored: ZeRO shards the stored
state, declared apart (`zero`). Nor is a routed expert's tp split a pin:
the estimate splits experts over etp x ep, as the strategy says.
"""

from __future__ import annotations

from typing import Any, Mapping

from planner.errors import InvalidInput
from planner.graph.blocks import Structure
from planner.graph.ir import Graph
from planner.graph.moe import expert_params
from planner.hypershard.layouts import activation_layouts, dim_axes, estimated_by_param
from planner.hypershard.patterns import expand
from planner.search.space import REPLICATED
from planner.strategy import Strategy

AXES = ("tp", "cp", "dp", "pp", "ep")


def tp_layout(dims: list[Any]) -> int:
    """The estimate's layout of a declared parameter: the first dim split over tp, else REPLICATED."""
    return next((d for d, spec in enumerate(dims) if "tp" in dim_axes(spec)), REPLICATED)


def layout_text(layout: int) -> str:
    return "replicated" if layout == REPLICATED else f"split on dim {layout}"


def declared_pins(view: Mapping[str, Any], graph: Graph, structure: Structure, s: Strategy) -> dict[str, int]:
    """{parameter: its declared tensor-axis layout} for one program's view; empty when tp is 1."""
    resolved, _, unused = expand(view["layouts"]["params"], graph.params)
    if unused:
        raise InvalidInput(f"layout entry {unused[0]!r} matches no parameter of the model; fix its name or pattern, "
                           "or remove it")
    if s.tp == 1:
        return {}
    pins: dict[str, int] = {}
    routed = expert_params(graph, structure)
    for p, entry in resolved.items():
        shape = graph.tensors[p].shape or ()
        dims = entry["dims"]
        if len(dims) != len(shape):
            raise InvalidInput(f"{p} has {len(shape)} dims {list(shape)} and its layout gives {len(dims)}; give one "
                               "entry per dim")
        for d, spec in enumerate(dims):
            bad = [a for a in dim_axes(spec) if a not in AXES]
            if bad:
                raise InvalidInput(f"{p} dim {d} names mesh axis {bad[0]!r}; use {', '.join(AXES)}")
        split = [d for d, spec in enumerate(dims) if "tp" in dim_axes(spec)]
        if len(split) > 1:
            raise InvalidInput(f"{p} is split over tp on dims {split}; an axis splits one dim of a tensor")
        if split and (shape[split[0]] < s.tp or shape[split[0]] % s.tp):
            raise InvalidInput(f"{p} dim {split[0]} ({shape[split[0]]}) does not split evenly over tp = {s.tp}; "
                               "declare another dim or null")
        if p not in routed:  # a routed expert's split is the strategy's etp x ep, not a layout of the program
            pins[p] = split[0] if split else REPLICATED
    _check_tied(graph, structure, pins)
    return pins


def _check_tied(graph: Graph, structure: Structure, pins: Mapping[str, int]) -> None:
    from planner.search.tying import tie_keys

    _, keys = tie_keys(graph, structure)
    first: dict[Any, str] = {}
    for p in graph.params:
        if p not in pins:
            continue
        other = first.setdefault(keys[p], p)
        if pins[other] != pins[p]:
            raise InvalidInput(f"{p} is declared {layout_text(pins[p])} over tp and {other} {layout_text(pins[other])}"
                               ", but layers of one block type share their layouts in the estimate; declare them alike "
                               "(one glob for all)")


def estimator_pins(structure: Structure, estimated: Mapping[str, Mapping[str, str]],
                   names: Mapping[str, int]) -> dict[str, int]:
    """The estimator's own layouts of the parameters in `names`, from an estimate's per-block-type table."""
    flat = estimated_by_param(structure, estimated)
    return {p: REPLICATED if flat.get(p, "R") == "R" else int(flat[p][1:]) for p in names}


def check_activations(view: Mapping[str, Any], graph: Graph, structure: Structure, s: Strategy, seq_len: int) -> None:
    """Declared boundary layouts must be those the strategy gives (see the module docstring)."""
    derived = activation_layouts(graph, structure, s, seq_len)
    for key, entry in (view["layouts"].get("activations") or {}).items():
        if key not in derived:
            raise InvalidInput(f"layouts.activations entry {key!r} names no model input or layer stack of the model; "
                               "fix or remove it")
        if entry["dims"] != derived[key]["dims"]:
            raise InvalidInput(f"layouts.activations[{key!r}] is {entry['dims']}, but this strategy places it "
                               f"{derived[key]['dims']} (batch over dp, sequence over cp, and over tp between layers "
                               "exactly when layouts.sequence_parallel is true); make them agree")
