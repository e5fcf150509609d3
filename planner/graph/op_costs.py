"""FLOPs and bytes of one ONNX op, from shapes, dtypes and attributes only.

A pure function (`node_cost`) so the planner can re-cost a node under a sharded
shape: pass the per-device shapes and get the per-device cost.

Rules, in one place:
- FLOPs are forward FLOPs; a multiply-add counts as 2 (per-element weights in
  `op_cost_tables`).
- Bytes read are the bytes of the inputs an op really touches, bytes written
  those of its outputs. Views (Reshape, Squeeze, Unsqueeze, Flatten, Identity,
  Shape, Size, Constant) move nothing: runtimes change metadata only
  (`is_shape_arithmetic` names the ops that only compute sizes and scalars,
  which frameworks run on the host). A cast to the dtype a tensor has moves nothing;
  CastLike reads only its first input. Gather,
  GatherND, GatherElements and Slice read their indices and only the data they
  write, not the whole table (an embedding lookup does not read the vocabulary).
- An op we have no rule for costs the bytes of its inputs and outputs, 0 FLOPs,
  and `known=False`; so does an op whose needed shapes are unknown.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, NamedTuple, Sequence

from planner.graph import op_cost_tables as T
from planner.graph.contractions import ShapeMissing, attention_flops, einsum_flops, matmul_flops
from planner.graph.ir import DTYPE_BYTES, Node, Tensor

Shape = tuple[int, ...] | None


class OpCost(NamedTuple):
    """Forward cost of one node at given shapes."""

    flops: float
    bytes_read: float
    bytes_written: float
    known: bool


_Missing = ShapeMissing  # a shape a FLOP rule needs is unknown (or does not fit the op)


def _numel(shape: Shape) -> int:
    if shape is None:
        raise _Missing
    return math.prod(shape)


_DTYPE_BYTES = dict(DTYPE_BYTES)  # a plain dict: this lookup runs for every tensor of every node


def _nbytes(shape: Shape, dtype: str) -> float:
    return math.prod(shape) * _DTYPE_BYTES.get(dtype, 4) if shape is not None else 0.0


class _Op:
    """The arguments of `node_cost`, with helpers that raise `_Missing` on unknown shapes."""

    __slots__ = ("op", "attrs", "ins", "in_dt", "outs", "out_dt")

    def __init__(self, op, attrs, ins, in_dt, outs, out_dt) -> None:
        self.op, self.attrs, self.ins, self.in_dt, self.outs, self.out_dt = op, attrs, ins, in_dt, outs, out_dt

    def inp(self, i: int) -> tuple[int, ...]:
        if i >= len(self.ins) or self.ins[i] is None:
            raise _Missing
        return self.ins[i]

    def has(self, i: int) -> bool:
        return i < len(self.ins) and self.ins[i] is not None

    def out(self, i: int = 0) -> tuple[int, ...]:
        if i >= len(self.outs) or self.outs[i] is None:
            raise _Missing
        return self.outs[i]

    def read(self, *idx: int) -> float:
        return sum(_nbytes(self.ins[i], self.in_dt[i]) for i in idx if i < len(self.ins))

    def read_all(self) -> float:
        return sum(_nbytes(s, d) for s, d in zip(self.ins, self.in_dt))

    def written(self) -> float:
        return sum(_nbytes(s, d) for s, d in zip(self.outs, self.out_dt))


def _attention(o: _Op) -> float:
    """ONNX Attention (opset 23): Q/K/V 4-D [B, H, S, D] or 3-D [B, S, H·D] with *_num_heads attrs."""
    q, k, v = o.inp(0), o.inp(1), o.inp(2)
    past = o.ins[4] if o.has(4) else None
    if len(q) == 4:
        b, hq, sq, d = q
        skv, dv = k[2], v[3]
    else:
        hq = int(o.attrs.get("q_num_heads", 0) or 0)
        hkv = int(o.attrs.get("kv_num_heads", 0) or 0)
        if hq <= 0 or hkv <= 0:
            raise _Missing
        b, sq, d = q[0], q[1], q[2] // hq
        skv, dv = k[1], v[2] // hkv
    total = skv + (past[2] if past is not None and len(past) == 4 else 0)
    return attention_flops(b, hq, sq, total, d, dv, o.has(3))


def _ms_attention(o: _Op) -> float:
    """com.microsoft MultiHeadAttention / GroupQueryAttention: Q [B, S, H·D], K [B, T, Hkv·D]."""
    q, k, v = o.inp(0), o.inp(1), o.inp(2)
    hq = int(o.attrs.get("num_heads", 0) or 0)
    if hq <= 0 or len(q) != 3:
        raise _Missing
    hkv = int(o.attrs.get("kv_num_heads", hq) or hq)
    b, sq, d = q[0], q[1], q[2] // hq
    if len(k) == 4:
        skv, dv = k[2], v[3]
    else:
        skv, dv = k[1], v[2] // hkv
    return attention_flops(b, hq, sq, skv, d, dv, False)


def _gemm(o: _Op) -> float:
    a, b = o.inp(0), o.inp(1)
    m = a[1] if o.attrs.get("transA", 0) else a[0]
    k = a[0] if o.attrs.get("transA", 0) else a[1]
    n = b[0] if o.attrs.get("transB", 0) else b[1]
    return 2.0 * m * n * k + (m * n if o.has(2) else 0)


def _conv(o: _Op) -> float:
    """2 · out elements · (C_in/groups · kernel volume) + bias; W is [C_out, C_in/g, k...]."""
    w = o.inp(1)
    out = _numel(o.out())
    return 2.0 * out * math.prod(w[1:]) + (out if o.has(2) else 0)


def _conv_transpose(o: _Op) -> float:
    """Each input element scatters into C_out/g · kernel outputs; W is [C_in, C_out/g, k...]."""
    w = o.inp(1)
    return 2.0 * _numel(o.inp(0)) * math.prod(w[1:]) + (_numel(o.out()) if o.has(2) else 0)


def _fused_matmul(o: _Op) -> float:
    a, b = list(o.inp(0)), list(o.inp(1))
    if o.attrs.get("transA", 0) and len(a) >= 2:
        a[-1], a[-2] = a[-2], a[-1]
    if o.attrs.get("transB", 0) and len(b) >= 2:
        b[-1], b[-2] = b[-2], b[-1]
    return matmul_flops(a, b)


def _pool(o: _Op) -> float:
    kernel = o.attrs.get("kernel_shape") or ()
    per = math.prod(kernel) if kernel else 1
    return float(_numel(o.out()) * per + (_numel(o.out()) if o.op == "AveragePool" else 0))


def _topk(o: _Op) -> float:
    k = o.out()[int(o.attrs.get("axis", -1))]
    return _numel(o.inp(0)) * max(1.0, math.log2(max(k, 2)))


def _resize(o: _Op) -> float:
    """Nearest: a copy. Linear: 2 taps per resized dim; cubic: 4 taps (each a multiply-add)."""
    mode = o.attrs.get("mode", "nearest")
    x, y = o.inp(0), o.out()
    resized = sum(1 for a, b in zip(x, y) if a != b)
    taps = {"linear": 2, "cubic": 4}.get(mode, 0)
    return 2.0 * _numel(y) * taps**resized if taps else 0.0


def _batchnorm(o: _Op) -> float:
    # Inference folds (x - mean) / sqrt(var + eps) * scale + bias into x·a + b per channel
    # (ONNX BatchNormalization spec); training also computes the batch statistics.
    per = 8 if o.attrs.get("training_mode", 0) else 2
    return float(per * _numel(o.inp(0)))


def _lrn(o: _Op) -> float:
    size = int(o.attrs.get("size", 1))
    return float((2 * size + 3) * _numel(o.inp(0)))


def _scatter(o: _Op) -> float:
    reduction = o.attrs.get("reduction", "none")
    return float(_numel(o.inp(2))) if reduction not in ("none", None) else 0.0


def _flops(o: _Op, domain: str) -> float | None:
    """FLOPs by rule; None when we have no rule for this op."""
    op = o.op
    if domain == "com.microsoft":
        if op in ("MultiHeadAttention", "GroupQueryAttention"):
            return _ms_attention(o)
        if op == "FusedMatMul":
            return _fused_matmul(o)
        if op in ("FastGelu", "BiasGelu", "Gelu", "QuickGelu"):
            bias = 1 if op in ("BiasGelu",) or (op == "FastGelu" and o.has(1)) else 0
            per = (T.GELU_TANH_FLOPS if op == "FastGelu" else T.UNARY_FLOPS["Gelu"]) + bias
            return float(per * _numel(o.out()))
        if op == "RotaryEmbedding":
            return 3.0 * _numel(o.inp(0))
        if op in T.NORM_FLOPS:
            return float(T.NORM_FLOPS[op] * _numel(o.inp(0)))
        if op in ("MatMulNBits", "MatMulInteger16", "MatMulIntegerToFloat", "QOrderedMatMul"):
            k = o.inp(0)[-1]
            n = int(o.attrs.get("N", 0)) or o.out()[-1]
            return 2.0 * (_numel(o.inp(0)) // max(k, 1)) * n * k
        return None
    if domain not in ("", "ai.onnx"):
        return None
    if op in ("MatMul", "MatMulInteger", "QLinearMatMul"):
        a, b = (o.inp(0), o.inp(3)) if op == "QLinearMatMul" else (o.inp(0), o.inp(1))
        return matmul_flops(a, b)
    if op == "Gemm":
        return _gemm(o)
    if op in ("Conv", "ConvInteger"):
        return _conv(o)
    if op == "QLinearConv":
        return 2.0 * _numel(o.out()) * math.prod(o.inp(3)[1:])
    if op == "ConvTranspose":
        return _conv_transpose(o)
    if op == "Einsum":
        return einsum_flops(str(o.attrs.get("equation", "")), [o.inp(i) for i in range(len(o.ins))])
    if op == "Attention":
        return _attention(o)
    if op == "RotaryEmbedding":
        return 3.0 * _numel(o.inp(0))
    if op == "Gelu" and o.attrs.get("approximate", "none") == "tanh":
        return float(T.GELU_TANH_FLOPS * _numel(o.out()))
    if op in T.UNARY_FLOPS:
        return float(T.UNARY_FLOPS[op] * _numel(o.out()))
    if op in T.NARY_FLOPS:
        extra = 1 if op == "Where" else max(1, len([s for s in o.ins if s is not None]) - 1) + (op == "Mean")
        return float(T.NARY_FLOPS[op] * extra * _numel(o.out()))
    if op in T.NORM_FLOPS:
        return float(T.NORM_FLOPS[op] * _numel(o.inp(0)))
    if op == "BatchNormalization":
        return _batchnorm(o)
    if op == "LRN":
        return _lrn(o)
    if op in T.REDUCE_IN_FLOPS:
        outs = _numel(o.out()) if o.op in T.REDUCE_OUT_FLOPS else 0
        return float(T.REDUCE_IN_FLOPS[op] * _numel(o.inp(0)) + T.REDUCE_OUT_FLOPS.get(op, 0) * outs)
    if op == "TopK":
        return _topk(o)
    if op in T.POOL_OPS:
        return _pool(o)
    if op in T.GLOBAL_POOL_OPS:
        return float(_numel(o.inp(0)))
    if op == "Resize":
        return _resize(o)
    if op == "NonZero":
        return float(_numel(o.inp(0)))
    if op in T.SCATTER_OPS:
        return _scatter(o)
    if op in T.VIEW_OPS or op in T.COPY_OPS or op in T.GATHER_OPS or op in T.WRITE_OPS:
        return 0.0
    return None


#: The most elements a shape vector holds (a tensor's rank): integer tensors this small are sizes, not data.
SHAPE_NUMEL = 16
_SIZE_DTYPES = frozenset({"int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8", "bool"})


def is_shape_arithmetic(op_type: str, ins: Sequence[tuple[Shape, str]], outs: Sequence[tuple[Shape, str]]) -> bool:
    """Whether an op only computes sizes or scalars: each output, and each input it reads, (shape, dtype) known and
    an integer (or boolean) tensor of at most `SHAPE_NUMEL` elements or a single number, such as the Concat of a
    Reshape's target dims or attention's 1/sqrt(d) cast to the scores' dtype. Frameworks do this on the host
    (torch's sizes and scale factors are Python numbers; ONNX Runtime folds it into shape inference): a costing
    charges it no kernel. Its FLOPs and bytes here stay what the op does."""
    def small(shape: Shape, dtype: str) -> bool:
        return shape is not None and math.prod(shape) <= (SHAPE_NUMEL if dtype in _SIZE_DTYPES else 1)

    read = ins[:1] if op_type == "CastLike" else ins  # CastLike's second input only names the dtype
    return bool(outs) and all(small(s, d) for s, d in outs) and all(small(s, d) for s, d in read if s is not None)


def _bytes(o: _Op) -> tuple[float, float]:
    """(bytes read, bytes written) under the module's data-movement rules."""
    op = o.op
    if op in T.VIEW_OPS:
        return 0.0, 0.0
    if op in ("Cast", "CastLike") and o.in_dt[:1] == o.out_dt[:1]:  # to the dtype it has: a runtime returns it
        return 0.0, 0.0
    if op == "CastLike":  # the second input only names the dtype
        return o.read(0), o.written()
    written = o.written()
    if op in T.GATHER_OPS:
        indices = o.read(*range(1, len(o.ins)))
        return indices + written, written
    if op in T.WRITE_OPS:
        return (o.read(0) if op == "OneHot" else 0.0), written
    return o.read_all(), written


def node_cost(op_type: str, domain: str, attrs: Mapping[str, Any], in_shapes: Sequence[Shape],
              in_dtypes: Sequence[str], out_shapes: Sequence[Shape], out_dtypes: Sequence[str]) -> OpCost:
    """Forward FLOPs and bytes of one op; `known` is False without a rule or a needed shape.

    Omitted optional inputs are passed as shape None (dtype any string).
    """
    o = _Op(op_type, attrs, list(in_shapes), list(in_dtypes), list(out_shapes), list(out_dtypes))
    domain = "" if domain == "ai.onnx" else domain
    read, written = _bytes(o) if domain in ("", "com.microsoft") else (o.read_all(), o.written())
    try:
        flops = _flops(o, domain)
    except (_Missing, IndexError, ValueError, TypeError, ZeroDivisionError):
        return OpCost(0.0, o.read_all(), o.written(), False)
    if flops is None:
        return OpCost(0.0, o.read_all(), o.written(), False)
    return OpCost(float(flops), float(read), float(written), True)


def read_once(cost: OpCost, names: Sequence[str], in_shapes: Sequence[Shape], in_dtypes: Sequence[str]) -> OpCost:
    """`cost` with a tensor that is several of the op's inputs read once (x * x squares what one load brings,
    as x ** 2 does), where its rule reads every input whole."""
    seen: set[str] = set()
    dup = whole = 0.0
    for name, shape, dtype in zip(names, in_shapes, in_dtypes):
        nbytes = _nbytes(shape, dtype)
        whole += nbytes
        if name and name in seen:
            dup += nbytes
        seen.add(name)
    if dup <= 0 or not math.isclose(cost.bytes_read, whole, rel_tol=1e-9):
        return cost
    return cost._replace(bytes_read=cost.bytes_read - dup)


def cost_of_node(node: Node, tensors: Mapping[str, Tensor],
                 shapes: Mapping[str, tuple[int, ...]] | None = None) -> OpCost:
    """Re-cost `node` from the graph's tensors, with `shapes` overriding some (e.g. sharded ones)."""
    shapes = shapes or {}

    def shape_of(name: str) -> Shape:
        if name in shapes:
            return shapes[name]
        t = tensors.get(name)
        return t.shape if t is not None else None

    def dtype_of(name: str) -> str:
        t = tensors.get(name)
        return t.dtype if t is not None else "float32"

    in_shapes, in_dtypes = [shape_of(n) if n else None for n in node.inputs], [dtype_of(n) for n in node.inputs]
    cost = node_cost(node.op_type, node.domain, node.attrs, in_shapes, in_dtypes,
                     [shape_of(n) if n else None for n in node.outputs], [dtype_of(n) for n in node.outputs])
    return read_once(cost, node.inputs, in_shapes, in_dtypes)
