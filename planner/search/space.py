"""The strategy space: for each op, the ways it can run over one tensor-parallel mesh axis.

The outer search places batch on the data axis and sequence on the context axis, so the per-op choice
that matters is what the tensor axis does: which layout (`tensor_layout.py`: a split dim, replicated, or
a pending sum) each input must arrive in and each output leaves in. Megatron's column-parallel matmul is
the strategy "weight split on its output dim, input replicated, output split on its last dim";
row-parallel is "split the contraction dim, output partial". The solver, not this module, decides which
to use; here we only enumerate what is legal for the op's shapes: elementwise ops, reductions and norms,
data movers, convolutions and attention here, contractions and Gather in `contractions.py`.
"""

from __future__ import annotations

from typing import Mapping

from planner.graph.ir import Graph, Node
from planner.search.contractions import einsum, gather, gemm, matmul
from planner.search.tensor_layout import (ANY, METADATA, PARTIAL, REPLICATED, OpContext, OpStrategy, Shape,
                                          bcast_dim, layout_name, norm_axis, splittable, view_dim_map)

__all__ = ["ANY", "PARTIAL", "REPLICATED", "ELEMENTWISE", "OpStrategy", "Shape", "candidate_strategies",
           "graph_shapes", "layout_name", "view_dim_map"]

# Ops that act on each element independently (with numpy broadcasting).
ELEMENTWISE = frozenset(
    """Add Sub Mul Div Pow Sqrt Reciprocal Exp Log Erf Tanh Sigmoid Relu Gelu LeakyRelu Neg Abs
    Cast CastLike Where Max Min Mean Sum Clip Equal Greater Less GreaterOrEqual LessOrEqual And Or
    Not Xor IsNaN IsInf Sign Floor Ceil Round Mod Sin Cos Softplus Softsign HardSigmoid HardSwish
    Mish Elu Selu Celu ThresholdedRelu PRelu Identity Dropout BitwiseAnd BitwiseOr BitwiseNot
    QuickGelu FastGelu BiasGelu Swish Silu""".split()
)
# Elementwise ops through which a pending sum may pass unreduced (they are linear).
_LINEAR_ALL = frozenset({"Add", "Sub", "Sum", "Neg", "Identity", "Cast", "CastLike"})
_LINEAR_FIRST = frozenset({"Mul", "Div"})  # linear in the first input when the second is replicated
# Ops whose output carries the same dims as input 0, with some dims (their "axes") not splittable.
_REDUCING = frozenset(
    {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
     "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin"}
)
_LINEAR_REDUCE = frozenset({"ReduceSum", "ReduceMean"})
_VIEW = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
_SOURCES = frozenset({"Constant", "ConstantOfShape", "Range", "EyeLike", "RandomNormal", "RandomUniform"})


def _elementwise(c: OpContext) -> list[OpStrategy]:
    out = c.outs[0]
    if out is None or any(s is None for s in c.ins):
        return []
    res: list[OpStrategy] = []
    r = len(out)
    for d in range(r):
        if not splittable(out[d], c.t):
            continue
        ins = tuple(bcast_dim(s, r, d) for s in c.ins)  # type: ignore[arg-type]
        if all(i == REPLICATED for i in ins):
            continue
        res.append(OpStrategy(f"S{d}", ins, (d,) * len(c.outs), True))
    op = c.node.op_type
    if op in _LINEAR_ALL:
        res.append(OpStrategy("P", (PARTIAL,) * len(c.ins), (PARTIAL,) * len(c.outs), False))
    elif op in _LINEAR_FIRST and len(c.ins) == 2:
        res.append(OpStrategy("P", (PARTIAL, REPLICATED), (PARTIAL,), False))
    return res


def _axes(c: OpContext, rank: int) -> set[int]:
    """The dims an op reduces or normalises over (cannot be split without changing the math)."""
    n, a = c.node, c.node.attrs
    op = n.op_type
    if op in ("Softmax", "LogSoftmax", "Hardmax"):
        return {norm_axis(int(a.get("axis", -1)), rank)}
    if op in ("LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization",
              "SkipLayerNormalization", "SkipSimplifiedLayerNormalization"):
        ax = norm_axis(int(a.get("axis", -1)), rank)
        return set(range(ax, rank))
    if op == "TopK":
        return {norm_axis(int(a.get("axis", -1)), rank)}
    if op in ("ArgMax", "ArgMin"):
        return {norm_axis(int(a.get("axis", 0)), rank)}
    if "axes" in a:  # reductions before opset 18
        return {norm_axis(int(x), rank) for x in a["axes"]}
    return _reduced_by_shape(c.ins[0], c.outs[0], bool(a.get("keepdims", 1)))


