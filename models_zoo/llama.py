"""Llama-style decoders: the stack, the embedding and the head around `llama_layer`'s layers.

The config and its parameter formulas are `llama_config` (re-exported
here); one layer is `llama_layer`. Parameter names and shapes are those of
transformers 5's ``*ForCausalLM`` of each variant (``LlamaForCausalLM``,
``MixtralForCausalLM``, ``Qwen3ForCausalLM``, ``Qwen3MoeForCausalLM``,
``NemotronForCausalLM``, ``Gemma2ForCausalLM``, ``Llama4ForCausalLM``...).
"""

from __future__ import annotations

from onnx import ModelProto, TensorProto

from models_zoo.common import finish
from models_zoo.graph_builder import GraphBuilder
from models_zoo.layer_functions import call_layer
from models_zoo.layers import causal_mask, linear, rope_tables, sliding_mask
from models_zoo.llama_config import (
    LlamaConfig,
    is_banded_layer,
    is_moe_layer,
    is_nope_layer,
    layer_params,
    norm_params,
    param_counts,
)
from models_zoo.llama_layer import decoder_layer, norm

__all__ = ["LlamaConfig", "build", "decoder_stack", "embed", "layer_kind", "layer_params", "lm_head", "norm_params",
           "param_counts"]


def embed(b: GraphBuilder, cfg: LlamaConfig, ids: str) -> tuple[str, str]:
    """``embed_tokens`` lookup in the current scope; returns (embeddings, table name)."""
    with b.scope("embed_tokens"):
        table = b.param("weight", [cfg.vocab, cfg.hidden])
        h = b.op("Gather", [table, ids], axis=0)
        if cfg.embed_scale != 1.0:  # Gemma's sqrt(hidden) normaliser, Granite's embedding_multiplier
            h = b.op("Mul", [h, b.fconst(cfg.embed_scale)])
        return h, table


def decoder_stack(b: GraphBuilder, cfg: LlamaConfig, h: str, seq: int, hooks: dict[int, str] | None = None) -> str:
    """Rotary tables, masks, the layers and the final norm, in the current (``model``) scope.

    `hooks` maps a layer index to a [B, S, H] tensor added to the residual
    stream after that layer (Qwen3-VL/Omni "DeepStack" visual features).
    """
    banded_any = any(is_banded_layer(cfg, i) for i in range(cfg.layers))
    with b.scope("rotary_emb"):
        rope = rope_tables(b, seq, cfg.rot, cfg.rope_theta, cfg.rope_attention_factor)
        local = rope_tables(b, seq, cfg.rot, cfg.local_rope_theta) if cfg.local_rope_theta and banded_any else rope
    full = causal_mask(b, seq)
    # Llama 4's chunked layers are banded at the chunk: each query sees 1..chunk keys in its chunk, a band of the
    # chunk's width sees chunk keys; the band's work bounds the chunked work above, and equals it while S <= chunk.
    banded = sliding_mask(b, full, seq, cfg.sliding_window) if banded_any else full
    for i in range(cfg.layers):
        moe, nope, band = is_moe_layer(cfg, i), is_nope_layer(cfg, i), is_banded_layer(cfg, i)
        tables = None if nope else (local if band else rope)
        inputs = {"hidden_states": h}
        if tables is not None:
            inputs.update(cos=tables[0], sin=tables[1])
        inputs["attention_mask"] = banded if band else full

        def layer(lb: GraphBuilder, x: str, *rest: str, moe: bool = moe, roped: bool = tables is not None) -> str:
            return decoder_layer(lb, cfg, x, seq, (rest[0], rest[1]) if roped else None, rest[-1], moe)

        h = call_layer(b, layer_kind(cfg, moe, nope), f"layers.{i}", layer, inputs)
        if hooks and i in hooks:
            with b.scope(f"layers.{i}"):
                h = b.op("Add", [h, hooks[i]])
    return norm(b, cfg, h, cfg.hidden, "norm")


def layer_kind(cfg: LlamaConfig, moe: bool | None = None, nope: bool = False) -> str:
    """The function name of a decoder layer: HF's class for this variant, plus what tells its layer types apart
    (``Dense``/``Moe`` when MoE layers are interleaved with dense ones, ``NoRope`` for Llama 4's NoPE layers)."""
    kind = _hf_layer_class(cfg)
    if cfg.experts and cfg.moe_every > 1:
        kind += "Moe" if (bool(cfg.experts) if moe is None else moe) else "Dense"
    return kind + ("NoRope" if nope else "")


def _hf_layer_class(cfg: LlamaConfig) -> str:
    if cfg.variant == "llama4":
        return "Llama4TextDecoderLayer"
    if cfg.norm_place == "sandwich":
        return "Gemma3DecoderLayer" if cfg.qk_norm else "Gemma2DecoderLayer"
    if cfg.norm_place == "post":
        return "Olmo2DecoderLayer"
    if cfg.residual_scale != 1.0:
        return "GraniteDecoderLayer"
    if cfg.fused_proj:
        return "Phi3DecoderLayer"
    if cfg.experts:
        if cfg.shared_experts:
            return "Qwen2MoeDecoderLayer"
        return "Qwen3MoeDecoderLayer" if cfg.qk_norm else "MixtralDecoderLayer"
    if cfg.mlp == "relu2" or cfg.norm == "layernorm1p":
        return "NemotronDecoderLayer"
    if cfg.qkv_bias:
        return "Qwen2DecoderLayer"
    return "Qwen3DecoderLayer" if cfg.qk_norm else "LlamaDecoderLayer"


def lm_head(b: GraphBuilder, cfg: LlamaConfig, h: str, table: str) -> str:
    """Logits [B, S, V]; a tied head reuses the embedding table (no new parameter). Granite divides the logits
    by ``logits_scaling``; Gemma 2 soft-caps them, c * tanh(logits / c)."""
    if cfg.tie_embeddings:
        with b.scope("lm_head"):
            logits = b.op("MatMul", [h, b.op("Transpose", [table], perm=[1, 0])])
    else:
        logits = linear(b, h, cfg.hidden, cfg.vocab, "lm_head")
    if cfg.logits_divisor != 1.0:
        logits = b.op("Div", [logits, b.fconst(cfg.logits_divisor)])
    if cfg.final_softcap:
        cap = b.fconst(cfg.final_softcap)
        logits = b.op("Mul", [b.op("Tanh", [b.op("Div", [logits, cap])]), cap])
    return logits


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
