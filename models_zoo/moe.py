"""Top-k routed experts whose graph FLOPs are the *active* compute.

All E experts' weights are parameters, but each expert runs on a slice of
C = ceil(T*k/E) tokens, so the expert MatMuls cost 2*T*k*(3*H*I) FLOPs, as
the routed computation does (Shazeer et al. 2017; Fedus et al. 2022 eq. 1).

Construction (it runs in onnxruntime, and every op is standard):

    logits = x @ gate^T                      [T, E]   router (fp32 from here, as HF does)
    p = softmax(logits) or sigmoid(logits)   score function (Mixtral / DeepSeek-V3)
    w, idx = TopK(p, k)                      [T, k]   (renormalised when norm_topk)
    perm = argsort(idx.flatten())            [T*k]    pairs grouped by expert id (TopK, ascending)
    xs = x[perm // k]                        [T*k, H] dispatch (Gather)
    ys = experts(xs.reshape(E, C, H))        [E, C, H] one batched MatMul per weight
    y = ScatterND(zeros, perm // k, ys * w, reduction=add)   combine

**Balanced-routing assumption**: chunk e of the sorted pairs goes to expert
e, i.e. every expert receives exactly T*k/E tokens. Real routing is uneven;
the FLOPs and bytes of the balanced case are what a planner provisions for
(capacity factor 1). Group-limited routing and DeepSeek-V3's bias-corrected
selection change which experts are picked, not the cost, and are left out.

Layouts: ``fused`` (default) stores ``experts.gate_up_proj [E, 2I, H]`` and
``experts.down_proj [E, H, I]`` exactly as transformers 5 does, which keeps a
256-expert model small; ``fused_io`` stores them as ``torch.bmm`` reads them,
``gate_up_proj [E, H, 2I]`` and ``down_proj [E, I, H]`` (transformers'
``Llama4TextExperts``); ``per_expert`` stores ``experts.N.{gate,up,down}_proj.weight``
as checkpoints of transformers 4 and DeepSeek's own release do, and emits one
small MLP per expert (large graphs: ~10 nodes per expert per layer).

Scores: ``softmax`` over all experts then top-k (Mixtral, Qwen), ``sigmoid``
then top-k (DeepSeek-V3), or ``topk_sigmoid``: top-k of the logits, then a
sigmoid of each of the k, not renormalised (Llama 4's ``Llama4Router``). All
pick k experts per token: the cost is the same.
"""

from __future__ import annotations

from collections.abc import Callable

from onnx import TensorProto

from models_zoo.graph_builder import GraphBuilder
from models_zoo.layers import filled, linear, reshape, silu

EXPERT_LAYOUTS = ("fused", "fused_io", "per_expert")


