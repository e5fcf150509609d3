"""Hand-built ONNX models for tests (and the import benchmark). Weightless unless a test needs data.

Each builder returns an `onnx.ModelProto`; `save` writes one to disk, with
external data when asked. `llama_like` writes a Llama-shaped graph the way the
PyTorch dynamo exporter does (node names, name_scopes metadata, run-time shape
arithmetic, symbolic batch/seq) at any size.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F, I64, BF16 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BFLOAT16


def opset(version: int, *extra: tuple[str, int]) -> list[onnx.OperatorSetIdProto]:
    return [helper.make_opsetid("", version), *(helper.make_opsetid(d, v) for d, v in extra)]


def model(nodes, inputs, outputs, inits=(), version: int = 18, value_info=(), functions=(), extra=()) -> onnx.ModelProto:
    g = helper.make_graph(list(nodes), "g", list(inputs), list(outputs), list(inits), value_info=list(value_info))
    m = helper.make_model(g, opset_imports=opset(version, *extra), functions=list(functions))
    m.ir_version = 10
    return m


def weight(name: str, *dims: int, dtype: int = F, value: float = 0.01) -> TensorProto:
    arr = np.full(dims, value, dtype=np.float32)
    t = numpy_helper.from_array(arr, name)
    if dtype != F:
        t = helper.make_tensor(name, dtype, dims, arr.reshape(-1).tolist())
    return t


def ints(name: str, values: list[int]) -> TensorProto:
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def vi(name: str, dims, dtype: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, dims)


def save(m: onnx.ModelProto, path: str, external: bool = False) -> str:
    if external:
        onnx.save_model(m, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=os.path.basename(path) + ".data", size_threshold=0)
    else:
        onnx.save_model(m, path)
    return path


def mlp(version: int = 18, d: int = 64, ff: int = 256, symbolic: bool = True) -> onnx.ModelProto:
    """x[batch, seq, d] -> MatMul -> Relu -> MatMul -> y: 2·B·S·(2·d·ff) FLOPs + B·S·ff for Relu."""
    dims = ["batch", "seq", d] if symbolic else [2, 8, d]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="/mlp/fc1/MatMul"),
             helper.make_node("Relu", ["h"], ["a"], name="/mlp/act/Relu"),
             helper.make_node("MatMul", ["a", "w2"], ["y"], name="/mlp/fc2/MatMul")]
    return model(nodes, [vi("x", dims)], [vi("y", None)], [weight("w1", d, ff), weight("w2", ff, d)], version)


def weights_as_inputs() -> onnx.ModelProto:
    """TorchScript-exporter style with keep_initializers_as_inputs: weights are graph inputs too."""
    m = mlp(13, symbolic=False)
    m.graph.input.extend([vi("w1", [64, 256]), vi("w2", [256, 64])])
    return m


def attention23(b: int = 2, hq: int = 8, hkv: int = 2, s: int = 16, dh: int = 32) -> onnx.ModelProto:
    """Opset 23: RMSNormalization, then Attention with GQA in 3-D form, then a projection."""
    d = hq * dh
    nodes = [helper.make_node("RMSNormalization", ["x", "g"], ["n"], axis=-1, name="/layer/norm/RMSNorm"),
             helper.make_node("MatMul", ["n", "wq"], ["q"], name="/layer/attn/q_proj/MatMul"),
             helper.make_node("MatMul", ["n", "wk"], ["k"], name="/layer/attn/k_proj/MatMul"),
             helper.make_node("MatMul", ["n", "wv"], ["v"], name="/layer/attn/v_proj/MatMul"),
             helper.make_node("Attention", ["q", "k", "v"], ["o"], q_num_heads=hq, kv_num_heads=hkv, is_causal=1,
                              name="/layer/attn/Attention"),
             helper.make_node("MatMul", ["o", "wo"], ["y"], name="/layer/attn/o_proj/MatMul")]
    inits = [weight("g", d), weight("wq", d, d), weight("wk", d, hkv * dh), weight("wv", d, hkv * dh),
             weight("wo", d, d)]
    return model(nodes, [vi("x", ["batch", "seq", d])], [vi("y", None)], inits, 23)


def attention13(b: int = 2, h: int = 4, s: int = 16, dh: int = 16) -> onnx.ModelProto:
    """Opset 13: attention written out as MatMul / Softmax / MatMul on 4-D tensors, with Reshape/Transpose."""
    d = h * dh
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q0"]),
             helper.make_node("Reshape", ["q0", "shape4"], ["q1"]),
             helper.make_node("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["q1"], ["kt"], perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["sc"]),
             helper.make_node("Softmax", ["sc"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "q"], ["o"]),
             helper.make_node("Transpose", ["o"], ["o1"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["o1", "shape3"], ["y"])]
    inits = [weight("wq", d, d), ints("shape4", [0, 0, h, dh]), ints("shape3", [0, 0, d])]
    return model(nodes, [vi("x", ["batch", "seq", d])], [vi("y", None)], inits, 13)


def with_functions() -> onnx.ModelProto:
    """Two calls of a local function `Block` (MatMul + a nested local `Act`), as torch exports modules."""
    act = helper.make_function("lib", "Act", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"], name="/act/Relu")],
                               opset_imports=opset(18))
    block = helper.make_function(
        "lib", "Block", ["a", "w"], ["b"],
        [helper.make_node("MatMul", ["a", "w"], ["t"], name="/fc/MatMul"),
         helper.make_node("Act", ["t"], ["b"], domain="lib", name="/act")],
        opset_imports=opset(18, ("lib", 1)))
    nodes = [helper.make_node("Block", ["x", "w"], ["h"], domain="lib", name="/layers.0/Block"),
             helper.make_node("Block", ["h", "w"], ["y"], domain="lib", name="/layers.1/Block")]
    return model(nodes, [vi("x", ["batch", 32])], [vi("y", None)], [weight("w", 32, 32)], 18,
                 functions=[act, block], extra=[("lib", 1)])


def with_if() -> onnx.ModelProto:
    """If: a MatMul branch (2·4·32·32 FLOPs) and a Relu branch; the outer weight is read inside."""
    then_g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t"])], "then", [], [vi("t", [4, 32])])
    else_g = helper.make_graph([helper.make_node("Relu", ["x"], ["e"])], "else", [], [vi("e", [4, 32])])
    nodes = [helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g, name="branch")]
    return model(nodes, [vi("x", [4, 32]), vi("cond", [], TensorProto.BOOL)], [vi("y", None)], [weight("w", 32, 32)])


def with_loop(trip: int = 5) -> onnx.ModelProto:
    """Loop with a constant trip count whose body does one MatMul of [4,32]x[32,32]."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("MatMul", ["h_in", "w"], ["h_out"])],
        "body", [vi("i", [], I64), vi("cond_in", [], TensorProto.BOOL), vi("h_in", [4, 32])],
        [vi("cond_out", [], TensorProto.BOOL), vi("h_out", [4, 32])])
    nodes = [helper.make_node("Loop", ["trip", "", "x"], ["y"], body=body, name="loop")]
    trip_t = numpy_helper.from_array(np.array(trip, np.int64), "trip")
    return model(nodes, [vi("x", [4, 32])], [vi("y", None)], [weight("w", 32, 32), trip_t])


