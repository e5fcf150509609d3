"""Building blocks shared by the families: linear, norms, activations, attention, RoPE.

Each block emits the ops PyTorch's exporter emits for the same module
(``nn.Linear`` -> Transpose + MatMul (+ Add), RMSNorm -> Mul/ReduceMean/Add/
Sqrt/Reciprocal/Mul, eager attention -> MatMul/Mul/Add/Softmax/MatMul), so an
importer costs a zoo graph and an exported model the same way. Shapes are
concrete and tracked by the caller; blocks take the ints they need.
"""

from __future__ import annotations

import math

from onnx import TensorProto

from models_zoo.graph_builder import GraphBuilder


def linear(b: GraphBuilder, x: str, in_f: int, out_f: int, name: str, bias: bool = False) -> str:
    """``nn.Linear``: weight stored [out, in], consumed as x @ W^T like the exporter does."""
    with b.scope(name):
        w = b.param("weight", [out_f, in_f])
        y = b.op("MatMul", [x, b.op("Transpose", [w], perm=[1, 0])])
        if bias:
            y = b.op("Add", [y, b.param("bias", [out_f])])
    return y


def conv1d_linear(b: GraphBuilder, x: str, in_f: int, out_f: int, name: str) -> str:
    """GPT-2's ``Conv1D``: weight stored [in, out], consumed as x @ W + b (HF GPT2 naming)."""
    with b.scope(name):
        y = b.op("MatMul", [x, b.param("weight", [in_f, out_f])])
        y = b.op("Add", [y, b.param("bias", [out_f])])
    return y


def layer_norm(b: GraphBuilder, x: str, dim: int, name: str, eps: float = 1e-5, bias: bool = True) -> str:
    with b.scope(name):
        ins = [x, b.param("weight", [dim])]
        if bias:
            ins.append(b.param("bias", [dim]))
        return b.op("LayerNormalization", ins, axis=-1, epsilon=eps)


def layer_norm_1p(b: GraphBuilder, x: str, dim: int, name: str, eps: float = 1e-5) -> str:
    """LayerNorm with zero-centred gamma: the weight is stored as w - 1 (Megatron's ``layernorm_zero_centered_gamma``,
    HF ``NemotronLayerNorm1P``: ``layer_norm(x, weight + 1, bias)``)."""
    with b.scope(name):
        w = b.op("Add", [b.param("weight", [dim]), b.fconst(1.0)])
        return b.op("LayerNormalization", [x, w, b.param("bias", [dim])], axis=-1, epsilon=eps)


def rms_norm(b: GraphBuilder, x: str, dim: int, name: str, eps: float = 1e-6, gain: str = "w") -> str:
    """RMSNorm (Zhang & Sennrich 2019): x / sqrt(mean(x^2) + eps) * w, as HF's LlamaRMSNorm.

    `gain` "1+w" scales by (1 + w) instead (HF ``GemmaRMSNorm``: the weight is stored zero-centred); ""
    has no weight at all (Llama 4's ``Llama4TextL2Norm`` of q and k).
    """
    with b.scope(name):
        w = b.param("weight", [dim]) if gain else ""
        ms = b.op("ReduceMean", [b.op("Mul", [x, x]), b.const([-1])], keepdims=1)
        inv = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [ms, b.fconst(eps)])])])
        if not gain:
            return b.op("Mul", [x, inv])
        if gain == "1+w":
            w = b.op("Add", [w, b.fconst(1.0)])
        return b.op("Mul", [w, b.op("Mul", [x, inv])])


def gelu(b: GraphBuilder, x: str, tanh: bool = False) -> str:
    return b.op("Gelu", [x], approximate="tanh" if tanh else "none")


def silu(b: GraphBuilder, x: str) -> str:
    return b.op("Mul", [x, b.op("Sigmoid", [x])])


def reshape(b: GraphBuilder, x: str, shape: list[int]) -> str:
    return b.op("Reshape", [x, b.const(shape)])


def split_heads(b: GraphBuilder, x: str, batch: int, seq: int, heads: int, dim: int) -> str:
    """[B, S, h*d] -> [B, h, S, d]."""
    return b.op("Transpose", [reshape(b, x, [batch, seq, heads, dim])], perm=[0, 2, 1, 3])


def merge_heads(b: GraphBuilder, x: str, batch: int, seq: int, width: int) -> str:
    """[B, h, S, d] -> [B, S, h*d]."""
    return reshape(b, b.op("Transpose", [x], perm=[0, 2, 1, 3]), [batch, seq, width])


def repeat_kv(b: GraphBuilder, x: str, batch: int, kv_heads: int, rep: int, seq: int, dim: int) -> str:
    """GQA: share each K/V head among `rep` query heads (HF ``repeat_kv``: expand + reshape)."""
    if rep == 1:
        return x
    x = b.op("Unsqueeze", [x, b.const([2])])
    x = b.op("Expand", [x, b.const([batch, kv_heads, rep, seq, dim])])
    return reshape(b, x, [batch, kv_heads * rep, seq, dim])


def sdpa(b: GraphBuilder, q: str, k: str, v: str, scale: float, mask: str | None, dropout: float = 0.0) -> str:
    """Eager scaled dot-product attention: softmax(q k^T * scale + mask) v (Vaswani et al. 2017, eq. 1),
    with dropout on the probabilities when `dropout` > 0 (as Megatron-LM trains GPT)."""
    scores = b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])])
    scores = b.op("Mul", [scores, b.fconst(scale)])
    if mask is not None:
        scores = b.op("Add", [scores, mask])
    return b.op("MatMul", [drop(b, b.op("Softmax", [scores], axis=-1), dropout), v])


