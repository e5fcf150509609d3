"""Llama-style decoders: RMSNorm, SwiGLU, RoPE, GQA; optionally top-k MoE (Mixtral, Qwen3-MoE).

One config covers Llama 2/3 (dense), Mixtral (``experts``/``top_k`` set: the
MLP is routed), Qwen3 and Qwen3-MoE (plus ``qk_norm``) and Nemotron-4
(``mlp="relu2"``, ``norm="layernorm1p"``, ``rotary_fraction=0.5``), because
they differ only in those switches. Parameter names and shapes are those of
transformers 5's ``LlamaForCausalLM`` / ``MixtralForCausalLM`` /
``Qwen3ForCausalLM`` / ``Qwen3MoeForCausalLM`` / ``NemotronForCausalLM``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from onnx import ModelProto, TensorProto

from models_zoo.common import check_divides, check_dtype, check_positive, finish, require, switch
from models_zoo.graph_builder import GraphBuilder
from models_zoo.layer_functions import call_layer
from models_zoo.layers import (
    apply_partial_rope,
    causal_mask,
    gated_mlp,
    layer_norm_1p,
    linear,
    merge_heads,
    repeat_kv,
    relu2_mlp,
    reshape,
    rms_norm,
    rope_tables,
    sdpa,
    split_heads,
)
from models_zoo.moe import EXPERT_LAYOUTS, routed_experts, routed_params

MLPS = ("swiglu", "relu2")
NORMS = ("rms", "layernorm1p")


@dataclass(frozen=True, slots=True, kw_only=True)
class LlamaConfig:
    """A decoder-only LM. ``ffn`` is the MLP width, per expert when ``experts`` > 0."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq_len: int
    batch: int = 1
    head_dim: int = 0  # 0: hidden // heads
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    qk_norm: bool = False
    experts: int = 0  # 0: dense MLP
    top_k: int = 0
    expert_layout: str = "fused"
    dtype: str = "bfloat16"
    mlp: str = switch("swiglu")  # or "relu2": non-gated squared ReLU (Nemotron-4)
    norm: str = switch("rms")  # or "layernorm1p": LayerNorm with bias and zero-centred gamma (Nemotron-4)
    rotary_fraction: float = switch(1.0)  # share of each head's channels that RoPE rotates (Nemotron-4: 0.5)

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def rot(self) -> int:
        """Channels of a head that RoPE rotates (HF: ``int(head_dim * partial_rotary_factor)``)."""
        return int(self.hd * self.rotary_fraction)

    def validate(self) -> None:
        check_positive(self, "hidden", "layers", "heads", "kv_heads", "ffn", "vocab", "seq_len", "batch")
        check_dtype(self.dtype)
        if not self.head_dim:
            check_divides(self.heads, self.hidden, "heads", "hidden")
        require(self.hd % 2 == 0, f"head dimension {self.hd} must be even for rotary embeddings.")
        require(
            0 < self.rotary_fraction <= 1 and self.rot > 0 and self.rot % 2 == 0,
            f"rotary_fraction={self.rotary_fraction} must rotate an even, positive share of the {self.hd} "
            "channels of a head.",
        )
        require(self.mlp in MLPS, f"mlp {self.mlp!r} is unknown; use one of {', '.join(MLPS)}.")
        require(self.norm in NORMS, f"norm {self.norm!r} is unknown; use one of {', '.join(NORMS)}.")
        check_divides(self.kv_heads, self.heads, "kv_heads", "heads")
        require(self.experts >= 0, f"experts must be >= 0, got {self.experts}.")
        if self.experts:
            require(
                0 < self.top_k <= self.experts,
                f"top_k={self.top_k} must be between 1 and experts={self.experts}.",
            )
            require(self.mlp == "swiglu", f"routed experts are SwiGLU MLPs; mlp={self.mlp!r} needs experts=0.")
        else:
            require(self.top_k == 0, f"top_k={self.top_k} needs experts > 0; set experts too.")
        require(
            self.expert_layout in EXPERT_LAYOUTS,
            f"expert_layout {self.expert_layout!r} is unknown; use one of {', '.join(EXPERT_LAYOUTS)}.",
        )


def norm_params(cfg: LlamaConfig, dim: int) -> int:
    """RMSNorm holds a weight; LayerNorm1P a weight and a bias."""
    return dim if cfg.norm == "rms" else 2 * dim


def layer_params(cfg: LlamaConfig) -> tuple[int, int]:
    """(total, active) parameters of one decoder layer."""
    h, hd = cfg.hidden, cfg.hd
    attn = h * cfg.heads * hd + 2 * h * cfg.kv_heads * hd + cfg.heads * hd * h
    attn += 2 * hd if cfg.qk_norm else 0
    norms = 2 * norm_params(cfg, h)
    if cfg.experts:
        mlp = routed_params(h, cfg.ffn, cfg.experts)
        idle = (cfg.experts - cfg.top_k) * 3 * h * cfg.ffn
    else:
        mlp, idle = (3 if cfg.mlp == "swiglu" else 2) * h * cfg.ffn, 0
    total = attn + norms + mlp
    return total, total - idle


def param_counts(cfg: LlamaConfig) -> tuple[int, int]:
    """(total, active); active = total minus the idle (E - k) experts of every layer."""
    total_l, active_l = layer_params(cfg)
    emb = cfg.vocab * cfg.hidden
    rest = emb + (0 if cfg.tie_embeddings else emb) + norm_params(cfg, cfg.hidden)
    return cfg.layers * total_l + rest, cfg.layers * active_l + rest


