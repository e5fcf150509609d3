"""Attention as today's kernels run it: each attention core of the graph as one fused (flash) kernel.

An exported graph spells attention out: QK^T, scale, mask, softmax,
(dropout), AV, with GQA's repeated K/V in front. A flash kernel (Dao et al.
2022, FlashAttention; Dao 2023, FlashAttention-2) runs all of it in one
pass over tiles: the seq x seq scores never reach HBM and are not kept for
backward, which instead keeps Q, K, V, the output O and the softmax's
log-sum-exp (one fp32 per query row and head), and recomputes the scores
inside the backward kernel. Its work:

- forward: the two contractions' FLOPs, times the fraction of tiles of
  (query, key) pairs the mask leaves any pair in: a kernel skips whole
  tiles the mask removes and computes the rest whole (FlashAttention-2,
  Dao 2023, section 3.1: 128 x 128 tiles at head dim 128). For a causal
  square mask of n tiles a side that is n(n+1)/2 of n^2 tiles; for a
  sliding window of w tokens, about ceil(w/128) + 1 tiles per row;
- backward: 2.5x the forward FLOPs (five matmuls of the forward's size
  against two: S recomputed, dV, dP, dQ, dK; FlashAttention-2 section 3.2);
- HBM traffic: Q, K, V read and O written forward (K and V at their
  stored, un-repeated size: GQA kernels index the shared heads).

The cores are found from the graph (`attention_regions`), whatever the
exporter: every Softmax between two contractions of activations.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from planner.costing.activations import _PASS, softmax_span, view_roots
from planner.graph.ir import Graph
from planner.graph.walk import GraphIndex, index_graph

#: Backward FLOPs of a flash kernel over its forward FLOPs (FlashAttention-2, Dao 2023, section 3.2).
BACKWARD_FLOPS_RATIO = 2.5
#: Ops that only relabel or broadcast K and V on their way into the core (GQA's repeat_kv, the K transpose):
#: a fused kernel reads the stored tensor instead.
_FEEDING_VIEWS = frozenset({"Transpose", "Reshape", "Expand", "Unsqueeze", "Squeeze", "Identity", "Tile"})
#: Ops through which a mask is built from positions: a Trilu, or comparisons of position ranges.
_MASK_MAKERS = frozenset({"Trilu"})
_MASK_COMPARES = frozenset({"Less", "LessOrEqual", "Greater", "GreaterOrEqual"})
#: Side of the square tiles a flash kernel computes whole (FlashAttention-2 and -3 at head dim 128).
TILE = 128
#: Ops a sink logit joins and leaves the softmax through (gpt-oss: Concat before, Slice after).
_SINK_OPS = frozenset({"Concat", "Slice"})


@dataclass(frozen=True, slots=True)
class AttentionRegion:
    """One attention core: the nodes a fused kernel replaces and the work it does, at the imported batch."""

    nodes: frozenset[int]  # QK^T .. AV, plus the views and broadcasts feeding only them
    anchor: int  # the QK^T contraction: where the kernel's time is charged
    q: str
    k: str
    v: str
    out: str
    flops: float  # both contractions as the graph writes them (every pair)
    kept: float  # fraction of the (query, key) tiles computed (see `kept_fraction`)
    causal: bool
    window: int  # sliding-window width in tokens (0: none)
    io_bytes: float  # Q, K, V read and O written (stored sizes)
    lse_bytes: float  # the softmax statistics kept for backward (fp32 per query row and head)
    heads: int
    q_len: int
    kv_len: int
    head_dim: float = 128.0  # mean of the query-key and value head dims (what `head_dim_factor` reads)

    @property
    def row_keys(self) -> float:
        """Key positions a query row's computed tiles cover, on average (`kept` of the kv length)."""
        return self.kept * self.kv_len

    @property
    def forward_flops(self) -> float:
        return self.flops * self.kept

    @property
    def backward_flops(self) -> float:
        return BACKWARD_FLOPS_RATIO * self.forward_flops


