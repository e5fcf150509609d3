"""The Llama family's config and parameter formulas: one dataclass of switches, counted layer by layer.

One config covers the decoders that differ from Llama only in switches:
Llama 2/3 and Mistral (dense), Mixtral and Qwen3-MoE (``experts``/``top_k``),
Qwen2 and Qwen2-MoE (q/k/v biases; a gated shared expert), Qwen3 (QK-norm),
Nemotron-4 (``mlp="relu2"``, ``norm="layernorm1p"``, ``rotary_fraction``),
Gemma 2/3 (``norm="rms1p"``, sandwich norms, GeGLU, scaled embeddings,
banded layers), OLMo 2 (post-norms, QK-norm over the whole projection),
Granite (multipliers), Phi-3 (fused projections) and Llama 4 (interleaved
MoE with a shared expert, NoPE layers, chunked attention: ``variant="llama4"``).
The switches added after the first presets are `common.switch` fields, so a
preset that does not set them keeps its exact config JSON.

Which layers differ, for a model of L layers (HF indices i = 0..L-1):

- MoE layer: ``experts > 0`` and ``(i + 1) % moe_every == 0`` (HF Qwen2-MoE's
  ``decoder_sparse_step``, Llama 4's ``interleave_moe_layer_step``); the
  others are dense MLPs of ``dense_ffn``;
- full-attention layer: ``full_every > 0`` and ``(i + 1) % full_every == 0``;
  with ``sliding_window > 0`` every other layer is banded (Gemma 2: 2,
  Gemma 3: 6, Mistral v0.1: 0 = every layer banded);
- NoPE layer (no rotary embedding): ``nope_every > 0`` and ``(i + 1) % nope_every == 0`` (Llama 4: 4).
"""

from __future__ import annotations

from dataclasses import dataclass

from models_zoo.common import check_divides, check_dtype, check_positive, require, switch
from models_zoo.moe import EXPERT_LAYOUTS

MLPS = ("swiglu", "relu2", "geglu")
NORMS = ("rms", "layernorm1p", "rms1p")
NORM_PLACES = ("pre", "sandwich", "post")
VARIANTS = ("", "llama4")


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
    mlp: str = switch("swiglu")  # "relu2": squared ReLU (Nemotron-4); "geglu": GELU-gated (Gemma)
    norm: str = switch("rms")  # "layernorm1p": LayerNorm + bias, zero-centred gamma (Nemotron-4); "rms1p": x * (1 + w)
    rotary_fraction: float = switch(1.0)  # share of each head's channels that RoPE rotates (Nemotron-4: 0.5)
    rope_attention_factor: float = switch(1.0)  # YaRN's scale of the (global) rotary tables; 1: none
    # -- switches of the Hugging Face config route (hf_config) ---------------------------------------
    qkv_bias: bool = switch(False)  # biases on q/k/v (Qwen2; HF attention_bias sets o_bias too)
    o_bias: bool = switch(False)
    mlp_bias: bool = switch(False)
    fused_proj: bool = switch(False)  # Phi-3: one qkv_proj and one gate_up_proj
    norm_place: str = switch("pre")  # "sandwich": pre and post norms around both sub-layers (Gemma); "post" (OLMo 2)
    qk_norm_per_head: bool = switch(True)  # False: QK-norm over the whole q/k projection (OLMo 2)
    qk_l2norm: bool = switch(False)  # weightless RMS of q and k on RoPE layers (Llama 4)
    embed_scale: float = switch(1.0)  # embeddings times this (Gemma: sqrt(hidden); Granite: embedding_multiplier)
    residual_scale: float = switch(1.0)  # sub-layer outputs times this before the residual add (Granite)
    attn_scale: float = switch(0.0)  # softmax scale; 0: 1/sqrt(head_dim) (Gemma: query_pre_attn_scalar^-0.5)
    logits_divisor: float = switch(1.0)  # logits / this (Granite logits_scaling)
    final_softcap: float = switch(0.0)  # logits -> c * tanh(logits / c) (Gemma 2); 0: none
    sliding_window: int = switch(0)  # banded layers' window (Llama 4: the attention chunk); 0: none
    full_every: int = switch(0)  # every n-th layer attends fully (see the module docstring); 0: none does
    local_rope_theta: float = switch(0.0)  # RoPE base of banded layers (Gemma 3: 10000); 0: rope_theta
    shared_experts: int = switch(0)  # always-on experts of width ffn, as one MLP (Qwen2-MoE, Llama 4)
    shared_gate: bool = switch(False)  # sigmoid gate on the shared expert (Qwen2-MoE shared_expert_gate)
    moe_every: int = switch(1)  # MoE on every n-th layer, dense MLPs between
    dense_ffn: int = switch(0)  # width of the dense layers of an MoE model
    norm_topk: bool = switch(True)  # renormalise the top-k router weights (Qwen2-MoE: False)
    nope_every: int = switch(0)  # every n-th layer has no RoPE (Llama 4: 4)
    variant: str = switch("")  # "llama4": Llama4ForCausalLM's names (feed_forward, router) and sigmoid router

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def rot(self) -> int:
        """Channels of a head that RoPE rotates (HF: ``int(head_dim * partial_rotary_factor)``)."""
        return int(self.hd * self.rotary_fraction)

    def validate(self) -> None:
        check_positive(self, "hidden", "layers", "heads", "kv_heads", "ffn", "vocab", "seq_len", "batch", "moe_every")
        check_dtype(self.dtype)
        if not self.head_dim:
            check_divides(self.heads, self.hidden, "heads", "hidden")
        require(self.hd % 2 == 0, f"head dimension {self.hd} must be even for rotary embeddings.")
        require(self.rope_attention_factor > 0,
                f"rope_attention_factor must be positive, got {self.rope_attention_factor}.")
        require(
            0 < self.rotary_fraction <= 1 and self.rot > 0 and self.rot % 2 == 0,
            f"rotary_fraction={self.rotary_fraction} must rotate an even, positive share of the {self.hd} "
            "channels of a head.",
        )
        for name, value, allowed in (("mlp", self.mlp, MLPS), ("norm", self.norm, NORMS),
                                     ("norm_place", self.norm_place, NORM_PLACES), ("variant", self.variant, VARIANTS),
                                     ("expert_layout", self.expert_layout, EXPERT_LAYOUTS)):
            require(value in allowed, f"{name} {value!r} is unknown; use one of {', '.join(map(repr, allowed))}.")
        check_divides(self.kv_heads, self.heads, "kv_heads", "heads")
        for name in ("sliding_window", "full_every", "nope_every", "shared_experts", "dense_ffn", "experts", "top_k"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 0, f"{name} must be an integer >= 0, got {value!r}.")
        for name in ("embed_scale", "residual_scale", "logits_divisor"):
            require(getattr(self, name) > 0, f"{name} must be positive, got {getattr(self, name)!r}.")
        for name in ("attn_scale", "final_softcap", "local_rope_theta"):
            require(getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)!r}.")
        require(not (self.qk_norm and self.qk_l2norm), "qk_norm and qk_l2norm exclude each other; set one.")
        require(not (self.qk_norm and self.norm == "layernorm1p"), "qk_norm needs norm 'rms' or 'rms1p'.")
        self._validate_experts()

    def _validate_experts(self) -> None:
        if not self.experts:
            require(self.top_k == 0, f"top_k={self.top_k} needs experts > 0; set experts too.")
            for name in ("shared_experts", "dense_ffn"):
                require(not getattr(self, name), f"{name}={getattr(self, name)} needs experts > 0; set experts too.")
            require(self.moe_every == 1 and not self.shared_gate, "moe_every and shared_gate need experts > 0.")
            return
        require(0 < self.top_k <= self.experts, f"top_k={self.top_k} must be between 1 and experts={self.experts}"
                + ("; set top_k too (--top-k)." if not self.top_k else "."))
        require(self.mlp == "swiglu", f"routed experts are SwiGLU MLPs; mlp={self.mlp!r} needs experts=0.")
        require(self.moe_every == 1 or self.dense_ffn > 0,
                f"moe_every={self.moe_every} leaves dense layers; give their width as dense_ffn.")
        require(not self.shared_gate or self.shared_experts > 0, "shared_gate needs shared_experts > 0.")


