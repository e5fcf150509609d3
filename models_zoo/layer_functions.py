"""Repeated layers as ONNX model-local functions: one body per layer type, one call per layer.

Why: a 61-layer model repeats the same ~150 nodes 61 times; the node
names and scope metadata of those copies were most of a flat zoo file
(2 MB for deepseek-v3). As a function, the body is stored once and each
layer is a single call node that passes the layer's activations and its
parameters, which is what PyTorch's exporter writes for modules it is asked
to keep as functions (``export_modules_as_functions``).

What keeps the graph the same after inlining (ONNX's inliner, ORT, or
hyperplan's importer, which also restores scopes):

- the call node sits in the layer's scope (``/model/layers.3/LlamaDecoderLayer``)
  and body nodes are named relative to the layer (``/self_attn/q_proj/MatMul``),
  so call prefix + body name is the flat graph's node name;
- a body parameter is a function input named by its layer-relative module
  path (``self_attn.q_proj.weight``); each call passes the initializer
  ``<layer path>.<that name>``, so parameter names are unchanged;
- the caller's node numbering skips what the body emitted, so nodes added
  to the layer's scope after the call are named as in the flat graph.

A body must depend only on the config that is fixed for the whole model
(one function per `kind`); anything per layer (DeepStack hooks, taps)
stays outside the call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from onnx import FunctionProto, ModelProto, NodeProto, helper

from models_zoo.graph_builder import FUNCTION_DOMAIN, OPSET, GraphBuilder

#: A layer body: builder, then the layer's inputs in the order given; returns its output(s).
Body = Callable[..., "str | list[str]"]


@dataclass(frozen=True, slots=True)
class LayerFunction:
    """One defined function and what each call needs to reproduce the flat layer."""

    proto: FunctionProto
    n_inputs: int  # activation inputs, before the parameters
    params: tuple[tuple[str, tuple[int, ...]], ...]  # (layer-relative name, shape), in input order
    n_out: int
    op_counts: dict[tuple[str, str], int]  # nodes per (relative scope prefix, op type)


def call_layer(b: GraphBuilder, kind: str, scope: str, body: Body, inputs: dict[str, str]) -> str | list[str]:
    """Emit layer `scope` (e.g. ``layers.3``) of type `kind`: inline in a flat graph, else a function call.

    `inputs` maps the function's formal input names (``hidden_states``,
    ``cos``...) to this layer's values; `body` is called with the builder
    and those values in order.
    """
    with b.scope(scope):
        if b.flat:
            return body(b, *inputs.values())
        fn = b.functions.get(kind)
        if fn is None:
            fn = b.functions[kind] = _define(b, kind, body, list(inputs))
        if fn.n_inputs != len(inputs):  # internal invariant: one kind, one signature
            raise AssertionError(f"layer function {kind} takes {fn.n_inputs} inputs, called with {len(inputs)}")
        args = list(inputs.values()) + [b.param(name, shape) for name, shape in fn.params]
        out = b.op(kind, args, n_out=fn.n_out, domain=FUNCTION_DOMAIN)
        b.skip_op_names(fn.op_counts)
        return out


def _define(b: GraphBuilder, kind: str, body: Body, formals: list[str]) -> LayerFunction:
    """Build the body once with a builder of its own, rooted at the layer (relative scopes)."""
    sub = GraphBuilder(kind, b.dtype, flat=True)
    sub.body_params = []
    outs = body(sub, *formals)
    outs = [outs] if isinstance(outs, str) else list(outs)
    if any(o in formals for o in outs):  # internal invariant: a body computes what it returns
        raise AssertionError(f"layer function {kind} returns one of its inputs unchanged")
    params = tuple(sub.body_params)
    proto = helper.make_function(
        FUNCTION_DOMAIN, kind, formals + [name for name, _ in params], outs, list(sub.graph.node),
        [helper.make_opsetid("", OPSET)],
    )
    return LayerFunction(proto, len(formals), params, len(outs), dict(sub.op_counts()))


def inlined_node_count(model: ModelProto) -> int:
    """Nodes of `model` once its local functions are inlined: what an importer or a runtime sees."""
    bodies = {(f.domain, f.name): f for f in model.functions}
    sizes: dict[tuple[str, str], int] = {}

    def size(node: NodeProto) -> int:
        key = (node.domain, node.op_type)
        if key not in bodies:
            return 1
        if key not in sizes:
            sizes[key] = 0  # a recursive function (invalid ONNX) counts as empty rather than looping
            sizes[key] = sum(size(n) for n in bodies[key].node)
        return sizes[key]

    return sum(size(n) for n in model.graph.node)
