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
- backward: S recomputed, dV, dP, dQ and dK against the forward's QK^T and
  PV (FlashAttention-2 section 3.2): 2.5x the forward FLOPs at equal head
  dims, more where the query-key heads are wider (`backward_flops_ratio`);
- HBM traffic: Q, K, V read and O written forward (K and V at their
  stored, un-repeated size: GQA kernels index the shared heads).

The cores are found from the graph (`attention_regions`), whatever the
exporter: every Softmax between two contractions of activations.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from planner.costing.activations import _PASS, softmax_span, view_roots
from planner.costing.node_work import METADATA_OPS
from planner.graph.ir import Graph
from planner.graph.walk import GraphIndex, index_graph


def backward_flops_ratio(head_dim_qk: float, head_dim_v: float) -> float:
    """Backward FLOPs of a flash kernel over its forward FLOPs, per (query, key) pair computed: forward QK^T and PV,
    2 (d_qk + d_v); backward S again, dP, dV, dQ and dK, 2 (3 d_qk + 2 d_v) (FlashAttention-2, Dao 2023, section
    3.2; cuDNN's SDPA benchmark counts the same, benchmarks/fit_attention_head_dim.useful_flops): 2.5 at equal head
    dims, 2.6 at MLA's 192/128."""
    return (3.0 * head_dim_qk + 2.0 * head_dim_v) / (head_dim_qk + head_dim_v)


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
    masks: tuple[str, ...] = ()  # what the ops between the contractions read from outside the core (masks, scales)
    backward_ratio: float = 2.5  # backward FLOPs over forward (`backward_flops_ratio` of its head dims)


def attention_regions(graph: Graph, index: GraphIndex | None = None) -> list[AttentionRegion]:
    """Every attention core of the graph, in node order (see the module docstring)."""
    index = index or index_graph(graph)
    producer, consumers = index.producer, index.consumers
    roots = view_roots(graph)
    out: list[AttentionRegion] = []
    for i, n in enumerate(graph.nodes):
        if n.op_type == "Attention" and n.domain in ("", "ai.onnx"):
            region = _attention_op(graph, producer, consumers, roots, i)
            if region is not None:
                out.append(region)
            continue
        if n.op_type != "Softmax":
            continue
        region, qk, av = softmax_span(graph, index, i, _PASS | _SINK_OPS)
        if av < 0:
            continue
        between = {k for k in region if k not in (qk, av, i)}
        causal, window = core_mask(graph, producer, between, region)
        region |= _stabilizers(graph, consumers, region)
        made = {o for k in region for o in graph.nodes[k].outputs if o}
        masks = tuple(sorted({x for k in between for x in graph.nodes[k].inputs if x and x not in made}))
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
        dims = (int(q_t.shape[-1]), int(o_t.shape[-1])) if q_t.shape and o_t.shape else (128, 128)
        out.append(AttentionRegion(frozenset(region), qk, q, k_in, v, graph.nodes[av].outputs[0], flops, kept,
                                   causal, window, io, lse, heads, q_len, kv_len, sum(dims) / 2, masks=masks,
                                   backward_ratio=backward_flops_ratio(*dims)))
    return out


def heads_problem(tp: int, heads: Iterable[int]) -> str:
    """Why tensor parallelism of degree `tp` cannot split attention of these query-head counts, or "": every
    framework the plans launch on splits attention by whole query heads (Megatron-Core's TransformerConfig
    refuses num_attention_heads not a multiple of tensor_model_parallel_size; torchtitan's and torch's
    Colwise plans cut the head dim evenly), so tp must divide each count."""
    counts = {h for h in heads if h > 0}
    odd = sorted(h for h in counts if h % tp)
    if tp <= 1 or not odd:
        return ""
    fits = [d for d in range(1, odd[0] + 1) if all(h % d == 0 for h in counts)]
    return (f"--tp {tp} does not divide the {odd[0]} query heads of an attention layer, and attention is split by "
            f"whole heads; use a tp that divides them ({', '.join(map(str, fits))})")


def mask_builders(graph: Graph, index: GraphIndex, regions: Iterable[AttentionRegion]) -> frozenset[int]:
    """The ops that only build the masks the cores read (comparisons of positions, the boolean-to-additive Where,
    their broadcasts): a flash kernel takes causal and window flags instead, so with one they do not run. Walked
    back from each core's mask inputs, an op is taken when everything that reads its outputs is a core, another
    op taken, or reads only a shape; never an op that reads a weight."""
    inside: set[int] = set()
    start: set[str] = set()
    for r in regions:
        inside |= r.nodes
        start |= set(r.masks)
    cone: set[int] = set()
    frontier = [index.producer[x] for x in start if x in index.producer]
    while frontier:
        j = frontier.pop()
        if j in cone or j in inside:
            continue
        cone.add(j)
        frontier += [index.producer[x] for x in graph.nodes[j].inputs if x in index.producer]
    taken: set[int] = set()
    for j in sorted(cone, reverse=True):  # readers first: ONNX lists a node after what it reads
        node = graph.nodes[j]
        if any(x in index.weight_of for x in node.inputs) or not any(node.outputs):
            continue
        readers = [c for o in node.outputs if o for c in index.consumers.get(o, ())]
        if any(o in graph.outputs for o in node.outputs):
            continue
        if all(c in inside or c in taken or graph.nodes[c].op_type in METADATA_OPS for c in readers):
            taken.add(j)
    return frozenset(taken)


