"""ONNX model -> `Graph`: concrete shapes, parameters, scopes and a cost per node.

The steps, each in its own module:
  read (no weights loaded) -> inline local functions, keep scopes (`onnx_scopes`)
  -> check and order the nodes (`onnx_read`) -> bind symbolic dims (`onnx_dims`)
  -> infer shapes: ONNX, then our rules (`onnx_shapes`) -> find parameters
  (`onnx_params`) -> cost each node (`op_costs`, `onnx_subgraphs`).
Whatever the importer had to assume is written to `Graph.notes`.
"""

from __future__ import annotations

import numbers
import os
from types import MappingProxyType
from typing import Mapping

import onnx
import onnx.numpy_helper

from planner.errors import InvalidInput, InvalidModel, UnboundDimension
from planner.graph import onnx_dims
from planner.graph.ir import Graph, Node, Tensor
from planner.graph.onnx_params import (attrs_of, consumed_names, declared_placeholders, declared_roles, find_params,
                                      folded_nodes, steering_only)
from planner.graph.onnx_read import inline_small_external, nested_refs, read_model, skeleton, topo_order
from planner.graph.onnx_scopes import inline_functions, node_scope
from planner.graph.onnx_shapes import Shapes, collect, propagate, write_back
from planner.graph.onnx_subgraphs import control_flow_cost, is_control_flow
from planner.graph.onnx_folded import unfold, unrename, unshare, untie, unview
from planner.graph.op_cost_tables import VIEW_OPS
from planner.graph.op_costs import OpCost, node_cost, read_once
from planner.graph.shape_rules import is_full, merge

#: Control-flow nodes described one by one in Graph.notes; the rest are counted.
MAX_FLOW_NOTES = 10


def import_model(source: str | os.PathLike | onnx.ModelProto, *, dims: Mapping[str, int] | None = None,
                 batch: int | None = None, seq_len: int | None = None, name: str | None = None,
                 built: bool = False) -> Graph:
    """Import an ONNX model (path or proto) as a costed `Graph` at concrete shapes.

    `dims` binds symbolic dims by exact name (or ``input[k]`` for an unnamed
    dim of a graph input); `batch` and `seq_len` bind every dim whose name
    reads as a batch size or a sequence length (rules in `onnx_dims`).
    `built`: the proto was built in this process field by field (the zoo, a
    config.json), so protobuf checked its strings as they were set
    (`read_model`).
    """
    _check_options(dims, batch, seq_len)
    model, default_name = read_model(source, built=built)
    notes: list[str] = []
    scopes = [node_scope(n) for n in model.graph.node]
    skel = skeleton(model)
    base_dir = os.path.dirname(os.path.abspath(os.fspath(source))) if isinstance(source, (str, os.PathLike)) else None
    inline_small_external(skel, base_dir)
    if note := unrename(skel, model, scopes, declared_placeholders(model.graph)):
        notes.append(note)
    if note := untie(skel, model, scopes, base_dir):
        notes.append(note)
    roles = declared_roles(model.graph)
    for note in (unfold(skel, scopes, roles), unshare(skel, scopes, roles),
                 unview(skel, scopes, declared_placeholders(model.graph))):
        if note:
            notes.append(note)
    skel, scopes, note = inline_functions(skel, scopes)
    if note:
        notes.append(note)
    g = skel.graph
    order = topo_order(g)
    if order != list(range(len(order))):
        nodes = [onnx.NodeProto() for _ in order]
        for new, i in zip(nodes, order):
            new.CopyFrom(g.node[i])
        del g.node[:]
        g.node.extend(nodes)
        scopes = [scopes[i] for i in order]
        notes.append("nodes were not in topological order; sorted them (stable)")
    bound = _bind(g, dims or {}, batch, seq_len, notes)
    known = _infer(skel, bound, notes)
    return _build(skel, known, scopes, bound, notes, name or default_name, model)


