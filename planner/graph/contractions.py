"""FLOPs of contractions from their operands' shapes: numpy-style MatMul, Einsum, and an attention core.

The rules `planner.graph.op_costs` applies to MatMul, Gemm-like fused matmuls, Einsum and the attention
ops of the ONNX and Microsoft domains: a multiply-add counts as 2 FLOPs, a product or a sum as 1.
"""

from __future__ import annotations

import math
from typing import Sequence

from planner.graph.op_cost_tables import NORM_FLOPS

#: FLOPs per element of a softmax (max, subtract, exp, sum, divide), as the norm table counts it.
SOFTMAX_FLOPS = NORM_FLOPS["Softmax"]


class ShapeMissing(ValueError):
    """A shape a FLOP rule needs is unknown (or does not fit the op)."""


def matmul_flops(a: Sequence[int], b: Sequence[int]) -> float:
    """2·batch·M·N·K for numpy-style matmul with broadcast batch dims (ONNX MatMul spec)."""
    a2 = (1, *a) if len(a) == 1 else tuple(a)
    b2 = (*b, 1) if len(b) == 1 else tuple(b)
    m, k, n = a2[-2], a2[-1], b2[-1]
    ba, bb = a2[:-2], b2[:-2]
    rank = max(len(ba), len(bb))
    ba, bb = (1,) * (rank - len(ba)) + ba, (1,) * (rank - len(bb)) + bb
    batch = math.prod(max(x, y) for x, y in zip(ba, bb))
    return 2.0 * batch * m * n * k


def einsum_flops(equation: str, shapes: Sequence[Sequence[int]]) -> float:
    """FLOPs of an Einsum evaluated left to right, pairwise.

    Each pairwise step that sums an index out is a contraction: 2 FLOPs per
    point of the joint index space (a multiply-add); a step with nothing to sum
    is 1 FLOP per point (a product). A single operand that sums indices costs
    one add per input element; a pure transpose costs nothing. For two operands
    this is exactly the MatMul count: 'bij,bjk->bik' gives 2·b·i·j·k.
    """
    eq = equation.replace(" ", "")
    lhs, _, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ShapeMissing
    sizes: dict[str, int] = {}
    subs: list[str] = []
    for term, shape in zip(terms, shapes):
        if "..." in term:  # broadcast dims, right-aligned: private letters counted from the right
            n_ell = len(shape) - (len(term) - 3)
            term = term.replace("...", "".join(chr(0x100 + i) for i in reversed(range(max(n_ell, 0)))))
        if len(term) != len(shape):
            raise ShapeMissing
        for ch, d in zip(term, shape):
            sizes[ch] = max(sizes.get(ch, 1), d)
        subs.append(term)
    ellipsis = {ch for ch in sizes if ord(ch) >= 0x100}
    if "->" not in eq:  # implicit output: the indices seen once, and the broadcast dims
        counts: dict[str, int] = {}
        for s in subs:
            for ch in s:
                counts[ch] = counts.get(ch, 0) + 1
        out = {ch for ch, c in counts.items() if c == 1} | ellipsis
    else:
        out = set(rhs.replace("...", "")) | (ellipsis if "..." in rhs else set())
    if len(subs) == 1:
        summed = set(subs[0]) - out
        return float(math.prod(sizes[c] for c in subs[0])) if summed else 0.0
    flops = 0.0
    cur = set(subs[0])
    for k in range(1, len(subs)):
        joint = cur | set(subs[k])
        later = set().union(*map(set, subs[k + 1:])) if k + 1 < len(subs) else set()
        keep = joint & (out | later)
        points = math.prod(sizes[c] for c in joint)
        flops += (2.0 if joint - keep else 1.0) * points
        cur = keep
    return flops


def attention_flops(batch: int, q_heads: int, q_len: int, kv_len: int, qk_dim: int, v_dim: int,
                     masked: bool) -> float:
    """QK^T and AV matmuls, scaling, mask add and softmax (Vaswani et al. 2017, eq. 1).

    Counted over the full q_len × kv_len score matrix even when causal: ONNX
    graphs do not say whether the kernel skips the masked half (FlashAttention
    does, a naive kernel does not), so this is the dense upper bound.
    """
    scores = batch * q_heads * q_len * kv_len
    return 2.0 * scores * qk_dim + 2.0 * scores * v_dim + scores * (1 + SOFTMAX_FLOPS + masked)


__all__ = ["SOFTMAX_FLOPS", "ShapeMissing", "attention_flops", "einsum_flops", "matmul_flops"]