def cyclic() -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", ["x", ], ["a"], name="first"),
             helper.make_node("Add", ["a", "c"], ["b"], name="second"),
             helper.make_node("Relu", ["b"], ["c"], name="third")]
    return model(nodes, [vi("x", [4])], [vi("c", [4])])


def dangling() -> onnx.ModelProto:
    nodes = [helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")]
    return model(nodes, [vi("x", [4])], [vi("y", [4])])


def unsorted() -> onnx.ModelProto:
    """The MLP with its nodes reversed: valid ONNX only once sorted."""
    m = mlp(symbolic=False)
    nodes = list(m.graph.node)[::-1]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return m


def custom_ops() -> onnx.ModelProto:
    """A com.microsoft SkipLayerNormalization (no ONNX shape inference) feeding a MatMul, and an unknown op."""
    nodes = [helper.make_node("SkipLayerNormalization", ["x", "skip", "g", "b"], ["n"], domain="com.microsoft",
                              epsilon=1e-5),
             helper.make_node("MatMul", ["n", "w"], ["h"]),
             helper.make_node("Frobnicate", ["h"], ["y"], domain="acme.ops")]
    inits = [weight("g", 64), weight("b", 64), weight("w", 64, 128)]
    return model(nodes, [vi("x", ["batch", 8, 64]), vi("skip", ["batch", 8, 64])], [vi("y", None)], inits, 18,
                 extra=[("com.microsoft", 1), ("acme.ops", 1)])


def constants() -> onnx.ModelProto:
    """A scalar Constant (not a parameter), a big float Constant (a parameter) and a shape initializer."""
    big = numpy_helper.from_array(np.ones((64, 64), np.float32), "cw")
    nodes = [helper.make_node("Constant", [], ["eps"], value=numpy_helper.from_array(np.array(1e-5, np.float32))),
             helper.make_node("Constant", [], ["cw"], value=big),
             helper.make_node("Add", ["x", "eps"], ["a"]),
             helper.make_node("MatMul", ["a", "cw"], ["m"]),
             helper.make_node("Reshape", ["m", "shape"], ["y"])]
    return model(nodes, [vi("x", [4, 64])], [vi("y", None)], [ints("shape", [2, -1])])


class _Dynamo:
    """Emit nodes the way torch.onnx.export(dynamo=True, optimize=False) names and annotates them."""

    _CLASSES = {"model": "transformers.models.llama.modeling_llama.LlamaModel",
                "layers": "transformers.models.llama.modeling_llama.LlamaDecoderLayer",
                "self_attn": "transformers.models.llama.modeling_llama.LlamaAttention",
                "mlp": "transformers.models.llama.modeling_llama.LlamaMLP",
                "act_fn": "transformers.activations.SiLUActivation"}

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.value_info: list[onnx.ValueInfoProto] = []
        self.k = 0

    def __call__(self, op: str, inputs: list[str], scope: str, dims=None, dtype: int = BF16, **attrs) -> str:
        self.k += 1
        fx = f"{op.lower()}_{self.k}"
        n = helper.make_node(op, inputs, [fx], name=f"node_{fx}", **attrs)
        parts = scope.split(".") if scope else []
        paths = [".".join(parts[:i + 1]) for i in range(len(parts))]
        paths = [p for p in paths if not p.split(".")[-1].isdigit()]  # 'model.layers' is not a module of its own
        classes = [self._CLASSES.get(p.split(".")[-1].rstrip("0123456789").rstrip("."), "torch.nn.modules.linear.Linear")
                   for p in paths]
        meta = {
            "namespace": "/".join([": transformers.models.llama.modeling_llama.LlamaForCausalLM",
                                   *(f"{p}: {c}" for p, c in zip(paths, classes)), f"{fx}: aten.{op.lower()}.default"]),
            "pkg.torch.onnx.class_hierarchy": repr(["transformers.models.llama.modeling_llama.LlamaForCausalLM",
                                                    *classes, f"aten.{op.lower()}.default"]),
            "pkg.torch.onnx.fx_node": f"%{fx} : [num_users=1] = call_function[target=torch.ops.aten.{op.lower()}]"
                                      f"(args = ({', '.join('%' + i for i in inputs)}), kwargs = {{}})",
            "pkg.torch.onnx.name_scopes": repr(["", *paths, fx]),
            "pkg.torch.onnx.stack_trace": f'File "transformers/models/llama/modeling_llama.py", line {100 + self.k % 300}'
                                          f", in forward\n    hidden_states = self.{parts[-1] if parts else 'model'}("
                                          "hidden_states)\n" * 2,
        }
        for key, value in meta.items():
            n.metadata_props.add(key=key, value=value)
        self.nodes.append(n)
        if dims is not None:
            self.value_info.append(vi(fx, dims, dtype))
        return fx

    def const(self, values, scope: str, dtype=np.int64) -> str:
        arr = np.array(values, dtype=dtype)
        return self("Constant", [], scope, value=numpy_helper.from_array(arr))


def llama_like(layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2, ffn: int = 128,
               vocab: int = 256) -> onnx.ModelProto:
    """A Llama decoder exported dynamo-style: bf16 weights as external data (never written), symbolic batch/seq.

    Per layer: RMSNorm, q/k/v/o projections (Transpose of the weight then MatMul), RoPE, GQA repeat_kv via
    Expand, softmax attention with a causal mask, SwiGLU MLP; all reshape targets built from Shape at run time.
    """
    dh = hidden // heads
    b = _Dynamo()
    inits: list[TensorProto] = []
    offset = 0

    def param(name: str, *dims: int) -> str:
        nonlocal offset
        t = TensorProto(name=name, data_type=BF16, dims=dims)
        t.data_location = TensorProto.EXTERNAL
        length = int(np.prod(dims)) * 2
        for key, value in (("location", "weights.bin"), ("offset", str(offset)), ("length", str(length))):
            t.external_data.add(key=key, value=value)
        offset += length
        inits.append(t)
        return name

    B, S = "batch", "seq"
    top = "model"
    sb = b("Squeeze", [b("Shape", ["input_ids"], top, start=0, end=1)], top)
    ss = b("Squeeze", [b("Shape", ["input_ids"], top, start=1, end=2)], top)

    def dims_of(*parts, scope: str) -> str:
        """Concat of run-time sizes and constants, as the exporter writes a view's target shape."""
        pieces = [b("Unsqueeze", [p, b.const([0], scope)], scope) if p in (sb, ss) else b.const([p], scope)
                  for p in parts]
        return b("Concat", pieces, scope, axis=0)

    x = b("Gather", [param("model.embed_tokens.weight", vocab, hidden), "input_ids"], "model.embed_tokens",
          [B, S, hidden])
    pos = b("Cast", [b("Range", [b.const(0, top), ss, b.const(1, top)], top)], top, to=F)
    inv = b.const(np.ones(dh // 2), top, np.float32)
    freqs = b("Mul", [b("Unsqueeze", [pos, b.const([1], top)], top), inv], "model.rotary_emb", [S, dh // 2], F)
    emb = b("Concat", [freqs, freqs], "model.rotary_emb", [S, dh], F, axis=-1)
    cos = b("Cast", [b("Cos", [emb], "model.rotary_emb")], "model.rotary_emb", [S, dh], to=BF16)
    sin = b("Cast", [b("Sin", [emb], "model.rotary_emb")], "model.rotary_emb", [S, dh], to=BF16)
    rows = b("Unsqueeze", [b("Range", [b.const(0, top), ss, b.const(1, top)], top), b.const([1], top)], top)
    cols = b("Unsqueeze", [b("Range", [b.const(0, top), ss, b.const(1, top)], top), b.const([0], top)], top)
    allowed = b("LessOrEqual", [cols, rows], top, [S, S], TensorProto.BOOL)
    mask = b("Where", [allowed, b.const(0.0, top, np.float32), b.const(-1e4, top, np.float32)], top, [S, S], F)
    mask = b("Cast", [mask], top, [S, S], to=BF16)

    def rmsnorm(h: str, scope: str) -> str:
        f = b("Cast", [h], scope, [B, S, hidden], F, to=F)
        var = b("ReduceMean", [b("Pow", [f, b.const(2.0, scope, np.float32)], scope), b.const([-1], scope)], scope,
                [B, S, 1], F, keepdims=1)
        inv_rms = b("Reciprocal", [b("Sqrt", [b("Add", [var, b.const(1e-5, scope, np.float32)], scope)], scope)], scope)
        normed = b("Cast", [b("Mul", [f, inv_rms], scope)], scope, [B, S, hidden], to=BF16)
        return b("Mul", [param(scope + ".weight", hidden), normed], scope, [B, S, hidden])

    def linear(h: str, scope: str, n_in: int, n_out: int, dims) -> str:
        wt = b("Transpose", [param(scope + ".weight", n_out, n_in)], scope, perm=[1, 0])
        return b("MatMul", [h, wt], scope, dims)

    def rope(t: str, scope: str, nh: int) -> str:
        half = dh // 2
        c4 = b("Unsqueeze", [cos, b.const([0, 1], scope)], scope)
        s4 = b("Unsqueeze", [sin, b.const([0, 1], scope)], scope)
        x1 = b("Slice", [t, b.const([0], scope), b.const([half], scope), b.const([3], scope), b.const([1], scope)], scope)
        x2 = b("Slice", [t, b.const([half], scope), b.const([dh], scope), b.const([3], scope), b.const([1], scope)],
               scope)
        rot = b("Concat", [b("Neg", [x2], scope), x1], scope, [B, nh, S, dh], axis=-1)
        return b("Add", [b("Mul", [t, c4], scope), b("Mul", [rot, s4], scope)], scope, [B, nh, S, dh])

    def heads_of(h: str, scope: str, nh: int) -> str:
        """view(*hidden_states.shape[:-1], -1, head_dim): the target comes from Shape at run time."""
        lead = b("Slice", [b("Shape", [h], scope), b.const([0], scope), b.const([2], scope), b.const([0], scope),
                           b.const([1], scope)], scope)
        target = b("Concat", [lead, b.const([-1], scope), b.const([dh], scope)], scope, axis=0)
        r = b("Reshape", [h, target], scope, [B, S, nh, dh])
        return b("Transpose", [r], scope, [B, nh, S, dh], perm=[0, 2, 1, 3])

    def repeat_kv(t: str, scope: str) -> str:
        rep = heads // kv_heads
        u = b("Unsqueeze", [t, b.const([2], scope)], scope, [B, kv_heads, 1, S, dh])
        e = b("Expand", [u, dims_of(sb, kv_heads, rep, ss, dh, scope=scope)], scope, [B, kv_heads, rep, S, dh])
        return b("Reshape", [e, dims_of(sb, heads, ss, dh, scope=scope)], scope, [B, heads, S, dh])

    for i in range(layers):
        L = f"model.layers.{i}"
        A = f"{L}.self_attn"
        n = rmsnorm(x, f"{L}.input_layernorm")
        q = rope(heads_of(linear(n, f"{A}.q_proj", hidden, hidden, [B, S, hidden]), A, heads), A, heads)
        k = rope(heads_of(linear(n, f"{A}.k_proj", hidden, kv_heads * dh, [B, S, kv_heads * dh]), A, kv_heads),
                 A, kv_heads)
        v = heads_of(linear(n, f"{A}.v_proj", hidden, kv_heads * dh, [B, S, kv_heads * dh]), A, kv_heads)
        k, v = b("Identity", [repeat_kv(k, A)], A), b("Identity", [repeat_kv(v, A)], A)  # .contiguous()
        kv_len = b("Unsqueeze", [b("Gather", [b("Shape", [k], A), b.const(2, A)], A), b.const([0], A)], A)
        causal = b("Slice", [mask, b.const([0], A), kv_len, b.const([1], A), b.const([1], A)], A, [S, S])
        scores = b("MatMul", [q, b("Transpose", [k], A, perm=[0, 1, 3, 2])], A, [B, heads, S, S])
        scores = b("Add", [b("Mul", [scores, b.const(dh ** -0.5, A, np.float32)], A), causal], A, [B, heads, S, S])
        p = b("Softmax", [b("Cast", [scores], A, to=F)], A, [B, heads, S, S], F, axis=-1)
        p = b("Cast", [b("Where", [b("IsNaN", [p], A), b.const(0.0, A, np.float32), p], A)], A, to=BF16)
        p = b("Identity", [p], A)  # dropout(p=0.0)
        o = b("Transpose", [b("MatMul", [p, v], A, [B, heads, S, dh])], A, [B, S, heads, dh], perm=[0, 2, 1, 3])
        o = b("Reshape", [o, dims_of(sb, ss, hidden, scope=A)], A, [B, S, hidden])
        x = b("Add", [x, linear(o, f"{A}.o_proj", hidden, hidden, [B, S, hidden])], L, [B, S, hidden])
        M = f"{L}.mlp"
        n = rmsnorm(x, f"{L}.post_attention_layernorm")
        gate = linear(n, f"{M}.gate_proj", hidden, ffn, [B, S, ffn])
        act = b("Mul", [gate, b("Sigmoid", [gate], f"{M}.act_fn")], f"{M}.act_fn", [B, S, ffn])
        up = linear(n, f"{M}.up_proj", hidden, ffn, [B, S, ffn])
        x = b("Add", [x, linear(b("Mul", [act, up], M), f"{M}.down_proj", ffn, hidden, [B, S, hidden])], L,
              [B, S, hidden])
    x = rmsnorm(x, "model.norm")
    logits = linear(x, "lm_head", hidden, vocab, [B, S, vocab])
    g = helper.make_graph(b.nodes, "main_graph", [vi("input_ids", [B, S], I64)], [vi(logits, [B, S, vocab])], inits,
                          value_info=b.value_info)
    m = helper.make_model(g, opset_imports=opset(18), producer_name="pytorch", producer_version="2.13.0")
    m.ir_version = 10
    return m


def llama_like_params(layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int) -> int:
    """Analytic parameter count of `llama_like` (untied embeddings)."""
    kv = kv_heads * hidden // heads
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * ffn + 2 * hidden
    return layers * per_layer + 2 * vocab * hidden + hidden


def with_scan(steps: int = 6) -> onnx.ModelProto:
    """Scan over the first axis of x[steps, 4, 32]: each step multiplies its slice by w[32, 32]."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x_t", "w"], ["y_t"]), helper.make_node("Identity", ["s_in"], ["s_out"])],
        "body", [vi("s_in", [1]), vi("x_t", [4, 32])], [vi("s_out", [1]), vi("y_t", [4, 32])])
    nodes = [helper.make_node("Scan", ["s0", "x"], ["s", "y"], body=body, num_scan_inputs=1, name="scan")]
    return model(nodes, [vi("s0", [1]), vi("x", [steps, 4, 32])], [vi("s", None), vi("y", None)],
                 [weight("w", 32, 32)])