def _attention_op(graph: Graph, producer, consumers, roots, i: int) -> AttentionRegion | None:
    """ONNX's Attention op (opset 23, what torch's dynamo exporter writes for scaled_dot_product_attention from
    opset 23): one core by itself. Q, K, V are [B, H, S, D], or [B, S, H x D] with `q_num_heads` and
    `kv_num_heads`; causal from `is_causal` or the mask it is given (input 3), as for a spelled-out core."""
    n = graph.nodes[i]
    ts = [graph.tensors.get(x) if x else None for x in n.inputs[:3]]
    o_t = graph.tensors.get(n.outputs[0]) if n.outputs else None
    if len(ts) < 3 or any(t is None or not t.shape for t in ts) or o_t is None:
        return None
    (q, k, v), shapes = n.inputs[:3], [t.shape for t in ts]
    if all(len(s) == 4 for s in shapes):
        batch, heads, q_len, qk_dim = shapes[0]
        kv_len, v_dim = shapes[1][2], shapes[2][3]
    elif all(len(s) == 3 for s in shapes) and int(n.attrs.get("q_num_heads", 0) or 0) > 0 \
            and int(n.attrs.get("kv_num_heads", 0) or 0) > 0:
        heads, kv_heads = int(n.attrs["q_num_heads"]), int(n.attrs["kv_num_heads"])
        batch, q_len, qk_dim = shapes[0][0], shapes[0][1], shapes[0][2] // heads
        kv_len, v_dim = shapes[1][1], shapes[2][2] // kv_heads
    else:
        return None
    region = {i} | _absorb_feeding_views(graph, producer, consumers, {i}, (q, k, v))
    causal, window = core_mask(graph, producer, [i], region) if len(n.inputs) > 3 and n.inputs[3] else (False, 0)
    causal = causal or bool(n.attrs.get("is_causal", 0))
    scores = float(batch * heads * q_len * kv_len)
    stored = {roots.get(x, x) for x in (q, k, v)}
    io = sum(graph.tensors[x].nbytes for x in stored if x in graph.tensors) + o_t.nbytes
    return AttentionRegion(frozenset(region), i, q, k, v, n.outputs[0], 2.0 * scores * (qk_dim + v_dim),
                           kept_fraction(q_len, kv_len, causal, window), causal, window, io,
                           4.0 * scores / max(1, kv_len), heads, q_len, kv_len, (qk_dim + v_dim) / 2,
                           masks=tuple(n.inputs[3:4]) if len(n.inputs) > 3 and n.inputs[3] else (),
                           backward_ratio=backward_flops_ratio(qk_dim, v_dim))


def _leading(shape: tuple[int, ...]) -> int:
    """The batch dim of a [B, heads, q, kv] score tensor (1 for rank-3 [heads, q, kv])."""
    return int(shape[0]) if len(shape) >= 4 else 1


def _absorb_feeding_views(graph: Graph, producer, consumers, region: set[int], inputs) -> set[int]:
    """Views and broadcasts between a stored Q/K/V and the core whose output only the core reads (a Shape or Size
    reading it takes only its metadata), and a scaling by one number on the way (torch's exported
    scaled_dot_product_attention multiplies Q and K each by the square root of the scale; the kernel applies it)."""
    taken: set[int] = set()
    for name in inputs:
        for _ in range(8):
            j = producer.get(name, -1)
            if j < 0:
                break
            node = graph.nodes[j]
            data = _scaled_input(graph, node) if node.op_type in ("Mul", "Div") else (
                node.inputs[0] if node.op_type in _FEEDING_VIEWS and node.inputs else None)
            if data is None:
                break
            if any(c not in region and c not in taken and graph.nodes[c].op_type not in METADATA_OPS
                   for c in consumers.get(name, [])):
                break
            taken.add(j)
            name = data
    return taken


def _stabilizers(graph: Graph, consumers, region: set[int]) -> set[int]:
    """ReduceMax ops that take the running maximum a softmax subtracts (x - max(x)) from scores made inside
    `region` and feed only it, through that Sub: as transformers' gpt-oss eager attention spells its
    softmax-with-sinks; a flash kernel keeps that maximum in registers. A maximum read elsewhere (a logged
    max-logit, a graph output) stays outside."""
    made = {o for k in region for o in graph.nodes[k].outputs if o}
    outputs = set(graph.outputs)
    out = set()
    for name in sorted(made):
        for j in consumers.get(name, ()):
            n = graph.nodes[j]
            if j in region or n.op_type != "ReduceMax" or n.inputs[0] != name or not n.outputs[0] \
                    or n.outputs[0] in outputs:
                continue
            readers = consumers.get(n.outputs[0], ())
            if readers and all(u in region and graph.nodes[u].op_type == "Sub"
                               and list(graph.nodes[u].inputs) == [name, n.outputs[0]] for u in readers):
                out.add(j)
    return out