def decoder_layer(b: GraphBuilder, cfg: LlamaConfig, h: str, seq: int, cos: str, sin: str, mask: str) -> str:
    """One pre-norm block in the current ``layers.N`` scope; h [B, S, H] -> [B, S, H]."""
    B, H, hd = cfg.batch, cfg.hidden, cfg.hd
    x = _norm(b, cfg, h, H, "input_layernorm")
    with b.scope("self_attn"):
        q = split_heads(b, linear(b, x, H, cfg.heads * hd, "q_proj"), B, seq, cfg.heads, hd)
        k = split_heads(b, linear(b, x, H, cfg.kv_heads * hd, "k_proj"), B, seq, cfg.kv_heads, hd)
        v = split_heads(b, linear(b, x, H, cfg.kv_heads * hd, "v_proj"), B, seq, cfg.kv_heads, hd)
        if cfg.qk_norm:
            q = rms_norm(b, q, hd, "q_norm", cfg.norm_eps)
            k = rms_norm(b, k, hd, "k_norm", cfg.norm_eps)
        q = apply_partial_rope(b, q, cos, sin, hd, cfg.rot)
        k = apply_partial_rope(b, k, cos, sin, hd, cfg.rot)
        rep = cfg.heads // cfg.kv_heads
        k = repeat_kv(b, k, B, cfg.kv_heads, rep, seq, hd)
        v = repeat_kv(b, v, B, cfg.kv_heads, rep, seq, hd)
        o = merge_heads(b, sdpa(b, q, k, v, 1.0 / math.sqrt(hd), mask), B, seq, cfg.heads * hd)
        o = linear(b, o, cfg.heads * hd, H, "o_proj")
    h = b.op("Add", [h, o])
    x = _norm(b, cfg, h, H, "post_attention_layernorm")
    if cfg.experts:
        with b.scope("mlp"):
            tokens = B * seq
            y = routed_experts(
                b, reshape(b, x, [tokens, H]), tokens, H, cfg.ffn, cfg.experts, cfg.top_k,
                layout=cfg.expert_layout,
            )
            y = reshape(b, y, [B, seq, H])
    elif cfg.mlp == "relu2":
        y = relu2_mlp(b, x, H, cfg.ffn, "mlp")
    else:
        y = gated_mlp(b, x, H, cfg.ffn, "mlp")
    return b.op("Add", [h, y])


def _norm(b: GraphBuilder, cfg: LlamaConfig, x: str, dim: int, name: str) -> str:
    if cfg.norm == "layernorm1p":
        return layer_norm_1p(b, x, dim, name, cfg.norm_eps)
    return rms_norm(b, x, dim, name, cfg.norm_eps)


def embed(b: GraphBuilder, cfg: LlamaConfig, ids: str) -> tuple[str, str]:
    """``embed_tokens`` lookup in the current scope; returns (embeddings, table name)."""
    with b.scope("embed_tokens"):
        table = b.param("weight", [cfg.vocab, cfg.hidden])
        return b.op("Gather", [table, ids], axis=0), table


def decoder_stack(b: GraphBuilder, cfg: LlamaConfig, h: str, seq: int, hooks: dict[int, str] | None = None) -> str:
    """Rotary tables, mask, the layers and the final norm, in the current (``model``) scope.

    `hooks` maps a layer index to a [B, S, H] tensor added to the residual
    stream after that layer (Qwen3-VL/Omni "DeepStack" visual features).
    """
    with b.scope("rotary_emb"):
        cos, sin = rope_tables(b, seq, cfg.rot, cfg.rope_theta)
    mask = causal_mask(b, seq)

    def layer(lb: GraphBuilder, x: str, c: str, s: str, m: str) -> str:
        return decoder_layer(lb, cfg, x, seq, c, s, m)

    for i in range(cfg.layers):
        h = call_layer(b, layer_kind(cfg), f"layers.{i}", layer, {"hidden_states": h, "cos": cos, "sin": sin,
                                                                  "attention_mask": mask})
        if hooks and i in hooks:
            with b.scope(f"layers.{i}"):
                h = b.op("Add", [h, hooks[i]])
    return _norm(b, cfg, h, cfg.hidden, "norm")


def layer_kind(cfg: LlamaConfig) -> str:
    """The function name of a decoder layer: HF's class for this variant."""
    if cfg.experts:
        return "Qwen3MoeDecoderLayer" if cfg.qk_norm else "MixtralDecoderLayer"
    if cfg.mlp == "relu2" or cfg.norm == "layernorm1p":
        return "NemotronDecoderLayer"
    return "Qwen3DecoderLayer" if cfg.qk_norm else "LlamaDecoderLayer"


def lm_head(b: GraphBuilder, cfg: LlamaConfig, h: str, table: str) -> str:
    """Logits [B, S, V]; a tied head reuses the embedding table (no new parameter)."""
    if cfg.tie_embeddings:
        with b.scope("lm_head"):
            return b.op("MatMul", [h, b.op("Transpose", [table], perm=[1, 0])])
    return linear(b, h, cfg.hidden, cfg.vocab, "lm_head")


def build(cfg: LlamaConfig, family: str = "llama", preset: str = "", flat: bool = False) -> ModelProto:
    """``input_ids`` [B, S] int64 -> ``logits`` [B, S, V]; layers as functions unless `flat`."""
    cfg.validate()
    b = GraphBuilder(preset or family, cfg.dtype, flat=flat)
    ids = b.input("input_ids", TensorProto.INT64, [cfg.batch, cfg.seq_len])
    with b.scope("model"):
        h, table = embed(b, cfg, ids)
        h = decoder_stack(b, cfg, h, cfg.seq_len)
    logits = lm_head(b, cfg, h, table)
    b.output(logits, "logits", b.elem, [cfg.batch, cfg.seq_len, cfg.vocab])
    total, active = param_counts(cfg)
    return finish(b, family, preset, cfg, total, active)
