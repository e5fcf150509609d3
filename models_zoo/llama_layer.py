"""One decoder layer of the Llama family: norms where the variant puts them, attention, a dense or routed MLP.

Emitted in the current ``layers.N`` scope with the names and shapes of the
transformers class of each variant (``LlamaDecoderLayer``, ``Gemma2DecoderLayer``,
``Olmo2DecoderLayer``, ``Phi3DecoderLayer``, ``Qwen2MoeDecoderLayer``,
``Llama4TextDecoderLayer``...). Left out of the graph, because they change no
parameter and no cost a fused kernel would show:

- Gemma 2's attention-logit soft-capping (50 * tanh(s / 50)): flash kernels
  apply it to each tile in registers (FlashAttention-2's ``softcap``);
  the scores never reach memory either way;
- Llama 4's attention temperature tuning of its NoPE layers (one
  per-position scale of q) and RoPE scaling (YaRN, "llama3", linear): they
  change values, not shapes.
"""

from __future__ import annotations

import math
from typing import Optional

from models_zoo.graph_builder import GraphBuilder
from models_zoo.layers import (
    apply_partial_rope,
    gated_mlp,
    layer_norm_1p,
    linear,
    merge_heads,
    relu2_mlp,
    repeat_kv,
    reshape,
    rms_norm,
    sdpa,
    silu,
    split_heads,
)
from models_zoo.llama_config import LlamaConfig
from models_zoo.moe import routed_experts

#: (cos, sin) tables of a layer that applies RoPE; None for a NoPE layer.
Rope = Optional[tuple[str, str]]


def norm(b: GraphBuilder, cfg: LlamaConfig, x: str, dim: int, name: str) -> str:
    if cfg.norm == "layernorm1p":
        return layer_norm_1p(b, x, dim, name, cfg.norm_eps)
    return rms_norm(b, x, dim, name, cfg.norm_eps, gain="1+w" if cfg.norm == "rms1p" else "w")


def decoder_layer(b: GraphBuilder, cfg: LlamaConfig, h: str, seq: int, rope: Rope, mask: str, moe: bool) -> str:
    """h [B, S, H] -> [B, S, H]: pre-norm (Llama), sandwich (Gemma: both norms around each sub-layer) or
    post-norm (OLMo 2: a norm on each sub-layer's output only)."""
    H, place = cfg.hidden, cfg.norm_place
    x = h if place == "post" else norm(b, cfg, h, H, "input_layernorm")
    with b.scope("self_attn"):
        o = attention(b, cfg, x, seq, rope, mask)
    if place != "pre":
        o = norm(b, cfg, o, H, "post_attention_layernorm")
    h = _residual(b, cfg, h, o)
    if place == "pre":
        x = norm(b, cfg, h, H, "post_attention_layernorm")
    else:
        x = h if place == "post" else norm(b, cfg, h, H, "pre_feedforward_layernorm")
    y = mlp(b, cfg, x, seq, moe)
    if place != "pre":
        y = norm(b, cfg, y, H, "post_feedforward_layernorm")
    return _residual(b, cfg, h, y)


def _residual(b: GraphBuilder, cfg: LlamaConfig, h: str, out: str) -> str:
    if cfg.residual_scale != 1.0:  # Granite's residual_multiplier
        out = b.op("Mul", [out, b.fconst(cfg.residual_scale)])
    return b.op("Add", [h, out])


