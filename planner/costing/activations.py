"""What the forward pass keeps for the backward pass, read off the graph, and what recompute drops.

Each op saves what its gradient needs (a matmul its activation inputs, a
softmax its output, a norm or a GeLU its input, a dropout its 1-byte mask);
tensors that are views of one another (reshape, transpose) are stored once.
On a GPT layer with dropout this reproduces Korthikanti et al. 2022's count,
34·s·b·h + 5·a·s²·b bytes in 16-bit, from the graph alone, and it applies
unchanged to any other architecture.

Selective recompute (Korthikanti section 5) drops what the attention core
(QK^T, mask, softmax, dropout, AV) saves and runs that core forward again;
full recompute keeps only each layer's inputs and runs the layer again.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Sequence

from planner.graph.ir import Graph, dtype_bytes
from planner.graph.walk import GraphIndex, index_graph
from planner.costing.loss import LOSS_SUFFIX
from planner.costing.node_work import FLOAT_DTYPES

_VIEWS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose", "Identity", "Expand"})
_SAVE_INPUT = frozenset(
    {"Gelu", "Erf", "Tanh", "Sigmoid", "Relu", "LeakyRelu", "Exp", "Log", "Sqrt", "Reciprocal", "Pow", "Silu",
     "Softplus", "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish", "Mish", "Sin", "Cos", "Abs", "QuickGelu",
     "FastGelu", "BiasGelu", "LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization",
     "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "BatchNormalization",
     "InstanceNormalization", "GroupNormalization", "ReduceMax", "ReduceMin", "MaxPool", "Clip"}
)
_SAVE_OUTPUT = frozenset({"Softmax", "LogSoftmax"})
_CONTRACTIONS = frozenset({"MatMul", "Gemm", "Einsum", "Conv", "ConvTranspose", "FusedMatMul"})
_BILINEAR = frozenset({"Mul", "Div"})
#: Ops between the scores and the softmax, or the softmax and AV, that an attention core passes (scale, mask,
#: casts, dropout; Tanh: Gemma-2's logit soft-capping, which FlashAttention-2 runs in its kernel, `softcap`).
_PASS = frozenset({"Add", "Sub", "Neg", "Cast", "Where", "Div", "Mul", "Dropout", "Reshape", "Transpose",
                   "Squeeze", "Unsqueeze", "Identity", "Expand", "Softmax", "Clip", "Max", "Min", "Tanh"})


def requires_grad(graph: Graph) -> set[str]:
    """Tensors that carry a gradient in training: floating-point values downstream of a parameter."""
    req = {p for p in graph.params if graph.tensors[p].dtype in FLOAT_DTYPES}
    for n in graph.nodes:
        if any(i in req for i in n.inputs if i):
            for o in n.outputs:
                t = graph.tensors.get(o) if o else None
                if t is not None and t.dtype in FLOAT_DTYPES:
                    req.add(o)
    return req


@dataclass(frozen=True, slots=True)
class Saved:
    """One stored tensor: its (view-root) name, the first node that saves it, and bytes at the imported batch."""

    tensor: str
    saver: int
    input_index: int  # which input of the saver it is, or is shaped like (a dropout mask); -1: an output
    nbytes: float


def view_roots(graph: Graph, casts: bool = False) -> dict[str, str]:
    """Tensor -> the tensor whose storage it views (itself when not a view). With `casts`, a float-to-float Cast
    or CastLike output also maps to its source's root: priced at the step's width (`saved_tensors`'
    `work_float_bytes`) a float cast, up or down, holds its source's values at that width, so a backward that
    keeps both keeps one tensor (an eager export's RMSNorm squares `x.float()` where the zoo squares `x`, which a
    residual already keeps; a router's fp32 softmax cast back)."""
    root: dict[str, str] = {}
    for n in graph.nodes:
        if not n.inputs or not n.inputs[0]:
            continue
        src = n.inputs[0]
        if casts and n.op_type in ("Cast", "CastLike") and n.outputs and n.outputs[0]:
            a, b = graph.tensors.get(src), graph.tensors.get(n.outputs[0])
            if a is None or b is None or a.dtype not in FLOAT_DTYPES or b.dtype not in FLOAT_DTYPES:
                continue
        elif n.op_type not in _VIEWS:
            continue
        for o in n.outputs:
            if o:
                root[o] = root.get(src, src)
    return root


def saved_tensors(graph: Graph, work_float_bytes: float | None = None, grad: set[str] | None = None,
                  fused_attention: Sequence | None = None, weights: Collection[str] = ()) -> list[Saved]:
    """Every tensor the forward pass stores for backward, once each, in node order.

    `work_float_bytes` re-prices floating-point tensors at the precision the
    step runs in (e.g. 2 for bf16 training of a float32 export). With
    `fused_attention` (the `AttentionRegion`s of `planner.costing.attention`),
    each region's ops save nothing of their own: the flash kernel keeps Q, K
    and V (saved as inputs 0, 1, 2 of the region's QK^T node) and its
    log-sum-exp statistics (saved as its output, fp32 at any precision); its
    output O is kept by whatever reads it, like any tensor.

    The loss keeps the log-softmax of each floating-point graph output that carries a gradient (the logits),
    priced here in fp32 as PyTorch's cross_entropy on upcast logits and Megatron's vocab-parallel cross entropy
    keep it; `planner.costing.recompute.kept_tensors` reprices it at the stack's kernel's peak (`loss.peak_scale`).

    `weights` are tensors made of parameters only (`planner.graph.walk`: a transposed weight, the routed experts'
    weights gathered per token): backward reads the parameters again, so they are not kept.
    """
    params = set(graph.params) | set(weights)
    grad = requires_grad(graph) if grad is None else grad
    roots = view_roots(graph, casts=work_float_bytes is not None)
    seen: set[str] = set()
    out: list[Saved] = []

    def price(name: str) -> float:
        t = graph.tensors[name]
        if work_float_bytes is not None and t.dtype in FLOAT_DTYPES:
            return t.numel * work_float_bytes
        return t.nbytes

    def keep(name: str, saver: int, idx: int) -> None:
        if not name or name in params or name not in graph.tensors:
            return
        r = roots.get(name, name)
        if r in seen or r in params:
            return
        seen.add(r)
        out.append(Saved(r, saver, idx, price(r)))

    regions = {r.anchor: r for r in fused_attention or ()}
    inside = {i for r in fused_attention or () for i in r.nodes}
    for i, n in enumerate(graph.nodes):
        op = n.op_type
        ins = [x for x in n.inputs]
        if not any(x in grad for x in ins if x):
            continue  # nothing upstream needs a gradient through this op
        if i in regions:
            r = regions[i]
            for k, x in enumerate((r.q, r.k, r.v)):
                keep(x, i, k)
            out.append(Saved(f"{n.name or i}::lse", i, -1, r.lse_bytes))
            continue
        if i in inside:
            continue
        if op in _CONTRACTIONS:
            for k, x in enumerate(ins):
                if x and any(y in grad for j, y in enumerate(ins) if j != k and y):
                    keep(x, i, k)
        elif op in _BILINEAR and len(ins) == 2:
            for k, x in enumerate(ins):
                other = ins[1 - k]
                if other in grad or (op == "Div" and k == 1):
                    keep(x, i, k)
        elif op in _SAVE_OUTPUT:
            keep(n.outputs[0], i, -1)
        elif op in _SAVE_INPUT:
            keep(ins[0], i, 0)
        elif op == "Dropout":
            x = ins[0]
            t = graph.tensors.get(x)
            if t is not None and t.shape is not None:
                out.append(Saved(f"{n.name or i}::mask", i, 0, float(t.numel)))  # 1-byte mask, shaped like input 0
        elif op == "Attention":
            for k in range(min(3, len(ins))):
                keep(ins[k], i, k)
            keep(n.outputs[0], i, -1)
    for name, producer in loss_inputs(graph, grad):  # the loss keeps their log-softmax, in fp32
        out.append(Saved(f"{name}{LOSS_SUFFIX}", producer, -1, 4.0 * graph.tensors[name].numel))
    return out


def loss_inputs(graph: Graph, grad: set[str]) -> list[tuple[str, int]]:
    """What a training loss reads: each floating-point graph output that carries a gradient (the logits), with
    the node that produces it."""
    produced = {o: i for i, n in enumerate(graph.nodes) for o in n.outputs if o}
    out = []
    for name in graph.outputs:
        t = graph.tensors.get(name)
        if name in grad and t is not None and t.dtype in FLOAT_DTYPES and name in produced:
            out.append((name, produced[name]))
    return out


def attention_core(graph: Graph, index: GraphIndex | None = None) -> set[int]:
    """Nodes of the attention core: from the QK^T contraction through softmax to the AV contraction.

    Found from every Softmax: backwards through elementwise ops to a
    contraction of two activations, forwards to the contraction that consumes
    the probabilities. The fused ONNX Attention op is a core by itself.
    """
    index = index or index_graph(graph)
    core: set[int] = set()
    for i, n in enumerate(graph.nodes):
        if n.op_type == "Attention":
            core.add(i)
        elif n.op_type == "Softmax":
            region, qk, _ = softmax_span(graph, index, i, _PASS)
            if qk >= 0:
                core |= region
    return core


def softmax_span(graph: Graph, index: GraphIndex, i: int, passable: frozenset[str] | set[str]
                 ) -> tuple[set[int], int, int]:
    """The ops around Softmax node `i`: back through `passable` ops (scale, mask, casts) to the QK^T
    contraction of two activations, forward through them to the AV contraction. Returns the ops passed
    (the one that stopped each walk included), and the two contractions' nodes (-1 where not found)."""
    def contraction(j: int) -> bool:  # of two activations: no weight (nor a view of one) among its inputs
        n = graph.nodes[j]
        return n.op_type in ("MatMul", "Einsum") and len(n.inputs) >= 2 and not any(
            x in index.weight_of for x in n.inputs)

    region, qk, av, j = {i}, -1, -1, i
    for _ in range(12):
        src = graph.nodes[j].inputs[0] if graph.nodes[j].inputs else ""
        j = index.producer.get(src, -1)
        if j < 0:
            break
        region.add(j)
        if contraction(j):
            qk = j
            break
        if graph.nodes[j].op_type not in passable:
            break
    if qk < 0:
        return region, -1, -1
    frontier = i
    for _ in range(8):
        nxt = _past_nan_guard(graph, index, index.consumers.get(graph.nodes[frontier].outputs[0], ()), region)
        if len(nxt) != 1:
            break
        frontier = nxt[0]
        region.add(frontier)
        if contraction(frontier):
            av = frontier
            break
        if graph.nodes[frontier].op_type not in passable:
            break
    return region, qk, av


#: Ops that only test a tensor for a value, as in torch's exported scaled_dot_product_attention, which zeroes a
#: fully masked row's NaN probabilities: Where(IsNaN(p), 0, p).
_GUARDS = frozenset({"IsNaN", "IsInf"})


def _past_nan_guard(graph: Graph, index: GraphIndex, users, region: set[int]) -> tuple[int, ...]:
    """`users` of a tensor, with a guard that only feeds the one other user taken into `region` and left out."""
    users = tuple(users)
    guards = [u for u in users if graph.nodes[u].op_type in _GUARDS]
    rest = [u for u in users if u not in guards]
    if not guards or len(rest) != 1:
        return users
    if any(tuple(index.consumers.get(graph.nodes[g].outputs[0], ())) != (rest[0],) for g in guards):
        return users
    region.update(guards)
    return (rest[0],)


def layer_inputs(graph: Graph, nodes: set[int] | frozenset[int], grad: set[str]) -> list[str]:
    """Tensors a group of nodes reads from outside itself that carry a gradient: what full recompute keeps.

    `grad` is `requires_grad(graph)`, computed once by the caller.
    """
    inside_outputs = {o for i in nodes for o in graph.nodes[i].outputs if o}
    seen: list[str] = []
    params = set(graph.params)
    for i in sorted(nodes):
        for x in graph.nodes[i].inputs:
            if x and x in grad and x not in inside_outputs and x not in params and x not in seen:
                seen.append(x)
    return seen


def element_bytes(graph: Graph, name: str) -> float:
    t = graph.tensors[name]
    return dtype_bytes(t.dtype)
