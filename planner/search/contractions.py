"""Strategies of contractions (MatMul, Gemm, Einsum) and of Gather, over the tensor axis.

A contraction is named by index letters, as an einsum equation: splitting a letter splits each operand
that carries it; a letter missing from the output leaves a partial sum (Megatron's row-parallel matmul
splits the contraction letter k, its column-parallel one the output letter n). Gather splits the table
on any dim: along the gathered axis each rank looks up the rows it holds and the others read zero
(vocab-parallel embedding), a partial sum.
"""

from __future__ import annotations

from typing import Sequence

from planner.search.tensor_layout import PARTIAL, REPLICATED, OpContext, OpStrategy, bcast_dim, norm_axis, splittable


def einsum_strategies(c: OpContext, subs: Sequence[str], out_sub: str, operands: Sequence[int]) -> list[OpStrategy]:
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
        if not splittable(sizes[ch], c.t):
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


def matmul(c: OpContext) -> list[OpStrategy]:
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
    return einsum_strategies(c, [sa, sb], bl + "mn", [0, 1])


def gemm(c: OpContext) -> list[OpStrategy]:
    at = "km" if c.node.attrs.get("transA", 0) else "mk"
    bt = "nk" if c.node.attrs.get("transB", 0) else "kn"
    subs, ops = [at, bt], [0, 1]
    res = einsum_strategies(c, subs, "mn", ops)
    if len(c.ins) > 2 and c.ins[2] is not None:  # bias C broadcast onto [m, n]
        fixed = []
        for s in res:
            o = s.outputs[0]
            if o == PARTIAL:
                continue  # a bias added on every rank would be summed t times
            cd = bcast_dim(c.ins[2], 2, o) if o >= 0 else REPLICATED
            fixed.append(OpStrategy(s.name, s.inputs[:2] + (cd,), s.outputs, s.split))
        res = fixed
    return res


def einsum(c: OpContext) -> list[OpStrategy]:
    eq = str(c.node.attrs.get("equation", "")).replace(" ", "")
    if "->" not in eq or "." in eq:
        return []
    lhs, out = eq.split("->")
    subs = lhs.split(",")
    if len(subs) != len(c.ins):
        return []
    return einsum_strategies(c, subs, out, list(range(len(subs))))


def gather(c: OpContext) -> list[OpStrategy]:
    data, idx = c.ins[0], c.ins[1]
    if data is None or idx is None:
        return []
    ax = norm_axis(int(c.node.attrs.get("axis", 0)), len(data))
    res: list[OpStrategy] = []
    for j in range(len(data)):
        if j == ax:
            if splittable(data[j], c.t):  # vocab-parallel lookup: masked rows, partial sum
                res.append(OpStrategy(f"S{j}->P", (j, REPLICATED), (PARTIAL,), True))
            continue
        if splittable(data[j], c.t):
            oj = j if j < ax else j - 1 + len(idx)
            res.append(OpStrategy(f"S{j}", (j, REPLICATED), (oj,), True))
    for i in range(len(idx)):
        if splittable(idx[i], c.t):
            res.append(OpStrategy(f"I{i}", (REPLICATED, i), (ax + i,), True))
    return res
