"""How each parameter is used, read from the graph: its op, the dim whose split leaves a pending sum, its input.

Backends need more than "split dim 0": a split on the dim a matmul sums
over leaves the output partial (Megatron's row-parallel linear), a split of
an embedding's vocabulary too (the masked lookup is summed), and under
sequence parallelism an op reading the residual stream receives it split by
sequence. All three come from the graph, so no architecture is hard-coded.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.costing.activations import layer_inputs, requires_grad
from planner.graph.blocks import Structure
from planner.graph.ir import Graph

#: Ops a parameter passes through unchanged in meaning before its real consumer.
_PASS = frozenset({"Transpose", "Cast", "Identity"})
#: Ops that keep a tensor "the residual stream" (elementwise and normalisation ops).
_ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "ReduceMean", "Cast", "Identity", "Neg", "Dropout",
    "LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization", "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization",
})
_SCALE = frozenset({"Add", "Sub", "Mul", "Div"})
_CONTRACTIONS = frozenset({"MatMul", "Gemm", "Conv", "Einsum", "MatMulInteger", "QLinearMatMul"})


@dataclass(frozen=True, slots=True)
class ParamRole:
    """The use of one parameter: `op` is linear, embedding, scale (norm weights, biases), conv or other."""

    op: str
    partial_dim: int | None  # a split of this dim leaves the op's output partial (a pending sum)
    input_shape: tuple[int, ...] | None  # the activation the op reads, if any
    reads_residual: bool  # that activation is the residual stream (reached through elementwise ops only)
    model_output: bool = False  # the op's output reaches a model output without another contraction (logits)


def _consumers(graph: Graph) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, n in enumerate(graph.nodes):
        for x in n.inputs:
            if x:
                out.setdefault(x, []).append(i)
    return out


def residual_tensors(graph: Graph, structure: Structure) -> set[str]:
    """Tensors reached from a layer's input through elementwise ops only: the residual stream and its norms.

    One pass in topological order, O(nodes + edges).
    """
    grad = requires_grad(graph)
    flagged: set[str] = set()
    for b in structure.blocks:
        if b.is_layer:
            flagged.update(layer_inputs(graph, set(b.nodes), grad))
    for n in graph.nodes:
        if n.op_type in _ELEMENTWISE and any(x in flagged for x in n.inputs if x):
            flagged.update(o for o in n.outputs if o)
    return flagged


def output_tensors(graph: Graph) -> set[str]:
    """Tensors that reach a model output through ops other than contractions (one reverse pass)."""
    reach = set(graph.outputs)
    for n in reversed(graph.nodes):
        if n.op_type not in _CONTRACTIONS and any(o in reach for o in n.outputs if o):
            reach.update(x for x in n.inputs if x)
    return reach


def param_roles(graph: Graph, structure: Structure) -> dict[str, ParamRole]:
    """A role per parameter, in graph order."""
    consumers = _consumers(graph)
    residual = residual_tensors(graph, structure)
    outputs = output_tensors(graph)
    roles: dict[str, ParamRole] = {}
    for p in graph.params:
        roles[p] = _role(graph, consumers, residual, outputs, p)
    return roles


def _role(graph: Graph, consumers: dict[str, list[int]], residual: set[str], outputs: set[str], p: str) -> ParamRole:
    shape = graph.tensors[p].shape or ()
    dims = list(range(len(shape)))  # dims[j]: the parameter dim at position j of the value followed
    value = p
    for _ in range(4):  # follow Transpose/Cast chains to the real consumer
        uses = consumers.get(value, [])
        if len(uses) != 1 or graph.nodes[uses[0]].op_type not in _PASS:
            break
        node = graph.nodes[uses[0]]
        if node.op_type == "Transpose":
            perm = node.attrs.get("perm") or tuple(reversed(range(len(dims))))
            dims = [dims[k] for k in perm]
        value = node.outputs[0]
    uses = consumers.get(value, [])
    if not uses:
        return ParamRole("other", None, None, False)
    node = graph.nodes[uses[0]]
    slot = node.inputs.index(value)
    others = [x for k, x in enumerate(node.inputs) if x and k != slot and x not in graph.params]
    act = others[0] if others else None
    act_shape = graph.tensors[act].shape if act and act in graph.tensors else None
    reads = act in residual if act else False
    op, partial = "other", None
    if node.op_type == "MatMul" and len(dims) >= 2:
        op = "linear"
        partial = dims[-2] if slot == 1 else dims[-1]
    elif node.op_type == "Gemm" and len(dims) == 2:
        op = "linear"
        if slot == 1:
            partial = dims[1] if node.attrs.get("transB", 0) else dims[0]
        else:
            partial = dims[0] if node.attrs.get("transA", 0) else dims[1]
    elif node.op_type == "Gather" and slot == 0:
        op = "embedding"
        axis = int(node.attrs.get("axis", 0))
        partial = dims[axis] if 0 <= axis < len(dims) else None
        reads = False  # it reads token ids, not the residual stream
    elif node.op_type == "Conv" and slot == 1:
        op, partial = "conv", 1
    elif node.op_type in _SCALE or node.op_type in _ELEMENTWISE:
        op = "scale"
    last = op == "linear" and any(o in outputs for o in node.outputs if o)
    return ParamRole(op, partial, tuple(act_shape) if act_shape else None, reads, last)
