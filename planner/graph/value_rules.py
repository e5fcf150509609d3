"""Compute the values of small constant tensors: the shape arithmetic of exported graphs.

Exporters build Reshape targets, Range limits and Expand shapes at run time
from `Shape` of an activation (PyTorch's dynamo exporter does this for every
symbolic size). ONNX shape inference cannot follow that chain through every op,
so once the input shapes are bound we evaluate it ourselves, on small tensors
only (`MAX_VALUE_NUMEL`), with numpy. Semantics follow the ONNX operator spec.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

#: Tensors larger than this are never evaluated: shape arithmetic is tiny.
MAX_VALUE_NUMEL = 1024

Value = np.ndarray | None
PShape = tuple[int | None, ...] | None

_NP_DTYPES: Mapping[str, Any] = {
    "float32": np.float32, "float64": np.float64, "float16": np.float16, "int8": np.int8,
    "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16, "int32": np.int32, "uint32": np.uint32,
    "int64": np.int64, "uint64": np.uint64, "bool": np.bool_,
}


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ONNX Div on integers truncates toward zero (C semantics), unlike numpy's floor division."""
    if np.issubdtype(a.dtype, np.integer) and np.issubdtype(b.dtype, np.integer):
        return (np.trunc(a / b)).astype(np.result_type(a, b))
    return a / b


_BINARY: Mapping[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": _int_div,
    "Max": np.maximum, "Min": np.minimum, "Mod": np.fmod, "Pow": np.power,
    "Equal": np.equal, "Less": np.less, "Greater": np.greater,
    "LessOrEqual": np.less_equal, "GreaterOrEqual": np.greater_equal,
    "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor,
}
_UNARY: Mapping[str, Callable[[np.ndarray], np.ndarray]] = {
    "Neg": np.negative, "Abs": np.abs, "Not": np.logical_not, "Floor": np.floor, "Ceil": np.ceil,
    "Sqrt": np.sqrt, "Identity": lambda a: a, "Sign": np.sign, "Reciprocal": np.reciprocal,
}
_REDUCE: Mapping[str, Callable[..., np.ndarray]] = {
    "ReduceProd": np.prod, "ReduceSum": np.sum, "ReduceMax": np.max, "ReduceMin": np.min,
}


def _axes(attrs: Mapping[str, Any], values: Sequence[Value], index: int) -> list[int] | None:
    """Axes from input `index` (newer opsets) or the `axes` attribute (older ones)."""
    if index < len(values) and values[index] is not None:
        return [int(a) for a in np.asarray(values[index]).reshape(-1)]
    axes = attrs.get("axes")
    return [int(a) for a in axes] if axes is not None else None


def _slice(x: np.ndarray, attrs: Mapping[str, Any], values: Sequence[Value]) -> np.ndarray | None:
    if len(values) > 1:
        if values[1] is None or values[2] is None:
            return None
        starts, ends = values[1].reshape(-1), values[2].reshape(-1)
        axes = values[3].reshape(-1) if len(values) > 3 and values[3] is not None else range(len(starts))
        steps = values[4].reshape(-1) if len(values) > 4 and values[4] is not None else [1] * len(starts)
    else:
        starts, ends = attrs.get("starts", ()), attrs.get("ends", ())
        axes = attrs.get("axes", range(len(starts)))
        steps = [1] * len(starts)
    index: list[Any] = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        index[int(a)] = slice(int(s), int(e), int(st))
    return x[tuple(index)]


def evaluate(op: str, attrs: Mapping[str, Any], values: Sequence[Value],
             in_shapes: Sequence[PShape], out_dtype: str | None) -> Value:
    """Value of output 0 of a default-domain op, or None when not computable here."""
    if op == "Shape":
        s = in_shapes[0] if in_shapes else None
        if s is None:
            return None
        start, end = int(attrs.get("start", 0)), attrs.get("end")
        dims = s[start:] if end is None else s[start:int(end)]
        return None if any(d is None for d in dims) else np.array(dims, dtype=np.int64)
    if op == "Size":
        s = in_shapes[0] if in_shapes else None
        if s is None or any(d is None for d in s):
            return None
        return np.array(math.prod(s), dtype=np.int64)
    if op == "Constant":
        return None  # read from the attribute by the importer
    if not values or values[0] is None:
        return None
    try:
        out = _evaluate(op, attrs, values, out_dtype)
    except (ValueError, TypeError, IndexError, ZeroDivisionError, OverflowError, FloatingPointError):
        return None
    if out is None:
        return None
    out = np.asarray(out)
    return out if out.size <= MAX_VALUE_NUMEL else None