def is_moe_layer(cfg: LlamaConfig, i: int) -> bool:
    return cfg.experts > 0 and (i + 1) % cfg.moe_every == 0


def is_banded_layer(cfg: LlamaConfig, i: int) -> bool:
    return cfg.sliding_window > 0 and not (cfg.full_every and (i + 1) % cfg.full_every == 0)


def is_nope_layer(cfg: LlamaConfig, i: int) -> bool:
    return cfg.nope_every > 0 and (i + 1) % cfg.nope_every == 0


def norm_params(cfg: LlamaConfig, dim: int) -> int:
    """RMSNorm (either gain) holds a weight; LayerNorm1P a weight and a bias."""
    return 2 * dim if cfg.norm == "layernorm1p" else dim


def attention_params(cfg: LlamaConfig) -> int:
    h, q, kv = cfg.hidden, cfg.heads * cfg.hd, cfg.kv_heads * cfg.hd
    n = h * q + 2 * h * kv + q * h
    n += (q + 2 * kv if cfg.qkv_bias else 0) + (h if cfg.o_bias else 0)
    if cfg.qk_norm:
        n += 2 * norm_params(cfg, cfg.hd) if cfg.qk_norm_per_head else norm_params(cfg, q) + norm_params(cfg, kv)
    return n


def mlp_params(cfg: LlamaConfig, moe: bool) -> tuple[int, int]:
    """(total, idle) parameters of one layer's MLP: idle are the (E - k) routed experts a token skips."""
    h, f = cfg.hidden, cfg.ffn
    if moe:
        n = cfg.experts * h + cfg.experts * 3 * h * f + cfg.shared_experts * 3 * h * f + (h if cfg.shared_gate else 0)
        return n, (cfg.experts - cfg.top_k) * 3 * h * f
    width = cfg.dense_ffn or f
    mats = 2 if cfg.mlp == "relu2" else 3
    return mats * h * width + ((mats - 1) * width + h if cfg.mlp_bias else 0), 0


def layer_params(cfg: LlamaConfig, moe: bool | None = None) -> tuple[int, int]:
    """(total, active) parameters of one decoder layer (an MoE one unless `moe` is False and there are experts)."""
    mlp, idle = mlp_params(cfg, bool(cfg.experts) if moe is None else moe)
    norms = (4 if cfg.norm_place == "sandwich" else 2) * norm_params(cfg, cfg.hidden)
    total = attention_params(cfg) + norms + mlp
    return total, total - idle


def param_counts(cfg: LlamaConfig) -> tuple[int, int]:
    """(total, active); active = total minus the idle (E - k) experts of every MoE layer."""
    n_moe = sum(is_moe_layer(cfg, i) for i in range(cfg.layers))
    moe_t, moe_a = layer_params(cfg, True)
    dense_t, dense_a = layer_params(cfg, False)
    emb = cfg.vocab * cfg.hidden
    rest = emb + (0 if cfg.tie_embeddings else emb) + norm_params(cfg, cfg.hidden)
    n_dense = cfg.layers - n_moe
    return n_moe * moe_t + n_dense * dense_t + rest, n_moe * moe_a + n_dense * dense_a + rest
