"""Which tensors are parameters, which are constants, and how node attributes read in Python.

A parameter is a stored tensor the model learns (or was quantised from):
- an initializer (inline or external data, or a graph input backed by a
  same-named initializer, as exporters with keep_initializers_as_inputs write
  them) of a floating dtype with more than one element, or of a 2/4/8-bit
  integer dtype with at least `QUANT_PARAM_MIN_NUMEL` elements (quantised
  weights);
- the output of a ConstantOfShape whose shape is a constant, with the same
  dtype and size rule (the light_* models of the ONNX test suite build their
  weights this way);
- the output of a Constant node under the same rule but with at least
  `CONSTANT_PARAM_MIN_NUMEL` elements: Constant nodes are where exporters put
  literals (scales, epsilons, masks), so only a large one is a weight.
Not parameters: integer shape tensors and scalars, tensors no node reads,
BatchNormalization's running mean and variance (inputs 3 and 4), which are
statistics, not trained weights — as PyTorch counts them (buffers) — and
tensors that only steer a selection (`steering_only`).

Where the exporter wrote down which inputs were parameters (PyTorch's
`pkg.torch.export.ExportedProgram.graph_signature` graph metadata, with
`PARAMETER target='...'` and `BUFFER target='...'` lines), that list wins:
a scalar parameter such as CLIP's `logit_scale` counts, a buffer such as
RoPE's `inv_freq` does not. A tensor it does not list (its optimiser's
folding made it) counts when it is read as a weight: by a contraction, or as
a Gather's table (a folded transpose of a listed weight), not when it is read
elementwise (rotary cos/sin tables, masks).
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable, Mapping

import onnx

from planner.graph.onnx_shapes import tensor_value
from planner.graph.dtype_rules import dtype_name
from planner.graph.shape_rules import PShape

QUANT_PARAM_MIN_NUMEL = 1024
CONSTANT_PARAM_MIN_NUMEL = 1024
_QUANT_DTYPES = frozenset({"int8", "uint8", "int4", "uint4", "int2", "uint2"})
_RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                         "Bernoulli", "Multinomial", "Dropout"})
#: Attribute tensors with at most this many elements keep their values in Node.attrs.
ATTR_VALUES_NUMEL = 64


def is_weight_dtype(dtype: str, numel: int, min_numel: int = 2) -> bool:
    if dtype.startswith(("float", "bfloat")):
        return numel >= min_numel
    return dtype in _QUANT_DTYPES and numel >= max(min_numel, QUANT_PARAM_MIN_NUMEL)


def _numel(shape: PShape) -> int | None:
    if shape is None or any(d is None for d in shape):
        return None
    return math.prod(shape)  # type: ignore[arg-type]


SIGNATURE_KEY = "pkg.torch.export.ExportedProgram.graph_signature"
_SIGNATURE_LINE = re.compile(r"\b(PARAMETER|BUFFER|CONSTANT_TENSOR)\s+target='([^']+)'")
_PLACEHOLDER_LINE = re.compile(r"(\w+):\s*(PARAMETER|BUFFER|CONSTANT_TENSOR)\s+target='([^']+)'")


def declared_roles(graph: onnx.GraphProto) -> dict[str, str]:
    """Initializer name -> 'PARAMETER' / 'BUFFER' / 'CONSTANT_TENSOR' from the exporter's signature, if any."""
    for prop in graph.metadata_props:
        if prop.key == SIGNATURE_KEY:
            return {m.group(2): m.group(1) for m in _SIGNATURE_LINE.finditer(prop.value)}
    return {}


def declared_placeholders(graph: onnx.GraphProto) -> dict[str, str]:
    """torch.export placeholder -> the parameter it stands for ('p_model_layers_0_mlp_experts_down_proj' ->
    'model.layers.0.mlp.experts.down_proj'), from the exporter's signature, if any."""
    for prop in graph.metadata_props:
        if prop.key == SIGNATURE_KEY:
            return {m.group(1): m.group(3) for m in _PLACEHOLDER_LINE.finditer(prop.value) if m.group(2) == "PARAMETER"}
    return {}


