"""OpenAI gpt-oss decoders: attention sinks, alternating banded and full attention, biased top-k MoE.

What sets them apart from the Llama family (OpenAI 2025, gpt-oss-120b &
gpt-oss-20b Model Card, arXiv 2508.10925, section 2; transformers 5's
``GptOssForCausalLM``, whose names and shapes the graph keeps):

- every projection has a bias; each head has a learned sink logit
  (``self_attn.sinks``) that joins the softmax and is dropped after it;
- even layers attend to the last ``sliding_window`` (128) tokens, odd
  layers to the whole causal prefix: one layer body, two masks;
- every MLP is routed: ``mlp.router`` (with bias) picks the top k of the
  logits and softmaxes those k; experts store ``gate_up_proj`` [E, H, 2I]
  with gate and up interleaved (even, odd columns), biases on both
  projections, and the clamped SwiGLU (up + 1) * g * sigmoid(1.702 g) with
  g <= 7 and |up| <= 7.

YaRN (factor 32 over a 4,096-token original context) scales the rotary
tables by its attention factor, 0.1 ln 32 + 1 (transformers'
`_compute_yarn_parameters`; `GptOssRotaryEmbedding` multiplies cos and sin
by it), which the graph keeps: a stack may run such a RoPE unfused
(`planner.costing.rotary`). Left out: YaRN's frequency interpolation, which
changes the tables' values, not the graph's shape or cost (base 150000).
Banded layers are masked full attention, as transformers' eager path
computes them: the graph's FLOPs for those layers are the full
S x S scores, where a kernel that skips masked blocks does about
window / S of that work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from onnx import ModelProto, TensorProto

from models_zoo.common import check_dtype, check_positive, require
from models_zoo.decoder_lm import build_decoder_lm
from models_zoo.graph_builder import GraphBuilder
from models_zoo.layer_functions import call_layer
from models_zoo.layers import (
    apply_rope,
    linear,
    merge_heads,
    repeat_kv,
    reshape,
    rms_norm,
    sliding_mask,
    split_heads,
)
from models_zoo.moe import dispatch_combine


@dataclass(frozen=True, slots=True, kw_only=True)
class GptOssConfig:
    """``ffn`` is each expert's width (HF ``intermediate_size``); every layer is an MoE layer."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    experts: int
    top_k: int
    vocab: int
    seq_len: int
    batch: int = 1
    sliding_window: int = 128
    rope_theta: float = 150000.0
    norm_eps: float = 1e-5
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    rope_attention_factor: float = 1.0 + 0.1 * math.log(32.0)  # YaRN's, for a factor of 32
    dtype: str = "bfloat16"

    def validate(self) -> None:
        check_positive(self, "hidden", "layers", "heads", "kv_heads", "head_dim", "ffn", "experts", "top_k", "vocab",
                       "seq_len", "batch", "sliding_window")
        check_dtype(self.dtype)
        require(self.head_dim % 2 == 0, f"head_dim={self.head_dim} must be even for rotary embeddings.")
        require(self.heads % self.kv_heads == 0, f"heads={self.heads} is not a multiple of kv_heads={self.kv_heads}.")
        require(self.top_k <= self.experts, f"top_k={self.top_k} must not exceed experts={self.experts}.")
        require(self.swiglu_limit > 0, f"swiglu_limit must be positive, got {self.swiglu_limit}.")
        require(self.rope_attention_factor > 0,
                f"rope_attention_factor must be positive, got {self.rope_attention_factor}.")


def expert_params(cfg: GptOssConfig) -> int:
    """One expert: gate_up [H, 2I] + bias 2I, down [I, H] + bias H."""
    h, i = cfg.hidden, cfg.ffn
    return h * 2 * i + 2 * i + i * h + h


def param_counts(cfg: GptOssConfig) -> tuple[int, int]:
    """(total, active): per token, k of the E experts of every layer run, every other weight does."""
    h, q, kv = cfg.hidden, cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    attn = (h * q + q) + 2 * (h * kv + kv) + (q * h + h) + cfg.heads
    layer = attn + 2 * h + cfg.experts * h + cfg.experts + cfg.experts * expert_params(cfg)
    idle = (cfg.experts - cfg.top_k) * expert_params(cfg)
    rest = 2 * cfg.vocab * h + h
    return cfg.layers * layer + rest, cfg.layers * (layer - idle) + rest