def capacity(tokens: int, experts: int, top_k: int) -> int:
    """Tokens per expert under balanced routing: ceil(T*k/E)."""
    return -(-tokens * top_k // experts)


def routed_experts(
    b: GraphBuilder,
    x: str,
    tokens: int,
    hidden: int,
    ffn: int,
    experts: int,
    top_k: int,
    score: str = "softmax",
    norm_topk: bool = True,
    layout: str = "fused",
    router: str = "gate",
) -> str:
    """Router (module `router`) + experts + combine on x [T, H], in the current (``mlp``) scope; returns [T, H]."""
    logits = b.op("Cast", [linear(b, x, hidden, experts, router)], to=TensorProto.FLOAT)
    if score == "topk_sigmoid":
        top, idx = b.op("TopK", [logits, b.const([top_k])], n_out=2, axis=-1)
        weights = b.op("Sigmoid", [top])
    else:
        probs = b.op("Softmax", [logits], axis=-1) if score == "softmax" else b.op("Sigmoid", [logits])
        weights, idx = b.op("TopK", [probs, b.const([top_k])], n_out=2, axis=-1)
    if norm_topk:
        weights = b.op("Div", [weights, b.op("ReduceSum", [weights, b.const([-1])], keepdims=1)])

    def body(eb: GraphBuilder, xs: str, cap: int) -> str:
        if layout == "per_expert":
            return _per_expert(eb, xs, hidden, ffn, experts, cap)
        return _fused_experts(eb, xs, hidden, ffn, experts, cap, stored_in_out=layout == "fused_io")

    return dispatch_combine(b, x, weights, idx, tokens, hidden, experts, top_k, body)


def dispatch_combine(
    b: GraphBuilder,
    x: str,
    weights: str,
    idx: str,
    tokens: int,
    hidden: int,
    experts: int,
    top_k: int,
    body: Callable[[GraphBuilder, str, int], str],
) -> str:
    """Sort the (token, expert) pairs by expert, run `body` on [E*C, H] in the ``experts`` scope, scatter back.

    `weights`, `idx` [T, k] are the router's choice (float32 weights); `body`
    gets the builder, the dispatched rows (expert e owns rows e*C..(e+1)*C)
    and C, and returns [E*C, H].
    """
    pairs = tokens * top_k
    cap = capacity(tokens, experts, top_k)
    padded = experts * cap
    # Index tensors are kept 2-D ([1, T*k]): ONNX data propagation expands every
    # 1-D int64 tensor dim by dim, which costs seconds at T*k ~ 10^5.
    key = b.op("Cast", [reshape(b, idx, [1, pairs])], to=TensorProto.FLOAT)
    _, perm = b.op("TopK", [key, b.const([pairs])], n_out=2, axis=1, largest=0, sorted=1)
    token_of = b.op("Div", [perm, b.const(top_k)])
    xs = reshape(b, b.op("Gather", [x, token_of], axis=0), [pairs, hidden])
    if padded > pairs:
        xs = b.op("Pad", [xs, b.const([0, 0, padded - pairs, 0])])
    with b.scope("experts"):
        ys = body(b, xs, cap)
    if padded > pairs:
        ys = b.op("Slice", [ys, b.const([0]), b.const([pairs]), b.const([0])])
    w = b.op("Cast", [b.op("Gather", [reshape(b, weights, [pairs]), perm], axis=0)], to=b.elem)
    ys = b.op("Mul", [reshape(b, ys, [1, pairs, hidden]), b.op("Unsqueeze", [w, b.const([2])])])
    zeros = filled(b, 0.0, [tokens, hidden], b.elem)
    where = b.op("Unsqueeze", [token_of, b.const([2])])
    return b.op("ScatterND", [zeros, where, ys], reduction="add")


def _fused_experts(b: GraphBuilder, xs: str, hidden: int, ffn: int, experts: int, cap: int,
                   stored_in_out: bool = False) -> str:
    """transformers-5 ``MixtralExperts`` (weights [E, out, in]), or ``Llama4TextExperts`` when `stored_in_out`
    (weights [E, in, out]): one batched MatMul per stacked weight."""
    xe = reshape(b, xs, [experts, cap, hidden])

    def weight(name: str, out_f: int, in_f: int) -> str:
        if stored_in_out:
            return b.param(name, [experts, in_f, out_f])
        return b.op("Transpose", [b.param(name, [experts, out_f, in_f])], perm=[0, 2, 1])

    h = b.op("MatMul", [xe, weight("gate_up_proj", 2 * ffn, hidden)])
    g, u = b.op("Split", [h, b.const([ffn, ffn])], n_out=2, axis=-1)
    y = b.op("MatMul", [b.op("Mul", [silu(b, g), u]), weight("down_proj", hidden, ffn)])
    return reshape(b, y, [experts * cap, hidden])


def _per_expert(b: GraphBuilder, xs: str, hidden: int, ffn: int, experts: int, cap: int) -> str:
    """One ``nn.Linear`` MLP per expert, named ``experts.N.{gate,up,down}_proj``."""
    parts = b.op("Split", [xs, b.const([cap] * experts)], n_out=experts, axis=0)
    parts = [parts] if isinstance(parts, str) else parts
    outs = []
    for e, part in enumerate(parts):
        with b.scope(str(e)):
            g = linear(b, part, hidden, ffn, "gate_proj")
            u = linear(b, part, hidden, ffn, "up_proj")
            outs.append(linear(b, b.op("Mul", [silu(b, g), u]), ffn, hidden, "down_proj"))
    return outs[0] if len(outs) == 1 else b.op("Concat", outs, axis=0)


def routed_params(hidden: int, ffn: int, experts: int) -> int:
    """Router [E, H] plus E SwiGLU experts."""
    return experts * hidden + experts * 3 * hidden * ffn
