"""Hugging Face vision-language configs -> zoo configs: a text config nested in ``text_config``, and LLaVA.

Gemma 3 (``gemma3``) and Llama 4 (``llama4``) ship one config for the whole
multimodal model; their text model is what the zoo builds (the vision
towers are SigLIP and Llama 4's own, which the zoo's multimodal builder
does not lay out). LLaVA (``llava``) is built whole: a CLIP tower run to
``vision_feature_layer``, the two-layer projector and any Llama-like text
model the text mappers read. So is Qwen2-VL (``qwen2_vl``): its ViT, the
2 x 2 patch merger and a Qwen2 text model. (Qwen2.5-VL's tower, with RMSNorm,
gated MLPs and windowed attention, is another layout: not read.)

Image size: Qwen2-VL reads images at their own resolution (its processor's
min/max pixels, not config.json, bound it); the graph takes one image of
`QWEN2_VL_IMAGE` pixels a side (1,024 patches, 256 tokens after merging),
``vision_image_size`` to change it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from models_zoo.common import require
from models_zoo.hf_fields import DEFAULTS, Fields
from models_zoo.hf_text import TEXT, qwen2
from models_zoo.llama_config import LlamaConfig
from models_zoo.multimodal import MultimodalConfig
from models_zoo.vision import VisionConfig

QWEN2_VL_IMAGE = 448

#: Reads a text config: (fields, seq_len) -> (family, config); the sub-config's model_type picks it.
Mapper = Callable[[Fields, int], "tuple[str, Any]"]


def sub(f: Fields, key: str, default_type: str, defaults: dict[str, Any] | None = None) -> Fields:
    """The nested config `key` (``text_config``...) as Fields of its own model_type."""
    data = f.raw(key)
    data = {} if data is None else data
    require(isinstance(data, dict), f"{f.where}: {key} must be an object, got {type(data).__name__}.")
    kind = data.get("model_type", default_type)
    out = Fields(data, kind, f"{f.where} {key} ({kind})")
    if defaults is not None:
        out.defaults = defaults
    return out


def text_of(f: Fields, seq_len: int, default_type: str) -> tuple[str, Any]:
    """The text model of a multimodal config, mapped by its own model_type."""
    text = sub(f, "text_config", default_type)
    mapper = TEXT.get(text.model_type)
    require(mapper is not None, f"{text.where}: the text model_type {text.model_type!r} is not one the zoo reads; "
                                f"supported: {', '.join(sorted(TEXT))}.")
    return mapper(text, seq_len)


def gemma3(f: Fields, seq_len: int) -> tuple[str, Any]:
    return text_of(f, seq_len, "gemma3_text")


def llama4(f: Fields, seq_len: int) -> tuple[str, Any]:
    return text_of(f, seq_len, "llama4_text")


def llava(f: Fields, seq_len: int) -> tuple[str, Any]:
    """LLaVA-1.5 / LLaVA-NeXT-style: CLIP tower, ``multi_modal_projector`` (linear_1, GELU, linear_2), text model.

    The tower runs to ``vision_feature_layer`` (-2: the penultimate layer): the
    layers after it and CLIP's ``post_layernorm`` are parameters transformers
    holds but no computation reads, and the graph leaves them out (as
    `presets` says of llava-style-7b).
    """
    family, text = text_of(f, seq_len, "llama")
    require(family == "llama" and isinstance(text, LlamaConfig),
            f"{f.where}: the zoo's multimodal builder takes a Llama-like text model, not {family}.")
    if f.flag("tie_word_embeddings") and not text.tie_embeddings:
        text = dataclasses.replace(text, tie_embeddings=True)
    v = sub(f, "vision_config", "clip_vision_model", None if f.has("vision_config") else DEFAULTS["llava_clip"])
    require(v.model_type == "clip_vision_model", f"{v.where}: LLaVA's tower is built as CLIP; "
                                                 f"{v.model_type!r} is not.")
    feature = f.raw("vision_feature_layer")
    require(isinstance(feature, int), f"{f.where}: vision_feature_layer {feature!r} (several layers) is not built.")
    depth = v.int("num_hidden_layers")
    run = feature if feature >= 0 else depth + 1 + feature
    require(0 < run <= depth, f"{f.where}: vision_feature_layer={feature} reads no layer of {depth}.")
    require(f.raw("vision_feature_select_strategy") == "default" and f.flag("multimodal_projector_bias")
            and f.raw("projector_hidden_act") == "gelu",
            f"{f.where}: the zoo builds LLaVA's default features (no CLS), a biased GELU projector.")
    vision = VisionConfig(
        hidden=v.int("hidden_size"), layers=run, heads=v.int("num_attention_heads"), ffn=v.int("intermediate_size"),
        image_size=v.int("image_size"), patch_size=v.int("patch_size"), channels=v.int("num_channels"),
        style="clip", norm_eps=v.num("layer_norm_eps"),
    )
    return "multimodal", MultimodalConfig(text=text, vision=vision)


def qwen2_vl(f: Fields, seq_len: int) -> tuple[str, Any]:
    """Qwen2-VL: text fields at the top level (published files) or in ``text_config`` (transformers 5), a Qwen2
    decoder; ``vision_config``: depth blocks of embed_dim, mlp_ratio x embed_dim MLPs, Conv3d patches of
    temporal_patch_size frames, a merger of spatial_merge_size^2 patches into the text model's hidden_size."""
    text = sub(f, "text_config", "qwen2_vl_text") if f.has("text_config") else Fields(f.data, "qwen2_vl_text", f.where)
    _, lm = qwen2(text, seq_len)
    if f.flag("tie_word_embeddings") and not lm.tie_embeddings:
        lm = dataclasses.replace(lm, tie_embeddings=True)
    v = sub(f, "vision_config", "qwen2_vl_vision", DEFAULTS["qwen2_vl_vision"])
    embed, merge = v.int("embed_dim"), v.int("spatial_merge_size")
    require(v.int("hidden_size") == lm.hidden, f"{v.where}: the merger's output hidden_size={v.int('hidden_size')} "
                                               f"is not the text model's {lm.hidden}.")
    vision = VisionConfig(
        hidden=embed, layers=v.int("depth"), heads=v.int("num_heads"), ffn=embed * v.int("mlp_ratio"),
        image_size=QWEN2_VL_IMAGE, patch_size=v.int("patch_size"), channels=v.int("in_channels"), style="qwen2vl",
        temporal_patch=v.int("temporal_patch_size"), norm_eps=1e-6,
    )
    return "multimodal", MultimodalConfig(text=lm, vision=vision, merge=merge, projector_norm=True,
                                          projector_hidden=embed * merge**2)


MULTIMODAL: dict[str, Mapper] = {"gemma3": gemma3, "llama4": llama4, "llava": llava, "qwen2_vl": qwen2_vl}