def attention(b: GraphBuilder, cfg: GptOssConfig, x: str, cos: str, sin: str, mask: str) -> str:
    """Biased GQA with one sink logit per head, in the current ``self_attn`` scope (HF ``eager_attention_forward``)."""
    B, S, H, n, kv, hd = cfg.batch, cfg.seq_len, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim
    q = split_heads(b, linear(b, x, H, n * hd, "q_proj", bias=True), B, S, n, hd)
    k = split_heads(b, linear(b, x, H, kv * hd, "k_proj", bias=True), B, S, kv, hd)
    v = split_heads(b, linear(b, x, H, kv * hd, "v_proj", bias=True), B, S, kv, hd)
    q, k = apply_rope(b, q, cos, sin, hd), apply_rope(b, k, cos, sin, hd)
    k = repeat_kv(b, k, B, kv, n // kv, S, hd)
    v = repeat_kv(b, v, B, kv, n // kv, S, hd)
    scores = b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])])
    scores = b.op("Add", [b.op("Mul", [scores, b.fconst(1.0 / math.sqrt(hd))]), mask])
    sinks = b.op("Expand", [reshape(b, b.param("sinks", [n]), [1, n, 1, 1]), b.const([B, n, S, 1])])
    probs = b.op("Softmax", [b.op("Concat", [scores, sinks], axis=-1)], axis=-1)
    probs = b.op("Slice", [probs, b.const([0]), b.const([S]), b.const([-1])])  # the sink's share is dropped
    o = merge_heads(b, b.op("MatMul", [probs, v]), B, S, n * hd)
    return linear(b, o, n * hd, H, "o_proj", bias=True)


def _experts(b: GraphBuilder, cfg: GptOssConfig, xs: str, cap: int) -> str:
    """HF ``GptOssExperts`` on the dispatched rows [E*C, H]: interleaved gate/up, clamped SwiGLU, biases."""
    E, H, ffn, lim = cfg.experts, cfg.hidden, cfg.ffn, cfg.swiglu_limit
    xe = reshape(b, xs, [E, cap, H])
    gate_up = b.op("MatMul", [xe, b.param("gate_up_proj", [E, H, 2 * ffn])])
    gate_up = b.op("Add", [gate_up, b.op("Unsqueeze", [b.param("gate_up_proj_bias", [E, 2 * ffn]), b.const([1])])])
    gate = b.op("Slice", [gate_up, b.const([0]), b.const([2 * ffn]), b.const([-1]), b.const([2])])
    up = b.op("Slice", [gate_up, b.const([1]), b.const([2 * ffn]), b.const([-1]), b.const([2])])
    gate = b.op("Min", [gate, b.fconst(lim)])
    up = b.op("Clip", [up, b.fconst(-lim), b.fconst(lim)])
    glu = b.op("Mul", [gate, b.op("Sigmoid", [b.op("Mul", [gate, b.fconst(cfg.swiglu_alpha)])])])
    act = b.op("Mul", [b.op("Add", [up, b.fconst(1.0)]), glu])
    y = b.op("MatMul", [act, b.param("down_proj", [E, ffn, H])])
    y = b.op("Add", [y, b.op("Unsqueeze", [b.param("down_proj_bias", [E, H]), b.const([1])])])
    return reshape(b, y, [E * cap, H])


def moe(b: GraphBuilder, cfg: GptOssConfig, x: str) -> str:
    """Router (top-k of the logits, softmax over those k: HF ``GptOssTopKRouter``) and experts, in ``mlp``."""
    B, S, H = cfg.batch, cfg.seq_len, cfg.hidden
    tokens = B * S
    flat = reshape(b, x, [tokens, H])
    logits = b.op("Cast", [linear(b, flat, H, cfg.experts, "router", bias=True)], to=TensorProto.FLOAT)
    top, idx = b.op("TopK", [logits, b.const([cfg.top_k])], n_out=2, axis=-1)
    weights = b.op("Softmax", [top], axis=-1)
    y = dispatch_combine(b, flat, weights, idx, tokens, H, cfg.experts, cfg.top_k,
                         lambda eb, xs, cap: _experts(eb, cfg, xs, cap))
    return reshape(b, y, [B, S, H])


def decoder_layer(b: GraphBuilder, cfg: GptOssConfig, h: str, cos: str, sin: str, mask: str) -> str:
    """One pre-norm block in the current ``layers.N`` scope; the mask makes it a banded or a full layer."""
    x = rms_norm(b, h, cfg.hidden, "input_layernorm", cfg.norm_eps)
    with b.scope("self_attn"):
        h = b.op("Add", [h, attention(b, cfg, x, cos, sin, mask)])
    x = rms_norm(b, h, cfg.hidden, "post_attention_layernorm", cfg.norm_eps)
    with b.scope("mlp"):
        return b.op("Add", [h, moe(b, cfg, x)])


def build(cfg: GptOssConfig, family: str = "gpt-oss", preset: str = "", flat: bool = False) -> ModelProto:
    """``input_ids`` [B, S] int64 -> ``logits`` [B, S, V]; layers as functions unless `flat`."""
    cfg.validate()

    def stack(b: GraphBuilder, h: str, cos: str, sin: str, full: str) -> str:
        banded = sliding_mask(b, full, cfg.seq_len, cfg.sliding_window)
        for i in range(cfg.layers):  # HF layer_types: sliding_attention on even layers, full_attention on odd
            h = call_layer(b, "GptOssDecoderLayer", f"layers.{i}",
                           lambda lb, x, c, s, m: decoder_layer(lb, cfg, x, c, s, m),
                           {"hidden_states": h, "cos": cos, "sin": sin,
                            "attention_mask": banded if i % 2 == 0 else full})
        return h

    return build_decoder_lm(cfg, family, preset, flat, cfg.head_dim, stack, param_counts(cfg),
                            rope_scale=cfg.rope_attention_factor)
