"""Reading a Hugging Face ``config.json`` as transformers does: its fields, with the config class's defaults.

A published ``config.json`` leaves out what its class defaults (Gemma 3's
``vocab_size``, Mistral's ``sliding_window``), and transformers fills it in;
so a field missing from the file is taken from `DEFAULTS`, the defaults of
transformers 5's ``*Config`` class of each ``model_type`` (read from its
source), and only then treated as absent. A field of the wrong type is a
ValueError naming it, in one sentence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from models_zoo.common import require

#: The LlamaConfig class's defaults; each other class as its differences from them.
_LLAMA = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False, "hidden_act": "silu",
    "max_position_embeddings": 2048, "rope_theta": 10000.0, "partial_rotary_factor": 1.0, "sliding_window": None,
}
_QWEN = {"vocab_size": 151936, "intermediate_size": 22016, "max_position_embeddings": 32768, "sliding_window": 4096,
         "use_sliding_window": False, "max_window_layers": 28}
_GEMMA = {"vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
          "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "tie_word_embeddings": True,
          "hidden_activation": "gelu_pytorch_tanh", "sliding_window": 4096, "max_position_embeddings": 8192,
          "query_pre_attn_scalar": 256}
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": _LLAMA,
    "mistral": _LLAMA | {"intermediate_size": 14336, "num_key_value_heads": 8, "max_position_embeddings": 131072,
                         "sliding_window": 4096},
    "mixtral": _LLAMA | {"intermediate_size": 14336, "num_key_value_heads": 8, "rms_norm_eps": 1e-5,
                         "max_position_embeddings": 131072, "rope_theta": 1e6, "num_local_experts": 8,
                         "num_experts_per_tok": 2},
    "qwen2": _LLAMA | _QWEN | {"num_key_value_heads": 32},
    "qwen2_moe": _LLAMA | _QWEN | {
        "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24, "num_attention_heads": 16,
        "num_key_value_heads": 16, "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632, "decoder_sparse_step": 1, "mlp_only_layers": None,
        "norm_topk_prob": False, "qkv_bias": True},
    "qwen3": _LLAMA | _QWEN | {"num_key_value_heads": 32, "head_dim": 128},
    "qwen3_moe": _LLAMA | _QWEN | {
        "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 24, "num_key_value_heads": 4,
        "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1,
        "mlp_only_layers": None, "norm_topk_prob": False},
    "gemma2": _LLAMA | _GEMMA | {"final_logit_softcapping": 30.0},
    "gemma3_text": _LLAMA | _GEMMA | {"vocab_size": 262208, "max_position_embeddings": 131072,
                                      "final_logit_softcapping": None, "rope_theta": 1e6,
                                      "rope_local_base_freq": 10000.0, "sliding_window_pattern": 6},
    "phi3": _LLAMA | {"vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192, "rms_norm_eps": 1e-5,
                      "max_position_embeddings": 4096},
    "olmo2": _LLAMA | {"vocab_size": 50304, "rms_norm_eps": 1e-5},
    "granite": _LLAMA | {"embedding_multiplier": 1.0, "residual_multiplier": 1.0, "attention_multiplier": 1.0,
                         "logits_scaling": 1.0},
    "llama4_text": _LLAMA | {
        "vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192, "num_hidden_layers": 48,
        "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 131072, "rope_theta": 500000.0, "num_local_experts": 16,
        "num_experts_per_tok": 1, "intermediate_size_mlp": 16384, "interleave_moe_layer_step": 1,
        "moe_layers": None, "no_rope_layers": None, "attention_chunk_size": 8192, "use_qk_norm": True},
    "deepseek_v3": _LLAMA | {
        "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 61,
        "num_attention_heads": 128, "max_position_embeddings": 4096, "num_experts_per_tok": 8,
        "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1, "first_k_dense_replace": 3,
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "moe_layer_freq": 1},
    "gpt_oss": _LLAMA | {
        "vocab_size": 201088, "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 36,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "rms_norm_eps": 1e-5,
        "attention_bias": True, "sliding_window": 128, "max_position_embeddings": 131072, "rope_theta": 150000.0,
        "num_local_experts": 128, "num_experts_per_tok": 4, "swiglu_limit": 7.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "truncate": False, "original_max_position_embeddings": 4096}},
}
#: transformers' CLIPVisionConfig; LlavaConfig's own vision defaults (CLIP ViT-L/14-336) for a file without one.
DEFAULTS["clip_vision_model"] = {
    "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
    "num_channels": 3, "image_size": 224, "patch_size": 32, "layer_norm_eps": 1e-5}
DEFAULTS["llava_clip"] = DEFAULTS["clip_vision_model"] | {
    "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
    "image_size": 336, "patch_size": 14}
DEFAULTS["llava"] = {"vision_feature_layer": -2, "vision_feature_select_strategy": "default",
                     "projector_hidden_act": "gelu", "multimodal_projector_bias": True, "tie_word_embeddings": False}
DEFAULTS["kimi_k2"] = DEFAULTS["deepseek_v3"]
#: Qwen2-VL: its text fields (at the file's top level in published files) and its vision tower.
DEFAULTS["qwen2_vl_text"] = _LLAMA | _QWEN | {
    "vocab_size": 152064, "hidden_size": 8192, "intermediate_size": 29568, "num_hidden_layers": 80,
    "num_attention_heads": 64, "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "max_window_layers": 80,
    "rope_theta": 1e6}
DEFAULTS["qwen2_vl_vision"] = {"depth": 32, "embed_dim": 1280, "hidden_size": 3584, "mlp_ratio": 4, "num_heads": 16,
                               "in_channels": 3, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}
DEFAULTS["qwen2_vl"] = {"tie_word_embeddings": False}
#: Field names some classes accept for another (transformers' ``attribute_map``).
ALIASES = {"num_local_experts": "num_experts", "num_experts": "num_local_experts", "in_channels": "in_chans"}


class Fields:
    """One config object (the file's top level, or its ``text_config``) read with its class's defaults."""

    def __init__(self, data: Mapping[str, Any], model_type: str, where: str) -> None:
        self.data, self.model_type, self.where = data, model_type, where
        self.defaults = DEFAULTS.get(model_type, _LLAMA)

    def raw(self, key: str) -> Any:
        """The file's value (JSON null included), else an alias's, else the class default (None if it has none)."""
        if key in self.data:
            return self.data[key]
        alias = ALIASES.get(key)
        if alias and alias in self.data:
            return self.data[alias]
        return self.defaults.get(key)

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def int(self, key: str, default: int | None = None) -> int:
        value = self.raw(key)
        value = default if value is None else value
        require(isinstance(value, int) and not isinstance(value, bool),
                f"{self.where}: {key} must be an integer, got {value!r}.")
        return value

    def opt_int(self, key: str) -> int | None:
        return None if self.raw(key) is None else self.int(key)

    def opt_size(self, key: str) -> int | None:
        """A size transformers derives when it is null (head_dim, num_key_value_heads): given, at least 1."""
        value = self.opt_int(key)
        require(value is None or value >= 1, f"{self.where}: {key} must be at least 1 (or null for the class's "
                                             f"default), got {value}.")
        return value

    def num(self, key: str, default: float | None = None) -> float:
        value = self.raw(key)
        value = default if value is None else value
        require(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
                f"{self.where}: {key} must be a number, got {value!r}.")
        return float(value)

    def flag(self, key: str) -> bool:
        value = self.raw(key)
        require(isinstance(value, bool) or value is None, f"{self.where}: {key} must be true or false, got {value!r}.")
        return bool(value)

    def ints(self, key: str) -> list[int] | None:
        value = self.raw(key)
        require(value is None or (isinstance(value, list) and all(isinstance(v, int) for v in value)),
                f"{self.where}: {key} must be a list of integers, got {value!r}.")
        return value

    def rope(self, key: str = "rope_theta", layer_type: str = "") -> float:
        """A RoPE base from the file's ``rope_theta``, or transformers 5's ``rope_parameters`` (per layer type
        when nested, as Gemma 3's), or the class default."""
        params = self.data.get("rope_parameters")
        if isinstance(params, dict) and layer_type and isinstance(params.get(layer_type), dict):
            params = params[layer_type]
        if key in self.data:
            return self.num(key)
        if isinstance(params, dict) and "rope_theta" in params:
            return float(params["rope_theta"])
        return self.num(key)

    def yarn_attention_factor(self) -> float:
        """The factor YaRN scales the rotary tables by (1 without YaRN): ``rope_scaling`` / ``rope_parameters``'
        ``attention_factor``, else mscale over mscale_all_dim at the scaling factor, else 0.1 ln(factor) + 1
        (transformers' ``_compute_yarn_parameters``)."""
        params = self.raw("rope_parameters") or self.raw("rope_scaling")
        if not isinstance(params, dict) or params.get("rope_type", params.get("type")) != "yarn":
            return 1.0
        def number(key: str) -> float:
            value = params[key]
            require(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                    and value > 0, f"{self.where}: rope scaling's {key} must be a positive number, got {value!r}.")
            return float(value)

        if params.get("attention_factor") is not None:
            return number("attention_factor")
        if params.get("factor") is not None:
            factor = number("factor")
        else:  # transformers: the context over the original one
            original = params.get("original_max_position_embeddings") or self.num("max_position_embeddings")
            factor = self.num("max_position_embeddings") / float(original)

        def mscale(m: float) -> float:
            return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0
        if params.get("mscale") and params.get("mscale_all_dim"):
            return mscale(number("mscale")) / mscale(number("mscale_all_dim"))
        return mscale(1.0)

    def rotary_fraction(self) -> float:
        """``partial_rotary_factor``, at the top level (transformers 4) or in ``rope_parameters`` (5)."""
        params = self.data.get("rope_parameters") or self.data.get("rope_scaling")
        if "partial_rotary_factor" not in self.data and isinstance(params, dict) and "partial_rotary_factor" in params:
            return float(params["partial_rotary_factor"])
        return self.num("partial_rotary_factor")


def full_every(banded: list[bool], hint: int = 0) -> int:
    """The `LlamaConfig.full_every` of a list of per-layer "is banded" flags: 0 when every layer is banded, n when
    exactly the layers i with (i + 1) % n == 0 attend fully; `hint` (the family's period) is tried first, then 0,
    then 2..L. Raises ValueError when no such n gives the list."""
    layers = len(banded)
    for n in dict.fromkeys([hint, 0, *range(2, layers + 2)]):
        if banded == [not (n and (i + 1) % n == 0) for i in range(layers)]:
            return n
    kinds = "".join("b" if x else "f" for x in banded)
    raise ValueError(f"the layers' attention pattern {kinds} (b: banded, f: full) is not every n-th layer full; "
                     "the zoo cannot express it, export the model to ONNX instead.")


def period(flags: list[bool], what: str) -> int:
    """n such that flags[i] == ((i + 1) % n == 0) for every layer i (0: none is set); ValueError otherwise."""
    layers = len(flags)
    for n in [0, *range(1, layers + 2)]:
        if flags == [bool(n) and (i + 1) % n == 0 for i in range(layers)]:
            return n
    raise ValueError(f"{what} {[i for i, f in enumerate(flags) if f]} are not every n-th layer; the zoo cannot "
                     "express that pattern, export the model to ONNX instead.")