def _check_options(dims: Mapping[str, int] | None, batch: int | None, seq_len: int | None) -> None:
    for flag, v in (("--batch", batch), ("--seq-len", seq_len), *((f"--dim {k}", v) for k, v in (dims or {}).items())):
        if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral) or v <= 0):
            raise InvalidInput(f"{flag} must be a positive integer, got {v!r}")


def _input_dims(g: onnx.GraphProto) -> list[tuple[onnx.ValueInfoProto, int, onnx.TensorShapeProto.Dimension]]:
    inits = {t.name for t in g.initializer}
    return [(vi, k, d) for vi in g.input if vi.name not in inits
            for k, d in enumerate(vi.type.tensor_type.shape.dim)]


_INTEGER_TYPES = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT16,
                            onnx.TensorProto.INT8, onnx.TensorProto.UINT8})


def _data_inputs(g: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs a caller feeds: not initializers, and with a tensor shape."""
    inits = {t.name for t in g.initializer}
    return [vi for vi in g.input if vi.name not in inits and vi.type.HasField("tensor_type")
            and vi.type.tensor_type.HasField("shape")]


def _check_fixed_length(g: onnx.GraphProto, seq_len: int) -> bool:
    """Refuse a --seq-len that a graph with fixed-length token inputs cannot be costed at; True when the
    graph's length is that one."""
    for vi in _data_inputs(g):
        tt = vi.type.tensor_type
        if tt.elem_type in _INTEGER_TYPES and len(tt.shape.dim) == 2 and tt.shape.dim[1].HasField("dim_value"):
            fixed = tt.shape.dim[1].dim_value
            if fixed != seq_len:
                raise InvalidInput(f"the model's input '{vi.name}' fixes the sequence length at {fixed}, but "
                                   f"--seq-len {seq_len} was given; pass --seq-len {fixed}, or re-export the model "
                                   "with a dynamic sequence dimension")
            return True
    return False


def _named(g: onnx.GraphProto, key: str) -> bool:
    """Whether the input dim `name[k]` carries a symbol (then it is listed by its symbol instead)."""
    name, _, k = key[:-1].rpartition("[")
    vi = next(v for v in g.input if v.name == name)
    return bool(vi.type.tensor_type.shape.dim[int(k)].dim_param)


def _bind(g: onnx.GraphProto, dims: Mapping[str, int], batch: int | None, seq_len: int | None,
          notes: list[str]) -> dict[str, int]:
    """Bind symbols, substitute them into inputs/outputs/value_info; raise for unbound input dims."""
    all_vis = (*g.input, *g.output, *g.value_info)
    exprs = sorted({d.dim_param for vi in all_vis for d in vi.type.tensor_type.shape.dim if d.dim_param})
    symbols = sorted({s for e in exprs for s in onnx_dims.names_in(e)})
    positional = {f"{vi.name}[{k}]" for vi, k, d in _input_dims(g) if not d.HasField("dim_value")}
    stray = sorted(k for k in dims if k not in symbols and k not in positional)
    if stray:
        on_inputs = sorted({s for _, _, d in _input_dims(g) if d.dim_param for s in onnx_dims.names_in(d.dim_param)})
        listed = ", ".join(on_inputs + sorted(p for p in positional if not _named(g, p))) or "none"
        raise InvalidInput(f"--dim {stray[0]!r} names no symbolic dimension of this model; "
                           f"its inputs' symbols are: {listed}")
    roles = onnx_dims.input_roles([(vi.type.tensor_type.elem_type in _INTEGER_TYPES,
                                    [d.dim_param if d.dim_param in symbols else ""
                                     for d in vi.type.tensor_type.shape.dim]) for vi in _data_inputs(g)])
    bound = onnx_dims.bind(symbols, dims, batch, seq_len, roles)
    for flag, v, rule, role in (("--batch", batch, onnx_dims.is_batch_name, "batch"),
                                ("--seq-len", seq_len, onnx_dims.is_seq_name, "seq")):
        if v is not None and not any(rule(s) or roles.get(s) == role for s in symbols):
            if role == "seq" and _check_fixed_length(g, v):
                continue
            notes.append(f"{flag} {v} was given but no symbolic dimension of the model reads as one; ignored")
    read = {i for n in g.node for i in n.input}
    inits = {t.name for t in g.initializer}
    for vi in g.input:
        tt = vi.type.tensor_type
        if vi.name in read and vi.name not in inits and vi.type.HasField("tensor_type") and not tt.HasField("shape"):
            raise InvalidModel(f"graph input '{vi.name}' declares no shape (not even its rank); re-export the model "
                               "with example inputs so its inputs carry shapes")
    unbound: list[str] = []
    where = ""
    for vi, k, d in _input_dims(g):
        if d.HasField("dim_value"):
            continue
        key = f"{vi.name}[{k}]"
        value = dims.get(key) if key in dims else (onnx_dims.evaluate(d.dim_param, bound) if d.dim_param else None)
        if value is None:
            missing = [s for s in onnx_dims.names_in(d.dim_param) if s not in bound] if d.dim_param else [key]
            unbound.extend(m for m in missing if m not in unbound)
            where = where or f"graph input '{vi.name}', dim {k}"
        else:
            d.dim_value = int(value)
    if unbound:
        raise UnboundDimension(unbound, where, " / ".join(f for f, v in (("--batch", batch), ("--seq-len", seq_len))
                                                       if v is None))
    for vi in (*g.output, *g.value_info):
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param:
                v = onnx_dims.evaluate(d.dim_param, bound)
                if v is not None:
                    d.dim_value = v
    return dict(sorted(bound.items()))


def _infer(skel: onnx.ModelProto, bound: Mapping[str, int], notes: list[str]) -> Shapes:
    """ONNX inference without its data propagation, then our pass; where shapes are left unknown, ONNX's once more
    with data propagation (a Reshape's target computed from Shape ops), on what ours fixed. Data propagation
    materialises index tensors as long as the sequence: Qwen3-235B at 128K tokens took 19.6 s to import with it
    first, 4.3 s without, the same graph."""
    inferred, ok = _onnx_infer(skel, notes, data_prop=False)
    known = collect(inferred.graph, bound)
    nodes = list(inferred.graph.node)
    propagate(nodes, known, attrs_of)
    unknown = [o for n in nodes for o in n.output if o and not is_full(known.shape.get(o))]
    if unknown and ok:
        write_back(skel.graph, known, [o for n in nodes for o in n.output if o])
        again, _ = _onnx_infer(skel, notes, data_prop=True)
        second = collect(again.graph, bound)
        for k, v in known.value.items():
            second.value.setdefault(k, v)
        for k, s in known.shape.items():
            second.shape[k] = merge(second.shape.get(k), s)
        propagate(list(again.graph.node), second, attrs_of)
        known, inferred = second, again
    skel.CopyFrom(inferred)
    return known


#: Integer constants between these are no dimension, axis or index of a real model (INT64_MAX-like sentinels of
#: "to the end" slices lie above, INT32_MAX below): ONNX's data propagation can materialise one as that many
#: elements in native code (a corrupted 2**40 ate all of a machine's memory), so such a graph is inferred
#: without it.
IMPLAUSIBLE_INT = (2**27, 2**62)


def _implausible_int(graph: onnx.GraphProto) -> int | None:
    """The first small integer constant (a Constant node or an initializer of at most 64 values) whose size is
    in IMPLAUSIBLE_INT and not INT32_MAX/INT32_MIN, or None."""
    lo, hi = IMPLAUSIBLE_INT
    tensors = [t for t in graph.initializer if len(t.dims) <= 1 and (not t.dims or t.dims[0] <= 64)]
    values: list[int] = []
    for n in graph.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            for a in n.attribute:
                values += list(a.ints) if a.name == "value_ints" else [a.i] if a.name == "value_int" else []
                if a.name == "value" and a.t.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
                    tensors.append(a.t)
    for t in tensors:
        if t.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
            try:
                values += [int(v) for v in onnx.numpy_helper.to_array(t).reshape(-1)[:64]]
            except Exception:  # noqa: BLE001 - a malformed constant: shape inference reports it
                continue
    return next((v for v in values if lo < abs(v) < hi and v not in (2**31 - 1, -(2**31))), None)


def _onnx_infer(skel: onnx.ModelProto, notes: list[str], data_prop: bool) -> tuple[onnx.ModelProto, bool]:
    """ONNX shape inference, with data propagation if asked (not when a constant could make it allocate without
    bound); on failure, the model as is and a note."""
    huge = _implausible_int(skel.graph) if data_prop else None
    if huge is not None:
        notes.append(f"the integer constant {huge:,} is no dimension of a real model; ONNX shape inference ran "
                     "without data propagation")
    try:
        return onnx.shape_inference.infer_shapes(skel, data_prop=data_prop and huge is None), True
    except Exception as exc:  # onnx raises several types (InferenceError, ValidationError, RuntimeError)
        reason = str(exc).strip().split("\n")[0][:200]
        notes.append(f"ONNX shape inference failed ({reason}); shapes come from our own rules only")
        return skel, False


def _build(skel: onnx.ModelProto, known: Shapes, scopes: list[str], bound: Mapping[str, int],
           notes: list[str], name: str, original: onnx.ModelProto) -> Graph:
    g = skel.graph
    nodes = list(g.node)
    nested = {i: nested_refs(n) for i, n in enumerate(nodes) if is_control_flow(n)}
    consumed = consumed_names(g, nodes, nested)
    roles = declared_roles(original.graph)
    params = find_params(g, nodes, consumed, known.shape, known.dtype, roles)
    steering = steering_only(g, nodes, nested, params, known.dtype, roles)
    if steering:
        params = [p for p in params if p not in steering]
        notes.append(f"{len(steering)} weight(s) reach the outputs only through integer tensors (they steer a "
                     f"selection, such as TopK's indices, and get no gradient: {', '.join(sorted(steering)[:3])}"
                     f"{', ...' if len(steering) > 3 else ''}); buffers, not parameters")
    param_set = set(params)
    init_names = {t.name for t in g.initializer}
    dead = sum(1 for t in g.initializer if t.name not in consumed)
    if dead:
        notes.append(f"{dead} initializer(s) are read by no node; ignored")
    as_inputs = sum(1 for vi in g.input if vi.name in init_names)
    if as_inputs:
        notes.append(f"{as_inputs} graph input(s) have a same-named initializer; treated as weights, not inputs")
    bare = sum(1 for vi in g.input if vi.name in param_set and vi.name not in init_names)
    if bare:
        how = "the exporter's signature lists them as parameters" if roles else \
            "fixed-shape floating inputs read as weights"
        notes.append(f"{bare} graph input(s) are weights without data ({how}); counted as parameters, not inputs")
    tensors: dict[str, Tensor] = {}

    def tensor(n: str) -> None:
        if n and n not in tensors:
            tensors[n] = Tensor(n, _full(known.shape.get(n)), known.dtype.get(n, "undefined"), n in param_set)

    held = {n for n, r in roles.items() if r != "PARAMETER"}  # buffers and constants the exporter lists: not data
    inputs = tuple(vi.name for vi in g.input if vi.name not in init_names and vi.name not in param_set
                   and vi.name not in held)
    for n in inputs:
        tensor(n)
    folded = folded_nodes(g, nodes)
    ir_nodes: list[Node] = []
    used_names: set[str] = set()
    unknown_shape = 0
    zero = OpCost(0.0, 0.0, 0.0, True)
    flow_notes: list[str] = []
    for idx, (n, scope) in enumerate(zip(nodes, scopes)):
        ins, outs, op = tuple(n.input), tuple(n.output), n.op_type
        for t in ins + outs:
            if t not in tensors:
                tensor(t)
        in_t = [tensors[i] if i else None for i in ins]
        out_t = [tensors[o] if o else None for o in outs]
        unknown_shape += sum(1 for t in out_t if t is not None and t.shape is None)
        attrs = attrs_of(n) if n.attribute else {}
        if folded[idx]:
            cost = zero
        elif idx in nested:
            cost, how = control_flow_cost(n, lambda t: (_full(known.shape.get(t)), known.dtype.get(t, "undefined")),
                                          attrs_of, known.value)
            flow_notes.append(how)
        else:
            in_shapes, in_dtypes = [t.shape if t else None for t in in_t], [t.dtype if t else "" for t in in_t]
            cost = read_once(node_cost(op, n.domain, attrs, in_shapes, in_dtypes,
                                       [t.shape if t else None for t in out_t], [t.dtype if t else "" for t in out_t]),
                             ins, in_shapes, in_dtypes)
            if cost.known and op not in VIEW_OPS and "Sequence" not in op \
                    and any(t is not None and t.shape is None for t in in_t + out_t):  # a sequence has no shape
                cost = cost._replace(known=False)  # costed from the shapes we know: flag it
        node_name = n.name or f"{op}_{idx}"
        if node_name in used_names:
            node_name = f"{node_name}#{idx}"
        used_names.add(node_name)
        ir_nodes.append(Node(node_name, op, ins, outs, attrs, n.domain, scope,
                             cost.flops, cost.bytes_read, cost.bytes_written, cost.known))
    for p in params:
        tensor(p)
    for vi in g.output:
        tensor(vi.name)
    notes.extend(flow_notes[:MAX_FLOW_NOTES])
    if len(flow_notes) > MAX_FLOW_NOTES:
        notes.append(f"... and {len(flow_notes) - MAX_FLOW_NOTES} more control-flow node(s) costed the same ways")
    causal = sum(1 for n in ir_nodes if n.op_type == "Attention" and n.attrs.get("is_causal", 0))
    if causal:
        notes.append(f"{causal} causal Attention node(s): FLOPs count the full score matrix; a kernel that skips "
                     "the masked half (FlashAttention) does about half of the attention FLOPs")
    n_folded = sum(folded)
    if n_folded:
        notes.append(f"{n_folded} node(s) compute only from constants (folded by runtimes at load); costed 0")
    if unknown_shape:
        notes.append(f"{unknown_shape} tensor(s) have shapes we could not infer; their nodes are costed from the "
                     "known shapes and flagged when a FLOP rule needed them")
    return Graph(
        name=name,
        nodes=tuple(ir_nodes),
        tensors=MappingProxyType(tensors),
        inputs=inputs,
        outputs=tuple(vi.name for vi in g.output),
        params=tuple(params),
        opset=next((op.version for op in original.opset_import if op.domain in ("", "ai.onnx")), 0),
        producer=f"{original.producer_name} {original.producer_version}".strip(),
        dims=MappingProxyType(dict(bound)),
        metadata=MappingProxyType({p.key: p.value for p in original.metadata_props}),
        notes=tuple(notes),
        scalars=MappingProxyType(_float_scalars(known)),
    )


def _float_scalars(known: Shapes) -> dict[str, float]:
    """The one-element floating values the import knows (initializers, Constant outputs, what folds from them)."""
    out = {}
    for name, v in known.value.items():
        if v is not None and v.size == 1 and (v.dtype.kind == "f" or v.dtype.name == "bfloat16"):
            out[name] = float(v.reshape(-1)[0])
    return dict(sorted(out.items()))


def _full(shape) -> tuple[int, ...] | None:
    """A concrete shape, or None when any dim (or the rank) is unknown."""
    return tuple(shape) if is_full(shape) else None
