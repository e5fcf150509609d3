"""Hugging Face vision-language configs -> zoo configs: a text config nested in ``text_config``, and LLaVA.

Gemma 3 (``gemma3``) and Llama 4 (``llama4``) ship one config for the whole
multimodal model; their text model is what the zoo builds (the vision
towers are SigLIP and Llama 4's own, which the zoo's multimodal builder
does not lay out). LLaVA (``llava``) is built whole: a CLIP tower run to
``vision_feature_layer``, the two-layer projector and any Llama-like text
model the text mappers read.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from models_zoo.common import require
from models_zoo.hf_fields import DEFAULTS, Fields
from models_zoo.hf_text import TEXT
from models_zoo.llama_config import LlamaConfig
from models_zoo.multimodal import MultimodalConfig
from models_zoo.vision import VisionConfig

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


MULTIMODAL: dict[str, Mapper] = {"gemma3": gemma3, "llama4": llama4, "llava": llava}
