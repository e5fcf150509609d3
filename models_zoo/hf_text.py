"""Hugging Face text decoders -> zoo configs, one function per ``model_type``: which field sets which switch.

Every function takes the config's `Fields` and the sequence length to
build at, and returns ``(family, config)``. Field semantics follow
transformers 5's modeling code of each ``model_type``; what a family has
that the graph leaves out is listed in `llama_layer` (soft-capped attention
logits, RoPE scaling) and `deepseek` (the MTP module).
"""

from __future__ import annotations

import math
from typing import Any

from models_zoo.common import require
from models_zoo.deepseek import DeepseekConfig
from models_zoo.gpt_oss import GptOssConfig
from models_zoo.hf_fields import Fields, full_every, period
from models_zoo.llama_config import LlamaConfig

#: hidden_act / hidden_activation values of a gated MLP's gate: SiLU (SwiGLU) or GELU (GeGLU; the exact and the
#: tanh-approximate GELU cost the same, and the graph uses the tanh form Gemma ships).
_GATES = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu", "gelu_pytorch_tanh": "geglu", "gelu_new": "geglu"}


def _base(f: Fields, seq_len: int, **switches: Any) -> LlamaConfig:
    """The fields every Llama-like class shares; `switches` set the family's own."""
    hidden, heads = f.int("hidden_size"), f.int("num_attention_heads")
    act = f.raw("hidden_activation") or f.raw("hidden_act")
    require(act in _GATES, f"{f.where}: hidden activation {act!r} is not one the zoo builds; use one of "
                           f"{', '.join(sorted(_GATES))}, or export the model to ONNX.")
    settings: dict[str, Any] = dict(
        hidden=hidden, layers=f.int("num_hidden_layers"), heads=heads,
        kv_heads=f.opt_size("num_key_value_heads") or heads, ffn=f.int("intermediate_size"), vocab=f.int("vocab_size"),
        seq_len=seq_len, head_dim=f.opt_size("head_dim") or 0, rope_theta=f.rope(), norm_eps=f.num("rms_norm_eps"),
        tie_embeddings=f.flag("tie_word_embeddings"), rotary_fraction=f.rotary_fraction(), mlp=_GATES[act],
        rope_attention_factor=f.yarn_attention_factor(),
    )
    if f.flag("attention_bias"):
        settings.update(qkv_bias=True, o_bias=True)
    if f.flag("mlp_bias"):
        settings.update(mlp_bias=True)
    settings.update(switches)
    return LlamaConfig(**settings)


def _bands(f: Fields, types: list[str], banded_kind: str = "sliding_attention", hint: int = 0) -> dict[str, int]:
    """sliding_window/full_every of per-layer ``layer_types`` (the file's, when it lists them)."""
    listed = f.raw("layer_types") if isinstance(f.raw("layer_types"), list) else None
    types = listed or types
    require(len(types) == f.int("num_hidden_layers"),
            f"{f.where}: layer_types lists {len(types)} layers for num_hidden_layers={f.int('num_hidden_layers')}.")
    banded = [t == banded_kind for t in types]
    if not any(banded):
        return {}
    return {"sliding_window": f.int("sliding_window" if banded_kind == "sliding_attention" else "attention_chunk_size"),
            "full_every": full_every(banded, hint)}


def _uniform_window(f: Fields) -> dict[str, int]:
    """Mistral, Mixtral, Phi-3: ``sliding_window`` (when not null) bands every layer."""
    window = f.opt_int("sliding_window")
    return {"sliding_window": window} if window else {}


def _qwen_window(f: Fields) -> dict[str, int]:
    """Qwen2/Qwen3: banded only with ``use_sliding_window``, from layer ``max_window_layers`` on."""
    layers = f.int("num_hidden_layers")
    on = f.flag("use_sliding_window") and f.opt_int("sliding_window")
    first = f.int("max_window_layers")
    return _bands(f, ["sliding_attention" if on and i >= first else "full_attention" for i in range(layers)])


def llama(f: Fields, seq_len: int) -> tuple[str, Any]:
    return "llama", _base(f, seq_len)


def mistral(f: Fields, seq_len: int) -> tuple[str, Any]:
    return "llama", _base(f, seq_len, **_uniform_window(f))


def phi3(f: Fields, seq_len: int) -> tuple[str, Any]:
    return "llama", _base(f, seq_len, fused_proj=True, **_uniform_window(f))


def qwen2(f: Fields, seq_len: int) -> tuple[str, Any]:
    return "llama", _base(f, seq_len, qkv_bias=True, o_bias=False, **_qwen_window(f))


def qwen3(f: Fields, seq_len: int) -> tuple[str, Any]:
    return "llama", _base(f, seq_len, qk_norm=True, **_qwen_window(f))


