"""hyperplan's planner: ONNX graph in, parallel strategy out.

The public names are loaded on first use (PEP 562) so that `import planner`
costs nothing: no onnx, no solver, until a function needs them. What the
CLI calls, a user can call: `planner.plan_model(...)` (hyperplan plan),
`planner.estimate_model(...)` (estimate), `planner.run_sweep(...)` (whatif),
`planner.load_graph(...)` with `planner.discover_blocks(...)` (inspect).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers and readers; at run time see __getattr__
    from planner.api import estimate_model, load_graph, plan_model
    from planner.whatif import run_sweep
    from planner.errors import HyperplanError, Infeasible, InvalidInput, InvalidModel, SolverTimeout, \
        UnboundDimension
    from planner.graph.blocks import Block, BlockType, Structure, SubModel, discover_blocks
    from planner.graph.ir import Graph, Node, Tensor

_EXPORTS: dict[str, str] = {
    "load_graph": "planner.api",
    "plan_model": "planner.api",
    "estimate_model": "planner.api",
    "run_sweep": "planner.whatif",
    "discover_blocks": "planner.graph.blocks",
    "Block": "planner.graph.blocks",
    "BlockType": "planner.graph.blocks",
    "SubModel": "planner.graph.blocks",
    "Structure": "planner.graph.blocks",
    "Graph": "planner.graph.ir",
    "Node": "planner.graph.ir",
    "Tensor": "planner.graph.ir",
    "HyperplanError": "planner.errors",
    "InvalidInput": "planner.errors",
    "InvalidModel": "planner.errors",
    "UnboundDimension": "planner.errors",
    "Infeasible": "planner.errors",
    "SolverTimeout": "planner.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'planner' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
