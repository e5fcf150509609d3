"""Concrete shapes and dtypes for every tensor of a graph whose symbolic dims are bound.

Two passes. ONNX shape inference (with data propagation) first: it knows
every standard op exactly. Then our own pass in topological order
(`shape_rules`, `value_rules`) fills what it left unknown: ops of custom
domains, and shapes computed at run time from `Shape` of an activation,
which is how the PyTorch exporter writes every symbolic size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from planner.graph import onnx_dims
from planner.graph.dtype_rules import dtype_name, infer_dtypes
from planner.graph.shape_rules import PShape, infer_shapes, is_full, merge
from planner.graph.value_rules import MAX_VALUE_NUMEL, evaluate

_VALUE_OPS = frozenset(
    {"Shape", "Size", "Gather", "Squeeze", "Unsqueeze", "Concat", "Slice", "Cast", "CastLike", "Reshape",
     "Flatten", "Identity", "Add", "Sub", "Mul", "Div", "Mod", "Neg", "Abs", "Max", "Min", "Equal", "Less",
     "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor", "Where", "Range", "Expand",
     "ConstantOfShape", "Floor", "Ceil", "Sqrt", "Sign", "ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin",
     "Tile", "Transpose", "Reciprocal", "Pow", "OneHot"}
)

_RAW_DTYPES = {1: np.dtype("<f4"), 6: np.dtype("<i4"), 7: np.dtype("<i8"), 11: np.dtype("<f8"), 9: np.dtype("bool")}
_ELEM_TYPES = {dtype_name(v): v for v in onnx.TensorProto.DataType.values() if v}


@dataclass(slots=True)
class Shapes:
    """What we know of each tensor: partial shape, dtype, and value when small and constant."""

    shape: dict[str, PShape] = field(default_factory=dict)
    dtype: dict[str, str] = field(default_factory=dict)
    value: dict[str, np.ndarray] = field(default_factory=dict)


def _vi_shape(vi: onnx.ValueInfoProto, bound: Mapping[str, int]) -> tuple[PShape, str | None]:
    tt = vi.type.tensor_type
    dtype = dtype_name(tt.elem_type) if tt.elem_type else None
    if not tt.HasField("shape"):
        return None, dtype
    dims: list[int | None] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            dims.append(onnx_dims.evaluate(d.dim_param, bound))
        else:
            dims.append(None)
    return tuple(dims), dtype


def tensor_value(t: onnx.TensorProto) -> np.ndarray | None:
    """Value of a small tensor with inline data, else None (never touches external data)."""
    if t.data_location == onnx.TensorProto.EXTERNAL:
        return None
    numel = 1
    for d in t.dims:
        numel *= d
    if numel > MAX_VALUE_NUMEL:
        return None
    fast = _RAW_DTYPES.get(t.data_type)
    if fast is not None and t.raw_data and len(t.raw_data) == numel * fast.itemsize:
        return np.frombuffer(t.raw_data, dtype=fast).reshape(tuple(t.dims))  # the common, little-endian case
    try:
        return numpy_helper.to_array(t)
    except (ValueError, TypeError, KeyError):
        return None


def collect(graph: onnx.GraphProto, bound: Mapping[str, int]) -> Shapes:
    """Shapes, dtypes and small values declared by the (inferred) graph itself."""
    known = Shapes()
    for vi in (*graph.value_info, *graph.input, *graph.output):
        shape, dtype = _vi_shape(vi, bound)
        known.shape[vi.name] = merge(known.shape.get(vi.name), shape)
        if dtype:
            known.dtype[vi.name] = dtype
    for sp in graph.sparse_initializer:
        known.shape[sp.values.name] = tuple(int(d) for d in sp.dims)
        known.dtype[sp.values.name] = dtype_name(sp.values.data_type)
    for t in graph.initializer:
        known.shape[t.name] = tuple(int(d) for d in t.dims)
        known.dtype[t.name] = dtype_name(t.data_type)
        if t.data_type in (6, 7, 9, 2, 3, 1, 10, 11):
            v = tensor_value(t)
            if v is not None:
                known.value[t.name] = v
    return known


def propagate(nodes: list[onnx.NodeProto], known: Shapes, attrs_of: Callable[[onnx.NodeProto], Mapping[str, Any]]
              ) -> None:
    """Our own pass, in topological order, filling `known` in place."""
    shape, dtype, value = known.shape, known.dtype, known.value
    for n in nodes:
        op, outs = n.op_type, n.output
        default = n.domain in ("", "ai.onnx")
        if op == "Constant" and default:
            _constant(n, known)
            continue
        hints = [shape.get(o) for o in outs]
        ins = n.input
        need_values = default and op in _VALUE_OPS and (op in ("Shape", "Size") or (ins and ins[0] in value))
        if all(is_full(h) for h in hints) and all(o in dtype for o in outs) and not need_values:
            continue
        attrs = attrs_of(n)
        in_shapes = [shape.get(i) if i else None for i in ins]
        in_values = [value.get(i) if i else None for i in ins]
        if any(o not in dtype for o in outs):
            for o, d in zip(outs, infer_dtypes(op, attrs, [dtype.get(i) for i in ins], len(outs))):
                if d and o not in dtype:
                    dtype[o] = d
        if not all(is_full(h) for h in hints):
            mine = infer_shapes(op, n.domain, attrs, in_shapes, in_values, hints, len(outs))
            for o, h, m in zip(outs, hints, mine):
                shape[o] = merge(h, m)
        if need_values and outs:
            v = evaluate(op, attrs, in_values, in_shapes, dtype.get(outs[0]))
            if v is not None:
                value[outs[0]] = v
                if not is_full(shape.get(outs[0])):
                    shape[outs[0]] = tuple(int(d) for d in v.shape)


def _constant(n: onnx.NodeProto, known: Shapes) -> None:
    """A Constant's output: shape, dtype and (small) value from its attribute."""
    out = n.output[0]
    for a in n.attribute:
        if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
            known.shape[out] = tuple(int(d) for d in a.t.dims)
            known.dtype[out] = dtype_name(a.t.data_type)
            v = tensor_value(a.t)
            if v is not None:
                known.value[out] = v
        elif a.name in ("value_int", "value_float"):
            known.shape[out] = ()
            known.dtype[out] = "int64" if a.name == "value_int" else "float32"
            known.value[out] = np.array(a.i if a.name == "value_int" else a.f,
                                        dtype=np.int64 if a.name == "value_int" else np.float32)
        elif a.name in ("value_ints", "value_floats"):
            data = list(a.ints) if a.name == "value_ints" else list(a.floats)
            known.shape[out] = (len(data),)
            known.dtype[out] = "int64" if a.name == "value_ints" else "float32"
            known.value[out] = np.array(data, dtype=np.int64 if a.name == "value_ints" else np.float32)


def write_back(graph: onnx.GraphProto, known: Shapes, names: list[str]) -> int:
    """Record our shapes for `names` as value_info, so a second ONNX inference can build on them."""
    by_name = {vi.name: vi for vi in graph.value_info}
    written = 0
    for name in names:
        s = known.shape.get(name)
        if not is_full(s) or name not in known.dtype:
            continue
        elem = _ELEM_TYPES.get(known.dtype[name])
        if elem is None:
            continue
        vi = by_name.get(name)
        if vi is None:
            vi = graph.value_info.add()
            vi.name = name
        new = onnx.helper.make_tensor_value_info(name, elem, list(s))
        vi.CopyFrom(new)
        written += 1
    return written