def _evaluate(op: str, attrs: Mapping[str, Any], values: Sequence[Value], out_dtype: str | None) -> Value:
    x = values[0]
    if op in _UNARY:
        return _UNARY[op](x)
    if op in _BINARY:
        if len(values) < 2 or values[1] is None:
            return None
        with np.errstate(all="ignore"):
            return _BINARY[op](x, values[1])
    if op == "Where":
        if len(values) < 3 or values[1] is None or values[2] is None:
            return None
        return np.where(x, values[1], values[2])
    if op in ("Cast", "CastLike"):
        dtype = _NP_DTYPES.get(out_dtype or "")
        return x.astype(dtype) if dtype is not None else None
    if op == "Squeeze":
        axes = _axes(attrs, values, 1)
        return np.squeeze(x, axis=tuple(axes)) if axes else np.squeeze(x)
    if op == "Unsqueeze":
        axes = _axes(attrs, values, 1)
        if axes is None:
            return None
        rank = x.ndim + len(axes)
        return x.reshape(_unsqueezed(x.shape, [a % rank for a in axes]))
    if op == "Concat":
        if any(v is None for v in values):
            return None
        return np.concatenate([np.atleast_1d(v) for v in values], axis=int(attrs.get("axis", 0)))
    if op == "Gather":
        if len(values) < 2 or values[1] is None:
            return None
        return np.take(x, values[1].astype(np.int64), axis=int(attrs.get("axis", 0)))
    if op == "Slice":
        return _slice(x, attrs, values)
    if op == "Reshape":
        if len(values) < 2 or values[1] is None:
            return None
        target = [int(d) for d in values[1].reshape(-1)]
        if not attrs.get("allowzero", 0):
            target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
        return x.reshape(target)
    if op == "Flatten":
        axis = int(attrs.get("axis", 1)) % max(x.ndim, 1) if x.ndim else 0
        return x.reshape(math.prod(x.shape[:axis]), -1)
    if op == "Transpose":
        perm = attrs.get("perm")
        return np.transpose(x, perm)
    if op == "Expand":
        if len(values) < 2 or values[1] is None:
            return None
        shape = np.broadcast_shapes(x.shape, tuple(int(d) for d in values[1].reshape(-1)))
        return np.broadcast_to(x, shape).copy() if math.prod(shape) <= MAX_VALUE_NUMEL else None
    if op == "Range":
        if len(values) < 3 or any(v is None or v.size != 1 for v in values[:3]):
            return None
        start, limit, delta = (v.reshape(()) for v in values[:3])
        n = max(int(math.ceil((float(limit) - float(start)) / float(delta))), 0)
        return start + delta * np.arange(n, dtype=np.result_type(start, delta)) if n <= MAX_VALUE_NUMEL else None
    if op == "ConstantOfShape":
        shape = tuple(int(d) for d in x.reshape(-1))
        if math.prod(shape) > MAX_VALUE_NUMEL:
            return None
        fill = attrs.get("value")
        fill_value = fill["values"][0] if isinstance(fill, dict) and fill.get("values") else 0
        return np.full(shape, fill_value, dtype=_NP_DTYPES.get(out_dtype or "float32", np.float32))
    if op in _REDUCE:
        axes = _axes(attrs, values, 1)
        keep = bool(attrs.get("keepdims", 1))
        if axes is None or not axes:
            if attrs.get("noop_with_empty_axes", 0):
                return x
            return _REDUCE[op](x, keepdims=keep)
        return _REDUCE[op](x, axis=tuple(axes), keepdims=keep)
    if op == "Tile":
        if len(values) < 2 or values[1] is None:
            return None
        return np.tile(x, [int(r) for r in values[1].reshape(-1)])
    if op == "OneHot":
        return _one_hot(x, attrs, values)
    return None


def _one_hot(indices: np.ndarray, attrs: Mapping[str, Any], values: Sequence[Value]) -> Value:
    """ONNX OneHot: `on` where an index (negative ones counted from `depth`) equals the position along the new
    axis, else `off` (values = [off, on]); torchscript's exported MoE layers build their experts' repeat counts
    from one over constants."""
    if len(values) < 3 or values[1] is None or values[2] is None or values[2].size != 2:
        return None
    depth = int(values[1].reshape(-1)[0])
    if depth < 1 or indices.size * depth > MAX_VALUE_NUMEL:
        return None
    idx = indices.astype(np.int64)
    idx = np.where(idx < 0, idx + depth, idx)
    hot = idx[..., None] == np.arange(depth)
    off, on = values[2].reshape(-1)
    out = np.where(hot, on, off)
    return np.moveaxis(out, -1, int(attrs.get("axis", -1)) % out.ndim)


def _unsqueezed(shape: tuple[int, ...], axes: list[int]) -> list[int]:
    dims = list(shape)
    for a in sorted(axes):
        dims.insert(a, 1)
    return dims
