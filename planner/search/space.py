"""The strategy space: for each op, the ways it can run over one tensor-parallel mesh axis.

A *layout* of a tensor over that axis is one small int: a tensor dim index
(the dim is split into equal shards, one per rank), `REPLICATED` (every rank
holds all of it) or `PARTIAL` (every rank holds a full-size partial sum that
still has to be reduced). This is the notation of JAX/MindSpore layouts and
DTensor's Shard(d)/Replicate()/Partial(), restricted to one axis: the outer
search places batch on the data axis and sequence on the context axis, so
the per-op choice that matters is what the tensor axis does.

An op *strategy* says which layout each input must arrive in, which layout
each output leaves in, and whether the op's work is split across the axis.
Megatron's column-parallel matmul is the strategy "weight split on its output
dim, input replicated, output split on its last dim"; row-parallel is "split
the contraction dim, output partial". The solver, not this module, decides
which to use; here we only enumerate what is legal for the op's shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from planner.graph.ir import Graph, Node

REPLICATED = -1
PARTIAL = -2
ANY = -3  # an input read only for its metadata (Shape, Size): any layout, no traffic

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OpStrategy:
    """One legal way to run an op over the tensor axis.

    `inputs[i]` is the layout input i must arrive in (ANY when only metadata is
    read); `outputs[j]` the layout output j leaves in; `split` is True when
    each rank does 1/t of the work.
    """

    name: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    split: bool  # False for ops on pending sums: each rank works on a full-size tensor


def layout_name(layout: int) -> str:
    return {REPLICATED: "R", PARTIAL: "P", ANY: "*"}.get(layout, f"S{layout}")


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
_METADATA = frozenset({"Shape", "Size"})
_SOURCES = frozenset({"Constant", "ConstantOfShape", "Range", "EyeLike", "RandomNormal", "RandomUniform"})


def _norm_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _splittable(size: int, t: int) -> bool:
    return size >= t and size % t == 0


def _bcast_dim(in_shape: Shape, out_rank: int, out_dim: int) -> int:
    """The input dim that out_dim reads under numpy broadcasting, or REPLICATED if broadcast."""
    i = out_dim - (out_rank - len(in_shape))
    if i < 0 or in_shape[i] == 1:
        return REPLICATED
    return i


def view_dim_map(in_shape: Shape, out_shape: Shape) -> dict[int, int]:
    """Map output dims to input dims of a reshape whose shard stays contiguous.

    A split on input dim i survives a reshape as a split on output dim j when
    both start at the same flat offset (equal products of the dims before
    them), so that each rank's contiguous block is still contiguous: e.g.
    [b, s, h] -> [b, s, heads, hd] maps dim 2 onto dim 2 (heads).
    """
    starts_in: dict[int, int] = {}
    p = 1
    for i, d in enumerate(in_shape):
        if d != 1:
            starts_in.setdefault(p, i)
        p *= d
    out: dict[int, int] = {}
    p = 1
    for j, d in enumerate(out_shape):
        if d != 1 and p in starts_in:
            out[j] = starts_in[p]
        p *= d
    return out


class _Ctx:
    """Shapes of one node's inputs and outputs, with helpers to build strategies."""

    def __init__(self, node: Node, shapes: Mapping[str, Shape | None], t: int) -> None:
        self.node = node
        self.t = t
        self.ins: list[Shape | None] = [shapes.get(n) if n else None for n in node.inputs]
        self.outs: list[Shape | None] = [shapes.get(n) if n else None for n in node.outputs]

    def rep(self) -> OpStrategy:
        ins = tuple(ANY if (self.node.op_type in _METADATA and i == 0) else REPLICATED for i in range(len(self.ins)))
        return OpStrategy("rep", ins, tuple(REPLICATED for _ in self.outs), False)

    def ok(self, shape: Shape | None, dim: int) -> bool:
        return shape is not None and 0 <= dim < len(shape) and _splittable(shape[dim], self.t)


def _elementwise(c: _Ctx) -> list[OpStrategy]:
    out = c.outs[0]
    if out is None or any(s is None for s in c.ins):
        return []
    res: list[OpStrategy] = []
    r = len(out)
    for d in range(r):
        if not _splittable(out[d], c.t):
            continue
        ins = tuple(_bcast_dim(s, r, d) for s in c.ins)  # type: ignore[arg-type]
        if all(i == REPLICATED for i in ins):
            continue
        res.append(OpStrategy(f"S{d}", ins, (d,) * len(c.outs), True))
    op = c.node.op_type
    if op in _LINEAR_ALL:
        res.append(OpStrategy("P", (PARTIAL,) * len(c.ins), (PARTIAL,) * len(c.outs), False))
    elif op in _LINEAR_FIRST and len(c.ins) == 2:
        res.append(OpStrategy("P", (PARTIAL, REPLICATED), (PARTIAL,), False))
    return res