def _scaled_input(graph: Graph, node) -> str | None:
    """The tensor a Mul or Div scales by a single number (a scalar operand, as Div only its divisor), or None."""
    def scalar(x: str) -> bool:
        t = graph.tensors.get(x)
        return t is not None and t.shape is not None and t.numel <= 1

    if len(node.inputs) != 2:
        return None
    a, b = node.inputs
    if scalar(b) and not scalar(a):
        return a
    return b if node.op_type == "Mul" and scalar(a) and not scalar(b) else None


def pass_window(window: int, backward: bool, fp8: str = "") -> int:
    """The sliding window a pass's kernel skips tiles by: the core's, but none in cuDNN's FP8 backward (`fp8`:
    Transformer Engine's fp8_dot_product_attention), which computes every tile the window's mask would skip (every
    causal tile of a causal core). Measured: at GPT-OSS's 128-token window cuDNN 9.22's FP8 and MXFP8 backward on
    GB200 and GB300 takes 3.2-3.9x as long for twice the tokens (0.47 -> 1.48 -> 5.19 -> 19.4 -> 74.8 ms from 2K to
    32K tokens on GB300), as a causal kernel does, where its forward and the BF16 backward take twice as long
    (tests/data/cudnn_sdpa_fp8.json; benchmarks/fit_attention_fp8.py)."""
    return 0 if fp8 and backward else window


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
    """(causal, window) of a mask input of the core, from how it is built, looking at up to 48 ops back, nearest
    first (a mask built once and shared by every layer spends the budget on its shape arithmetic if walked depth
    first). Causal: a Trilu, or a comparison across the two position axes (key positions against query
    positions, as transformers' mask functions build it; a comparison against one number, a padding or
    bidirectional mask, is not). Banded to w tokens: a second Trilu whose diagonal offset is k, |k| > 1 (w = |k|),
    or such a comparison with w added to or taken from one side (kv > q - w), or of q - kv against w."""
    frontier, seen, causal, window = deque([name]), 0, False, 0
    while frontier and seen < 48:
        x = frontier.popleft()
        j = producer.get(x, -1)
        if j < 0 or j in region:
            continue
        seen += 1
        node = graph.nodes[j]
        if node.op_type in _MASK_MAKERS:
            causal = True
            k = _constant(graph, producer, node.inputs[1]) if len(node.inputs) > 1 else None
            if k is not None and abs(k) > 1:
                window = max(window, abs(int(k)))
        elif node.op_type in _MASK_COMPARES and len(node.inputs) == 2:
            band = _position_compare(graph, producer, *node.inputs)
            if band is not None:
                causal, window = True, max(window, band)
        frontier += [y for y in node.inputs if y]
    return causal, window


def _position_compare(graph: Graph, producer, a: str, b: str) -> int | None:
    """The band (0: none) of a comparison of query and key positions, or None if it does not compare across the
    two axes: its operands vary along different ones of the last two dims, either of them offset by a constant
    (the band), or it compares their difference against a constant (the band)."""
    def axis(x: str) -> int | None:  # -1: varies along the last dim only, -2: along the one before only
        t = graph.tensors.get(x)
        if t is None or t.shape is None or len(t.shape) < 2:
            return None
        last, before = t.shape[-1] > 1, t.shape[-2] > 1
        return -1 if last and not before else -2 if before and not last else None

    def offset(x: str) -> tuple[str, float]:  # the operand behind an added or subtracted constant, and it
        j = producer.get(x, -1)
        if j >= 0 and graph.nodes[j].op_type in ("Add", "Sub") and len(graph.nodes[j].inputs) == 2:
            c = _constant(graph, producer, graph.nodes[j].inputs[1])
            if c is not None:
                return graph.nodes[j].inputs[0], c
        return x, 0.0

    (a0, ca), (b0, cb) = offset(a), offset(b)
    axes = {axis(a0), axis(b0)}
    if axes == {-1, -2}:
        band = abs(ca or cb)
        return int(band) if band > 1 else 0
    for diff, other in ((a, b), (b, a)):  # (q - kv) < w
        j, c = producer.get(diff, -1), _constant(graph, producer, other)
        if j >= 0 and c is not None and graph.nodes[j].op_type == "Sub" and len(graph.nodes[j].inputs) == 2 \
                and {axis(graph.nodes[j].inputs[0]), axis(graph.nodes[j].inputs[1])} == {-1, -2}:
            return int(abs(c)) if abs(c) > 1 else 0
    return None


def _constant(graph: Graph, producer, name: str) -> float | None:
    """The value of a scalar Constant, if `name` is one."""
    j = producer.get(name, -1)
    if j < 0 or graph.nodes[j].op_type != "Constant":
        return None
    value = graph.nodes[j].attrs.get("value")
    values = value.get("values") if isinstance(value, dict) else None
    return float(values[0]) if values and len(values) == 1 and isinstance(values[0], (int, float)) else None


__all__ = ["TILE", "AttentionRegion", "attention_regions", "backward_flops_ratio", "core_mask", "kept_fraction",
           "mask_builders", "pass_window"]