def attention_regions(graph: Graph, index: GraphIndex | None = None) -> list[AttentionRegion]:
    """Every attention core of the graph, in node order (see the module docstring)."""
    index = index or index_graph(graph)
    producer, consumers = index.producer, index.consumers
    roots = view_roots(graph)
    out: list[AttentionRegion] = []
    for i, n in enumerate(graph.nodes):
        if n.op_type != "Softmax":
            continue
        region, qk, av = softmax_span(graph, index, i, _PASS | _SINK_OPS)
        if av < 0:
            continue
        causal, window = core_mask(graph, producer, {k for k in region if k not in (qk, av, i)}, region)
        q, k_in = graph.nodes[qk].inputs[0], graph.nodes[qk].inputs[1]
        v = graph.nodes[av].inputs[1]
        fed = _absorb_feeding_views(graph, producer, consumers, region, (q, k_in, v))
        region |= fed
        q_t, o_t = graph.tensors.get(q), graph.tensors.get(graph.nodes[av].outputs[0])
        scores = graph.tensors.get(graph.nodes[qk].outputs[0])
        if q_t is None or o_t is None or scores is None or not scores.shape or len(scores.shape) < 2:
            continue
        q_len, kv_len = int(scores.shape[-2]), int(scores.shape[-1])
        kept = kept_fraction(q_len, kv_len, causal, window)
        heads = int(scores.numel // max(1, q_len * kv_len * _leading(scores.shape)))
        stored = {roots.get(x, x) for x in (q, k_in, v)}
        io = sum(graph.tensors[x].nbytes for x in stored if x in graph.tensors) + o_t.nbytes
        lse = 4.0 * scores.numel / max(1, kv_len)
        flops = graph.nodes[qk].flops + graph.nodes[av].flops
        head_dim = (int(q_t.shape[-1]) + int(o_t.shape[-1])) / 2 if q_t.shape and o_t.shape else 128.0
        out.append(AttentionRegion(frozenset(region), qk, q, k_in, v, graph.nodes[av].outputs[0], flops, kept,
                                   causal, window, io, lse, heads, q_len, kv_len, head_dim))
    return out


def _leading(shape: tuple[int, ...]) -> int:
    """The batch dim of a [B, heads, q, kv] score tensor (1 for rank-3 [heads, q, kv])."""
    return int(shape[0]) if len(shape) >= 4 else 1


def _absorb_feeding_views(graph: Graph, producer, consumers, region: set[int], inputs) -> set[int]:
    """Views and broadcasts between a stored Q/K/V and the core whose output only the core reads."""
    taken: set[int] = set()
    for name in inputs:
        for _ in range(6):
            j = producer.get(name, -1)
            if j < 0 or graph.nodes[j].op_type not in _FEEDING_VIEWS:
                break
            if any(c not in region and c not in taken for c in consumers.get(name, [])):
                break
            taken.add(j)
            name = graph.nodes[j].inputs[0] if graph.nodes[j].inputs else ""
    return taken


def kept_fraction(q_len: int, kv_len: int, causal: bool, window: int, tile: int = TILE) -> float:
    """Fraction of the (query, key) tiles a flash kernel computes (see the module docstring)."""
    if q_len <= 0 or kv_len <= 0 or not (causal or window):
        return 1.0
    rows, cols = -(-q_len // tile), -(-kv_len // tile)
    offset = cols - rows  # queries are the last q_len positions (a prefix of kv_len - q_len comes before)
    band = -(-window // tile) + 1 if window else cols
    if not causal:
        return min(1.0, rows * min(band, cols) / (rows * cols))
    # sum over rows r of min(band, r + 1 + offset), in closed form (a million-token sequence has 8k rows of
    # tiles, and a sweep asks for it at every layer): the first k rows are below the band, the rest at it
    first = 1 + offset
    k = min(max(band - first, 0), rows)
    tiles = k * first + k * (k - 1) // 2 + (rows - k) * band
    return min(1.0, tiles / (rows * cols))


def core_mask(graph: Graph, producer, between: Iterable[int], region: Collection[int]) -> tuple[bool, int]:
    """(causal, window in tokens, 0: none) of an attention core, from the masks fed to the ops `between` its
    contractions (`region`: the core's nodes, where the walk back from each mask stops)."""
    found = [_mask_shape(graph, producer, x, region) for k in between for x in graph.nodes[k].inputs if x]
    return any(c for c, _ in found), max((w for _, w in found), default=0)


def _mask_shape(graph: Graph, producer, name: str, region: Collection[int]) -> tuple[bool, int]:
    """(causal, window) of a mask input of the core, from how it is built, looking up to 16 ops back: a Trilu
    or a comparison of position ranges makes it causal; a second Trilu whose diagonal offset is k, |k| > 1,
    bands it to |k| tokens (the additive -inf masks of transformers' sliding-window layers)."""
    frontier, seen, causal, window = [name], 0, False, 0
    while frontier and seen < 16:
        x = frontier.pop()
        j = producer.get(x, -1)
        if j < 0 or j in region:
            continue
        seen += 1
        node = graph.nodes[j]
        if node.op_type in _MASK_MAKERS or node.op_type in _MASK_COMPARES:
            causal = True
            k = _constant(graph, producer, node.inputs[1]) if node.op_type == "Trilu" and len(node.inputs) > 1 else None
            if k is not None and abs(k) > 1:
                window = max(window, abs(int(k)))
        frontier += [y for y in node.inputs if y]
    return causal, window


def _constant(graph: Graph, producer, name: str) -> float | None:
    """The value of a scalar Constant, if `name` is one."""
    j = producer.get(name, -1)
    if j < 0 or graph.nodes[j].op_type != "Constant":
        return None
    value = graph.nodes[j].attrs.get("value")
    values = value.get("values") if isinstance(value, dict) else None
    return float(values[0]) if values and len(values) == 1 and isinstance(values[0], (int, float)) else None


__all__ = ["BACKWARD_FLOPS_RATIO", "TILE", "AttentionRegion", "attention_regions", "core_mask", "kept_fraction"]