def _axes(c: _Ctx, rank: int) -> set[int]:
    """The dims an op reduces or normalises over (cannot be split without changing the math)."""
    n, a = c.node, c.node.attrs
    op = n.op_type
    if op in ("Softmax", "LogSoftmax", "Hardmax"):
        return {_norm_axis(int(a.get("axis", -1)), rank)}
    if op in ("LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization",
              "SkipLayerNormalization", "SkipSimplifiedLayerNormalization"):
        ax = _norm_axis(int(a.get("axis", -1)), rank)
        return set(range(ax, rank))
    if op == "TopK":
        return {_norm_axis(int(a.get("axis", -1)), rank)}
    if op in ("ArgMax", "ArgMin"):
        return {_norm_axis(int(a.get("axis", 0)), rank)}
    if "axes" in a:  # reductions before opset 18
        return {_norm_axis(int(x), rank) for x in a["axes"]}
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


def _along_axes(c: _Ctx) -> list[OpStrategy]:
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
        if d in red or not _splittable(x[d], c.t):
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
            if _splittable(x[d], c.t):
                res.append(OpStrategy(f"S{d}->P", (d,) + (REPLICATED,) * (len(c.ins) - 1), (PARTIAL,), True))
    return res


def _einsum_strategies(c: _Ctx, subs: Sequence[str], out_sub: str, operands: Sequence[int]) -> list[OpStrategy]:
    """Contraction ops named by index letters: split any letter; letters missing from the output give a partial sum."""
    sizes: dict[str, int] = {}
    for s, k in zip(subs, operands):
        shape = c.ins[k]
        if shape is None or len(shape) != len(s):
            return []
        for ch, n in zip(s, shape):
            if n != 1:
                sizes[ch] = n
    res: list[OpStrategy] = []
    for ch in sorted(sizes):
        if not _splittable(sizes[ch], c.t):
            continue
        ins = [REPLICATED] * len(c.ins)
        for s, k in zip(subs, operands):
            shape = c.ins[k]
            pos = s.find(ch)
            if pos >= 0 and shape is not None and shape[pos] != 1:
                ins[k] = pos
        outl = out_sub.find(ch)
        out = outl if outl >= 0 else PARTIAL
        res.append(OpStrategy(f"{ch}", tuple(ins), (out,) + (REPLICATED,) * (len(c.outs) - 1), True))
    return res


_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _matmul(c: _Ctx) -> list[OpStrategy]:
    a, b = c.ins[0], c.ins[1]
    if a is None or b is None or not a or not b:
        return []
    ra, rb = len(a), len(b)
    if ra == 1 or rb == 1:
        return []
    batch = max(ra, rb) - 2
    bl = _LETTERS[:batch]
    sa = bl[batch - (ra - 2):] + "mk"
    sb = bl[batch - (rb - 2):] + "kn"
    return _einsum_strategies(c, [sa, sb], bl + "mn", [0, 1])


def _gemm(c: _Ctx) -> list[OpStrategy]:
    at = "km" if c.node.attrs.get("transA", 0) else "mk"
    bt = "nk" if c.node.attrs.get("transB", 0) else "kn"
    subs, ops = [at, bt], [0, 1]
    res = _einsum_strategies(c, subs, "mn", ops)
    if len(c.ins) > 2 and c.ins[2] is not None:  # bias C broadcast onto [m, n]
        fixed = []
        for s in res:
            o = s.outputs[0]
            if o == PARTIAL:
                continue  # a bias added on every rank would be summed t times
            cd = _bcast_dim(c.ins[2], 2, o) if o >= 0 else REPLICATED
            fixed.append(OpStrategy(s.name, s.inputs[:2] + (cd,), s.outputs, s.split))
        res = fixed
    return res


def _einsum(c: _Ctx) -> list[OpStrategy]:
    eq = str(c.node.attrs.get("equation", "")).replace(" ", "")
    if "->" not in eq or "." in eq:
        return []
    lhs, out = eq.split("->")
    subs = lhs.split(",")
    if len(subs) != len(c.ins):
        return []
    return _einsum_strategies(c, subs, out, list(range(len(subs))))


def _gather(c: _Ctx) -> list[OpStrategy]:
    data, idx = c.ins[0], c.ins[1]
    if data is None or idx is None:
        return []
    ax = _norm_axis(int(c.node.attrs.get("axis", 0)), len(data))
    res: list[OpStrategy] = []
    for j in range(len(data)):
        if j == ax:
            if _splittable(data[j], c.t):  # vocab-parallel lookup: masked rows, partial sum
                res.append(OpStrategy(f"S{j}->P", (j, REPLICATED), (PARTIAL,), True))
            continue
        if _splittable(data[j], c.t):
            oj = j if j < ax else j - 1 + len(idx)
            res.append(OpStrategy(f"S{j}", (j, REPLICATED), (oj,), True))
    for i in range(len(idx)):
        if _splittable(idx[i], c.t):
            res.append(OpStrategy(f"I{i}", (REPLICATED, i), (ax + i,), True))
    return res