def olmo2(f: Fields, seq_len: int) -> tuple[str, Any]:
    return "llama", _base(f, seq_len, norm_place="post", qk_norm=True, qk_norm_per_head=False)


def granite(f: Fields, seq_len: int) -> tuple[str, Any]:
    return "llama", _base(f, seq_len, embed_scale=f.num("embedding_multiplier"),
                          residual_scale=f.num("residual_multiplier"), attn_scale=f.num("attention_multiplier"),
                          logits_divisor=f.num("logits_scaling"))


def _gemma(f: Fields, seq_len: int, **switches: Any) -> LlamaConfig:
    """Gemma 2 and 3: (1 + w) RMSNorms before and after each sub-layer, GeGLU, embeddings times sqrt(hidden),
    softmax scale query_pre_attn_scalar^-0.5, tied head. Attention-logit soft-capping is left out (`llama_layer`)."""
    cap = f.raw("final_logit_softcapping")
    return _base(f, seq_len, norm="rms1p", norm_place="sandwich", embed_scale=math.sqrt(f.int("hidden_size")),
                 attn_scale=f.num("query_pre_attn_scalar") ** -0.5, final_softcap=float(cap or 0.0), **switches)


def gemma2(f: Fields, seq_len: int) -> tuple[str, Any]:
    types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(f.int("num_hidden_layers"))]
    return "llama", _gemma(f, seq_len, **_bands(f, types, hint=2))


def gemma3_text(f: Fields, seq_len: int) -> tuple[str, Any]:
    n = f.int("sliding_window_pattern")
    types = ["sliding_attention" if (i + 1) % n else "full_attention" for i in range(f.int("num_hidden_layers"))]
    bands = _bands(f, types, hint=n)
    local = {"local_rope_theta": f.rope("rope_local_base_freq", "sliding_attention")} if bands else {}
    return "llama", _gemma(f, seq_len, qk_norm=True, rope_theta=f.rope("rope_theta", "full_attention"),
                           **bands, **local)


def _routed(f: Fields, experts_key: str) -> dict[str, Any]:
    return {"experts": f.int(experts_key), "top_k": f.int("num_experts_per_tok")}


def mixtral(f: Fields, seq_len: int) -> tuple[str, Any]:
    return "llama", _base(f, seq_len, **_routed(f, "num_local_experts"), **_uniform_window(f))


def _qwen_moe(f: Fields, **switches: Any) -> dict[str, Any]:
    """Experts of moe_intermediate_size on every decoder_sparse_step-th layer, dense MLPs of intermediate_size
    between them; ``mlp_only_layers`` must be empty (published Qwen MoE configs leave it so)."""
    require(not f.ints("mlp_only_layers"), f"{f.where}: mlp_only_layers {f.ints('mlp_only_layers')} makes layers "
                                           "dense out of pattern; the zoo cannot express it, export to ONNX instead.")
    step = f.int("decoder_sparse_step")
    out = dict(_routed(f, "num_experts"), ffn=f.int("moe_intermediate_size"), moe_every=step,
               norm_topk=f.flag("norm_topk_prob"), **switches)
    if step > 1:
        out["dense_ffn"] = f.int("intermediate_size")
    return out


