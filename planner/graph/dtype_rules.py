"""Element types: ONNX's numbers as our names, and the dtype each op's outputs take.

Names are the lower-case `onnx.TensorProto` names, except FLOAT and DOUBLE,
which read better as float32 and float64 (and match numpy and torch).
Output dtypes follow the type constraints of the ONNX operator spec.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

#: onnx.TensorProto element types by number -> our dtype names.
DTYPE_NAMES: Mapping[int, str] = {
    0: "undefined", 1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32",
    7: "int64", 8: "string", 9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64",
    14: "complex64", 15: "complex128", 16: "bfloat16", 17: "float8e4m3fn", 18: "float8e4m3fnuz",
    19: "float8e5m2", 20: "float8e5m2fnuz", 21: "uint4", 22: "int4", 23: "float4e2m1",
    24: "float8e8m0", 25: "uint2", 26: "int2", 27: "float6e2m3", 28: "float6e3m2",
}


def dtype_name(elem_type: int) -> str:
    return DTYPE_NAMES.get(int(elem_type), "undefined")


_BOOL_OUT = frozenset({"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor",
                       "Not", "IsNaN", "IsInf"})
_INT64_OUT = frozenset({"Shape", "Size", "ArgMax", "ArgMin", "NonZero"})


def infer_dtypes(op: str, attrs: Mapping[str, Any], in_dtypes: Sequence[str | None], n_out: int) -> list[str | None]:
    """Output dtypes by the ONNX spec's type constraints; None where unknown."""
    first = next((d for d in in_dtypes if d), None)
    if op in _BOOL_OUT:
        out = "bool"
    elif op in _INT64_OUT:
        out = "int64"
    elif op == "Cast" and "to" in attrs:
        out = dtype_name(int(attrs["to"]))
    elif op == "CastLike":
        out = in_dtypes[1] if len(in_dtypes) > 1 else None
    elif op in ("ConstantOfShape", "Constant"):
        value = attrs.get("value")
        out = value.get("dtype") if isinstance(value, dict) else ("float32" if op == "ConstantOfShape" else None)
    elif op in ("MatMulInteger", "ConvInteger"):
        out = "int32"
    elif op == "Where":
        out = in_dtypes[1] if len(in_dtypes) > 1 else None
    elif op == "DequantizeLinear":
        out = in_dtypes[1] if len(in_dtypes) > 1 else None
    elif op == "QuantizeLinear":
        out = in_dtypes[2] if len(in_dtypes) > 2 and in_dtypes[2] else "uint8"
    elif "dtype" in attrs and op.startswith(("Random", "EyeLike")):
        out = dtype_name(int(attrs["dtype"]))
    else:
        out = first
    outs: list[str | None] = [out] * n_out
    if op == "TopK" and n_out > 1:
        outs[1] = "int64"
    if op == "Dropout" and n_out > 1:
        outs[1] = "bool"
    return outs