def _passthrough(c: _Ctx, in_dims: Mapping[int, int], linear: bool) -> list[OpStrategy]:
    """Data movers: output dim j split <=> input dim in_dims[j] split; other inputs replicated."""
    x = c.ins[0]
    res: list[OpStrategy] = []
    for j in sorted(in_dims):
        i = in_dims[j]
        if x is None or not _splittable(x[i], c.t):
            continue
        res.append(OpStrategy(f"S{j}", (i,) + (REPLICATED,) * (len(c.ins) - 1), (j,) * len(c.outs), True))
    if linear:
        res.append(OpStrategy("P", (PARTIAL,) + (REPLICATED,) * (len(c.ins) - 1), (PARTIAL,) * len(c.outs), False))
    return res


def _same_size_dims(x: Shape | None, out: Shape | None) -> dict[int, int]:
    if x is None or out is None or len(x) != len(out):
        return {}
    return {d: d for d in range(len(x)) if x[d] == out[d]}


def _movers(c: _Ctx) -> list[OpStrategy] | None:
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
        dims = {d: d for d in range(len(x)) if x[d] == out[d] or (_splittable(x[d], c.t) and _splittable(out[d], c.t))}
        return _passthrough(c, dims, True)
    if op in ("Pad", "Tile", "Expand"):
        return _passthrough(c, _same_size_dims(x, out), False)
    if op == "Split":
        if x is None or any(o is None or len(o) != len(x) for o in c.outs):
            return []
        ax = _norm_axis(int(c.node.attrs.get("axis", 0)), len(x))
        dims = {d: d for d in range(len(x)) if d != ax}
        if all(_splittable(o[ax], c.t) for o in c.outs):  # type: ignore[index]
            dims[ax] = ax  # fused weights (QKV) stored part by part: each rank splits its own shard
        return _passthrough(c, dims, True)
    if op == "Concat":
        if out is None or any(s is None for s in c.ins):
            return []
        ax = _norm_axis(int(c.node.attrs.get("axis", 0)), len(out))
        res = []
        for d in range(len(out)):
            if _splittable(out[d], c.t) and (d != ax or all(_splittable(i[d], c.t) for i in c.ins)):  # type: ignore[index]
                res.append(OpStrategy(f"S{d}", (d,) * len(c.ins), (d,), True))
        res.append(OpStrategy("P", (PARTIAL,) * len(c.ins), (PARTIAL,), False))
        return res
    return None


def _by_batch_and_channel(c: _Ctx) -> list[OpStrategy]:
    """Conv, pooling and batch-style norms: split batch (dim 0) or, for conv, out/in channels."""
    x, out = c.ins[0], c.outs[0]
    if x is None or out is None:
        return []
    res = []
    if _splittable(x[0], c.t):
        res.append(OpStrategy("S0", (0,) + (REPLICATED,) * (len(c.ins) - 1), (0,) + (REPLICATED,) * (len(c.outs) - 1), True))
    op = c.node.op_type
    if op == "Conv" and len(c.ins) > 1 and c.ins[1] is not None and int(c.node.attrs.get("group", 1)) == 1:
        w = c.ins[1]
        if _splittable(w[0], c.t):  # output channels
            bias = (0,) if len(c.ins) > 2 else ()
            res.append(OpStrategy("Cout", (REPLICATED, 0) + bias, (1,), True))
        if _splittable(w[1], c.t) and len(c.ins) == 2:  # input channels: partial sums
            res.append(OpStrategy("Cin", (1, 1), (PARTIAL,), True))
    elif op in ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool") and _splittable(x[1], c.t):
        res.append(OpStrategy("S1", (1,), (1,) * len(c.outs), True))
    return res


def _attention(c: _Ctx) -> list[OpStrategy]:
    """ONNX Attention (opset 23): split batch, or heads (dim 1 of 4-D inputs, the hidden dim of 3-D ones)."""
    q = c.ins[0]
    if q is None:
        return []
    res = []
    n_in = len(c.ins)
    qkv = min(3, n_in)
    if _splittable(q[0], c.t):
        res.append(OpStrategy("batch", (0,) * qkv + (REPLICATED,) * (n_in - qkv), (0,) + (REPLICATED,) * (len(c.outs) - 1), True))
    heads = int(c.node.attrs.get("q_num_heads", 0)) or (q[1] if len(q) == 4 else 0)
    hd = 1 if len(q) == 4 else 2
    kvh = int(c.node.attrs.get("kv_num_heads", 0)) or heads
    if heads and _splittable(heads, c.t) and _splittable(kvh, c.t):
        res.append(OpStrategy("heads", (hd,) * qkv + (REPLICATED,) * (n_in - qkv), (hd,) + (REPLICATED,) * (len(c.outs) - 1), True))
    return res


def candidate_strategies(node: Node, shapes: Mapping[str, Shape | None], t: int) -> tuple[OpStrategy, ...]:
    """Every legal strategy of `node` on a tensor axis of size t; the replicated one is always first."""
    c = _Ctx(node, shapes, t)
    base = c.rep()
    if t <= 1:
        return (base,)
    op = node.op_type
    if op in _METADATA or op in _SOURCES:
        return (base,)
    if op in ("MatMul", "FusedMatMul"):
        more = _matmul(c)
    elif op == "Gemm":
        more = _gemm(c)
    elif op == "Einsum":
        more = _einsum(c)
    elif op == "Gather":
        more = _gather(c)
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
