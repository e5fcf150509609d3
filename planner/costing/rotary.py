"""Rotary embeddings whose cos and sin tables are scaled: the ops a stack may run unfused.

YaRN (Peng et al. 2023, arXiv 2309.00071, section 3.4) multiplies a rotary
embedding's cos and sin tables by an attention factor, 0.1 ln(s) + 1 for a
context extended s times unless the model names its own (transformers'
`_compute_yarn_parameters`; gpt-oss: s = 32, 1.347). A graph carries it as a
scalar product on the tables' path (`GptOssRotaryEmbedding`: `emb.cos() *
attention_scaling`); an unscaled model multiplies by 1 or not at all.

Megatron-Core runs such a RoPE as separate PyTorch ops: `apply_rotary_pos_emb`
(megatron/core/models/common/embeddings/rope_utils.py, at the 26.04
container's pin d7288711 and at d98e8a64) warns "mscale=... is not supported
by TE's fused RoPE. Using unfused implementation." whenever the factor it is
handed is not 1, and `_apply_rotary_pos_emb_bshd` then multiplies, negates,
concatenates and adds in eager ops. Megatron-Bridge's GPT-OSS bridge leaves
`yarn_mscale` and `yarn_mscale_all_dim` unset (models/gpt_oss, every release
v0.2.0 to v0.6.0), so `_yarn_get_concentration_factor` gives 0.1 ln 32 + 1
and every GPT-OSS layer takes that path for its queries and keys
(`Execution.scaled_rope_unfused`). DeepSeek-V3's YaRN sets both to 1: its
factor is 1 and its RoPE stays fused.

ASSUMPTIONS: the graph's own RoPE ops stand for Megatron's: transformers'
rotate-half form moves about 20 bytes an element of the queries and keys
forward in five kernels (its slices views), its chunked form (gpt-oss) about
18 in seven, where Megatron's chunk views, negation, concatenation, products,
sum and final concatenation move 24 in six. Megatron's recomputation of the
scaled tables on every call (six small kernels a tensor) is not charged. A
graph whose tables were folded into stored constants (a static-shape export)
shows no Cos or Sin and is not found.
"""

from __future__ import annotations

import numpy as np

from planner.graph.ir import Graph
from planner.graph.walk import GraphIndex

#: Ops a rotary table passes through unchanged in kind: casts, views, the position lookup, broadcasts, a part.
_TABLE_PATH = frozenset({"Cast", "CastLike", "Unsqueeze", "Reshape", "Squeeze", "Expand", "Tile", "Gather", "Slice",
                         "Transpose", "Identity", "Concat"})
#: Ops that take part of a head (transformers' rotate_half slices, its chunk): views in eager PyTorch.
VIEWS = frozenset({"Slice", "Split", "SplitToSequence", "SequenceAt"})
#: Ops that build the rotated half of a head from its input.
_ROTATE = VIEWS | {"Neg", "Concat"}
#: How far a factor may sit from 1 and still be read as none.
_UNIT = 1e-6


def table_scales(graph: Graph) -> dict[str, float]:
    """Each rotary table tensor (from a Cos or Sin op, through casts, views, lookups and scalar products) and the
    product of the scalar factors on its path."""
    scale: dict[str, float] = {}
    for n in graph.nodes:
        if n.op_type in ("Cos", "Sin"):
            scale.update({o: 1.0 for o in n.outputs if o})
            continue
        ins = [x for x in n.inputs if x]
        if n.op_type == "Mul" and len(ins) == 2 and ins[0] in graph.scalars:
            ins = ins[::-1]  # the scalar first: a product commutes
        if not ins or ins[0] not in scale:
            continue
        if n.op_type in _TABLE_PATH:
            value = scale[ins[0]]
        elif n.op_type in ("Mul", "Div") and len(ins) == 2 and graph.scalars.get(ins[1], 0.0) != 0.0:
            factor = graph.scalars[ins[1]]
            value = scale[ins[0]] * (factor if n.op_type == "Mul" else 1.0 / factor)
        else:
            continue
        scale.update({o: value for o in n.outputs if o})
    return scale


def scaled_rotary_nodes(graph: Graph, index: GraphIndex) -> np.ndarray:
    """Per node: part of a rotary embedding applied with scaled tables (see the module docstring): each product of
    a head tensor by such a table, the slices, negations and concatenations that rotate its other operand, and the
    sums (and the concatenation after them) that combine the products. Run eagerly, its slices (`VIEWS`) are
    views: they launch nothing and move nothing."""
    scale = table_scales(graph)
    out = np.zeros(len(graph.nodes), dtype=bool)
    for i, n in enumerate(graph.nodes):
        if n.op_type != "Mul" or len(n.inputs) != 2:
            continue
        tables = [x for x in n.inputs if x in scale]
        heads = [x for x in n.inputs if x and x not in scale]
        if len(tables) != 1 or len(heads) != 1 or heads[0] in graph.scalars or abs(scale[tables[0]] - 1.0) <= _UNIT:
            continue
        out[i] = True
        _mark_rotation(graph, index, heads[0], out)
        for j in (j for o in n.outputs if o for j in index.consumers.get(o, ())):
            if graph.nodes[j].op_type in ("Add", "Sub"):
                out[j] = True
                for k in (k for o in graph.nodes[j].outputs if o for k in index.consumers.get(o, ())):
                    if graph.nodes[k].op_type == "Concat":  # transformers' gpt-oss concatenates the two halves
                        out[k] = True
    return out


def _mark_rotation(graph: Graph, index: GraphIndex, head: str, out: np.ndarray) -> None:
    """Mark the slices, negations and concatenations that built `head` from a head tensor (rotate_half, chunk)."""
    stack = [head]
    while stack:
        p = index.producer.get(stack.pop())
        if p is None or out[p] or graph.nodes[p].op_type not in _ROTATE:
            continue
        node = graph.nodes[p]
        out[p] = True
        data = node.inputs[:1] if node.op_type in VIEWS else node.inputs
        stack.extend(x for x in data if x)


__all__ = ["VIEWS", "scaled_rotary_nodes", "table_scales"]