def qwen2_moe(f: Fields, seq_len: int) -> tuple[str, Any]:
    shared, width = f.int("shared_expert_intermediate_size"), f.int("moe_intermediate_size")
    require(shared % width == 0, f"{f.where}: shared_expert_intermediate_size={shared} is not a multiple of "
                                 f"moe_intermediate_size={width}; the zoo's shared expert is whole experts.")
    extra = {"shared_experts": shared // width, "shared_gate": True} if shared else {}
    bias = {"qkv_bias": f.flag("qkv_bias")}
    return "llama", _base(f, seq_len, **_qwen_moe(f, **extra), **bias, **_qwen_window(f))


def qwen3_moe(f: Fields, seq_len: int) -> tuple[str, Any]:
    return "llama", _base(f, seq_len, qk_norm=True, **_qwen_moe(f), **_qwen_window(f))


def llama4_text(f: Fields, seq_len: int) -> tuple[str, Any]:
    """Llama 4: MoE with one shared expert on the moe_layers (every interleave_moe_layer_step-th), dense MLPs of
    intermediate_size_mlp between; RoPE layers chunked at attention_chunk_size with a weightless QK L2 norm, every
    4th layer NoPE and full (``no_rope_layers``: 1 = RoPE)."""
    layers = f.int("num_hidden_layers")
    step = f.int("interleave_moe_layer_step")
    require(step >= 1, f"{f.where}: interleave_moe_layer_step must be at least 1 (every step-th layer is MoE), "
                       f"got {step}.")
    moe = f.ints("moe_layers")
    moe = list(range(step - 1, layers, step)) if moe is None else moe
    roped = f.ints("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(layers)]
    chunk = f.opt_int("attention_chunk_size")
    types = ["chunked_attention" if r and chunk else "full_attention" for r in roped]
    moe_every = period([i in moe for i in range(layers)], "moe_layers")
    require(moe_every > 0, f"{f.where}: moe_layers is empty; a dense Llama 4 is model_type llama.")
    switches: dict[str, Any] = dict(
        variant="llama4", expert_layout="fused_io", experts=f.int("num_local_experts"),
        top_k=f.int("num_experts_per_tok"), shared_experts=1, moe_every=moe_every,
        nope_every=period([not r for r in roped], "NoPE layers (no_rope_layers 0)"), qk_l2norm=f.flag("use_qk_norm"),
    )
    if moe_every > 1:
        switches["dense_ffn"] = f.int("intermediate_size_mlp")
    return "llama", _base(f, seq_len, **switches, **_bands(f, types, "chunked_attention", hint=4))


def deepseek_v3(f: Fields, seq_len: int) -> tuple[str, Any]:
    """DeepSeek-V3 and Kimi K2 (``kimi_k2``: DeepseekV3ForCausalLM with 384 experts). The MTP layers
    (num_nextn_predict_layers) are not part of transformers' model either."""
    require(not f.flag("tie_word_embeddings"), f"{f.where}: tied embeddings are not a DeepSeek-V3 layout.")
    require(f.int("moe_layer_freq") == 1, f"{f.where}: moe_layer_freq={f.int('moe_layer_freq')}; the zoo builds "
                                          "DeepSeek-V3's MoE on every layer after first_k_dense_replace.")
    cfg = DeepseekConfig(
        hidden=f.int("hidden_size"), layers=f.int("num_hidden_layers"), dense_layers=f.int("first_k_dense_replace"),
        heads=f.int("num_attention_heads"), q_lora_rank=f.opt_int("q_lora_rank") or 0,
        kv_lora_rank=f.int("kv_lora_rank"), qk_nope_dim=f.int("qk_nope_head_dim"),
        qk_rope_dim=f.int("qk_rope_head_dim"),
        v_head_dim=f.int("v_head_dim"), ffn=f.int("intermediate_size"), expert_ffn=f.int("moe_intermediate_size"),
        experts=f.int("n_routed_experts"), top_k=f.int("num_experts_per_tok"), shared_experts=f.int("n_shared_experts"),
        vocab=f.int("vocab_size"), seq_len=seq_len, rope_theta=f.rope(), norm_eps=f.num("rms_norm_eps"),
    )
    return "deepseek", cfg


def gpt_oss(f: Fields, seq_len: int) -> tuple[str, Any]:
    """gpt-oss: banded even layers and full odd ones (the zoo's only pattern), biased attention, tied nothing."""
    layers = f.int("num_hidden_layers")
    types = f.raw("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    require(list(types) == ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
            f"{f.where}: gpt-oss layer_types other than banded even and full odd layers are not built by the zoo.")
    require(f.flag("attention_bias") and not f.flag("tie_word_embeddings"),
            f"{f.where}: the zoo's gpt-oss has biased attention and an untied head.")
    cfg = GptOssConfig(
        hidden=f.int("hidden_size"), layers=layers, heads=f.int("num_attention_heads"),
        kv_heads=f.int("num_key_value_heads"), head_dim=f.int("head_dim"), ffn=f.int("intermediate_size"),
        experts=f.int("num_local_experts"), top_k=f.int("num_experts_per_tok"), vocab=f.int("vocab_size"),
        seq_len=seq_len, sliding_window=f.int("sliding_window"), rope_theta=f.rope(), norm_eps=f.num("rms_norm_eps"),
        swiglu_limit=f.num("swiglu_limit"), rope_attention_factor=f.yarn_attention_factor(),
    )
    return "gpt-oss", cfg


#: model_type -> mapper; ``kimi_k2`` is DeepSeek-V3's architecture under Moonshot's name.
TEXT = {
    "llama": llama, "mistral": mistral, "mixtral": mixtral, "qwen2": qwen2, "qwen2_moe": qwen2_moe, "qwen3": qwen3,
    "qwen3_moe": qwen3_moe, "deepseek_v3": deepseek_v3, "kimi_k2": deepseek_v3, "gpt_oss": gpt_oss,
    "gemma2": gemma2, "gemma3_text": gemma3_text, "phi3": phi3, "olmo2": olmo2, "granite": granite,
    "llama4_text": llama4_text,
}