def find_params(graph: onnx.GraphProto, nodes: list[onnx.NodeProto], consumed: set[str],
                shapes: Mapping[str, PShape], dtypes: Mapping[str, str],
                roles: Mapping[str, str] | None = None) -> list[str]:
    """Parameter names in order of first use (then initializer order for the rest).

    `roles` is `declared_roles` of the original graph (the skeleton drops metadata).
    """
    stats = {n.input[i] for n in nodes if n.op_type == "BatchNormalization" for i in (3, 4) if len(n.input) > i}
    init_names = {t.name for t in graph.initializer}
    constant_names = set(init_names)
    candidates: set[str] = set()
    for t in graph.initializer:
        numel = math.prod(t.dims)
        if t.name in consumed and is_weight_dtype(dtype_name(t.data_type), numel):
            candidates.add(t.name)
    for n in nodes:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            constant_names.update(n.output)
            out = n.output[0]
            numel = _numel(shapes.get(out))
            if numel is not None and is_weight_dtype(dtypes.get(out, ""), numel, CONSTANT_PARAM_MIN_NUMEL):
                candidates.add(out)
        elif n.op_type == "ConstantOfShape" and n.input and n.input[0] in constant_names:
            out = n.output[0]
            constant_names.add(out)
            numel = _numel(shapes.get(out))
            if numel is not None and is_weight_dtype(dtypes.get(out, "float32"), numel):
                candidates.add(out)
    roles = declared_roles(graph) if roles is None else roles
    if roles:
        contracted = {x for n in nodes for j, x in enumerate(n.input) if x and _reads_as_weight(n.op_type, j)}
        candidates = {c for c in candidates if roles.get(c) == "PARAMETER" or (c not in roles and c in contracted)}
        candidates |= {t.name for t in graph.initializer if roles.get(t.name) == "PARAMETER"}
    candidates |= weight_inputs(graph, nodes, roles, shapes, dtypes)
    candidates = {c for c in candidates if c in consumed and c not in stats}
    ordered: list[str] = []
    seen: set[str] = set()
    for n in nodes:
        for i in n.input:
            if i in candidates and i not in seen:
                seen.add(i)
                ordered.append(i)
    ordered.extend(sorted(candidates - seen))  # read only by subgraphs or graph outputs
    return ordered


def weight_inputs(graph: onnx.GraphProto, nodes: list[onnx.NodeProto], roles: Mapping[str, str],
                  shapes: Mapping[str, PShape], dtypes: Mapping[str, str]) -> set[str]:
    """Graph inputs without an initializer that are weights: those the exporter's signature lists as parameters
    (torch's dynamo export saved with keep_initializers_as_inputs and without initializers); with no signature,
    floating inputs of fixed shape that are read as weights (see `_reads_as_weight`, through a Transpose or
    Cast) or named as one (``*.weight``, ``*.bias``): no caller feeds those."""
    inits = {t.name for t in graph.initializer}
    free = [vi.name for vi in graph.input if vi.name not in inits]
    if roles:
        return {n for n in free if roles.get(n) == "PARAMETER"}
    relay = {o: n.input[0] for n in nodes if n.op_type in ("Transpose", "Cast") and n.input for o in n.output}
    read_as_weight = {relay.get(x, x) for n in nodes for j, x in enumerate(n.input) if x and _reads_as_weight(
        n.op_type, j) and (j > 0 or n.op_type == "Gather")}
    out = set()
    for name in free:
        shape, dtype = shapes.get(name), dtypes.get(name, "")
        numel = _numel(shape)
        if numel is None or not is_weight_dtype(dtype, numel) or len(free) < 2:
            continue
        last = re.split(r"[./:]", name)[-1].lower()
        if name in read_as_weight or last in ("weight", "bias") or last.endswith(("_weight", "_bias")):
            out.add(name)
    return out