def _reduced_by_shape(x: Shape | None, out: Shape | None, keepdims: bool) -> set[int]:
    """Reduced dims read off the shapes (opset 18 passes axes as an input tensor)."""
    if x is None or out is None:
        return set(range(len(x))) if x is not None else set()
    if keepdims and len(out) == len(x):
        return {d for d in range(len(x)) if out[d] == 1 and x[d] != 1}
    red, j = set(), 0
    for i, n in enumerate(x):
        if j < len(out) and out[j] == n:
            j += 1
        else:
            red.add(i)
    return red


def _along_axes(c: OpContext) -> list[OpStrategy]:
    """Softmax, norms, reductions, TopK: split any dim they do not reduce over."""
    x = c.ins[0]
    if x is None:
        return []
    rank = len(x)
    red = _axes(c, rank)
    op = c.node.op_type
    keep = bool(c.node.attrs.get("keepdims", 1))
    res: list[OpStrategy] = []
    for d in range(rank):
        if d in red or not splittable(x[d], c.t):
            continue
        ins = [d] + [REPLICATED] * (len(c.ins) - 1)
        if op in ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization") and len(c.ins) > 1:
            ins[1] = d
        od = d
        if op in _REDUCING and not keep:
            od = d - sum(1 for a in red if a < d)
        outs = []
        for o in c.outs:
            outs.append(od if (o is not None and len(o) > od and o[od] == x[d]) else REPLICATED)
        res.append(OpStrategy(f"S{d}", tuple(ins), tuple(outs), True))
    if op in _LINEAR_REDUCE:
        for d in sorted(red):
            if splittable(x[d], c.t):
                res.append(OpStrategy(f"S{d}->P", (d,) + (REPLICATED,) * (len(c.ins) - 1), (PARTIAL,), True))
    return res


def _passthrough(c: OpContext, in_dims: Mapping[int, int], linear: bool) -> list[OpStrategy]:
    """Data movers: output dim j split <=> input dim in_dims[j] split; other inputs replicated."""
    x = c.ins[0]
    res: list[OpStrategy] = []
    for j in sorted(in_dims):
        i = in_dims[j]
        if x is None or not splittable(x[i], c.t):
            continue
        res.append(OpStrategy(f"S{j}", (i,) + (REPLICATED,) * (len(c.ins) - 1), (j,) * len(c.outs), True))
    if linear:
        res.append(OpStrategy("P", (PARTIAL,) + (REPLICATED,) * (len(c.ins) - 1), (PARTIAL,) * len(c.outs), False))
    return res


def _same_size_dims(x: Shape | None, out: Shape | None) -> dict[int, int]:
    if x is None or out is None or len(x) != len(out):
        return {}
    return {d: d for d in range(len(x)) if x[d] == out[d]}


def _movers(c: OpContext) -> list[OpStrategy] | None:
    op, x, out = c.node.op_type, c.ins[0] if c.ins else None, c.outs[0] if c.outs else None
    if op == "Transpose":
        if x is None:
            return []
        perm = c.node.attrs.get("perm") or list(reversed(range(len(x))))
        return _passthrough(c, {j: int(p) for j, p in enumerate(perm)}, True)
    if op in _VIEW:
        if x is None or out is None:
            return []
        return _passthrough(c, view_dim_map(x, out), True)
    if op == "Slice":  # a slice of a part-wise sharded fused tensor stays sharded if both sides divide
        if x is None or out is None or len(x) != len(out):
            return []
        dims = {d: d for d in range(len(x)) if x[d] == out[d] or (splittable(x[d], c.t) and splittable(out[d], c.t))}
        return _passthrough(c, dims, True)
    if op in ("Pad", "Tile", "Expand"):
        return _passthrough(c, _same_size_dims(x, out), False)
    if op == "Split":
        if x is None or any(o is None or len(o) != len(x) for o in c.outs):
            return []
        ax = norm_axis(int(c.node.attrs.get("axis", 0)), len(x))
        dims = {d: d for d in range(len(x)) if d != ax}
        if all(splittable(o[ax], c.t) for o in c.outs):  # type: ignore[index]
            dims[ax] = ax  # fused weights (QKV) stored part by part: each rank splits its own shard
        return _passthrough(c, dims, True)
    if op == "Concat":
        if out is None or any(s is None for s in c.ins):
            return []
        ax = norm_axis(int(c.node.attrs.get("axis", 0)), len(out))
        res = []
        for d in range(len(out)):
            if splittable(out[d], c.t) and (d != ax or all(splittable(i[d], c.t) for i in c.ins)):  # type: ignore[index]
                res.append(OpStrategy(f"S{d}", (d,) * len(c.ins), (d,), True))
        res.append(OpStrategy("P", (PARTIAL,) * len(c.ins), (PARTIAL,), False))
        return res
    return None