def drop(b: GraphBuilder, x: str, ratio: float) -> str:
    """Training-mode Dropout (it keeps a 1-byte mask for backward); the identity when ratio is 0."""
    if ratio <= 0:
        return x
    return b.op("Dropout", [x, b.fconst(ratio), b.const(True, TensorProto.BOOL)], n_out=2)[0]


def filled(b: GraphBuilder, value: float, shape: list[int], elem: int) -> str:
    """A tensor of `shape` holding `value`: Expand of a scalar Constant.

    Not ConstantOfShape: importers (ours included) take a ConstantOfShape of
    a float dtype for a stored weight, as the ONNX test suite's models use it.
    """
    return b.op("Expand", [b.const([value], elem), b.const(shape)])


def causal_mask(b: GraphBuilder, seq: int) -> str:
    """[S, S] additive mask, -inf above the diagonal, built in-graph so the file stays small."""
    return b.op("Trilu", [filled(b, -math.inf, [seq, seq], b.elem), b.const(1)], upper=1)


def sliding_mask(b: GraphBuilder, full: str, seq: int, window: int) -> str:
    """The causal mask with keys `window` or more positions back also at -inf (HF ``sliding_window_overlay``)."""
    if seq <= window:
        return full
    far = b.op("Trilu", [filled(b, -math.inf, [seq, seq], b.elem), b.const(-window)], upper=0)
    return b.op("Add", [full, far])


def rope_tables(b: GraphBuilder, seq: int, dim: int, theta: float, scale: float = 1.0) -> tuple[str, str]:
    """cos, sin [S, dim] of rotary embeddings (Su et al. 2021, RoFormer eq. 34), HF half-split layout, times
    `scale` when it is not 1 (YaRN's attention factor, as transformers' rotary classes apply it).

    Positions come from a CumSum over ones, not a stored arange, so a 64K
    context costs no bytes in the file. Computed in float32 and cast.
    """
    pos = b.op("CumSum", [filled(b, 1.0, [seq], TensorProto.FLOAT), b.const(0)])
    pos = b.op("Sub", [pos, b.const(1.0, TensorProto.FLOAT)])
    inv_freq = [theta ** (-2.0 * i / dim) for i in range(dim // 2)]
    freqs = b.op("Mul", [b.op("Unsqueeze", [pos, b.const([1])]), b.const(inv_freq, TensorProto.FLOAT)])
    emb = b.op("Concat", [freqs, freqs], axis=-1)
    cos, sin = b.op("Cos", [emb]), b.op("Sin", [emb])
    if scale != 1.0:
        factor = b.const(float(scale), TensorProto.FLOAT)
        cos, sin = b.op("Mul", [cos, factor]), b.op("Mul", [sin, factor])
    return b.op("Cast", [cos], to=b.elem), b.op("Cast", [sin], to=b.elem)


def apply_rope(b: GraphBuilder, x: str, cos: str, sin: str, dim: int) -> str:
    """x * cos + rotate_half(x) * sin over the last dim of [B, h, S, dim] (HF ``apply_rotary_pos_emb``)."""
    half = dim // 2
    x1 = b.op("Slice", [x, b.const([0]), b.const([half]), b.const([-1])])
    x2 = b.op("Slice", [x, b.const([half]), b.const([dim]), b.const([-1])])
    rotated = b.op("Concat", [b.op("Neg", [x2]), x1], axis=-1)
    return b.op("Add", [b.op("Mul", [x, cos]), b.op("Mul", [rotated, sin])])


def apply_partial_rope(b: GraphBuilder, x: str, cos: str, sin: str, dim: int, rot: int) -> str:
    """RoPE on the first `rot` of `dim` channels, the rest passed through (GPT-NeoX ``rotary_pct``; HF Nemotron's
    ``partial_rotary_factor``); the whole head when rot == dim."""
    if rot == dim:
        return apply_rope(b, x, cos, sin, dim)
    head = b.op("Slice", [x, b.const([0]), b.const([rot]), b.const([-1])])
    rest = b.op("Slice", [x, b.const([rot]), b.const([dim]), b.const([-1])])
    return b.op("Concat", [apply_rope(b, head, cos, sin, rot), rest], axis=-1)


def gated_mlp(b: GraphBuilder, x: str, hidden: int, ffn: int, name: str, bias: bool = False,
              gelu_gate: bool = False) -> str:
    """SwiGLU MLP (Shazeer 2020): down(silu(gate(x)) * up(x)), HF ``LlamaMLP`` names; GeGLU with `gelu_gate`
    (tanh-approximate GELU, as Gemma's ``gelu_pytorch_tanh``)."""
    with b.scope(name):
        g = linear(b, x, hidden, ffn, "gate_proj", bias)
        u = linear(b, x, hidden, ffn, "up_proj", bias)
        act = gelu(b, g, tanh=True) if gelu_gate else silu(b, g)
        return linear(b, b.op("Mul", [act, u]), ffn, hidden, "down_proj", bias)


def relu2_mlp(b: GraphBuilder, x: str, hidden: int, ffn: int, name: str, bias: bool = False) -> str:
    """Non-gated squared-ReLU MLP (So et al. 2021, Primer): down(relu(up(x))^2), HF ``NemotronMLP`` names."""
    with b.scope(name):
        u = b.op("Relu", [linear(b, x, hidden, ffn, "up_proj", bias)])
        return linear(b, b.op("Mul", [u, u]), ffn, hidden, "down_proj", bias)


def gated_mlp_params(hidden: int, ffn: int) -> int:
    return 3 * hidden * ffn