def steering_only(graph: onnx.GraphProto, nodes: list[onnx.NodeProto], nested: Mapping[int, set[str]],
                  params: Iterable[str], dtypes: Mapping[str, str], roles: Mapping[str, str]) -> set[str]:
    """Weights that reach the graph's outputs only through integer tensors (TopK's indices, a comparison).

    Such a tensor steers a selection and gets no gradient: DeepSeek-V3's
    `e_score_correction_bias`, added to the router's scores to pick experts
    but not to weigh them, is a buffer to torch. A gradient flows backwards
    from the floating outputs through floating tensors only. Names the
    exporter's signature lists as parameters are kept; a graph with no
    floating output (it returns ids only) says nothing, so nothing is dropped.
    `nested` holds, per control-flow node, the outer names its subgraphs read.
    """
    def floating(name: str) -> bool:
        return not dtypes.get(name, "float").startswith(("int", "uint", "bool"))

    reached = {o.name for o in graph.output if o.name and floating(o.name)}
    if not reached:
        return set()
    for idx in range(len(nodes) - 1, -1, -1):
        n = nodes[idx]
        if any(o in reached for o in n.output if o):
            reached.update(i for i in (*n.input, *nested.get(idx, ())) if i and floating(i))
    return {p for p in params if p not in reached and roles.get(p) != "PARAMETER"}


_CONTRACTIONS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "MatMulInteger", "ConvInteger"})


def _reads_as_weight(op_type: str, index: int) -> bool:
    """Whether input `index` of an op is where a learned weight goes: an operand of a contraction, or the table
    a Gather or GatherND looks rows up in (an embedding; the experts' weights picked by expert index). An
    exporter's optimiser folds a weight's transpose into a tensor of a new name that its signature does not list;
    rotary tables and masks, which it folds too, are read elsewhere."""
    return op_type in _CONTRACTIONS or (op_type in ("Gather", "GatherND") and index == 0)


def folded_nodes(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> list[bool]:
    """Per node: does it compute only from constants? Runtimes fold such nodes at load (cost 0 per step)."""
    const = {t.name for t in graph.initializer}
    out: list[bool] = []
    for n in nodes:
        ins = [i for i in n.input if i]
        folded = (n.op_type == "Constant" or (bool(ins) and all(i in const for i in ins))) and \
            n.op_type not in _RANDOM_OPS and not any(a.type in (onnx.AttributeProto.GRAPH,
                                                                onnx.AttributeProto.GRAPHS) for a in n.attribute)
        if folded:
            const.update(o for o in n.output if o)
        out.append(folded)
    return out


def tensor_attr(t: onnx.TensorProto) -> dict[str, Any]:
    """A tensor attribute as plain data: dtype, shape and (small ones only) the flat values."""
    value = tensor_value(t) if math.prod(t.dims) <= ATTR_VALUES_NUMEL else None
    values = tuple(value.reshape(-1).tolist()) if value is not None else None
    return {"dtype": dtype_name(t.data_type), "shape": tuple(int(d) for d in t.dims), "values": values}


def attrs_of(node: onnx.NodeProto) -> dict[str, Any]:
    """Node attributes as Python values; subgraphs become a short description."""
    A = onnx.AttributeProto
    out: dict[str, Any] = {}
    for a in node.attribute:
        t = a.type
        if t == A.INT:
            out[a.name] = a.i
        elif t == A.FLOAT:
            out[a.name] = a.f
        elif t == A.STRING:
            out[a.name] = a.s.decode("utf-8", "replace")
        elif t == A.INTS:
            out[a.name] = tuple(a.ints)
        elif t == A.FLOATS:
            out[a.name] = tuple(a.floats)
        elif t == A.STRINGS:
            out[a.name] = tuple(s.decode("utf-8", "replace") for s in a.strings)
        elif t == A.TENSOR:
            out[a.name] = tensor_attr(a.t)
        elif t == A.TENSORS:
            out[a.name] = tuple(tensor_attr(x) for x in a.tensors)
        elif t == A.GRAPH:
            out[a.name] = _graph_summary(a.g)
        elif t == A.GRAPHS:
            out[a.name] = tuple(_graph_summary(g) for g in a.graphs)
        else:
            out[a.name] = f"<{A.AttributeType.Name(t).lower()}>"
    return out


def _graph_summary(g: onnx.GraphProto) -> str:
    return f"<graph '{g.name}': {len(g.node)} nodes>"


def consumed_names(graph: onnx.GraphProto, nodes: Iterable[onnx.NodeProto], nested: Mapping[int, set[str]]) -> set[str]:
    """Every name a node (or a subgraph of one) reads, plus the graph outputs."""
    used = {o.name for o in graph.output}
    for idx, n in enumerate(nodes):
        used.update(i for i in n.input if i)
        used.update(nested.get(idx, ()))
    return used
