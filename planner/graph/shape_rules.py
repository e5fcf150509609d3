"""Our own output-shape rules, for what ONNX shape inference leaves unknown.

ONNX inference stops at custom-domain ops and at shapes computed at run time;
these rules take over for the common ops, using partial shapes (a dim is an
int or None, a shape is a tuple or None when even the rank is unknown) and the
values of small constant tensors (`value_rules`). They follow the ONNX
operator spec; an op without a rule yields unknown outputs, never an error.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from planner.graph import op_cost_tables as T

PShape = tuple[int | None, ...] | None
Value = np.ndarray | None


def is_full(shape: PShape) -> bool:
    return shape is not None and all(d is not None for d in shape)


def merge(first: PShape, second: PShape) -> PShape:
    """Per-dim union: a known dim of `first` wins, unknowns are filled from `second`."""
    if first is None:
        return second
    if second is None or len(second) != len(first):
        return first
    return tuple(a if a is not None else b for a, b in zip(first, second))


def broadcast(*shapes: PShape) -> PShape:
    """Numpy broadcasting of partial shapes; None when any rank is unknown."""
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    out: list[int | None] = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        known = [d for d in dims if d is not None and d != 1]
        if known:
            out.append(max(known))
        elif all(d == 1 for d in dims):
            out.append(1)
        else:
            out.append(None)
    return tuple(out)


def _ints(v: Value) -> list[int] | None:
    return None if v is None else [int(x) for x in np.asarray(v).reshape(-1)]


class _Args:
    __slots__ = ("op", "attrs", "ins", "vals", "hints", "n_out")

    def __init__(self, op, attrs, ins, vals, hints, n_out) -> None:
        self.op, self.attrs, self.ins, self.vals, self.hints, self.n_out = op, attrs, ins, vals, hints, n_out

    def s(self, i: int) -> PShape:
        return self.ins[i] if i < len(self.ins) else None

    def v(self, i: int) -> Value:
        return self.vals[i] if i < len(self.vals) else None

    def axes(self, index: int) -> list[int] | None:
        from_input = _ints(self.v(index))
        if from_input is not None:
            return from_input
        axes = self.attrs.get("axes")
        return [int(a) for a in axes] if axes is not None else None


def _matmul(a: PShape, b: PShape) -> PShape:
    if a is None or b is None:
        return None
    a2, b2 = (a if len(a) > 1 else (1, *a)), (b if len(b) > 1 else (*b, 1))
    batch = broadcast(a2[:-2], b2[:-2]) or ()
    out = (*batch, a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def _reshape(x: _Args) -> PShape:
    target, src = _ints(x.v(1)), x.s(0)
    if target is None:
        hint = x.hints[0] if x.hints else None
        shape_len = x.s(1)
        if hint is None and shape_len is not None and shape_len[0] is not None:
            hint = (None,) * shape_len[0]
        return _conserve(hint, src)
    out: list[int | None] = []
    for i, d in enumerate(target):
        if d == 0 and not x.attrs.get("allowzero", 0):
            out.append(src[i] if src is not None and i < len(src) else None)
        else:
            out.append(None if d == -1 else d)
    return _conserve(tuple(out), src)


def _conserve(out: PShape, src: PShape) -> PShape:
    """A reshape keeps the element count: solve for a single unknown output dim."""
    if out is None or not is_full(src):
        return out
    unknown = [i for i, d in enumerate(out) if d is None]
    if len(unknown) != 1:
        return out
    known = math.prod(d for d in out if d is not None)
    total = math.prod(src)  # type: ignore[arg-type]
    if known == 0 or total % known:
        return out
    res = list(out)
    res[unknown[0]] = total // known
    return tuple(res)


def _slice_dims(x: _Args) -> PShape:
    src = x.s(0)
    if src is None:
        return None
    if len(x.ins) > 1:
        starts, ends, axes, steps = _ints(x.v(1)), _ints(x.v(2)), _ints(x.v(3)), _ints(x.v(4))
        if len(x.ins) > 3 and x.ins[3] is not None and axes is None:
            return (None,) * len(src)
        if len(x.ins) > 4 and x.ins[4] is not None and steps is None:
            return (None,) * len(src)
    else:
        starts, ends = list(x.attrs.get("starts", ())), list(x.attrs.get("ends", ()))
        axes, steps = (list(x.attrs["axes"]) if "axes" in x.attrs else None), None
    if starts is None or ends is None:
        return (None,) * len(src)
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    out = list(src)
    for s, e, a, st in zip(starts, ends, axes, steps):
        a %= len(src)
        out[a] = None if src[a] is None else len(range(*slice(s, e, st).indices(src[a])))
    return tuple(out)


def _spatial(x: _Args, kernel: Sequence[int], channels: int | None) -> PShape:
    """Conv / pool output: floor((in + pads - dilation·(k-1) - 1) / stride) + 1 (ONNX Conv spec)."""
    src = x.s(0)
    if src is None:
        return None
    n_sp = len(src) - 2
    strides = list(x.attrs.get("strides") or [1] * n_sp)
    dil = list(x.attrs.get("dilations") or [1] * n_sp)
    pads = list(x.attrs.get("pads") or [0] * (2 * n_sp))
    auto = x.attrs.get("auto_pad", "NOTSET")
    ceil = bool(x.attrs.get("ceil_mode", 0))
    out: list[int | None] = [src[0], channels]
    for i in range(n_sp):
        d = src[2 + i]
        if d is None or i >= len(kernel):
            out.append(None)
        elif auto in ("SAME_UPPER", "SAME_LOWER"):
            out.append(-(-d // strides[i]))
        else:
            pad = 0 if auto == "VALID" else pads[i] + pads[i + n_sp]
            span = d + pad - dil[i] * (kernel[i] - 1) - 1
            out.append((-(-span // strides[i]) if ceil else span // strides[i]) + 1)
    return tuple(out)


def _reduce(x: _Args, axes_input: int) -> PShape:
    src = x.s(0)
    if src is None:
        return None
    axes = x.axes(axes_input) if x.op not in ("ArgMax", "ArgMin") else [int(x.attrs.get("axis", 0))]
    keep = bool(x.attrs.get("keepdims", 1))
    if not axes:
        if x.attrs.get("noop_with_empty_axes", 0):
            return src
        axes = list(range(len(src)))
    axes = {a % len(src) for a in axes} if src else set()
    return tuple((1 if i in axes else d) for i, d in enumerate(src) if keep or i not in axes)


def _one(x: _Args) -> PShape:  # noqa: C901 - a flat dispatch reads better than a table of lambdas
    """Output 0 of the default-domain op `x.op`."""
    op, s0 = x.op, x.s(0)
    if op in T.UNARY_FLOPS or op in T.NORM_FLOPS or op in ("BatchNormalization", "LRN", "RotaryEmbedding",
                                                            "Identity", "Gelu", "FastGelu", "BiasGelu",
                                                            "QuickGelu", "ScatterND", "ScatterElements"):
        return s0
    if op in T.NARY_FLOPS:
        return broadcast(*[s for s in x.ins if s is not None] or [None])
    if op in ("MatMul", "MatMulInteger"):
        return _matmul(s0, x.s(1))
    if op == "Gemm":
        a, b = s0, x.s(1)
        if a is None or b is None:
            return None
        return (a[1] if x.attrs.get("transA", 0) else a[0], b[0] if x.attrs.get("transB", 0) else b[1])
    if op == "Reshape":
        return _reshape(x)
    if op == "Transpose":
        if s0 is None:
            return None
        perm = x.attrs.get("perm") or list(range(len(s0)))[::-1]
        return tuple(s0[p] for p in perm)
    if op == "Concat":
        known = [s for s in x.ins if s is not None]
        if len(known) != len(x.ins) or not known:
            return None
        axis = int(x.attrs.get("axis", 0)) % len(known[0])
        total = sum(s[axis] for s in known) if all(s[axis] is not None for s in known) else None
        return tuple(total if i == axis else merge_dim(known, i) for i in range(len(known[0])))
    if op == "Slice":
        return _slice_dims(x)
    if op == "Squeeze":
        axes = x.axes(1)
        if s0 is None:
            return None
        if axes is None:
            return None if any(d is None for d in s0) else tuple(d for d in s0 if d != 1)
        drop = {a % len(s0) for a in axes}
        return tuple(d for i, d in enumerate(s0) if i not in drop)
    if op == "Unsqueeze":
        axes = x.axes(1)
        if s0 is None or axes is None:
            return None
        rank = len(s0) + len(axes)
        out: list[int | None] = list(s0)
        for a in sorted(a % rank for a in axes):
            out.insert(a, 1)
        return tuple(out)
    if op == "Flatten":
        if s0 is None:
            return None
        axis = int(x.attrs.get("axis", 1)) % (len(s0) + 1) if s0 else 0
        head, tail = s0[:axis], s0[axis:]
        return (math.prod(head) if all(d is not None for d in head) else None,
                math.prod(tail) if all(d is not None for d in tail) else None)
    if op == "Expand":
        target = _ints(x.v(1))
        return broadcast(s0, tuple(target)) if target is not None else None
    if op == "Tile":
        reps = _ints(x.v(1))
        if s0 is None or reps is None:
            return None
        return tuple(None if d is None else d * r for d, r in zip(s0, reps))
    if op == "Gather":
        idx = x.s(1)
        if s0 is None or idx is None:
            return None
        axis = int(x.attrs.get("axis", 0)) % len(s0)
        return (*s0[:axis], *idx, *s0[axis + 1:])
    if op == "GatherElements":
        return x.s(1)
    if op == "GatherND":
        idx, b = x.s(1), int(x.attrs.get("batch_dims", 0))
        if s0 is None or idx is None or idx[-1] is None:
            return None
        return (*idx[:-1], *s0[b + idx[-1]:])
    if op == "Shape":
        if s0 is None:
            return None
        start, end = int(x.attrs.get("start", 0)), x.attrs.get("end")
        return (len(s0[start:] if end is None else s0[start:int(end)]),)
    if op == "Size":
        return ()
    if op == "ConstantOfShape":
        dims = _ints(x.v(0))
        return tuple(dims) if dims is not None else ((None,) * x.s(0)[0] if is_full(x.s(0)) else None)
    if op == "Range":
        start, limit, delta = (x.v(i) for i in range(3))
        if start is None or limit is None or delta is None:
            return (None,)
        return (max(int(math.ceil((float(limit) - float(start)) / float(delta))), 0),)
    if op in T.REDUCE_IN_FLOPS:
        return _reduce(x, 1)
    if op in ("Conv", "ConvInteger"):
        w = x.s(1)
        if w is None or any(d is None for d in w):
            return None
        kernel = list(x.attrs.get("kernel_shape") or w[2:])
        return _spatial(x, kernel, w[0])
    if op in T.POOL_OPS:
        return _spatial(x, list(x.attrs.get("kernel_shape") or ()), s0[1] if s0 else None)
    if op in T.GLOBAL_POOL_OPS:
        return None if s0 is None else (*s0[:2], *([1] * (len(s0) - 2)))
    if op == "Attention":
        v = x.s(2)
        if s0 is None or v is None:
            return None
        if len(s0) == 4:
            return (*s0[:3], v[3])
        hkv = int(x.attrs.get("kv_num_heads", 0) or 0)
        hq = int(x.attrs.get("q_num_heads", 0) or 0)
        dv = v[2] // hkv if hkv and v[2] is not None else None
        return (s0[0], s0[1], hq * dv if dv is not None and hq else None)
    if op == "Pad":
        pads = _ints(x.v(1)) if len(x.ins) > 1 else list(x.attrs.get("pads") or [])
        if s0 is None or pads is None:
            return None
        axes = _ints(x.v(3)) if len(x.ins) > 3 else None
        axes = [a % len(s0) for a in axes] if axes is not None else list(range(len(s0)))
        out = list(s0)
        for k, a in enumerate(axes):
            out[a] = None if out[a] is None else out[a] + pads[k] + pads[k + len(axes)]
        return tuple(out)
    if op == "TopK":
        k = _ints(x.v(1))
        if s0 is None:
            return None
        axis = int(x.attrs.get("axis", -1)) % len(s0)
        return tuple((k[0] if k else None) if i == axis else d for i, d in enumerate(s0))
    if op == "Where":
        return broadcast(*x.ins)
    return None


def merge_dim(shapes: Sequence[tuple[int | None, ...]], i: int) -> int | None:
    return next((s[i] for s in shapes if s[i] is not None), None)


def infer_shapes(op: str, domain: str, attrs: Mapping[str, Any], in_shapes: Sequence[PShape],
                 in_values: Sequence[Value], hints: Sequence[PShape], n_out: int) -> list[PShape]:
    """Partial output shapes by our rules (None where we have none).

    `hints` are the (partial) output shapes ONNX inference produced; rules that
    can only fix one dim (a Reshape with a -1) build on them.
    """
    x = _Args(op, attrs, list(in_shapes), list(in_values), list(hints), n_out)
    outs: list[PShape] = [None] * n_out
    if domain not in ("", "ai.onnx", "com.microsoft"):
        return outs
    try:
        outs[0] = _one(x) if n_out else None
    except (TypeError, ValueError, IndexError, ZeroDivisionError, KeyError):
        return outs
    s0 = x.s(0)
    if op == "Split" and s0 is not None:
        axis = int(attrs.get("axis", 0)) % len(s0)
        sizes = _ints(x.v(1)) or list(attrs.get("split") or [])
        if not sizes and s0[axis] is not None and n_out:
            sizes = [-(-s0[axis] // n_out)] * (n_out - 1)
            sizes.append(s0[axis] - sum(sizes))
        for k in range(min(n_out, len(sizes))):
            outs[k] = tuple(sizes[k] if i == axis else d for i, d in enumerate(s0))
    elif op in ("Dropout", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization") and n_out > 1:
        outs[-1] = s0 if op == "Dropout" or n_out == 4 else None
    elif op == "TopK" and n_out > 1:
        outs[1] = outs[0]
    return outs