def _by_batch_and_channel(c: OpContext) -> list[OpStrategy]:
    """Conv, pooling and batch-style norms: split batch (dim 0) or, for conv, out/in channels."""
    x, out = c.ins[0], c.outs[0]
    if x is None or out is None:
        return []
    res = []
    if splittable(x[0], c.t):
        res.append(OpStrategy("S0", (0,) + (REPLICATED,) * (len(c.ins) - 1), (0,) + (REPLICATED,) * (len(c.outs) - 1), True))
    op = c.node.op_type
    if op == "Conv" and len(c.ins) > 1 and c.ins[1] is not None and int(c.node.attrs.get("group", 1)) == 1:
        w = c.ins[1]
        if splittable(w[0], c.t):  # output channels
            bias = (0,) if len(c.ins) > 2 else ()
            res.append(OpStrategy("Cout", (REPLICATED, 0) + bias, (1,), True))
        if splittable(w[1], c.t) and len(c.ins) == 2:  # input channels: partial sums
            res.append(OpStrategy("Cin", (1, 1), (PARTIAL,), True))
    elif op in ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool") and splittable(x[1], c.t):
        res.append(OpStrategy("S1", (1,), (1,) * len(c.outs), True))
    return res


def _attention(c: OpContext) -> list[OpStrategy]:
    """ONNX Attention (opset 23): split batch, or heads (dim 1 of 4-D inputs, the hidden dim of 3-D ones)."""
    q = c.ins[0]
    if q is None:
        return []
    res = []
    n_in = len(c.ins)
    qkv = min(3, n_in)
    if splittable(q[0], c.t):
        res.append(OpStrategy("batch", (0,) * qkv + (REPLICATED,) * (n_in - qkv), (0,) + (REPLICATED,) * (len(c.outs) - 1), True))
    heads = int(c.node.attrs.get("q_num_heads", 0)) or (q[1] if len(q) == 4 else 0)
    hd = 1 if len(q) == 4 else 2
    kvh = int(c.node.attrs.get("kv_num_heads", 0)) or heads
    if heads and splittable(heads, c.t) and splittable(kvh, c.t):
        res.append(OpStrategy("heads", (hd,) * qkv + (REPLICATED,) * (n_in - qkv), (hd,) + (REPLICATED,) * (len(c.outs) - 1), True))
    return res


def candidate_strategies(node: Node, shapes: Mapping[str, Shape | None], t: int) -> tuple[OpStrategy, ...]:
    """Every legal strategy of `node` on a tensor axis of size t; the replicated one is always first."""
    c = OpContext(node, shapes, t)
    base = c.rep()
    if t <= 1:
        return (base,)
    op = node.op_type
    if op in METADATA or op in _SOURCES:
        return (base,)
    if op in ("MatMul", "FusedMatMul"):
        more = matmul(c)
    elif op == "Gemm":
        more = gemm(c)
    elif op == "Einsum":
        more = einsum(c)
    elif op == "Gather":
        more = gather(c)
    elif op == "Attention":
        more = _attention(c)
    elif op in ELEMENTWISE:
        more = _elementwise(c)
    elif op in ("Softmax", "LogSoftmax", "Hardmax", "LayerNormalization", "RMSNormalization",
                "SimplifiedLayerNormalization", "SkipLayerNormalization",
                "SkipSimplifiedLayerNormalization", "TopK") or op in _REDUCING:
        more = _along_axes(c)
    elif op in ("Conv", "BatchNormalization", "InstanceNormalization", "MaxPool", "AveragePool",
                "GlobalAveragePool", "GlobalMaxPool", "LRN"):
        more = _by_batch_and_channel(c)
    else:
        moved = _movers(c)
        more = moved if moved is not None else []
    seen = {base.inputs + base.outputs}
    out = [base]
    for s in more:
        key = s.inputs + s.outputs
        if key not in seen:
            seen.add(key)
            out.append(s)
    return tuple(out)


def graph_shapes(graph: Graph) -> dict[str, Shape | None]:
    return {name: t.shape for name, t in graph.tensors.items()}
