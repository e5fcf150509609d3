"""DeepSeek-V3-style decoder: multi-head latent attention and fine-grained MoE.

MLA (DeepSeek-V2 paper, section 2.1): queries go through a low-rank
``q_a_proj`` -> RMSNorm -> ``q_b_proj``; keys and values are decompressed
from a ``kv_lora_rank`` latent by ``kv_b_proj``; a ``qk_rope_head_dim`` part
of each query/key carries RoPE, the key's part shared by all heads. MoE
layers hold ``experts`` routed experts (sigmoid scores, top-k) plus
``shared_experts`` always-on experts; the first ``dense_layers`` layers
have a dense MLP. Names and shapes follow transformers 5's
``DeepseekV3ForCausalLM``.

Multi-token prediction (DeepSeek-V3 report, section 2.2, Eq. 21-23), off
by default as in transformers' model and on with ``mtp_layers`` (HF
``num_nextn_predict_layers``; DeepSeek-V3 trains with 1, and the released
checkpoint's 685B = 671B + 14B counts it): each depth after the main layers
embeds the tokens again, RMS-normalises that and the previous depth's hidden
state (``enorm``, ``hnorm``), projects their concatenation back to the
hidden size (``eh_proj``), runs one MoE layer, normalises
(``shared_head.norm``) and computes logits with the main model's output
weight, named as the checkpoint's ``model.layers.61``. As training runs it:
Megatron-LM builds the same module (``mtp.layers.N``: enorm, hnorm, eh_proj,
a transformer layer), computes its logits with the main ``output_layer``
(gpt_model.py) and, on the MTP's pipeline stage, keeps a copy of the word
embedding: so here the depth has its own ``embed_tokens`` (683.6B in all with
one depth) and shares ``lm_head``. DeepSeek's README_WEIGHTS calls both
tables shared; the released checkpoint stores them again (685B). The
one-token shift of each depth's input ids changes values, not cost: left
out.

Left out (they change no parameter count): the routing bias
``e_score_correction_bias`` (a buffer, not a parameter);
group-limited routing and the routed scaling factor (they change which
experts run, not how much compute); YaRN's attention scale (long-context
only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from onnx import ModelProto

from models_zoo.common import check_dtype, check_positive, require, switch
from models_zoo.decoder_lm import INPUT_IDS, OUTPUT_WEIGHT, build_decoder_lm
from models_zoo.graph_builder import GraphBuilder
from models_zoo.layer_functions import call_layer
from models_zoo.layers import (
    apply_rope,
    gated_mlp,
    linear,
    merge_heads,
    reshape,
    rms_norm,
    sdpa,
    split_heads,
)
from models_zoo.moe import EXPERT_LAYOUTS, routed_experts, routed_params


@dataclass(frozen=True, slots=True, kw_only=True)
class DeepseekConfig:
    hidden: int
    layers: int
    dense_layers: int  # HF first_k_dense_replace
    heads: int
    q_lora_rank: int  # 0: a plain q_proj
    kv_lora_rank: int
    qk_nope_dim: int
    qk_rope_dim: int
    v_head_dim: int
    ffn: int  # dense-layer MLP width (HF intermediate_size)
    expert_ffn: int  # per-expert width (HF moe_intermediate_size)
    experts: int
    top_k: int
    shared_experts: int
    vocab: int
    seq_len: int
    batch: int = 1
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    expert_layout: str = "fused"
    mtp_layers: int = switch(0)  # multi-token-prediction depths (HF num_nextn_predict_layers); 0: none, as transformers
    dtype: str = "bfloat16"

    @property
    def qk_dim(self) -> int:
        return self.qk_nope_dim + self.qk_rope_dim

    def validate(self) -> None:
        check_positive(
            self, "hidden", "layers", "heads", "kv_lora_rank", "qk_nope_dim", "qk_rope_dim", "v_head_dim",
            "ffn", "expert_ffn", "experts", "top_k", "vocab", "seq_len", "batch",
        )
        check_dtype(self.dtype)
        require(
            0 <= self.dense_layers <= self.layers,
            f"dense_layers={self.dense_layers} must be in 0..layers={self.layers}; give at least "
            f"{self.dense_layers} layers, or set dense_layers (--set dense_layers=N) to at most {self.layers}.",
        )
        require(self.q_lora_rank >= 0, f"q_lora_rank must be >= 0, got {self.q_lora_rank}.")
        require(self.shared_experts >= 0, f"shared_experts must be >= 0, got {self.shared_experts}.")
        require(self.mtp_layers >= 0, f"mtp_layers must be >= 0, got {self.mtp_layers}.")
        require(self.top_k <= self.experts, f"top_k={self.top_k} must not exceed experts={self.experts}.")
        require(self.qk_rope_dim % 2 == 0, f"qk_rope_dim={self.qk_rope_dim} must be even for rotary embeddings.")
        require(
            self.expert_layout in EXPERT_LAYOUTS,
            f"expert_layout {self.expert_layout!r} is unknown; use one of {', '.join(EXPERT_LAYOUTS)}.",
        )


def attention_params(cfg: DeepseekConfig) -> int:
    h, n = cfg.hidden, cfg.heads
    if cfg.q_lora_rank:
        q = h * cfg.q_lora_rank + cfg.q_lora_rank + cfg.q_lora_rank * n * cfg.qk_dim
    else:
        q = h * n * cfg.qk_dim
    kv = h * (cfg.kv_lora_rank + cfg.qk_rope_dim) + cfg.kv_lora_rank
    kv += cfg.kv_lora_rank * n * (cfg.qk_nope_dim + cfg.v_head_dim)
    return q + kv + n * cfg.v_head_dim * h


def param_counts(cfg: DeepseekConfig) -> tuple[int, int]:
    """(total, active): per token, k routed experts of E run, every other weight does."""
    h = cfg.hidden
    base = attention_params(cfg) + 2 * h
    dense = base + 3 * h * cfg.ffn
    moe = base + routed_params(h, cfg.expert_ffn, cfg.experts) + 3 * h * cfg.expert_ffn * cfg.shared_experts
    idle = (cfg.experts - cfg.top_k) * 3 * h * cfg.expert_ffn
    n_moe = cfg.layers - cfg.dense_layers + cfg.mtp_layers
    rest = 2 * cfg.vocab * h + h
    # each MTP depth: its embedding copy, enorm, hnorm, eh_proj, shared_head.norm and an MoE layer (its logits
    # share the main output weight)
    mtp = cfg.vocab * h + 3 * h + 2 * h * h
    total = cfg.dense_layers * dense + n_moe * moe + rest + cfg.mtp_layers * mtp
    return total, total - n_moe * idle


def mla(b: GraphBuilder, cfg: DeepseekConfig, x: str, seq: int, cos: str, sin: str, mask: str) -> str:
    """Multi-head latent attention in the current ``self_attn`` scope."""
    B, H, n = cfg.batch, cfg.hidden, cfg.heads
    nope, rope, vd = cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.v_head_dim
    if cfg.q_lora_rank:
        q = linear(b, x, H, cfg.q_lora_rank, "q_a_proj")
        q = rms_norm(b, q, cfg.q_lora_rank, "q_a_layernorm", cfg.norm_eps)
        q = linear(b, q, cfg.q_lora_rank, n * cfg.qk_dim, "q_b_proj")
    else:
        q = linear(b, x, H, n * cfg.qk_dim, "q_proj")
    q_nope, q_rot = b.op("Split", [split_heads(b, q, B, seq, n, cfg.qk_dim), b.const([nope, rope])], n_out=2, axis=-1)
    ckv = linear(b, x, H, cfg.kv_lora_rank + rope, "kv_a_proj_with_mqa")
    latent, k_rot = b.op("Split", [ckv, b.const([cfg.kv_lora_rank, rope])], n_out=2, axis=-1)
    latent = rms_norm(b, latent, cfg.kv_lora_rank, "kv_a_layernorm", cfg.norm_eps)
    kv = split_heads(b, linear(b, latent, cfg.kv_lora_rank, n * (nope + vd), "kv_b_proj"), B, seq, n, nope + vd)
    k_nope, v = b.op("Split", [kv, b.const([nope, vd])], n_out=2, axis=-1)
    k_rot = b.op("Unsqueeze", [k_rot, b.const([1])])  # one rotary key shared by all heads
    q_rot = apply_rope(b, q_rot, cos, sin, rope)
    k_rot = b.op("Expand", [apply_rope(b, k_rot, cos, sin, rope), b.const([B, n, seq, rope])])
    q = b.op("Concat", [q_nope, q_rot], axis=-1)
    k = b.op("Concat", [k_nope, k_rot], axis=-1)
    o = merge_heads(b, sdpa(b, q, k, v, 1.0 / math.sqrt(cfg.qk_dim), mask), B, seq, n * vd)
    return linear(b, o, n * vd, H, "o_proj")


def moe_mlp(b: GraphBuilder, cfg: DeepseekConfig, x: str, seq: int) -> str:
    """Routed experts + shared experts, in the current ``mlp`` scope."""
    B, H = cfg.batch, cfg.hidden
    tokens = B * seq
    flat = reshape(b, x, [tokens, H])
    y = routed_experts(
        b, flat, tokens, H, cfg.expert_ffn, cfg.experts, cfg.top_k,
        score="sigmoid", norm_topk=True, layout=cfg.expert_layout,
    )
    if cfg.shared_experts:
        y = b.op("Add", [y, gated_mlp(b, flat, H, cfg.expert_ffn * cfg.shared_experts, "shared_experts")])
    return reshape(b, y, [B, seq, H])


def decoder_layer(b: GraphBuilder, cfg: DeepseekConfig, h: str, cos: str, sin: str, mask: str, moe: bool) -> str:
    """One pre-norm block in the current ``layers.N`` scope: MLA, then a dense or an MoE MLP."""
    H, S = cfg.hidden, cfg.seq_len
    x = rms_norm(b, h, H, "input_layernorm", cfg.norm_eps)
    with b.scope("self_attn"):
        h = b.op("Add", [h, mla(b, cfg, x, S, cos, sin, mask)])
    x = rms_norm(b, h, H, "post_attention_layernorm", cfg.norm_eps)
    if moe:
        with b.scope("mlp"):
            y = moe_mlp(b, cfg, x, S)
    else:
        y = gated_mlp(b, x, H, cfg.ffn, "mlp")
    return b.op("Add", [h, y])


def mtp_layer(b: GraphBuilder, cfg: DeepseekConfig, h: str, ids: str, head: str, cos: str, sin: str,
              mask: str) -> list[str]:
    """One multi-token-prediction depth in the current ``layers.N`` scope: (its hidden state, its logits); `head`
    is the main model's output weight [V, H], which the depth's logits share."""
    H, V = cfg.hidden, cfg.vocab
    with b.scope("embed_tokens"):
        e = b.op("Gather", [b.param("weight", [V, H]), ids], axis=0)
    x = b.op("Concat", [rms_norm(b, e, H, "enorm", cfg.norm_eps), rms_norm(b, h, H, "hnorm", cfg.norm_eps)], axis=-1)
    x = decoder_layer(b, cfg, linear(b, x, 2 * H, H, "eh_proj"), cos, sin, mask, moe=True)
    with b.scope("shared_head"):
        y = rms_norm(b, x, H, "norm", cfg.norm_eps)
        with b.scope("head"):
            return [x, b.op("MatMul", [y, b.op("Transpose", [head], perm=[1, 0])])]


def build(cfg: DeepseekConfig, family: str = "deepseek", preset: str = "", flat: bool = False) -> ModelProto:
    """``input_ids`` [B, S] int64 -> ``logits`` [B, S, V]; layers as functions unless `flat`."""
    cfg.validate()

    def stack(b: GraphBuilder, h: str, cos: str, sin: str, mask: str) -> tuple[str, list[tuple[str, str]]]:
        for i in range(cfg.layers):
            moe = i >= cfg.dense_layers
            h = call_layer(
                b, "DeepseekV3MoeLayer" if moe else "DeepseekV3DenseLayer", f"layers.{i}",
                lambda lb, x, c, s, m, moe=moe: decoder_layer(lb, cfg, x, c, s, m, moe),
                {"hidden_states": h, "cos": cos, "sin": sin, "attention_mask": mask},
            )
        extra, x = [], h
        for d in range(cfg.mtp_layers):  # after the main layers, so the pipeline cut puts them last
            x, logits = call_layer(
                b, "DeepseekV3MTPLayer", f"layers.{cfg.layers + d}",
                lambda lb, x, ids, w, c, s, m: mtp_layer(lb, cfg, x, ids, w, c, s, m),
                {"hidden_states": x, "input_ids": INPUT_IDS, "head_weight": OUTPUT_WEIGHT, "cos": cos, "sin": sin,
                 "attention_mask": mask},
            )
            extra.append((logits, f"mtp_logits.{d}"))
        return h, extra

    return build_decoder_lm(cfg, family, preset, flat, cfg.qk_rope_dim, stack, param_counts(cfg))