def attention(b: GraphBuilder, cfg: LlamaConfig, x: str, seq: int, rope: Rope, mask: str) -> str:
    """GQA in the current ``self_attn`` scope, with the variant's biases, fused projection and QK-norm."""
    B, H, hd = cfg.batch, cfg.hidden, cfg.hd
    qw, kvw = cfg.heads * hd, cfg.kv_heads * hd

    def heads(t: str, n: int, norm_name: str) -> str:
        if norm_name and cfg.qk_norm and not cfg.qk_norm_per_head:  # OLMo 2: the whole projection, then split
            t = norm(b, cfg, t, n * hd, norm_name)
        return split_heads(b, t, B, seq, n, hd)

    if cfg.fused_proj:
        qkv = linear(b, x, H, qw + 2 * kvw, "qkv_proj", bias=cfg.qkv_bias)
        q, k, v = b.op("Split", [qkv, b.const([qw, kvw, kvw])], n_out=3, axis=-1)
        q, k, v = heads(q, cfg.heads, "q_norm"), heads(k, cfg.kv_heads, "k_norm"), heads(v, cfg.kv_heads, "")
    else:
        q = heads(linear(b, x, H, qw, "q_proj", bias=cfg.qkv_bias), cfg.heads, "q_norm")
        k = heads(linear(b, x, H, kvw, "k_proj", bias=cfg.qkv_bias), cfg.kv_heads, "k_norm")
        v = heads(linear(b, x, H, kvw, "v_proj", bias=cfg.qkv_bias), cfg.kv_heads, "")
    if cfg.qk_norm and cfg.qk_norm_per_head:
        q, k = norm(b, cfg, q, hd, "q_norm"), norm(b, cfg, k, hd, "k_norm")
    if rope is not None:
        q = apply_partial_rope(b, q, rope[0], rope[1], hd, cfg.rot)
        k = apply_partial_rope(b, k, rope[0], rope[1], hd, cfg.rot)
        if cfg.qk_l2norm:  # Llama 4: after RoPE, RoPE layers only
            with b.scope("qk_norm"):
                q, k = rms_norm(b, q, hd, "q", cfg.norm_eps, gain=""), rms_norm(b, k, hd, "k", cfg.norm_eps, gain="")
    rep = cfg.heads // cfg.kv_heads
    k = repeat_kv(b, k, B, cfg.kv_heads, rep, seq, hd)
    v = repeat_kv(b, v, B, cfg.kv_heads, rep, seq, hd)
    scale = cfg.attn_scale or 1.0 / math.sqrt(hd)
    o = merge_heads(b, sdpa(b, q, k, v, scale, mask), B, seq, qw)
    return linear(b, o, qw, H, "o_proj", bias=cfg.o_bias)


def mlp(b: GraphBuilder, cfg: LlamaConfig, x: str, seq: int, moe: bool) -> str:
    """The layer's MLP in its scope (``mlp``; Llama 4: ``feed_forward``)."""
    scope = "feed_forward" if cfg.variant == "llama4" else "mlp"
    H = cfg.hidden
    if moe:
        with b.scope(scope):
            tokens = cfg.batch * seq
            return reshape(b, moe_block(b, cfg, reshape(b, x, [tokens, H]), tokens), [cfg.batch, seq, H])
    width = cfg.dense_ffn or cfg.ffn
    if cfg.mlp == "relu2":
        return relu2_mlp(b, x, H, width, scope, cfg.mlp_bias)
    if cfg.fused_proj:
        return _fused_gated_mlp(b, cfg, x, width, scope)
    return gated_mlp(b, x, H, width, scope, cfg.mlp_bias, gelu_gate=cfg.mlp == "geglu")


def _fused_gated_mlp(b: GraphBuilder, cfg: LlamaConfig, x: str, width: int, scope: str) -> str:
    """Phi-3's ``gate_up_proj`` [2I, H] split into gate and up (HF ``Phi3MLP``), then ``down_proj``."""
    with b.scope(scope):
        g, u = b.op("Split", [linear(b, x, cfg.hidden, 2 * width, "gate_up_proj", cfg.mlp_bias),
                              b.const([width, width])], n_out=2, axis=-1)
        return linear(b, b.op("Mul", [silu(b, g), u]), width, cfg.hidden, "down_proj", cfg.mlp_bias)


def moe_block(b: GraphBuilder, cfg: LlamaConfig, x: str, tokens: int) -> str:
    """Routed experts plus the shared expert (gated by a sigmoid in Qwen2-MoE) on x [T, H]."""
    H = cfg.hidden
    llama4 = cfg.variant == "llama4"
    y = routed_experts(
        b, x, tokens, H, cfg.ffn, cfg.experts, cfg.top_k, score="topk_sigmoid" if llama4 else "softmax",
        norm_topk=cfg.norm_topk and not llama4, layout=cfg.expert_layout, router="router" if llama4 else "gate",
    )
    if cfg.shared_experts:
        s = gated_mlp(b, x, H, cfg.ffn * cfg.shared_experts, "shared_expert")
        if cfg.shared_gate:
            s = b.op("Mul", [b.op("Sigmoid", [linear(b, x, H, 1, "shared_expert_gate")]), s])
        y = b.op("Add", [y, s])
    return y
