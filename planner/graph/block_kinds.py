"""What a block is, read off its ops, and the label a reader sees for its type.

Why from ops and not from names: the same rules then hold for any exporter
and any architecture, known or not. A block's kind is what it mostly is
(`moe`, `attention`, `ssm`, `conv`, `mlp`, `embedding`, `other`); a layer's
mixer is what mixes its tokens (attention, or a state-space scan), which is
what tells the layer types of a hybrid model (Jamba: attention and Mamba
layers, each with a dense MLP or experts) apart in their labels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

ATTENTION_OPS = frozenset({"Softmax", "Attention", "MultiHeadAttention", "GroupQueryAttention"})
#: A selective state-space scan (Mamba, Mamba-2): a causal conv over the sequence, a step size
#: softplus(.) and the decay exp(step * A) it discretises (Gu and Dao 2023, eq. 4).
SSM_OPS = frozenset({"Conv", "Softplus", "Exp"})
KIND_TEXT = {"moe": "MoE layer", "attention": "transformer layer", "ssm": "SSM layer", "conv": "conv block",
             "mlp": "MLP layer", "embedding": "embedding", "other": "layer"}


def mixer(ops: frozenset[str] | set[str]) -> str:
    """What mixes a layer's tokens: `ssm`, `attention`, or '' (neither)."""
    if SSM_OPS <= ops:
        return "ssm"
    return "attention" if ops & ATTENTION_OPS else ""


def block_kind(ops: frozenset[str] | set[str], params: Iterable[str], param_ranks: Sequence[int]) -> str:
    """What a block mostly is, from its op types and its parameters' names and ranks."""
    # a TopK, or ArgMaxes over masked scores (sparsemixer), beside experts' weights stacked [E, ...]
    routed = "TopK" in ops or ({"ArgMax", "ScatterElements"} <= ops and max(param_ranks, default=0) >= 3)
    if routed or any("expert" in p.lower() for p in params):
        return "moe"
    mix = mixer(ops)
    if mix:
        return mix
    if "Conv" in ops:
        return "conv"
    if "Gather" in ops and 2 in param_ranks and not ops & {"MatMul", "Gemm"}:
        return "embedding"
    return "mlp" if ops & {"MatMul", "Gemm"} else "other"


@dataclass(frozen=True, slots=True)
class TypeFacts:
    """What labelling needs of one block type: its instances' names, the stack of a layer type, kind, mixer."""

    names: tuple[str, ...]
    stack: str | None
    kind: str
    mixer: str


def labels(types: Sequence[TypeFacts]) -> list[str]:
    """One label per type, distinct within a stack.

    A stack with one type: `model.layers (transformer layer)`. Several:
    `model.layers[dense]` / `model.layers[moe]`; with different mixers the
    mixer comes first (`model.layers[ssm+moe]`, `model.layers[attention+dense]`);
    types that would still share a tag are numbered (`[attention1]`, `[attention2]`).
    """
    per_stack: dict[str, list[int]] = {}
    for k, t in enumerate(types):
        if t.stack is not None:
            per_stack.setdefault(t.stack, []).append(k)
    tags: dict[int, str] = {}
    for siblings in per_stack.values():
        has_moe = any(types[s].kind == "moe" for s in siblings)
        mixed = len({types[s].mixer for s in siblings}) > 1
        for s in siblings:
            t = types[s]
            parts = [t.mixer or t.kind] if mixed else []
            if has_moe or not mixed:
                parts.append("moe" if t.kind == "moe" else ("dense" if has_moe else t.kind))
            tags[s] = "+".join(parts)
        base = {s: tags[s] for s in siblings}
        for s in siblings:
            same = [o for o in siblings if base[o] == base[s]]
            if len(same) > 1:
                tags[s] += str(same.index(s) + 1)
    out: list[str] = []
    for k, t in enumerate(types):
        if t.stack is None:
            names = t.names
            out.append(", ".join(names) if len(names) <= 2 else f"{names[0]} (+{len(names) - 1} alike)")
        elif len(per_stack[t.stack]) == 1:
            out.append(f"{t.stack or '(root)'} ({KIND_TEXT[t.kind]})")
        else:
            out.append(f"{t.stack or '(root)'}[{tags[k]}]")
    return out
