"""What an attention layer caches per token, found from the graph's structure (no model names).

From each attention core (the QK^T and AV contractions around a softmax) we
walk back from K and V through re-layout and position ops to the narrowest
tensors they are computed from per token. Two stopping rules:

- a cache written in place (ScatterND of this step's entries into a static
  cache) is walked through its updates;
- a projection (a MatMul with a weight) stops the walk at its output, the
  plain K/V cache of MHA/GQA/MQA (Vaswani 2017; Ainslie 2023); a split of a
  fused QKV projection stops at its K or V part;
- a projection that *widens* (its input narrower than its output) and is
  followed by re-layout only (no rotary embedding, no non-linearity) can be
  absorbed into the query and output projections at decode time, so what is
  cached is its input: multi-head latent attention's compressed latent
  (DeepSeek-V2, Liu et al. 2024, section 2.1.2, "absorb W^UK into W^Q and W^UV
  into W^O"). The decoupled RoPE key takes the first rule and joins it.

The cached widths also give the decode-time attention FLOPs per (query,
cached token) pair: 2 x heads x (key width + value width), where a latent's
width is the whole latent (every head reads it), and the number of ways
tensor parallelism can split the cache (the KV heads; 1 for a latent).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.costing.attention import AttentionRegion
from planner.graph.ir import Graph
from planner.graph.walk import GraphIndex, is_weight_matmul, per_token
from planner.costing.node_work import FLOAT_DTYPES

#: Ops that only move or re-lay out values, or apply position-wise elementwise maps (rotary embedding):
#: the cache can be taken before them at the same width.
_RELAYOUT = frozenset({"Reshape", "Transpose", "Unsqueeze", "Squeeze", "Expand", "Concat", "Cast", "Identity",
                       "Flatten", "Tile", "Slice", "Split", "SplitToSequence", "SequenceAt", "Gather"})
_ELEMENTWISE = frozenset({"Mul", "Add", "Sub", "Neg", "Div", "Where"})
#: Ops that write this step's keys or values into a preallocated cache (a static cache: index_copy or
#: slice assignment export as ScatterND); the cache per token is their updates, not the whole buffer.
_CACHE_WRITES = frozenset({"ScatterND", "ScatterElements", "Scatter"})
_FUSED_ATTENTION = frozenset({"Attention", "MultiHeadAttention", "GroupQueryAttention"})


@dataclass(frozen=True, slots=True)
class AttentionFacts:
    """One attention core of a layer, per token of the sequence that built it."""

    heads: int
    key_dim: int  # per head, as the graph computes it (prefill)
    value_dim: int
    cached_key: float  # elements per token on the key side of the cache (a latent counts whole)
    cached_value: float  # elements per token on the value side not already on the key side
    kv_heads: int  # ways tensor parallelism splits the cache (1: every head reads all of it)
    latent: bool  # the cache is an absorbed latent (MLA)
    prefill_pair_flops: float  # FLOPs per (query, key) pair as the graph computes attention
    decode_pair_flops: float  # FLOPs per (query, cached token) pair at decode
    window: int = 0  # sliding window in tokens (0: none): a query reads, and the cache keeps, only the last `window`

    def held(self, context: float) -> float:
        """Tokens of a `context`-token sequence this core keeps cached and a new query reads: the last `window` of a
        sliding-window layer (vLLM's hybrid KV cache manager frees the rest), else all of them."""
        return min(context, self.window) if self.window else context

    def prefill_pairs(self, prefix: float, q: float) -> float:
        """(query, key) pairs of `q` new tokens after `prefix` cached ones, each query reading the keys up to
        itself, the last `window` of them in a sliding-window layer."""
        first, last = prefix + 1, prefix + q  # keys the first and the last new query read, before the window
        w = self.window
        if not w or last <= w:
            return q * (first + last) / 2
        if first >= w:
            return q * w
        return (first + w) * (w - first + 1) / 2 + (last - w) * w

    @property
    def cached_elements(self) -> float:
        """Elements cached per token per layer."""
        return self.cached_key + self.cached_value


@dataclass(frozen=True, slots=True)
class Core:
    """One attention core: the QK^T contraction, the softmax, the AV contraction and the ops between."""

    qk: int
    av: int
    nodes: frozenset[int]


def find_cores(graph: Graph, index: GraphIndex, nodes: frozenset[int],
               regions: Sequence[AttentionRegion]) -> list[Core]:
    """Attention cores among `nodes`, as training finds them (`regions`, the graph's
    `planner.costing.attention.attention_regions`: a softmax between two contractions of activations, whatever
    torch wrote around it). ONNX's fused attention ops are read apart (`attention_facts`)."""
    return [Core(qk=r.anchor, av=index.producer[r.out], nodes=r.nodes)
            for r in _spelled_out(graph, index, nodes, regions)]


def core_windows(graph: Graph, index: GraphIndex, nodes: frozenset[int],
                 regions: Sequence[AttentionRegion]) -> list[int]:
    """The sliding window (tokens, 0: none) of each attention core among `nodes`, in `find_cores`' order: layers of
    one structure differ in it (gpt-oss bands every other layer's mask, Gemma its local layers')."""
    return [r.window for r in _spelled_out(graph, index, nodes, regions)]


def _spelled_out(graph: Graph, index: GraphIndex, nodes: frozenset[int],
                 regions: Sequence[AttentionRegion]) -> list[AttentionRegion]:
    """The `regions` among `nodes` that are spelled out (QK^T, softmax, AV), not one fused attention op."""
    return [r for r in regions if r.anchor in nodes and graph.nodes[r.anchor].op_type not in _FUSED_ATTENTION
            and r.out in index.producer]


def attention_facts(graph: Graph, index: GraphIndex, cores: list[Core], nodes: frozenset[int],
                    stream: frozenset[str], tokens: int, batch: int) -> list[AttentionFacts]:
    """The attention of a layer; `stream` holds the layer's token-stream tensors (walks stay in it)."""
    seq = max(1, tokens // max(1, batch))
    out: list[AttentionFacts] = []
    for i in sorted(nodes):
        n = graph.nodes[i]
        if n.op_type in _FUSED_ATTENTION:
            out.append(_fused(graph, index, n, stream, tokens, batch, seq))
    for c in cores:
        qk, av = graph.nodes[c.qk], graph.nodes[c.av]
        q_name, k_name, v_name = qk.inputs[0], qk.inputs[1], av.inputs[1]
        scores = graph.tensors[qk.outputs[0]]
        heads = max(1, round(scores.numel / (batch * seq * seq)))
        key_dim = int((graph.tensors[q_name].shape or (1,))[-1])
        value_dim = int((graph.tensors[v_name].shape or (1,))[-1])
        flops_pair = (qk.flops + av.flops) / (batch * seq * seq)
        out.append(_facts(graph, index, k_name, v_name, heads, key_dim, value_dim, flops_pair, stream, tokens))
    return out


def _fused(graph, index, n, stream, tokens, batch, seq) -> AttentionFacts:
    heads = int(n.attrs.get("num_heads", n.attrs.get("q_num_heads", 1)) or 1)
    q_shape = graph.tensors[n.inputs[0]].shape or (1,)
    width = q_shape[-1] if len(q_shape) >= 4 else max(1, q_shape[-1] // heads)
    flops_pair = n.flops / (batch * seq * seq) if n.flops else 4.0 * heads * width
    return _facts(graph, index, n.inputs[1], n.inputs[2], heads, int(width), int(width), flops_pair, stream, tokens)


def _facts(graph, index, k_name, v_name, heads, key_dim, value_dim, flops_pair, stream, tokens) -> AttentionFacts:
    k_front, k_latent = _cached(graph, index, k_name, stream)
    v_front, v_latent = _cached(graph, index, v_name, stream)
    k_width = sum(per_token(graph, t, tokens) for t in sorted(k_front))
    v_only = sum(per_token(graph, t, tokens) for t in sorted(v_front - k_front))
    v_width = sum(per_token(graph, t, tokens) for t in sorted(v_front))
    latent = k_latent or v_latent
    if latent:
        kv_heads = 1
        decode = 2.0 * heads * (k_width + v_width)
    else:
        kv_heads = max(1, round(k_width / key_dim)) if key_dim else 1
        decode = flops_pair
    return AttentionFacts(heads=heads, key_dim=key_dim, value_dim=value_dim, cached_key=k_width, cached_value=v_only,
                          kv_heads=kv_heads, latent=latent, prefill_pair_flops=flops_pair, decode_pair_flops=decode)


def _cached(graph: Graph, index: GraphIndex, start: str, stream: frozenset[str]) -> tuple[frozenset[str], bool]:
    """(tensors the cache holds for `start`, whether a widening projection was absorbed on the way).

    The walk carries the last Split output it came through: reaching a projection through one caches that
    part only (K of a fused QKV); reaching it also without one caches the whole output.
    """
    parts: dict[str, set[str | None]] = {}  # projection output -> the split parts of it that are needed
    found: set[str] = set()
    absorbed = False
    seen: set[tuple[str, bool, str | None]] = set()
    stack: list[tuple[str, bool, str | None]] = [(start, True, None)]  # (tensor, re-layout only so far, part)
    while stack:
        name, linear, part = stack.pop()
        if (name, linear, part) in seen:
            continue
        seen.add((name, linear, part))
        j = index.producer.get(name)
        if j is None or name not in stream:
            found.add(name)
            continue
        node = graph.nodes[j]
        acts = [x for x in _data_inputs(graph, node) if x in stream and not index.is_weight(x) and _is_float(graph, x)]
        if is_weight_matmul(graph, index, j):
            src = acts[0] if acts else None
            if linear and src is not None and per_token_ratio(graph, src, part or name) < 1.0:
                absorbed = True
                found.add(src)
            else:
                parts.setdefault(name, set()).add(part)
            continue
        if node.op_type in ("Split", "SequenceAt") or (node.op_type == "Slice" and _feature_slice(graph, node)):
            part = name  # K or V of a fused QKV projection (Phi-3's qkv_proj is sliced, not split)
        if node.op_type in _CACHE_WRITES:  # a cache written in place: what this step adds is the updates
            updates = node.inputs[2] if len(node.inputs) > 2 else ""
            if updates in stream:
                stack.append((updates, linear, part))
            else:
                found.add(name)
        elif node.op_type in _RELAYOUT and acts:
            stack.extend((x, linear, part) for x in acts)
        elif node.op_type in _ELEMENTWISE and acts:
            stack.extend((x, False, part) for x in acts)  # rotary embedding: position-wise, not absorbable
        else:
            found.add(name)
    for whole, needed in parts.items():
        found |= {whole} if None in needed else {p for p in needed if p}
    return frozenset(found), absorbed


def _feature_slice(graph: Graph, node) -> bool:
    """A Slice that cuts only the last dim of its input (a part of each token's features, not of the tokens)."""
    a = graph.tensors.get(node.inputs[0]) if node.inputs else None
    b = graph.tensors.get(node.outputs[0]) if node.outputs else None
    if a is None or b is None or not a.shape or not b.shape or len(a.shape) != len(b.shape):
        return False
    return a.shape[:-1] == b.shape[:-1] and a.shape[-1] != b.shape[-1]


def _data_inputs(graph: Graph, node) -> list[str]:
    """The inputs that carry the token's values through an op: not shapes, axes or indices, and not the
    broadcast operands of an elementwise op (a norm's statistic, a scale, a position table)."""
    if node.op_type == "Concat":
        return [x for x in node.inputs if x]
    if node.op_type in _ELEMENTWISE:
        ins = [x for x in (node.inputs[1:] if node.op_type == "Where" else node.inputs) if x and x in graph.tensors]
        out = graph.tensors.get(node.outputs[0]) if node.outputs else None
        same = [x for x in ins if out is not None and graph.tensors[x].shape == out.shape]
        return same or sorted(ins, key=lambda x: -graph.tensors[x].numel)[:1]
    return [node.inputs[0]] if node.inputs and node.inputs[0] else []


def _is_float(graph: Graph, name: str) -> bool:
    t = graph.tensors.get(name)
    return t is not None and t.dtype in FLOAT_DTYPES


def per_token_ratio(graph: Graph, a: str, b: str) -> float:
    """Width of `a` over width of `b` (same tokens): below 1 when the projection a -> b widens."""
    ta, tb = graph.tensors.get(a), graph.tensors.get(b)
    if ta is None or tb is None or not tb.numel:
        return 1.0
    return ta.numel / tb.numel
